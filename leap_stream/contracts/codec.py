"""Bytes from Kafka to a checked event dict, and back; pure, and ``decode`` never raises.

A worker must neither crash on bad input nor lose it, so every failure is a value
(``DecodeError``) whose ``kind`` is the dead-letter ``error.kind``. The checks run cheapest
first: size, UTF-8, JSON, nesting and integer range, schema (compiled fastjsonschema), then the
semantic rules a JSON Schema cannot say (cross-field arithmetic, the hardware catalog). In front
of that, a schema's fast path (``fastpath``, derived from the same schema) may say "certainly
valid" and skip the compiled validator; anything else takes the full route, so the answer,
including the error kind, message and path, is the one the compiled validator gives.

Things orjson does that we had to check for ourselves (see tests/unit/test_contracts_codec.py):
it rejects NaN/Infinity literals, invalid UTF-8, lone surrogate escapes and nesting deeper than
1024; but it turns integers beyond 64 bits into floats silently, so those are caught here, and we
keep nesting to ``MAX_DEPTH`` (our events are 3 deep) so nothing downstream recurses far.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar, cast, overload

import fastjsonschema
import orjson

from leap_stream.contracts.events import (
    DeadLetter,
    ErrorKind,
    HardwareCatalogDocument,
    HardwareRanking,
    JobCompleted,
    JobSubmitted,
)
from leap_stream.contracts.schemas import SCHEMA_NAMES, fast_validator, load_schema, validator
from leap_stream.contracts.timestamps import parse_ts

MAX_DEPTH: Final = 32
DLQ_PAYLOAD_LIMIT: Final = 64 * 1024  # bytes of the original payload kept in a dead letter
MAX_MESSAGE_CHARS: Final = 2048  # dead-letter error.message maxLength
MAX_PATH_CHARS: Final = 512  # dead-letter error.path maxLength

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
# A run of 19+ digits is the only way an integer literal can leave int64. Mapping digits to "0"
# and the rest to " " then a substring search is ~15x faster than the regex \d{19,}.
_DIGITS_TO_ZERO: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN: Final = b"0" * 19

E = TypeVar("E")


@dataclass(frozen=True, slots=True)
class Ok(Generic[E]):
    """A usable event: valid against its schema and the semantic rules."""

    event: E


@dataclass(frozen=True, slots=True)
class DecodeError:
    """Why an input was rejected; ``path`` is where (``data.training.num_devices``)."""

    kind: ErrorKind
    message: str
    path: str | None = None
    schema: str | None = None


Decoded: TypeAlias = Ok[Any] | DecodeError


# --- encode


def _default(obj: Any) -> Any:
    """numpy scalars (LightGBM output) become Python numbers; anything else is a bug."""
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def encode(event: Any) -> bytes:
    """orjson bytes. Does not validate: NaN becomes null, which ``validate_event`` would reject."""
    return orjson.dumps(event, default=_default)


# --- decode


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _err(kind: ErrorKind, message: str, path: str | None, schema: str) -> DecodeError:
    return DecodeError(
        kind, _clip(message), None if path is None else _clip(path, MAX_PATH_CHARS), schema
    )


def _too_deep(obj: Any) -> bool:
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


class _OversizedInt(Exception):
    pass


def _int64(literal: str) -> int:
    if len(literal) > 20:  # also keeps int() clear of the 4300-digit conversion limit
        raise _OversizedInt(literal)
    value = int(literal)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _OversizedInt(literal)
    return value


def _oversized_int(raw: bytes) -> str | None:
    """The first integer literal outside int64, if any (only called when a long digit run exists).

    orjson would have turned it into a float; the stdlib parser shows us the literal itself, and
    only for numbers (a long digit run inside a string is fine).
    """
    try:
        json.loads(raw, parse_int=_int64)
    except _OversizedInt as exc:
        return str(exc)
    except (ValueError, RecursionError):
        return None  # orjson accepted it: the stdlib's opinion on the rest does not matter
    return None


def _type_name(obj: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(obj), "number"
    )


def _decode(
    raw: Any,
    schema: str,
    max_bytes: int,
    known_hardware: Container[str] | None,
    fast: bool = True,
) -> Decoded:
    if raw is None:
        return _err("not_json", "no payload (null message value)", None, schema)
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    elif not isinstance(raw, bytes):
        raw = bytes(raw)
    size = len(raw)
    if size > max_bytes:
        return _err(
            "too_large",
            f"message is {size} bytes, larger than the limit of {max_bytes}",
            None,
            schema,
        )
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _err(
                "not_utf8", f"invalid UTF-8 at byte {exc.start}: {exc.reason}", None, schema
            )
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _err("not_json", str(exc) if size else "empty message", None, schema)
    if fast and (check := _fast_check(schema)) is not None and check(obj):
        # Certainly valid (see fastpath): an object no deeper than MAX_DEPTH whose integer fields
        # hold ints, so the nesting check, the object check and the normalisation are moot. The
        # int64 check is not: it reads the bytes, and a duplicate key hides a literal from obj.
        if _LONG_RUN in raw.translate(_DIGITS_TO_ZERO) and (lit := _oversized_int(raw)) is not None:
            return _err("not_json", f"integer {lit[:40]} does not fit in 64 bits", None, schema)
        return _semantic(obj, schema, known_hardware)
    if raw.count(b"{") + raw.count(b"[") > MAX_DEPTH and _too_deep(obj):
        return _err("not_json", f"nested deeper than {MAX_DEPTH} levels", None, schema)
    if _LONG_RUN in raw.translate(_DIGITS_TO_ZERO) and (literal := _oversized_int(raw)) is not None:
        return _err("not_json", f"integer {literal[:40]} does not fit in 64 bits", None, schema)
    if type(obj) is not dict:
        return _err("not_object", f"top level is {_type_name(obj)}, expected object", None, schema)
    return _validate(obj, schema, known_hardware)


_FAST: dict[str, Callable[[Any], bool] | None] = {}


def _fast_check(schema: str) -> Callable[[Any], bool] | None:
    """The schema's fast path, if it has one whose accepted values fit within ``MAX_DEPTH``."""
    try:
        return _FAST[schema]
    except KeyError:
        pass
    if schema not in SCHEMA_NAMES:
        return None  # _validate reports the unknown name
    fast = fast_validator(schema)
    check = _FAST[schema] = None if fast is None or fast.depth > MAX_DEPTH else fast.check
    return check


def _decode_plain(
    raw: bytes | None, schema: str, *, max_bytes: int, known_hardware: Container[str] | None = None
) -> Decoded:
    """``decode`` without the fast path: the reference the tests and the benchmark compare with."""
    try:
        return _decode(raw, schema, max_bytes, known_hardware, fast=False)
    except Exception as exc:
        return _err("internal", f"{type(exc).__name__}: {exc}", None, schema)


@overload
def decode(
    raw: bytes | None,
    schema: Literal["job-submitted"],
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
) -> Ok[JobSubmitted] | DecodeError: ...
@overload
def decode(
    raw: bytes | None,
    schema: Literal["job-completed"],
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
) -> Ok[JobCompleted] | DecodeError: ...
@overload
def decode(
    raw: bytes | None,
    schema: Literal["hardware-ranking"],
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
) -> Ok[HardwareRanking] | DecodeError: ...
@overload
def decode(
    raw: bytes | None,
    schema: Literal["dead-letter"],
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
) -> Ok[DeadLetter] | DecodeError: ...
@overload
def decode(
    raw: bytes | None,
    schema: Literal["hardware-catalog"],
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
) -> Ok[HardwareCatalogDocument] | DecodeError: ...
@overload
def decode(
    raw: bytes | None,
    schema: str,
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
) -> Decoded: ...
def decode(
    raw: bytes | None,
    schema: str,
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
) -> Decoded:
    """Check one message against ``schema`` (a name of ``SCHEMA_NAMES``). Never raises.

    ``known_hardware`` (e.g. the catalog): hardware ids outside it are ``unknown_hardware``;
    ``None`` skips that check. Anything unexpected inside is reported as kind ``internal``.
    """
    try:
        return _decode(raw, schema, max_bytes, known_hardware)
    except Exception as exc:  # the promise is "never raises": a bug here must not kill a worker
        return _err("internal", f"{type(exc).__name__}: {exc}", None, schema)


def decode_many(
    raws: Iterable[bytes | None],
    schema: str,
    *,
    max_bytes: int,
    known_hardware: Container[str] | None = None,
) -> list[Decoded]:
    """``decode`` over a batch, in order (one result per input)."""
    return [decode(r, schema, max_bytes=max_bytes, known_hardware=known_hardware) for r in raws]


def validate_event(
    event: Any, schema: str, *, known_hardware: Container[str] | None = None
) -> DecodeError | None:
    """Schema and semantic checks of an event built in memory (e.g. a ranking before encode).

    Like ``decode`` it turns integer-valued floats in integer fields into ints, in place. Always
    the compiled validator: the fast path is proven sound for JSON values (what orjson returns),
    not for any object built in memory.
    """
    try:
        result = _validate(event, schema, known_hardware)
    except Exception as exc:
        return _err("internal", f"{type(exc).__name__}: {exc}", None, schema)
    return result if isinstance(result, DecodeError) else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _validate(event: Any, schema: str, known_hardware: Container[str] | None) -> Decoded:
    try:
        validator(schema)(event)
    except fastjsonschema.JsonSchemaValueException as exc:
        message = exc.message
        if isinstance(exc.value, str | int | float | bool | None):
            message = f"{message} (got {_short(exc.value)})"
        return _err("schema", message, exc.name, schema)
    _normalise_integers(event, _integer_plan(schema))
    return _semantic(event, schema, known_hardware)


def _semantic(event: Any, schema: str, known_hardware: Container[str] | None) -> Decoded:
    check = _SEMANTIC.get(schema)
    if check is not None and (problem := check(event, known_hardware)) is not None:
        kind, message, path = problem
        return _err(kind, message, path, schema)
    return Ok(event)


# --- integers: JSON Schema calls 8.0 an integer; downstream code (Redis keys, range()) must not
# see a float. Which fields are integers is read from the schema once.

_Plan: TypeAlias = list[tuple[str, "_Plan | None", bool]]  # key, sub-plan (None: leaf), is array


def _types(node: dict[str, Any]) -> list[Any]:
    types = node.get("type")
    return types if isinstance(types, list) else [types]


def _plan_of(node: dict[str, Any], defs: dict[str, Any]) -> _Plan:
    plan: _Plan = []
    for key, prop in node.get("properties", {}).items():
        prop = _deref(prop, defs)
        if "integer" in _types(prop):
            plan.append((key, None, False))
        elif "object" in _types(prop):
            if sub := _plan_of(prop, defs):
                plan.append((key, sub, False))
        elif "array" in _types(prop) and isinstance(prop.get("items"), dict):
            items = _deref(prop["items"], defs)
            if "object" in _types(items) and (sub := _plan_of(items, defs)):
                plan.append((key, sub, True))
    return plan


def _deref(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved: dict[str, Any] = defs[ref.removeprefix("#/$defs/")]
        return resolved
    return node


_PLANS: dict[str, _Plan] = {}


def _integer_plan(schema: str) -> _Plan:
    plan = _PLANS.get(schema)
    if plan is None:
        doc = load_schema(schema)
        plan = _PLANS[schema] = _plan_of(doc, doc.get("$defs", {}))
    return plan


def _normalise_integers(obj: dict[str, Any], plan: _Plan) -> None:
    for key, sub, is_array in plan:
        value = obj.get(key)
        if value is None:
            continue
        if sub is None:
            if type(value) is float:
                obj[key] = int(value)
        elif is_array:
            for item in value:
                if type(item) is dict:
                    _normalise_integers(item, sub)
        elif type(value) is dict:
            _normalise_integers(value, sub)


# --- semantic rules (after the schema, so every field exists and has its type)

_Problem: TypeAlias = tuple[ErrorKind, str, str]  # kind, message, path


def _unknown(
    ids: Sequence[str], known: Container[str] | None, path: Callable[[int], str]
) -> _Problem | None:
    if known is None:
        return None
    if type(known) in (frozenset, set) and cast("frozenset[str]", known).issuperset(ids):
        return None  # the same membership test (no subclass) in one C loop: 1 µs → 0.3 for 20 ids
    for i, hw in enumerate(ids):
        if hw not in known:
            return "unknown_hardware", f"hardware type {hw!r} is not in the catalog", path(i)
    return None


def _check_submitted(ev: dict[str, Any], known: Container[str] | None) -> _Problem | None:
    candidates = ev["candidate_hardware"]
    if ev["default_hardware"] not in candidates:
        return (
            "semantic",
            f"default_hardware {ev['default_hardware']!r} is not one of candidate_hardware",
            "data.default_hardware",
        )
    t = ev["training"]
    dp, tp, pp, n = (
        t["data_parallel"],
        t["tensor_parallel"],
        t["pipeline_parallel"],
        t["num_devices"],
    )
    if dp * tp * pp != n:
        return (
            "semantic",
            f"data_parallel × tensor_parallel × pipeline_parallel = {dp}×{tp}×{pp} = {dp * tp * pp}"
            f", but num_devices = {n}",
            "data.training.num_devices",
        )
    if t["micro_batch_size"] > t["global_batch_size"]:
        return (
            "semantic",
            f"micro_batch_size {t['micro_batch_size']} > global_batch_size {t['global_batch_size']}",
            "data.training.micro_batch_size",
        )
    m = ev["model"]
    active = m.get("active_parameters")
    if active is not None and active > m["parameters"]:
        return (
            "semantic",
            f"active_parameters {active:g} > parameters {m['parameters']:g}",
            "data.model.active_parameters",
        )
    return _unknown(candidates, known, lambda i: f"data.candidate_hardware[{i}]")


def _check_completed(ev: dict[str, Any], known: Container[str] | None) -> _Problem | None:
    if parse_ts(ev["ended_at"]) < parse_ts(ev["started_at"]):
        return (
            "semantic",
            f"ended_at {ev['ended_at']} is before started_at {ev['started_at']}",
            "data.ended_at",
        )
    return _unknown([ev["hardware_type"]], known, lambda _i: "data.hardware_type")


def _check_ranking(ev: dict[str, Any], known: Container[str] | None) -> _Problem | None:
    candidates = ev["candidates"]
    seen: set[str] = set()
    for i, c in enumerate(candidates):
        if c["rank"] != i + 1:
            return (
                "semantic",
                f"candidate {i} has rank {c['rank']}, expected {i + 1} (best first, from 1)",
                f"data.candidates[{i}].rank",
            )
        if c["hardware_type"] in seen:
            return (
                "semantic",
                f"hardware type {c['hardware_type']!r} ranked twice",
                f"data.candidates[{i}].hardware_type",
            )
        seen.add(c["hardware_type"])
        tpc = c["throughput_per_cost"]
        expected = c["predicted_throughput"] * 3600 / (c["cost_per_device_hour"] * c["num_devices"])
        if abs(tpc - expected) > 1e-4 * expected:
            return (
                "semantic",
                f"throughput_per_cost {tpc} is not predicted_throughput × 3600 / "
                f"(cost_per_device_hour × num_devices) = {expected:.6g}",
                f"data.candidates[{i}].throughput_per_cost",
            )
        if i and tpc > candidates[i - 1]["throughput_per_cost"] * (1 + 1e-9):
            return (
                "semantic",
                f"candidate {i} has a higher throughput_per_cost than candidate {i - 1} "
                "(best first)",
                f"data.candidates[{i}].throughput_per_cost",
            )
        interval = c["interval"]
        if interval is not None and interval["low"] > interval["high"]:
            return (
                "semantic",
                f"interval low {interval['low']} > high {interval['high']}",
                f"data.candidates[{i}].interval",
            )
        if c.get("within_noise_of_best") and (not i or interval is None):
            return (
                "semantic",
                "within_noise_of_best needs an interval and is for candidates after the first",
                f"data.candidates[{i}].within_noise_of_best",
            )
    explore = ev.get("explore")
    if explore is not None and not any(
        c["hardware_type"] == explore["hardware_type"] and c.get("within_noise_of_best")
        for c in candidates
    ):
        return (
            "semantic",
            f"explore names {explore['hardware_type']!r}, not a candidate within_noise_of_best",
            "data.explore.hardware_type",
        )
    if (ev["source"] == "none") != (not candidates):
        return (
            "semantic",
            f"source {ev['source']!r} with {len(candidates)} candidates "
            "(none means no candidates, model/lookup at least one)",
            "data.source",
        )
    if ev["source"] == "model" and ev["model_version"] is None:
        return "semantic", "source 'model' needs a model_version", "data.model_version"
    return _unknown(
        [c["hardware_type"] for c in candidates], known, lambda i: f"data.candidates[{i}]"
    )


def _check_dead_letter(ev: dict[str, Any], _known: Container[str] | None) -> _Problem | None:
    try:
        payload = base64.b64decode(ev["payload_b64"], validate=True)
    except (binascii.Error, ValueError) as exc:
        return "semantic", f"payload_b64 is not base64: {exc}", "data.payload_b64"
    size, truncated = ev["payload_size"], ev["payload_truncated"]
    if truncated != (size > DLQ_PAYLOAD_LIMIT) or len(payload) != min(size, DLQ_PAYLOAD_LIMIT):
        return (
            "semantic",
            f"payload of {len(payload)} bytes (truncated={truncated}) does not match "
            f"payload_size {size} with the {DLQ_PAYLOAD_LIMIT}-byte limit",
            "data.payload_size",
        )
    if not truncated and hashlib.sha256(payload).hexdigest() != ev["payload_sha256"]:
        return "semantic", "payload_sha256 is not the sha256 of the payload", "data.payload_sha256"
    return None


def _check_catalog(ev: dict[str, Any], _known: Container[str] | None) -> _Problem | None:
    seen: set[str] = set()
    for i, hw in enumerate(ev["hardware"]):
        if hw["type_id"] in seen:
            return (
                "semantic",
                f"type_id {hw['type_id']!r} listed twice",
                f"data.hardware[{i}].type_id",
            )
        seen.add(hw["type_id"])
    return None


_SEMANTIC: dict[str, Callable[[dict[str, Any], Container[str] | None], _Problem | None]] = {
    "job-submitted": _check_submitted,
    "job-completed": _check_completed,
    "hardware-ranking": _check_ranking,
    "dead-letter": _check_dead_letter,
    "hardware-catalog": _check_catalog,
}

__all__ = [
    "DLQ_PAYLOAD_LIMIT",
    "MAX_DEPTH",
    "DecodeError",
    "Decoded",
    "Ok",
    "decode",
    "decode_many",
    "encode",
    "validate_event",
]
