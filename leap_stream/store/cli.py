"""`leap-stream store`: operate the stores by hand (rebuild the history, compact, models)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson

from leap_stream.settings import Settings


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    rb = sub.add_parser(
        "rebuild-history",
        help="recreate the Redis history from the dataset (after Redis lost it; worker stopped)",
    )
    rb.add_argument("--dataset", type=Path, default=None, help="default: LEAP_DATASET_DIR")
    rb.add_argument("--redis-url", default=None, help="default: LEAP_REDIS_URL")
    rb.add_argument("--prefix", default=None, help="default: LEAP_REDIS_PREFIX")
    cp = sub.add_parser("compact", help="rewrite day partitions as one de-duplicated file each")
    cp.add_argument("--dataset", type=Path, default=None, help="default: LEAP_DATASET_DIR")
    cp.add_argument("--day", action="append", help="YYYY-MM-DD (repeatable); default: every day")
    md = sub.add_parser("models", help="list registry versions; --promote to switch current")
    md.add_argument("--registry", type=Path, default=None, help="default: LEAP_REGISTRY_DIR")
    md.add_argument("--promote", metavar="VERSION", help="make VERSION current (manual rollback)")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    if args.action == "rebuild-history":
        from leap_stream.store.connection import connect_with
        from leap_stream.store.offline import completions_from_frame, read_dataset
        from leap_stream.store.online import OnlineStore

        t0 = time.perf_counter()
        completions = completions_from_frame(read_dataset(args.dataset or cfg.dataset_dir))
        if args.prefix is not None:
            cfg = cfg.replace(redis_prefix=args.prefix)
        store = OnlineStore.of(cfg, connect_with(cfg, args.redis_url))
        applied, measured = store.rebuild_history(completions)
        dt = time.perf_counter() - t0
        print(f"rebuilt history: {applied} completions, {measured} measurements, {dt:.1f}s")
        return 0
    if args.action == "compact":
        from leap_stream.store.offline import compact

        root = args.dataset or cfg.dataset_dir
        days = args.day or sorted(p.name.removeprefix("day=") for p in root.glob("day=*"))
        for day in days:
            out = compact(root, day)
            print(f"{day}: {out if out else 'empty'}")
        return 0
    from leap_stream.store.registry import Registry

    reg = Registry(args.registry or cfg.registry_dir)
    if args.promote:
        reg.promote(args.promote, reason="manual (leap-stream store models --promote)")
    current = reg.current_version()
    for version in reg.list_versions():
        meta = reg.metadata(version)
        mark = "*" if version == current else " "
        rest = {k: v for k, v in meta.items() if k not in ("version", "trained_at")}
        extra = orjson.dumps(rest).decode()[:100] if rest else ""
        print(f"{mark} {version}  trained_at={meta['trained_at']}  {extra}")
    if current is None:
        print("(no current model)")
    return 0
