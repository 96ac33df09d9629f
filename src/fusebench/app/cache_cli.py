"""``fusebench-cache``: list and remove cache entries: embeddings, each model's stored ranked lists, score matrices,
distractors' near-duplicate maxima, FAISS indexes (``search=faiss_*``) and the settings a target recall chose.

    fusebench-cache list [--dir DIR]           entries with model, kind (image/text/lists/scores/dedup/index/tuning), shape,
                                               size, state (every data file's checksum verified, as a run would)
    fusebench-cache list --quick               the same without reading the data: state from sizes alone
    fusebench-cache remove KEY [KEY ...]       remove entries by key prefix (at least 4 characters, either case);
                                               a prefix that matches several entries is refused (they are listed)
    fusebench-cache remove --all KEY [...]     remove every entry each prefix matches
    fusebench-cache clear --yes                remove every entry
    fusebench-cache verify [KEY ...] [--remove]
                                               read every gallery shard's images again (or the shards the key
                                               prefixes name) and check each against the SHA-256 recorded when it
                                               was embedded: a file replaced with the same size and mtime keeps
                                               its shard's key, and only this finds it; exit 1 naming the shards
                                               with changed images (--remove: removes them, so the next run embeds
                                               them again)
The default DIR is the runs' own: embed.cache.dir of the composed config ($FUSEBENCH_OUTPUT/cache, else
outputs/cache). A DIR given with --dir must be an existing folder (an empty --dir, such as an unset shell
variable, is an error: never the default). State: complete (each data file's size and checksum are the
recorded ones: a run reads it as it is; ``complete (sizes)`` with --quick); partial (an unfinished entry, with its finished
chunks); partial (damaged: why), an entry that a run would report and recompute (meta.json of another entry,
a data file missing, of the wrong size or not a file, a file where the entry's folder belongs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fusebench import FusebenchError
from fusebench.config import CONFIG_DIR, schema
from fusebench.runtime.arguments import OneLineParser
from fusebench.runtime.progress import bar
from fusebench.stores.embeddings import EmbeddingCache, entry_contents
from fusebench.stores.entries import STORES, matching, read_meta, remove_entry


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def format_entries(entries: list[dict]) -> str:
    if not entries:
        return "no cache entries"
    lines = [f"{'key':<14} {'model':<26} {'kind':<6} {'shape':<14} {'size':>9}  state"]
    for e in entries:
        shape = "x".join(str(x) for x in e.get("shape") or []) or "-"
        if e["complete"]:
            state = "complete" if e.get("verified", True) else "complete (sizes)"
        else:
            state = f"partial (damaged: {e['problem']})" if e.get("problem") else f"partial ({e.get('chunks', 0)} chunks)"
        lines.append(f"{e['key'][:12]:<14} {e.get('model', '') or '-':<26} {e.get('kind', '') or '-':<6} "
                     f"{shape:<14} {_size(e['bytes']):>9}  {state}")
    total = sum(e["bytes"] for e in entries)
    lines.append(f"{len(entries)} entries, {_size(total)}")
    return "\n".join(lines)


def checked_dir(given: str | None) -> str:
    """The cache folder: ``given`` (--dir), which must be an existing folder, else the runs' default, which
    may not exist yet (no entries) but must not be anything else. An empty --dir (an unset shell variable) is
    an error, not the default: ``clear --yes --dir "$UNSET"`` must not clear the default cache."""
    if given is not None and not given.strip():
        raise FusebenchError(f"--dir is empty ({given!r}; an unset shell variable?): give the cache folder, "
                             "or leave --dir out for the default (embed.cache.dir)")
    folder = Path(given if given is not None else default_cache_dir()).expanduser()
    if folder.exists() and not folder.is_dir():
        raise FusebenchError(f"--dir {folder}: not a folder")
    if given is not None and not folder.exists():
        raise FusebenchError(f"--dir {folder}: no such folder")
    return str(folder)


def _match_line(entry: dict) -> str:
    return f"  {entry['key']}  {entry.get('kind') or '-'}  {entry.get('model') or '-'}"


def default_cache_dir() -> str:
    """embed.cache.dir as a run would resolve it (the config is the one home of that default)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra


    schema.register()  # the groups' schemas, which the YAML options start from (as the fusebench command has them)
    if GlobalHydra.instance().is_initialized():
        cfg = compose(config_name="config")
    else:
        with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
            cfg = compose(config_name="config")
    root = cfg.paths.output_dir
    if isinstance(root, str) and not root.strip():  # as the fusebench command refuses it (app.callback.ROOTS)
        raise FusebenchError("paths.output_dir is empty (FUSEBENCH_OUTPUT set to nothing), so the default cache "
                             f"would be {cfg.embed.cache.dir} at the filesystem root; unset FUSEBENCH_OUTPUT or set it "
                             "to a folder, or give --dir FOLDER")
    return str(cfg.embed.cache.dir)


BAR_BYTES = 256 << 20  # hashing more than this shows a progress bar (a few seconds of reading)
BAR_IMAGES = 5000  # verify reading at least this many images shows a progress bar


def listed(stores, verify: bool) -> list[dict]:
    """Every store's entries; with ``verify``, each data file's checksum read, as a run reads it (a bar on
    stderr when there is much to hash; an empty or small cache lists without importing tqdm)."""
    stores = list(stores)
    quick = [e for store in stores for e in store.entries(verify=False)]
    if not verify or not any(e["complete"] for e in quick):
        return quick
    if sum(e["bytes"] for e in quick if e["complete"]) < BAR_BYTES:
        return [e for store in stores for e in store.entries(verify=True)]

    with bar(desc="verifying checksums", unit="B", unit_scale=True, leave=False, file=sys.stderr) as progress:
        return [e for store in stores for e in store.entries(verify=True, progress=progress.update)]


def main(argv: list[str] | None = None) -> int:
    """The command; Ctrl-C is one line and exit 130 (each entry is removed whole, under its lock)."""
    try:
        return _cache(argv)
    except KeyboardInterrupt:
        print("\nfusebench-cache: interrupted; entries already removed are gone, the others untouched", file=sys.stderr)
        return 130


def _cache(argv: list[str] | None) -> int:
    parser = OneLineParser(prog="fusebench-cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="cache folder (default: embed.cache.dir, as runs use it)")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {"list": sub.add_parser("list", help="list entries"),
                "remove": sub.add_parser("remove", help="remove entries by key prefix"),
                "clear": sub.add_parser("clear", help="remove every entry")}
    for command in commands.values():  # --dir before or after the command: both forms work
        command.add_argument("--dir", default=argparse.SUPPRESS, help="cache folder")
    commands["list"].add_argument("--quick", action="store_true",
                                  help="skip the checksums: state from meta.json and file sizes alone")
    commands["remove"].add_argument("keys", nargs="+")
    commands["remove"].add_argument("--all", action="store_true",
                                    help="remove every entry a prefix matches (without it, a prefix that matches "
                                         "several entries is refused and the matches are listed)")
    commands["clear"].add_argument("--yes", action="store_true", help="confirm")
    commands["verify"] = sub.add_parser("verify", help="check gallery shards' images against their recorded digests")
    commands["verify"].add_argument("--dir", default=argparse.SUPPRESS, help="cache folder")
    commands["verify"].add_argument("keys", nargs="*", help="key prefixes of the shards to check (default: all)")
    commands["verify"].add_argument("--remove", action="store_true",
                                    help="remove each shard with a changed image (or a damaged record)")
    args = parser.parse_args(argv)
    try:
        args.dir = checked_dir(args.dir)
        stores = {"embeddings": EmbeddingCache(args.dir), **{store.folder: store(args.dir) for store in STORES.items()}}
        if args.command == "list":
            print(format_entries(listed(stores.values(), verify=not args.quick)))
        elif args.command == "remove":
            entries = listed(stores.values(), verify=False)
            chosen = []
            for key in args.keys:  # every prefix is resolved before anything is removed
                found = matching(entries, key)
                if not found:
                    print(f"fusebench-cache: no entry matches {key!r} in {args.dir}", file=sys.stderr)
                    return 1
                if len(found) > 1 and not args.all:
                    print(f"fusebench-cache: error: {key!r} matches {len(found)} entries; give more of the key, "
                          f"or --all to remove them all:", *map(_match_line, found), sep="\n", file=sys.stderr)
                    return 2
                chosen += [e for e in found if e not in chosen]
            for entry in chosen:
                remove_entry(entry)
            print("\n".join(f"removed {e['key']}" for e in chosen))
        elif args.command == "clear":
            if not args.yes:
                print("fusebench-cache: clear removes every entry; add --yes to confirm", file=sys.stderr)
                return 2
            entries = listed(stores.values(), verify=False)
            for entry in entries:
                remove_entry(entry)
            print(f"removed {len(entries)} entries from {args.dir}")
        elif args.command == "verify":
            return verify(stores, args.keys, args.remove)
    except FusebenchError as err:
        print(f"fusebench-cache: error: {err}", file=sys.stderr)
        return 2
    return 0


def _chosen_shards(stores: dict, prefixes: list[str], shard_kind: str) -> list[dict]:
    """The complete gallery shard entries to verify: every one, or those the key prefixes name (a prefix that
    names no complete shard entry is an error naming what it names)."""
    shards = [e for e in stores["embeddings"].entries(verify=False)
              if e.get("kind") == shard_kind and (e["complete"] or e.get("problem"))]
    if not prefixes:
        return shards
    every = listed(stores.values(), verify=False)
    chosen = []
    for prefix in prefixes:
        found = matching(shards, prefix)
        if not found:
            others = sorted({f"{e.get('kind') or '-'} ({'complete' if e['complete'] else 'partial'})"
                             for e in matching(every, prefix)})
            named = f"names {', '.join(others)} entries only" if others else "matches no entry"
            raise FusebenchError(f"{prefix!r} {named}; verify checks finished gallery shards (kind {shard_kind}: "
                                 "see fusebench-cache list)")
        chosen += [e for e in found if e not in chosen]
    return chosen


def verify(stores: dict, prefixes: list[str], remove: bool) -> int:
    """``fusebench-cache verify``: each chosen shard's images read again and checked against its content record
    (``encoders.shard_check``); a line per shard and a total. 0: every shard checked and unchanged (or removed,
    with ``remove``); 1: a shard with a changed image or a damaged record left in place, or one without a
    record (embedded before fusebench recorded them), which cannot be checked."""
    from fusebench.encoders.shard_check import changed_images  # lazy: heavy (torch, PIL)
    from fusebench.encoders.shards import SHARD_KIND  # lazy: heavy (torch, numba, PIL)

    shards = _chosen_shards(stores, prefixes, SHARD_KIND)
    if not shards:
        print(f"no finished gallery shard entries in {stores['embeddings'].root}")
        return 0
    unchanged = bad = unrecorded = removed = 0
    total = sum(e["shape"][0] for e in shards)
    with bar(total=total, desc="reading images", unit="img", leave=False, file=sys.stderr,
             disable=total < BAR_IMAGES) as progress:
        for entry in shards:
            folder = Path(entry["path"])
            label = f"{entry['key'][:12]}  {entry.get('model') or '-'}  {entry['shape'][0]} images"
            contents, problem = (None, entry["problem"]) if entry.get("problem") else entry_contents(
                folder, read_meta(folder / "meta.json"))
            if contents is None and problem is None:
                unrecorded += 1
                print(f"{label}: no content record (embedded before fusebench recorded one), not checked; "
                      f"fusebench-cache remove {entry['key'][:12]} embeds it again on the next run")
                progress.update(entry["shape"][0])
                continue
            changed = changed_images(contents, progress.update) if problem is None else []
            if problem is None and not changed:
                unchanged += 1
                print(f"{label}: unchanged")
                continue
            bad += 1
            what = (f"damaged ({problem}): a run removes it and embeds it again" if problem else
                    f"{len(changed)} image(s) changed since embedded: " + "; ".join(
                        f"row {c['row']} {c['ref']} ({c['why']})" for c in changed[:3])
                    + (f"; and {len(changed) - 3} more" if len(changed) > 3 else ""))
            if remove:
                remove_entry(entry)
                removed += 1
                print(f"{label}: {what}; removed")
            else:
                print(f"{label}: {what}")
    print(f"{len(shards)} shard(s): {unchanged} unchanged, {bad} changed or damaged"
          + (f" ({removed} removed: the next run embeds them again)" if remove else "")
          + (f", {unrecorded} without a content record" if unrecorded else ""))
    if bad and not remove:
        print(f"fusebench-cache: {bad} shard(s) hold rows of images that changed since they were embedded; "
              "remove them (fusebench-cache verify --remove) so that the next run embeds them again", file=sys.stderr)
    return 1 if (bad and not remove) or unrecorded else 0


if __name__ == "__main__":
    sys.exit(main())
