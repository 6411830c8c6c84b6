"""`leap-stream config`: show what the process would run with."""

from __future__ import annotations

import argparse

import orjson

from leap_stream.settings import Settings, config_table_markdown


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument(
        "--markdown", action="store_true", help="the documented table (docs/configuration.md)"
    )


def run(args: argparse.Namespace, cfg: Settings) -> int:
    if args.markdown:
        print(config_table_markdown(), end="")
        return 0
    values = cfg.raw()
    if args.json:
        print(orjson.dumps(values).decode())
    else:
        width = max(len(k) for k in values)
        for key, value in values.items():
            print(f"{key:<{width}}  {value}")
    return 0
