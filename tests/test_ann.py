"""The FAISS backend (fusebench.backends.faiss_index) and index quality (search.ann_quality): flat equals exact search, every
index's lists and list ranks are what its own search returns, neighbour recall and top-1 agreement equal a slow
reference, and bad parameters or a missing faiss are one-line errors."""

import sys

import numpy as np
import pytest
import torch

faiss = pytest.importorskip("faiss")

from fusebench import FusebenchError  # noqa: E402
from fusebench.backends import faiss_index as ann  # noqa: E402
from fusebench.backends.faiss_index import faiss_lists, faiss_version  # noqa: E402
from fusebench.backends.quality import neighbour_recall, top1_agreement, with_quality  # noqa: E402
from fusebench.config.search import SearchConfig, check_depth, check_sizes, resolve_pq_m  # noqa: E402
from fusebench.encoders.base import ModelEmbeddings  # noqa: E402
from fusebench.search.model_lists import compute_model_lists  # noqa: E402

CPU = torch.device("cpu")
TIE = 1e-6  # scores this close may come out in either order (FAISS's BLAS and torch's matmul round differently)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_case(n_images=300, dim=32, seed=5, clusters=0):
    """A model over ``n_images`` images with 0-3 captions each (some none); ``clusters`` > 0: images around that
    many centres (what IVF partitions well)."""
    rng = np.random.default_rng(seed)
    caption_image = np.repeat(np.arange(n_images), rng.integers(0, 4, n_images))
    if clusters:
        centres = rng.standard_normal((clusters, dim)) * 2
        image = _unit(centres[rng.integers(0, clusters, n_images)] + rng.standard_normal((n_images, dim)))
    else:
        image = _unit(rng.standard_normal((n_images, dim)))
    text = _unit(image[caption_image] + 0.7 * rng.standard_normal((len(caption_image), dim)))
    return ModelEmbeddings("m", image, text), caption_image


def config(index="flat", **settings) -> SearchConfig:
    return SearchConfig(backend="faiss", index=index, **settings)


def reference_list_ranks(ids: np.ndarray, correct) -> np.ndarray:
    """1-based position of the first correct id in each row, 0 when none: one row at a time."""
    out = []
    for q, row in enumerate(ids.tolist()):
        out.append(next((p + 1 for p, i in enumerate(row) if i >= 0 and i in correct(q)), 0))
    return np.array(out)


def assert_same_up_to_ties(ids, scores, exact_ids, exact_scores, least_identical=0.95):
    """The same lists, but for items of (float-rounding) tied scores, which may come in either order: the score
    sequences agree, and every position whose ids differ lies in a run of scores equal within TIE."""
    np.testing.assert_allclose(scores, exact_scores, atol=TIE, rtol=0)
    differ = ids != exact_ids
    for q, p in zip(*np.nonzero(differ)):
        row = exact_scores[q]
        near = [abs(row[p] - row[j]) <= TIE for j in (p - 1, p + 1) if 0 <= j < len(row)]
        assert any(near), f"query {q} position {p}: {ids[q, p]} instead of {exact_ids[q, p]} without a tie"
    assert (~differ.any(axis=1)).mean() >= least_identical


@pytest.fixture(scope="module")
def case():
    return make_case()


@pytest.fixture(scope="module")
def exact(case):
    model, caption_image = case
    return compute_model_lists(model.text, model.image, caption_image, 20)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_flat_lists_and_ranks_equal_exact_search(case, exact):
    model, caption_image = case
    result = faiss_lists(model, caption_image, 20, config(), CPU, None)
    query_images = np.unique(caption_image)
    for direction in ("t2i", "i2t"):
        ids, ex_ids = result.lists[direction].ids.numpy(), exact[direction].ids.numpy()
        assert ids.dtype == np.int32 and result.lists[direction].scores.numpy().dtype == np.float32
        assert result.lists[direction].ranks.dtype == np.int64 and ids.shape == ex_ids.shape
        assert_same_up_to_ties(ids, result.lists[direction].scores.numpy(), ex_ids, exact[direction].scores.numpy(), least_identical=1.0)
        ex_ranks = exact[direction].ranks  # exact ranks in the whole ranking; the index's are list ranks
        np.testing.assert_array_equal(result.lists[direction].ranks, np.where(ex_ranks <= ids.shape[1], ex_ranks, 0))
    correct = {"t2i": lambda q: {caption_image[q]},
               "i2t": lambda q: set(np.flatnonzero(caption_image == query_images[q]).tolist())}
    for direction in ("t2i", "i2t"):
        np.testing.assert_array_equal(result.lists[direction].ranks,
                                      reference_list_ranks(result.lists[direction].ids.numpy(), correct[direction]))
    quality = with_quality(result, exact)
    assert all(q.neighbour_recall == 1.0 and q.top1_agreement == 1.0 for q in quality.values())
    assert all(q.where == "cpu" and not q.stored and q.key is None and q.index_bytes > 0 and q.query_ms > 0
               for q in quality.values())


def test_lists_shorter_than_the_depth_hold_every_item(case):
    model, caption_image = case
    image = model.image[:30]
    small = ModelEmbeddings("m", image, model.text[caption_image < 30])
    cap = caption_image[caption_image < 30]
    result = faiss_lists(small, cap, 50, config(), CPU, None)
    exact = compute_model_lists(small.text, small.image, cap, 50)
    assert result.lists["t2i"].ids.numpy().shape == (len(cap), 30) and result.lists.depth == 50
    np.testing.assert_array_equal(result.lists["t2i"].ranks, exact["t2i"].ranks)  # all listed: ranks are exact
    np.testing.assert_array_equal(result.lists["i2t"].ranks, exact["i2t"].ranks)
    assert result.costs["t2i"].depth == 30 and result.costs["i2t"].depth == len(cap)


def test_ivf_flat_visiting_every_list_equals_flat(case):
    model, caption_image = case
    flat = faiss_lists(model, caption_image, 20, config(), CPU, None)
    ivf = faiss_lists(model, caption_image, 20, config("ivf_flat", nlist=6, nprobe=6), CPU, None)
    assert ivf.params["t2i"] == {"nlist": 6, "seed": 1234, "nprobe": 6}
    for direction in ("t2i", "i2t"):
        assert_same_up_to_ties(ivf.lists[direction].ids.numpy(), ivf.lists[direction].scores.numpy(), flat.lists[direction].ids.numpy(),
                               flat.lists[direction].scores.numpy())


def slow_recall(index_ids, exact_ids, depth):
    out = []
    for found, wanted in zip(index_ids.tolist(), exact_ids.tolist()):
        wanted = {i for i in wanted[:min(depth, len(wanted))] if i >= 0}
        found = {i for i in found[:depth] if i >= 0}
        out.append(len(found & wanted) / len(wanted) if wanted else 1.0)
    return np.array(out)


def slow_top1(index_ids, exact_ids):
    return np.array([bool(f) and bool(w) and f[0] == w[0] and w[0] >= 0
                     for f, w in zip(index_ids.tolist(), exact_ids.tolist())])


def random_lists(rng, queries, width, items, pad_share):
    ids = np.stack([rng.permutation(items)[:width] for _ in range(queries)])
    cut = rng.random(queries) < pad_share  # rows the index returned short: -1 after a random length
    for q in np.flatnonzero(cut):
        ids[q, rng.integers(0, width + 1):] = -1
    return ids


@pytest.mark.parametrize("index_width,exact_width,depth", [(10, 10, 10), (10, 10, 5), (6, 6, 10), (12, 8, 10),
                                                           (10, 10, 1)])
def test_neighbour_recall_and_top1_agreement_equal_a_slow_reference(index_width, exact_width, depth):
    rng = np.random.default_rng(index_width * 100 + exact_width * 10 + depth)
    for items in (12, 40):  # few items: lists overlap a lot; more: little
        index_ids = random_lists(rng, 1500, index_width, items, 0.3)
        exact_ids = random_lists(rng, 1500, exact_width, items, 0.1)
        exact_ids[::7, :] = np.where(rng.random((len(exact_ids[::7]), 1)) < 0.5, -1, exact_ids[::7, :])  # empty rows
        index_ids[::5, 0] = exact_ids[::5, 0]  # some agree at the top (-1 with -1 included)
        got = neighbour_recall(index_ids, exact_ids, depth)
        np.testing.assert_allclose(got, slow_recall(index_ids, exact_ids, depth), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(top1_agreement(index_ids, exact_ids), slow_top1(index_ids, exact_ids))
        assert 0 < got.mean() < 1


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_recall_of_the_approximate_indexes_is_computed_right_and_sane():
    model, caption_image = make_case(n_images=1000, dim=32, seed=8, clusters=40)
    exact = compute_model_lists(model.text, model.image, caption_image, 10)
    cases = {"hnsw": (config("hnsw", hnsw_m=16, ef_construction=80, ef_search=64), 0.95, 1.0),
             "ivf_flat": (config("ivf_flat", nlist=20, nprobe=3), 0.3, 0.995),
             "ivf_pq": (config("ivf_pq", nlist=16, nprobe=4, pq_m=8, nbits=6), 0.2, 0.95)}
    for kind, (search, low, high) in cases.items():
        result = faiss_lists(model, caption_image, 10, search, CPU, None)
        quality = with_quality(result, exact)
        for direction in ("t2i", "i2t"):
            ids, ex_ids = result.lists[direction].ids.numpy(), exact[direction].ids.numpy()
            recall = slow_recall(ids, ex_ids, 10).mean()
            assert quality[direction].neighbour_recall == pytest.approx(recall, abs=1e-12)
            assert quality[direction].top1_agreement == pytest.approx(slow_top1(ids, ex_ids).mean(), abs=1e-12)
            assert low <= recall <= high, f"{kind} {direction}: neighbour recall {recall:.3f}"
            n_items = len(model.image) if direction == "t2i" else len(model.text)
            assert ((ids >= -1) & (ids < n_items)).all()
        assert result.params["t2i"] == {**ann.build_params(search, len(model.image), 32, "m"), **ann.search_params(search)}


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_index_scores_are_the_inner_products_of_the_listed_items(case):
    model, caption_image = case
    result = faiss_lists(model, caption_image, 10, config("hnsw", ef_search=32), CPU, None)
    ids, scores = result.lists["t2i"].ids.numpy(), result.lists["t2i"].scores.numpy()
    recomputed = np.einsum("qd,qkd->qk", model.text.astype(np.float64), model.image[ids].astype(np.float64))
    np.testing.assert_allclose(scores, recomputed, atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first


def faiss_own_ivf_pq(items, queries, width, nlist, m, nbits, nprobe, seed, k):
    """FAISS's own IVF-PQ over the rows zero-padded to ``width`` by hand: the slow reference for the padded index."""
    import faiss

    pad = lambda x: np.pad(np.asarray(x, dtype=np.float32), ((0, 0), (0, width - x.shape[1])))  # noqa: E731
    index = faiss.IndexIVFPQ(faiss.IndexFlatIP(width), width, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = index.pq.cp.seed = seed
    index.pq.cp.min_points_per_centroid = 1
    index.train(pad(items))
    index.add(pad(items))
    index.nprobe = nprobe
    scores, ids = index.search(pad(queries), k)
    return ids, scores


@pytest.mark.parametrize("pq_m", [5, 3])
def test_pq_m_that_does_not_divide_the_width_pads_and_equals_faiss_over_padded_rows(case, pq_m):
    """m need not divide the width: the vectors are zero-padded to a multiple of m (no inner product changes), and
    the lists are FAISS's own IVF-PQ over the same rows padded by hand, id for id and score for score."""
    model, caption_image = case
    search = config("ivf_pq", nlist=4, nprobe=2, pq_m=pq_m, nbits=4)
    width = -(-32 // pq_m) * pq_m
    assert ann.build_params(search, len(model.image), 32, "m")["width"] == width
    result = faiss_lists(model, caption_image, 10, search, CPU, None)
    ids, scores = faiss_own_ivf_pq(model.image, model.text, width, 4, pq_m, 4, 2, search.seed, 10)
    np.testing.assert_array_equal(result.lists["t2i"].ids.numpy(), ids)
    np.testing.assert_array_equal(result.lists["t2i"].scores.numpy(), scores)


@pytest.mark.slow  # > 0.1 s: outside the unit tier
def test_automatic_pq_m_pads_a_width_with_no_good_divisor_and_reaches_better_recall():
    """Width 34 = 2 x 17: the largest divisor up to width / 4 is 2 (two sub-quantizers of 17 dims each); padded to
    40 with m = 8, the index codes 4x finer and its neighbour recall is higher."""
    model, caption_image = make_case(n_images=1000, dim=34, seed=8, clusters=40)
    exact = compute_model_lists(model.text, model.image, caption_image, 10)
    search = config("ivf_pq", nlist=16, nprobe=16, nbits=6)
    assert resolve_pq_m(search, 34, "m") == 2  # what an engine, which cannot pad, takes
    assert ann.build_params(search, 1000, 34, "m") == {"nlist": 16, "m": 8, "width": 40, "nbits": 6, "seed": search.seed}
    padded = slow_recall(faiss_lists(model, caption_image, 10, search, CPU, None).lists["t2i"].ids.numpy(),
                         exact["t2i"].ids.numpy(), 10).mean()
    divisor = slow_recall(faiss_lists(model, caption_image, 10, config("ivf_pq", nlist=16, nprobe=16, nbits=6, pq_m=2),
                                      CPU, None).lists["t2i"].ids.numpy(), exact["t2i"].ids.numpy(), 10).mean()
    assert padded > divisor + 0.1, (padded, divisor)


def test_pq_m_wider_than_the_model_is_refused_naming_the_range(case):
    model, caption_image = case
    with pytest.raises(FusebenchError, match=r"search\.pq_m=33 is more than model .*width 32.*valid: 1\.\.32"):
        faiss_lists(model, caption_image, 10, config("ivf_pq", nlist=4, nprobe=2, pq_m=33), CPU, None)


def test_a_pq_m_wider_than_any_model_is_refused_before_any_index_is_built(monkeypatch):
    """Two models, 32 and 16 wide, pq_m=20: the second's refusal comes before the first model's index is built."""
    from fusebench.backends.kinds import faiss as faiss_backend
    from fusebench.backends.retrieval import ListSource, SearchSettings
    from fusebench.fusion.config import FusionConfig

    wide, caption_image = make_case(n_images=300, dim=32, seed=5)
    rng = np.random.default_rng(6)
    image = _unit(rng.standard_normal((300, 16)))
    narrow = ModelEmbeddings("narrow", image, _unit(image[caption_image] + rng.standard_normal((len(caption_image), 16))))
    monkeypatch.setattr(ann, "build_index", lambda *a, **k: pytest.fail("an index was built before the refusal"))
    with pytest.raises(FusebenchError, match=r"search\.pq_m=20 is more than model narrow's width 16"):
        faiss_backend.run([wide, narrow], caption_image, FusionConfig(method="rrf", top_k=10), 10,
                          config("ivf_pq", nlist=4, nprobe=2, pq_m=20, nbits=4), SearchSettings(), ListSource(), "")


def test_parameters_the_index_cannot_take_are_refused_before_any_work(case):
    """The index rules are config.search's, checked once per run before any embedding work (the pipeline calls
    check_sizes with the corpus's sizes; check_depth runs when the config is checked)."""
    model, caption_image = case
    sizes = {"t2i": len(model.image), "i2t": len(caption_image)}
    with pytest.raises(FusebenchError, match=r"search\.nbits=9 needs at least 512 items.*valid search\.nbits is 4\.\.8"):
        check_sizes(config("ivf_pq", nlist=4, nprobe=2, nbits=9), sizes, 10)
    with pytest.raises(FusebenchError, match=r"search\.ef_search=16 is below the list depth 20"):
        check_depth(config("hnsw", ef_search=16), 20)
    with pytest.raises(FusebenchError, match=r"search\.nprobe=40 is more than the \d+ lists"):
        check_sizes(config("ivf_flat", nlist=None, nprobe=40), sizes, 20)


def test_threads_are_set_for_the_search_and_restored(case, monkeypatch):
    model, caption_image = case
    before = faiss.omp_get_max_threads()
    seen = []
    real = ann.search_blocks

    def spy(*args):
        seen.append(faiss.omp_get_max_threads())
        return real(*args)

    monkeypatch.setattr(ann, "search_blocks", spy)
    faiss_lists(model, caption_image, 10, config(threads=1), CPU, None)
    assert seen == [1, 1] and faiss.omp_get_max_threads() == before


def test_progress_counts_every_item_and_query(case, monkeypatch):
    model, caption_image = case
    monkeypatch.setattr(ann, "QUERY_BLOCK", 64)
    counts = {}

    def progress(desc, total):
        counts[desc] = [total, 0]
        return lambda n: counts[desc].__setitem__(1, counts[desc][1] + n)

    faiss_lists(model, caption_image, 10, config(), CPU, None, progress=progress)
    n_query_images = len(np.unique(caption_image))
    assert counts == {"index m t2i": [300, 300], "search m t2i": [len(caption_image)] * 2,
                      "index m i2t": [len(caption_image)] * 2, "search m i2t": [n_query_images] * 2}


def test_missing_faiss_names_the_extra(case, monkeypatch):
    model, caption_image = case
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss now raises ImportError
    with pytest.raises(FusebenchError, match=r"pip install 'fusebench\[faiss\]'"):
        faiss_lists(model, caption_image, 10, config(), CPU, None)
    with pytest.raises(FusebenchError, match=r"fusebench\[faiss\]"):
        faiss_version()


def test_faiss_version_names_the_library():
    assert faiss_version() == f"faiss {faiss.__version__}"


class FakeGpuFaiss:
    """What ``searcher`` reads of a FAISS GPU build (this machine's faiss-cpu has none of it)."""

    def __init__(self, gpus=1, fails=False):
        self.gpus, self.fails, self.copied = gpus, fails, []

    def StandardGpuResources(self):  # noqa: N802 (FAISS's name)
        return "resources"

    def get_num_gpus(self):
        return self.gpus

    def index_cpu_to_gpu(self, resources, device, index):
        if self.fails:
            raise RuntimeError("not supported on the GPU")
        self.copied.append((resources, device, index))
        return type("GpuIndex", (), {"nprobe": 1})()


def test_flat_and_ivf_indexes_search_on_the_gpu_when_faiss_has_one(caplog):
    cuda = torch.device("cuda:1")
    fake = FakeGpuFaiss()
    gpu, where, resources = ann.searcher(fake, "cpu index", "ivf_flat", cuda, 100, {"nprobe": 24})
    assert where == "cuda" and resources == "resources" and gpu.nprobe == 24
    assert fake.copied == [("resources", 1, "cpu index")]
    for kind, device, k, faiss_module in [("hnsw", cuda, 100, fake), ("flat", CPU, 100, fake),
                                          ("flat", cuda, 100, FakeGpuFaiss(gpus=0)), ("flat", cuda, 4096, fake),
                                          ("flat", cuda, 100, faiss)]:
        assert ann.searcher(faiss_module, "cpu index", kind, device, k, {}) == ("cpu index", "cpu", None)
    assert ann.searcher(FakeGpuFaiss(fails=True), "cpu index", "ivf_pq", cuda, 100, {"nprobe": 8})[:2] == \
        ("cpu index", "cpu")
    assert "searching on the CPU" in caplog.text
