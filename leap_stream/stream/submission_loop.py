"""The submissions hot path: a librdkafka consumer read by one thread that ranks and publishes.

Why not a Faust agent: Faust's consumer (aiokafka) parses every fetched record in Python and
hands it to the event loop message by message, competing for the interpreter lock with the
ranking; at 1,000 submissions/s events waited a median 12 ms to reach the agent
(docs/benchmarks.md). librdkafka fetches and parses in C threads; this loop takes whatever it
has queued in one call, ranks it, publishes, and goes back: one Python thread on the hot path.

Durability: offsets are stored (``enable.auto.offset.store``
is off) only after the batch's rankings and dead letters are acknowledged by the broker and
the submissions are remembered in Redis, in offset order per partition (`OrderedAcks`);
librdkafka commits stored offsets every ``LEAP_COMMIT_INTERVAL_S``, on a rebalance and on
close. A crash redoes work and never loses it.

A consumer whose group has not settled for ``LEAP_CONSUMER_STALL_S`` (librdkafka's statistics,
`GroupHealth`) is replaced by a new one: after a broker restart a consumer can stay outside its
group for good without reporting an error. What the old one had not committed is redone.

The loop uses its own consumer group, ``<LEAP_CONSUMER_GROUP>.submissions``: Faust's group
(completions) uses Faust's own partition assignor, which librdkafka cannot join.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from leap_stream.contracts import DeadLetter, HardwareRanking
from leap_stream.stream.acks import HeldAcks, OrderedAcks
from leap_stream.stream.batch import Record, SubmissionBatchResult, SubmissionProcessor
from leap_stream.stream.clock import BrokerClock
from leap_stream.stream.group_health import GroupHealth, group_state, stats_interval_ms
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.retry import Retry, Unfinished

log = logging.getLogger(__name__)
T = TypeVar("T")

GROUP_SUFFIX = ".submissions"
CLOSE_WAIT_S = 10.0  # at stop, how long a replaced consumer's close may still take


def _record(m: Any) -> Record:
    """A librdkafka message as the processors need it, with its Kafka timestamp."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE

    kind, ms = m.timestamp()
    ts = None if kind == TIMESTAMP_NOT_AVAILABLE else ms / 1000.0
    append = kind == TIMESTAMP_LOG_APPEND_TIME
    return Record(m.topic(), m.partition(), m.offset(), m.key(), m.value(), ts, append)


def submissions_group(group: str) -> str:
    """The consumer group of the submissions loop, next to Faust's group for completions."""
    return group + GROUP_SUFFIX


class SubmissionLoop:
    """Consume → `SubmissionProcessor.process` → publish (flush) → store offsets, in one thread.

    ``send(rankings, dead_letters)`` publishes and blocks until the broker acknowledged them
    (the agent's `OutputProducer` flush); ``on_batch(records, result, seconds)`` updates the
    metrics once the batch is durable; ``on_replace(reason)`` counts a replaced consumer. All
    run in the loop's thread.
    """

    def __init__(
        self,
        *,
        kafka: KafkaClients,
        group: str,
        topic: str,
        processor: SubmissionProcessor,
        send: Callable[[list[HardwareRanking], list[DeadLetter]], int],
        on_batch: Callable[[list[Record], SubmissionBatchResult, float], object],
        on_store_error: Callable[[str], object] = lambda _op: None,
        on_replace: Callable[[str], object] = lambda _why: None,
        batch_size: int = 500,
        max_held: int = 100_000,
        retry_cap_s: float = 10.0,
        stall_s: float = 120.0,
        session_timeout_s: float = 10.0,
        commit_interval_s: float = 1.0,
        fetch_max_wait_ms: int = 5,
        extra: dict[str, Any] | None = None,
        clock: BrokerClock | None = None,
    ) -> None:
        self.topic = topic
        self.clock = clock or BrokerClock()
        self.group = submissions_group(group)
        self.processor = processor
        self.send = send
        self.on_batch = on_batch
        self.on_replace = on_replace
        self.batch_size = batch_size
        self.retry = Retry(self._stop_requested, self._wait_stop, on_store_error, retry_cap_s)
        self._stop = threading.Event()
        self.kafka = kafka
        session_s = session_timeout_s
        self.conf: dict[str, Any] = dict(
            {
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "enable.auto.offset.store": False,  # stored only once durable (see module doc)
                "auto.commit.interval.ms": int(commit_interval_s * 1000),
                "session.timeout.ms": int(session_s * 1000),
                "heartbeat.interval.ms": int(min(3.0, session_s / 3) * 1000),
                "fetch.wait.max.ms": fetch_max_wait_ms,
                "enable.partition.eof": False,
            }
        )
        self.health = GroupHealth(stall_s)
        if self.health.watching:
            self.conf["statistics.interval.ms"] = stats_interval_ms(stall_s)
        self.conf.update(extra or {})
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._stored: list[Any] = []  # TopicPartitions whose offsets the gate released
        self._closers: list[threading.Thread] = []  # replaced consumers being closed
        self._generation = 0  # consumers created so far
        self._acks = HeldAcks(
            OrderedAcks(lambda r: (r.topic, r.partition), lambda r: r.offset, self._release),
            max_held,
        )
        self.error: BaseException | None = None
        self.unfinished = False
        self.batches = 0
        self.assigned: frozenset[tuple[str, int]] = frozenset()  # partitions the loop owns

    # --- lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="leap-submissions", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish the batch in hand, commit what is durable, leave the group."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _main(self) -> None:
        try:
            self.run()
        except Unfinished:
            pass
        except BaseException as exc:  # reported to the app, which stops the worker
            log.exception("submissions loop failed: stopping the worker")
            self.error = exc

    def run(self) -> None:
        self._consumer = self._new_consumer()
        try:
            while not self._stop.is_set():
                first = self._consumer.poll(0.1)
                if self.health.stalled(time.monotonic()):
                    self._replace_consumer()
                    continue  # `first` is the old consumer's: the new one redelivers it
                if first is None:
                    self._idle()
                    continue
                msgs = [first]
                if self.batch_size > 1:  # what librdkafka has queued already, no waiting
                    msgs += self._consumer.consume(self.batch_size - 1, timeout=0)
                records = []
                for m in msgs:
                    if m.error() is not None:
                        log.warning("submissions consumer: %s", m.error())
                        continue
                    records.append(_record(m))
                if records:
                    self._batch(records)
            self._forget_unacked("stop")
            if self.assigned:  # a lost or never-made assignment has nothing to commit
                self._commit()
        finally:
            if not self.unfinished:
                self._consumer.close()
            deadline = time.monotonic() + CLOSE_WAIT_S
            for closer in self._closers:  # a close stuck on a dead coordinator is abandoned
                closer.join(max(0.0, deadline - time.monotonic()))

    def _new_consumer(self) -> Any:
        conf = dict(self.conf)
        self._generation += 1
        if self.health.watching:
            gen = self._generation  # a replaced consumer's last statistics are not this one's
            conf["stats_cb"] = lambda stats_json: self._on_stats(gen, stats_json)
        consumer = self.kafka.consumer(self.group, conf)
        consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self.health.restart(time.monotonic())
        return consumer

    def _replace_consumer(self) -> None:
        """Give up on a consumer stuck outside its group (module doc); its close runs aside."""
        old = self._consumer
        why = (
            f"group {self.group} not settled for {self.health.unsettled_for(time.monotonic()):.0f}s"
            f" (last state {self.health.last})"
        )
        log.error("submissions consumer stuck: %s; replacing it", why)
        self._forget_unacked("consumer replaced")
        self._stored.clear()
        self.assigned = frozenset()
        self._consumer = self._new_consumer()  # the old one's callbacks are ignored from now
        self.on_replace(why)
        # close() leaves the group through the coordinator the old consumer could not reach: it
        # may block until that comes back, so it must not hold up the loop
        closer = threading.Thread(
            target=_close_quietly, args=(old,), name="leap-old-consumer", daemon=True
        )
        closer.start()
        self._closers = [t for t in self._closers if t.is_alive()] + [closer]

    def _on_stats(self, generation: int, stats_json: str) -> None:
        if generation != self._generation:
            return
        state = group_state(stats_json)
        if state is not None:
            self.health.observe(state, time.monotonic())

    # --- one batch
    def _batch(self, records: list[Record]) -> None:
        t0 = time.perf_counter()
        self._acks.gate.track(records)
        now = self.clock.read(records, self._caught_up(records))
        res = self._until_done("rank", self.processor.process, records, now)
        if res.rankings or res.dead_letters:
            self._until_done("produce", self.send, res.rankings, res.dead_letters)
        self._acks.batch_done(records, res.remembered, res.flushed_pending)
        self._store()
        self.batches += 1
        self.on_batch(records, res, time.perf_counter() - t0)

    def _caught_up(self, records: list[Record]) -> bool:
        """Whether the batch reached its partitions' ends within a batch (the consumer's cached
        high watermarks, no broker call): its records did not wait in the topic."""
        from confluent_kafka import KafkaException, TopicPartition

        last: dict[tuple[str, int], int] = {}
        for r in records:
            key = (r.topic, r.partition)
            last[key] = max(last.get(key, -1), r.offset)
        for (topic, partition), offset in last.items():
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), cached=True
                )
            except KafkaException:
                return False
            if high < 0 or high - (offset + 1) > self.batch_size:
                return False
        return True

    def _idle(self) -> None:
        """Redis back but no submission came to write what it missed (see flush_pending); and
        the last batch's predictions, which no next batch carried."""
        if self._acks.held and self.processor.flush_pending():
            self._acks.release()
            self._store()
        self.processor.flush_predictions()

    def _until_done(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """`Retry.run`; giving up at a stop marks the loop unfinished (nothing more committed)."""
        try:
            return self.retry.run(what, fn, *args)
        except Unfinished:
            self.unfinished = True
            raise

    def _stop_requested(self) -> bool:
        return self._stop.is_set()

    def _wait_stop(self, seconds: float) -> bool:
        return self._stop.wait(seconds)

    # --- offsets
    def _release(self, rec: Record) -> None:
        from confluent_kafka import TopicPartition

        self._stored.append(TopicPartition(rec.topic, rec.partition, rec.offset + 1))

    def _store(self) -> None:
        if not self._stored:
            return
        last: dict[tuple[str, int], Any] = {}
        for tp in self._stored:
            last[(tp.topic, tp.partition)] = tp
        self._stored.clear()
        try:
            self._consumer.store_offsets(offsets=list(last.values()))
        except Exception as exc:  # a partition revoked meanwhile: its new owner redoes it
            log.warning("storing offsets failed (%r): that work is redone", exc)

    def _commit(self) -> None:
        """Commit what is stored, now (a stop or a revoke must not wait for the timer)."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                log.warning("committing offsets failed (%r): that work is redone", exc)

    def _forget_unacked(self, why: str) -> None:
        left = self._acks.forget()
        if left:
            log.warning(
                "%d submission events left uncommitted (%s); redelivered later", len(left), why
            )

    # --- rebalance callbacks (they run inside poll/consume, between batches)
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        if consumer is not self._consumer:
            return
        self.assigned = frozenset((tp.topic, tp.partition) for tp in partitions)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Store what is durable; librdkafka commits it before the partitions move on.

        No synchronous commit here: it would block inside poll() on a coordinator that may be
        the very thing failing (auto commit commits stored offsets on every revoke anyway)."""
        if consumer is not self._consumer:
            return
        self.assigned = frozenset()
        self._forget_unacked("rebalance")
        self._store()

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        if consumer is not self._consumer:
            return
        self.assigned = frozenset()
        self._forget_unacked("partitions lost")
        self._stored.clear()


def _close_quietly(consumer: Any) -> None:
    try:
        consumer.close()
    except Exception as exc:
        log.warning("closing the replaced submissions consumer failed (%r)", exc)


__all__ = [
    "GROUP_SUFFIX",
    "SubmissionLoop",
    "Unfinished",
    "submissions_group",
]
