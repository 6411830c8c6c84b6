"""Acks in offset order per partition, whatever order the work finishes in.

Faust commits "the highest contiguous acked offset", but its gap check has holes (a single
unacked offset right at the committed position, or anything while the committed offset is
0, is stepped over), so an event that is still waiting (a completion waiting for its
submission, a row waiting for the dataset write) could be committed past and lost on a
crash. The gate hands Faust only a contiguous prefix: an event is acked when it and every
earlier tracked event of its partition are done. For the same reason Faust's consumer is
made to record no ack but the gate's (`ExplicitAcks`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)


class OrderedAcks:
    def __init__(
        self,
        partition_of: Callable[[Any], Hashable],
        offset_of: Callable[[Any], int],
        ack: Callable[[Any], object],
    ) -> None:
        self._partition_of = partition_of
        self._offset_of = offset_of
        self._ack = ack
        # partition -> offset -> [event, done]
        self._open: dict[Hashable, OrderedDict[int, list[Any]]] = {}
        self.closed = False

    def track(self, events: Iterable[Any]) -> None:
        """Register events as they are received (offset order within a partition)."""
        if self.closed:
            return
        for ev in events:
            q = self._open.setdefault(self._partition_of(ev), OrderedDict())
            q.setdefault(self._offset_of(ev), [ev, False])

    def done(self, events: Iterable[Any]) -> int:
        """Mark events done; ack every newly contiguous prefix. Returns how many were acked.

        An event the gate does not track is not acked: it was forgotten (a stop, a rebalance)
        and events before it may have been forgotten unfinished; it is redelivered."""
        touched = set()
        for ev in events:
            p = self._partition_of(ev)
            q = self._open.get(p)
            entry = q.get(self._offset_of(ev)) if q is not None else None
            if entry is None:
                continue
            entry[1] = True
            touched.add(p)
        acked = 0
        for p in touched:
            q = self._open[p]
            while q:
                offset, (ev, finished) = next(iter(q.items()))
                if not finished:
                    break
                del q[offset]
                self._ack(ev)
                acked += 1
            if not q:
                del self._open[p]
        return acked

    def pending(self) -> list[Any]:
        """Tracked events not acked yet (done or not), oldest first per partition."""
        return [entry[0] for q in self._open.values() for entry in q.values()]

    def forget(self) -> list[Any]:
        """Drop everything unacked (shutdown, rebalance): Faust redelivers from the commit."""
        left = self.pending()
        self._open.clear()
        return left

    def close(self) -> list[Any]:
        """`forget`, and track nothing more: at a stop, work finished after the last commit
        must not be acked past what was forgotten unfinished."""
        self.closed = True
        return self.forget()


class ExplicitAcks:
    """Makes a Faust consumer record only the acks given through `give`.

    Faust acks some events by itself, even on a ``noack`` stream: an event its stream skips
    because flow control is suspended (a stop or rebalance in progress) or because it was
    fetched in an earlier consumer generation is acked unprocessed (faust/streams.py,
    "otherwise the lag would increase"). Faust then commits the first run of acked offsets,
    and while a partition has no commit yet nothing checks that the run starts at the
    committed position: one such ack commits past every earlier event still queued or
    waiting for the dataset write, and they are lost. Faust seeks every partition back to its
    commit before it resumes after a rebalance, so a skipped event comes again anyway.
    """

    def __init__(self) -> None:
        self._giving = threading.local()
        self.refused = 0

    def install(self, consumer: Any) -> Any:
        """Wrap ``consumer.ack`` (what `Message.ack` calls on the final ack)."""
        record = consumer.ack

        def ack(message: Any) -> bool:
            if getattr(self._giving, "on", False):
                return bool(record(message))
            self.refused += 1
            log.info("not recording Faust's own ack of %s offset %s", message.tp, message.offset)
            return False

        consumer.ack = ack
        return consumer

    def give(self, event: Any) -> None:
        """Ack ``event`` (a Faust event) for real."""
        self._giving.on = True
        try:
            event.ack()
        finally:
            self._giving.on = False


def seek_every_partition(consumer: Any) -> Any:
    """Make Faust's seek to the committed offsets move every partition, also one without a
    commit; returns ``consumer``.

    After each rebalance Faust seeks the partitions to their commits (``perform_seek``) before
    its streams resume, and counts on that to deliver again what it skipped. aiokafka, though,
    seeks only to a commit above 0 and leaves any other partition where its fetcher is; if
    Faust dropped records fetched right after the assignment (below a read offset its previous
    generation left behind, the family of faust-streaming#216), nothing would bring them back
    and the new generation's first acks would commit past them (docs/worker.md). Such a
    partition is sought to its earliest offset, where a consumer without a commit starts
    anyway (``auto_offset_reset`` earliest)."""
    seek_to_committed = consumer.seek_to_committed

    async def seek_from_commit_or_start() -> Mapping[Any, int | None]:
        committed: Mapping[Any, int | None] = await seek_to_committed()
        uncommitted = [tp for tp, offset in committed.items() if not offset]
        if uncommitted:
            earliest = await consumer.earliest_offsets(*uncommitted)
            for tp, offset in earliest.items():
                await consumer.seek(tp, offset)
            log.info(
                "no commit yet: sought to the earliest offsets %s",
                ", ".join(
                    f"{tp.topic}[{tp.partition}]@{offset}" for tp, offset in earliest.items()
                ),
            )
        return committed

    consumer.seek_to_committed = seek_from_commit_or_start
    return consumer


class HeldAcks:
    """Acks of submission batches: in offset order, and held while a batch's submissions are not
    in Redis for the completion join (`SubmissionBatchResult.remembered` false, Redis down), so
    that a restart redoes them. At most ``max_held`` events wait; beyond that the oldest are
    acked anyway (their completions become orphans, dead-lettered, not lost).
    """

    def __init__(self, gate: OrderedAcks, max_held: int) -> None:
        self.gate = gate
        self.max_held = max_held
        self.held: list[Any] = []

    def batch_done(self, events: list[Any], remembered: bool, flushed_pending: bool) -> None:
        """A batch is published; ``flushed_pending``: Redis also took the held submissions."""
        if flushed_pending:
            self.release()
        if remembered:
            self.gate.done(events)
            return
        self.held.extend(events)
        overflow = len(self.held) - self.max_held
        if overflow > 0:
            log.warning("%d submissions not remembered; acking the oldest", len(self.held))
            self.gate.done(self.held[:overflow])
            del self.held[:overflow]

    def release(self) -> None:
        """Redis took the held submissions (`SubmissionProcessor.flush_pending`): ack them."""
        self.gate.done(self.held)
        self.held.clear()

    def forget(self) -> list[Any]:
        """Stop or rebalance: drop everything unacked, held or not (redelivered later)."""
        self.held.clear()
        return self.gate.forget()


__all__ = ["ExplicitAcks", "HeldAcks", "OrderedAcks", "seek_every_partition"]
