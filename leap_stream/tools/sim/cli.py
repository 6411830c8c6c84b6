"""`leap-stream simulate`: generate a synthetic fleet, write it to files and/or Kafka.

The last stdout line is one JSON summary object, so scripts can ``tail -1 | jq``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import orjson

from leap_stream.settings import Settings
from leap_stream.stream.kafka import KafkaClients, produce_waiting
from leap_stream.tools.sim.config import SimConfig


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    parser.add_argument("--days", type=int, default=1, help="days to simulate")
    parser.add_argument("--start", type=date.fromisoformat, default=date(2026, 11, 1))
    parser.add_argument("--out", type=Path, help="folder for submissions/completions jsonl etc.")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="without --to-kafka: submissions per day (default 30000); "
        "with --to-kafka: events produced per second (default 2000, 0 = as fast as possible)",
    )
    parser.add_argument(
        "--per-day", type=int, default=None, help="submissions per day (also with --to-kafka)"
    )
    parser.add_argument(
        "--dataset-dir",
        type=Path,
        help="write only the training dataset, day by day, to this folder (day= partitions, "
        "as the worker writes it): memory stays one day's, for a year of history",
    )
    parser.add_argument("--to-kafka", action="store_true", help="produce the events to Kafka")
    parser.add_argument("--bootstrap", default="", help="Kafka bootstrap (default: settings)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from leap_stream.tools.sim.events import write_jsonl
    from leap_stream.tools.sim.fleet import simulate

    if args.out is None and not args.to_kafka and args.dataset_dir is None:
        print("simulate: give --out DIR, --dataset-dir DIR and/or --to-kafka", file=sys.stderr)
        return 2
    per_day = args.per_day
    if per_day is None:
        per_day = int(args.rate) if (args.rate is not None and not args.to_kafka) else 30000
    cfg = SimConfig(seed=args.seed, days=args.days, rate=per_day, start=args.start)
    if args.dataset_dir is not None:
        if args.out is not None or args.to_kafka:
            print("simulate: --dataset-dir goes alone", file=sys.stderr)
            return 2
        written = write_dataset_by_day(cfg, args.dataset_dir, progress=not args.no_progress)
        sys.stdout.write(orjson.dumps(written).decode() + "\n")
        return 0
    t0 = time.perf_counter()
    result = simulate(cfg)
    gen_s = time.perf_counter() - t0
    summary: dict[str, Any] = result.summary()
    summary["generate_s"] = round(gen_s, 3)
    if args.out is not None:
        t1 = time.perf_counter()
        paths = write_jsonl(result, args.out)
        summary["write_s"] = round(time.perf_counter() - t1, 3)
        summary["out"] = {k: str(v) for k, v in paths.items()}
    if args.to_kafka:
        rate = 2000.0 if args.rate is None else float(args.rate)
        kafka = KafkaClients.of(settings, args.bootstrap or settings.require_kafka())
        summary["kafka"] = produce(
            result, kafka, settings.input_topics, rate, progress=not args.no_progress
        )
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


def write_dataset_by_day(cfg: SimConfig, root: Path, progress: bool = True) -> dict[str, Any]:
    """Simulate ``cfg`` a day at a time, appending each day's dataset rows under ``root``
    and keeping nothing else (no events, no truth)."""
    from tqdm import tqdm

    from leap_stream.store.offline import DatasetSink
    from leap_stream.tools.sim.fleet import FleetSimulator

    t0 = time.perf_counter()
    sim = FleetSimulator(cfg)
    sink = DatasetSink(root)
    rows = 0
    for _ in tqdm(range(cfg.days), desc="simulate", unit="day", disable=not progress):
        day = sim.step_day()
        sink.append_frame(day.dataset)
        rows += len(day.dataset)
    return {
        "days": cfg.days,
        "dataset_rows": rows,
        "dataset_dir": str(root),
        "generate_s": round(time.perf_counter() - t0, 3),
    }


def produce(
    result: Any,
    kafka: KafkaClients,
    input_topics: tuple[str, str],
    rate: float,
    progress: bool = True,
) -> dict[str, Any]:
    """Produce submissions and completions in time order at ``rate`` events/s, keyed by job_id;
    ``input_topics``: (submissions, completions)."""
    from confluent_kafka import KafkaException
    from tqdm import tqdm

    from leap_stream.tools.sim.events import timeline

    topics = {"submission": input_topics[0], "completion": input_topics[1]}
    producer = kafka.producer(
        {"linger.ms": 5, "compression.type": "lz4", "enable.idempotence": True}
    )
    known = producer.list_topics(timeout=10).topics
    missing = [t for t in topics.values() if t not in known]
    if missing:
        raise SystemExit(
            f"simulate: topics {missing} do not exist (run `leap-stream topics create`)"
        )
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    total = len(result.submissions) + len(result.completions)
    counts = {"submission": 0, "completion": 0}
    bar = tqdm(total=total, unit="ev", file=sys.stderr, disable=not progress, mininterval=0.5)
    start = time.perf_counter()
    sent = 0
    for kind, key, value in timeline(result):
        if rate > 0:
            ahead = sent / rate - (time.perf_counter() - start)
            if ahead > 0.002:
                time.sleep(ahead)
        produce_waiting(producer, topics[kind], key, value, on_delivery)
        counts[kind] += 1
        sent += 1
        if sent % 1000 == 0:
            bar.update(1000)
    bar.update(sent % 1000)
    remaining = producer.flush(60)
    bar.close()
    elapsed = time.perf_counter() - start
    if remaining:
        raise KafkaException(f"{remaining} events not delivered after 60 s")
    if errors:
        raise KafkaException(f"{len(errors)} delivery errors, first: {errors[0]}")
    return {
        "topics": topics,
        "produced": counts,
        "seconds": round(elapsed, 2),
        "events_per_s": round(sent / elapsed, 1) if elapsed > 0 else None,
    }


__all__ = ["produce", "register", "run"]
