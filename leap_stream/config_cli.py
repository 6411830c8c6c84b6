"""`leap-stream config`: show what the process would run with."""

from __future__ import annotations

import argparse

import orjson

from leap_stream import config


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument(
        "--markdown", action="store_true", help="the documented table (docs/configuration.md)"
    )


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(config.config_table_markdown(), end="")
        return 0
    values = {s.env: config.get(s.env) for s in config.SETTINGS}
    for secret in ("LEAP_KAFKA_SASL_PASSWORD", "LEAP_REDIS_PASSWORD"):
        if values[secret]:
            values[secret] = "***"
    if args.json:
        print(orjson.dumps(values).decode())
    else:
        width = max(len(k) for k in values)
        for key, value in values.items():
            print(f"{key:<{width}}  {value}")
    return 0
