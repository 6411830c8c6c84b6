"""`leap-stream demo --fast` end to end on the real broker and Redis: the report is complete,
its figures are consistent with what was streamed, and the run cleans up after itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_demo_fast_end_to_end(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAP_")}
    env.update(
        LEAP_KAFKA_BOOTSTRAP=kafka_bootstrap,
        LEAP_REDIS_URL=redis_url,
        LEAP_HOME=str(tmp_path / "home"),
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "leap_stream", "demo", "--fast", "--out", str(out), "--no-progress"],
        env=env,
        capture_output=True,
        timeout=280,
        check=False,
    )
    took = time.monotonic() - t0
    stdout, stderr = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, stderr[-4000:]
    print(stdout, f"\ndemo --fast took {took:.0f} s")
    assert f"report: {out.resolve() / 'report.html'}" in stdout
    assert "leap-stream dev down" in stdout

    for name in ("accuracy", "calibration", "savings", "latency"):
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    rep = orjson.loads((out / "report.json").read_bytes())

    st = rep["stream"]
    assert st["submissions"] > 1000 and st["completions"] > 1000
    assert st["held_timeout"] == 0
    # every streamed submission got a ranking and a latency
    assert rep["coverage"]["submissions"] == rep["coverage"]["rankings"] == st["submissions"]
    assert rep["latency"]["n"] == st["submissions"]
    assert 0 < rep["latency"]["p50_ms"] <= rep["latency"]["p99_ms"] <= rep["latency"]["max_ms"]
    assert rep["coverage"]["coverage"] > 0.9
    # every completion the worker consumed reached the dataset the nightly retrain read
    assert rep["dataset_rows_written"] == rep["completions_streamed"] == st["completions"]
    assert rep["lag_end"] == 0
    # the injected bad events, and nothing else, are in the dead-letter topic
    assert rep["dead_letters"]["count"] == st["poison"] == 3
    assert rep["dead_letters"]["by_kind"] == {"not_json": 1, "schema": 1, "completion_mismatch": 1}
    ran = rep["accuracy"]["ran"]
    assert ran["service"]["exact"] == 0  # no ranking saw its own measurement
    assert ran["oracle"]["accuracy"] > 0.95  # measurement noise only
    assert ran["service"]["accuracy"] > ran["lookup"]["accuracy"]
    assert rep["retrain"]["version"] != rep["first_model"]["version"]
    if rep["retrain"]["promoted"]:
        assert rep["reload"]["ok"], rep["reload"]
        assert rep["reload"]["morning_rankings_by_version"].get(rep["retrain"]["version"], 0) > 0
    assert rep["worker_exit"] == 0

    # the run's topics are gone again (reruns start clean, nothing piles up on the broker)
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    assert not [t for t in topics if t.startswith(f"leap-demo-{rep['run_id']}.")]
