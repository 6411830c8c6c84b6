"""`leap-stream worker`: build the dependencies, check the topics, run the Faust worker.

A thin wrapper over ``faust.Worker``: SIGTERM/SIGINT go to Faust's graceful shutdown (finish
the batch in hand, flush, commit, exit 0).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
import sys
from typing import Any

from leap_stream import config
from leap_stream.stream.env import resolve_bootstrap, resolve_redis_url

log = logging.getLogger(__name__)


def missing_topics(bootstrap: str, names: list[str], timeout: float = 15.0) -> list[str]:
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = dict(config.kafka_client_config(bootstrap))
    meta = AdminClient(conf).list_topics(timeout=timeout)
    return [n for n in names if n not in meta.topics or meta.topics[n].error is not None]


def build_deps(cfg: config.Config, bootstrap: str, redis_url: str) -> Any:
    from leap_stream.catalog import load_catalog
    from leap_stream.store.offline import DatasetSink
    from leap_stream.store.online import OnlineStore, connect
    from leap_stream.store.registry import Registry
    from leap_stream.stream import compiled
    from leap_stream.stream.app import WorkerDeps
    from leap_stream.stream.batch import CompletionProcessor, SubmissionProcessor
    from leap_stream.stream.lag import LagReader, worker_groups
    from leap_stream.stream.metrics import Metrics
    from leap_stream.stream.models import RankerHolder, lookup_from_dataset
    from leap_stream.stream.output import OutputProducer

    metrics = Metrics()
    catalog = load_catalog()
    known = set(catalog.types)
    store = OnlineStore(connect(redis_url), prefix=cfg.redis_prefix)
    holder = RankerHolder(
        catalog,
        Registry(cfg.registry_dir),
        metrics,
        lookup_from_dataset(cfg.dataset_dir),
        compile_trees=compiled.wanted(),
    )
    holder.poll()  # serve the current model from the first batch on
    sink = DatasetSink(cfg.dataset_dir)
    lag = LagReader(
        bootstrap,
        worker_groups(cfg.consumer_group, cfg.topic_submissions, cfg.topic_completions),
    )

    def lag_poll() -> None:
        for row in lag.read():
            metrics.consumer_lag.labels(topic=row.topic, partition=str(row.partition)).set(row.lag)

    return WorkerDeps(
        cfg=cfg,
        bootstrap=bootstrap,
        submissions=SubmissionProcessor(
            store, holder.get, max_bytes=cfg.max_message_bytes, known_hardware=known
        ),
        completions=CompletionProcessor(
            store, max_bytes=cfg.max_message_bytes, known_hardware=known
        ),
        dataset_append=sink.append,
        make_output=lambda: OutputProducer(bootstrap, on_reset=metrics.producer_resets.inc),
        metrics=metrics,
        model_poll=holder.poll,
        lag_poll=lag_poll,
        flush_rows=int(config.get("LEAP_DATASET_FLUSH_ROWS")),
        flush_s=float(config.get("LEAP_DATASET_FLUSH_S")),
        lag_interval_s=float(config.get("LEAP_LAG_INTERVAL_S")),
        orphan_grace_s=float(config.get("LEAP_ORPHAN_GRACE_S")),
    )


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="default LEAP_METRICS_PORT (0: off)"
    )
    parser.add_argument("-l", "--loglevel", default=None, help="log level (default LEAP_LOG_LEVEL)")


def run(args: argparse.Namespace) -> int:
    import faust

    from leap_stream.stream.app import build_app

    faulthandler.enable()  # a crash in a C extension prints every thread's stack
    from leap_stream.stream.compiled import wanted
    from leap_stream.stream.submission_loop import consumer_stall_s

    cfg = config.Config.from_env()
    try:
        consumer_stall_s()
        wanted()
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    level = (args.loglevel or config.get("LEAP_LOG_LEVEL")).lower()
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    bootstrap = resolve_bootstrap(cfg.kafka_bootstrap)
    redis_url = resolve_redis_url(cfg.redis_url)
    topics = [
        cfg.topic_submissions,
        cfg.topic_completions,
        cfg.topic_rankings,
        cfg.topic_dead_letter,
    ]
    missing = missing_topics(bootstrap, topics)
    if missing:
        print(
            f"missing topics {', '.join(missing)}: run `leap-stream topics create` first",
            file=sys.stderr,
        )
        return 2
    deps = build_deps(cfg, bootstrap, redis_url)
    port = cfg.metrics_port if args.metrics_port is None else args.metrics_port
    deps.metrics.serve(port)
    app = build_app(deps)
    worker = faust.Worker(app, loglevel=level, redirect_stdouts=False)
    if config.get("LEAP_GC_FREEZE") == "1":
        gc.collect()
        gc.freeze()
    worker.execute_from_commandline()  # raises SystemExit with Faust's exit status
    return 0


__all__ = ["build_deps", "missing_topics", "register", "run"]
