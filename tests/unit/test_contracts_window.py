"""The time window: events dated outside it are dead letters of their own kind (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from leap_stream.contracts import TimeWindow, validate_event
from leap_stream.contracts.timestamps import format_ts
from leap_stream.stream.batch import Record, decode_records

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
T = NOW.timestamp()
DAY = 86_400.0


def _example(kind: str, name: str) -> dict[str, Any]:
    return dict(orjson.loads((ROOT / "schemas" / "examples" / kind / "valid" / name).read_bytes()))


def _submission(submitted_at: str) -> dict[str, Any]:
    return dict(_example("job-submitted", "llama-70b-64xh100.json"), submitted_at=submitted_at)


def _completion(started_at: str, ended_at: str) -> dict[str, Any]:
    c = _example("job-completed", "llama-70b-succeeded-h100.json")
    return dict(c, started_at=started_at, ended_at=ended_at)


WINDOW = TimeWindow(max_age_s=30 * DAY, max_lead_s=3600)


@pytest.mark.parametrize(
    "when",
    [
        "0001-01-01T00:00:00Z",  # before pandas' range
        "1677-09-21T00:00:00Z",
        "1996-05-01T00:00:00Z",  # decades old
        "2263-01-01T00:00:00Z",  # after pandas' range
        format_ts(T - 31 * DAY),
        format_ts(T + 2 * 3600),
    ],
)
def test_a_submission_outside_the_window_is_rejected(when: str) -> None:
    err = WINDOW.check(_submission(when), "job-submitted", T)
    assert err is not None and err.kind == "time_out_of_bounds"
    assert err.path == "data.submitted_at" and when in err.message


@pytest.mark.parametrize("when", [format_ts(T - 29 * DAY), format_ts(T), format_ts(T + 3000)])
def test_a_submission_inside_the_window_passes(when: str) -> None:
    assert WINDOW.check(_submission(when), "job-submitted", T) is None


def test_a_completion_from_the_future_is_rejected_but_a_long_job_is_not() -> None:
    future = _completion(format_ts(T - 3600), format_ts(T + 365 * DAY))
    err = WINDOW.check(future, "job-completed", T)
    assert err is not None and err.path == "data.ended_at"
    long_job = _completion(format_ts(T - 90 * DAY), format_ts(T - 60))
    assert WINDOW.check(long_job, "job-completed", T) is None
    ancient_start = _completion("1600-01-01T00:00:00Z", format_ts(T - 60))
    err = WINDOW.check(ancient_start, "job-completed", T)
    assert err is not None and err.path == "data.started_at"


def test_zero_switches_the_relative_bounds_off_but_not_the_fixed_range() -> None:
    off = TimeWindow(0, 0)
    assert off.check(_submission("1996-05-01T00:00:00Z"), "job-submitted", T) is None
    assert off.check(_submission("2150-01-01T00:00:00Z"), "job-submitted", T) is None
    for when in ("0001-01-01T00:00:00Z", "1677-09-21T00:00:00Z", "2263-01-01T00:00:00Z"):
        assert off.check(_submission(when), "job-submitted", T) is not None


def test_decode_records_dead_letters_out_of_window_events() -> None:
    ok = _submission(format_ts(T - 60))
    late = _submission("2263-01-01T00:00:00Z")
    records = [
        Record("s", 0, 1, None, orjson.dumps(ok)),
        Record("s", 0, 2, None, orjson.dumps(late)),
    ]
    good, dead = decode_records(records, "job-submitted", NOW, max_bytes=1 << 20, window=WINDOW)
    assert [r.offset for r, _ in good] == [1]
    assert [d["error"]["kind"] for d in dead] == ["time_out_of_bounds"]
    assert validate_event(dead[0], "dead-letter") is None
    # without a window (the default) the schema alone decides
    good, dead = decode_records(records, "job-submitted", NOW, max_bytes=1 << 20)
    assert len(good) == 2 and not dead
