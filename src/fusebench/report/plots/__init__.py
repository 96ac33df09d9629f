"""The plots (matplotlib, PNG): one module per plot in this package, each registering one :class:`Plot` (the file
it writes, where it is drawn, its settings, its rules, the drawing), found by a scan of this package
(:data:`fusebench.runtime.layout.PLOT_REGISTRY`, kept in the bottom layer so that the run dir's checks read the
names without importing the report). Every list that names plots is derived from the registry: the run dir's
(``runtime.layout.run_plot_names``), the sweep report's (``report.report_files``), the table in
docs/formats.md (checked by ``tests/test_plots.py``).

A plot's **scopes**: ``run`` (drawn into each run dir's ``plots/`` from its record and ranks: :func:`run_plots`),
``sweep`` (drawn by a sweep report from its summary: :func:`sweep_plots`), or both (the pair plots). ``draw(inputs,
path, params)`` gets :class:`RunInputs` or :class:`SweepInputs` and returns the path written, or None when the
inputs hold nothing to show (the plot is then absent, never empty).

Modules here keep their top level light (no matplotlib): the CLI reads the plot names before any job;
``_common.py`` imports matplotlib on a plot's first draw. What the plots share is in the ``_``-named modules,
which the scan skips.

A new plot is one module here (``PLOT = register(Plot(...))``: see ``query_ranks.py``), one line in the plots
table of docs/formats.md and a test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from fusebench.evaluation.record import RunRecord
from fusebench.report.plots._common import DPI, TITLE_Y, drawn_once, load_matplotlib, subplots, wilson
from fusebench.report.report_files import plots_dir
from fusebench.runtime.layout import PLOT_REGISTRY, PLOTS_MANIFEST, plots_manifest_text, run_plot_names
from fusebench.stores.files import atomic_write_text, file_sha256

__all__ = ["DPI", "TITLE_Y", "Plot", "REGISTRY", "RunInputs", "SweepInputs", "drawn_once", "load_matplotlib",
           "docs_table", "names", "register", "run_plots", "subplots", "sweep_plots", "wilson"]
SCOPES = ("run", "sweep")


@dataclass(frozen=True)
class Plot:
    name: str  # the PNG it writes (its name in plots/, in the manifests and in W&B as plots/STEM)
    scopes: tuple[str, ...]  # run: each run dir's plots/; sweep: a sweep report's plots dir
    draw: Callable  # (RunInputs | SweepInputs, path, params) -> the path written, or None (nothing to show)
    doc: str  # one line: what it shows and when it is drawn (docs/formats.md's table)
    params: type | None = None  # a dataclass of its settings, defaults for every field (None: it has none)
    check: Callable | None = None  # (params, inputs) -> None, or a FusebenchError: its rules, before it draws
    order: int = 50  # drawing order (the order of the list returned, and of W&B's images)

    def __post_init__(self):
        if not self.name.endswith(".png") or "/" in self.name:
            raise ValueError(f"plot {self.name!r}: a plot's name is the PNG file it writes")
        if not self.scopes or set(self.scopes) - set(SCOPES):
            raise ValueError(f"plot {self.name!r}: scopes {self.scopes!r} are not among {SCOPES}")

    def settings(self, params: Any = None) -> Any:
        """``params``, or the defaults of its params dataclass (None when it has none)."""
        return params if params is not None or self.params is None else self.params()

    def make(self, inputs: RunInputs | SweepInputs, out: Path, params: Any = None) -> Path | None:
        """Check its rules, then draw it into ``out / name``."""
        params = self.settings(params)
        if self.check is not None:
            self.check(params, inputs)
        return self.draw(inputs, Path(out) / self.name, params)


@dataclass
class RunInputs:
    """What a run plot reads: the run dir (its ranks/ and topk/) and its record."""

    run_dir: Path
    record: RunRecord
    scope: ClassVar[str] = "run"

    @cached_property
    def comparisons(self) -> list[dict]:
        return [c.to_json() for c in self.record.comparisons]  # the rows the run and sweep pair plots share


@dataclass
class SweepInputs:
    """What a sweep plot reads: the sweep report (a :class:`fusebench.report.sweep.SweepSummary`)."""

    report: Any
    scope: ClassVar[str] = "sweep"


REGISTRY = PLOT_REGISTRY  # filled by a scan of this package on first use
register = REGISTRY.register


def names(scope: str | None = None) -> tuple[str, ...]:
    """The registered plots (drawn in ``scope``), in drawing order."""
    return tuple(p.name for p in REGISTRY.items() if scope is None or scope in p.scopes)


WHERE = {"run": "run dir", "sweep": "report"}  # a scope as the docs table says it


def docs_table() -> str:
    """The plots table of docs/formats.md, from the registry (``tests/test_plots.py`` checks the page holds it)."""
    lines = ["| plot | drawn in | what it shows | settings (defaults) |", "| --- | --- | --- | --- |"]
    for plot in REGISTRY.items():
        settings = ", ".join(f"`{f.name}`: {'null' if f.default is None else f.default}"
                             for f in fields(plot.params)) if plot.params else ""
        lines.append(f"| `{plot.name}` | {', '.join(WHERE[s] for s in plot.scopes)} | {plot.doc} | {settings} |")
    return "\n".join(lines) + "\n"


def _draw(scope: str, inputs: RunInputs | SweepInputs, out: Path) -> list[Path]:
    made = [plot.make(inputs, out) for plot in REGISTRY.items() if scope in plot.scopes]
    return [p for p in made if p is not None]


def run_plots(run_dir: str | Path, record: RunRecord) -> list[Path]:
    """The run's plots in ``run_dir/plots``, with a manifest of what was drawn (``runtime.layout.PLOTS_MANIFEST``:
    written before the first plot, each as being drawn, then with every plot's sha256), so that a later run in
    this dir tells its own plots from a user's file of the same name (refused, never overwritten)."""
    run_dir = Path(run_dir)
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    atomic_write_text(out / PLOTS_MANIFEST, plots_manifest_text({name: None for name in sorted(run_plot_names())}))
    made = _draw("run", RunInputs(run_dir, record), out)
    atomic_write_text(out / PLOTS_MANIFEST, plots_manifest_text({p.name: file_sha256(p) for p in made}))
    return made


def sweep_plots(folder: str | Path, report, subdir: str | None = None) -> list[Path]:
    """The sweep's plots from its report (a :class:`fusebench.report.sweep.SweepSummary`), drawn in ``folder``'s
    ``subdir``: by default where a report into ``folder`` draws them (``report_files.plots_dir``: ``plots/``, or
    ``report_plots/`` when ``folder`` is a run dir, whose ``plots/`` is the run's)."""
    out = Path(folder) / (subdir or plots_dir(folder))
    out.mkdir(parents=True, exist_ok=True)
    return _draw("sweep", SweepInputs(report), out)
