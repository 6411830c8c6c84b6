"""Watching a running worker from outside, as a scheduler or an operator would: every record of
a topic, the dead letters by source or by kind, the rankings as they arrive, the consumer
groups' state and lag. The demo and the fault tests read the worker through these."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import orjson

from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients


def read_all(
    bootstrap: str,
    topic: str,
    idle_s: float = 1.5,
    max_s: float = 60.0,
    committed_only: bool = False,
) -> list[Any]:
    """Every message of a topic from the beginning, until ``idle_s`` pass without a new one (at
    most ``max_s``). ``committed_only``: skip records of aborted transactions."""
    isolation = "read_committed" if committed_only else "read_uncommitted"
    consumer = KafkaClients(bootstrap).consumer(
        f"leap-reader-{uuid.uuid4().hex[:8]}",
        {
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.message.max.bytes": 20 * 1024 * 1024,
            "isolation.level": isolation,
        },
    )
    consumer.subscribe([topic])
    out: list[Any] = []
    end = time.monotonic() + max_s
    last = time.monotonic()
    while time.monotonic() < end and time.monotonic() - last < idle_s:
        for m in consumer.consume(1000, timeout=0.3):
            if m.error() is None:
                out.append(m)
                last = time.monotonic()
    consumer.close()
    return out


def dead_letters(bootstrap: str, topic: str) -> dict[tuple[str, int, int], dict[str, Any]]:
    """Dead letters by their source (topic, partition, offset); repeats collapse."""
    out = {}
    for m in read_all(bootstrap, topic):
        d = orjson.loads(m.value())
        s = d["source"]
        out[(s["topic"], s["partition"], s["offset"])] = d
    return out


def count_dead_letters(bootstrap: str, topic: str, idle_s: float = 3.0) -> dict[str, Any]:
    """How many dead letters the topic holds, by kind (``undecodable`` for a value that is not
    one)."""
    kinds: dict[str, int] = {}
    messages = read_all(bootstrap, topic, idle_s=idle_s, committed_only=True)
    for msg in messages:
        try:
            kind = str(orjson.loads(msg.value() or b"")["error"]["kind"])
        except Exception:
            kind = "undecodable"
        kinds[kind] = kinds.get(kind, 0) + 1
    return {"count": len(messages), "by_kind": kinds}


class RankingCollector:
    """Reads the rankings topic in a thread (`RankingsClient.poll_stamped`) and keeps the first
    arrival of each submission's ranking: the demo's latency is measured from these stamps."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.client = RankingsClient(
            KafkaClients(bootstrap), topic, consumer_extra={"fetch.wait.max.ms": 10}
        )
        self.rankings: list[dict[str, Any]] = []
        self.arrived: dict[str, float] = {}  # submission_event_id -> first arrival (epoch s)
        self.produced: dict[str, float] = {}  # ... -> the ranking's Kafka timestamp (epoch s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="rankings", daemon=True)

    @property
    def undecodable(self) -> int:
        return self.client.undecodable

    def start(self) -> RankingCollector:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            for arrival in self.client.poll_stamped(0.1):
                eid = arrival.ranking.get("submission_event_id")
                with self._lock:
                    self.rankings.append(arrival.ranking)
                    if eid is not None and eid not in self.arrived:
                        self.arrived[str(eid)] = arrival.arrived
                        self.produced[str(eid)] = arrival.produced

    def count(self) -> int:
        with self._lock:
            return len(self.arrived)

    def arrived_many(self, event_ids: list[str]) -> list[bool]:
        with self._lock:
            return [e in self.arrived for e in event_ids]

    def has(self, event_ids: set[str]) -> bool:
        with self._lock:
            return event_ids.issubset(self.arrived.keys())

    def snapshot(self) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, float]]:
        with self._lock:
            return list(self.rankings), dict(self.arrived), dict(self.produced)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


class GroupWatch:
    """One AdminClient for the run's group state and lag (clients are not cheap to make)."""

    def __init__(self, bootstrap: str, group: str, topics: list[str]) -> None:
        from leap_stream.stream.lag import LagReader, worker_groups

        submissions, completions = topics
        self.groups = worker_groups(group, submissions, completions)
        self._admin = KafkaClients(bootstrap).admin()
        self._lag = LagReader(KafkaClients(bootstrap), self.groups)

    def stable(self) -> bool:
        """The worker's groups have members and finished their rebalance (listing: describe
        can stall)."""
        from confluent_kafka import ConsumerGroupState

        try:
            listing = self._admin.list_consumer_groups(request_timeout=5).result(timeout=10)
        except Exception:
            return False
        stable = {g.group_id for g in listing.valid if g.state == ConsumerGroupState.STABLE}
        return set(self.groups.values()) <= stable

    def lag(self) -> int:
        from leap_stream.stream.lag import total_lag

        return int(total_lag(self._lag.read()))
