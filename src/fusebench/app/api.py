"""The Python API: what a notebook calls. The CLI is a thin layer over the same run (``app.pipeline.run``).

    import fusebench
    result = fusebench.evaluate({"siglip": (img_a, txt_a), "dfn": (img_b, txt_b)}, caption_image,
                                fusion="dbsf", overrides=["eval.bootstrap.draws=2000"])
    result.record                  # the run record (what metrics.json holds): recalls, paired gains, ...
    result.recall()                # DataFrame: run x retriever x direction x k, with intervals
    result.comparisons()           # DataFrame: each paired comparison (gain, interval, wins / losses, p)
    result.ranks["fused"]["t2i"]   # every query's rank of its first positive (1 = first)

    result = fusebench.run(["dataset=sim", "fusion=rrf"])   # any job the ``fusebench`` command runs

:func:`evaluate` takes embeddings the caller holds: per model an image array (N, d) and a text array (Q, d), in
any float dtype, not necessarily normalised, and ``caption_image`` (Q,): the image each caption describes (an
image no caption names is a distractor). It runs exactly what ``fusebench dataset=manifest ... models.X.kind=
vectors`` runs over the same rows (``tests/test_api.py`` checks ranks and metrics equal): the rows are checked
and normalised by the same code, and every other setting is a config key, given as a keyword (``top_k=100``,
``draws=500``, ``search="faiss_hnsw"``: :func:`keyword_settings`) or in ``overrides`` as on the command line
(``fusion.top_k=100``, ``eval.ks=[1,5]``, ``tune=weights``). :func:`run` composes the package's config with
``overrides`` through Hydra's compose API and runs that job. Both return a :class:`Result`. With ``out_dir`` the
run's files (metrics.json, ranks/, topk/, plots/ with ``plots=true``) are written there under the run dir's rules
(a folder holding files fusebench did not write under a run output's name is refused); without, nothing is written
(the record and the ranks stay in the result; an engine's database and W&B's files, which those write while the
job runs, go to a temporary folder, removed after). :func:`evaluate` keeps each model's ranked lists in
``cache_dir`` when given (the list store, reused by the next call on the same rows), else in memory; :func:`run`'s
stores write where the command's do (``embed.cache.dir``). W&B is off unless ``logger=wandb`` is among the
overrides. ``overrides`` is a list of ``KEY=VALUE`` strings (one string is refused, not split into characters);
Hydra's own keys (``hydra.run.dir=...``, ``hydra/launcher=...``: the API runs one job in this process, with no
Hydra run dir, sweep or launcher) are refused, naming what to use (``out_dir`` for the run's folder). A mistake,
an argument of the wrong type too, is a :class:`~fusebench.FusebenchError` naming the argument or key and what is
valid. The plain-array functions beneath (search, fuse, ranks, recall, compare) are :mod:`fusebench.library`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fusebench import DIRECTIONS, FusebenchError
from fusebench.app import rundir
from fusebench.app.cli import hydra_error_message
from fusebench.app.run_config import run_config
from fusebench.backends import base as backends
from fusebench.config import CONFIG_DIR, schema
from fusebench.config.run import LOGGERS
from fusebench.data.corpus import Corpus
from fusebench.fusion.config import check_moved_overrides, moved_keys
from fusebench.report.runs import Run
from fusebench.runtime import checks, run_lock

IN_MEMORY = "(in memory: fusebench.evaluate)"  # what a model's spec records as its files


@dataclass
class Result:
    """What one run measured: its ``record`` (the types metrics.json serialises), each retriever's ``ranks``
    (name -> direction -> (queries,) rank of the first positive, 1 = first, as ranks/ holds them), and
    ``out_dir`` (None when the files went to a temporary folder)."""

    record: object  # fusebench.evaluation.record.RunRecord
    ranks: dict[str, dict[str, np.ndarray]] = field(repr=False)
    out_dir: Path | None = None

    def _run(self):
        return Run(path=self.out_dir or Path("."), name=str(self.out_dir or "evaluate"), record=self.record)

    def recall(self):
        """One row per retriever x direction x k: recall (percent) with its Wilson interval and the settings
        (``fusebench.report.frames.retriever_frame``; pandas: the ``notebook`` extra)."""
        from fusebench.report.frames import retriever_frame  # lazy: heavy (pandas)

        return retriever_frame(self._run())

    def comparisons(self):
        """One row per paired comparison: gain, bootstrap interval, wins and losses, p-values
        (``fusebench.report.frames.comparison_frame``)."""
        from fusebench.report.frames import comparison_frame  # lazy: heavy (pandas)

        return comparison_frame(self._run())


def _pair(name: str, value) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"image", "text"})
        if unknown or not {"image", "text"} <= set(value):
            raise FusebenchError(f"models[{name!r}] must hold 'image' and 'text' arrays (got keys "
                                 f"{sorted(map(str, value))}).")
        value = (value["image"], value["text"])
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise FusebenchError(f"models[{name!r}] must be (image rows, text rows) or {{'image': ..., 'text': ...}}; "
                             f"got {type(value).__name__}.")
    arrays = []
    for what, array in zip(("image", "text"), value):
        try:
            array = np.asarray(array)
        except (TypeError, ValueError) as err:
            raise FusebenchError(f"models[{name!r}] {what} rows are not an array ({err}).") from None
        if array.ndim != 2 or not np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.complexfloating):
            raise FusebenchError(f"models[{name!r}] {what} rows must be a 2-D real array (one row per "
                                 f"{'image' if what == 'image' else 'caption'}); got shape {array.shape}, dtype "
                                 f"{array.dtype}.")
        arrays.append(array)
    return arrays[0], arrays[1]


def _plain(value):
    """A NumPy scalar as the Python value it holds (np.float32(0.5) -> 0.5), which the config takes; others as given
    (the model's weight check names a wrong one)."""
    return value.item() if isinstance(value, np.generic) else value


def _caption_image(caption_image, n_images: int) -> np.ndarray:
    array = np.asarray(caption_image)
    if array.ndim != 1 or array.size == 0 or not np.issubdtype(array.dtype, np.integer):
        raise FusebenchError(f"caption_image must be a non-empty 1-D integer array (caption q describes image "
                             f"caption_image[q]); got shape {array.shape}, dtype {array.dtype}.")
    if array.min() < 0 or array.max() >= n_images:
        bad = int(np.flatnonzero((array < 0) | (array >= n_images))[0])
        raise FusebenchError(f"caption_image[{bad}] = {int(array[bad])} is not an image index; valid: 0..{n_images - 1} "
                             f"(the image arrays hold {n_images} rows).")
    return array.astype(np.int64)


def _ids(values, n: int, what: str, default, integers: bool = False) -> list:
    if values is None:
        return default
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, np.ndarray)):
        raise FusebenchError(f"{what} must be a list of {n} ids (one per {what.split('_')[0]}), or None; got "
                             f"{type(values).__name__}.")
    values = list(values)
    if integers and not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        bad = next(v for v in values if not isinstance(v, (int, np.integer)) or isinstance(v, bool))
        raise FusebenchError(f"{what} must hold integers (the captions' ids); got {bad!r}.")
    if len(values) != n:
        raise FusebenchError(f"{what} holds {len(values)} ids for {n} {what.split('_')[0]}s.")
    if len(set(map(str, values))) != n:
        raise FusebenchError(f"{what} holds duplicate ids; each must be unique.")
    return values


def in_memory_corpus(caption_image: np.ndarray, n_images: int, name: str, image_ids=None, caption_ids=None):
    """The corpus of ``caption_image``: images ``0..n_images-1`` (ids given or their index as text), captions
    named by their index (the API has no caption text)."""

    images = [str(i) for i in _ids(image_ids, n_images, "image_ids", list(range(n_images)))]
    captions = _ids(caption_ids, len(caption_image), "caption_ids", None, integers=True)
    return Corpus(name=name, image_ids=images, captions=[f"caption {q}" for q in range(len(caption_image))],
                  caption_image=caption_image, caption_ids=None if captions is None else [int(c) for c in captions],
                  kind="arrays", meta={"source": "fusebench.evaluate"})


HYDRA_KEYS = {"hydra.run.dir": "out_dir=... (the run's folder; None: a temporary one)",
              "hydra.sweep.dir": "one call per job, each with its out_dir=..."}  # Hydra's key -> the API's way


def override_list(overrides, key: str = "overrides") -> list[str]:
    """``overrides`` as a list of strings: a single string (which a loop would split into characters), or anything
    but a list or tuple of strings, is refused, and so is a Hydra key (``hydra.*``, ``hydra/GROUP=``): the API
    composes one job and runs it here, so Hydra's run dir, sweeps and launchers are never read (:data:`HYDRA_KEYS`
    names what to use instead)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    if isinstance(overrides, (str, bytes)):
        raise FusebenchError(f"{key}={overrides!r} is one string; {key} takes a list of override strings, e.g. "
                             f"{key}=[{str(overrides)!r}].")
    if not isinstance(overrides, (list, tuple)):
        raise FusebenchError(f"{key} must be a list of override strings (e.g. ['fusion.top_k=100']); got "
                             f"{type(overrides).__name__}.")
    for bad in (o for o in overrides if not isinstance(o, str)):
        raise FusebenchError(f"{key} must be a list of override strings (e.g. ['fusion.top_k=100']); "
                             f"{bad!r} ({type(bad).__name__}) is not a string.")
    parser = OverridesParser.create()
    for override in overrides:
        try:
            name = parser.parse_overrides([override])[0].key_or_group
        except HydraException:  # compose names a bad override itself
            continue
        if name == "hydra" or name.startswith(("hydra.", "hydra/")):
            instead = f"use {HYDRA_KEYS[name]}" if name in HYDRA_KEYS else "leave it out"
            raise FusebenchError(f"{key}: {override!r} sets Hydra's own {name}, which the Python API never reads (it "
                                 f"runs one job in this process: no Hydra run dir, sweep or launcher); {instead}.")
    return list(overrides)


def compose(overrides: Sequence[str] = ()):
    """The package's config composed with ``overrides`` (Hydra's compose API, as ``fusebench`` composes it; a
    bad override is a FusebenchError naming it)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException


    overrides = override_list(overrides)
    check_moved_overrides(overrides)
    schema.register()
    if GlobalHydra.instance().is_initialized():  # another compose (or a Hydra app) left it set: ours is composed fresh
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
            return hydra_compose(config_name="config", overrides=overrides)
    except MissingConfigException as err:  # an option no group has: the CLI's message, with the valid ones
        raise FusebenchError(hydra_error_message(err)) from None
    except (HydraException, OmegaConfBaseException) as err:
        raise FusebenchError(f"overrides {overrides}: {str(err).splitlines()[0]}") from None


def _folder(out_dir) -> Path | None:
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise FusebenchError(f"out_dir must be a folder (a str or a Path), or None to write nothing; got "
                             f"{type(out_dir).__name__}.")
    if out_dir is not None and not str(out_dir).strip():
        raise FusebenchError(f"out_dir={out_dir!r} is empty; give the run a folder, or None to write nothing.")
    return None if out_dir is None else Path(out_dir).expanduser()


def _needs_folder(config) -> bool:
    """Whether the job writes files of its own while it runs, so that a run with no ``out_dir`` still needs a
    (temporary) folder: an engine's database (RUN_DIR/engine_db), or W&B's run files."""

    return backends.get(config.search.backend).engine or not isinstance(config.logger, LOGGERS["none"])


def _execute(cfg, out_dir, corpus=None, rows: Mapping[str, tuple] | None = None) -> Result:
    """Run the composed ``cfg``: over ``corpus`` and each model's ``rows`` when given (fusebench.evaluate), else
    loading what the config names. Without ``out_dir`` nothing is written (an engine's database and W&B's files
    go to a temporary folder, removed after)."""
    from fusebench.app.pipeline import Inputs, measure  # lazy: heavy (torch, numba, scipy)
    from fusebench.encoders.base import RawEmbeddings  # lazy: heavy (numba)

    folder = _folder(out_dir)
    config = run_config(cfg)  # a mistake in the config is refused here, before any work
    inputs = None
    if rows is not None:
        if config.gallery.active:
            raise FusebenchError("fusebench.evaluate takes the whole gallery in its arrays (an image no caption "
                                 "names is a distractor): leave the gallery group at gallery=none.")
        inputs = Inputs(corpus, [RawEmbeddings(name, image, text, f"models[{name!r}] image rows",
                                               f"models[{name!r}] text rows", dict(config.models[name].given))
                                 for name, (image, text) in rows.items()])
    if folder is None and not _needs_folder(config):
        record, lists = measure(config, None, inputs)
        return Result(record=record, ranks=_ranks(lists), out_dir=None)
    with tempfile.TemporaryDirectory(prefix="fusebench-") if folder is None else contextlib.nullcontext() as scratch:
        where = folder if folder is not None else Path(scratch) / "run"
        taken = rundir.start_fresh(where, "out_dir")  # the dir's lock, held while the run writes it
        try:
            record, lists = measure(config, str(where), inputs)
            rundir.forget(where)
        finally:
            if taken:
                run_lock.release(where)
    return Result(record=record, ranks=_ranks(lists), out_dir=folder)


def _ranks(lists: dict) -> dict[str, dict[str, np.ndarray]]:
    """Each retriever's ranks by direction, as ranks/ holds them (int64)."""
    return {name: {d: np.asarray(by_direction[d].ranks, dtype=np.int64) for d in DIRECTIONS}
            for name, by_direction in lists.items()}


def _leaves(cfg, prefix: str = "") -> list[str]:
    """Every setting's dotted key in the composed config (``models``, ``hydra`` and the fusion keys that moved into
    ``fusion.params`` aside)."""
    from omegaconf import DictConfig

    out = []
    for key in cfg:
        path = f"{prefix}{key}"
        if path in ("models", "hydra") or path in {f"fusion.{k}" for k in moved_keys()}:  # old names: not offered
            continue
        value = cfg._get_node(key)
        out += _leaves(value, f"{path}.") if isinstance(value, DictConfig) else [path]
    return out


def keyword_settings(cfg, settings: Mapping[str, object]) -> list[tuple[str, object]]:
    """Each keyword setting of :func:`evaluate` as (config key, value): a config group's name (``search``,
    ``tune``) takes an option; any other keyword is the setting whose last part it names (``top_k`` ->
    ``fusion.top_k``, ``draws`` -> ``eval.bootstrap.draws``), or a whole key with ``__`` for its dots
    (``eval__bootstrap__seed``); an unknown or ambiguous one is refused, naming what is valid."""

    keys = _leaves(cfg)
    groups = sorted(p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir() and p.name not in ("hydra", "models"))
    out = []
    for word, value in settings.items():
        if word in groups:
            out.append((word, value))
            continue
        dotted = word.replace("__", ".")
        found = [dotted] if dotted in keys else [k for k in keys if k.rsplit(".", 1)[-1] == word]
        if len(found) != 1:
            why = (f"names several settings ({', '.join(found)}): give the whole key with '__' for its dots (e.g. "
                   f"{found[0].replace('.', '__')})" if found else
                   f"is not a setting; valid: a config group ({', '.join(groups)}), a setting's name (e.g. top_k, "
                   "ks, draws) or its whole key with '__' for its dots (e.g. eval__bootstrap__seed)")
            raise FusebenchError(f"fusebench.evaluate({word}=...) {why}.")
        out.append((found[0], value))
    return out


def check_given_once(named: list[tuple[str, object]], overrides: list[str]) -> None:
    """A setting given both as a keyword and as an override, or any dataset setting (evaluate's corpus is the
    arrays it is given), is refused rather than one of them read."""
    given = {checks.override_key(o): str(o) for o in overrides}
    for key, _ in named:
        if key in given:
            raise FusebenchError(f"fusebench.evaluate: {key} is given twice, as a keyword and as the override "
                                 f"{given[key]!r}: give it once.")
    for key in [k for k, _ in named] + list(given):
        if key == "dataset" or key.startswith("dataset."):
            raise FusebenchError(f"fusebench.evaluate: {key} is never read: the corpus is the arrays given (models, "
                                 "caption_image, name); fusebench.run(overrides) runs a dataset.")


def _override(key: str, value) -> str:
    """``key=value`` as Hydra reads it (the value written as YAML: lists, null, strings quoted when needed)."""
    import yaml

    value = _plain(value)
    if isinstance(value, (tuple, np.ndarray)):
        value = [_plain(v) for v in value]
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
    return f"{key}={text.removesuffix(chr(10) + '...').strip()}"


def evaluate(models: Mapping[str, object], caption_image, *, fusion: str = "dbsf",
             weights: Mapping[str, float] | None = None, overrides: Sequence[str] = (), out_dir: str | Path | None = None,
             cache_dir: str | Path | None = None, image_ids: Sequence | None = None,
             caption_ids: Sequence[int] | None = None, name: str = "arrays", **settings) -> Result:
    """Evaluate the models' embeddings the caller holds, and their fusion (``fusion``: a ``conf/fusion`` option;
    ``none`` for the single models alone, which takes no ``weights`` and no fusion setting); ``settings``: config
    keys as keywords (``top_k=50``, ``draws=500``, ``ks=[1, 5]``, ``search="faiss_hnsw"``: :func:`keyword_settings`);
    ``overrides``: a list of ``KEY=VALUE`` strings, Hydra's own keys refused; ``out_dir``: the run's folder (None:
    nothing written); ``cache_dir``: a folder for each model's ranked lists, reused by the next call on the same
    rows (None: kept in memory); see the module's docstring."""
    from omegaconf import open_dict

    if not isinstance(models, Mapping) or not models:
        raise FusebenchError("models must be a non-empty mapping: name -> (image rows, text rows).")
    overrides = override_list(overrides)
    if not isinstance(fusion, str) or not fusion.strip():
        raise FusebenchError(f"fusion={fusion!r} must be a conf/fusion option's name (e.g. 'dbsf', 'rrf', or 'none' "
                             "for the single models alone).")
    if weights is not None and not isinstance(weights, Mapping):
        raise FusebenchError(f"weights must be a mapping: model name -> weight (e.g. {{'a': 0.5}}), or None; got "
                             f"{type(weights).__name__}.")
    if cache_dir is not None and (not isinstance(cache_dir, (str, os.PathLike)) or not str(cache_dir).strip()):
        raise FusebenchError(f"cache_dir must be a folder (a str or a Path), or None to keep the lists in memory; got "
                             f"{cache_dir!r}.")
    rows = {str(n): _pair(str(n), v) for n, v in models.items()}
    n_images = {n: image.shape[0] for n, (image, _) in rows.items()}
    if len(set(n_images.values())) > 1:
        raise FusebenchError(f"the models' image arrays hold different numbers of rows ({n_images}); each must hold "
                             "one row per image, in one order.")
    caption_image = _caption_image(caption_image, next(iter(n_images.values())))
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(rows))
    if unknown:
        raise FusebenchError(f"weights names {unknown}, which are not models; valid: {', '.join(rows)}.")
    if not isinstance(name, str) or not name.strip():
        raise FusebenchError(f"name={name!r} must be a non-empty string (the corpus's name in the record).")
    stores = (["eval.lists.store=false"] if cache_dir is None else
              ["eval.lists.store=true", f"embed.cache.dir={Path(cache_dir).expanduser()}"])  # nothing kept unless asked
    base = [f"fusion={fusion}", "logger=none", "plots=false", "views=inline", "models=[]", *stores]
    cfg = compose(base)  # the keywords are read against the config they set
    named = keyword_settings(cfg, settings)
    check_given_once(named, overrides)
    keywords = [_override(key, value) for key, value in named]
    cfg = compose([*base, *keywords, *overrides]) if keywords or overrides else cfg
    with open_dict(cfg):
        for model in rows:
            cfg.models[model] = {"kind": "vectors", "image_embeddings": IN_MEMORY, "text_embeddings": IN_MEMORY,
                                 **({"weight": _plain(weights[model])} if model in weights else {})}
    corpus = in_memory_corpus(caption_image, next(iter(n_images.values())), name, image_ids, caption_ids)
    return _execute(cfg, out_dir, corpus, rows)


def run(overrides: Sequence[str] = (), out_dir: str | Path | None = None) -> Result:
    """The job ``fusebench OVERRIDES`` runs (W&B off unless ``logger=wandb`` is given; its plots and log made in
    the call, ``views=inline``, unless ``views=`` is given), returning its result; ``overrides``: a list of
    ``KEY=VALUE`` strings, Hydra's own keys refused (``out_dir``: the run's folder)."""
    given = override_list(overrides)
    quiet = [default for default, key in (("logger=none", "logger="), ("views=inline", "views="))
             if not any(o.startswith(key) for o in given)]
    return _execute(compose([*quiet, *given]), out_dir)
