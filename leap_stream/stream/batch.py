"""What the agents do with one batch, as plain synchronous code (no Faust, no event loop).

The agents hand a list of `Record`s to these processors in a worker thread and ack the input
offsets only after the processor's outputs are durable. Everything here is deterministic given
the store and the ranker, so it is tested directly against a real Redis without a broker.

Failure policy, per kind of failure:
- bad input (undecodable, schema, unknown hardware, orphan completion) goes to the dead-letter
  list with the reason, never raises;
- a ranker bug on some submissions: those are retried one by one and the ones that still fail
  are dead-lettered as ``internal`` (a poison event must not stall its partition);
- Redis down on the submission path: ranked without history (``history_used=false``);
- Redis down on the completion path: `OnlineStoreUnavailable` propagates, the agent retries the
  batch with backoff (history and dedup cannot be skipped without losing or doubling data).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any, Protocol

from leap_stream.contracts import (
    DeadLetter,
    DecodeError,
    HardwareRanking,
    JobSubmitted,
    Ok,
    TimeWindow,
    decode,
    make_dead_letter,
)
from leap_stream.core.history import LineageHistory, TypeAggregates
from leap_stream.store.values import Prediction, encode_predictions

log = logging.getLogger(__name__)

SUBMISSION_SCHEMA = "job-submitted"
COMPLETION_SCHEMA = "job-completed"


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record as the processors need it (decoupled from Faust's Event)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float | None = None  # the record's Kafka timestamp, epoch seconds
    log_append: bool = False  # that timestamp is the broker's append time, not the producer's


def store_failed(exc: BaseException) -> bool:
    """Whether an exception is Redis (or the online store over it) failing: counted per step in
    `leap_redis_errors_total` by the agents' retry loops."""
    name = type(exc).__name__
    return "Redis" in name or "OnlineStore" in name


class SubmissionStore(Protocol):
    def read_and_remember(
        self, submissions: Sequence[JobSubmitted], predictions: Sequence[Prediction] = ()
    ) -> tuple[list[LineageHistory], Mapping[str, TypeAggregates]]: ...

    def remember_submissions(self, submissions: Sequence[JobSubmitted]) -> None: ...

    def remember_predictions(self, predictions: Sequence[Prediction]) -> None: ...


class BatchRanker(Protocol):
    @property
    def known_types(self) -> Container[str]: ...

    def rank_batch(
        self,
        submissions: Sequence[JobSubmitted],
        histories: Sequence[LineageHistory | None],
        aggregates: Mapping[str, TypeAggregates],
        now: datetime,
    ) -> list[HardwareRanking]: ...


def dead_letter(
    record: Record, kind: str, message: str, now: datetime, schema: str | None = None
) -> DeadLetter:
    err = DecodeError(kind, message, None, schema)  # type: ignore[arg-type]
    return _dead_letter_of(record, err, now)


def _dead_letter_of(record: Record, err: DecodeError, now: datetime) -> DeadLetter:
    return make_dead_letter(
        record.value,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        error=err,
        now=now.timestamp(),
    )


def decode_records(
    records: Sequence[Record],
    schema: str,
    now: datetime,
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
    window: TimeWindow | None = None,
) -> tuple[list[tuple[Record, Any]], list[DeadLetter]]:
    """Split a batch into decoded events (of ``schema``) and dead letters; never raises.

    ``window``: events whose timestamps fall outside it (around ``now``) are dead letters too.
    """
    good: list[tuple[Record, Any]] = []
    dead: list[DeadLetter] = []
    clock = now.timestamp()
    for rec in records:
        result = decode(rec.value, schema, max_bytes=max_bytes, known_hardware=known_hardware)
        if isinstance(result, Ok) and window is not None:
            late = window.check(result.event, schema, clock)
            if late is not None:
                result = late
        if isinstance(result, Ok):
            good.append((rec, result.event))
        else:
            dead.append(_dead_letter_of(rec, result, now))
    return good, dead


@dataclass
class SubmissionBatchResult:
    rankings: list[HardwareRanking] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    valid: int = 0
    history_available: bool = True
    redis_error: str | None = None
    # The submissions are in Redis for the completion join: this batch's (`remembered`), and
    # those of earlier batches that had failed (`flushed_pending`). The agent holds the acks
    # of a batch until it is remembered, so a restart redoes what only lived in memory.
    remembered: bool = True
    flushed_pending: bool = False


class Backoff:
    """Exponential backoff with a ceiling; `ready()` says whether to try the resource again."""

    def __init__(
        self, base_s: float = 0.5, cap_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.base_s, self.cap_s, self._clock = base_s, cap_s, clock
        self.failures = 0
        self._next_try = 0.0

    def ready(self) -> bool:
        return self._clock() >= self._next_try

    def failed(self) -> float:
        self.failures += 1
        delay = min(self.cap_s, self.base_s * 2 ** (self.failures - 1))
        self._next_try = self._clock() + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self._next_try = 0.0


_HARDWARE = itemgetter("hardware_type")
_PREDICTED = itemgetter("predicted_throughput")


class SubmissionProcessor:
    """Submissions → rankings. Holds the Redis backoff and the submissions not yet remembered."""

    MAX_PENDING_REMEMBER = 100_000

    def __init__(
        self,
        store: SubmissionStore,
        ranker: Callable[[], BatchRanker],
        *,
        max_bytes: int,
        known_hardware: Container[str] | None = None,
        backoff: Backoff | None = None,
        window: TimeWindow | None = None,
    ) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.known_hardware = known_hardware
        self.window = window
        self._ranker = ranker  # called once per batch: the hot-reload holder's current ranker
        self.backoff = backoff or Backoff()
        # Submissions whose SET failed while Redis was down; written when it is back so their
        # completions can still be joined for the dataset. Bounded: oldest dropped first.
        self.pending_remember: list[JobSubmitted] = []
        # The model's predictions of the last batch, for the online accuracy: they ride along
        # with the next batch's round trip (or `flush_predictions` when idle). Not durable: a
        # crash loses one batch's worth from the metric, never a ranking.
        self.pending_predictions: list[Prediction] = []

    def process(self, records: Sequence[Record], now: datetime) -> SubmissionBatchResult:
        # Coverage first (lead's decision): unknown candidates do not reject a submission, the
        # ranker lists them in `excluded` (unknown_hardware); only an unknown default_hardware
        # (so no known candidate: the default is one of them) is dead-lettered.
        good, dead = decode_records(
            records,
            SUBMISSION_SCHEMA,
            now,
            max_bytes=self.max_bytes,
            known_hardware=None,
            window=self.window,
        )
        ranker = self._ranker()  # once per batch: the hot-reload holder's current ranker
        known = self.known_hardware if self.known_hardware is not None else ranker.known_types
        if known is not None:
            kept = []
            for rec, ev in good:
                if ev["default_hardware"] in known:
                    kept.append((rec, ev))
                    continue
                message = f"default_hardware {ev['default_hardware']!r} is not in the catalog"
                dead.append(dead_letter(rec, "unknown_hardware", message, now, SUBMISSION_SCHEMA))
            good = kept
        out = SubmissionBatchResult(dead_letters=dead, valid=len(good))
        if not good:
            return out
        subs = [ev for _rec, ev in good]
        histories: list[LineageHistory | None]
        aggregates: Mapping[str, TypeAggregates]
        histories, aggregates = [None] * len(subs), {}
        if self.backoff.ready():
            try:
                if self.pending_remember:
                    self.store.remember_submissions(self.pending_remember)
                    self.pending_remember = []
                    out.flushed_pending = True
                got, aggregates = self.store.read_and_remember(subs, self.pending_predictions)
                self.pending_predictions = []
                histories = list(got)
                self.backoff.succeeded()
            except Exception as exc:
                out.redis_error = f"{type(exc).__name__}: {exc}"
                delay = self.backoff.failed()
                log.warning(
                    "online store unavailable (%s); ranking without history for %.1fs",
                    out.redis_error,
                    delay,
                )
                self._keep_for_later(subs)
        else:
            out.redis_error = "backoff"
            self._keep_for_later(subs)
        out.history_available = out.redis_error is None
        out.remembered = out.history_available
        try:
            out.rankings = ranker.rank_batch(subs, histories, aggregates, now)
        except Exception:
            log.exception("rank_batch failed on %d submissions; retrying one by one", len(subs))
            out.rankings = []
            for (rec, sub), hist in zip(good, histories, strict=True):
                try:
                    out.rankings.extend(ranker.rank_batch([sub], [hist], aggregates, now))
                except Exception as exc:
                    out.valid -= 1
                    out.dead_letters.append(
                        dead_letter(rec, "internal", f"ranking failed: {exc!r}", now)
                    )
        by_job = {
            (s["job_id"], s["attempt"]): (s["model"]["model_type"], h or {})
            for s, h in zip(subs, histories, strict=True)
        }
        self._keep_predictions(out.rankings, by_job)
        return out

    def _keep_predictions(
        self,
        rankings: Sequence[HardwareRanking],
        by_job: Mapping[tuple[str, int], tuple[str, LineageHistory]],
    ) -> None:
        """What the model predicted per candidate and from which anchor (self: the lineage ran
        on it; transfer: on another type; model: never ran), for the completion to compare."""
        for r in rankings:
            cands = r["candidates"]
            if r["source"] != "model" or not cands:
                continue
            model_type, hist = by_job[(r["job_id"], r["attempt"])]
            value = encode_predictions(
                list(map(_HARDWARE, cands)),
                list(map(_PREDICTED, cands)),
                cands[0]["num_devices"],
                hist,
            )
            self.pending_predictions.append((r["job_id"], int(r["attempt"]), model_type, value))
        overflow = len(self.pending_predictions) - self.MAX_PENDING_REMEMBER
        if overflow > 0:
            del self.pending_predictions[:overflow]

    def flush_predictions(self) -> None:
        """Write the last batch's predictions when no batch follows to carry them."""
        if not self.pending_predictions or not self.backoff.ready():
            return
        try:
            self.store.remember_predictions(self.pending_predictions)
        except Exception as exc:
            log.debug("predictions not stored yet (%r)", exc)
            return
        self.pending_predictions = []

    def flush_pending(self) -> bool:
        """Write the submissions kept while Redis was down; True when none is left.

        The agent calls it between batches: when no submission follows an outage, nothing else
        would write them, their held acks would never be released and their completions would
        end as orphans (tests/faults/test_faults_services.py).
        """
        if not self.pending_remember:
            return True
        if not self.backoff.ready():
            return False
        try:
            self.store.remember_submissions(self.pending_remember)
        except Exception as exc:
            delay = self.backoff.failed()
            log.warning("online store still unavailable (%r); retrying in %.1fs", exc, delay)
            return False
        self.pending_remember = []
        self.backoff.succeeded()
        return True

    def _keep_for_later(self, subs: list[JobSubmitted]) -> None:
        self.pending_remember.extend(subs)
        overflow = len(self.pending_remember) - self.MAX_PENDING_REMEMBER
        if overflow > 0:
            del self.pending_remember[:overflow]


__all__ = [
    "Backoff",
    "Record",
    "SubmissionBatchResult",
    "SubmissionProcessor",
    "dead_letter",
    "decode_records",
    "store_failed",
]
