"""fusebench: measure whether fusing image-text embedding models beats the best single model.

The packages, bottom to top (each imports only the ones above it in this list: ``tests/test_layers.py``):

- ``runtime``     the bottom layer: process state, progress, typed config reads, the plugin ``Registry``, run-dir names and lock
- ``search``      exact top-k and its kernels, one model's ranked lists, the ranked-list type
- ``fusion``      the fusion group's type, one module per method (``fusion/methods``), whole rankings, engine presets
- ``config``      the config groups' schemas (``conf/`` at the repository root), kinds and backends read from their registries
- ``stores``      what is computed once and reused (one ``Store`` base): embeddings, lists, score matrices, near-duplicates, indexes
- ``data``        the corpus type; one module per dataset kind (``data/kinds``); galleries' distractor sources
- ``encoders``    one module per model kind (``encoders/kinds``) behind one interface; query text; gallery shards
- ``evaluation``  metrics, paired statistics, comparisons, extra positives, tuning, extrapolation, the run record
- ``library``     plain-array search, fuse, ranks, recall and compare over what a caller holds (no Hydra, no files)
- ``backends``    who answers the queries: one module per search backend or engine (``backends/kinds``)
- ``report``      a run's files, the printed table, one module per plot (``report/plots``), sweep reports, notebooks
- ``app``         the commands, one run's named stages (``app.pipeline``), run dirs, W&B tracking, interrupts

A fusion method, dataset kind, model kind, search backend or plot is one module in its package's plugin folder,
found by a scan (``runtime.plugins.Registry``); every list of their names is read from the registry.

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
        from fusebench.app import api  # lazy: heavy (numpy)

        return getattr(api, name)
    raise AttributeError(f"module 'fusebench' has no attribute {name!r}")
