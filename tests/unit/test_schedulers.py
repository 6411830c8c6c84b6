"""The pure parts every scheduler integration shares: job spec → submission, ranking → choice,
and the Slurm rankings cache's files."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from leap_stream.contracts import Ok, decode
from leap_stream.contracts.job_spec import JobSpecError, spec_of, submission_from_spec
from leap_stream.core.placement import candidate_of, choose, ranked_types
from leap_stream.schedulers.slurm import RankingsCache, cache_entry, file_name

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "schemas" / "examples" / "job-submitted" / "valid" / "llama-70b-64xh100.json"
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _spec() -> dict[str, Any]:
    event = orjson.loads(EXAMPLE.read_bytes())
    return spec_of(event)


def _ranking(types: list[str], source: str = "model", **extra: Any) -> dict[str, Any]:
    return {
        "job_id": "job/a",
        "lineage_id": "lineage/a",
        "produced_at": "2026-12-03T12:00:00.000Z",
        "source": source,
        "model_version": "v1",
        "candidates": [{"hardware_type": t, "rank": i + 1} for i, t in enumerate(types)],
        **extra,
    }


def test_a_spec_becomes_a_valid_submission_with_the_allowed_types() -> None:
    event = submission_from_spec(
        _spec(), job_id="slurm/1", allowed=["mi300x", "h100-sxm", "mi300x"], now=NOW
    )
    decoded = decode(orjson.dumps(event), "job-submitted", max_bytes=1 << 20)
    assert isinstance(decoded, Ok), decoded
    assert event["candidate_hardware"] == ["mi300x", "h100-sxm"]
    assert event["default_hardware"] == "mi300x" and event["submitted_at"].startswith("2026-12-03")


def test_the_spec_wins_except_for_the_candidates() -> None:
    spec = {**_spec(), "job_id": "portal/7", "candidate_hardware": ["tpu-v5p"]}
    event = submission_from_spec(spec, job_id="slurm/1", allowed=["h200"], now=NOW, default="x")
    assert event["job_id"] == "portal/7"
    assert event["candidate_hardware"] == ["h200"] and event["default_hardware"] == "h200"


@pytest.mark.parametrize("spec, allowed", [([1], ["h200"]), ({}, [])])
def test_a_spec_that_cannot_be_a_submission_is_refused(spec: Any, allowed: list[str]) -> None:
    with pytest.raises(JobSpecError):
        submission_from_spec(spec, job_id="j", allowed=allowed, now=NOW)


def test_choose_takes_the_best_allowed_types_by_rank() -> None:
    r = _ranking(["h200", "mi300x", "h100-sxm"])
    r["candidates"].reverse()  # the rank decides, not the position
    assert ranked_types(r) == ["h200", "mi300x", "h100-sxm"]
    assert choose(r, {"h100-sxm", "mi300x"}) == ["mi300x"]
    assert choose(r, None, k=2) == ["h200", "mi300x"]
    assert choose(r, {"tpu-v5p"}) == [] and choose(None) == [] and choose(r, k=0) == []
    assert choose(_ranking(["h200"], source="none")) == []
    assert candidate_of(r, "mi300x") == {"hardware_type": "mi300x", "rank": 2}
    assert candidate_of(r, "b200") is None


def test_an_exploration_the_ranking_marks_is_tried_first() -> None:
    """Every integration places by `ranked_types`: the type a ranking marks to explore comes
    before its first, where the user allowed it; otherwise the rank order."""
    r = _ranking(["h200", "mi300x", "h100-sxm"])
    r["explore"] = {
        "hardware_type": "h100-sxm",
        "reason": "never_measured",
        "expected_extra_cost": 0.03,
    }
    assert ranked_types(r) == ["h100-sxm", "h200", "mi300x"]
    assert choose(r, {"h200", "mi300x"}) == ["h200"]
    r["explore"]["hardware_type"] = "b200"  # not a candidate: ignored
    assert ranked_types(r) == ["h200", "mi300x", "h100-sxm"]


def test_cache_file_names_are_one_to_one_and_stay_in_the_folder() -> None:
    names = {file_name("job", i) for i in ("a/b:c", "a:b/c", "a:b:c", "..", "../x")}
    assert len(names) == 5 and all("/" not in n and n.startswith("job.") for n in names)


def test_cache_entry_lists_the_ranked_types() -> None:
    text = cache_entry(_ranking(["h200", "mi300x"]))
    assert text is not None
    assert text.decode().splitlines() == [
        "leap-ranking 1",
        f"produced_at {datetime(2026, 12, 3, 12, tzinfo=UTC).timestamp():.3f}",
        "job_id job/a",
        "source model",
        "model_version v1",
        "rank h200",
        "rank mi300x",
    ]
    assert cache_entry(_ranking(["h200"], source="none")) is None


def test_the_cache_keeps_the_newest_ranking_of_a_lineage(tmp_path: Path) -> None:
    now = datetime(2026, 12, 3, 13, tzinfo=UTC).timestamp()
    cache = RankingsCache(tmp_path, max_age_s=86400)
    newer = _ranking(["h200"], job_id="job/new", produced_at="2026-12-03T12:30:00.000Z")
    older = _ranking(["mi300x"], job_id="job/old")
    assert cache.write(newer, now) and cache.write(older, now)
    lineage = (tmp_path / file_name("lineage", "lineage/a")).read_text()
    assert "rank h200" in lineage  # a repeat of an older ranking does not take it back
    assert (tmp_path / file_name("job", "job/old")).exists()

    stale = _ranking(["h200"], job_id="job/stale", produced_at="2026-11-01T00:00:00.000Z")
    assert not cache.write(stale, now) and not cache.write({"job_id": 3}, now)
    assert not cache.write(_ranking([], source="none", job_id="job/none"), now)
    assert cache.skipped == 3 and cache.written == 2


def test_prune_removes_what_is_older_than_the_maximum_age(tmp_path: Path) -> None:
    cache = RankingsCache(tmp_path, max_age_s=100)
    now = datetime(2026, 12, 3, 12, 0, 50, tzinfo=UTC).timestamp()
    cache.write(_ranking(["h200"]), now)
    old = tmp_path / file_name("job", "job/a")
    os.utime(old, (now - 500, now - 500))
    (tmp_path / "notes.txt").write_text("not ours")
    os.utime(tmp_path / "notes.txt", (now - 500, now - 500))
    assert cache.prune(now) == 1
    assert not old.exists() and (tmp_path / file_name("lineage", "lineage/a")).exists()
    assert (tmp_path / "notes.txt").exists()


def test_spec_of_is_the_inverse_of_submission_from_spec() -> None:
    event = orjson.loads(EXAMPLE.read_bytes())
    spec = spec_of(event)
    assert not set(spec) & {"job_id", "event_id", "submitted_at", "candidate_hardware"}
    again = submission_from_spec(
        spec, job_id=event["job_id"], allowed=event["candidate_hardware"], now=NOW
    )
    assert spec_of(again) == spec and again["candidate_hardware"] == event["candidate_hardware"]


def _probed_ranking() -> dict[str, Any]:
    """Three candidates 5 % apart, each within ×1.3 (80 %), the first two to probe."""
    r = _ranking(["h200", "mi300x", "h100-sxm"])
    for c, pred in zip(r["candidates"], (100.0, 95.0, 90.0), strict=True):
        c.update(
            predicted_throughput=pred,
            interval={"low": pred / 1.3, "high": pred * 1.3, "level": 0.8},
            cost_per_device_hour=3.0,
            num_devices=8,
        )
    r["probe"] = {
        "hardware_types": ["h200", "mi300x"],
        "minutes": 4.5,
        "cost": 4.0,
        "expected_saving": 50.0,
    }
    return r


def test_after_probes_puts_first_what_the_probes_measured_best() -> None:
    from leap_stream.core.placement import after_probes

    r = _probed_ranking()
    assert after_probes(r, {}) == ["h200", "mi300x", "h100-sxm"]  # nothing measured
    # the first measures 30 % under its prediction, the second as predicted
    assert after_probes(r, {"h200": 70.0, "mi300x": 95.0}) == ["mi300x", "h200", "h100-sxm"]
    assert after_probes(r, {"h200": 101.0, "mi300x": 80.0}) == ["h200", "mi300x", "h100-sxm"]
    del r["probe"]  # a ranking without a probe keeps its order
    assert after_probes(r, {"h200": 70.0}) == ranked_types(r)


def test_after_probes_carries_what_a_slice_measured_to_the_jobs_size() -> None:
    from leap_stream.core.placement import after_probes

    r = _probed_ranking()
    # each probe ran one of the job's replicas, predicted at a 16th of the job
    r["probe"]["runs"] = [_run(100.0 / 16), _run(95.0 / 16)]
    # a 16th of the prediction on the first is as predicted; 30 % under on the second
    assert after_probes(r, {"h200": 100.0 / 16, "mi300x": 0.7 * 95.0 / 16})[0] == "h200"
    # the first's slice 30 % under its prediction, the second's as predicted: the second
    assert after_probes(r, {"h200": 0.7 * 100.0 / 16, "mi300x": 95.0 / 16})[0] == "mi300x"
    # read as whole-job measurements, both probed types would be 16 times slower than
    # predicted: the job would go to the one not probed
    del r["probe"]["runs"]
    assert after_probes(r, {"h200": 0.7 * 100.0 / 16, "mi300x": 95.0 / 16})[0] == "h100-sxm"


def _run(predicted: float) -> dict[str, Any]:
    return {
        "num_devices": 8,
        "data_parallel": 1,
        "global_batch_size": 64,
        "predicted_throughput": predicted,
    }


def test_a_probe_job_per_type_and_the_completion_it_reports() -> None:
    from leap_stream.contracts import validate_event
    from leap_stream.core.history import HistoryBook
    from leap_stream.schedulers.probes import probe_completion, probe_types, slurm_probe_args

    r = _probed_ranking()
    assert probe_types(r) == ["h200", "mi300x"] and probe_types(_ranking(["h200"])) == []
    args = slurm_probe_args(r, {"h200": "gpu-h200"})
    assert args[0] == [
        "--partition=gpu-h200",
        "--time=5",
        "--job-name=leap-probe.h200",
        "--export=ALL,LEAP_PROBE=1,LEAP_PROBE_TYPE=h200",
    ]
    assert args[1][0] == "--partition=mi300x"
    sliced = _probed_ranking()
    sliced["probe"]["runs"] = [_run(6.0), _run(5.0)]
    assert slurm_probe_args(sliced)[0][-1] == (
        "--export=ALL,LEAP_PROBE=1,LEAP_PROBE_TYPE=h200,LEAP_PROBE_DEVICES=8,"
        "LEAP_PROBE_DATA_PARALLEL=1,LEAP_PROBE_GLOBAL_BATCH=64"
    )
    sub = submission_from_spec(_spec(), job_id="slurm/9", allowed=["h200", "mi300x"], now=NOW)
    started = datetime(2026, 12, 3, 12, 1, tzinfo=UTC)
    ended = datetime(2026, 12, 3, 12, 5, 30, tzinfo=UTC)
    c = probe_completion(sub, "mi300x", 123.4, started, ended)
    assert validate_event(c, "job-completed") is None
    nd = sub["training"]["num_devices"]
    assert c["probe"] is True and c["device_hours"] == pytest.approx(nd * 4.5 / 60)
    # one per type, apart from the attempt's own completion
    book = HistoryBook()
    assert book.apply_completion(c) == "accepted"
    assert book.apply_completion(dict(c, event_id="again")) == "repeat"
    own = dict(c, event_id="own", hardware_type="h200", probe=False)
    assert book.apply_completion(own) != "repeat"
