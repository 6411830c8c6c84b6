"""Event contracts: the schemas compiled once, typed event dicts, ``decode``/``encode``, dead letters.

Pure (no I/O beyond reading the schema files once); the stream adapters call these.
"""

from leap_stream.contracts.codec import (
    DLQ_PAYLOAD_LIMIT,
    MAX_DEPTH,
    Decoded,
    DecodeError,
    Ok,
    decode,
    decode_many,
    encode,
    validate_event,
)
from leap_stream.contracts.dead_letter import dead_letter_event_id, make_dead_letter
from leap_stream.contracts.events import (
    DeadLetter,
    ErrorKind,
    Excluded,
    Exploration,
    HardwareRanking,
    Interval,
    JobCompleted,
    JobSubmitted,
    ModelSpec,
    RankedCandidate,
    Throughput,
    TrainingSpec,
)
from leap_stream.contracts.schemas import SCHEMA_NAMES, load_schema, schema_dir, validator
from leap_stream.contracts.timestamps import format_ts, parse_ts, utc_now_iso
from leap_stream.contracts.window import TimeWindow

__all__ = [
    "DLQ_PAYLOAD_LIMIT",
    "MAX_DEPTH",
    "SCHEMA_NAMES",
    "DeadLetter",
    "DecodeError",
    "Decoded",
    "ErrorKind",
    "Excluded",
    "Exploration",
    "HardwareRanking",
    "Interval",
    "JobCompleted",
    "JobSubmitted",
    "ModelSpec",
    "Ok",
    "RankedCandidate",
    "Throughput",
    "TimeWindow",
    "TrainingSpec",
    "dead_letter_event_id",
    "decode",
    "decode_many",
    "encode",
    "format_ts",
    "load_schema",
    "make_dead_letter",
    "parse_ts",
    "schema_dir",
    "utc_now_iso",
    "validate_event",
    "validator",
]
