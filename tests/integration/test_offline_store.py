"""The Parquet dataset on a real file system: atomic, idempotent appends; de-duplicated reads."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from leap_stream.store.offline import (
    DATASET_COLUMNS,
    DatasetSink,
    compact,
    flatten,
    read_dataset,
)
from leap_stream.tools import synthetic_events as synthetic


def _rows(n: int, seed: int = 0) -> list[dict]:
    return [flatten(s, c) for s, c in synthetic.pairs(n, seed=seed)]


def _files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet"))


def test_append_partitions_by_submission_day_and_reads_back(tmp_path: Path) -> None:
    rows = _rows(300)
    written = DatasetSink(tmp_path).append(rows)
    days = {r["submitted_at"].strftime("%Y-%m-%d") for r in rows}
    assert {p.parent.name for p in written} == {f"day={d}" for d in days}
    assert len(written) == len(days)
    for path in written:
        day = path.parent.name.removeprefix("day=")
        sub = pq.read_table(path).column("submitted_at").to_pandas()
        assert (sub.dt.strftime("%Y-%m-%d") == day).all()

    frame = read_dataset(tmp_path)
    assert list(frame.columns) == list(DATASET_COLUMNS)
    assert len(frame) == 300
    assert str(frame["submitted_at"].dtype) == "datetime64[ns, UTC]"
    got = frame.set_index("event_id").loc[rows[5]["event_id"]]
    assert got["ended_at"] == rows[5]["ended_at"]
    assert got["num_devices"] == rows[5]["num_devices"]
    if math.isnan(rows[5]["samples_per_s"]):
        assert math.isnan(got["samples_per_s"])
    else:
        assert got["samples_per_s"] == rows[5]["samples_per_s"]


def test_same_batch_twice_is_one_file(tmp_path: Path) -> None:
    rows = _rows(40, seed=1)
    sink = DatasetSink(tmp_path)
    first = sink.append(rows)
    second = sink.append(list(reversed(rows)))  # same event ids, other order: same names
    assert first == second
    assert _files(tmp_path) == sorted(first)
    assert len(read_dataset(tmp_path)) == 40


def test_crash_repeat_with_other_batching_never_duplicates(tmp_path: Path) -> None:
    rows = _rows(100, seed=2)
    sink = DatasetSink(tmp_path)
    sink.append(rows[:60])  # written, offsets not committed, crash
    sink.append(rows[30:])  # the restart re-reads 30.. and batches differently
    (tmp_path / "day=2026-11-21").mkdir(exist_ok=True)
    (tmp_path / "day=2026-11-21" / ".tmp-crashed.parquet").write_bytes(b"PAR1 half a file")
    frame = read_dataset(tmp_path)
    assert len(frame) == 100
    assert frame["event_id"].is_unique
    assert set(frame["event_id"]) == {r["event_id"] for r in rows}


def test_duplicate_keeps_the_earliest_file(tmp_path: Path) -> None:
    [row] = _rows(1, seed=3)
    sink = DatasetSink(tmp_path)
    sink.append([row])
    later = dict(row, steps=row["steps"] + 1)
    other = dict(row, event_id="done-other")  # same day: a different batch, another file
    sink.append([later, other])
    assert len(_files(tmp_path)) == 2
    frame = read_dataset(tmp_path).set_index("event_id")
    assert frame.loc[row["event_id"], "steps"] == row["steps"]


def test_a_compact_read_of_some_columns_holds_the_same_values(tmp_path: Path) -> None:
    """What training reads (trainer.TRAINING_COLUMNS, categorical): the same rows and values,
    strings as categoricals, integers as int32, still one row per event id."""
    rows = _rows(300, seed=7)
    sink = DatasetSink(tmp_path)
    sink.append(rows[:200])
    sink.append(rows[150:])  # a redelivered stretch: 50 rows twice, in other files
    full = read_dataset(tmp_path).set_index("event_id").sort_index()
    columns = ["lineage_id", "model_type", "status", "num_devices", "samples_per_s", "ended_at"]
    small = read_dataset(tmp_path, columns=[*columns, "event_id"], categorical=True)
    assert list(small.columns) == [*columns, "event_id"] and len(small) == 300
    assert isinstance(small["model_type"].dtype, pd.CategoricalDtype)
    assert str(small["num_devices"].dtype) == "int32"
    small = small.set_index("event_id").sort_index()
    for c in columns:
        assert small[c].astype(full[c].dtype).equals(full[c]), c
    without_id = read_dataset(tmp_path, columns=columns, categorical=True)
    assert list(without_id.columns) == columns and len(without_id) == 300
    with pytest.raises(ValueError, match="not dataset columns"):
        read_dataset(tmp_path, columns=["lineage_id", "colour"])


def test_time_window(tmp_path: Path) -> None:
    rows = _rows(200, seed=5)
    DatasetSink(tmp_path).append(rows)
    start, end = pd.Timestamp("2026-11-22T12:00:00Z"), pd.Timestamp("2026-11-25T00:00:00Z")
    frame = read_dataset(tmp_path, start=start, end=end)
    want = {r["event_id"] for r in rows if start <= r["submitted_at"] < end}
    assert set(frame["event_id"]) == want and len(frame) == len(want) > 0
    assert len(read_dataset(tmp_path, end="2026-11-22")) == sum(
        r["submitted_at"] < pd.Timestamp("2026-11-22T00:00:00Z") for r in rows
    )


def test_compact_rewrites_one_partition(tmp_path: Path) -> None:
    rows = _rows(120, seed=6)
    sink = DatasetSink(tmp_path)
    for i in range(0, 120, 25):
        sink.append(rows[i : i + 40])  # overlapping batches: duplicates on disk
    day = rows[0]["submitted_at"].strftime("%Y-%m-%d")
    folder = tmp_path / f"day={day}"
    assert len(list(folder.glob("*.parquet"))) > 1
    before = read_dataset(tmp_path)
    out = compact(tmp_path, day)
    assert out is not None and list(folder.glob("*.parquet")) == [out]
    assert pq.read_table(out).num_rows == sum(
        r["submitted_at"].strftime("%Y-%m-%d") == day for r in rows
    )
    after = read_dataset(tmp_path)
    key = ["event_id"]
    pd.testing.assert_frame_equal(
        before.sort_values(key).reset_index(drop=True),
        after.sort_values(key).reset_index(drop=True),
    )
    assert compact(tmp_path, day) == out  # idempotent
    assert compact(tmp_path, "2001-01-01") is None


def test_reads_the_simulators_single_file(tmp_path: Path) -> None:
    rows = _rows(30, seed=7)
    frame = pd.DataFrame(rows)
    for col in ("submitted_at", "started_at", "ended_at"):  # a writer with other defaults
        frame[col] = frame[col].dt.tz_localize(None).astype("datetime64[us]")
    frame["attempt"] = frame["attempt"].astype("int32")
    frame["extra_sim_column"] = 1
    path = tmp_path / "dataset.parquet"
    frame.to_parquet(path, index=False)
    got = read_dataset(path)
    assert list(got.columns) == list(DATASET_COLUMNS)
    assert str(got["ended_at"].dtype) == "datetime64[ns, UTC]"
    assert got["ended_at"].iloc[3] == rows[3]["ended_at"]
    assert len(read_dataset(path, start="2026-11-25")) == sum(
        r["submitted_at"] >= pd.Timestamp("2026-11-25T00:00:00Z") for r in rows
    )
    assert read_dataset(tmp_path / "missing").empty


def test_simulator_dataset_equals_flattened_simulator_events(tmp_path: Path) -> None:
    """The contract both ways: the simulator's dataset.parquet is what the worker would write."""
    import orjson

    from leap_stream.tools.sim.config import SimConfig
    from leap_stream.tools.sim.events import write_jsonl
    from leap_stream.tools.sim.fleet import simulate

    paths = write_jsonl(simulate(SimConfig(seed=2, days=1, rate=600)), tmp_path / "sim")
    subs = {}
    for line in paths["submissions"].read_bytes().splitlines():
        s = orjson.loads(line)
        subs[(s["job_id"], s["attempt"])] = s
    comps = [orjson.loads(line) for line in paths["completions"].read_bytes().splitlines()]
    rows = [flatten(subs[(c["job_id"], c["attempt"])], c) for c in comps]
    DatasetSink(tmp_path / "ds").append(rows)

    key = ["event_id"]
    sim = read_dataset(paths["dataset"]).sort_values(key).reset_index(drop=True)
    ours = read_dataset(tmp_path / "ds").sort_values(key).reset_index(drop=True)
    assert len(ours) == len(comps) > 100
    pd.testing.assert_frame_equal(sim, ours)
