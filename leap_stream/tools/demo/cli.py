"""`leap-stream demo`: services, simulated history, first model, worker, one streamed day,
nightly retrain with hot reload, and a report (text, JSON, PNGs, one HTML file)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from leap_stream.settings import Settings

FAST = {"days_history": 3, "per_day": 1500, "rate": 800.0, "morning": 100}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("demo-report"),
        help="report folder (default ./demo-report)",
    )
    parser.add_argument("--days-history", type=int, default=None, help="days of history (7)")
    parser.add_argument("--per-day", type=int, default=None, help="submissions per day (10000)")
    parser.add_argument(
        "--rate", type=float, default=None, help="events/s streamed to Kafka (250; 0: no limit)"
    )
    parser.add_argument("--seed", type=int, default=7, help="simulator seed")
    parser.add_argument(
        "--fast", action="store_true", help="small run: 3 days × 1500, 800 events/s (~30 s)"
    )
    parser.add_argument(
        "--services",
        choices=("native", "docker", "auto"),
        default="native",
        help="native Kafka/Redis (default), docker compose, or docker when an engine answers",
    )
    parser.add_argument("--no-poison", action="store_true", help="inject no bad events")
    parser.add_argument("--keep", action="store_true", help="keep the run's topics and Redis keys")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _terminate(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace, _settings: Settings) -> int:
    from leap_stream.tools.demo.options import DemoOptions
    from leap_stream.tools.demo.runner import run_demo

    opts = DemoOptions(out=args.out, seed=args.seed, services=args.services)
    if args.fast:
        opts.days_history = int(FAST["days_history"])
        opts.per_day = int(FAST["per_day"])
        opts.rate = float(FAST["rate"])
        opts.morning = int(FAST["morning"])
    if args.days_history is not None:
        opts.days_history = args.days_history
    if args.per_day is not None:
        opts.per_day = args.per_day
    if args.rate is not None:
        opts.rate = args.rate
    opts.poison = not args.no_poison
    opts.keep = args.keep
    opts.progress = not args.no_progress
    if opts.days_history < 2:
        print("demo: --days-history must be at least 2", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C, so the worker is stopped and the run's topics deleted
    signal.signal(signal.SIGTERM, _terminate)
    try:
        report, paths = run_demo(opts)
    except (RuntimeError, TimeoutError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo: interrupted (worker stopped, the run's topics deleted)", file=sys.stderr)
        return 130
    print(report["_text"])
    print(
        f"\nreport: {paths['html']}  (also report.json, report.txt and the PNGs in {opts.out.resolve()})"
    )
    print(f"services are left running; stop them with `{report['_stop_hint']}`")
    return 0


__all__ = ["register", "run"]
