"""``search.target_recall`` (fusebench.backends.target_recall): the nprobe / efSearch chosen is the smallest that
reaches the target on the held-out queries (against a slow reference that builds FAISS's own index and tries every
value), what it chose and the recall it reached are recorded, an unreachable target is one line naming the best,
and bad values are one line each; a null target changes no label, parameter or record."""

from __future__ import annotations

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


def slow_recall(found: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Mean over queries of |found top k & exact top k| / k, one query at a time."""
    return float(np.mean([len(set(f[:k].tolist()) & set(e[:k].tolist())) / k for f, e in zip(found, exact)]))


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


def scan_every_value(index, kind: str, queries, exact_ids, values, target) -> dict[int, float]:
    """The sample recall at every value of the setting (the slow reference of the doubling and bisection)."""
    out = {}
    for value in values:
        if kind == "hnsw":
            index.hnsw.efSearch = value
        else:
            index.nprobe = value
        out[value] = slow_recall(index.search(queries, DEPTH)[1], exact_ids, DEPTH)
    return out


@pytest.mark.parametrize("kind,settings,target", [("ivf_flat", {"nlist": 40}, 0.9), pytest.param(
    "hnsw", {"hnsw_m": 8, "ef_construction": 40}, 0.95, marks=pytest.mark.slow)])  # ~4 s: the scan of every efSearch
def test_the_chosen_setting_is_the_smallest_reaching_the_target_on_the_held_out_queries(clustered, kind, settings,
                                                                                          target):
    model, caption_image, exact = clustered
    config = SearchConfig(backend="faiss", index=kind, target_recall=target, **settings)
    result = faiss_lists(model, caption_image, DEPTH, config, CPU, None, exact=exact)
    quality = with_quality(result, exact)
    setting = "nprobe" if kind == "ivf_flat" else "efSearch"
    sides = {"t2i": (model.image, model.text), "i2t": (model.text, model.image[np.unique(caption_image)])}
    for direction, (items, queries) in sides.items():
        chosen = result.params[direction][setting]
        sample = tr.held_out(len(queries), config.seed)
        assert len(sample) == min(len(queries), 300) and len(np.unique(sample)) == len(sample)
        index = own_index(kind, items, settings.get("nlist", 0), m=settings.get("hnsw_m", 8))
        exact_ids = exact[direction].ids.numpy()[sample]
        low = 1 if kind == "ivf_flat" else DEPTH
        values = range(low, chosen + 1) if kind == "hnsw" else range(1, settings["nlist"] + 1)
        scanned = scan_every_value(index, kind, queries[sample], exact_ids, values, target)
        assert scanned[chosen] >= target
        assert chosen == low or scanned[chosen - 1] < target  # the next smaller one does not reach it
        if kind == "ivf_flat":  # recall never falls as lists are added: the smallest of a full scan
            assert chosen == min(v for v, r in scanned.items() if r >= target)
        record = quality[direction].target
        assert record["setting"] == setting and record["value"] == chosen and record["target_recall"] == target
        assert record["sample_queries"] == len(sample) and record["sample_recall"] == pytest.approx(scanned[chosen])
        assert all(r == pytest.approx(scanned[int(v)]) for v, r in record["tried"].items() if int(v) in scanned)
        every = slow_recall(result.lists[direction].ids.numpy(), exact[direction].ids.numpy(), DEPTH)
        assert quality[direction].neighbour_recall == pytest.approx(every)  # on every query, with the chosen value
    assert config.label() == f"faiss {kind} " + ("nlist=40 target_recall=0.9" if kind == "ivf_flat" else
                                                 "M=8 efConstruction=40 target_recall=0.95")


def test_doubling_then_bisection_equals_a_scan_of_every_value():
    rng = np.random.default_rng(3)
    for _ in range(200):
        high = int(rng.integers(1, 300))
        low = int(rng.integers(1, high + 1))
        curve = np.sort(rng.random(high + 1))  # recall grows with the setting
        target = float(rng.random())
        calls = []
        value, tried = tr.smallest_reaching(lambda v, calls=calls, curve=curve: calls.append(v) or curve[v], low, high, target)
        reaching = [v for v in range(low, high + 1) if curve[v] >= target]
        assert value == (reaching[0] if reaching else None)
        assert len(calls) == len(set(calls)) == len(tried) and len(calls) <= 2 * np.log2(high) + 3


def test_held_out_sample_sizes_and_seed():
    assert len(tr.held_out(25_010, 1)) == 1000 and len(tr.held_out(5_000, 1)) == 500
    assert len(tr.held_out(2_000, 1)) == 300 and len(tr.held_out(120, 1)) == 120
    np.testing.assert_array_equal(tr.held_out(5_000, 7), tr.held_out(5_000, 7))
    assert not np.array_equal(tr.held_out(5_000, 7), tr.held_out(5_000, 8))


def test_an_unreachable_target_is_one_line_naming_the_best_recall_and_setting(clustered):
    model, caption_image, exact = clustered
    config = SearchConfig(backend="faiss", index="ivf_pq", nlist=8, pq_m=2, nbits=4, target_recall=0.99)
    with pytest.raises(FusebenchError) as err:
        faiss_lists(model, caption_image, DEPTH, config, CPU, None, exact=exact)
    message = str(err.value)
    assert "\n" not in message and "search.target_recall=0.99 is not reached by model m's t2i index" in message
    assert "at nprobe=8 (every list)" in message and "nprobe tried 1..8" in message
    best = float(message.split("held-out queries is ")[1].split(",")[0])
    valid = float(message.split("search.target_recall at most ")[1].split(" ")[0])
    assert best < 0.99 and best - 1e-4 <= valid <= best  # a target it reaches


@pytest.mark.parametrize("settings,fragments", [
    ({"target_recall": 1.5}, ("search.target_recall=1.5", "> 0 and <= 1")),
    ({"target_recall": -0.1}, ("search.target_recall=-0.1", "> 0 and <= 1")),
    ({"target_recall": 0.0}, ("search.target_recall=0.0", "> 0 and <= 1")),
    ({"target_recall": True}, ("search.target_recall=True",)),
    ({"backend": "exact", "index": "flat", "target_recall": 0.9}, ("search.target_recall=0.9", "search=exact")),
    ({"index": "ivf_flat", "target_recall": 0.9, "nprobe": 8}, ("search.nprobe=8 is chosen by search.target_recall",)),
    ({"index": "hnsw", "target_recall": 0.9, "ef_search": 300}, ("search.ef_search=300 is chosen",)),
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
