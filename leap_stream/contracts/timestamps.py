"""Timestamps, one way: RFC 3339 strings on the wire, epoch seconds (float64, ns / 1e9) in the
history, pandas UTC timestamps in the dataset. Every conversion of the project lives here, so
the history the trainer replays is bit for bit the one Redis stores."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

TimeLike = str | date | datetime | pd.Timestamp


def parse_ts(value: str) -> float:
    """RFC 3339 → epoch seconds. A timestamp without an offset is taken as UTC, never local."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def format_ts(value: float | datetime) -> str:
    """Epoch seconds or a datetime → ``2026-12-02T13:14:00.123Z`` (milliseconds, truncated, UTC).

    Rounded to the microsecond first: 1796217240.003 is 1796217240.00299... as a double, and
    plain truncation would print .002, so format_ts(parse_ts(s)) would not give s back.
    """
    if isinstance(value, datetime):
        value = value.astimezone(UTC)
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    seconds, micros = divmod(round(value * 1_000_000), 1_000_000)
    millis = micros // 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def utc_now_iso() -> str:
    return format_ts(time.time())


def isoformat_z(value: Any) -> str:
    """Full-precision ISO 8601 with ``Z`` (model metadata: data windows must compare exactly)."""
    return str(pd.Timestamp(value).isoformat()).replace("+00:00", "Z")


def to_ns(value: TimeLike) -> int:
    """Epoch nanoseconds (UTC) of an RFC 3339 string or a date/time; naive values are UTC.

    Fast path through ``datetime.fromisoformat``: this runs three times per dataset row.
    """
    if isinstance(value, pd.Timestamp):
        return int(value.value)  # UTC ns for aware values, wall time as UTC for naive ones
    if isinstance(value, str):
        dot = value.find(".")
        if dot != -1 and len(value) > dot + 7 and value[dot + 7].isdigit():
            return int(pd.Timestamp(value).value)  # sub-µs digits: fromisoformat would truncate
        dt = datetime.fromisoformat(value)
    elif isinstance(value, datetime):
        dt = value
    else:
        dt = datetime(value.year, value.month, value.day)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return ((dt - _EPOCH) // _US) * 1000


def to_timestamp(value: TimeLike) -> pd.Timestamp:
    """RFC 3339 or a date/time → pandas UTC timestamp; a naive value is taken as UTC."""
    if isinstance(value, pd.Timestamp) and value.tzinfo is UTC:
        return value
    return pd.Timestamp(to_ns(value), tz=UTC)


def epoch_s(value: TimeLike) -> float:
    """Epoch seconds, the unit of `Measurement.measured_at`: ``ended_at`` as ns / 1e9."""
    return to_ns(value) / 1e9


def epoch_seconds(col: pd.Series) -> npt.NDArray[np.float64]:
    """Vectorised `epoch_s` for a timestamp column (tz-aware or naive UTC, any unit): the same
    float64 bit for bit (ns / 1e9; pandas' ``total_seconds()`` differs in the last bit for about
    a quarter of millisecond values)."""
    ns = pd.to_datetime(col, utc=True).dt.as_unit("ns").astype("int64").to_numpy()
    return np.asarray(ns / 1e9, dtype=np.float64)


def epoch_ms(col: pd.Series) -> npt.NDArray[np.int64]:
    """Epoch milliseconds of a UTC timestamp column."""
    naive = col.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
    return np.asarray(naive.astype("datetime64[ms]").astype(np.int64))


def format_column(col: pd.Series) -> list[str]:
    """Vectorised `format_ts` for a UTC timestamp column."""
    values = col.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy().astype("datetime64[ms]")
    return [s + "Z" for s in np.datetime_as_string(values, unit="ms").tolist()]


__all__ = [
    "epoch_ms",
    "epoch_s",
    "epoch_seconds",
    "format_column",
    "format_ts",
    "isoformat_z",
    "parse_ts",
    "to_ns",
    "to_timestamp",
    "utc_now_iso",
]
