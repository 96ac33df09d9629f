"""``search.target_recall`` (fusebench.backends.target_recall): the nprobe / efSearch chosen is the smallest that
reaches the target, by the one-sided lower bound of its recall, on tuning queries outside the reported ones
(against a slow reference that builds FAISS's own index, searches exactly one query at a time and tries every
value), what it chose, on what and the recall it reached are recorded, an unreachable target is one line naming
the best, and bad values are one line each; a null target changes no label, parameter or record."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

faiss = pytest.importorskip("faiss")

from test_ann import make_case  # noqa: E402

from fusebench import FusebenchError  # noqa: E402
from fusebench.backends import target_recall as tr  # noqa: E402
from fusebench.backends.faiss_index import faiss_lists  # noqa: E402
from fusebench.backends.quality import with_quality  # noqa: E402
from fusebench.config.search import SearchConfig, check_depth, check_sizes  # noqa: E402
from fusebench.evaluation.search_record import IndexQuality, SearchRecord  # noqa: E402
from fusebench.search.model_lists import compute_model_lists  # noqa: E402

CPU = torch.device("cpu")
DEPTH = 20


@pytest.fixture(scope="module")
def clustered():
    model, caption_image = make_case(n_images=1500, dim=24, seed=11, clusters=16)
    return model, caption_image, compute_model_lists(model.text, model.image, caption_image, DEPTH)


@pytest.fixture(scope="module")
def tuning():
    """Queries of another split of the same kind as ``clustered``'s (same centres: same seed's first draws)."""
    other, other_caption_image = make_case(n_images=1500, dim=24, seed=11, clusters=16)
    rng = np.random.default_rng(99)
    image = other.image + 0.05 * rng.standard_normal(other.image.shape)
    image = (image / np.linalg.norm(image, axis=1, keepdims=True)).astype(np.float32)
    text = other.text[rng.choice(len(other.text), 400, replace=False)]
    text = text + 0.05 * rng.standard_normal(text.shape)
    text = (text / np.linalg.norm(text, axis=1, keepdims=True)).astype(np.float32)
    return tr.TuningQueries("split", "val", 300, len(text), {"m": {"t2i": text, "i2t": image[:300]}})


def slow_recall(found: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Mean over queries of |found top k & exact top k| / k, one query at a time."""
    return float(np.mean(slow_recalls(found, exact, k)))


def slow_recalls(found: np.ndarray, exact: np.ndarray, k: int) -> list[float]:
    return [len(set(f[:k].tolist()) & set(e[:k].tolist())) / k for f, e in zip(found, exact)]


def slow_lower_bound(values: list[float]) -> float:
    """mean - 1.6449 * sample sd / sqrt(n), written out."""
    n = len(values)
    mean = sum(values) / n
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return mean - 1.6449 * sd / n ** 0.5


def slow_exact_top(queries: np.ndarray, items: np.ndarray, k: int) -> np.ndarray:
    """Each query's top k items by cosine, ties to the lower id, one query at a time."""
    out = []
    for q in queries.astype(np.float64):
        scores = items.astype(np.float32) @ q.astype(np.float32)
        out.append(sorted(range(len(items)), key=lambda i: (-scores[i], i))[:k])
    return np.array(out)


def own_index(kind: str, items: np.ndarray, nlist: int = 0, seed: int = 1234, m: int = 8, ef_construction: int = 40):
    """FAISS's own index over ``items``, as its documentation builds it (not fusebench's builder)."""
    d = items.shape[1]
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
    else:
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        index.train(items)
    index.add(items)
    return index


def scan_every_value(index, kind: str, queries, exact_ids, values) -> dict[int, tuple[float, float]]:
    """The tuning queries' (mean recall, lower bound) at every value of the setting (the slow reference of the
    doubling and bisection and of the rule)."""
    out = {}
    for value in values:
        if kind == "hnsw":
            index.hnsw.efSearch = value
        else:
            index.nprobe = value
        per_query = slow_recalls(index.search(queries, DEPTH)[1], exact_ids, DEPTH)
        out[value] = (float(np.mean(per_query)), slow_lower_bound(per_query))
    return out


@pytest.mark.parametrize("kind,settings,target", [("ivf_flat", {"nlist": 40}, 0.9), pytest.param(
    "hnsw", {"hnsw_m": 8, "ef_construction": 40}, 0.95, marks=pytest.mark.slow)])  # ~4 s: the scan of every efSearch
def test_the_chosen_setting_is_the_smallest_whose_lower_bound_reaches_the_target_on_the_tuning_queries(
        clustered, tuning, kind, settings, target):
    model, caption_image, exact = clustered
    config = SearchConfig(backend="faiss", index=kind, target_recall=target, **settings)
    result = faiss_lists(model, caption_image, DEPTH, config, CPU, None, exact=exact, tuning=tuning)
    quality = with_quality(result, exact)
    setting = "nprobe" if kind == "ivf_flat" else "efSearch"
    sides = {"t2i": (model.image, model.text), "i2t": (model.text, model.image[np.unique(caption_image)])}
    for direction, (items, _queries) in sides.items():
        chosen = result.params[direction][setting]
        queries = tuning.rows["m"][direction]
        index = own_index(kind, items, settings.get("nlist", 0), m=settings.get("hnsw_m", 8))
        exact_ids = slow_exact_top(queries, items, DEPTH)
        low = 1 if kind == "ivf_flat" else DEPTH
        values = range(low, chosen + 1) if kind == "hnsw" else range(1, settings["nlist"] + 1)
        scanned = scan_every_value(index, kind, queries, exact_ids, values)
        assert scanned[chosen][1] >= target  # the lower bound reaches it, not only the mean
        assert chosen == low or scanned[chosen - 1][1] < target  # the next smaller one does not
        if kind == "ivf_flat":  # recall never falls as lists are added: the smallest of a full scan
            assert chosen == min(v for v, (_r, lo) in scanned.items() if lo >= target)
        record = quality[direction].target
        assert record["setting"] == setting and record["value"] == chosen and record["target_recall"] == target
        assert record["queries"] == {"source": "split", "split": "val", "images": 300, "captions": 400}
        assert record["sample_queries"] == len(queries) and record["seconds"] > 0
        assert record["sample_recall"] == pytest.approx(scanned[chosen][0])
        assert record["sample_recall_low"] == pytest.approx(scanned[chosen][1])
        assert all(r == {"recall": pytest.approx(scanned[int(v)][0]), "low": pytest.approx(scanned[int(v)][1])}
                   for v, r in record["tried"].items() if int(v) in scanned)
        every = slow_recall(result.lists[direction].ids.numpy(), exact[direction].ids.numpy(), DEPTH)
        assert quality[direction].neighbour_recall == pytest.approx(every)  # on every query, with the chosen value
    assert config.label() == f"faiss {kind} " + ("nlist=40 target_recall=0.9" if kind == "ivf_flat" else
                                                 "M=8 efConstruction=40 target_recall=0.95")


def test_exact_top_over_blocks_equals_a_scan_one_query_at_a_time():
    rng = np.random.default_rng(4)
    items = rng.standard_normal((300, 8)).astype(np.float32)
    items[17] = items[3]  # an exact tie: the lower id first
    queries = rng.standard_normal((25, 8)).astype(np.float32)
    queries[0] = items[3]
    for block in (300, 64, 7):
        moved = []  # a progress bar over the items moves by each block's rows
        got = tr.exact_top(queries, tr.array_blocks(items, block), 10, moved.append)
        np.testing.assert_array_equal(got, slow_exact_top(queries, items, 10))
        assert sum(moved) == len(items) and len(moved) == -(-len(items) // block)
    short = tr.exact_top(queries, tr.array_blocks(items[:4], 3), 6)  # fewer items than k: -1 after them
    np.testing.assert_array_equal(short[:, 4:], -1)
    np.testing.assert_array_equal(short[:, :4], slow_exact_top(queries, items[:4], 4))


def test_the_lower_bound_is_the_one_sided_normal_bound():
    values = [1.0, 0.9, 0.95, 0.8, 1.0, 0.85]
    assert tr.lower_bound(np.array(values)) == pytest.approx(slow_lower_bound(values))
    assert tr.lower_bound(np.array([0.7])) == 0.7 and tr.lower_bound(np.ones(50)) == 1.0


def test_doubling_then_bisection_equals_a_scan_of_every_value():
    rng = np.random.default_rng(3)
    for _ in range(200):
        high = int(rng.integers(1, 300))
        low = int(rng.integers(1, high + 1))
        curve = np.sort(rng.random(high + 1))  # recall grows with the setting
        target = float(rng.random())
        calls = []
        value = tr.smallest_reaching(lambda v, calls=calls, curve=curve, t=target: calls.append(v) or curve[v] >= t,
                                     low, high)
        reaching = [v for v in range(low, high + 1) if curve[v] >= target]
        assert value == (reaching[0] if reaching else None)
        assert len(calls) <= 2 * np.log2(high) + 3
        assert len(calls) <= tr.most_tries(low, high)  # the total of the tuning's progress bar


def test_most_tries_bounds_every_search_and_is_reached():
    for high in range(1, 70):
        for low in range(1, high + 1):
            counts = []
            for first in range(low, high + 2):  # the smallest value reaching (high + 1: none does)
                calls = []
                tr.smallest_reaching(lambda v, calls=calls, first=first: calls.append(v) or v >= first, low, high)
                counts.append(len(calls))
            assert max(counts) <= tr.most_tries(low, high), (low, high)
    assert tr.most_tries(1, 4010) <= 2 * 12 + 1 and tr.most_tries(5, 5) == 1


def test_an_unreachable_target_is_one_line_naming_the_best_recall_and_setting(clustered, tuning):
    model, caption_image, exact = clustered
    config = SearchConfig(backend="faiss", index="ivf_pq", nlist=8, pq_m=2, nbits=4, target_recall=0.99)
    with pytest.raises(FusebenchError) as err:
        faiss_lists(model, caption_image, DEPTH, config, CPU, None, exact=exact, tuning=tuning)
    message = str(err.value)
    assert "\n" not in message and "search.target_recall=0.99 is not reached by model m's t2i index" in message
    assert "at nprobe=8 (every list)" in message and "nprobe tried 1..8" in message
    assert "on its 400 tuning queries the best neighbour recall@20 is " in message
    best = float(message.split("lower bound ")[1].split(")")[0])
    valid = float(message.split("search.target_recall at most ")[1].split(" ")[0])
    assert best < 0.99 and best - 1e-4 <= valid <= best  # a target it reaches


def test_a_target_without_tuning_queries_is_a_bug_not_a_silent_choice(clustered):
    model, caption_image, exact = clustered
    with pytest.raises(ValueError, match="needs tuning queries of model m"):
        faiss_lists(model, caption_image, DEPTH, SearchConfig(backend="faiss", index="ivf_flat", nlist=40,
                                                               target_recall=0.9), CPU, None, exact=exact)


@pytest.mark.parametrize("settings,fragments", [
    ({"target_recall": 1.5}, ("search.target_recall=1.5", "> 0 and <= 1")),
    ({"target_recall": -0.1}, ("search.target_recall=-0.1", "> 0 and <= 1")),
    ({"target_recall": 0.0}, ("search.target_recall=0.0", "> 0 and <= 1")),
    ({"target_recall": True}, ("search.target_recall=True",)),
    ({"backend": "exact", "index": "flat", "target_recall": 0.9}, ("search.target_recall=0.9", "search=exact")),
    ({"index": "ivf_flat", "target_recall": 0.9, "nprobe": 8}, ("search.nprobe=8 is chosen by search.target_recall",)),
    ({"index": "hnsw", "target_recall": 0.9, "ef_search": 300}, ("search.ef_search=300 is chosen",)),
    ({"index": "ivf_flat", "tune_queries": "held_out"}, ("search.tune_queries=held_out is read only with "
                                                         "search.target_recall set",)),
    ({"index": "ivf_flat", "tune_images": 50}, ("search.tune_images=50 is read only with search.target_recall",)),
    ({"index": "ivf_flat", "target_recall": 0.9, "tune_queries": "val"}, ("search.tune_queries='val'",
                                                                          "auto, split, held_out")),
    ({"index": "ivf_flat", "target_recall": 0.9, "tune_images": 0}, ("search.tune_images=0",)),
])
def test_bad_target_recall_is_one_line(settings, fragments):
    with pytest.raises(FusebenchError) as err:
        SearchConfig(**{"backend": "faiss", "index": "ivf_flat", **settings})
    assert "\n" not in str(err.value)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


@pytest.mark.parametrize("settings,fragment", [
    ({"backend": "faiss", "index": "flat"}, "search.target_recall=0.9 is never read with search.index=flat"),
    ({"backend": "milvus", "index": "hnsw"}, "search.target_recall=0.9 is never read with search.backend=milvus"),
])
def test_a_target_with_an_index_or_backend_without_the_knob_is_refused(settings, fragment):
    from fusebench.backends.base import check_search
    from fusebench.fusion.config import FusionConfig

    with pytest.raises(FusebenchError) as err:
        check_search(SearchConfig(**settings, target_recall=0.9), FusionConfig(preset="milvus_rrf", method="rrf"),
                     [1.0, 1.0])
    assert "\n" not in str(err.value) and fragment in str(err.value), str(err.value)


def test_the_rules_for_the_setting_it_chooses_do_not_apply_with_a_target():
    check_sizes(SearchConfig(backend="faiss", index="ivf_flat", nlist=None, target_recall=0.9), {"t2i": 500, "i2t": 900},
                100)  # the default nprobe 52 exceeds 12 automatic lists: chosen in 1..12 instead
    check_depth(SearchConfig(backend="faiss", index="hnsw", target_recall=0.9), 300)  # efSearch from the depth up
    SearchConfig(backend="faiss", index="ivf_flat", nlist=8, target_recall=0.9)  # nprobe 52 > nlist 8: not read


def test_a_null_target_changes_no_label_parameter_or_record(clustered):
    model, caption_image, exact = clustered
    config = SearchConfig(backend="faiss", index="ivf_flat", nlist=40, nprobe=5)
    assert config.label() == "faiss ivf_flat nlist=40 nprobe=5" and config.tuned is None
    result = faiss_lists(model, caption_image, DEPTH, config, CPU, None, exact=exact)
    quality = with_quality(result, exact)["t2i"]
    assert result.params["t2i"] == {"nlist": 40, "seed": 1234, "nprobe": 5}
    assert quality.target is None and "target" not in quality.to_json()
    record = SearchRecord("faiss", "ivf_flat", {}, "x", "faiss", DEPTH, {"m": {"t2i": quality}})
    assert SearchRecord.from_json(record.to_json()).to_json() == record.to_json()
    old = {k: v for k, v in quality.to_json().items()}
    assert IndexQuality.from_json(old).target is None  # a record written before the target existed


def test_the_tuning_moves_its_progress_bar_once_per_value_measured():
    exact_ids = np.arange(40 * 10).reshape(40, 10)
    wrong = exact_ids + 1000  # no neighbour found: recall 0

    def search(_queries, value):
        return exact_ids if value >= 37 else wrong

    moved = []
    tuned = tr.choose(search, np.zeros((40, 4), np.float32), exact_ids, 10, "nprobe", 1, 64, 0.95, "a test index",
                      {"kind": "split"}, update=moved.append)
    assert tuned.value == 37 and moved == [1] * len(tuned.tried) and len(moved) <= tr.most_tries(1, 64)


def test_a_rerun_over_a_stored_index_reads_the_choice_and_lists_the_same(clustered, tuning, tmp_path, monkeypatch):
    """With a store, the choice is kept beside the index (stores.tunings): a rerun reads the index and the choice,
    runs no exact search of the tuning queries and no trial search, and gives the same lists and record; another
    target (another key) is chosen again, and an entry not provably the one asked for is chosen again."""
    from fusebench.stores.entries import cache_key
    from fusebench.stores.tunings import TuningStore

    model, caption_image, exact = clustered
    config = SearchConfig(backend="faiss", index="ivf_flat", target_recall=0.9, nlist=40)
    store = str(tmp_path / "cache")
    first = faiss_lists(model, caption_image, DEPTH, config, CPU, store, exact=exact, tuning=tuning)
    entries = TuningStore(store).entries()
    assert [(e["kind"], e["complete"]) for e in entries] == [("tuning", True), ("tuning", True)]

    def never(*_args, **_kwargs):
        raise AssertionError("chosen again: the stored choice was not read")

    monkeypatch.setattr(tr, "exact_top", never)
    monkeypatch.setattr(tr, "choose", never)
    again = faiss_lists(model, caption_image, DEPTH, config, CPU, store, exact=exact, tuning=tuning)
    for direction in ("t2i", "i2t"):
        assert again.costs[direction].hit and not first.costs[direction].hit  # the index itself was read
        assert again.costs[direction].target == first.costs[direction].target
        assert again.params[direction] == first.params[direction]
        for field in ("ids", "scores", "ranks"):
            assert np.array_equal(np.asarray(getattr(again.lists[direction], field)),
                                  np.asarray(getattr(first.lists[direction], field)))
    monkeypatch.undo()
    other = SearchConfig(backend="faiss", index="ivf_flat", target_recall=0.8, nlist=40)
    lower = faiss_lists(model, caption_image, DEPTH, other, CPU, store, exact=exact, tuning=tuning)
    assert len(TuningStore(store).entries()) == 4
    assert lower.costs["t2i"].target["value"] <= first.costs["t2i"].target["value"]
    folder = next(e for e in TuningStore(store).entries())["path"]  # a meta.json of another key: chosen again
    meta = json.loads((Path(folder) / "meta.json").read_text())
    meta["key"] = cache_key({"another": 1})
    (Path(folder) / "meta.json").write_text(json.dumps(meta))
    faiss_lists(model, caption_image, DEPTH, other, CPU, store, exact=exact, tuning=tuning)
    faiss_lists(model, caption_image, DEPTH, config, CPU, store, exact=exact, tuning=tuning)
    assert all(e["complete"] for e in TuningStore(store).entries())


@pytest.mark.parametrize("damage", ["value", "recall", "no checksum"])
def test_a_stored_choice_whose_bytes_changed_is_chosen_again(clustered, tuning, tmp_path, monkeypatch, caplog, damage):
    """meta.json is the whole tuning entry: a digit changed in the choice (it still parses: nprobe 22 read as 23,
    with 22's recall) or an entry without the choice's checksum is reported and chosen again, and the lists are
    the ones the first run chose, never the altered setting's."""
    from fusebench.stores.tunings import TuningStore

    model, caption_image, exact = clustered
    config = SearchConfig(backend="faiss", index="ivf_flat", target_recall=0.9, nlist=40)
    store = str(tmp_path / "cache")
    first = faiss_lists(model, caption_image, DEPTH, config, CPU, store, exact=exact, tuning=tuning)
    for entry in TuningStore(store).entries():
        path = Path(entry["path"]) / "meta.json"
        meta = json.loads(path.read_text())
        if damage == "value":
            meta["tuned"]["value"] += 1
        elif damage == "recall":
            meta["tuned"]["sample_recall"] = 1.0
        else:
            del meta["tuned_sha256"]
        path.write_text(json.dumps(meta))
    chosen = []
    real = tr.choose
    monkeypatch.setattr(tr, "choose", lambda *a, **k: chosen.append(1) or real(*a, **k))
    with caplog.at_level("WARNING"):
        again = faiss_lists(model, caption_image, DEPTH, config, CPU, store, exact=exact, tuning=tuning)
    assert len(chosen) == 2  # both directions chosen again
    assert "checksum" in caplog.text
    for direction in ("t2i", "i2t"):
        assert again.costs[direction].target["value"] == first.costs[direction].target["value"]
        assert np.array_equal(np.asarray(again.lists[direction].ids), np.asarray(first.lists[direction].ids))
