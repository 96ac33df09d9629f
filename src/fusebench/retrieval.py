"""Every retriever's ranked lists and exact ranks, both directions, in one chunked pass per model.

One similarity matrix per model (captions x images, fp32) serves both directions: its rows are the t2i
queries, its columns the i2t queries. It is computed in blocks of caption rows, so memory stays at
``chunk_size x n_images`` per model however large the corpus. Per block we take each caption's top-k images
and each image's top-k captions (merged across blocks at the end); t2i fusion happens per block, i2t fusion
after the last block. Ranks: a query whose first correct item is in its top-k list gets its list position
(exact, the lists follow the stable tie rule); the few others are counted exactly against the full row
(t2i, same block) or a recomputed full column (i2t).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fusebench.fusion import FusionConfig, fuse_in_blocks
from fusebench.metrics import i2t_list_ranks, t2i_list_ranks
from fusebench.search import column_target_ranks, merge_topk, target_ranks, topk_stable



@dataclass
class ModelInput:
    name: str
    image: np.ndarray | torch.Tensor  # (N, d), L2-normalised
    text: np.ndarray | torch.Tensor  # (Q, d), L2-normalised
    weight: float = 1.0


@dataclass
class RankedLists:
    """One retriever in one direction: per-query exact ranks and its (possibly truncated) ranked list."""

    ranks: np.ndarray  # (queries,) 1-based rank of the first correct item, 0 when absent from the list
    ids: torch.Tensor  # (queries, L) int64 item index per position, -1 padding
    scores: torch.Tensor  # (queries, L) float32
    contributors: torch.Tensor | None = None  # fused only: bitmask of models holding each entry


def _t2i_block_ranks(scores: torch.Tensor, ids: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    ranks = torch.as_tensor(t2i_list_ranks(ids, targets), device=scores.device)
    missing = torch.nonzero(ranks == 0).flatten()
    if missing.numel():
        ranks[missing] = target_ranks(scores[missing], targets[missing])
    return ranks.cpu().numpy()


def _i2t_ranks(ids: torch.Tensor, text: torch.Tensor, image: torch.Tensor, query_images: torch.Tensor,
               cap_img: torch.Tensor, block: int = 256) -> np.ndarray:
    ranks = torch.as_tensor(i2t_list_ranks(ids, query_images, cap_img), device=text.device)
    missing = torch.nonzero(ranks == 0).flatten()
    for start in range(0, missing.numel(), block):
        rows = missing[start:start + block]
        columns = text @ image[query_images[rows]].T
        ranks[rows] = column_target_ranks(columns, cap_img, query_images[rows])
    return ranks.cpu().numpy()


def retrieve(models: Sequence[ModelInput], caption_image: np.ndarray, fusion: FusionConfig, keep_k: int | None,
             chunk_size: int = 4096, device: torch.device | str = "cpu",
             progress: Callable[[int], None] | None = None) -> dict[str, dict[str, RankedLists]]:
    """Ranked lists and ranks for each model alone and, with 2+ models and a method, for ``fused``.

    Ranks are computed from the full lists (single models: their full ranking); the lists returned are cut
    to their first ``keep_k`` entries (None = keep all), so memory stays small even with ``top_k`` = all.
    Returns ``{retriever: {"t2i": RankedLists, "i2t": RankedLists}}``; i2t rows are the images that have
    captions, in index order.
    """
    device = torch.device(device)
    n_captions = len(caption_image)
    images = [torch.as_tensor(np.asarray(m.image), dtype=torch.float32).to(device) for m in models]
    texts = [torch.as_tensor(np.asarray(m.text), dtype=torch.float32).to(device) for m in models]
    n_images = images[0].shape[0]
    cap_img = torch.as_tensor(caption_image, dtype=torch.int64, device=device)
    query_images = torch.unique(cap_img)
    fusing = fusion.method != "none" and len(models) >= 2
    weights = [float(m.weight) for m in models]
    k_t2i, k_i2t = fusion.per_model_k(n_images), fusion.per_model_k(n_captions)
    if not fusing and keep_k is not None:  # lists serve only ranks (exact either way) and inspection
        k_t2i, k_i2t = min(k_t2i, keep_k), min(k_i2t, keep_k)
    keep = slice(None) if keep_k is None else slice(0, keep_k)

    t2i = [{"ranks": [], "ids": [], "scores": []} for _ in models]
    block_buffer = torch.empty(min(chunk_size, n_captions), n_images, dtype=torch.float32, device=device)
    i2t_chunks: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in models]
    fused_t2i = {"ranks": [], "ids": [], "scores": [], "contributors": []}
    previous_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # no TF32: ranks are of fp32 scores
    try:
        for r0 in range(0, n_captions, chunk_size):
            r1 = min(r0 + chunk_size, n_captions)
            targets = cap_img[r0:r1]
            block_lists = []
            for m in range(len(models)):
                scores = torch.matmul(texts[m][r0:r1], images[m].T, out=block_buffer[: r1 - r0])
                values, ids = topk_stable(scores, k_t2i)
                block_lists.append((ids, values))
                t2i[m]["ranks"].append(_t2i_block_ranks(scores, ids, targets))
                t2i[m]["ids"].append(ids[:, keep].cpu())
                t2i[m]["scores"].append(values[:, keep].cpu())
                col_values, col_ids = topk_stable(scores.T, k_i2t)
                i2t_chunks[m].append((col_values, col_ids + r0))
            if fusing:
                fused = fuse_in_blocks([b[0] for b in block_lists], [b[1] for b in block_lists], fusion,
                                       fusion.final_k(n_images, len(models)), weights)
                fused_t2i["ranks"].append(t2i_list_ranks(fused.ids, targets))
                for key in ("ids", "scores", "contributors"):
                    fused_t2i[key].append(getattr(fused, key)[:, keep].cpu())
            if progress is not None:
                progress(r1 - r0)

        results: dict[str, dict[str, RankedLists]] = {}
        i2t_lists = []
        for m, model in enumerate(models):
            values, ids = merge_topk(i2t_chunks[m], k_i2t)
            values, ids = values[query_images], ids[query_images]
            i2t_lists.append((ids, values))
            results[model.name] = {
                "t2i": RankedLists(np.concatenate(t2i[m]["ranks"]), torch.cat(t2i[m]["ids"]),
                                   torch.cat(t2i[m]["scores"])),
                "i2t": RankedLists(_i2t_ranks(ids, texts[m], images[m], query_images, cap_img),
                                   ids[:, keep].cpu(), values[:, keep].cpu()),
            }
    finally:
        torch.set_float32_matmul_precision(previous_precision)
    if fusing:
        fused = fuse_in_blocks([l[0] for l in i2t_lists], [l[1] for l in i2t_lists], fusion,
                               fusion.final_k(n_captions, len(models)), weights)
        results["fused"] = {
            "t2i": RankedLists(np.concatenate(fused_t2i["ranks"]), torch.cat(fused_t2i["ids"]),
                               torch.cat(fused_t2i["scores"]), torch.cat(fused_t2i["contributors"])),
            "i2t": RankedLists(i2t_list_ranks(fused.ids, query_images, cap_img), fused.ids[:, keep].cpu(),
                               fused.scores[:, keep].cpu(), fused.contributors[:, keep].cpu()),
        }
    return results
