"""Settings: parsed once, typed, every bad value named; nothing else reads LEAP_* variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from leap_stream.cli import main
from leap_stream.settings import SETTINGS, Settings, SettingsError

PACKAGE = Path(__file__).resolve().parents[2] / "leap_stream"


def test_the_defaults_parse_to_typed_values() -> None:
    cfg = Settings.from_env({"LEAP_HOME": "/tmp/leap-home"})
    assert cfg.batch_size == 500 and isinstance(cfg.batch_size, int)
    assert cfg.redis_timeout_s == 1.0 and cfg.gc_freeze is True
    assert cfg.kafka_auto_create_topics is False
    assert cfg.dataset_dir == Path("/tmp/leap-home/dataset")
    assert cfg.registry_dir == Path("/tmp/leap-home/registry")
    assert cfg.topics == (
        "leap.job-submissions",
        "leap.job-completions",
        "leap.rankings",
        "leap.dead-letter",
    )
    assert len(SETTINGS) == len(cfg.raw()) and all(s.env.startswith("LEAP_") for s in SETTINGS)


def test_every_bad_value_is_named_at_once() -> None:
    bad = {"LEAP_BATCH_SIZE": "0", "LEAP_METRICS_PORT": "70000", "LEAP_GC_FREEZE": "yes"}
    with pytest.raises(SettingsError) as err:
        Settings.from_env(bad)
    for env in bad:
        assert env in str(err.value)


def test_a_bad_number_says_seconds_only_for_a_duration() -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"LEAP_EXPLORE_BUDGET": "-1", "LEAP_MODEL_POLL_S": "soon"})
    text = str(err.value)
    assert "LEAP_EXPLORE_BUDGET='-1': expected a finite number >= 0" in text
    assert "LEAP_MODEL_POLL_S='soon': expected a finite number of seconds > 0" in text


def test_secrets_are_masked_and_raw_values_round_trip() -> None:
    cfg = Settings.from_env({"LEAP_REDIS_PASSWORD": "s3cret", "LEAP_GC_FREEZE": "0"})
    raw = cfg.raw()
    assert raw["LEAP_REDIS_PASSWORD"] == "***" and raw["LEAP_GC_FREEZE"] == "0"
    again = Settings.from_env({k: v for k, v in raw.items() if k != "LEAP_REDIS_PASSWORD"})
    assert again.gc_freeze is False and again.batch_size == cfg.batch_size


def test_a_bad_setting_stops_a_command_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LEAP_BATCH_SIZE", "many")
    assert main(["config"]) == 2
    assert "LEAP_BATCH_SIZE='many'" in capsys.readouterr().err


def test_nothing_outside_the_settings_module_reads_a_leap_variable() -> None:
    reads = re.compile(r"""(environ|getenv)\W*(\.get)?\(?\s*\[?\s*["']LEAP_""")
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "settings.py" and reads.search(p.read_text())
    ]
    assert offenders == []


def test_worker_roles() -> None:
    assert Settings.from_env({}).worker_roles == "submissions,completions"
    cfg = Settings.from_env({"LEAP_WORKER_ROLES": " completions , submissions"})
    assert cfg.worker_roles == "submissions,completions" and cfg.runs("completions")
    only = Settings.from_env({"LEAP_WORKER_ROLES": "completions"})
    assert only.runs("completions") and not only.runs("submissions")
    for bad in ("", "rankings", "submissions,rankings", ","):
        with pytest.raises(SettingsError, match="LEAP_WORKER_ROLES"):
            Settings.from_env({"LEAP_WORKER_ROLES": bad})
