#!/usr/bin/env python
"""Benchmark reading distractor sources: tar shard listing, clip-retrieval dump keys and tile reads, near-duplicates.

1. Listing a webdataset shard (img2dataset's layout: KEY.jpg, KEY.txt, KEY.json per sample) from its headers with
   fusebench's reader against ``tarfile``'s iteration (both read headers only), per member.
2. A clip-retrieval dump's key: the per-shard fingerprint (SHA-256 of each .npy's first and last MiB) against a full
   SHA-256 of every .npy, per GB.
3. VectorDumpRows tiles: a whole gallery read tile by tile in seeded order, dense (size = dump) and sparse (size =
   dump / 10), against a bare np.load of the same shards (MB/s of rows delivered).
4. The near-duplicate pass (each distractor's largest cosine to the test images) against the bare fp32 matmuls.
Ratios come from one run; the CPU model is printed.
Usage: python scripts/bench_gallery_sources.py [--samples 10000] [--dump-rows 200000] [--dim 768]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import cpu_model  # noqa: E402

from fusebench.data.distractor_sources import webdataset_items  # noqa: E402
from fusebench.data.tar_shards import _tarfile_members, tar_members  # noqa: E402
from fusebench.encoders.distractors import normalised  # noqa: E402
from fusebench.encoders.duplicate_scan import distractor_max_cosine  # noqa: E402
from fusebench.encoders.vector_dumps import ClipRetrievalDump, VectorDumpRows  # noqa: E402


def best_of(fn, repeats=3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def write_shard(path: Path, samples: int) -> None:
    jpeg = os.urandom(3000)  # listing reads headers only: the payload's content does not matter
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:
        for key in range(samples):
            for ext, data in (("jpg", jpeg), ("txt", b"a caption"), ("json", json.dumps({"key": key}).encode())):
                info = tarfile.TarInfo(f"{key:09d}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))


def bench_listing(folder: Path, samples: int) -> None:
    shard = folder / "00000.tar"
    write_shard(shard, samples)
    members = 3 * samples
    fast, slow = best_of(lambda: tar_members(str(shard))), best_of(lambda: _tarfile_members(str(shard)))
    listing = best_of(lambda: webdataset_items(str(folder)))
    print(f"listing a {members:,}-member shard ({shard.stat().st_size / 1e6:.0f} MB): headers read here "
          f"{fast:.3f} s ({1e6 * fast / members:.1f} us/member), tarfile {slow:.3f} s ({1e6 * slow / members:.1f} "
          f"us/member): {slow / fast:.1f}x; webdataset_items (ids, refs) {listing:.3f} s; "
          f"1M samples (3M members) ~ {3e6 * listing / members:.0f} s")


def write_dump(folder: Path, rows: int, dim: int, shards: int = 4) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / "img_emb").mkdir(parents=True)
    (folder / "metadata").mkdir(parents=True)
    rng, start = np.random.default_rng(0), 0
    for i, n in enumerate(np.diff(np.linspace(0, rows, shards + 1).astype(int))):
        np.save(folder / "img_emb" / f"img_emb_{i}.npy", normalised(rng.standard_normal((n, dim))).astype(np.float16))
        keys = [f"{start + r:09d}" for r in range(n)]
        pq.write_table(pa.table({"image_path": keys, "key": keys, "url": [f"http://x/{k}.jpg" for k in keys]}),
                       folder / "metadata" / f"metadata_{i}.parquet")
        start += n


def full_digest(dump: ClipRetrievalDump) -> None:
    for shard in dump.shards:
        digest = hashlib.sha256()
        with shard.npy.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                digest.update(chunk)


def bench_dump(folder: Path, rows: int, dim: int, tile: int) -> None:
    write_dump(folder, rows, dim)
    dump = ClipRetrievalDump(str(folder), "gallery.vectors.bench")
    npy_bytes = sum(s.npy.stat().st_size for s in dump.shards)
    partial, full = best_of(dump.key), best_of(lambda: full_digest(dump))
    print(f"dump key over {npy_bytes / 1e9:.2f} GB of .npy ({rows:,} x {dim} fp16, {len(dump.shards)} shards): "
          f"ends + metadata {partial:.3f} s, full SHA-256 of the .npy {full:.3f} s ({full / npy_bytes * 1e9:.2f} s/GB,"
          f" page cache warm)")
    bare = best_of(lambda: [np.load(s.npy).astype(np.float32) for s in dump.shards], repeats=2)
    print(f"  bare np.load of every shard (+ fp32): {npy_bytes / bare / 1e6:.0f} MB/s of fp16 rows")
    for size in (rows, rows // 10):
        gallery = VectorDumpRows(dump, size, "bench", seed=0)
        seconds = best_of(lambda g=gallery: [g.read(a, min(a + tile, g.n)) for a in range(0, g.n, tile)], repeats=2)
        got = size * dim * 2
        print(f"  VectorDumpRows size {size:,} of {rows:,}, tiles of {tile:,}: {seconds:.3f} s, "
              f"{got / seconds / 1e6:.0f} MB/s of fp16 rows delivered (incl. normalising)")


def bench_near_duplicates(n_test: int, n: int, dim: int, tile: int) -> None:
    rng = np.random.default_rng(1)
    test = normalised(rng.standard_normal((n_test, dim)))

    class Rows:  # distractors generated in memory: the pass, not the reading, is timed
        def __init__(self):
            self.n, self.dim, self.data = n, dim, normalised(rng.standard_normal((n, dim)))

        def read(self, a, b):
            return self.data[a:b]

    rows = Rows()
    ours = best_of(lambda: distractor_max_cosine(test, rows, tile, "cpu"), repeats=2)
    q, items = torch.from_numpy(test), torch.from_numpy(rows.data)
    torch.set_float32_matmul_precision("highest")
    bare = best_of(lambda: [items[a:a + tile] @ q.T for a in range(0, n, tile)], repeats=2)
    print(f"near-duplicate maxima, {n_test:,} test images x {n:,} distractors, d={dim}, tiles of {tile:,}: "
          f"{ours:.2f} s vs {bare:.2f} s of bare fp32 matmuls ({ours / bare:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10000, help="samples in the generated tar shard")
    parser.add_argument("--dump-rows", type=int, default=200000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--tile", type=int, default=16384, help="rows per read (eval.item_chunk_size)")
    parser.add_argument("--test-images", type=int, default=5000)
    parser.add_argument("--distractors", type=int, default=20000, help="for the near-duplicate pass")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), torch threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "shards").mkdir()
        bench_listing(Path(tmp) / "shards", args.samples)
        bench_dump(Path(tmp) / "dump", args.dump_rows, args.dim, args.tile)
    bench_near_duplicates(args.test_images, args.distractors, args.dim, args.tile)


if __name__ == "__main__":
    main()
