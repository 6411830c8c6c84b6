"""Hot reload: RankerHolder against a real on-disk registry and real LightGBM text models."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import generate_latest

from leap_stream.catalog import load_catalog
from leap_stream.core.lookup import LookupTable
from leap_stream.store.artefact import read_model, write_model
from leap_stream.store.registry import Registry
from leap_stream.stream.metrics import Metrics
from leap_stream.stream.models import RankerHolder, lookup_from_dataset
from leap_stream.tools.sim.config import SimConfig, SimResult
from leap_stream.tools.sim.events import submission_events
from leap_stream.tools.sim.fleet import simulate
from leap_stream.train.trainer import fit, training_rows

NOW = datetime(2026, 11, 2, tzinfo=UTC)


@cache
def _sim() -> SimResult:
    return simulate(SimConfig(seed=2, days=1, rate=800))


def _model_dir(tmp: Path, version: str, trained_at: str, with_lookup: bool = True) -> Path:
    model = fit(training_rows(_sim().dataset), num_rounds=15)
    model.metadata["version"] = version
    model.metadata["trained_at"] = trained_at
    lookup = LookupTable.fit(_sim().dataset) if with_lookup else None
    return write_model(tmp / f"build-{version}", model, lookup)


def _text(m: Metrics) -> str:
    return generate_latest(m.registry).decode()


def _rank(holder: RankerHolder) -> list[dict[str, Any]]:
    subs = submission_events(_sim().submissions)[:30]
    return holder.get().rank_batch(subs, [None] * len(subs), {}, NOW)


def test_no_model_then_hot_reload_then_bad_model_keeps_the_good_one(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "registry")
    m = Metrics()
    holder = RankerHolder(load_catalog(), reg, m, fallback_lookup=None)
    assert holder.poll() is False  # nothing promoted
    assert {r["source"] for r in _rank(holder)} == {"none"}
    first = holder.get()

    reg.promote(reg.publish(_model_dir(tmp_path, "v1", "2026-11-01T00:00:00Z")))
    assert holder.poll() is True
    assert holder.version == "v1" and holder.get() is not first
    out = _rank(holder)
    assert {r["model_version"] for r in out if r["source"] == "model"} == {"v1"}
    assert any(r["source"] == "model" for r in out)
    assert 'leap_model_info{version="v1"} 1.0' in _text(m)
    assert holder.poll() is False  # unchanged pointer: one stat, no reload

    # v2 is published, then its model file is damaged before promotion: the load fails
    v2 = reg.publish(_model_dir(tmp_path, "v2", "2026-11-02T00:00:00Z"))
    reg.promote(v2)
    (reg.versions / v2 / "model.txt").write_text("garbage")
    serving = holder.get()
    assert holder.poll() is False
    assert holder.get() is serving and holder.version == "v1"
    assert "leap_model_load_failures_total 1.0" in _text(m)
    assert 'leap_model_info{version="v1"} 1.0' in _text(m)

    # a good v3 is picked up again
    reg.promote(reg.publish(_model_dir(tmp_path, "v3", "2026-11-03T00:00:00Z")))
    assert holder.poll() is True and holder.version == "v3"
    text = _text(m)
    assert 'leap_model_info{version="v3"} 1.0' in text and 'version="v1"' not in text


def test_fallback_lookup_from_the_dataset(tmp_path: Path) -> None:
    from leap_stream.store.offline import DatasetSink

    assert lookup_from_dataset(tmp_path / "nothing-here") is None
    DatasetSink(tmp_path / "ds").append(_sim().dataset.to_dict("records"))
    lookup = lookup_from_dataset(tmp_path / "ds")
    assert lookup is not None
    holder = RankerHolder(load_catalog(), None, Metrics(), fallback_lookup=lookup)
    sources = {r["source"] for r in _rank(holder)}
    assert "lookup" in sources and "model" not in sources


def test_model_load_is_the_registry_format(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, "v9", "2026-11-09T00:00:00Z", with_lookup=False)
    assert orjson.loads((d / "metadata.json").read_bytes())["version"] == "v9"
    copy = tmp_path / "copy"
    shutil.copytree(d, copy)
    assert read_model(copy).version == "v9"
