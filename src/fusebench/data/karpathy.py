"""COCO 5k and Flickr30k 1k: the Karpathy test splits, read exactly as the annotation files give them.

Accepted annotation files:
- Karpathy's ``dataset_coco.json`` / ``dataset_flickr30k.json``: ``{"images": [{"split", "filename",
  "filepath" (COCO), "sentences": [{"raw", ...}], ...}]}``; images are ``image_root/filepath/filename``.
- CLIP_benchmark's ``coco_test_karpathy.json`` (COCO annotation format: ``images`` with ``id`` and
  ``file_name``, ``annotations`` with ``image_id`` and ``caption``) and ``flickr30k_test_karpathy.txt``
  (a header line, then ``IMAGE.jpg,caption`` lines); images are ``image_root/file_name``.
Captions are the raw sentences, unchanged: query preprocessing stays a per-model choice.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image

from fusebench import FusebenchError
from fusebench.data.corpus import Corpus, validate_corpus
from fusebench.data.input_files import not_a_directory, read_utf8, utf8_lines

SHOW = 50  # missing or unreadable paths listed in an error message (all are written to a file)


Record = tuple[str, str, list[str], list[int] | None]  # image id, relative path, captions, caption ids (or None)


def _karpathy(data: dict, source: str, split: str) -> list[Record]:
    images = data["images"]
    for i, image in enumerate(images):
        for key in ("split", "filename", "sentences"):
            if key not in image:
                raise FusebenchError(f"{source}: images[{i}] has no {key!r} key; Karpathy's format gives every "
                                     "image 'split', 'filename' and 'sentences' (and 'filepath' for COCO).")
    splits = Counter(image["split"] for image in images)
    chosen = [image for image in images if image["split"] == split]
    if not chosen:
        raise FusebenchError(f"{source}: no images in split {split!r}; splits present: "
                             f"{', '.join(f'{s} ({n})' for s, n in sorted(splits.items()))}.")
    out = []
    for image in chosen:
        relative = str(Path(image.get("filepath", "")) / image["filename"])
        image_id = str(image.get("cocoid", image.get("imgid", image["filename"])))
        captions, sentids = [], []
        for j, sentence in enumerate(image["sentences"]):
            if "raw" not in sentence:
                raise FusebenchError(f"{source}: image {image['filename']} sentence {j} has no 'raw' key "
                                     "(fusebench uses the raw sentence, not the tokens).")
            captions.append(sentence["raw"])
            sentids.append(sentence.get("sentid"))
        # Karpathy's sentids are COCO's caption annotation ids (what ECCV Caption and CxC key on)
        ids = [int(i) for i in sentids] if all(isinstance(i, int) and not isinstance(i, bool) for i in sentids) else None
        out.append((image_id, relative, captions, ids))
    return out


def _coco_format(data: dict, source: str) -> list[Record]:
    captions: dict = {}
    for i, ann in enumerate(data["annotations"]):
        if "image_id" not in ann or "caption" not in ann:
            raise FusebenchError(f"{source}: annotations[{i}] needs 'image_id' and 'caption' (COCO captions format).")
        captions.setdefault(ann["image_id"], []).append(ann["caption"])
    out = []
    for i, image in enumerate(data["images"]):
        if "id" not in image or "file_name" not in image:
            raise FusebenchError(f"{source}: images[{i}] needs 'id' and 'file_name' (COCO captions format).")
        out.append((str(image["id"]), image["file_name"], captions.get(image["id"], []), None))  # no caption ids
    return out


def _flickr_txt(path: Path) -> list[Record]:
    order: dict[str, list[str]] = {}
    for lineno, line in utf8_lines(path):
        line = line.rstrip("\r\n")
        if lineno == 1 or not line.strip():  # line 1: the header
            continue
        image, sep, caption = line.partition(".jpg,")
        if not sep:
            raise FusebenchError(f"{path}:{lineno}: expected 'IMAGE.jpg,caption' (CLIP_benchmark's Flickr format).")
        order.setdefault(image + ".jpg", []).append(caption)
    return [(name, name, caps, None) for name, caps in order.items()]


def read_annotations(path: str | Path, split: str = "test") -> list[Record]:
    """(image id, path relative to the image root, raw captions, caption ids or None) per image, in file order."""
    path = Path(path).expanduser()
    not_a_directory(path, "dataset.annotations", "Karpathy's dataset_*.json, or CLIP_benchmark's "
                    "coco_test_karpathy.json or flickr30k_test_karpathy.txt")
    if not path.is_file():
        raise FusebenchError(f"annotation file not found: {path} (run scripts/prepare_data.py, or set the "
                             "dataset's annotations= path).")
    if path.suffix == ".txt":
        return _flickr_txt(path)
    try:
        data = json.loads(read_utf8(path))
    except json.JSONDecodeError as err:
        raise FusebenchError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}).") from None
    if not isinstance(data, dict) or "images" not in data:
        raise FusebenchError(f"{path}: missing key 'images': expected Karpathy's dataset_*.json "
                             "(images with split/filename/sentences) or COCO captions format (images + annotations).")
    if "annotations" in data:
        return _coco_format(data, str(path))
    return _karpathy(data, str(path), split)


def _report(paths: list[str], what: str, root: Path, hint: str) -> FusebenchError:
    listing = Path(tempfile.mkstemp(prefix=f"fusebench-{what.replace(' ', '-')}-", suffix=".txt")[1])
    listing.write_text("\n".join(paths) + "\n", encoding="utf-8")
    shown = "\n  ".join(paths[:SHOW])
    more = f"\n  ... and {len(paths) - SHOW} more" if len(paths) > SHOW else ""
    return FusebenchError(f"{len(paths)} {what} under image root {root}:\n  {shown}{more}\n(all {len(paths)} listed "
                          f"in {listing}). {hint}")


def check_images(paths: list[Path], root: Path, verify: str = "header") -> None:
    """Every referenced image present (and, with verify=header|full, readable); all failures reported at once."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing and len(missing) == len(paths):
        raise FusebenchError(f"none of the {len(paths)} referenced images exist under image root {root} "
                             f"(first expected: {paths[0]}): the image root points at the wrong folder. "
                             "For COCO it is the folder holding val2014/; for Flickr30k the folder of the .jpg files.")
    if missing:
        raise _report(missing, "missing images", root, "Download them again (scripts/prepare_data.py) or fix the root.")
    if verify == "none":
        return
    bad = []
    for path in paths:
        try:
            with Image.open(path) as image:
                if verify == "full":
                    image.load()
                else:
                    image.verify()
        except Exception:  # noqa: BLE001 - any decoder failure means unreadable
            bad.append(str(path))
    if bad:
        raise _report(bad, "unreadable images", root, "Replace these files (they are not valid images).")


def load_karpathy(annotations: str | Path, image_root: str | Path, split: str = "test", name: str = "karpathy",
                  expected: dict | None = None, allow_nonstandard: bool = False, verify: str = "header") -> Corpus:
    """Load a Karpathy split; with ``expected`` counts, refuse a corpus that differs unless allowed."""
    records = read_annotations(annotations, split)
    ids = Counter(record[0] for record in records)
    duplicates = [i for i, n in ids.items() if n > 1]
    if duplicates:
        raise FusebenchError(f"{annotations}: duplicate image ids {duplicates[:10]} ({len(duplicates)} in all).")
    root = Path(image_root).expanduser()
    paths = [root / record[1] for record in records]
    check_images(paths, root, verify)
    captions = [c for record in records for c in record[2]]
    caption_image = np.repeat(np.arange(len(records)), [len(record[2]) for record in records]).astype(np.int64)
    caption_ids = [i for record in records for i in record[3]] if all(r[3] is not None for r in records) else None
    counts = {"images": len(records), "captions": len(captions)}
    meta = {"source": str(annotations), "split": split}
    if expected:
        wanted = {"images": int(expected["images"]), "captions": int(expected["captions"])}
        if counts != wanted:
            message = (f"{annotations} split {split!r} has {counts['images']} images and {counts['captions']} "
                       f"captions; the standard {name} has {wanted['images']} and {wanted['captions']}. Published "
                       "scores are fractions of the standard counts, so this corpus is not comparable.")
            if not allow_nonstandard:
                raise FusebenchError(message + " Set dataset.allow_nonstandard=true to run anyway (outputs are "
                                     "then marked non-standard).")
            meta["nonstandard"] = True
        if split != "test":  # a deliberate choice of another split: allowed, but never passed off as the benchmark
            meta["nonstandard"] = True
    corpus = Corpus(name=name, image_ids=[record[0] for record in records], captions=captions,
                    caption_image=caption_image, image_paths=[str(p) for p in paths], meta=meta, caption_ids=caption_ids,
                    kind="karpathy")
    return validate_corpus(corpus, str(annotations))
