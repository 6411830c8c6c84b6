"""decode/encode: each failure kind, in the order the checks run, and what orjson does by itself."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from leap_stream.contracts import (
    MAX_DEPTH,
    DecodeError,
    Ok,
    decode,
    decode_many,
    encode,
    format_ts,
    load_schema,
    parse_ts,
    schema_dir,
    utc_now_iso,
    validate_event,
    validator,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
LIMIT = 1 << 20


def _example(name: str, file: str) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((EXAMPLES / name / "valid" / file).read_bytes())
    return doc


LLAMA = _example("job-submitted", "llama-70b-64xh100.json")
COMPLETED = _example("job-completed", "llama-70b-succeeded-h100.json")


def _sub(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(LLAMA)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for p in parents:
            node = node[p]
        node[leaf] = value
    return doc


def _err(raw: bytes | None, schema: str = "job-submitted", **kw: Any) -> DecodeError:
    result = decode(raw, schema, max_bytes=kw.pop("max_bytes", LIMIT), **kw)
    assert isinstance(result, DecodeError), result
    return result


def test_valid_event_decodes_to_the_same_dict() -> None:
    result = decode(encode(LLAMA), "job-submitted", max_bytes=LIMIT)
    assert isinstance(result, Ok)
    assert result.event == LLAMA


# --- size and bytes


def test_too_large_is_checked_before_parsing() -> None:
    raw = b"\xff" * 100  # would be not_utf8 if it were looked at
    err = _err(raw, max_bytes=99)
    assert err.kind == "too_large"
    assert "100 bytes" in err.message
    assert _err(raw, max_bytes=100).kind == "not_utf8"  # the limit itself is allowed


@pytest.mark.parametrize(
    "raw",
    [
        b'{"team": "\xff"}',  # not a UTF-8 byte
        b'{"team": "\xc3"}',  # truncated sequence
        b'{"team": "\xed\xa0\x80"}',  # encoded surrogate (CESU-8)
        b'{"team": "\xc0\xaf"}',  # overlong "/"
    ],
)
def test_invalid_utf8_is_not_utf8_and_orjson_agrees(raw: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)  # orjson requires valid UTF-8 too: our check only names the problem
    err = _err(raw)
    assert err.kind == "not_utf8"
    assert "byte 10" in err.message


def test_valid_non_ascii_is_fine() -> None:
    result = decode(encode(_sub(team="équipe-視覚")), "job-submitted", max_bytes=LIMIT)
    assert isinstance(result, Ok)
    assert result.event["team"] == "équipe-視覚"


# --- JSON


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"   ",
        b"{",
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"a": 1e400}',  # overflows a double
        b'{"a": "\\ud800"}',  # lone surrogate escape
        b"\xef\xbb\xbf{}",  # BOM
        b'{"a": 1} {"b": 2}',
        b"{'a': 1}",
    ],
)
def test_not_json(raw: bytes) -> None:
    assert _err(raw).kind == "not_json"


def test_none_payload_is_not_json() -> None:
    err = _err(None)
    assert err.kind == "not_json"
    assert "null" in err.message


def test_orjson_rejects_nesting_beyond_1024_by_itself() -> None:
    with pytest.raises(orjson.JSONDecodeError, match="depth"):
        orjson.loads(b"[" * 1025 + b"]" * 1025)
    assert _err(b"[" * 100_000 + b"]" * 100_000).kind == "not_json"


def test_nesting_beyond_max_depth_is_not_json() -> None:
    raw = b'{"team": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
    err = _err(raw)
    assert (err.kind, "nested deeper") == ("not_json", err.message[:13])
    ok_depth = b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1)
    assert _err(b'{"team": ' + ok_depth + b"}").kind == "schema"  # deep enough, still allowed


def test_many_brackets_that_are_not_deep_are_fine() -> None:
    raw = encode(_sub(z=[[[]] for _ in range(40)]))  # 80 brackets, 3 deep
    assert raw.count(b"[") > MAX_DEPTH
    err = _err(raw)
    assert (err.kind, "z" in err.message) == ("schema", True)  # got past the depth check


@pytest.mark.parametrize("literal", [b"9223372036854775808", b"18446744073709551616", b"-9223372036854775809", b"1" * 5000])  # fmt: skip
def test_integers_beyond_64_bits_are_not_json(literal: bytes) -> None:
    if len(literal) < 100:  # orjson itself turns them into floats without complaint
        assert isinstance(orjson.loads(literal), float | int)
    raw = encode(LLAMA).replace(b'"attempt":1', b'"attempt":' + literal)
    assert literal in raw
    err = _err(raw)
    assert err.kind == "not_json"
    # orjson refuses a literal too long for a double by itself; shorter ones are ours to catch
    assert ("64 bits" if len(literal) < 100 else "infinity") in err.message


def test_int64_edges_and_long_digit_strings_are_fine() -> None:
    # 64-bit integers parse (and then fail the schema's maximum), and digits in a string are text
    raw = encode(_sub(job_id="job-" + "1" * 60)).replace(
        b'"attempt":1', b'"attempt":9223372036854775807'
    )
    err = _err(raw)
    assert (err.kind, err.path) == ("schema", "data.attempt")
    assert isinstance(decode(encode(_sub(job_id="1" * 100)), "job-submitted", max_bytes=LIMIT), Ok)
    assert isinstance(
        decode(
            encode(_sub(model__parameters=12345678901234567890.5)), "job-submitted", max_bytes=LIMIT
        ),
        DecodeError,  # float, but above the schema's 1e14: the point is that it reached the schema
    )


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"x"', b"null", b"true", b"[{}]"])
def test_not_object(raw: bytes) -> None:
    assert _err(raw).kind == "not_object"


# --- schema


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"training__num_devices": 0}, "data.training.num_devices", "bigger than or equal to 1"),
        ({"training__num_devices": True}, "data.training.num_devices", "integer"),
        ({"model__family": "llm"}, "data.model.family", "one of"),
        ({"candidate_hardware": ["h100-sxm", "H200"]}, "data.candidate_hardware[1]", "pattern"),
        ({"schema_version": 2}, "data.schema_version", "1"),
        ({"team": ""}, "data.team", "longer than or equal to 1"),
    ],
)
def test_schema_error_has_precise_path(changes: dict[str, Any], path: str, words: str) -> None:
    err = _err(encode(_sub(**changes)))
    assert (err.kind, err.path, err.schema) == ("schema", path, "job-submitted")
    assert words in err.message


def test_schema_error_message_shows_the_value() -> None:
    err = _err(encode(_sub(training__tensor_parallel=4096)))
    assert "(got 4096)" in err.message


def test_missing_and_extra_fields() -> None:
    doc = _sub()
    del doc["model"]["layers"]
    err = _err(encode(doc))
    assert (err.path, "layers" in err.message) == ("data.model", True)
    err = _err(encode(_sub(model__experts=8)))
    assert (err.path, "experts" in err.message) == ("data.model", True)


def test_integer_valued_floats_become_ints() -> None:
    """8.0 is an integer to JSON Schema; downstream keys and range() must see 8."""
    raw = encode(_sub(attempt=3.0, training__num_devices=64.0, training__data_parallel=2.0))
    result = decode(raw, "job-submitted", max_bytes=LIMIT)
    assert isinstance(result, Ok)
    assert type(result.event["attempt"]) is int
    assert type(result.event["training"]["num_devices"]) is int
    assert result.event["attempt"] == 3
    assert type(result.event["model"]["parameters"]) is float  # a number field stays as it is


def test_integer_normalisation_reaches_arrays_of_objects() -> None:
    ranking = _example("hardware-ranking", "llama-70b-model-with-intervals.json")
    ranking["candidates"][1]["rank"] = 2.0
    result = decode(encode(ranking), "hardware-ranking", max_bytes=LIMIT)
    assert isinstance(result, Ok)
    assert type(result.event["candidates"][1]["rank"]) is int


def test_succeeded_completion_needs_throughput_but_failed_does_not() -> None:
    doc = copy.deepcopy(COMPLETED)
    del doc["throughput"]
    assert _err(encode(doc), "job-completed").kind == "schema"
    doc["status"] = "failed"
    assert isinstance(decode(encode(doc), "job-completed", max_bytes=LIMIT), Ok)


# --- semantic


@pytest.mark.parametrize(
    "changes, kind, path",
    [
        ({"default_hardware": "l4"}, "semantic", "data.default_hardware"),
        ({"training__tensor_parallel": 4}, "semantic", "data.training.num_devices"),
        ({"training__micro_batch_size": 2048}, "semantic", "data.training.micro_batch_size"),
        ({"model__active_parameters": 8e10}, "semantic", "data.model.active_parameters"),
        ({"candidate_hardware": ["h100-sxm", "nope-9"]}, "unknown_hardware", "data.candidate_hardware[1]"),
    ],
)  # fmt: skip
def test_submission_semantic_rules(changes: dict[str, Any], kind: str, path: str) -> None:
    err = _err(
        encode(_sub(**changes)), known_hardware={"h100-sxm", "h200", "mi300x", "tpu-v5p", "trn2"}
    )
    assert (err.kind, err.path) == (kind, path)


def test_active_parameters_equal_to_total_is_fine() -> None:
    raw = encode(_sub(model__active_parameters=LLAMA["model"]["parameters"]))
    assert isinstance(decode(raw, "job-submitted", max_bytes=LIMIT), Ok)


def test_known_hardware_none_skips_the_catalog_check_only() -> None:
    raw = encode(_sub(candidate_hardware=["h100-sxm", "nope-9"]))
    assert isinstance(decode(raw, "job-submitted", max_bytes=LIMIT), Ok)
    assert _err(raw, known_hardware=frozenset()).kind == "unknown_hardware"


def test_completion_semantic_rules() -> None:
    doc = copy.deepcopy(COMPLETED)
    doc["ended_at"] = doc["started_at"]  # zero duration is allowed
    assert isinstance(decode(encode(doc), "job-completed", max_bytes=LIMIT), Ok)
    # an offset that makes a later wall-clock time earlier in UTC
    doc["started_at"], doc["ended_at"] = "2026-12-02T13:00:00Z", "2026-12-02T13:30:00+01:00"
    err = _err(encode(doc), "job-completed")
    assert (err.kind, err.path) == ("semantic", "data.ended_at")
    doc["ended_at"] = "2026-12-02T15:30:00+01:00"
    err = _err(encode(doc), "job-completed", known_hardware={"a100-80g"})
    assert (err.kind, err.path) == ("unknown_hardware", "data.hardware_type")


def test_validate_event_checks_in_memory_events() -> None:
    assert validate_event(LLAMA, "job-submitted") is None
    problem = validate_event(_sub(default_hardware="l4"), "job-submitted")
    assert problem is not None and problem.kind == "semantic"


# --- never raises


def test_unknown_schema_name_is_internal_not_an_exception() -> None:
    err = _err(encode(LLAMA), "no-such-schema")
    assert err.kind == "internal"
    assert "no-such-schema" in err.message


def test_bytes_like_inputs() -> None:
    raw = encode(LLAMA)
    for value in (bytearray(raw), memoryview(raw)):
        assert isinstance(decode(value, "job-submitted", max_bytes=LIMIT), Ok)  # type: ignore[call-overload]


def test_decode_many_keeps_order() -> None:
    raws = [encode(LLAMA), b"{", None, encode(_sub(default_hardware="l4"))]
    kinds = [
        r.kind if isinstance(r, DecodeError) else "ok"
        for r in decode_many(raws, "job-submitted", max_bytes=LIMIT)
    ]
    assert kinds == ["ok", "not_json", "not_json", "semantic"]


def test_message_and_path_are_clipped_to_dead_letter_limits() -> None:
    raw = encode(LLAMA).replace(b'"attempt":1', b'"attempt":' + b"9" * 4000)
    assert len(_err(raw).message) <= 2048
    err = _err(encode(_sub(team="x" * 5000)))
    assert len(err.message) <= 2048


# --- schemas module


def test_compiling_does_not_change_the_loaded_schema() -> None:
    validator("job-submitted")
    on_disk = orjson.loads((schema_dir() / "job-submitted.schema.json").read_bytes())
    assert load_schema("job-submitted") == on_disk


def test_validator_does_not_insert_defaults() -> None:
    doc = copy.deepcopy(LLAMA)
    validator("job-submitted")(doc)
    assert doc == LLAMA


# --- encode and timestamps


def test_encode_is_compact_orjson_and_handles_numpy_scalars() -> None:
    np = pytest.importorskip("numpy")
    assert encode({"a": 1, "b": [1.5]}) == b'{"a":1,"b":[1.5]}'
    assert encode({"x": np.float64(2.5), "n": np.int64(3)}) == b'{"x":2.5,"n":3}'
    with pytest.raises(TypeError):
        encode({"x": object()})


@pytest.mark.parametrize(
    "text, epoch",
    [
        ("1970-01-01T00:00:00Z", 0.0),
        ("2026-12-02T13:14:00.123Z", 1796217240.123),
        ("2026-12-02T14:14:00.123+01:00", 1796217240.123),
        ("2026-12-02T13:14:00", 1796217240.0),  # no offset: UTC, not local time
    ],
)
def test_parse_ts(text: str, epoch: float) -> None:
    assert parse_ts(text) == pytest.approx(epoch, abs=1e-6)


def test_format_ts_milliseconds_z_and_round_trip() -> None:
    assert format_ts(0) == "1970-01-01T00:00:00.000Z"
    assert format_ts(1796217240.1239) == "2026-12-02T13:14:00.123Z"  # truncated, not rounded
    assert format_ts(1796217240.9999) == "2026-12-02T13:14:00.999Z"
    assert format_ts(-0.5) == "1969-12-31T23:59:59.500Z"
    for epoch in (1796217240.123, 1.0, 4102444799.999):
        assert parse_ts(format_ts(epoch)) == pytest.approx(epoch, abs=1e-6)


def test_utc_now_iso_is_a_valid_timestamp() -> None:
    now = utc_now_iso()
    assert now.endswith("Z") and len(now) == 24
    assert isinstance(decode(encode(_sub(submitted_at=now)), "job-submitted", max_bytes=LIMIT), Ok)
