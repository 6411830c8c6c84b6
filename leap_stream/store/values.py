"""How the online store keeps its values in Redis: lineage entries and aggregate tables as
the read script returns them, submissions as value arrays, a ranking's predictions."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from leap_stream.core.aggregates import AggregateTable
from leap_stream.core.history import (
    QUARANTINE_RULES,
    Measurement,
    log_per_device,
    measurement,
)
from leap_stream.core.rows import SUBMISSION_COLUMNS


def decode_measurement(v: Sequence[Any]) -> Measurement:
    """A stored lineage entry; the 4-value form is the single-measurement layout of 0.x."""
    if len(v) == 4:
        nd = int(v[1])
        x = log_per_device(float(v[0]), nd)
        return measurement(((float(v[2]), x),), nd, float(v[2]), int(v[3]), None)
    pending = (float(v[4]), float(v[5])) if v[3] == 1 else None
    recent = tuple((float(v[j]), float(v[j + 1])) for j in range(6, len(v) - 1, 2))
    return measurement(recent, int(v[0]), float(v[1]), int(v[2]), pending)


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


Hash = tuple[Sequence[Any], Sequence[Any]]  # (fields, values) of one HGETALL


def _from_flat(flat: Sequence[Any]) -> Hash:
    return flat[0::2], flat[1::2]


def _aggregate_table(
    hashes: Sequence[Hash], decoded: list[Any], model_types: Sequence[str], names: dict[Any, str]
) -> AggregateTable:
    """The model types' aggregate hashes (in ``model_types`` order) as one flat table."""
    hardware: dict[str, int] = {}
    owner: list[int] = []
    codes: list[int] = []
    for i, (fields, _vs) in enumerate(hashes):
        for f in fields:
            name = names.get(f)
            if name is None:
                name = names[f] = _text(f)
            code = hardware.get(name)
            if code is None:
                code = hardware[name] = len(hardware)
            codes.append(code)
        owner.extend([i] * len(fields))
    if len(decoded) != len(codes):
        raise ValueError(f"{len(decoded)} aggregate values for {len(codes)} fields")
    values = np.asarray(decoded, np.float64).reshape(len(codes), -1) if codes else np.empty((0, 3))
    if values.shape[1] != 3:  # [EWMA, count, last_at] (core.history.apply_aggregate)
        raise ValueError(f"aggregate values of {values.shape[1]} numbers, expected 3")
    return AggregateTable(model_types, list(hardware), np.asarray(owner), np.asarray(codes), values)


_SUB_FORMAT = 1  # first element of a stored submission: the column list it was written with
# 1-based positions (the Lua script's) of the fields a completion must agree with
_SUB_LINEAGE = SUBMISSION_COLUMNS.index("lineage_id") + 2
_SUB_MODEL_TYPE = SUBMISSION_COLUMNS.index("model_type") + 2
_SUB_DEVICES = SUBMISSION_COLUMNS.index("num_devices") + 2
_SUB_CANDIDATES = SUBMISSION_COLUMNS.index("candidate_hardware") + 2  # '|'-joined


_SUBMISSION_VALUES = itemgetter(*SUBMISSION_COLUMNS)  # one C call for the 25 values


def encode_submission(fields: Mapping[str, Any]) -> bytes:
    """Values only, in `SUBMISSION_COLUMNS` order: half the memory of a JSON object."""
    return orjson.dumps([_SUB_FORMAT, *_SUBMISSION_VALUES(fields)])


def decode_submission(raw: bytes | str | None) -> dict[str, Any] | None:
    """A stored submission; None when absent or unreadable (the completion becomes an orphan)."""
    if raw is None:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if (
        isinstance(value, list)
        and value
        and value[0] == _SUB_FORMAT
        and len(value) == len(SUBMISSION_COLUMNS) + 1
    ):
        return dict(zip(SUBMISSION_COLUMNS, value[1:], strict=True))
    return None


Prediction = tuple[str, int, str, bytes]  # (job_id, attempt, model_type, encode_predictions(...))
ANCHORS = ("self", "transfer", "model")


def encode_predictions(
    hardware: Sequence[str],
    predicted: Sequence[float],
    num_devices: int,
    history: Collection[str],
) -> bytes:
    """A ranking's predictions, for the online accuracy when the completion comes: the
    candidates' types and whole-job samples/s (one list each, no object per candidate: this
    runs for every ranked job), the job's device count, and the anchor kind, from the types the
    lineage has a prior on (``history``): `self` there, else `transfer` when it has any prior,
    else `model`."""
    own = sorted(set(history).intersection(hardware))
    other = "transfer" if history else "model"
    return orjson.dumps(
        {"hw": hardware, "p": predicted, "nd": num_devices, "self": own, "else": other}
    )


def decode_predictions(raw: bytes | str) -> dict[str, tuple[float, str]]:
    """hw -> (per-device prediction, anchor); empty when unreadable (the metric skips it).
    Reads the list of ``[hw, per-device samples/s, anchor]`` that 0.x stored too."""
    try:
        value = orjson.loads(raw)
        if isinstance(value, list):
            return {str(hw): (float(v), str(a)) for hw, v, a in value}
        nd, own, other = float(value["nd"]), set(value["self"]), str(value["else"])
        return {
            str(hw): (float(p) / nd, "self" if hw in own else other)
            for hw, p in zip(value["hw"], value["p"], strict=True)
        }
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, ZeroDivisionError):
        return {}


# What the script did with one completion (its return codes, see APPLY_LUA)
_OUTCOMES = {
    1: "none",
    2: "accepted",
    3: "corroborated",
    4: "lineage",
    5: "aggregate",
    6: "devices",
    7: "physics",
    8: "mismatch",
    9: "no_submission",
    10: "repeat",
    11: "speed",
}
_AGGREGATE_HELD = 20  # added to an outcome when the aggregate speed bound held the aggregate


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """One completion's fate. ``outcome``: ``none`` (no measurement), ``accepted``,
    ``corroborated``, ``devices`` / ``lineage`` / ``aggregate`` / ``physics`` / ``speed``
    (quarantined by that rule), ``mismatch`` (its stored submission names another lineage or
    model type), ``no_submission`` (none stored and orphans are not allowed) or ``repeat``
    (another completion of the same job attempt was taken before: an attempt completes once);
    for a duplicate, what the first delivery got. ``aggregate_held``: the measurement entered
    the history but the aggregate speed bound held its model type's aggregate back."""

    event_id: str
    new: bool  # False: seen before (duplicate), nothing changed
    outcome: str = "none"
    aggregate_held: bool = False

    @property
    def measured(self) -> bool:
        """The history was updated by this delivery."""
        return self.new and self.outcome in ("accepted", "corroborated")

    @property
    def quarantine(self) -> str | None:
        """The rule that quarantined the measurement (this delivery or the first one)."""
        return self.outcome if self.outcome in QUARANTINE_RULES else None

    @property
    def applied(self) -> bool:
        """The completion was taken (now or before): not a mismatch, not waiting for its
        submission."""
        return self.outcome not in ("mismatch", "no_submission", "repeat")


def _result(event_id: str, code: int) -> ApplyResult:
    new = code < 100
    code = code if new else code - 100
    held = code > _AGGREGATE_HELD
    code = code - _AGGREGATE_HELD if held else code
    outcome = _OUTCOMES[code] if new else _OUTCOMES.get(code, "none")
    return ApplyResult(event_id, new, outcome, held)
