"""Dead letters: valid against their schema, payload kept (or truncated with its digest), stable ids."""

from __future__ import annotations

import base64
import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from leap_stream.contracts import (
    DLQ_PAYLOAD_LIMIT,
    DecodeError,
    Ok,
    decode,
    encode,
    make_dead_letter,
    parse_ts,
    validate_event,
)
from leap_stream.contracts.events import ErrorKind

NOW = parse_ts("2026-12-02T13:14:00.123Z")
ERROR = DecodeError("not_json", "unexpected end of data", None, "job-submitted")
KINDS = list(ErrorKind.__args__)  # type: ignore[attr-defined]


def _dlq(raw: bytes | None, offset: int = 42, **kw: object) -> dict[str, object]:
    args: dict[str, object] = {
        "topic": "leap.job-submissions",
        "partition": 3,
        "offset": offset,
        "key": b"job-1",
        "error": ERROR,
        "now": NOW,
    }
    args.update(kw)
    return dict(make_dead_letter(raw, **args))  # type: ignore[arg-type]


def test_small_payload_is_kept_whole() -> None:
    raw = b'{"job_id": "job-1", '
    dlq = _dlq(raw)
    assert validate_event(dlq, "dead-letter") is None
    assert base64.b64decode(str(dlq["payload_b64"])) == raw
    assert dlq["payload_size"] == len(raw)
    assert dlq["payload_truncated"] is False
    assert dlq["payload_sha256"] == hashlib.sha256(raw).hexdigest()
    assert dlq["failed_at"] == "2026-12-02T13:14:00.123Z"
    assert dlq["source"] == {
        "topic": "leap.job-submissions",
        "partition": 3,
        "offset": 42,
        "key_b64": base64.b64encode(b"job-1").decode(),
    }
    assert dlq["error"] == {
        "kind": "not_json",
        "message": "unexpected end of data",
        "path": None,
        "schema": "job-submitted",
    }


def test_large_payload_is_truncated_to_64_kib_with_digest_of_the_whole() -> None:
    raw = bytes(range(256)) * 1000  # 256 000 bytes, not UTF-8
    dlq = _dlq(raw, error=DecodeError("too_large", "too big", None, "job-submitted"))
    assert validate_event(dlq, "dead-letter") is None
    kept = base64.b64decode(str(dlq["payload_b64"]))
    assert kept == raw[:DLQ_PAYLOAD_LIMIT]
    assert dlq["payload_truncated"] is True
    assert dlq["payload_size"] == len(raw)
    assert dlq["payload_sha256"] == hashlib.sha256(raw).hexdigest()


def test_exactly_64_kib_is_not_truncated() -> None:
    dlq = _dlq(b"x" * DLQ_PAYLOAD_LIMIT)
    assert dlq["payload_truncated"] is False
    assert validate_event(dlq, "dead-letter") is None


def test_none_payload_and_none_key() -> None:
    dlq = _dlq(None, key=None)
    assert (dlq["payload_b64"], dlq["payload_size"]) == ("", 0)
    assert dlq["source"]["key_b64"] is None  # type: ignore[index]
    assert validate_event(dlq, "dead-letter") is None


def test_event_id_is_deterministic_from_where_the_message_was_read() -> None:
    a = _dlq(b"{", offset=7)
    again = _dlq(b"{", offset=7, now=NOW + 60, error=DecodeError("internal", "retry"))
    assert a["event_id"] == again["event_id"]
    assert _dlq(b"{", offset=8)["event_id"] != a["event_id"]
    assert _dlq(b"{", offset=7, partition=2)["event_id"] != a["event_id"]
    assert _dlq(b"{", offset=7, topic="leap.job-completions")["event_id"] != a["event_id"]


def test_unknown_offset_falls_back_to_the_payload_digest() -> None:
    assert _dlq(b"a", offset=-1)["event_id"] != _dlq(b"b", offset=-1)["event_id"]
    assert _dlq(b"a", offset=-1)["event_id"] == _dlq(b"a", offset=-1)["event_id"]


def test_long_topic_and_long_error_text_still_fit_the_schema() -> None:
    dlq = _dlq(
        b"{}",
        topic="t" * 249,
        error=DecodeError("schema", "m" * 5000, "p" * 900, "s" * 100),
    )
    assert validate_event(dlq, "dead-letter") is None


def test_dead_letter_round_trips_through_decode() -> None:
    dlq = _dlq(b"\xff\xfe not even utf-8")
    result = decode(encode(dlq), "dead-letter", max_bytes=1 << 20)
    assert isinstance(result, Ok)
    assert result.event == dlq


@settings(max_examples=100, deadline=None)
@given(
    raw=st.none() | st.binary(max_size=70_000),
    key=st.none() | st.binary(max_size=300),
    topic=st.text(min_size=1, max_size=249),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(-1, 2**63 - 1),
    kind=st.sampled_from(KINDS),
    message=st.text(max_size=3000),
    path=st.none() | st.text(max_size=600),
    now=st.floats(0, 4e9),
)
def test_any_dead_letter_is_valid(
    raw: bytes | None,
    key: bytes | None,
    topic: str,
    partition: int,
    offset: int,
    kind: ErrorKind,
    message: str,
    path: str | None,
    now: float,
) -> None:
    dlq = make_dead_letter(
        raw,
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        error=DecodeError(kind, message, path, "job-completed"),
        now=now,
    )
    assert validate_event(dlq, "dead-letter") is None
