"""`leap-stream store compact` and `store models` on temp folders."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from leap_stream.cli import main
from leap_stream.store.offline import DatasetSink, flatten, read_dataset
from leap_stream.store.registry import Registry
from leap_stream.tools import synthetic_events as synthetic


def test_compact_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [flatten(s, c) for s, c in synthetic.pairs(120, seed=1)]
    sink = DatasetSink(tmp_path)
    sink.append(rows[:80])
    sink.append(rows[40:])
    assert main(["store", "compact", "--dataset", str(tmp_path)]) == 0
    days = list(tmp_path.glob("day=*"))
    assert days and all(len(list(d.glob("*.parquet"))) == 1 for d in days)
    assert len(read_dataset(tmp_path)) == 120
    assert "day=" in capsys.readouterr().out


def test_models_command_promotes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reg = Registry(tmp_path / "reg")
    for v, t in (("v1", "2026-12-01T00:00:00Z"), ("v2", "2026-12-02T00:00:00Z")):
        d = tmp_path / v
        d.mkdir()
        (d / "model.txt").write_text("tree\n")
        (d / "metadata.json").write_bytes(
            orjson.dumps({"version": v, "trained_at": t, "mape": 0.1})
        )
        reg.publish(d)
    reg.promote("v2")
    assert main(["store", "models", "--registry", str(reg.root), "--promote", "v1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("* v1") and out[1].startswith("  v2") and "mape" in out[0]
    assert reg.current_version() == "v1"
    assert reg.promotions()[-1]["previous"] == "v2"
