"""The `leap-stream` console script.

Each subcommand lives next to the code it drives and exposes ``register(parser)`` and
``run(args, settings) -> int``; the modules are imported only when their command runs, so
`leap-stream --version` stays instant. The settings are parsed here, once: a bad value stops
the command with exit 2 before it starts.
"""

from __future__ import annotations

# Only what holding the stop signals needs is imported here: the console script imports this
# module before `main` can block them, so every import above `main` widens the window in which
# a SIGTERM still kills the worker (argparse and typing cost ~12 ms of it). The rest is
# imported inside the functions.
import signal
import sys

from leap_stream import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; checkers read it as True
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from leap_stream.settings import Settings

# subcommand -> (module with register(sub) and run(args) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("leap_stream.config_cli", "print the effective settings"),
    "dev": ("leap_stream.tools.dev.cli", "start, inspect and stop local Kafka and Redis"),
    "topics": ("leap_stream.tools.dev.topics_cli", "create the topics the service uses"),
    "simulate": ("leap_stream.tools.sim.cli", "generate a synthetic fleet (files and/or Kafka)"),
    "worker": ("leap_stream.stream.worker", "run the stream processor (Faust worker)"),
    "serve": ("leap_stream.stream.serve", "rank over HTTP (POST /v1/rank) for schedulers"),
    "kueue-gate": (
        "leap_stream.schedulers.kueue",
        "release Kueue-gated jobs onto their top-ranked types (untested on a live cluster)",
    ),
    "lag": ("leap_stream.stream.lag", "consumer lag of the worker's group per partition"),
    "rankings": (
        "leap_stream.stream.client",
        "read rankings (`rankings tail`), keep the Slurm cache (`rankings cache`)",
    ),
    "store": ("leap_stream.store.cli", "Redis history rebuild, dataset compaction, models"),
    "train": ("leap_stream.train.trainer", "nightly training with the promotion gate"),
    "backtest": ("leap_stream.tools.backtest", "nightly retrains against the simulator's truth"),
    "evaluate": (
        "leap_stream.tools.evaluate.cli",
        "cross-hardware prediction checked on a real benchmark table",
    ),
    "demo": ("leap_stream.tools.demo.cli", "the whole service on one machine, with a report"),
    "bench": (
        "leap_stream.tools.bench.cli",
        "throughput and latency benchmark against the local services",
    ),
}


# Commands that stop gracefully on SIGTERM/SIGINT once loaded. Until they have their handlers
# (the worker: `stream.worker.stop_on_signals`, which unblocks them) the signals are blocked:
# held, not lost, so that one arriving while Python imports the command (~0.6 s for the
# worker) stops it cleanly instead of killing it. This module imports nothing heavy before.
HOLDS_STOP_SIGNALS = frozenset({"worker"})
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    import argparse

    parser = argparse.ArgumentParser(prog="leap-stream", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"leap-stream {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser, {name: module for name, (module, _h) in COMMANDS.items()}


def with_local_services(settings: Settings) -> Settings:
    """Empty service addresses filled in from `leap-stream dev up` (the entry point is the one
    place that knows both the service and the dev tooling)."""
    from leap_stream.tools.dev import with_local_services as fill

    return fill(settings)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    held = bool(argv) and argv[0] in HOLDS_STOP_SIGNALS
    if held:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return _main(argv)
    finally:
        if held:  # also when the command failed before it took them over
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _main(argv: list[str]) -> int:
    import argparse
    import importlib

    parser, modules = build_parser()
    if not argv or argv[0] not in modules:
        parser.parse_args(argv)  # handles --version, --help and unknown commands
        parser.print_help()
        return 2
    from leap_stream.settings import Settings, SettingsError

    name, rest = argv[0], argv[1:]
    module = importlib.import_module(modules[name])
    command_parser = argparse.ArgumentParser(
        prog=f"leap-stream {name}", description=COMMANDS[name][1]
    )
    module.register(command_parser)
    args = command_parser.parse_args(rest)
    try:
        settings = with_local_services(Settings.from_env())
        result: int = module.run(args, settings)
    except SettingsError as exc:
        print(f"leap-stream {name}: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    raise SystemExit(main())
