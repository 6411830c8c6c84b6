"""Dead-letter events: rejected input with the reason and the original bytes (pure).

Nothing disappears: the payload is kept (base64; its first 64 KiB when larger, with the sha256
and size of the whole) so it can be inspected or replayed. The event id is derived from where the
message was read, so re-processing the same message after a crash produces the same dead letter
id and consumers of the dead-letter topic can de-duplicate.
"""

from __future__ import annotations

import base64
import hashlib

from leap_stream.contracts.codec import (
    DLQ_PAYLOAD_LIMIT,
    MAX_MESSAGE_CHARS,
    MAX_PATH_CHARS,
    DecodeError,
)
from leap_stream.contracts.events import DeadLetter, DeadLetterError, DeadLetterSource
from leap_stream.contracts.timestamps import format_ts

_MAX_SCHEMA_CHARS = 64


def dead_letter_event_id(topic: str, partition: int, offset: int, payload_sha256: str) -> str:
    """``dlq-<32 hex>`` from topic/partition/offset; an unknown offset (< 0) also hashes the payload."""
    basis = f"{topic}\x00{partition}\x00{offset}"
    if offset < 0:
        basis += "\x00" + payload_sha256
    return (
        "dlq-" + hashlib.blake2b(basis.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    )


def make_dead_letter(
    raw: bytes | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    error: DecodeError,
    now: float,
) -> DeadLetter:
    """The dead-letter event for ``raw`` read at topic/partition/offset, valid against its schema."""
    payload = b"" if raw is None else bytes(raw)
    digest = hashlib.sha256(payload).hexdigest()
    kept = payload[:DLQ_PAYLOAD_LIMIT]
    err: DeadLetterError = {
        "kind": error.kind,
        "message": error.message[:MAX_MESSAGE_CHARS],
        "path": None if error.path is None else error.path[:MAX_PATH_CHARS],
        "schema": None if error.schema is None else error.schema[:_MAX_SCHEMA_CHARS],
    }
    source: DeadLetterSource = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key_b64": None if key is None else base64.b64encode(key).decode("ascii"),
    }
    return {
        "schema_version": 1,
        "event_id": dead_letter_event_id(topic, partition, offset, digest),
        "failed_at": format_ts(now),
        "source": source,
        "error": err,
        "payload_b64": base64.b64encode(kept).decode("ascii"),
        "payload_size": len(payload),
        "payload_truncated": len(payload) > DLQ_PAYLOAD_LIMIT,
        "payload_sha256": digest,
    }


__all__ = ["dead_letter_event_id", "make_dead_letter"]
