import numpy as np
import pytest
import torch
from helpers.reference import fuse_one_query
from helpers.tiers import fast_first

from fusebench import FusebenchError
from fusebench.fusion.combine import fuse, fuse_in_blocks, plain_evidence
from fusebench.fusion.config import COMBINES, FUSE_ON, MEANS, METHODS, FusionConfig
from fusebench.fusion.methods import REGISTRY


def _evidence(method, scores, valid, **settings):
    """A method's evidence for each list, through the path fusion runs (the registry's method, by its kind)."""
    return plain_evidence(scores, valid, FusionConfig(method=method, **settings))


def dbsf_evidence(scores, valid, ddof):
    return _evidence("dbsf", scores, valid, params={"ddof": ddof})


def minmax_evidence(scores, valid):
    return _evidence("minmax", scores, valid)


def zscore_evidence(scores, valid, ddof):
    return _evidence("zscore", scores, valid, params={"ddof": ddof})


def rrf_evidence(scores, valid, rrf_k):
    return _evidence("rrf", scores, valid, params={"rrf_k": rrf_k})

FUSING = [m for m in METHODS if m != "none"]


def _random_lists(seed: int, rows: int = 40, k: int = 12, n_items: int = 30, models: int = 3):
    """Per-model ranked lists with overlapping ids, tied scores (multiples of 1/8) and -1 padding."""
    rng = np.random.default_rng(seed)
    ids, scores = [], []
    for _ in range(models):
        model_ids = np.full((rows, k), -1, dtype=np.int64)
        model_scores = np.full((rows, k), -np.inf, dtype=np.float32)
        for r in range(rows):
            length = k if r % 5 else int(rng.integers(1, k + 1))
            model_ids[r, :length] = rng.choice(n_items, size=length, replace=False)
            model_scores[r, :length] = np.sort(rng.integers(0, 8, size=length) / 8.0)[::-1]
        ids.append(torch.from_numpy(model_ids))
        scores.append(torch.from_numpy(model_scores))
    return ids, scores


def _query_lists(ids, scores, row):
    return [(m_ids[row].tolist(), m_scores[row].tolist()) for m_ids, m_scores in zip(ids, scores)]


def _valid(method: str, fuse_on: str, combine: str) -> bool:
    """Weighted means and Borda combine an image across lists: source_object only; Borda adds (combine sum)."""
    if method == "borda" and combine != "sum":
        return False
    return fuse_on == "source_object" or (combine not in MEANS and method != "borda")


def _tie_groups(entries, rel=1e-5):
    """Consecutive (id, score, bits) entries with scores equal to ``rel`` as (score, set of (id, bits))."""
    out = []
    for item, score, bits in entries:
        if out and abs(out[-1][0] - score) <= rel * max(1.0, abs(score)):
            out[-1][1].add((item, bits))
        else:
            out.append((score, {(item, bits)}))
    return out


@pytest.mark.slow  # > 0.1 s: outside the unit tier
@pytest.mark.parametrize("method", FUSING)
@pytest.mark.parametrize("fuse_on", FUSE_ON)
@pytest.mark.parametrize("combine", fast_first(COMBINES, 2))
def test_fuse_matches_per_query_reference(method, fuse_on, combine):
    if not _valid(method, fuse_on, combine):
        with pytest.raises(FusebenchError, match="source_object|borda"):
            FusionConfig(method=method, fuse_on=fuse_on, combine=combine)
        return
    ids, scores = _random_lists(seed=10 * list(FUSING).index(method) + FUSE_ON.index(fuse_on))  # reproducible
    weights = [1.0, 0.5, 2.0]
    config = FusionConfig(method=method, fuse_on=fuse_on, params={"rrf_k": 60.0, "ddof": 0}, combine=combine)
    logs = combine in ("geometric", "harmonic")  # logs and divisions: equal to rounding, compared per tie group
    final_k = 36 if logs else 15
    fused = fuse(ids, scores, config, final_k=final_k, weights=weights)
    for row in range(ids[0].shape[0]):
        expected = fuse_one_query(_query_lists(ids, scores, row), method, fuse_on, final_k, weights, combine=combine)
        got = [(i, s, b) for i, s, b in zip(fused.ids[row].tolist(), fused.scores[row].tolist(),
                                            fused.contributors[row].tolist()) if i >= 0]
        assert len(got) == len(expected) and (fused.ids[row, len(expected):] == -1).all()
        if logs:
            mine, theirs = _tie_groups(got), _tie_groups(expected)
            assert [g[1] for g in mine] == [g[1] for g in theirs], (method, row)
            assert [g[0] for g in mine] == pytest.approx([g[0] for g in theirs], rel=1e-5)
            continue
        assert [g[0] for g in got] == [e[0] for e in expected], (method, fuse_on, row)
        assert [g[1] for g in got] == pytest.approx([e[1] for e in expected], abs=0)
        assert [g[2] for g in got] == [e[2] for e in expected]


@pytest.mark.parametrize("fuse_on", FUSE_ON)
def test_fuse_in_blocks_equals_one_block(fuse_on):
    ids, scores = _random_lists(seed=3, rows=50)
    config = FusionConfig(method="dbsf", fuse_on=fuse_on, top_k=12, final_top_k=10)
    whole = fuse(ids, scores, FusionConfig(method="dbsf", fuse_on=fuse_on), 10)
    blocked = fuse_in_blocks(ids, scores, config, 10, max_entries=100)
    assert torch.equal(whole.ids, blocked.ids) and torch.equal(whole.scores, blocked.scores)


def test_dbsf_exact_numbers_population_and_sample():
    scores = torch.tensor([[0.9, 0.7, 0.5]])
    valid = torch.ones_like(scores, dtype=torch.bool)
    # population sd = sqrt(0.08 / 3); low = 0.7 - 3 sd; s' = (s - low) / (6 sd)
    sd = np.sqrt(0.08 / 3)
    expected = [(s - (0.7 - 3 * sd)) / (6 * sd) for s in (0.9, 0.7, 0.5)]
    assert dbsf_evidence(scores, valid, ddof=0)[0].tolist() == pytest.approx(expected, rel=1e-6)
    # sample sd = 0.2 (Qdrant): low = 0.1, span 1.2
    assert dbsf_evidence(scores, valid, ddof=1)[0].tolist() == pytest.approx([2 / 3, 0.5, 1 / 3], rel=1e-6)


def test_dbsf_ignores_padding_and_handles_zero_sd():
    scores = torch.tensor([[0.9, 0.7, 0.5, -5.0], [0.3, 0.3, 0.3, 0.3]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True]])
    out = dbsf_evidence(scores, valid, ddof=0)
    assert out[0, :3].tolist() == pytest.approx(dbsf_evidence(scores[:1, :3], valid[:1, :3], ddof=0)[0].tolist())
    assert out[1].tolist() == [0.5] * 4
    # no clipping: a score above mean + 3 sd maps above 1
    spread = torch.tensor([[10.0] + [0.0] * 20])
    assert dbsf_evidence(spread, torch.ones_like(spread, dtype=torch.bool), ddof=0)[0, 0] > 1.0


def test_rrf_minmax_zscore_exact_numbers():
    scores = torch.tensor([[0.8, 0.6, 0.2]])
    valid = torch.ones_like(scores, dtype=torch.bool)
    assert rrf_evidence(scores, valid, rrf_k=60)[0].tolist() == pytest.approx([1 / 61, 1 / 62, 1 / 63])
    assert rrf_evidence(scores, valid, rrf_k=0)[0].tolist() == pytest.approx([1, 1 / 2, 1 / 3])
    assert minmax_evidence(scores, valid)[0].tolist() == pytest.approx([1.0, 4 / 6, 0.0])
    mean, sd = 1.6 / 3, np.std([0.8, 0.6, 0.2])
    assert zscore_evidence(scores, valid, ddof=0)[0].tolist() == pytest.approx([(s - mean) / sd for s in (0.8, 0.6, 0.2)], rel=1e-5)
    flat = torch.tensor([[0.4, 0.4]])
    assert minmax_evidence(flat, torch.ones_like(flat, dtype=torch.bool))[0].tolist() == [0.5, 0.5]
    assert zscore_evidence(flat, torch.ones_like(flat, dtype=torch.bool), ddof=0)[0].tolist() == [0.0, 0.0]


def test_tie_rule_first_appearance_model_by_model():
    ids = [torch.tensor([[10, 20]]), torch.tensor([[20, 10]])]
    scores = [torch.tensor([[0.9, 0.8]]), torch.tensor([[0.7, 0.6]])]
    # source_object: both get 1/61 + 1/62; 10 appears first (model 0, rank 1)
    assert fuse(ids, scores, FusionConfig(method="rrf", fuse_on="source_object"), 2).ids.tolist() == [[10, 20]]
    # document: (m0,10)=1/61, (m1,20)=1/61, (m0,20)=1/62, (m1,10)=1/62, in that order
    doc = fuse(ids, scores, FusionConfig(method="rrf", fuse_on="document"), 4)
    assert doc.ids.tolist() == [[10, 20, 20, 10]]
    assert doc.contributors.tolist() == [[1, 2, 1, 2]]


def test_rrf_by_document_never_changes_rank_one():
    ids, scores = _random_lists(seed=11, rows=200, models=2)
    for fuse_on, expect_same in (("document", True), ("source_object", False)):
        fused = fuse(ids, scores, FusionConfig(method="rrf", fuse_on=fuse_on), 10)
        same = fused.ids[:, 0] == ids[0][:, 0]
        if expect_same:
            assert same.all()
        else:  # keyed by image, agreement between models can lift another image to rank 1
            assert not same.all()


def test_weights_scale_evidence():
    ids = [torch.tensor([[1, 2]]), torch.tensor([[2, 1]])]
    scores = [torch.tensor([[0.9, 0.1]]), torch.tensor([[0.9, 0.1]])]
    assert fuse(ids, scores, FusionConfig(method="sum", fuse_on="source_object"), 2, weights=[1.0, 3.0]).ids.tolist() == [[2, 1]]
    assert fuse(ids, scores, FusionConfig(method="sum", fuse_on="source_object"), 2, weights=[3.0, 1.0]).ids.tolist() == [[1, 2]]


def test_every_method_has_evidence():
    assert set(REGISTRY.names()) == set(FUSING)


@pytest.mark.parametrize("kwargs,fragment", [
    ({"method": "condorcet"}, "valid: none, sum, minmax, zscore, isr, rrf, dbsf, l2, borda, rbc"),
    ({"score_map": "exp"}, "fusion.score_map"),
    ({"floor": "low"}, "fusion.floor"),
    ({"method": "borda", "combine": "max"}, "combine=sum"),
    ({"method": "rrf", "combine": "harmonic", "params": {"rrf_weighting": "rank"}}, "params.rrf_weighting=multiply"),
    ({"combine": "harmonic", "params": {"rrf_weighting": "rank"}},
     "fusion.params.rrf_weighting='rank' is never read with fusion.method=dbsf"),
    ({"method": "rrf", "params": {"rrf_weighting": "sum"}}, "fusion.params.rrf_weighting='sum' is not valid"),
    ({"method": "rrf", "params": {"rrf_k": -1}}, "fusion.params.rrf_k=-1 is not valid"),
    ({"fuse_on": "image"}, "valid: document, source_object"),
    ({"top_k": 0}, "fusion.top_k"),
    ({"final_top_k": -3}, "fusion.final_top_k"),
    ({"params": {"ddof": 2}}, "fusion.params.ddof=2 is not valid"),
    ({"ddof": 2}, "fusion.params.ddof=2 is not valid"),  # the old key: read as the new, checked alike
    ({"params": {"ddof": True}}, "fusion.params.ddof=True is not valid"),
])
def test_fusion_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(FusebenchError, match=fragment.replace(".", r"\.")):
        FusionConfig(**kwargs)


@pytest.mark.parametrize("key", ["top_k", "final_top_k"])
def test_lists_shorter_than_largest_k_rejected(key):
    with pytest.raises(FusebenchError, match=f"fusion.{key}=5 is below the largest eval.ks"):
        FusionConfig(**{key: 5}).check_ks([1, 5, 10])


def test_final_k_defaults_to_top_k_and_caps():
    assert FusionConfig(top_k=100).final_k(5000, 2) == 100
    assert FusionConfig(top_k=100, final_top_k=25).final_k(5000, 2) == 25
    assert FusionConfig(top_k=None).final_k(300, 2) == 300
    assert FusionConfig(top_k=None, fuse_on="document").final_k(300, 2) == 600


@pytest.mark.parametrize("combine", ["sum", "max", "mnz"])
@pytest.mark.parametrize("method", ["rrf", "dbsf", "minmax"])
def test_numba_kernel_equals_the_torch_path(method, combine, monkeypatch):
    """On the CPU source_object fusion runs in fusebench.search.topk_kernels.fuse_by_id; other devices take the torch path:
    both must give the same lists, scores and contributor bits exactly."""
    import fusebench.fusion.combine as fusion

    ids, scores = _random_lists(seed=21, rows=60)
    config = FusionConfig(method=method, combine=combine)
    kernel = fuse(ids, scores, config, 20, weights=[1.0, 0.5, 2.0])
    monkeypatch.setattr(fusion, "_kernel_combines", lambda config, all_ids: False)
    torch_path = fuse(ids, scores, config, 20, weights=[1.0, 0.5, 2.0])
    assert torch.equal(kernel.ids, torch_path.ids) and torch.equal(kernel.scores, torch_path.scores)
    assert torch.equal(kernel.contributors, torch_path.contributors)


@pytest.mark.parametrize("method", ["rrf", "sum"])
def test_ties_by_id_order_equal_scores_by_the_smaller_id(method):
    """fusion.ties=id (Milvus' newIDScores): the same entries and scores as ties=first, equal scores by smaller id,
    against the obvious sort of every fused entry; the cut keeps the smaller ids of a tie at the boundary."""
    rng = np.random.default_rng(5)
    rows, k = 40, 6
    ids = [torch.from_numpy(np.stack([rng.permutation(12)[:k] for _ in range(rows)])) for _ in range(2)]
    scores = [torch.from_numpy(np.sort(rng.choice([0.9, 0.5, 0.3], size=(rows, k)), axis=1)[:, ::-1].copy()
                               .astype(np.float32)) for _ in range(2)]
    first = FusionConfig(method=method, fuse_on="source_object", top_k=k)
    by_id = FusionConfig(method=method, fuse_on="source_object", top_k=k, ties="id")
    every = fuse(ids, scores, first, 2 * k)
    for final_k in (3, 2 * k):
        got = fuse(ids, scores, by_id, final_k)
        for q in range(rows):
            entries = [(float(s), int(i)) for i, s in zip(every.ids[q].tolist(), every.scores[q].tolist()) if i >= 0]
            expected = sorted(entries, key=lambda e: (-e[0], e[1]))[:final_k]
            mine = [(float(s), int(i)) for i, s in zip(got.ids[q].tolist(), got.scores[q].tolist()) if i >= 0]
            assert mine == expected
    assert any(len(set(fuse(ids, scores, first, 2 * k).scores[q].tolist())) < 2 * k for q in range(rows))  # ties occur


def test_ties_by_id_needs_lists():
    with pytest.raises(FusebenchError, match="fusion.ties=id"):
        FusionConfig(method="rrf", top_k=None, ties="id")
