"""Small corpora written to disk for tests: JSONL manifests and miniature Karpathy COCO / Flickr splits."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image


def write_manifest(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def jpeg(path, colour=(200, 30, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 8), colour).save(path, "JPEG")


def mini_coco(root, n_test=3, extra_caption=True):
    """A miniature dataset_coco.json with test/val/restval/train images under root/val2014 and root/train2014."""
    images = []
    for i in range(n_test + 4):
        split = "test" if i < n_test else ["val", "restval", "train", "val"][i - n_test]
        folder = "train2014" if split == "train" else "val2014"
        name = f"COCO_{folder}_{i:012d}.jpg"
        jpeg(root / folder / name)
        captions = [f"  A raw caption {j} of image {i}, As Typed.  " for j in range(5 + (i == 0 and extra_caption))]
        sentids = [700000 + 10 * i + j for j in range(len(captions))]  # as Karpathy's: COCO caption annotation ids
        images.append({"filepath": folder, "filename": name, "split": split, "cocoid": 1000 + i, "imgid": i,
                       "sentids": sentids, "sentences": [{"raw": c, "tokens": c.lower().split(), "imgid": i, "sentid": s}
                                                         for c, s in zip(captions, sentids)]})
    path = root / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return path


def mini_flickr(root, n_test=2):
    images = []
    for i in range(n_test + 1):
        name = f"{1000 + i}.jpg"
        jpeg(root / "flickr30k-images" / name)
        images.append({"filename": name, "split": "test" if i < n_test else "train", "imgid": i,
                       "sentences": [{"raw": f"Person {j} in picture {i}."} for j in range(5)]})
    path = root / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": images, "dataset": "flickr30k"}))
    return path
