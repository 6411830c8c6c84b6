"""The completions agent: apply to the history, join with the submission, buffer the dataset
rows, write them on size or age, then ack in offset order (docs/worker.md)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from leap_stream.contracts import DeadLetter
from leap_stream.stream.acks import OrderedAcks
from leap_stream.stream.batch import (
    COMPLETION_SCHEMA,
    Backoff,
    Record,
    dead_letter,
)
from leap_stream.stream.completion_batch import CompletionBatchResult
from leap_stream.stream.deps import WorkerDeps, count_applied, count_dead, exit_unfinished, send_all
from leap_stream.stream.output import OutputProducer
from leap_stream.stream.retry import Retry, Unfinished
from leap_stream.stream.waiting import WaitingCompletions

if TYPE_CHECKING:
    from leap_stream.stream.app import LeanApp

log = logging.getLogger(__name__)
T = TypeVar("T")


AIOKAFKA_LOG_APPEND_TIME = 1  # aiokafka's timestamp_type (0: the producer's create time)


def record_of(event: Any) -> Record:
    m = event.message
    append = m.timestamp_type == AIOKAFKA_LOG_APPEND_TIME
    return Record(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp, append)


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
