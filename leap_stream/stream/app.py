"""The worker's Faust app: the completions agent, the submissions loop as a task, two timers.

Faust owns the completions' consumption, group membership and offset commits; the agent owns
durability. It reads with ``stream.noack()`` so that nothing is acked implicitly: an event is
acked only after every output it caused is durable (dead letters acknowledged by the broker,
dataset rows fsynced, history applied in Redis). Faust commits only acked offsets, handed to it
in offset order (`OrderedAcks`), so a crash anywhere repeats work and never loses it
(docs/worker.md). The submissions are read by `SubmissionLoop` on librdkafka, which keeps the
same contract for its own consumer group.

The blocking work of a completions batch (Redis round trip, Parquet write, producer flush) runs
in a single-thread executor: the event loop keeps fetching meanwhile, and batches stay in order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import faust
import orjson

from leap_stream.contracts import DeadLetter, HardwareRanking
from leap_stream.settings import Settings
from leap_stream.stream.acks import ExplicitAcks, OrderedAcks, seek_every_partition
from leap_stream.stream.batch import (
    COMPLETION_SCHEMA,
    Backoff,
    CompletionBatchResult,
    CompletionProcessor,
    Record,
    SubmissionBatchResult,
    SubmissionProcessor,
    dead_letter,
)
from leap_stream.stream.clock import BrokerClock
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.metrics import LATENCY_CEILING_S, Metrics
from leap_stream.stream.output import OutputProducer
from leap_stream.stream.retry import Retry, Unfinished
from leap_stream.stream.submission_loop import SubmissionLoop
from leap_stream.stream.waiting import WaitingCompletions

log = logging.getLogger(__name__)
T = TypeVar("T")

# Exit status when the worker had to stop with work it could not make durable (e.g. SIGTERM
# while Redis is down): the offsets of that work are not committed and it is redone on restart.
EXIT_UNFINISHED = 3
# Most submission events held unacked while Redis is down (then the oldest are acked anyway,
# matching SubmissionProcessor.MAX_PENDING_REMEMBER).
MAX_HELD = 100_000


def faust_broker_url(bootstrap: str) -> str:
    """'a:9092,b:9092' → 'kafka://a:9092;b:9092' (Faust's multi-host URL form)."""
    hosts = [h.strip() for h in bootstrap.split(",") if h.strip()]
    return ";".join(f"kafka://{h}" if "://" not in h else h for h in hosts)


def faust_credentials(cfg: Settings) -> Any:
    """SASL/SSL credentials for Faust's aiokafka clients, from the same settings librdkafka uses."""
    protocol = cfg.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=cfg.kafka_ssl_cafile or None)
        if cfg.kafka_ssl_certfile:
            context.load_cert_chain(cfg.kafka_ssl_certfile, cfg.kafka_ssl_keyfile or None)
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    return faust.SASLCredentials(
        username=cfg.kafka_sasl_username,
        password=cfg.kafka_sasl_password,
        mechanism=cfg.kafka_sasl_mechanism or "PLAIN",
        ssl_context=context,
    )


AIOKAFKA_LOG_APPEND_TIME = 1  # aiokafka's timestamp_type (0: the producer's create time)


def record_of(event: Any) -> Record:
    m = event.message
    append = m.timestamp_type == AIOKAFKA_LOG_APPEND_TIME
    return Record(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp, append)


def dead_letter_key(dl: DeadLetter) -> bytes:
    s = dl["source"]
    return f"{s['topic']}/{s['partition']}/{s['offset']}".encode()


@dataclass
class WorkerDeps:
    """Everything the agents use, built by the worker command (or a test) before the app starts."""

    cfg: Settings
    kafka: KafkaClients
    submissions: SubmissionProcessor
    completions: CompletionProcessor
    dataset_append: Callable[[list[dict[str, Any]]], object]
    make_output: Callable[[], OutputProducer]  # one producer per agent (see send_all)
    metrics: Metrics
    model_poll: Callable[[], object] | None = None  # runs in a thread; hot reload
    lag_poll: Callable[[], object] | None = None  # runs in a thread; updates the lag gauge
    store_poll: Callable[[], object] | None = None  # runs in a thread; Redis evictions
    ready: Callable[[], dict[str, Any]] | None = None  # /readyz (RankingCore.ready)
    retry_cap_s: float = 10.0
    stats: dict[str, float] = field(default_factory=dict)
    # the time events are judged by: the host's, or the broker's where the host is behind
    clock: BrokerClock = field(default_factory=BrokerClock)


class _Pending:
    """Completion events whose rows wait for the next dataset write, unacked until then."""

    def __init__(self, waiting: WaitingCompletions) -> None:
        self.events: list[Any] = []
        self.rows: dict[str, dict[str, Any]] = {}
        self.since: float | None = None
        self.lock = asyncio.Lock()
        # completions that arrived before their submission was remembered (the submissions
        # loop is behind), retried until the grace
        self.waiting = waiting

    def add(self, events: list[Any], rows: list[dict[str, Any]]) -> None:
        if self.since is None:
            self.since = time.monotonic()
        self.events.extend(events)
        for row in rows:
            self.rows.setdefault(str(row["event_id"]), row)  # first wins, as in read_dataset


class Batcher:
    """Lets Faust keep fetching while a batch is processed (pipelining).

    `noack_take` stops buffering while its consumer runs, so with one batch in the executor
    the next one could only gather what arrives in `within` seconds: small batches exactly
    when the worker is busy. Here the agent body only appends to ``events`` and returns at
    once; a separate task takes everything accumulated (up to ``max_batch``) when it is free.
    ``max_backlog`` bounds memory: the agent waits when that many events are queued.
    """

    def __init__(self, max_batch: int, max_backlog: int) -> None:
        self.max_batch = max_batch
        self.max_backlog = max_backlog
        self.events: list[Any] = []
        self._ready = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()

    async def feed(self, events: list[Any]) -> None:
        self.events.extend(events)
        self._ready.set()
        while len(self.events) >= self.max_backlog:
            self._space.clear()
            await self._space.wait()

    async def next_batch(self) -> list[Any]:
        while not self.events:
            self._ready.clear()
            await self._ready.wait()
        batch = self.events[: self.max_batch]
        del self.events[: self.max_batch]
        if len(self.events) < self.max_backlog:
            self._space.set()
        return batch


class LeanApp(faust.App):
    """A Faust app without its built-in Monitor sensor.

    The Monitor keeps Faust's own per-message statistics (for its web view, which is off);
    it runs several hooks per message on the event loop, on the same GIL as the batch thread.
    The worker's metrics are its own (stream/metrics.py). Its consumer records only the acks
    the worker gives (``explicit_acks``), and after a rebalance it seeks every partition, also one
    without a commit (``seek_every_partition``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.explicit_acks = ExplicitAcks()
        super().__init__(*args, **kwargs)

    def on_init_dependencies(self) -> Any:
        services = super().on_init_dependencies()
        self.sensors.remove(self.monitor)
        return services

    def _new_consumer(self) -> Any:
        return seek_every_partition(self.explicit_acks.install(super()._new_consumer()))


def tune_consumer(min_bytes: int, max_wait_ms: int) -> None:
    """Settings Faust does not pass to the aiokafka consumer it creates (the completions').

    - ``read_committed``: Faust asks for it only in its own exactly-once mode, so records of an
      aborted producer transaction were applied to the history. The submissions consumer
      (librdkafka) reads committed records by default.
    - fetch_min_bytes / fetch_max_wait_ms: Faust hard-codes fetch_max_wait_ms=1500 and leaves
      fetch_min_bytes at 1, so each fetch returns as soon as one record is there, and each costs
      Python work in the consumer thread and a hop to the event loop (~0.3 ms of GIL at 300/s,
      most of it per fetch, not per record). A larger minimum with a short wait lets a fetch
      carry several records."""
    from faust.transport.drivers import aiokafka as driver

    cls: Any = driver.AIOKafkaConsumerThread
    original = getattr(cls, "_leap_original_create", None) or cls._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        # read by AIOKafkaConsumer.start() when it builds its Fetcher
        consumer._isolation_level = "read_committed"
        consumer._fetch_min_bytes = min_bytes
        consumer._fetch_max_wait_ms = max_wait_ms
        return consumer

    cls._leap_original_create = original
    cls._create_worker_consumer = create


def new_faust_app(deps: WorkerDeps) -> LeanApp:
    """The Faust app of the completions: raw bytes, no tables, commits only what is acked."""
    cfg = deps.cfg
    datadir = cfg.home / "faust" / cfg.consumer_group
    datadir.mkdir(parents=True, exist_ok=True)
    tune_consumer(cfg.fetch_min_bytes, cfg.completions_fetch_max_wait_ms)
    session_s = cfg.kafka_session_timeout_s
    return LeanApp(
        cfg.consumer_group,
        broker=faust_broker_url(deps.kafka.bootstrap),
        broker_credentials=faust_credentials(cfg),
        key_serializer="raw",
        value_serializer="raw",
        # State lives in Redis: no tables, no changelogs, no leader topic. The broker runs with
        # auto.create.topics.enable=false and topics come from `leap-stream topics create`.
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        datadir=str(datadir),
        consumer_auto_offset_reset="earliest",
        # a rebalance does not wait for the batch in hand: what it has not acked stays
        # uncommitted and the partition's next owner redoes it (completions are deduplicated)
        stream_wait_empty=False,
        broker_commit_interval=cfg.commit_interval_s,
        broker_commit_every=cfg.batch_size,
        # a crashed worker's partitions move after this long (aiokafka heartbeats from the
        # event loop, which the executor keeps free, so a long batch does not trip it)
        broker_session_timeout=session_s,
        broker_heartbeat_interval=min(3.0, session_s / 3),
        stream_buffer_maxsize=max(4 * cfg.batch_size, 4096),
        broker_max_poll_records=cfg.batch_size,
        # partitions added to the topic are assigned this soon (aiokafka's default: 5 minutes)
        consumer_metadata_max_age_ms=int(cfg.metadata_refresh_s * 1000),
        producer_acks=-1,
        autodiscover=False,
    )


def send_all(
    out: OutputProducer,
    topics: Settings,
    rankings: Sequence[HardwareRanking],
    dead: Sequence[DeadLetter],
) -> int:
    """Publish rankings and dead letters and wait until the broker has them all."""
    for r in rankings:
        out.send(topics.topic_rankings, str(r["job_id"]).encode(), orjson.dumps(r))
    for dl in dead:
        out.send(topics.topic_dead_letter, dead_letter_key(dl), orjson.dumps(dl))
    return out.flush()


def count_dead(m: Metrics, topic: str, dead: Sequence[DeadLetter]) -> None:
    for dl in dead:
        m.dead_letter.labels(topic=topic, kind=dl["error"]["kind"]).inc()


def count_applied(m: Metrics, res: CompletionBatchResult) -> None:
    """What applying completions did (on arrival or at a late join): duplicates, quarantines."""
    m.completions_duplicate.inc(res.duplicates)
    for rule, n in res.quarantined.items():
        m.quarantined.labels(rule=rule).inc(n)
    m.aggregate_held.inc(res.aggregate_held)
    m.observe_online(res.online)


def observe_submissions(
    deps: WorkerDeps, records: list[Record], res: SubmissionBatchResult, took: float
) -> None:
    """Metrics of a submission batch, once its outputs are durable."""
    m, topic, stats = deps.metrics, deps.cfg.topic_submissions, deps.stats
    skew = deps.clock.skew()
    if skew is not None:
        m.clock_skew.set(skew)
    m.events_in.labels(topic=topic, outcome="valid").inc(res.valid)
    m.events_in.labels(topic=topic, outcome="invalid").inc(len(records) - res.valid)
    count_dead(m, topic, res.dead_letters)
    if res.redis_error is not None:
        if res.redis_error != "backoff":
            m.redis_errors.labels(op="read_and_remember").inc()
        m.history_unavailable.inc(len(res.rankings))
    # one counter update per label value, not per ranking (a label look-up takes a lock)
    sources = Counter(r["source"] for r in res.rankings)
    for source, n in sources.items():
        m.rankings_out.labels(source=source).inc(n)
    fallbacks = Counter(r["reason"] for r in res.rankings if r["source"] != "model")
    for reason, n in fallbacks.items():
        m.fallback.labels(reason=reason).inc(n)
    for r in res.rankings:
        m.ranking_latency.observe(min(max(0.0, float(r["latency_ms"]) / 1000.0), LATENCY_CEILING_S))
    m.observe_coverage(len(res.rankings), len(res.rankings) - sources["none"])
    m.batch_size.labels(agent="submissions").observe(len(records))
    m.batch_seconds.labels(agent="submissions").observe(took)
    stats["submissions_in"] = stats.get("submissions_in", 0) + len(records)
    stats["rankings_out"] = stats.get("rankings_out", 0) + len(res.rankings)


class CompletionsAgent:
    """Completions: apply to the history, join with the submission, buffer the dataset rows,
    write them on size or age, then ack in offset order. One batch at a time with the flusher
    (``pending.lock``), so a rebalance never sees half a batch."""

    def __init__(self, app: LeanApp, deps: WorkerDeps, out: OutputProducer) -> None:
        self.app = app
        self.deps = deps
        self.out = out
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="leap-completions")
        cfg = deps.cfg
        self.pending = _Pending(WaitingCompletions(cfg.max_waiting_completions, cfg.orphan_grace_s))
        self.gate = OrderedAcks(
            lambda e: e.message.tp, lambda e: e.message.offset, app.explicit_acks.give
        )
        self.stopping = threading.Event()
        self.generation: int | None = None  # the consumer generation the gate's events are of
        self.sink_backoff = Backoff(base_s=0.5, cap_s=30.0)
        self.retry = Retry(
            lambda: bool(app.should_stop),
            self.stopping.wait,
            lambda op: deps.metrics.redis_errors.labels(op=op).inc(),
            deps.retry_cap_s,
        )

    async def consume(self, stream: Any) -> None:
        """The agent's body: events go to a Batcher, batches to `handle`; the flusher beside."""
        cfg = self.deps.cfg
        batcher = Batcher(cfg.batch_size, 4 * cfg.batch_size)
        tasks = [
            asyncio.ensure_future(self._run_batches(batcher)),
            asyncio.ensure_future(self._flusher()),
        ]
        try:
            if cfg.batch_within_s > 0:
                async for events in stream.noack_take(cfg.batch_size, within=cfg.batch_within_s):
                    await batcher.feed(events)
            else:
                # each event goes to the Batcher as Faust delivers it: noack_take polls its
                # buffer every `within` (a timer wake-up per period, up to `within` of delay)
                async for event in stream.noack().events():
                    await batcher.feed([event])
        finally:
            for task in tasks:
                task.cancel()

    async def _run_batches(self, batcher: Batcher) -> None:
        """A bug in a batch stops the worker (nothing of it is acked)."""
        while True:
            batch = await batcher.next_batch()
            try:
                await self.handle(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("completions batch handler failed: stopping the worker")
                await self.app.crash(exc)
                return

    async def _step(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """`Retry.run` in the agent's thread; giving up at a stop exits unfinished."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.pool, self.retry.run, what, fn, *args
            )
        except Unfinished:
            exit_unfinished([self.out])

    def _send_dead(self, dead: list[DeadLetter]) -> int:
        return send_all(self.out, self.deps.cfg, [], dead)

    def _process(self, records: list[Record], now: datetime) -> CompletionBatchResult:
        grace = self.deps.cfg.orphan_grace_s
        return self.deps.completions.process(records, now, wait_for_join=grace > 0)

    def _current(self, events: list[Any]) -> list[Any]:
        """The events of the consumer's current generation. Under ``pending.lock``.

        After a rebalance Faust seeks every partition back to its commit and delivers again
        whatever was not committed, so the first batch of a new generation starts the gate over
        (as the flusher does when it sees the rebalance), and an event fetched before the
        rebalance is left alone: tracked now it would follow what the gate forgot (Faust's
        streams skip such events the same way)."""
        generation = self.app.consumer_generation_id
        if generation != self.generation:
            self.generation = generation
            self.pending.waiting.clear()
            if left := self.gate.forget():
                log.warning("%d completion events left to the new generation", len(left))
        current = [e for e in events if e.message.generation_id == generation]
        if len(current) < len(events):
            log.info(
                "%d completion events from before a rebalance: redelivered",
                len(events) - len(current),
            )
        return current

    async def handle(self, events: list[Any]) -> None:
        t0 = time.perf_counter()
        pending = self.pending
        async with pending.lock:
            events = [] if self.gate.closed else self._current(events)
            if not events:  # stopped after the last write, or stale: redelivered
                return
            records = [record_of(e) for e in events]
            now = self.deps.clock.read(records)
            self.gate.track(events)
            res: CompletionBatchResult = await self._step("apply", self._process, records, now)
            if res.dead_letters:
                await self._step("produce", self._send_dead, res.dead_letters)
            waiting = {i for i, _c in res.waiting}
            pending.add([e for i, e in enumerate(events) if i not in waiting], res.rows)
            waits = [(events[i], records[i], comp) for i, comp in res.waiting]
            over = pending.waiting.add(waits, time.monotonic())
            if over:
                await self._overflow(over, now)
            await self._flush_locked(force=False)
        self._observe(records, res, time.perf_counter() - t0)

    def _observe(self, records: list[Record], res: CompletionBatchResult, took: float) -> None:
        m, topic, stats = self.deps.metrics, self.deps.cfg.topic_completions, self.deps.stats
        m.events_in.labels(topic=topic, outcome="valid").inc(res.valid)
        m.events_in.labels(topic=topic, outcome="invalid").inc(len(records) - res.valid)
        count_dead(m, topic, res.dead_letters)
        count_applied(m, res)
        m.batch_size.labels(agent="completions").observe(len(records))
        m.batch_seconds.labels(agent="completions").observe(took)
        stats["completions_in"] = stats.get("completions_in", 0) + len(records)

    async def _overflow(
        self, over: list[tuple[Any, Record, dict[str, Any]]], now: datetime
    ) -> None:
        """Completions past their partition's waiting capacity: dead letters now, acked."""
        cap = self.deps.cfg.max_waiting_completions
        dead = [
            dead_letter(
                rec,
                "waiting_overflow",
                f"{cap} completions of this partition already wait for their submission "
                "(LEAP_MAX_WAITING_COMPLETIONS)",
                now,
                COMPLETION_SCHEMA,
            )
            for _e, rec, _c in over
        ]
        await self._step("produce", self._send_dead, dead)
        count_dead(self.deps.metrics, self.deps.cfg.topic_completions, dead)
        self.pending.add([e for e, _r, _c in over], [])

    async def _resolve_waiting(self) -> None:
        """Retry the join of the waiting completions that are due; orphan them after the grace
        period."""
        pending = self.pending
        mono = time.monotonic()
        due = pending.waiting.due(mono)
        if not due:
            return
        items = [(w.record, w.completion) for w in due]
        give_up = [pending.waiting.expired(w, mono) for w in due]
        now = self.deps.clock.current()
        join = self.deps.completions.join_waiting
        res: CompletionBatchResult = await self._step("join", join, items, give_up, now)
        if res.dead_letters:
            await self._step("produce", self._send_dead, res.dead_letters)
            count_dead(self.deps.metrics, self.deps.cfg.topic_completions, res.dead_letters)
        count_applied(self.deps.metrics, res)
        decided = []
        for w, (kind, value) in zip(due, res.joined, strict=True):
            if kind == "wait":
                pending.waiting.retry_later(w, mono)
                continue
            decided.append(w)
            pending.add([w.event], [value] if kind == "row" and value is not None else [])
        pending.waiting.remove(decided)

    async def _flush_locked(self, force: bool) -> None:
        """Dataset write when due, then ack (in offset order, through the gate). Holds the lock.

        A failing sink (full or read-only folder, lost mount) does not stop the history: the
        write is tried once per backoff step, the rows and their events stay pending (unacked,
        so nothing is lost) and the next batches are applied meanwhile. Only when
        ``LEAP_DATASET_MAX_PENDING_ROWS`` are held, or at a stop or rebalance, does the agent
        wait for the sink, retrying, as it must not hold more or commit past what is unwritten.
        """
        await self._resolve_waiting()
        pending, deps = self.pending, self.deps
        if pending.events:
            age = time.monotonic() - (pending.since or time.monotonic())
            due = len(pending.rows) >= deps.cfg.dataset_flush_rows
            if force or due or age >= deps.cfg.dataset_flush_s:
                rows = list(pending.rows.values())
                if rows:
                    held = len(rows) >= deps.cfg.dataset_max_pending_rows
                    if force or held:
                        await self._step("dataset", self._append_counted, rows)
                    elif not await self._try_append(rows):
                        deps.metrics.dataset_pending_rows.set(len(rows))
                        return
                    deps.metrics.dataset_rows_written.inc(len(rows))
                deps.metrics.dataset_pending_rows.set(0)
                self.gate.done(pending.events)
                pending.events, pending.rows, pending.since = [], {}, None
                deps.stats["dataset_rows"] = deps.stats.get("dataset_rows", 0) + len(rows)
        if force and (self.app.should_stop or self.app.rebalancing):
            # what is still unacked (completions waiting for their submission and the events
            # after them) stays uncommitted and is redelivered; after a stop's last write
            # nothing more is acked
            pending.waiting.clear()
            left = self.gate.close() if self.app.should_stop else self.gate.forget()
            if left:
                log.warning("%d completion events left uncommitted; redelivered later", len(left))

    def _append_counted(self, rows: list[dict[str, Any]]) -> object:
        try:
            out = self.deps.dataset_append(rows)
        except Exception:
            self.deps.metrics.dataset_write_failures.inc()
            raise
        self.sink_backoff.succeeded()
        return out

    async def _try_append(self, rows: list[dict[str, Any]]) -> bool:
        """One attempt at the dataset write, unless the sink's backoff says not yet."""
        if not self.sink_backoff.ready():
            return False
        try:
            await asyncio.get_running_loop().run_in_executor(self.pool, self._append_counted, rows)
        except Exception as exc:
            delay = self.sink_backoff.failed()
            log.warning(
                "dataset write failed (%s: %s); %d rows held, history updates go on; "
                "retrying in %.1fs",
                type(exc).__name__,
                exc,
                len(rows),
                delay,
            )
            return False
        return True

    async def flush(self, force: bool) -> None:
        async with self.pending.lock:
            await self._flush_locked(force)

    async def _flusher(self) -> None:
        """Writes the dataset buffer on age, when idle, and when the app stops or rebalances."""
        tick = max(0.05, min(0.5, self.deps.cfg.dataset_flush_s / 4))
        while True:
            await asyncio.sleep(tick)
            try:
                await self.flush(force=bool(self.app.should_stop or self.app.rebalancing))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dataset flush failed")


def exit_unfinished(outputs: list[OutputProducer]) -> NoReturn:
    """Leave now with status 3: what is not durable stays uncommitted and is redone."""
    for out in outputs:
        out.close(5.0)
    os._exit(EXIT_UNFINISHED)


def submission_loop(deps: WorkerDeps, out: OutputProducer) -> SubmissionLoop:
    """The submissions loop of a worker, publishing through ``out`` (its own producer)."""
    cfg = deps.cfg
    return SubmissionLoop(
        kafka=deps.kafka,
        group=cfg.consumer_group,
        topic=cfg.topic_submissions,
        processor=deps.submissions,
        send=lambda rankings, dead: send_all(out, cfg, rankings, dead),
        on_batch=lambda records, res, took: observe_submissions(deps, records, res, took),
        on_store_error=lambda op: deps.metrics.redis_errors.labels(op=op).inc(),
        on_replace=lambda _why: deps.metrics.consumer_replaced.inc(),
        batch_size=cfg.batch_size,
        max_held=MAX_HELD,
        retry_cap_s=deps.retry_cap_s,
        stall_s=cfg.consumer_stall_s,
        session_timeout_s=cfg.kafka_session_timeout_s,
        commit_interval_s=cfg.commit_interval_s,
        fetch_max_wait_ms=cfg.fetch_max_wait_ms,
        extra={"topic.metadata.refresh.interval.ms": int(cfg.metadata_refresh_s * 1000)},
        clock=deps.clock,
    )


def polls(deps: WorkerDeps) -> list[tuple[str, float, Callable[[], object]]]:
    """The worker's periodic side work: (name, interval, function), each run in a thread of its
    own (a model that takes minutes to load or compile must not freeze the lag gauge)."""
    cfg = deps.cfg
    found = (
        ("model poll", cfg.model_poll_s, deps.model_poll),
        ("lag poll", cfg.lag_interval_s, deps.lag_poll),
        ("store poll", cfg.lag_interval_s, deps.store_poll),
    )
    return [(name, interval, poll) for name, interval, poll in found if poll is not None]


def poll_in_thread(
    name: str, interval: float, poll: Callable[[], object], stop: threading.Event
) -> threading.Thread:
    """Run ``poll`` every ``interval`` seconds in a daemon thread of its own until ``stop`` is
    set; what it raises is logged and the next round comes (the polls of a process without
    Faust's timers: a submissions-only worker, `leap-stream serve`)."""

    def every() -> None:
        while not stop.wait(interval):
            try:
                poll()
            except Exception as exc:
                log.warning("%s failed: %r", name, exc)

    thread = threading.Thread(target=every, name=f"leap-{name.split()[0]}", daemon=True)
    thread.start()
    return thread


def run_submissions_only(deps: WorkerDeps, stop: threading.Event) -> int:
    """A worker with LEAP_WORKER_ROLES=submissions: the submissions loop and the polls, without
    Faust (which has nothing to consume then). Runs until ``stop`` is set (SIGTERM) or the loop
    fails; exit status as the full worker's: 0, or 3 when work was left unfinished."""
    out = deps.make_output()
    loop = submission_loop(deps, out)
    for name, interval, poll in polls(deps):
        poll_in_thread(name, interval, poll, stop)
    loop.start()
    while loop.running and not stop.wait(0.25):
        pass
    loop.stop()
    stop.set()
    if loop.unfinished:
        exit_unfinished([out])
    out.close()
    if loop.error is not None:
        log.error("submissions loop failed: %r", loop.error)
        return 1
    return 0


def build_app(deps: WorkerDeps) -> faust.App:
    """The worker: the completions agent, the submissions loop (unless LEAP_WORKER_ROLES leaves
    it out), the model and lag timers. A process without the completions role never gets here
    (`run_submissions_only`: Faust would have nothing to consume)."""
    cfg = deps.cfg
    app = new_faust_app(deps)
    # one producer per consumer of the input, each used from one thread only: a flush then
    # covers exactly that side's records and delivery reports
    comp_out = deps.make_output()
    agent = CompletionsAgent(app, deps, comp_out)
    topic = app.topic(cfg.topic_completions, key_type=bytes, value_type=bytes, internal=False)
    app.agent(topic)(agent.consume)
    # a completions-only process (LEAP_WORKER_ROLES) builds no submissions side at all
    sub_out = deps.make_output() if cfg.runs("submissions") else None
    sub_loop = submission_loop(deps, sub_out) if sub_out is not None else None

    async def submissions_loop() -> None:
        assert sub_loop is not None
        sub_loop.start()
        while sub_loop.running:
            await asyncio.sleep(0.25)
        if sub_loop.error is not None:
            await app.crash(sub_loop.error)

    if sub_loop is not None:
        app.task(submissions_loop)
    # a thread each: a model that takes minutes to load or compile must not freeze the lag
    # gauge, which is what on-call reads when something is slow
    for name, interval, poll in polls(deps):
        own = ThreadPoolExecutor(1, thread_name_prefix=f"leap-{name.split()[0]}")
        app.timer(interval, name=name)(_in_aux(own, name, poll))

    async def close(app_: Any, **_kw: Any) -> None:
        agent.stopping.set()
        # finish the batch in hand, commit what is durable, leave the group
        if sub_loop is not None and sub_out is not None:
            await asyncio.get_running_loop().run_in_executor(None, sub_loop.stop)
            if sub_loop.unfinished:
                exit_unfinished([sub_out, comp_out])
        await agent.flush(force=True)
        if sub_out is not None:
            sub_out.close()
        await asyncio.get_running_loop().run_in_executor(agent.pool, comp_out.close)

    app.on_before_shutdown.connect(close)  # type: ignore[arg-type]
    return app


def _in_aux(
    pool: ThreadPoolExecutor, name: str, poll: Callable[[], object]
) -> Callable[[], Coroutine[Any, Any, None]]:
    """A timer body that runs ``poll`` in ``pool`` (its own thread) and logs what it raises."""

    async def tick() -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(pool, poll)
        except Exception as exc:
            log.warning("%s failed: %r", name, exc)

    tick.__name__ = tick.__qualname__ = name.replace(" ", "_")
    return tick


__all__ = [
    "EXIT_UNFINISHED",
    "WorkerDeps",
    "build_app",
    "faust_broker_url",
    "poll_in_thread",
    "polls",
    "record_of",
    "run_submissions_only",
    "submission_loop",
]
