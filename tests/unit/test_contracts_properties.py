"""Property tests: ``decode`` never raises, valid events round-trip, and the compiled validator
agrees with the reference 2020-12 validator on mutated events."""

from __future__ import annotations

import copy
import json
import string
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from leap_stream.catalog import load_catalog
from leap_stream.contracts import (
    DecodeError,
    Ok,
    decode,
    encode,
    format_ts,
    load_schema,
    parse_ts,
    validator,
)
from leap_stream.contracts.events import ErrorKind

LIMIT = 1 << 20
HARDWARE = list(load_catalog().types)
KINDS = set(ErrorKind.__args__)  # type: ignore[attr-defined]
SCHEMAS = ["job-submitted", "job-completed", "hardware-ranking", "dead-letter"]

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ids = st.text(string.ascii_letters + string.digits + "._:/-", min_size=1, max_size=48)
names = st.text(min_size=1, max_size=30).filter(lambda s: len(s) <= 30)
offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
timestamps = st.builds(
    lambda dt, tz, spec: dt.astimezone(tz).isoformat(timespec=spec).replace("+00:00", "Z"),
    st.datetimes(datetime(1971, 1, 1), datetime(2099, 12, 31), timezones=st.just(UTC)),
    offsets,
    st.sampled_from(["seconds", "milliseconds", "microseconds"]),
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # beyond 64 bits too
    | st.floats()  # NaN and infinities too (the stdlib writes NaN/Infinity literals)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def submissions(draw: st.DrawFn) -> dict[str, Any]:
    candidates = draw(st.lists(st.sampled_from(HARDWARE), min_size=1, max_size=8, unique=True))
    dp, tp, pp = draw(st.integers(1, 64)), draw(st.integers(1, 16)), draw(st.integers(1, 16))
    global_batch = draw(st.integers(1, 100_000_000))
    parameters = draw(st.floats(1e3, 1e14))
    model: dict[str, Any] = {
        "family": draw(
            st.sampled_from(["dense_llm", "moe_llm", "encoder", "vision_cnn", "recsys"])
        ),
        "model_type": draw(names),
        "parameters": parameters,
        "layers": draw(st.integers(1, 10_000)),
        "hidden_size": draw(st.integers(1, 1_000_000)),
        "sequence_length": draw(st.integers(1, 10_000_000)),
        "precision": draw(st.sampled_from(["fp32", "tf32", "fp16", "bf16", "fp8"])),
        "optimizer": draw(st.sampled_from(["adamw", "sgd", "lion"])),
        "framework": draw(st.sampled_from(["pytorch", "jax", "tensorflow"])),
        "framework_version": draw(st.text(string.digits + ".", min_size=1, max_size=12)),
    }
    if draw(st.booleans()):
        model["active_parameters"] = parameters * draw(st.floats(1e-6, 1.0))
    return {
        "schema_version": 1,
        "event_id": draw(ids),
        "job_id": draw(ids),
        "attempt": draw(st.integers(1, 100_000)),
        "lineage_id": draw(ids),
        "submitted_at": draw(timestamps),
        "team": draw(names),
        "model": model,
        "training": {
            "global_batch_size": global_batch,
            "micro_batch_size": draw(st.integers(1, min(global_batch, 10_000_000))),
            "num_devices": dp * tp * pp,
            "data_parallel": dp,
            "tensor_parallel": tp,
            "pipeline_parallel": pp,
            "activation_checkpointing": draw(st.booleans()),
        },
        "candidate_hardware": candidates,
        "default_hardware": draw(st.sampled_from(candidates)),
    }


@st.composite
def completions(draw: st.DrawFn) -> dict[str, Any]:
    started = draw(timestamps)
    ended = draw(timestamps)
    if parse_ts(ended) < parse_ts(started):
        started, ended = ended, started
    status = draw(st.sampled_from(["succeeded", "failed", "preempted"]))
    event: dict[str, Any] = {
        "schema_version": 1,
        "event_id": draw(ids),
        "job_id": draw(ids),
        "attempt": draw(st.integers(1, 100_000)),
        "lineage_id": draw(ids),
        "model_type": draw(names),
        "hardware_type": draw(st.sampled_from(HARDWARE)),
        "num_devices": draw(st.integers(1, 100_000)),
        "steps": draw(st.integers(0, 10**12)),
        "started_at": started,
        "ended_at": ended,
        "status": status,
        "device_hours": draw(st.floats(0, 1e9)),
    }
    if status == "succeeded" or draw(st.booleans()):
        throughput = {"samples_per_s": draw(st.floats(1e-6, 1e12))}
        if draw(st.booleans()):
            throughput["tokens_per_s"] = draw(st.floats(1e-6, 1e15))
        event["throughput"] = throughput
    return event


@FAST
@given(raw=st.binary(max_size=3000), schema=st.sampled_from(SCHEMAS))
def test_decode_never_raises_on_bytes(raw: bytes, schema: str) -> None:
    result = decode(raw, schema, max_bytes=2000, known_hardware=HARDWARE)
    assert isinstance(result, DecodeError)  # random bytes are never a valid event
    assert result.kind in KINDS and result.kind != "internal", result


@FAST
@given(value=json_values, schema=st.sampled_from(SCHEMAS))
def test_decode_never_raises_on_json_values(value: Any, schema: str) -> None:
    raw = json.dumps(value).encode()  # may contain NaN, Infinity, integers beyond 64 bits
    result = decode(raw, schema, max_bytes=LIMIT, known_hardware=HARDWARE)
    assert isinstance(result, DecodeError)
    assert result.kind in ("not_json", "not_object", "schema"), result


@FAST
@given(event=submissions())
def test_valid_submissions_round_trip(event: dict[str, Any]) -> None:
    result = decode(encode(event), "job-submitted", max_bytes=LIMIT, known_hardware=HARDWARE)
    assert isinstance(result, Ok), result
    assert result.event == event


@FAST
@given(event=completions())
def test_valid_completions_round_trip(event: dict[str, Any]) -> None:
    result = decode(encode(event), "job-completed", max_bytes=LIMIT, known_hardware=HARDWARE)
    assert isinstance(result, Ok), result
    assert result.event == event


def _leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaf_paths(v, (*prefix, k))] + [prefix]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaf_paths(v, (*prefix, i))] + [prefix]
    return [prefix]


REFERENCE = {
    name: jsonschema.Draft202012Validator(
        load_schema(name), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for name in ("job-submitted", "job-completed")
}


def _fast_ok(name: str, event: Any) -> bool:
    try:
        validator(name)(copy.deepcopy(event))
    except Exception:
        return False
    return True


@pytest.mark.parametrize(
    "name, events", [("job-submitted", submissions()), ("job-completed", completions())]
)
@FAST
@given(data=st.data())
def test_compiled_validator_agrees_with_reference(
    name: str, events: Any, data: st.DataObject
) -> None:
    """Replace or delete one part of a valid event: both validators must give the same verdict.

    Two known, deliberate differences are kept out: our date-time is stricter (see schemas.py),
    and the reference lets a ``$`` pattern match before a trailing newline (Python ``re``) where
    fastjsonschema, like ECMA-262, does not. Both make our validator the stricter one.
    """
    event = data.draw(events)
    path = data.draw(st.sampled_from([p for p in _leaf_paths(event) if p]))
    node = event
    for part in path[:-1]:
        node = node[part]
    if data.draw(st.booleans()) and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = data.draw(json_values)
    fast, reference = _fast_ok(name, event), REFERENCE[name].is_valid(event)
    if fast != reference:
        assert not fast, f"we accept what the reference rejects: {path}"
        text = json.dumps(event)
        assert path[-1] in ("submitted_at", "started_at", "ended_at") or "\\n" in text, path


@settings(max_examples=500, deadline=None)
@given(millis=st.integers(0, 4102444799999))
@example(
    millis=2183226373411
)  # 2183226373.411 is ...410999 as a double: plain truncation says .410
def test_format_ts_round_trips_every_millisecond(millis: int) -> None:
    text = format_ts(millis / 1000)
    assert text[-4:-1] == f"{millis % 1000:03d}"
    assert format_ts(parse_ts(text)) == text
    assert round(parse_ts(text) * 1000) == millis
