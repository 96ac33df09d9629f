"""A world of scores for the distractor-scaling study: each query's target score, its test split's other scores
and every distractor's score drawn directly (no embeddings), so exact ranks and saved lists at nested gallery
sizes are cheap, and each query's true chance of losing its target to one more distractor is known."""

import numpy as np
from scipy.stats import norm


class ScoreWorld:
    """``caption_image``: each query's target (a test image index). Distractor scores for query q are
    N(0, spread) with probability 1 - hard, else N(target_q - gap, hard_spread) (near copies of some scene); the
    target's score N(target_mean, target_spread); other test images N(0, spread)."""

    def __init__(self, caption_image: np.ndarray, n_test: int, seed: int = 0, spread: float = 0.1,
                 hard: float = 2e-4, gap: float = 0.15, hard_spread: float = 0.06, target_mean: float = 0.45,
                 target_spread: float = 0.08):
        self.caption_image, self.n_test = np.asarray(caption_image), int(n_test)
        self.spread, self.hard, self.gap, self.hard_spread = spread, hard, gap, hard_spread
        rng = np.random.default_rng([seed, 0])
        q = len(self.caption_image)
        self.target = target_mean + target_spread * rng.standard_normal(q)
        self.test = spread * rng.standard_normal((q, n_test))
        self.test[np.arange(q), self.caption_image] = self.target
        self.seed = seed

    def true_rate(self) -> np.ndarray:
        """Per query, the exact chance that one distractor outscores its target."""
        bulk = norm.sf(self.target / self.spread)
        near = norm.sf(self.gap / self.hard_spread)  # (target - (target - gap)) / hard_spread
        return (1 - self.hard) * bulk + self.hard * near

    def _distractors(self, start: int, stop: int) -> np.ndarray:
        """Scores of distractors start..stop-1 for every query ((Q, stop - start); blocks of 1,000 seeded apart)."""
        blocks = []
        for b in range(start // 1000, (stop - 1) // 1000 + 1):
            rng = np.random.default_rng([self.seed, 1, b])
            q = len(self.target)
            scores = self.spread * rng.standard_normal((q, 1000))
            hard = rng.random((q, 1000)) < self.hard
            near = self.target[:, None] - self.gap + self.hard_spread * rng.standard_normal((q, 1000))
            blocks.append(np.where(hard, near, scores))
        rows = np.hstack(blocks)
        offset = (start // 1000) * 1000
        return rows[:, start - offset:stop - offset]

    def at(self, size: int, depth: int = 25) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(exact t2i ranks, saved ids, saved scores) with the first ``size`` distractors (item ids: test images,
        then distractors from n_test), lists ``depth`` deep, float32 scores as a run saves them."""
        scores = np.hstack([self.test, self._distractors(0, size)]) if size else self.test
        ranks = 1 + (scores > self.target[:, None]).sum(axis=1)
        ids = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        return ranks, ids.astype(np.int32), np.take_along_axis(scores, ids, axis=1).astype(np.float32)


def sim_lists(corpus, params, sizes: list[int], depth: int = 25, gallery_seed: int = 0, chunk: int = 16384) -> dict:
    """A sim model's exact t2i ranks and saved lists (ids, scores) over nested ``gallery=sim`` galleries of each
    size in ``sizes`` (0 included: the test split alone), computed the obvious way, streaming the distractors
    through :class:`~fusebench.encoders.simulated.SimDistractorRows` (the rows a run searches)."""
    import torch

    from fusebench.config.gallery import GalleryConfig
    from fusebench.encoders.simulated import SimDistractorRows, sim_arrays

    image, text = sim_arrays(params, corpus)
    image = image / np.linalg.norm(image, axis=1, keepdims=True)
    text = text / np.linalg.norm(text, axis=1, keepdims=True)
    scores = text @ image.T
    targets = np.asarray(corpus.caption_image)
    target = scores[np.arange(len(text)), targets]
    above = (scores > target[:, None]).sum(axis=1)
    top_ids = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
    top = np.take_along_axis(scores, top_ids, axis=1)
    out = {0: (1 + above, top_ids.astype(np.int32), top.astype(np.float32))} if 0 in sizes else {}
    rows = SimDistractorRows(params, corpus, GalleryConfig(kind="sim", size=max(sizes), seed=gallery_seed,
                                                           near_duplicate=None))
    done, n_test = 0, len(image)
    for size in sorted(s for s in sizes if s > 0):
        while done < size:
            stop = min(done + chunk, size)
            block = text @ rows.read(done, stop).T
            above = above + (block > target[:, None]).sum(axis=1)
            k = min(depth, block.shape[1])
            best = torch.from_numpy(block).topk(k, dim=1, sorted=False)
            ids = np.hstack([top_ids, best.indices.numpy() + n_test + done])
            values = np.hstack([top, best.values.numpy()])
            order = np.lexsort((ids, -values), axis=1)[:, :depth]  # ties: the lower id first
            top_ids, top = np.take_along_axis(ids, order, axis=1), np.take_along_axis(values, order, axis=1)
            done = stop
        out[size] = (1 + above, top_ids.astype(np.int32), top.astype(np.float32))
    return out

