"""Reading leap.rankings the way a scheduler would: decoded, one answer per (job_id, attempt).

The worker delivers at least once, so a ranking can repeat after a crash or a rebalance; the
topic is keyed by job_id, so repeats land on the same partition in production order and "the
latest one wins" is simply the last one read.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from leap_stream.settings import Settings
from leap_stream.stream.kafka import KafkaClients

RankingKey = tuple[str, int]


class Arrival(NamedTuple):
    """One ranking as read: arrival here and the producer's Kafka timestamp (epoch s)."""

    arrived: float
    produced: float
    ranking: dict[str, Any]


def decode_ranking(value: bytes | None) -> dict[str, Any] | None:
    """A ranking event, or None when the value is not a JSON object with a job_id."""
    try:
        ranking = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        return None
    return ranking if isinstance(ranking, dict) and "job_id" in ranking else None


class RankingsClient:
    """A confluent-kafka consumer of the rankings topic with a per-(job_id, attempt) view."""

    def __init__(
        self,
        kafka: KafkaClients,
        topic: str,
        *,
        from_beginning: bool = True,
        group: str | None = None,
        keep_all: bool = False,
        consumer_extra: dict[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self._consumer = kafka.consumer(
            # a private group: reading rankings must never move anyone else's offsets
            group or f"leap-rankings-client-{uuid.uuid4().hex[:12]}",
            {
                "enable.auto.commit": group is not None,
                "auto.offset.reset": "earliest" if from_beginning else "latest",
                "enable.partition.eof": False,
                **(consumer_extra or {}),
            },
        )
        self._consumer.subscribe([topic])
        self._latest: dict[RankingKey, dict[str, Any]] = {}
        self.received = 0  # rankings read, repeats included
        self.undecodable = 0
        self.all: list[dict[str, Any]] | None = [] if keep_all else None  # every one, in order

    def start_at_end(self, timeout: float = 10.0) -> None:
        """Read only what is produced from now on: every partition assigned at its high
        watermark, with no group join to wait for (the bench measures latency from here)."""
        from confluent_kafka import TopicPartition

        self._consumer.unsubscribe()
        meta = self._consumer.list_topics(self.topic, timeout=timeout).topics[self.topic]
        parts = []
        for p in meta.partitions:
            tp = TopicPartition(self.topic, p)
            _low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout)
            parts.append(TopicPartition(self.topic, p, high))
        self._consumer.assign(parts)

    def poll(self, timeout: float = 1.0, max_messages: int = 1000) -> list[dict[str, Any]]:
        """Rankings that arrived now (repeats included); the latest view is updated too."""
        return [r.ranking for r in self.poll_stamped(timeout, max_messages)]

    def poll_stamped(self, timeout: float = 1.0, max_messages: int = 1000) -> list[Arrival]:
        """Like `poll`, each ranking with when it arrived here and when it was produced.

        Waits up to ``timeout`` for the first message only, then takes what is already queued
        (``consume(n, timeout)`` would wait for n or the timeout, blurring every arrival)."""
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        msgs = [first]
        if max_messages > 1:
            msgs += self._consumer.consume(num_messages=max_messages - 1, timeout=0)
        now = time.time()
        out: list[Arrival] = []
        for msg in msgs:
            if msg.error() is not None:
                continue
            ranking = decode_ranking(msg.value())
            if ranking is None:
                self.undecodable += 1
                continue
            self.received += 1
            self._latest[(str(ranking["job_id"]), int(ranking.get("attempt", 1)))] = ranking
            out.append(Arrival(now, msg.timestamp()[1] / 1000.0, ranking))
            if self.all is not None:
                self.all.append(ranking)
        return out

    def drain(self, idle_s: float = 2.0, max_s: float = 120.0) -> int:
        """Read until nothing arrives for idle_s (or max_s passes); returns rankings read."""
        start = last = time.monotonic()
        n = 0
        while time.monotonic() - start < max_s:
            got = self.poll(timeout=0.5)
            now = time.monotonic()
            if got:
                n += len(got)
                last = now
            elif now - last >= idle_s:
                break
        return n

    def latest(self) -> dict[RankingKey, dict[str, Any]]:
        return dict(self._latest)

    def get(self, job_id: str, attempt: int = 1) -> dict[str, Any] | None:
        return self._latest.get((job_id, attempt))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            yield from self.poll(timeout=1.0)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> RankingsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def summary_line(r: dict[str, Any]) -> str:
    best = r.get("candidates") or []
    top = best[0]["hardware_type"] if best else "-"
    return (
        f"{r.get('produced_at', '')} {r.get('job_id')}#{r.get('attempt')} source={r.get('source')} "
        f"reason={r.get('reason')} best={top} candidates={len(best)} "
        f"model={r.get('model_version')} latency_ms={r.get('latency_ms')}"
    )


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    cache = sub.add_parser(
        "cache", help="keep the local rankings cache of Slurm's job_submit plugin fresh"
    )
    cache.add_argument("--dir", default=None, help="default LEAP_RANKINGS_CACHE_DIR")
    cache.add_argument(
        "--group",
        default=None,
        help="consumer group (default leap-rankings-cache-<host>: one per slurmctld host)",
    )
    cache.add_argument("--topic", default=None, help="default LEAP_TOPIC_RANKINGS")
    cache.add_argument(
        "--idle-exit", type=float, default=0.0, help="exit after this many idle seconds (0: never)"
    )
    tail = sub.add_parser("tail", help="print rankings as they arrive")
    tail.add_argument("--from-beginning", action="store_true", help="start at the oldest ranking")
    tail.add_argument("--json", action="store_true", help="one JSON ranking per line")
    tail.add_argument("--topic", default=None, help="default LEAP_TOPIC_RANKINGS")
    tail.add_argument("--bootstrap", default=None, help="default LEAP_KAFKA_BOOTSTRAP")
    tail.add_argument(
        "--idle-exit", type=float, default=0.0, help="exit after this many idle seconds (0: never)"
    )


PRUNE_EVERY_S = 300.0


def run_cache(args: argparse.Namespace, cfg: Settings) -> int:
    """Follow the rankings topic into the cache folder until interrupted (or idle)."""
    import socket

    from leap_stream.schedulers.slurm import RankingsCache

    folder = Path(args.dir) if args.dir else cfg.rankings_cache_dir
    cache = RankingsCache(folder, cfg.rankings_cache_max_age_s)
    group = args.group or f"leap-rankings-cache-{socket.gethostname()}"
    client = RankingsClient(
        KafkaClients.of(cfg, cfg.require_kafka()), args.topic or cfg.topic_rankings, group=group
    )
    print(f"rankings cache: {folder} (group {group})", flush=True)
    last = pruned = time.monotonic()
    try:
        while True:
            got = client.poll(timeout=0.5)
            for r in got:
                cache.write(r)
            now = time.monotonic()
            if got:
                last = now
            elif args.idle_exit and now - last >= args.idle_exit:
                return 0
            if now - pruned >= PRUNE_EVERY_S:
                cache.prune()
                pruned = now
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()
        print(f"rankings cache: {cache.written} written, {cache.skipped} skipped", flush=True)


def run(args: argparse.Namespace, cfg: Settings) -> int:
    if args.action == "cache":
        return run_cache(args, cfg)
    kafka = KafkaClients.of(cfg, args.bootstrap or cfg.require_kafka())
    client = RankingsClient(
        kafka, args.topic or cfg.topic_rankings, from_beginning=args.from_beginning
    )
    last = time.monotonic()
    try:
        while True:
            got = client.poll(timeout=0.5)
            for r in got:
                line = orjson.dumps(r).decode() if args.json else summary_line(r)
                sys.stdout.write(line + "\n")
            if got:
                sys.stdout.flush()
                last = time.monotonic()
            elif args.idle_exit and time.monotonic() - last >= args.idle_exit:
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()


__all__ = ["Arrival", "RankingsClient", "decode_ranking", "summary_line"]
