"""The contract of a real model backend and what its loaders share (Hugging Face Hub access, the one-line load
error), and the two embedding types: a model's rows as loaded (:class:`RawEmbeddings`, unchecked) and as the
evaluator takes them (:class:`ModelEmbeddings`: validated, L2-normalised, with the model's weight), with the
checks between them.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from fusebench import FusebenchError
from fusebench.config.specs import DEFAULT_WEIGHT, model_spec
from fusebench.encoders.fingerprint import first_line, hf_hub_revision, path_fingerprint
from fusebench.encoders.rownorm import l2_normalise_rows
from fusebench.runtime import state

if TYPE_CHECKING:
    import torch


@runtime_checkable
class Encoder(Protocol):
    """A real model backend (a model kind's ``backend``, ``fusebench.encoders.kinds``, builds one as
    ``backend(name, spec)``). Nothing is loaded until :meth:`load`."""

    backend: str
    name: str
    dim: int  # the embedding width, known once load() has run

    def fingerprint(self) -> dict:
        """What identifies the weights, without loading them (part of the embedding cache key)."""

    def versions(self) -> dict:
        """The library versions that produce the embeddings (part of the cache key)."""

    def text_preprocessing(self) -> dict:
        """Tokenizer settings that change the text embeddings (part of the cache key)."""

    def image_preprocessing(self) -> dict:
        """Image transform settings that change the image embeddings (part of the cache key)."""

    def load(self, device: torch.device) -> None:
        """Load weights, tokenizer and transform onto ``device`` and set :attr:`dim`."""

    @property
    def image_transform(self) -> Callable[[Any], Any]:
        """PIL image -> model input for one image (picklable, for DataLoader workers)."""

    def max_text_tokens(self) -> int:
        """The tokenizer's maximum length (captions longer than it are cut)."""

    def tokenize(self, texts: list[str]) -> Any:
        """Model inputs for a batch of (already preprocessed) captions."""

    def count_truncated(self, texts: list[str]) -> int:
        """How many of ``texts`` the tokenizer cuts at its maximum length."""

    def encode_images(self, batch: Any) -> torch.Tensor:
        """(B, dim) embeddings of a batch of transformed images."""

    def encode_texts(self, tokens: Any) -> torch.Tensor:
        """(B, dim) embeddings of a batch of tokenized captions."""


def to_device(batch, device, non_blocking: bool = False):
    """A batch (a tensor or a dict of tensors) on ``device``; a list (of PIL images or strings, which the
    backend's own encode moves) as it is."""
    if isinstance(batch, list):
        return batch
    if isinstance(batch, dict):
        return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()}
    return batch.to(device, non_blocking=non_blocking)


def embedding_width(encoder: Encoder, device) -> int:
    """The width of a loaded encoder's embeddings (one short caption through its text tower)."""
    import torch

    with torch.no_grad():
        return int(encoder.encode_texts(to_device(encoder.tokenize(["a photo"]), device)).shape[1])


HUB_PROBE_SECONDS = 5.0  # how long the one request that checks the hub can be reached may take


def hub_offline_set() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, as the environment is now (huggingface_hub reads it once,
    when imported)."""
    return any(os.environ.get(key, "").strip().lower() in ("1", "true", "yes", "on")
               for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_unavailable() -> str | None:
    """Why weights must come from the local Hugging Face cache only, or None to use the hub as usual.

    Without network huggingface_hub retries each file five times with backoff (about 25 s a file, and a model
    asks for several), so one request (HF_ENDPOINT, proxies honoured, :data:`HUB_PROBE_SECONDS`) checks first
    that the hub answers."""
    if hub_offline_set():
        return "HF_HUB_OFFLINE is set"
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_SECONDS)
    except Exception as err:  # noqa: BLE001 - any failure to get an answer means the hub cannot be used
        return f"{constants.ENDPOINT} cannot be reached ({type(err).__name__}: {first_line(err).rstrip('.')})"
    return None


@contextlib.contextmanager
def cached_files_only(on: bool) -> Iterator[None]:
    """While ``on``, huggingface_hub (and so transformers and open_clip) makes no request and reads only its
    local cache, whatever HF_HUB_OFFLINE was when it was imported."""
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = saved or on
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def load_error(name: str, what: str, err: BaseException, offline: str | None, repo: str | None,
               local: str) -> FusebenchError:
    """The one-line error for weights that did not load: ``what`` failed and why; for hub weights (``repo``)
    whether only the local cache was tried (``offline``: why) and the download command; else the ``local``
    alternative."""
    text = f"models.{name}: {what}: {first_line(err)}"
    if repo is None:
        return FusebenchError(f"{text} Give {local}.")
    if offline:
        text += f" Only the local Hugging Face cache was looked in: {offline}."
    then = "" if hub_offline_set() else ", then set HF_HUB_OFFLINE=1 to run without network"
    return FusebenchError(f"{text} Download them once with network (`huggingface-cli download {repo}`){then}; "
                          f"or give {local}.")


class RealEncoder:
    """What every real encoder does alike before loading anything: its model spec typed once (a mapping of its keys
    is converted and checked, as ``models.NAME`` in a config is) and ``configure``d, no model yet, its width known
    once loaded. ``spec_type`` is the kind's spec class, ``backend`` the kind's name."""

    backend: str
    spec_type: type

    def __init__(self, name: str, spec):
        if not isinstance(spec, self.spec_type):
            spec = model_spec(name, {"kind": self.backend, **spec}, [])
        self.name = name
        self.model = None
        self.dim = 0  # known once loaded
        self.configure(spec)

    def configure(self, spec) -> None:
        raise NotImplementedError


class HubWeights:
    """Weights named by a Hugging Face repo id or a local folder (``source``) at a ``revision``: the folder, the repo,
    and the fingerprint that identifies them without loading them (a folder's files, else the cached commit of the
    repo, found by ``HUB_FILE``). ``SOURCE_KEY`` names the source in the fingerprint (the kind's key for it)."""

    SOURCE_KEY = "model"
    HUB_FILE = "config.json"
    backend: str
    name: str
    source: str
    revision: str | None

    @property
    def local_path(self) -> Path | None:
        path = Path(str(self.source)).expanduser()
        return path if path.is_dir() else None

    @property
    def hub_repo(self) -> str | None:
        """The Hugging Face repo id the source names; None for a folder (or a path that is not one)."""
        if self.local_path is not None or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", str(self.source)):
            return None
        return str(self.source)

    def from_hub(self, load: Callable[[str, dict], None], what: str, folder: str) -> None:
        """``load(source, kwargs)`` the weights: from the folder, or from the hub at ``revision`` (from the local
        cache alone, no retries, when the hub is out of reach); any failure is one message saying ``what`` failed
        and that a ``folder`` would do."""
        offline = hub_unavailable() if self.hub_repo else None  # no hub: the local cache only, no retries
        try:
            kwargs = {"revision": self.revision} if self.local_path is None and self.revision else {}
            if offline:
                kwargs["local_files_only"] = True
            with cached_files_only(bool(offline)):
                load(str(self.local_path or self.source), kwargs)
        except Exception as err:  # noqa: BLE001 - turn any loader failure into one actionable message
            raise load_error(self.name, what, err, offline, self.hub_repo, folder) from None

    def fingerprint(self) -> dict:
        out = {"backend": self.backend, self.SOURCE_KEY: str(self.source), "revision": self.revision}
        if self.local_path is not None:
            out["files"] = path_fingerprint(self.local_path)
        else:
            out["commit"] = hf_hub_revision(str(self.source), self.revision, self.HUB_FILE)
        return out


@dataclass
class RawEmbeddings:
    """A model's rows as loaded, before the checks (real models mark unreadable images with NaN rows)."""

    name: str
    image: np.ndarray
    text: np.ndarray
    image_source: str
    text_source: str
    spec: dict  # what the run record keeps of the model (its spec as configured)
    info: dict = field(default_factory=dict)
    declared_dim: int | None = None  # a sim model's declared width (its rows carry two more dims)

    @property
    def unreadable_images(self) -> np.ndarray | None:
        """Rows the encoder skipped as unreadable files (all-NaN rows of a real model); None if none."""
        if self.info.get("skipped_images"):
            return np.isnan(self.image).all(axis=1)
        return None


@dataclass
class ModelEmbeddings:
    """What the evaluator takes from a model: L2-normalised float32 rows in corpus order, ``image`` (N, d) and
    ``text`` (Q, d), the model's ``weight`` in the fused score, and what the record keeps of it."""

    name: str
    image: np.ndarray
    text: np.ndarray
    weight: float = DEFAULT_WEIGHT
    spec: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # real models: cache keys and hits, preprocessing, versions, stats
    declared_dim: int | None = None  # a sim model's (or sim stand-in's) declared width
    distractors: object | None = None  # the gallery's distractor rows (encoders.distractors.DistractorRows), if any

    @property
    def dim(self) -> int:
        return int(self.image.shape[1])

    @property
    def n_items(self) -> int:
        """Gallery images this model searches: the test split's and the distractors after them."""
        return len(self.image) + (0 if self.distractors is None else int(self.distractors.n))

    @property
    def index_dim(self) -> int:
        """The width an index of this model stores (what cost tables count): the embedding width, except for a
        sim model, whose declared ``dim`` it is (its two score-location dims are a device of the simulation)."""
        return self.dim if self.declared_dim is None else self.declared_dim


def _first_bad_row(array: np.ndarray, mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _normalise_shared(array: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    normalised, norms, finite = l2_normalise_rows(array)
    normalised.setflags(write=False)  # shared by the jobs of the process: nothing may change it in place
    return normalised, norms, finite


def _check_shape(array: np.ndarray, rows: int, what: str, source: str, rows_meaning: str) -> None:
    """What a matrix's shape and dtype alone show (a .npy file's header: nothing of its rows is read)."""
    if array.ndim != 2:
        raise FusebenchError(f"{source}: {what} must be a 2-D array (rows x dim), got shape {array.shape}.")
    if array.shape[0] != rows:
        raise FusebenchError(
            f"{source}: {what} has {array.shape[0]} rows but the corpus has {rows} {rows_meaning}; "
            f"rows must follow the manifest order, one per {rows_meaning.rstrip('s')}."
        )
    if array.dtype.kind not in "fiu":
        raise FusebenchError(f"{source}: {what} must be numeric, got dtype {array.dtype}.")


def check_matrix(array: np.ndarray, rows: int, what: str, source: str, rows_meaning: str) -> np.ndarray:
    """Validate one embedding matrix and return it L2-normalised as float32 (rows are 0-based in messages).
    Any finite row that is not all zeros is accepted at any scale (1e-30 or 3e38: see fusebench.encoders.rownorm)."""
    _check_shape(array, rows, what, source, rows_meaning)
    # one pass, the same bits as numpy's norm and divide for rows of ordinary scale; once per process for the rows
    # the process keeps (a sim model's, the same read-only object every job of a sweep: runtime.state.SharedArrays),
    # whose normalised rows are then shared and read-only too
    normalised, norms, finite = (l2_normalise_rows(array) if array.flags.writeable
                                 else state.current().shared.derived(array, "l2_normalise_rows", _normalise_shared))
    if not finite.all():
        row = _first_bad_row(array, ~finite)
        raise FusebenchError(
            f"{source}: {what} row {row} contains NaN or inf ({int((~finite).sum())} bad rows in all); "
            "every embedding must be finite."
        )
    zero = norms == 0
    if zero.any():
        row = _first_bad_row(array, zero)
        raise FusebenchError(
            f"{source}: {what} row {row} is all zeros ({int(zero.sum())} zero rows in all); "
            "a zero vector has no direction, so its cosine similarity is undefined."
        )
    return normalised


def check_embeddings(name: str, image: np.ndarray, text: np.ndarray, n_images: int, n_captions: int,
                     image_source: str, text_source: str, spec: dict | None = None,
                     weight: float = DEFAULT_WEIGHT) -> ModelEmbeddings:
    image = check_matrix(image, n_images, "image embeddings", image_source, "images")
    text = check_matrix(text, n_captions, "text embeddings", text_source, "captions")
    if image.shape[1] != text.shape[1]:
        raise FusebenchError(
            f"model {name!r}: image embeddings have dimension {image.shape[1]} ({image_source}) but text embeddings "
            f"have {text.shape[1]} ({text_source}); both must come from the same model's shared space."
        )
    return ModelEmbeddings(name=name, image=image, text=text, weight=weight, spec=dict(spec or {}))
