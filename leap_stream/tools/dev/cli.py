"""`leap-stream dev up|down|status`: native Kafka and Redis for a laptop or a CI box.

Progress goes to stderr and only `export` lines go to stdout, so `eval "$(leap-stream dev up --env)"`
works and a human still sees what happened.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time

import orjson

from leap_stream.settings import Settings
from leap_stream.tools import dev
from leap_stream.tools.dev import state
from leap_stream.tools.dev.state import Paths


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start what is missing (idempotent); prints shell exports")
    up.add_argument("--env", action="store_true", help="print only the export lines (for eval)")
    up.add_argument("--no-kafka", action="store_true", help="leave Kafka alone")
    up.add_argument("--no-redis", action="store_true", help="leave Redis alone")
    up.add_argument(
        "--redis-cluster",
        action="store_true",
        help="a local Redis Cluster of three masters instead of one Redis; the exports add "
        "LEAP_REDIS_CLUSTER=1",
    )
    st = sub.add_parser("status", help="what runs: pids, addresses, logs")
    st.add_argument("--json", action="store_true", help="one JSON object")
    down = sub.add_parser("down", help="stop what `up` started (SIGTERM, then SIGKILL)")
    down.add_argument("--purge", action="store_true", help="also delete broker and Redis data")
    down.add_argument("--timeout", type=float, default=20.0, help="seconds before SIGKILL")
    for p in (up, st, down):
        p.add_argument("--home", default=None, help="state folder (default $LEAP_HOME)")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    logging.basicConfig(
        level=logging.WARNING if getattr(args, "env", False) else logging.INFO,
        format="dev: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.action == "up":
            return _up(args, cfg)
        if args.action == "status":
            return _status(args, cfg)
        return _down(args, cfg)
    except RuntimeError as e:
        print(f"leap-stream dev {args.action}: {e}", file=sys.stderr)
        return 1


def _up(args: argparse.Namespace, cfg: Settings) -> int:
    t0 = time.monotonic()
    cluster = args.redis_cluster and not args.no_redis
    services = dev.ensure_services(
        kafka=not args.no_kafka,
        redis=not args.no_redis and not cluster,
        redis_cluster=cluster,
        home=args.home,
        cfg=cfg,
    )
    paths = Paths.from_env(args.home, cfg)
    if not args.env:
        started = ", ".join(services.started) or "nothing (already running)"
        print(
            f"dev: started {started} in {time.monotonic() - t0:.1f} s; env in {paths.env_file}",
            file=sys.stderr,
        )
    sys.stdout.write(state.render_env(services.env()))
    return 0


def _status(args: argparse.Namespace, cfg: Settings) -> int:
    info = dev.status(args.home, cfg)
    if args.json:
        print(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
        return 0
    for name in dev.SERVICES:
        s = info[name]
        if s.get("running"):
            ready = "ready" if s.get("ready") else "NOT answering"
            print(
                f"{name:<6} running  pid {s['pid']}  {s['address']}  {ready}  owner={s['owner']}"
                f"  leases={len(s['leases'])}"
            )
        elif "stale_pid_file" in s:
            print(f"{name:<6} stopped  (stale pid file {s['stale_pid_file']})")
        else:
            print(f"{name:<6} stopped")
        print(f"       log {s['log']}")
    print(f"home   {info['home']['path']}  env {info['home']['env_file']}")
    return 0


def _down(args: argparse.Namespace, cfg: Settings) -> int:
    result = dev.stop_services(home=args.home, timeout=args.timeout, cfg=cfg)
    for name, what in result.items():
        print(f"{name}: {what}")
    if args.purge:
        paths = Paths.from_env(args.home, cfg)
        for d in (paths.kafka_dir, paths.redis_dir, paths.redis_cluster_dir):
            shutil.rmtree(d, ignore_errors=True)
            print(f"purged {d}")
    return 0
