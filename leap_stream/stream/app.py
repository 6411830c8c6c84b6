"""The Faust app: two agents (submissions, completions), a model-reload timer and a lag timer.

Faust owns consumption, group membership and offset commits; the agents own durability. Both
agents read with ``stream.noack_take`` so that *nothing* is acked implicitly: an event is acked
only after every output it caused is durable (rankings and dead letters acknowledged by the
broker; dataset rows fsynced; history applied in Redis). Faust commits only acked offsets, and
only contiguous ones, so a crash anywhere repeats work and never loses it (docs/worker.md).

The blocking work of a batch (Redis round trip, one LightGBM call, Parquet write, producer
flush) runs in one single-thread executor per agent: the event loop keeps fetching meanwhile,
and each agent's batches stay in order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import faust
import orjson

from leap_stream import config
from leap_stream.stream.acks import HeldAcks, OrderedAcks
from leap_stream.stream.batch import (
    CompletionBatchResult,
    CompletionProcessor,
    Record,
    SubmissionBatchResult,
    SubmissionProcessor,
    store_failed,
)
from leap_stream.stream.eager import eager_message_delivery
from leap_stream.stream.metrics import Metrics
from leap_stream.stream.output import OutputProducer
from leap_stream.stream.submission_loop import SubmissionLoop, uses_submission_loop

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


def faust_credentials() -> Any:
    """SASL/SSL credentials for Faust's aiokafka clients, from the same settings librdkafka uses."""
    protocol = config.get("LEAP_KAFKA_SECURITY_PROTOCOL").upper()
    if protocol == "PLAINTEXT":
        return None
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=config.get("LEAP_KAFKA_SSL_CAFILE") or None)
        if cert := config.get("LEAP_KAFKA_SSL_CERTFILE"):
            context.load_cert_chain(cert, config.get("LEAP_KAFKA_SSL_KEYFILE") or None)
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    return faust.SASLCredentials(
        username=config.get("LEAP_KAFKA_SASL_USERNAME"),
        password=config.get("LEAP_KAFKA_SASL_PASSWORD"),
        mechanism=config.get("LEAP_KAFKA_SASL_MECHANISM") or "PLAIN",
        ssl_context=context,
    )


def record_of(event: Any) -> Record:
    m = event.message
    return Record(m.topic, m.partition, m.offset, m.key, m.value)


def dead_letter_key(dl: dict[str, Any]) -> bytes:
    s = dl["source"]
    return f"{s['topic']}/{s['partition']}/{s['offset']}".encode()


@dataclass
class WorkerDeps:
    """Everything the agents use, built by the worker command (or a test) before the app starts."""

    cfg: config.Config
    bootstrap: str
    submissions: SubmissionProcessor
    completions: CompletionProcessor
    dataset_append: Callable[[list[dict[str, Any]]], object]
    make_output: Callable[[], OutputProducer]  # one producer per agent (see send_all)
    metrics: Metrics
    model_poll: Callable[[], object] | None = None  # runs in a thread; hot reload
    lag_poll: Callable[[], object] | None = None  # runs in a thread; updates the lag gauge
    flush_rows: int = 5000
    flush_s: float = 10.0
    lag_interval_s: float = 15.0
    orphan_grace_s: float = 60.0
    retry_cap_s: float = 10.0
    stats: dict[str, float] = field(default_factory=dict)


class _Pending:
    """Completion events whose rows wait for the next dataset write, unacked until then."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.rows: dict[str, dict[str, Any]] = {}
        self.since: float | None = None
        self.lock = asyncio.Lock()
        # completions that arrived before their submission was remembered (the submissions
        # agent is behind): (event, record, completion, first seen), retried until the grace
        self.waiting: list[tuple[Any, Record, dict[str, Any], float]] = []

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
    The worker's metrics are its own (stream/metrics.py)."""

    def on_init_dependencies(self) -> Any:
        services = super().on_init_dependencies()
        self.sensors.remove(self.monitor)
        return services


def tune_consumer_fetch(min_bytes: int, max_wait_ms: int) -> None:
    """Pass fetch_min_bytes / fetch_max_wait_ms to the aiokafka consumer Faust creates.

    Faust hard-codes fetch_max_wait_ms=1500 and leaves fetch_min_bytes at 1: each fetch then
    returns as soon as one record is there, and each costs Python work in the consumer thread
    and a hop to the event loop (~0.3 ms of GIL at 300/s, most of it per fetch, not per
    record). A larger minimum with a short wait lets a fetch carry several records."""
    from faust.transport.drivers import aiokafka as driver

    cls: Any = driver.AIOKafkaConsumerThread
    original = getattr(cls, "_leap_original_create", None) or cls._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        consumer._fetch_min_bytes = min_bytes  # read by AIOKafkaConsumer.start() (Fetcher)
        consumer._fetch_max_wait_ms = max_wait_ms
        return consumer

    cls._leap_original_create = original
    cls._create_worker_consumer = create


def build_app(deps: WorkerDeps) -> faust.App:
    cfg = deps.cfg
    datadir = cfg.home / "faust" / cfg.consumer_group
    datadir.mkdir(parents=True, exist_ok=True)
    # Faust's consumer reads the submissions too only with LEAP_SUBMISSIONS_CONSUMER=faust
    wait = (
        "LEAP_COMPLETIONS_FETCH_MAX_WAIT_MS" if uses_submission_loop() else "LEAP_FETCH_MAX_WAIT_MS"
    )
    tune_consumer_fetch(int(config.get("LEAP_FETCH_MIN_BYTES")), int(config.get(wait)))
    if config.get("LEAP_EAGER_DELIVERY") == "1":
        eager_message_delivery()
    app = LeanApp(
        cfg.consumer_group,
        broker=faust_broker_url(deps.bootstrap),
        broker_credentials=faust_credentials(),
        key_serializer="raw",
        value_serializer="raw",
        # State lives in Redis: no tables, no changelogs, no leader topic. The broker runs with
        # auto.create.topics.enable=false and topics come from `leap-stream topics create`.
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        datadir=str(datadir),
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=True,  # shutdown/rebalance waits for the batch in hand to be acked
        broker_commit_interval=float(config.get("LEAP_COMMIT_INTERVAL_S")),
        broker_commit_every=cfg.batch_size,
        # a crashed worker's partitions move after this long (aiokafka heartbeats from the
        # event loop, which the executors keep free, so a long batch does not trip it)
        broker_session_timeout=float(config.get("LEAP_KAFKA_SESSION_TIMEOUT_S")),
        broker_heartbeat_interval=min(3.0, float(config.get("LEAP_KAFKA_SESSION_TIMEOUT_S")) / 3),
        stream_buffer_maxsize=max(4 * cfg.batch_size, 4096),
        broker_max_poll_records=cfg.batch_size,
        producer_acks=-1,
        autodiscover=False,
    )
    completions_topic = app.topic(
        cfg.topic_completions, key_type=bytes, value_type=bytes, internal=False
    )
    sub_pool = ThreadPoolExecutor(1, thread_name_prefix="leap-submissions")
    comp_pool = ThreadPoolExecutor(1, thread_name_prefix="leap-completions")
    aux_pool = ThreadPoolExecutor(1, thread_name_prefix="leap-aux")
    m = deps.metrics
    pending = _Pending()
    stats = deps.stats

    async def in_thread(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def exit_unfinished() -> None:
        """Leave now with status 3: what is not durable stays uncommitted and is redone."""
        for out in outputs.values():
            out.close(5.0)
        os._exit(EXIT_UNFINISHED)

    async def until_done(what: str, pool: ThreadPoolExecutor, fn: Callable[..., T], *a: Any) -> T:
        """Retry an infrastructure step with backoff; at shutdown give up without acking."""
        delay = 0.2
        while True:
            try:
                return await in_thread(pool, fn, *a)
            except Exception as exc:
                if store_failed(exc):
                    m.redis_errors.labels(op=what).inc()
                if app.should_stop:
                    log.error(
                        "stopping while %s fails (%r): exiting without committing it", what, exc
                    )
                    exit_unfinished()
                log.warning("%s failed (%r); retrying in %.1fs", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(deps.retry_cap_s, delay * 2)

    # Each agent has its own producer, used only from its own executor thread: a flush then
    # covers exactly that agent's records and their delivery reports (with one producer
    # flushed from two threads, one agent could ack on the strength of the other's flush).
    outputs = {sub_pool: deps.make_output(), comp_pool: deps.make_output()}

    def sender(out: OutputProducer) -> Callable[[list[Any], list[Any]], int]:
        def send_all(rankings: list[dict[str, Any]], dead: list[dict[str, Any]]) -> int:
            for r in rankings:
                out.send(cfg.topic_rankings, str(r["job_id"]).encode(), orjson.dumps(r))
            for dl in dead:
                out.send(cfg.topic_dead_letter, dead_letter_key(dl), orjson.dumps(dl))
            return out.flush()

        return send_all

    send_submissions, send_completions = sender(outputs[sub_pool]), sender(outputs[comp_pool])

    def count_dead(topic: str, dead: list[dict[str, Any]]) -> None:
        for dl in dead:
            m.dead_letter.labels(topic=topic, kind=dl["error"]["kind"]).inc()

    sub_acks = HeldAcks(
        OrderedAcks(lambda e: e.message.tp, lambda e: e.message.offset, lambda e: e.ack()),
        MAX_HELD,
    )
    sub_busy = asyncio.Lock()  # a batch in hand: the flusher must not forget its events

    async def handle_submissions(events: list[Any]) -> None:
        async with sub_busy:
            await _handle_submissions(events)

    async def _handle_submissions(events: list[Any]) -> None:
        t0 = time.perf_counter()
        records = [record_of(e) for e in events]
        now = datetime.now(UTC)
        res: SubmissionBatchResult = await until_done(
            "rank", sub_pool, deps.submissions.process, records, now
        )
        if res.rankings or res.dead_letters:
            await until_done("produce", sub_pool, send_submissions, res.rankings, res.dead_letters)
        sub_acks.gate.track(events)
        sub_acks.batch_done(events, res.remembered, res.flushed_pending)
        observe_submissions(records, res, time.perf_counter() - t0)

    def observe_submissions(records: list[Record], res: SubmissionBatchResult, took: float) -> None:
        """Metrics of a submission batch, once its outputs are durable."""
        topic = cfg.topic_submissions
        m.events_in.labels(topic=topic, outcome="valid").inc(res.valid)
        m.events_in.labels(topic=topic, outcome="invalid").inc(len(records) - res.valid)
        count_dead(topic, res.dead_letters)
        if res.redis_error is not None:
            if res.redis_error != "backoff":
                m.redis_errors.labels(op="read_and_remember").inc()
            m.history_unavailable.inc(len(res.rankings))
        covered = 0
        for r in res.rankings:
            m.rankings_out.labels(source=r["source"]).inc()
            if r["source"] != "model":
                m.fallback.labels(reason=r["reason"]).inc()
            covered += r["source"] != "none"
            m.ranking_latency.observe(max(0.0, float(r["latency_ms"])) / 1000.0)
        m.observe_coverage(len(res.rankings), covered)
        m.batch_size.labels(agent="submissions").observe(len(records))
        m.batch_seconds.labels(agent="submissions").observe(took)
        stats["submissions_in"] = stats.get("submissions_in", 0) + len(records)
        stats["rankings_out"] = stats.get("rankings_out", 0) + len(res.rankings)

    async def run_batches(name: str, batcher: Batcher, handle: Callable[[list[Any]], Any]) -> None:
        """The processing side of a Batcher; a bug here stops the worker (nothing is acked)."""
        while True:
            batch = await batcher.next_batch()
            try:
                await handle(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("%s batch handler failed: stopping the worker", name)
                await app.crash(exc)
                return

    async def consume(stream: Any, name: str, handle: Callable[[list[Any]], Any]) -> None:
        batcher = Batcher(cfg.batch_size, 4 * cfg.batch_size)
        task = asyncio.ensure_future(run_batches(name, batcher, handle))
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
            task.cancel()

    sub_loop: SubmissionLoop | None = None
    if uses_submission_loop():
        # the hot path on librdkafka (stream/submission_loop.py); Faust keeps the completions
        sub_loop = SubmissionLoop(
            bootstrap=deps.bootstrap,
            group=cfg.consumer_group,
            topic=cfg.topic_submissions,
            processor=deps.submissions,
            send=send_submissions,  # the loop's thread is then its producer's only user
            on_batch=observe_submissions,
            on_store_error=lambda op: m.redis_errors.labels(op=op).inc(),
            on_replace=lambda _why: m.consumer_replaced.inc(),
            batch_size=cfg.batch_size,
            max_held=MAX_HELD,
            retry_cap_s=deps.retry_cap_s,
        )
        loop_ref = sub_loop

        @app.task
        async def submissions_loop() -> None:
            loop_ref.start()
            while loop_ref.running:
                await asyncio.sleep(0.25)
            if loop_ref.error is not None:
                await app.crash(loop_ref.error)
    else:
        submissions_topic = app.topic(
            cfg.topic_submissions, key_type=bytes, value_type=bytes, internal=False
        )

        @app.agent(submissions_topic)
        async def submissions(stream: Any) -> None:
            await consume(stream, "submissions", handle_submissions)

    gate = OrderedAcks(lambda e: e.message.tp, lambda e: e.message.offset, lambda e: e.ack())

    async def resolve_waiting() -> None:
        """Retry the join of waiting completions; orphan them after the grace period."""
        if not pending.waiting:
            return
        mono = time.monotonic()
        items = [(rec, comp) for _e, rec, comp, _t in pending.waiting]
        give_up = [mono - since >= deps.orphan_grace_s for *_x, since in pending.waiting]
        now = datetime.now(UTC)
        outcome = await until_done(
            "join", comp_pool, deps.completions.join_waiting, items, give_up, now
        )
        dead = [dl for kind, dl in outcome if kind == "dead" and dl is not None]
        if dead:
            await until_done("produce", comp_pool, send_completions, [], dead)
            count_dead(cfg.topic_completions, dead)
        still: list[tuple[Any, Record, dict[str, Any], float]] = []
        for item, (kind, value) in zip(pending.waiting, outcome, strict=True):
            if kind == "wait":
                still.append(item)
                continue
            pending.add([item[0]], [value] if kind == "row" and value is not None else [])
        pending.waiting = still

    async def flush_locked(force: bool) -> None:
        """Dataset write when due, then ack (in offset order, through the gate). Holds the lock."""
        await resolve_waiting()
        if pending.events:
            age = time.monotonic() - (pending.since or time.monotonic())
            if force or len(pending.rows) >= deps.flush_rows or age >= deps.flush_s:
                rows = list(pending.rows.values())
                if rows:
                    await until_done("dataset", comp_pool, deps.dataset_append, rows)
                    m.dataset_rows_written.inc(len(rows))
                gate.done(pending.events)
                pending.events, pending.rows, pending.since = [], {}, None
                stats["dataset_rows"] = stats.get("dataset_rows", 0) + len(rows)
        if force and (app.should_stop or app.rebalancing):
            # Shutdown or rebalance: what is still unacked (completions waiting for their
            # submission and the events after them) is dropped without acking. Faust is told
            # not to wait for it; its offsets stay uncommitted and it is redelivered.
            pending.waiting = []
            drop_unacked(gate.forget(), "completion")

    def drop_unacked(left: list[Any], what: str) -> None:
        """Forget events without acking them; Faust must not wait for them at stop/rebalance."""
        if not left:
            return
        log.warning("%d %s events left uncommitted; redelivered later", len(left), what)
        unacked = getattr(app.consumer, "_unacked_messages", None)
        if unacked is not None:
            for ev in left:
                unacked.discard(ev.message)

    async def flusher() -> None:
        """Writes the dataset buffer on age, when idle, and when the app stops or rebalances."""
        tick = max(0.05, min(0.5, deps.flush_s / 4))
        while True:
            await asyncio.sleep(tick)
            if (app.should_stop or app.rebalancing) and sub_acks.held and not sub_busy.locked():
                drop_unacked(sub_acks.forget(), "submission")
            elif sub_acks.held and not sub_busy.locked():
                # Redis is back but no submission batch came to write what it missed
                async with sub_busy:
                    flushed: bool = await in_thread(sub_pool, deps.submissions.flush_pending)
                    if flushed:
                        sub_acks.release()
            try:
                async with pending.lock:
                    await flush_locked(force=app.should_stop or app.rebalancing)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dataset flush failed")

    def process_completions(records: list[Record], now: datetime) -> CompletionBatchResult:
        return deps.completions.process(records, now, wait_for_join=deps.orphan_grace_s > 0)

    async def handle_completions(events: list[Any]) -> None:
        t0 = time.perf_counter()
        records = [record_of(e) for e in events]
        now = datetime.now(UTC)
        # one batch at a time with the flusher: a rebalance never sees half a batch
        async with pending.lock:
            gate.track(events)
            res: CompletionBatchResult = await until_done(
                "apply", comp_pool, process_completions, records, now
            )
            if res.dead_letters:
                await until_done("produce", comp_pool, send_completions, [], res.dead_letters)
            waiting = {i for i, _c in res.waiting}
            mono = time.monotonic()
            pending.add([e for i, e in enumerate(events) if i not in waiting], res.rows)
            pending.waiting.extend((events[i], records[i], comp, mono) for i, comp in res.waiting)
            await flush_locked(force=False)
        topic = cfg.topic_completions
        m.events_in.labels(topic=topic, outcome="valid").inc(res.valid)
        m.events_in.labels(topic=topic, outcome="invalid").inc(len(records) - res.valid)
        count_dead(topic, res.dead_letters)
        m.completions_duplicate.inc(res.duplicates)
        m.batch_size.labels(agent="completions").observe(len(records))
        m.batch_seconds.labels(agent="completions").observe(time.perf_counter() - t0)
        stats["completions_in"] = stats.get("completions_in", 0) + len(records)

    @app.agent(completions_topic)
    async def completions(stream: Any) -> None:
        task = asyncio.ensure_future(flusher())
        try:
            await consume(stream, "completions", handle_completions)
        finally:
            task.cancel()

    if deps.model_poll is not None:
        model_poll = deps.model_poll

        @app.timer(cfg.model_poll_s)
        async def reload_model() -> None:
            try:
                await in_thread(aux_pool, model_poll)
            except Exception:
                log.exception("model poll failed")

    if deps.lag_poll is not None:
        lag_poll = deps.lag_poll

        @app.timer(deps.lag_interval_s)
        async def consumer_lag() -> None:
            try:
                await in_thread(aux_pool, lag_poll)
            except Exception as exc:
                log.warning("lag poll failed: %r", exc)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def _close(app_: Any, **_kw: Any) -> None:
        if sub_loop is not None:
            # finish the batch in hand, commit what is durable, leave the group
            await asyncio.get_running_loop().run_in_executor(None, sub_loop.stop)
            if sub_loop.unfinished:
                exit_unfinished()
        async with pending.lock:
            await flush_locked(force=True)
        for pool, out in outputs.items():
            await in_thread(pool, out.close)

    return app


__all__ = ["EXIT_UNFINISHED", "WorkerDeps", "build_app", "faust_broker_url", "record_of"]
