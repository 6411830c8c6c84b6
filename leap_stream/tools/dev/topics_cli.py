"""`leap-stream topics create`: the four service topics, idempotently."""

from __future__ import annotations

import argparse
import sys

from leap_stream.settings import Settings


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = sub.add_parser("create", help="create the configured topics (existing ones are fine)")
    create.add_argument(
        "--bootstrap", default=None, help="Kafka bootstrap servers (default $LEAP_KAFKA_BOOTSTRAP)"
    )
    create.add_argument(
        "--partitions", type=int, default=None, help="default $LEAP_TOPIC_PARTITIONS"
    )
    create.add_argument(
        "--replication", type=int, default=None, help="default $LEAP_TOPIC_REPLICATION"
    )
    create.add_argument("--timeout", type=float, default=30.0, help="seconds per admin operation")
    create.add_argument("names", nargs="*", help="topics to create (default: the four configured)")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    from leap_stream.tools.dev.topics import create_topics, topic_config

    bootstrap = args.bootstrap or cfg.kafka_bootstrap
    if not bootstrap:
        print(
            "leap-stream topics create: no broker: pass --bootstrap or set LEAP_KAFKA_BOOTSTRAP "
            '(eval "$(leap-stream dev up --env)" starts a local one)',
            file=sys.stderr,
        )
        return 2
    try:
        outcome = create_topics(
            bootstrap,
            args.names or None,
            args.partitions,
            args.replication,
            timeout=args.timeout,
            cfg=cfg,
        )
    except RuntimeError as e:
        print(f"leap-stream topics create: {e}", file=sys.stderr)
        return 1
    partitions = args.partitions or cfg.topic_partitions
    for name, what in outcome.items():
        retention = topic_config(name, cfg)["retention.ms"]
        print(f"{what:<8} {name}  (partitions {partitions}, retention.ms {retention})")
    return 0
