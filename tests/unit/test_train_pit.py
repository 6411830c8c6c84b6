"""Point-in-time replay: a row only sees completions that ended before it was submitted."""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from leap_stream.contracts.timestamps import epoch_s
from leap_stream.train import pit


def _row(lin: str, hw: str, sub: str, end: str, sps: float, status: str = "succeeded") -> dict:
    return {
        "lineage_id": lin,
        "model_type": "m",
        "hardware_type": hw,
        "status": status,
        "samples_per_s": sps,
        "num_devices": 2,
        "submitted_at": pd.Timestamp(sub, tz="UTC"),
        "ended_at": pd.Timestamp(end, tz="UTC"),
    }


def test_row_sees_only_completions_ended_before_its_submission() -> None:
    d = pd.DataFrame(
        [
            _row("a", "l4", "2026-01-01T00:00", "2026-01-01T05:00", 10.0),
            _row("a", "l4", "2026-01-01T04:00", "2026-01-01T08:00", 20.0),  # sub before #0 ends
            _row("a", "h100", "2026-01-01T06:00", "2026-01-01T07:00", 50.0),
            _row("a", "l4", "2026-01-01T09:00", "2026-01-01T10:00", 30.0),
            _row("a", "l4", "2026-01-01T09:30", "2026-01-01T11:00", 0.0, "failed"),
        ]
    )
    snap = pit.replay(d, d)
    assert snap.histories[0] == {}
    assert snap.histories[1] == {}  # row 0 ends at 05:00, after row 1 was submitted
    assert snap.histories[2]["l4"].samples_per_s == pytest.approx(10.0)
    assert set(snap.histories[3]) == {"l4", "h100"}
    # the prior is the median of the recent per-device values: of two, their geometric mean
    assert snap.histories[3]["l4"].samples_per_s == pytest.approx(math.sqrt(10.0 * 20.0))
    assert snap.histories[3]["l4"].count == 2
    assert snap.aggregates[3]["l4"].count == 2
    assert len(pit.measured(d)) == 4


def test_replayed_measured_at_is_what_redis_stores_bit_for_bit() -> None:
    """Redis stores ``measured_at`` as epoch_s(ended_at) (ns / 1e9); the replay must too, or
    training sees a history that serving never does (pandas' total_seconds() differs in the
    last bit for about a quarter of millisecond timestamps)."""
    ends = pd.Timestamp("2026-11-01T00:00:00.001Z") + pd.to_timedelta(range(0, 4000, 7), "ms")
    rows = [_row(f"l{i}", "l4", "2026-10-31T00:00", str(end), 10.0) for i, end in enumerate(ends)]
    d = pd.DataFrame(rows)
    later = d.assign(submitted_at=pd.Timestamp("2026-12-01", tz="UTC"))
    snap = pit.replay(d, later)
    got = [h["l4"].measured_at for h in snap.histories]
    assert got == [epoch_s(end) for end in ends]


def test_finish_replays_every_completion_for_its_verdict() -> None:
    rows = [_row("a", "l4", "2026-01-01T00:00", f"2026-01-01T0{i}:00", 10.0) for i in range(1, 5)]
    rows.append(_row("a", "l4", "2026-01-01T00:00", "2026-01-01T06:00", 10_000.0))
    d = pd.DataFrame(rows)
    assert list(pit.replay(d, d).verdicts) == ["none"] * 5  # all ended after every query
    assert list(pit.replay(d, d, finish=True).verdicts) == ["accepted"] * 4 + ["lineage"]


def test_collector_paused_restores_the_collector_as_it_found_it() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), pit.collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a replay that fails still gives the collector back")
    assert gc.isenabled()
    gc.disable()
    try:
        with pit.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # whoever turned it off keeps it off
    finally:
        gc.enable()


def test_replay_pauses_the_collector_for_the_replayer_too(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    original = pit.replay_chunks

    def spy(*args: object, **kwargs: object) -> Iterator[tuple[Any, pit.Snapshots]]:
        for piece in original(*args, **kwargs):  # type: ignore[arg-type]
            seen.append(gc.isenabled())
            yield piece

    monkeypatch.setattr(pit, "replay_chunks", spy)
    rep = pit.Replayer()
    rows = pd.DataFrame([_row("a", "l4", "2026-01-01T00:00", "2026-01-01T01:00", 10.0)])
    rep.add_completions(rows)
    rep.snapshot(rows.assign(submitted_at=pd.Timestamp("2026-01-02", tz="UTC")))
    assert seen == [False]
    assert gc.isenabled()
