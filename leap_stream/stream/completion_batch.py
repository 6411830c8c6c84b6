"""What the completions agent does with one batch, as plain synchronous code: apply to the
history (Redis, atomic, deduplicated), join with the stored submission, and build the dataset
rows. The failure policy is `stream.batch`'s: bad input becomes a dead letter with its reason;
Redis down propagates `OnlineStoreUnavailable` and the agent retries the batch."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from leap_stream.contracts import (
    DeadLetter,
    JobCompleted,
    TimeWindow,
)
from leap_stream.core.columns import Columns
from leap_stream.core.features import log_rate_ceiling
from leap_stream.core.rows import SUBMISSION_COLUMNS
from leap_stream.core.specs import SpecArrays
from leap_stream.store.offline import flatten
from leap_stream.stream.batch import (
    COMPLETION_SCHEMA,
    Record,
    dead_letter,
    decode_records,
)

log = logging.getLogger(__name__)

Ceilings = Callable[[Sequence[dict[str, Any] | None]], Sequence[float | None]]


class CompletionStore(Protocol):
    def apply_and_fetch(
        self,
        completions: Sequence[JobCompleted],
        ceilings: Ceilings | None = None,
        now: float = ...,
    ) -> tuple[list[Any], list[dict[str, Any] | None]]: ...


# ("row", dataset row) | ("dead", dead letter) | ("wait", None): see join_waiting
JoinOutcome = tuple[str, Any]


@dataclass
class CompletionBatchResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    valid: int = 0
    new: int = 0
    duplicates: int = 0
    measured: int = 0
    orphans: int = 0
    mismatches: int = 0
    repeats: int = 0  # completions of an attempt that had completed before: dead letters
    probes: int = 0  # new completions of probes (`probe`: a short run before the attempt's)
    quarantined: Counter[str] = field(default_factory=Counter)  # by rule, new ones only
    aggregate_held: int = 0  # new measurements whose aggregate update the speed bound held
    # (hardware type, anchor, predicted / measured per-device - 1) where the model ranked the
    # job and the completion's measurement was accepted: the online accuracy
    online: list[tuple[str, str, float]] = field(default_factory=list)
    # (index in the batch, completion) whose submission is not known yet: the caller retries
    # with `join_waiting` before giving up (only when process(wait_for_join=True))
    waiting: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    # what join_waiting decided, per item it was given
    joined: list[JoinOutcome] = field(default_factory=list)


class CompletionProcessor:
    """Completions → history update (Redis, atomic, deduplicated) and dataset rows.

    Rows are produced for duplicates too (when the submission is known): a crash after the
    Redis update but before the dataset write replays the event as a "duplicate", and its row
    must still reach the dataset; `read_dataset` keeps one row per event_id.

    A completion must agree with the submission stored for its job attempt (lineage, model
    type, a hardware type among its candidates), else it is a ``completion_mismatch`` dead
    letter and changes nothing. An attempt completes once: a completion of an attempt whose
    completion (another event) was taken before is an ``attempt_completed`` dead letter and
    changes nothing, whatever its ``event_id``. Without a stored
    submission it changes nothing either (unless the store allows orphans): it waits for the
    join, and is applied when its submission arrives, or dead-lettered as an orphan.
    """

    def __init__(
        self,
        store: CompletionStore,
        *,
        max_bytes: int,
        known_hardware: Container[str] | None = None,
        window: TimeWindow | None = None,
        specs: Callable[[], SpecArrays] | None = None,
    ) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.known_hardware = known_hardware
        self.window = window
        # the serving catalog's specs, for the physics reference of the guard (None: not used)
        self.specs = specs

    def process(
        self, records: Sequence[Record], now: datetime, *, wait_for_join: bool = False
    ) -> CompletionBatchResult:
        good, dead = decode_records(
            records,
            COMPLETION_SCHEMA,
            now,
            max_bytes=self.max_bytes,
            known_hardware=self.known_hardware,
            window=self.window,
        )
        out = CompletionBatchResult(dead_letters=dead, valid=len(good))
        if not good:
            return out
        index = {id(rec): i for i, rec in enumerate(records)}
        for (rec, comp), kind, value in self._apply(
            good, [not wait_for_join] * len(good), now, out
        ):
            if kind == "wait":
                out.waiting.append((index[id(rec)], comp))
            elif kind == "row":
                out.rows.append(value)
            else:
                out.dead_letters.append(value)
        return out

    def _apply(
        self,
        items: Sequence[tuple[Record, Any]],
        give_up: Sequence[bool],
        now: datetime,
        out: CompletionBatchResult,
    ) -> list[tuple[tuple[Record, Any], str, Any]]:
        """Apply ``items`` (one round trip, two with the physics ceilings; raises
        OnlineStoreUnavailable: the agent retries); per item ("row", row) | ("dead", dead
        letter) | ("wait", None), counted in ``out``."""
        completions = [c for _r, c in items]
        ceilings = None if self.specs is None else self._ceilings(completions)
        applied, submissions = self.store.apply_and_fetch(completions, ceilings, now.timestamp())
        decided: list[tuple[tuple[Record, Any], str, Any]] = []
        for item, res, sub, stop in zip(items, applied, submissions, give_up, strict=True):
            rec, comp = item
            if res.outcome == "mismatch":
                out.mismatches += 1
                decided.append((item, "dead", self.mismatch(rec, comp, sub, now)))
                continue
            if res.outcome == "repeat":
                out.repeats += 1
                decided.append((item, "dead", self.repeat(rec, comp, now)))
                continue
            if res.outcome == "no_submission" or sub is None:
                if stop:
                    out.orphans += 1
                    decided.append((item, "dead", self.orphan(rec, comp, now, res.applied)))
                else:
                    decided.append((item, "wait", None))
                continue
            if res.new:
                out.new += 1
                out.probes += bool(comp.get("probe"))
                out.measured += int(res.measured)
                if res.quarantine is not None:
                    out.quarantined[res.quarantine] += 1
                out.aggregate_held += int(res.aggregate_held)
                if res.measured:
                    self._score(sub, comp, out)
            else:
                out.duplicates += 1
            try:
                decided.append((item, "row", flatten(sub, comp, quarantine=res.quarantine)))
            except Exception as exc:
                dl = dead_letter(rec, "internal", f"dataset row failed: {exc!r}", now)
                decided.append((item, "dead", dl))
        return decided

    def _ceilings(self, completions: Sequence[Mapping[str, Any]]) -> Ceilings:
        """From the stored submissions, each completion's physics ceiling on its hardware."""
        assert self.specs is not None
        specs = self.specs()

        def ceilings(subs: Sequence[dict[str, Any] | None]) -> list[float | None]:
            known = [i for i, sub in enumerate(subs) if sub is not None]
            stored = [sub for sub in subs if sub is not None]
            out: list[float | None] = [None] * len(subs)
            if known:
                jobs = Columns.of_rows(stored, SUBMISSION_COLUMNS)
                hw = [completions[i]["hardware_type"] for i in known]
                for i, v in zip(known, log_rate_ceiling(jobs, hw, specs).tolist(), strict=True):
                    out[i] = v
            return out

        return ceilings

    @staticmethod
    def _score(sub: Mapping[str, Any], comp: Mapping[str, Any], out: CompletionBatchResult) -> None:
        """The ranking's prediction on the hardware the job ran on, against what it measured."""
        predicted = (sub.get("_predictions") or {}).get(comp["hardware_type"])
        sps = (comp.get("throughput") or {}).get("samples_per_s")
        if predicted is None or not sps:
            return
        per_device, anchor = predicted
        actual = float(sps) / int(comp["num_devices"])
        out.online.append((comp["hardware_type"], anchor, per_device / actual - 1.0))

    @staticmethod
    def orphan(rec: Record, comp: Mapping[str, Any], now: datetime, applied: bool) -> DeadLetter:
        effect = "history updated" if applied else "history not updated"
        return dead_letter(
            rec,
            "orphan_completion",
            f"no submission stored for job {comp['job_id']} attempt {comp['attempt']}; "
            f"{effect}, no dataset row",
            now,
            COMPLETION_SCHEMA,
        )

    @staticmethod
    def repeat(rec: Record, comp: Mapping[str, Any], now: datetime) -> DeadLetter:
        return dead_letter(
            rec,
            "attempt_completed",
            f"job {comp['job_id']} attempt {comp['attempt']} completed before (another event): "
            "an attempt completes once; history not updated, no dataset row",
            now,
            COMPLETION_SCHEMA,
        )

    @staticmethod
    def mismatch(
        rec: Record, comp: Mapping[str, Any], sub: Mapping[str, Any] | None, now: datetime
    ) -> DeadLetter:
        differ = [
            f"{k} {comp[k]!r} (submission: {sub.get(k)!r})"
            for k in ("lineage_id", "model_type")
            if sub is not None and sub.get(k) != comp[k]
        ]
        candidates = str((sub or {}).get("candidate_hardware", "")).split("|")
        if sub is not None and comp["hardware_type"] not in candidates:
            differ.append(f"hardware_type {comp['hardware_type']!r} is not one of its candidates")
        return dead_letter(
            rec,
            "completion_mismatch",
            f"job {comp['job_id']} attempt {comp['attempt']} does not match its submission: "
            + ("; ".join(differ) or "fields differ")
            + "; history not updated, no dataset row",
            now,
            COMPLETION_SCHEMA,
        )

    def join_waiting(
        self,
        items: Sequence[tuple[Record, Mapping[str, Any]]],
        give_up: Sequence[bool],
        now: datetime,
    ) -> CompletionBatchResult:
        """Retry completions that arrived before their submission was remembered.

        In ``joined``, per item: ("row", row) when the submission is known now (the history is
        updated then), ("dead", orphan dead letter) when it is still unknown and ``give_up``,
        else ("wait", None). One Redis round trip; raises `OnlineStoreUnavailable` like
        `process`.
        """
        out = CompletionBatchResult()
        if items:
            decided = self._apply(list(items), give_up, now, out)
            out.joined = [(kind, value) for _item, kind, value in decided]
            out.dead_letters = [v for _i, kind, v in decided if kind == "dead"]
        return out


__all__ = ["Ceilings", "CompletionBatchResult", "CompletionProcessor", "CompletionStore"]
