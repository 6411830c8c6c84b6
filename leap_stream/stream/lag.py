"""Consumer lag of the worker's group: high watermark minus committed offset, per partition,
and the age of the oldest record not yet processed (what on-call reads first).

The worker exports them as `leap_consumer_lag` and `leap_consumer_lag_seconds`; `leap-stream
lag` prints them. A partition the group never committed counts its whole retained range
(high - low) as lag: that is what the group would still have to read. Partitions added to a
topic (the documented way to scale out) appear within `METADATA_REFRESH_MS`; one whose offsets
cannot be read yet is left out of that reading, not the whole reading.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import orjson

from leap_stream.settings import Settings
from leap_stream.stream.kafka import KafkaClients

TopicPartitionKey = tuple[str, int]
T = TypeVar("T")
log = logging.getLogger(__name__)

# librdkafka learns of new partitions at its metadata refresh (5 minutes by default)
METADATA_REFRESH_MS = 10_000

# NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE: librdkafka does not
# flag them retriable for committed(), yet a fresh or restarted broker answers them for a moment
COORDINATOR_MOVING = frozenset({16, 14, 15})


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None  # None: the group has no committed offset here
    low: int
    high: int
    lag: int
    age_s: float = 0.0  # now - timestamp of the oldest unprocessed record (0: none waiting)


def compute_lag(
    committed: Mapping[TopicPartitionKey, int | None],
    watermarks: Mapping[TopicPartitionKey, tuple[int, int]],
) -> list[PartitionLag]:
    """Pure: lag rows sorted by (topic, partition), from offsets already fetched."""
    rows = []
    for tp in sorted(watermarks):
        low, high = watermarks[tp]
        c = committed.get(tp)
        if c is None or c < 0:
            lag, c = max(0, high - low), None
        else:
            lag = max(0, high - max(c, low))
        rows.append(PartitionLag(tp[0], tp[1], c, low, high, lag))
    return rows


def with_ages(
    rows: Iterable[PartitionLag], oldest_ms: Mapping[TopicPartitionKey, int], now_s: float
) -> list[PartitionLag]:
    """Pure: rows with ``age_s`` from the timestamp (ms) of each partition's oldest unread
    record; 0 where none is readable (no lag, or only transaction markers left)."""
    out = []
    for r in rows:
        ts = oldest_ms.get((r.topic, r.partition))
        age = 0.0 if ts is None or r.lag == 0 else max(0.0, now_s - ts / 1000.0)
        out.append(dataclasses.replace(r, age_s=age))
    return out


def total_lag(rows: Iterable[PartitionLag]) -> int:
    return sum(r.lag for r in rows)


def while_coordinator_moves(
    fn: Callable[[], T],
    timeout: float,
    *,
    every: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """``fn()``, retried while the group's coordinator is moving or loading, up to ``timeout``.

    CI read the lag of a group on a broker started seconds before: the coordinator had not
    loaded the offsets topic yet and ``committed()`` raised NOT_COORDINATOR."""
    from confluent_kafka import KafkaException

    deadline = clock() + timeout
    while True:
        try:
            return fn()
        except KafkaException as exc:
            if exc.args[0].code() not in COORDINATOR_MOVING or clock() + every > deadline:
                raise
        sleep(every)


class LagReader:
    """Committed offsets and watermarks through one confluent-kafka Consumer of the group.

    A Consumer, not the AdminClient: librdkafka's admin ListConsumerGroupOffsets crashes the
    process (SIGSEGV in rd_kafka_cgrp_op with no group handle) when the coordinator answers
    NOT_COORDINATOR, which is what a broker says right after a restart (librdkafka via
    confluent-kafka-python #1982, confluent-kafka-javascript #374); our broker-outage test hit
    it. A consumer carrying the group id has that handle. It never subscribes, so it never
    joins the group, and it never commits.
    """

    def __init__(
        self, kafka: KafkaClients, group: str | Mapping[str, str], topics: Iterable[str] = ()
    ) -> None:
        """``group``: one group for ``topics``, or ``{topic: group}`` (`worker_groups`)."""
        by_topic = dict(group) if isinstance(group, Mapping) else dict.fromkeys(topics, group)
        self.groups = by_topic
        self.topics = list(by_topic)
        self._consumers: dict[str, Any] = {}
        conf = {
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
            "auto.offset.reset": "earliest",
        }
        for g in dict.fromkeys(by_topic.values()):
            self._consumers[g] = kafka.consumer(g, conf)

    def _oldest_unread(
        self, consumer: Any, starts: list[Any], timeout: float
    ) -> dict[TopicPartitionKey, int]:
        """Timestamp (ms) of the first record at each start offset: the oldest not processed.

        The consumer is assigned, never subscribed: it reads without joining the group and
        never commits (read_committed, so an aborted tail is not a record waiting)."""
        if not starts:
            return {}
        consumer.assign(starts)
        want = {(tp.topic, tp.partition) for tp in starts}
        found: dict[TopicPartitionKey, int] = {}
        deadline = time.monotonic() + timeout
        try:
            while want - set(found) and time.monotonic() < deadline:
                for m in consumer.consume(len(want), timeout=0.2):
                    key = (m.topic(), m.partition())
                    if m.error() is None and key in want and key not in found:
                        found[key] = int(m.timestamp()[1])
        finally:
            consumer.unassign()
        return found

    def read(
        self, timeout: float = 10.0, ages: bool = False, now: float | None = None
    ) -> list[PartitionLag]:
        """Lag of every partition of the topics; with ``ages``, also how old the oldest
        unprocessed record of each lagging partition is (one short read per such partition),
        at ``now`` (epoch s; the worker's `BrokerClock`, so a host off by hours does not add
        them to the age; default the host's clock)."""
        from confluent_kafka import KafkaException, TopicPartition

        if not self._consumers:
            return []
        any_consumer = next(iter(self._consumers.values()))
        meta = any_consumer.list_topics(timeout=timeout)
        committed: dict[TopicPartitionKey, int | None] = {}
        watermarks: dict[TopicPartitionKey, tuple[int, int]] = {}
        for g, consumer in self._consumers.items():
            tps = [
                TopicPartition(t, p)
                for t in self.topics
                if self.groups[t] == g and t in meta.topics and meta.topics[t].error is None
                for p in sorted(meta.topics[t].partitions)
            ]
            if not tps:
                continue
            ask = functools.partial(consumer.committed, tps, timeout=timeout)
            got = while_coordinator_moves(ask, timeout)
            for tp in got:
                committed[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
            for tp in tps:
                try:
                    low, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
                except KafkaException as exc:  # a partition this client does not know yet
                    log.debug("no watermarks for %s[%d] yet: %s", tp.topic, tp.partition, exc)
                    continue
                watermarks[(tp.topic, tp.partition)] = (int(low), int(high))
        rows = compute_lag(committed, watermarks)
        if not ages:
            return rows
        oldest: dict[TopicPartitionKey, int] = {}
        for g, consumer in self._consumers.items():
            starts = [
                TopicPartition(r.topic, r.partition, r.low if r.committed is None else r.committed)
                for r in rows
                if r.lag > 0 and self.groups[r.topic] == g
            ]
            oldest.update(self._oldest_unread(consumer, starts, min(timeout, 2.0)))
        return with_ages(rows, oldest, time.time() if now is None else now)

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()


def worker_groups(group: str, submissions: str, completions: str) -> dict[str, str]:
    """The group that commits each input topic of a worker whose LEAP_CONSUMER_GROUP is
    ``group`` (the submissions loop has its own: stream/submission_loop.py)."""
    from leap_stream.stream.submission_loop import submissions_group

    return {submissions: submissions_group(group), completions: group}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--group",
        default=None,
        help="consumer group (default: the worker's, LEAP_CONSUMER_GROUP for the completions and "
        "LEAP_CONSUMER_GROUP.submissions for the submissions)",
    )
    parser.add_argument(
        "--topic",
        action="append",
        default=None,
        help="topic to report (repeatable; default: the worker's two input topics)",
    )
    parser.add_argument("--bootstrap", default=None, help="default LEAP_KAFKA_BOOTSTRAP")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    kafka = KafkaClients.of(cfg, args.bootstrap or cfg.require_kafka())
    groups: dict[str, str]
    if args.group:
        topics = args.topic or [cfg.topic_submissions, cfg.topic_completions]
        groups = dict.fromkeys(topics, args.group)
    else:
        groups = worker_groups(cfg.consumer_group, cfg.topic_submissions, cfg.topic_completions)
        if args.topic:
            groups = {t: groups.get(t, cfg.consumer_group) for t in args.topic}
    rows = LagReader(kafka, groups).read(ages=True)
    total = total_lag(rows)
    if args.json:
        doc = {
            "group": args.group or cfg.consumer_group,
            "groups": groups,
            "total": total,
            "partitions": [dict(asdict(r), group=groups[r.topic]) for r in rows],
        }
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return 0
    for group in dict.fromkeys(groups.values()):
        print(f"group {group}: {', '.join(t for t, g in groups.items() if g == group)}")
    print(f"{'topic':<32} {'part':>4} {'committed':>10} {'high':>10} {'lag':>8} {'age_s':>8}")
    for r in rows:
        committed = "-" if r.committed is None else str(r.committed)
        print(
            f"{r.topic:<32} {r.partition:>4} {committed:>10} {r.high:>10} {r.lag:>8} "
            f"{r.age_s:>8.1f}"
        )
    print(f"total lag {total}")
    return 0


__all__ = [
    "METADATA_REFRESH_MS",
    "LagReader",
    "PartitionLag",
    "compute_lag",
    "total_lag",
    "with_ages",
    "worker_groups",
]
