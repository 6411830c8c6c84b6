"""The librdkafka submissions loop against the real broker and Redis: offsets are committed
only for what is durable (published and remembered), in order; a stop commits what is done and
nothing else; a fresh group starts where Faust's group stopped; a rebalance loses nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache, partial
from typing import Any

import orjson
import pytest

from leap_stream.catalog import load_catalog
from leap_stream.core.history import LineageHistory, TypeAggregates
from leap_stream.core.lookup import LookupTable
from leap_stream.core.ranker import Ranker
from leap_stream.store.connection import connect
from leap_stream.store.online import OnlineStore, OnlineStoreUnavailable
from leap_stream.stream.batch import Record, SubmissionBatchResult, SubmissionProcessor
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.lag import LagReader, total_lag
from leap_stream.stream.submission_loop import SubmissionLoop, submissions_group
from leap_stream.tools.harness import wait_for as _wait_for
from leap_stream.tools.sim.config import SimConfig, SimResult
from leap_stream.tools.sim.events import submission_events
from leap_stream.tools.sim.fleet import simulate

pytestmark = pytest.mark.services

MAX = 1 << 20
wait_for = partial(_wait_for, every=0.1)  # the project's polling helper (TimeoutError on expiry)


@cache
def _sim() -> SimResult:
    return simulate(SimConfig(seed=5, days=1, rate=600))


@cache
def _ranker() -> Ranker:
    return Ranker(load_catalog(), model=None, lookup=LookupTable.fit(_sim().dataset))


def _subs(n: int) -> list[dict[str, Any]]:
    subs = submission_events(_sim().submissions)
    assert len(subs) >= n
    return subs[:n]


def _produce(bootstrap: str, topic: str, subs: list[dict[str, Any]], partitions: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    for i, s in enumerate(subs):
        p.produce(topic, key=s["job_id"].encode(), value=orjson.dumps(s), partition=i % partitions)
    assert p.flush(30) == 0


class SwitchableStore:
    """The real OnlineStore, with an outage switch (a deterministic "Redis down")."""

    def __init__(self, store: OnlineStore) -> None:
        self.store = store
        self.down = False

    def read_and_remember(
        self, submissions: Sequence[Any], predictions: Sequence[Any] = ()
    ) -> tuple[list[LineageHistory], dict[str, TypeAggregates]]:
        if self.down:
            raise OnlineStoreUnavailable("switched off by the test")
        return self.store.read_and_remember(submissions, predictions)

    def remember_submissions(self, submissions: Sequence[Any]) -> None:
        if self.down:
            raise OnlineStoreUnavailable("switched off by the test")
        self.store.remember_submissions(submissions)

    def remember_predictions(self, predictions: Sequence[Any]) -> None:
        if self.down:
            raise OnlineStoreUnavailable("switched off by the test")
        self.store.remember_predictions(predictions)


class Published:
    """`send` of the loop: what it published (thread-safe), optionally failing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rankings: list[dict[str, Any]] = []
        self.calls = 0
        self.fail = False

    def __call__(self, rankings: list[dict[str, Any]], dead: list[dict[str, Any]]) -> int:
        with self.lock:
            self.calls += 1
            if self.fail:
                raise RuntimeError("broker refused (test)")
            self.rankings.extend(rankings)
        return len(rankings) + len(dead)

    def jobs(self) -> set[tuple[str, int]]:
        """(job, attempt) ranked at least once."""
        with self.lock:
            return {(str(r["job_id"]), int(r["attempt"])) for r in self.rankings}


@contextmanager
def running(loop: SubmissionLoop) -> Iterator[SubmissionLoop]:
    loop.start()
    try:
        yield loop
    finally:
        loop.stop(60)
        assert not loop.running


def _loop(
    bootstrap: str,
    group: str,
    topic: str,
    store: Any,
    send: Published,
    seen: list[Record] | None = None,
    **kw: Any,
) -> SubmissionLoop:
    known = set(load_catalog().types)
    processor = SubmissionProcessor(store, _ranker, max_bytes=MAX, known_hardware=known)

    def on_batch(records: list[Record], _res: SubmissionBatchResult, _s: float) -> None:
        if seen is not None:
            seen.extend(records)

    extra = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    return SubmissionLoop(
        kafka=KafkaClients(bootstrap),
        group=group,
        topic=topic,
        processor=processor,
        send=send,
        on_batch=on_batch,
        batch_size=50,
        extra=extra,
        **kw,
    )


def test_ranks_publishes_and_commits_everything(
    kafka_bootstrap: str, topic_factory: Any, redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    topic = topic_factory("loop", partitions=2)
    subs = _subs(300)
    _produce(kafka_bootstrap, topic, subs, 2)
    group = f"loop-{time.time_ns()}"
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sent = Published()
    lag = LagReader(KafkaClients(kafka_bootstrap), submissions_group(group), [topic])
    assert total_lag(lag.read()) == len(subs)
    with running(_loop(kafka_bootstrap, group, topic, store, sent)) as loop:
        wait_for("every submission ranked", lambda: len(sent.jobs()) == len(subs), 60)
        wait_for("the commit timer", lambda: total_lag(lag.read()) == 0, 30)
        assert loop.batches >= 2
    assert sent.jobs() == {(s["job_id"], s["attempt"]) for s in subs}
    # remembered for the completion join
    got = store.fetch_submissions([(s["job_id"], s["attempt"]) for s in subs])
    assert all(g is not None for g in got)
    lag.close()


def test_offsets_wait_for_redis_then_commit(
    kafka_bootstrap: str, topic_factory: Any, redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    topic = topic_factory("loop-redis", partitions=2)
    subs = _subs(120)
    _produce(kafka_bootstrap, topic, subs, 2)
    group = f"loop-redis-{time.time_ns()}"
    store = SwitchableStore(OnlineStore(connect(redis_url), prefix=redis_prefix))
    store.down = True
    sent = Published()
    lag = LagReader(KafkaClients(kafka_bootstrap), submissions_group(group), [topic])
    with running(_loop(kafka_bootstrap, group, topic, store, sent)):
        wait_for("ranked without Redis", lambda: len(sent.jobs()) == len(subs), 60)
        assert not any(r["history_used"] for r in sent.rankings)
        time.sleep(2.0)  # two commit intervals: nothing may be committed yet
        assert total_lag(lag.read()) == len(subs)
        store.down = False  # the idle loop writes what Redis missed, then the offsets go
        wait_for("committed once remembered", lambda: total_lag(lag.read()) == 0, 60)
    got = store.store.fetch_submissions([(s["job_id"], s["attempt"]) for s in subs])
    assert all(g is not None for g in got)
    lag.close()


def test_stop_while_publishing_fails_commits_nothing_of_that_batch(
    kafka_bootstrap: str, topic_factory: Any, redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    topic = topic_factory("loop-stop", partitions=1)
    subs = _subs(150)
    group = f"loop-stop-{time.time_ns()}"
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sent = Published()
    lag = LagReader(KafkaClients(kafka_bootstrap), submissions_group(group), [topic])
    loop = _loop(kafka_bootstrap, group, topic, store, sent)
    loop.start()
    try:
        _produce(kafka_bootstrap, topic, subs[:50], 1)
        wait_for("the first 50 ranked", lambda: len(sent.jobs()) == 50, 60)
        wait_for("the first 50 committed", lambda: total_lag(lag.read()) == 0, 30)
        sent.fail = True
        _produce(kafka_bootstrap, topic, subs[50:], 1)
        wait_for("publishing retried", lambda: sent.calls >= 3, 30)
    finally:
        loop.stop(60)
    assert loop.unfinished and loop.error is None
    assert not loop.running
    rows = lag.read()
    assert [r.committed for r in rows] == [50]  # the failing batch stays to be redone
    assert total_lag(rows) == 100
    lag.close()


def test_a_second_loop_takes_partitions_and_nothing_is_lost(
    kafka_bootstrap: str, topic_factory: Any, redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    topic = topic_factory("loop-rebalance", partitions=4)
    subs = _subs(400)
    group = f"loop-rebalance-{time.time_ns()}"
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sent = Published()
    seen_a: list[Record] = []
    seen_b: list[Record] = []
    lag = LagReader(KafkaClients(kafka_bootstrap), submissions_group(group), [topic])
    a = _loop(kafka_bootstrap, group, topic, store, sent, seen_a)
    b = _loop(kafka_bootstrap, group, topic, store, sent, seen_b)
    with running(a):
        _produce(kafka_bootstrap, topic, subs[:200], 4)
        wait_for("loop a ranked the first half", lambda: len(sent.jobs()) == 200, 60)
        with running(b):
            wait_for("the partitions shared", lambda: len(a.assigned) == len(b.assigned) == 2, 60)
            _produce(kafka_bootstrap, topic, subs[200:], 4)
            wait_for("the group ranked everything", lambda: len(sent.jobs()) == 400, 90)
            wait_for("everything committed", lambda: total_lag(lag.read()) == 0, 60)
            assert seen_b, "the second loop never got a partition"
    offsets = {(r.partition, r.offset) for r in seen_a + seen_b}
    assert len(offsets) == len(subs)
    lag.close()


def test_a_bug_after_a_batch_stops_the_loop_and_is_reported(
    kafka_bootstrap: str, topic_factory: Any, redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    """The app crashes the worker on `loop.error` (stream/app.py); the loop must stop, not spin."""
    topic = topic_factory("loop-bug", partitions=1)
    _produce(kafka_bootstrap, topic, _subs(20), 1)
    group = f"loop-bug-{time.time_ns()}"
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    loop = _loop(kafka_bootstrap, group, topic, store, Published())

    def broken(_records: list[Record], _res: SubmissionBatchResult, _s: float) -> None:
        raise RuntimeError("bug in the metrics (test)")

    loop.on_batch = broken
    loop.start()
    wait_for("the loop to stop", lambda: not loop.running, 60)
    assert isinstance(loop.error, RuntimeError) and "metrics" in str(loop.error)
    assert not loop.unfinished
    assert loop.batches == 1  # stopped at the first failing batch


def test_stop_and_rebalance_commit_without_the_timer(
    kafka_bootstrap: str, topic_factory: Any, redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    """With the commit timer out of the way, the offsets still move on a revoke (librdkafka
    commits the offsets the loop stored in its revoke callback) and on stop: the second loop
    redoes nothing the first one finished, and nothing is left uncommitted."""
    topic = topic_factory("loop-commit", partitions=4)
    subs = _subs(400)
    group = f"loop-commit-{time.time_ns()}"
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sent = Published()
    seen_a: list[Record] = []
    seen_b: list[Record] = []
    lag = LagReader(KafkaClients(kafka_bootstrap), submissions_group(group), [topic])
    no_timer = {"auto.commit.interval.ms": 3_600_000}
    a = _loop(kafka_bootstrap, group, topic, store, sent, seen_a)
    b = _loop(kafka_bootstrap, group, topic, store, sent, seen_b)
    a.conf.update(no_timer)
    b.conf.update(no_timer)
    with running(a):
        _produce(kafka_bootstrap, topic, subs[:200], 4)
        wait_for("loop a ranked the first half", lambda: len(sent.jobs()) == 200, 60)
        assert total_lag(lag.read()) == 200  # the timer is off: nothing committed yet
        with running(b):
            wait_for("the partitions shared", lambda: len(a.assigned) == len(b.assigned) == 2, 60)
            assert total_lag(lag.read()) == 0  # committed on the revoke
            _produce(kafka_bootstrap, topic, subs[200:], 4)
            wait_for("the group ranked everything", lambda: len(sent.jobs()) == 400, 90)
        # b stopped: its partitions committed on its stop, a's on the revoke that followed
        wait_for("everything committed", lambda: total_lag(lag.read()) == 0, 30)
    assert seen_b, "the second loop never got a partition"
    records = [(r.partition, r.offset) for r in seen_a + seen_b]
    assert len(records) == len(set(records)) == len(subs)  # no record ranked twice
    lag.close()
