"""The ``tiny`` dataset: photographs shipped inside installed packages, with hand-written captions.

Nothing is downloaded; the images are resolved from the installed scikit-image, scikit-learn and
matplotlib packages (the first two are the ``tiny`` extra: ``pip install 'fusebench[tiny]'``), so an end-to-end run
with real encoders works offline.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from fusebench import FusebenchError
from fusebench.data.corpus import Corpus, validate_corpus

CAPTIONS_FILE = Path(__file__).with_name("tiny_captions.json")


def _package_root(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FusebenchError(f"dataset=tiny needs the package {package!r}, which ships its photographs: "
                             "pip install 'fusebench[tiny]' (in a checkout: pip install -e '.[tiny]').")
    return Path(spec.origin).parent


def load_tiny(limit: int | None = None, name: str = "tiny") -> Corpus:
    records = json.loads(CAPTIONS_FILE.read_text(encoding="utf-8"))["images"]
    if limit is not None:
        records = records[: int(limit)]
    paths = []
    for record in records:
        path = _package_root(record["package"]) / record["file"]
        if not path.is_file():
            raise FusebenchError(f"dataset=tiny: {path} is missing from the installed {record['package']} package.")
        paths.append(str(path))
    captions = [c for r in records for c in r["captions"]]
    caption_image = np.repeat(np.arange(len(records)), [len(r["captions"]) for r in records])
    corpus = Corpus(name=name, image_ids=[r["id"] for r in records], captions=captions,
                    caption_image=caption_image.astype(np.int64), image_paths=paths,
                    meta={"source": str(CAPTIONS_FILE)}, kind="tiny")
    return validate_corpus(corpus, str(CAPTIONS_FILE))
