"""`leap-stream simulate` writes the files and ends stdout with one JSON summary."""

from __future__ import annotations

from pathlib import Path

import orjson
import pandas as pd
import pytest

from leap_stream.cli import main


def test_simulate_cli_writes_files_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim"
    assert main(["simulate", "--seed", "2", "--days", "2", "--rate", "800", "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = orjson.loads(last)
    for key in (
        "submissions",
        "completions",
        "hardware_types",
        "vendors",
        "model_types",
        "submissions_with_prior",
        "drift_events",
    ):
        assert key in summary
    assert summary["vendors"] == 5
    lines = (out / "submissions.jsonl").read_bytes().splitlines()
    assert len(lines) == summary["submissions"]
    comps = [orjson.loads(x) for x in (out / "completions.jsonl").read_bytes().splitlines()]
    assert len(comps) == summary["completions"]
    ended = [c["ended_at"] for c in comps]
    assert ended == sorted(ended)  # telemetry in arrival order
    ds = pd.read_parquet(out / "dataset.parquet")
    assert len(ds) == summary["completions"]
    truth = pd.read_parquet(out / "truth.parquet")
    assert truth["hardware_type"].nunique() == summary["hardware_types"]


def test_simulate_needs_a_destination(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--seed", "1"]) == 2
    assert "--out" in capsys.readouterr().err


def test_simulate_dataset_by_day_is_the_simulators_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dataset-dir writes day by day exactly the rows the whole-run simulation's
    dataset.parquet has (what `read_dataset` reads back from either)."""
    from leap_stream.store.offline import read_dataset

    args = ["simulate", "--seed", "2", "--days", "3", "--rate", "600", "--no-progress"]
    assert main([*args, "--dataset-dir", str(tmp_path / "ds")]) == 0
    summary = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*args, "--out", str(tmp_path / "sim")]) == 0
    by_day = read_dataset(tmp_path / "ds")
    whole = read_dataset(tmp_path / "sim" / "dataset.parquet")
    assert summary["dataset_rows"] == len(by_day) == len(whole) > 0
    assert len(list((tmp_path / "ds").glob("day=*"))) >= 3
    key = ["event_id"]
    pd.testing.assert_frame_equal(
        by_day.sort_values(key).reset_index(drop=True),
        whole.sort_values(key).reset_index(drop=True),
    )
