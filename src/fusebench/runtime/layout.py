"""Where things are on disk, by name: the config groups' folder (``CONFIG_DIR``); what a run writes into its dir, the
one list the run dir's checks (``app.rundir``), its outputs (``report.outputs``) and the sweep report's scan
(``report.runs``) share; the plots' registry, whose names are the PNGs a run dir's ``plots/`` and a sweep report
hold; and how an error.txt fusebench wrote is told from anyone else's file."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fusebench.runtime.plugins import Registry

_PACKAGE = Path(__file__).resolve().parents[1]


def _config_dir() -> Path:
    """The YAML config groups: the repository's top-level ``conf/``, the only copy. A wheel ships them as
    ``fusebench/conf`` (``pyproject.toml`` maps ``conf/`` there); a checkout or an editable install reads ``conf/``."""
    packaged = _PACKAGE / "conf"  # a wheel or a regular install: fusebench/conf
    if (packaged / "config.yaml").is_file():
        return packaged
    return _PACKAGE.parents[1] / "conf"  # a checkout (editable install): <repo>/src/fusebench -> <repo>/conf


CONFIG_DIR = str(_config_dir())
OUTPUTS = ("metrics.json", "ranks", "topk", "plots", "error.txt")  # what a run writes into its dir
# the plots, one module each in fusebench.report.plots (scanned by dotted name on first use, so this bottom layer
# reads their names without importing the report): a plot's name is the PNG it writes
PLOT_REGISTRY = Registry("fusebench.report.plots", "plot", "plots")
PLOTS_MANIFEST = ".fusebench-plots.json"  # in plots/: each plot the run drew, with its sha256 (null: being drawn)
PLOTS_FORMAT = "fusebench run plots"
# the first bytes of an error.txt fusebench writes: a bug's traceback, or a user's mistake in one line
ERROR_FILE_STARTS = (b"Traceback (most recent call last):", b"fusebench: error: ")


def plot_names(scope: str) -> tuple[str, ...]:
    """The PNGs drawn in ``scope``: ``run`` (what a run dir's plots/ holds: ``report.plots.run_plots``) or
    ``sweep`` (a sweep report's: ``report.plots.sweep_plots``). A function, not a constant: reading the registry
    imports the plot modules, which importing this module must not. In drawing order."""
    return tuple(p.name for p in PLOT_REGISTRY.items() if scope in p.scopes)


def run_plot_names() -> tuple[str, ...]:
    return plot_names("run")


def is_error_file(path: Path) -> bool:
    """Whether ``path`` is an error.txt fusebench wrote: a failed sweep job's traceback, or exactly the one line
    ``fusebench: error: ...`` of a user's mistake (a file with more after that line is someone else's)."""
    with Path(path).open("rb") as fh:
        data = fh.read(1 << 20)
    if data.startswith(ERROR_FILE_STARTS[1]):
        return data.count(b"\n") == 1 and data.endswith(b"\n")
    return data.startswith(ERROR_FILE_STARTS[0])


def error_text(message: str | None, trace: str) -> str:
    """What a failed sweep job's error.txt holds: the one-line ``message`` of a user's mistake, else the
    traceback ``trace`` (a bug)."""
    return f"fusebench: error: {message}\n" if message else trace


def read_plots_manifest(plots_dir: Path) -> dict[str, str | None] | None:
    """The plots a run drew in ``plots_dir`` (name -> sha256, None while it was being drawn), or None when the
    folder holds no manifest fusebench wrote (a run dir written before manifests were kept, or none at all)."""
    try:
        data = json.loads((Path(plots_dir) / PLOTS_MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    plots = data.get("plots") if isinstance(data, dict) and data.get("format") == PLOTS_FORMAT else None
    if not isinstance(plots, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, str))
                                              for k, v in plots.items()):
        return None
    return plots


def begins_as(path: Path, fmt: str) -> bool:
    """Whether the file at ``path`` begins as fusebench writes a JSON file of format ``fmt`` (``{"format": fmt``,
    compact or indented), or is a beginning of that (cut short, down to empty): one of its own, damaged, which is
    rebuilt, never a dead end."""
    try:
        with Path(path).open("rb") as fh:
            head = fh.read(256)
    except OSError:
        return False
    if re.match(rb'\{\s*"format":\s*"' + re.escape(fmt.encode()) + rb'"', head) is not None:
        return True
    openings = [json.dumps({"format": fmt}, indent=i)[:-1].rstrip().encode() for i in (None, 1)]
    return any(opening.startswith(head) for opening in openings)


def plots_manifest_text(plots: dict[str, str | None]) -> str:
    return json.dumps({"format": PLOTS_FORMAT, "plots": plots}, indent=1, sort_keys=True) + "\n"
