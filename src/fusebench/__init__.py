"""fusebench: measure whether fusing image-text embedding models beats the best single model.

The packages read as a run's data flows (``app.pipeline.run`` holds the flow on one screen):

- ``config``      the config groups' schemas (``conf/`` at the repository root), typed reads, model keys per kind
- ``data``        the corpus type and one loader per source (a new dataset goes here)
- ``encoders``    embedding sources behind one interface, one plugin module per model kind (``encoders/kinds``); query text; devices
- ``stores``      what is computed once and reused: embeddings, ranked lists, score matrices (one entry mechanism)
- ``search``      exact top-k and its kernels, one model's ranked lists (approximate index backends go here)
- ``fusion``      normalisers x aggregations, fusion over whole rankings, engine presets (a new method goes here)
- ``evaluation``  metrics, paired statistics, comparisons, extra positives, tuning, the run record
- ``library``     plain-array search, fuse, ranks, recall and compare over what a caller holds (no Hydra, no files)
- ``report``      a run's files, the printed table, plots, sweep summaries, notebook helpers (a new plot goes here)
- ``app``         the commands, one run's orchestration, run dirs, W&B tracking, progress, interrupts

The Python API (``app.api``): ``fusebench.evaluate(models, caption_image, ...)`` over embeddings a notebook
holds, and ``fusebench.run(overrides)``, any job of the ``fusebench`` command; both return a ``Result``.

Importing ``fusebench`` imports nothing heavy (the API is imported on first use).
"""

__version__ = "0.1.0"
FUSED = "fused"  # the fused retriever's name in a run's record (model names may not take it)
DIRECTIONS = ("t2i", "i2t")  # text-to-image (captions search images) and image-to-text


class FusebenchError(ValueError):
    """A user-facing error: bad input, bad config. The message says what is wrong and what is valid."""


API = ("evaluate", "run", "Result")  # fusebench.evaluate, fusebench.run, fusebench.Result (fusebench.app.api)


def __getattr__(name: str):
    """The API's names, imported on first use so that ``import fusebench`` stays light."""
    if name in API:
        from fusebench.app import api

        return getattr(api, name)
    raise AttributeError(f"module 'fusebench' has no attribute {name!r}")
