"""Model kind ``sim``: a simulated embedding model over the ``sim`` dataset (see fusebench.data.simulated).

A simulated model's rows are a pure function of its spec and the corpus parameters, so they are kept in
memory for the next job of the same process (a sweep on Hydra's basic launcher runs every job in one
process): models of at most ``MEMO_ENTRY_BYTES`` (a COCO-size sim model is ~130 MB), ``MEMO_BYTES`` in all,
so that a large corpus (100,000 images) never holds a second copy of its rows. Returned read-only.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from fusebench.config import checks
from fusebench.data.corpus import Corpus
from fusebench.data.simulated import require_sim_corpus, sim_model_embeddings

MEMO_BYTES = 768 << 20
MEMO_ENTRY_BYTES = 256 << 20
_MEMO: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()


def _key(settings: dict, corpus: Corpus) -> str:
    sim_meta = {k: v for k, v in corpus.meta.items() if k.startswith("sim_")}
    return json.dumps({**settings, **sim_meta, "n": [corpus.n_images, corpus.n_captions]}, sort_keys=True)


def sim_settings(spec: Mapping, where: str = "models.NAME") -> dict:
    """A sim model's parameters (dim, image_noise, text_noise, seed: all set, as conf/models/sim_*.yaml do;
    score_scale and score_shift: where its cosines sit, both or neither), checked; ``where`` names the config
    block in errors."""
    def need(key):
        return checks.required(spec, key, where)

    settings = {"dim": checks.integer(need("dim"), f"{where}.dim", 1),
                "image_noise": checks.number(need("image_noise"), f"{where}.image_noise", 0),
                "text_noise": checks.number(need("text_noise"), f"{where}.text_noise", 0),
                "seed": checks.integer(need("seed"), f"{where}.seed", 0), "score": None}
    if "score_scale" in spec or "score_shift" in spec:
        settings["score"] = (checks.number(need("score_scale"), f"{where}.score_scale", 0, 1, open_low=True),
                             checks.number(need("score_shift"), f"{where}.score_shift", -1, 1))
    return settings


def sim_arrays(spec: Mapping, corpus: Corpus, where: str = "models.NAME") -> tuple[np.ndarray, np.ndarray]:
    require_sim_corpus(corpus)
    settings = sim_settings(spec, where)
    key = _key(settings, corpus)
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key]
    image, text = sim_model_embeddings(corpus, **settings)
    image.setflags(write=False)
    text.setflags(write=False)
    if image.nbytes + text.nbytes <= MEMO_ENTRY_BYTES:
        _MEMO[key] = (image, text)
        while sum(a.nbytes + b.nbytes for a, b in _MEMO.values()) > MEMO_BYTES:
            _MEMO.popitem(last=False)
    return image, text
