"""The dataset kinds: one module per kind (``dataset.kind``), each registering one :class:`DatasetKind` (its name,
its parameters dataclass, the loader, a one-line doc), found by a scan of this package
(:class:`fusebench.runtime.plugins.Registry`). Every list that names dataset kinds is derived from :data:`REGISTRY`:
the ``dataset`` group's valid kinds and types (``config.run.dataset_config``; each kind's dataclass is stored with
Hydra as ``schema_dataset_NAME``), ``data.load_corpus``'s dispatch, the tuning splits (``data.other_split``), the
advice of ``evaluation.positives`` and docs/config.md's table of kinds (checked by ``tests/test_dataset_kinds.py``).

The registry object itself is :data:`fusebench.config.schema.DATASET_KINDS`: the config layer, below this one,
reads it (by this package's dotted name, on first use), and the kinds register into it from here.

A kind's parameters dataclass holds its keys (types, defaults, one-line comments) and, in ``__post_init__``, every
check it owns, run when the config is converted, before any work. Light on purpose: the CLI scans the kinds to check
a config before any heavy import, so a kind imports its loader (numpy, PIL, pyarrow) inside ``load``.

A new dataset kind is one module here (``KIND = register(DatasetKind(...))``: see ``hf.py``), one
``conf/dataset/NAME.yaml``, one row in docs/config.md's table of dataset kinds and a test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fusebench.config.schema import DATASET_KINDS


@dataclass(frozen=True)
class DatasetKind:
    name: str  # the value of dataset.kind
    params: type  # the dataclass of its keys (dataset.KEY); its __post_init__ checks them
    load: Callable  # (params) -> Corpus
    doc: str  # one line: what it reads (docs/config.md's table)
    order: int = 50  # the order kinds are listed in (messages, docs)
    tuning: Callable | None = None  # (params, split, n_images, seed) -> Corpus: another split's images and captions,
    #   at most n_images, for choosing a setting on (search.target_recall); None: one split only
    split_params: Callable | None = None  # (params, split) -> the params loading split `split` of the same data
    #   (its counts unchecked, marked non-standard); set: tune=weights tunes on its val split (tune.split=auto is
    #   val, seeded is refused); None: tune=weights holds out a seeded share of the test images


REGISTRY = DATASET_KINDS  # filled by a scan of this package
register = REGISTRY.register


def kind(name: str) -> DatasetKind:
    return REGISTRY.get(name)
