"""``fusebench-cache``: list and remove cache entries: embeddings, each model's stored ranked lists and score matrices.

    fusebench-cache list [--dir DIR]           entries with model, kind (image/text/lists/scores), shape, size, state
    fusebench-cache remove KEY [KEY ...]       remove entries by key prefix (at least 4 characters)
    fusebench-cache clear --yes                remove every entry
The default DIR is the runs' own: embed.cache.dir of the composed config ($FUSEBENCH_OUTPUT/cache, else
outputs/cache).
"""

from __future__ import annotations

import argparse
import sys

from fusebench import FusebenchError
from fusebench.cache import EmbeddingCache
from fusebench.list_store import ListStore
from fusebench.score_store import ScoreStore


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
        state = "complete" if e["complete"] else f"partial ({e.get('chunks', 0)} chunks)"
        lines.append(f"{e['key'][:12]:<14} {e.get('model', '') or '-':<26} {e.get('kind', '') or '-':<6} "
                     f"{shape:<14} {_size(e['bytes']):>9}  {state}")
    total = sum(e["bytes"] for e in entries)
    lines.append(f"{len(entries)} entries, {_size(total)}")
    return "\n".join(lines)


def default_cache_dir() -> str:
    """embed.cache.dir as a run would resolve it (the config is the one home of that default)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fusebench.cli import CONFIG_DIR

    if GlobalHydra.instance().is_initialized():
        cfg = compose(config_name="config")
    else:
        with initialize_config_dir(version_base="1.3", config_dir=CONFIG_DIR):
            cfg = compose(config_name="config")
    return str(cfg.embed.cache.dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fusebench-cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="cache folder (default: embed.cache.dir, as runs use it)")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {"list": sub.add_parser("list", help="list entries"),
                "remove": sub.add_parser("remove", help="remove entries by key prefix"),
                "clear": sub.add_parser("clear", help="remove every entry")}
    for command in commands.values():  # --dir before or after the command: both forms work
        command.add_argument("--dir", default=argparse.SUPPRESS, help="cache folder")
    commands["remove"].add_argument("keys", nargs="+")
    commands["clear"].add_argument("--yes", action="store_true", help="confirm")
    args = parser.parse_args(argv)
    args.dir = args.dir or default_cache_dir()
    stores = {"embeddings": EmbeddingCache(args.dir), "lists": ListStore(args.dir), "scores": ScoreStore(args.dir)}
    try:
        if args.command == "list":
            print(format_entries([e for store in stores.values() for e in store.entries()]))
        elif args.command == "remove":
            for key in args.keys:
                removed = [k for store in stores.values() for k in store.remove(key)]
                if not removed:
                    print(f"fusebench-cache: no entry matches {key!r} in {args.dir}", file=sys.stderr)
                    return 1
                print("\n".join(f"removed {k}" for k in removed))
        elif args.command == "clear":
            if not args.yes:
                print("fusebench-cache: clear removes every entry; add --yes to confirm", file=sys.stderr)
                return 2
            entries = [(store, e) for store in stores.values() for e in store.entries()]
            for store, entry in entries:
                store.remove(entry["key"])
            print(f"removed {len(entries)} entries from {args.dir}")
    except FusebenchError as err:
        print(f"fusebench-cache: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
