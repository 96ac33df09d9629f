"""Search: per model, per direction, ranked lists from embeddings. ``exact`` is stable top-k and the ranks of
known targets on any torch device; ``topk_kernels`` (numba) select running top-k per row and per column of a score
block in one read; ``row_kernels`` (numba) order and rank whole rows; ``model_lists`` streams one model's
similarity matrix in tiles into its lists, both directions, with every query's exact rank; ``gallery_search`` does
the same over a gallery of distractors streamed tile by tile (memory bounded by the tiles), with ``margin``'s
certified bf16 / TF32 path for accelerators; ``ranked`` is the one ranked-list type every stage hands on. Who
answers a run's queries (exact search, a FAISS index, an engine) is a search backend: ``fusebench.backends``.
"""
