#!/usr/bin/env python
"""Prepare COCO 5k or Flickr30k 1k under ROOT and print the exact override to use it.

    python scripts/prepare_data.py coco5k --root /data/fusebench
    python scripts/prepare_data.py flickr1k --root /data/fusebench

COCO: downloads Karpathy's split archive and the COCO val2014 images (about 6.6 GB) from the official sources,
with resume and a progress bar, then verifies every referenced image is present and decodes, and the counts.
Flickr30k: downloads Karpathy's splits; the images need the owners' form (the command says where), then it
verifies what you placed. --sources FILE (JSON: {"coco_val2014": {"url": ..., "sha256": ...}, ...}) points at
mirrors; --no-download only verifies; --expected IMAGES,CAPTIONS checks other counts (for subsets).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from fusebench import FusebenchError
from fusebench.data.prepare import BENCHMARKS, prepare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=sorted(BENCHMARKS))
    parser.add_argument("--root", required=True, help="data root (use the same as FUSEBENCH_DATA / paths.data_root)")
    parser.add_argument("--sources", help="JSON file overriding download URLs and checksums")
    parser.add_argument("--no-download", action="store_true", help="only verify what is already there")
    parser.add_argument("--no-verify", action="store_true", help="skip the full decode check of every image")
    parser.add_argument("--expected", help="IMAGES,CAPTIONS to expect instead of the standard counts")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        sources = json.loads(open(args.sources, encoding="utf-8").read()) if args.sources else None
        expected = tuple(int(x) for x in args.expected.split(",")) if args.expected else None
        override = prepare(args.dataset, args.root, sources, download_files=not args.no_download,
                           verify=not args.no_verify, expected=expected)
    except FusebenchError as err:
        print(f"prepare_data: error: {err}", file=sys.stderr)
        return 2
    print(f"{args.dataset} is ready. Run:\n  {override}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
