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
