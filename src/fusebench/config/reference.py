"""The reference study's rows (``data/article_reference.json``): what ``reference: {dataset, study}`` resolves to
when the config is checked (``config.run``); the report places them beside a run's numbers (``report.article``)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from fusebench import FusebenchError
from fusebench.config.schema import ReferenceConfig

REFERENCE_FILE = Path(__file__).resolve().parents[1] / "data" / "article_reference.json"


@cache
def article() -> dict:
    return json.loads(REFERENCE_FILE.read_text(encoding="utf-8"))


def reference_row(reference: ReferenceConfig | None) -> dict | None:
    """The article's row for ``reference: {dataset, study}`` (None when unset, or when the article has none)."""
    if reference is None:
        return None
    dataset, study = reference.dataset, reference.study
    rows = article().get(dataset)
    if not isinstance(rows, dict):
        raise FusebenchError(f"reference.dataset={dataset!r} is not valid; valid: "
                             f"{', '.join(k for k, v in article().items() if isinstance(v, dict))}.")
    row = rows.get(study)
    return None if not isinstance(row, dict) else {"dataset": dataset, "study": study, **row}
