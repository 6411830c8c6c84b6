"""Trainer: point-in-time rows, promotion gate, registry round trip, CLI last line JSON."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from leap_stream.catalog import load_catalog
from leap_stream.core import features as F
from leap_stream.core.history import QUARANTINE_RULES, HistoryBook
from leap_stream.core.specs import SpecArrays
from leap_stream.store.artefact import read_lookup, read_model
from leap_stream.store.registry import LOOKUP, Registry
from leap_stream.tools import synthetic_rows as S
from leap_stream.train import pit, trainer

CATALOG = load_catalog().spec_matrix()


def _dataset(n: int = 3000, seed: int = 4) -> pd.DataFrame:
    # synthetic hardware names exist in the real catalog, so the trainer's catalog specs apply
    return S.dataset(n, seed=seed, days=10).drop(columns=["true_samples_per_s", "lineage_factor"])


def test_gate_rules() -> None:
    ok, why = trainer.gate({"accuracy": 0.8, "mape": 0.1}, None)
    assert ok and "no current" in why
    ok, why = trainer.gate({"accuracy": 0.70, "mape": 0.1}, {"accuracy": 0.80, "mape": 0.1})
    assert not ok and "accuracy" in why
    ok, _ = trainer.gate({"accuracy": 0.798, "mape": 0.1}, {"accuracy": 0.80, "mape": 0.1})
    assert ok  # within tolerance
    ok, why = trainer.gate({"accuracy": 0.80, "mape": 0.2}, {"accuracy": 0.80, "mape": 0.1})
    assert not ok and "MAPE" in why


def test_training_rows_respect_known_before() -> None:
    d = _dataset()
    cut = pd.Timestamp("2026-11-06", tz="UTC")
    tr = trainer.training_rows(d, known_before=cut)
    assert (pd.to_datetime(tr.rows["ended_at"], utc=True) < cut).all()
    assert len(tr.rows) == len(tr.frame) == len(tr.y)


def test_training_rows_replay_and_build_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A year of replay keeps millions of live objects that every full collection would walk
    (`pit.collector_paused`); the collector is back once the rows are built."""
    seen: list[bool] = []
    original = F.build_columns

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(F, "build_columns", spy)
    trainer.training_rows(_dataset(1500), chunk_rows=500)
    assert len(seen) > 1 and not any(seen)  # every piece
    assert gc.isenabled()


def test_rows_known_before_a_cutoff_need_no_second_replay() -> None:
    """The gate's candidate rows, cut from the full replay, are exactly a replay of the dataset
    cut there (histories, aggregates, quarantine verdicts and all)."""
    d = _dataset(4000, seed=6)
    cut = pd.Timestamp("2026-11-07T06:00:00", tz="UTC")
    sub = pd.to_datetime(d["submitted_at"], utc=True)
    replayed = trainer.training_rows(d.loc[(sub < cut).to_numpy()], known_before=cut)
    cut_out = trainer.training_rows(d).known_before(cut)
    assert 0 < len(cut_out.rows) < len(trainer.training_rows(d).rows)
    pd.testing.assert_frame_equal(cut_out.rows, replayed.rows)
    pd.testing.assert_frame_equal(cut_out.frame, replayed.frame)
    assert (cut_out.y == replayed.y).all()
    # rows ordered known-first (as train_and_publish orders them): the same rows, as views
    first = np.argsort(~trainer._known_before(d, cut), kind="stable")
    whole = trainer.training_rows(d.iloc[first].reset_index(drop=True))
    prefix = whole.known_before(cut)
    pd.testing.assert_frame_equal(prefix.rows, replayed.rows)
    pd.testing.assert_frame_equal(prefix.frame, replayed.frame)
    assert (prefix.y == replayed.y).all() and np.shares_memory(prefix.y, whole.y)


def _poisoned(d: pd.DataFrame, factor: float, minutes: list[float]) -> pd.DataFrame:
    """``d`` and, for its most measured (lineage, type), rows of new jobs ``factor`` × its
    newest measurement, ``minutes`` after it."""
    ok = d[d["status"] == "succeeded"]
    lineage, hw = ok.groupby(["lineage_id", "hardware_type"]).size().idxmax()
    last = ok[(ok["lineage_id"] == lineage) & (ok["hardware_type"] == hw)].iloc[-1]
    rows = []
    for k, m in enumerate(minutes):
        r = last.copy()
        when = pd.Timestamp(last["ended_at"]) + pd.Timedelta(minutes=m)
        r["event_id"], r["job_id"] = f"poison-{k}", f"poison-job-{k}"
        r["submitted_at"], r["ended_at"] = when - pd.Timedelta(hours=2), when
        r["started_at"] = when - pd.Timedelta(hours=1)
        r["samples_per_s"] = last["samples_per_s"] * factor
        rows.append(r)
    return pd.concat([d, pd.DataFrame(rows)], ignore_index=True)


def test_a_pair_of_poisoned_rows_does_not_become_targets() -> None:
    """Two ×20 rows of two new jobs a minute apart: the second does not corroborate the first
    (not independent: too soon), so neither is a target and the first stays pending."""
    clean = trainer.training_rows(_dataset())
    d = _poisoned(_dataset(), 20.0, [1.0, 2.0])
    poison = d["samples_per_s"].iloc[-2:].to_numpy()
    tr = trainer.training_rows(d)
    assert len(tr.y) == len(clean.y) and not np.isin(tr.y, poison).any()
    # an hour apart they corroborate each other: the rule, not the rows, decides
    apart = trainer.training_rows(_poisoned(_dataset(), 20.0, [1.0, 62.0]))
    assert np.isin(apart.y, poison).sum() == 1  # the corroborating row; the first stays held


def test_the_online_verdict_stands_in_training() -> None:
    """A row the online store quarantined (its ``quarantine`` column) is no target, even where
    a replay alone would accept it."""
    d = _dataset()
    whole = trainer.training_rows(d)
    held = np.isin(d["samples_per_s"].to_numpy(), whole.y[::50])
    d["quarantine"] = np.where(held, "speed", None)
    tr = trainer.training_rows(d)
    assert held.sum() > 10 and len(tr.y) == len(whole.y) - int(held.sum())
    assert not np.isin(tr.y, d.loc[held, "samples_per_s"].to_numpy()).any()


def test_training_rows_in_pieces_equal_one_whole_replay() -> None:
    """Replayed in pieces, aggregates from the change log and columns stored compactly, the
    training rows are the whole replay's features (float columns to float32 precision)."""
    d = _dataset(3000, seed=8)
    pieces = trainer.training_rows(d, chunk_rows=97)
    rows = pit.measured(d)
    snap = pit.replay(rows, rows, HistoryBook(), finish=True, specs=SpecArrays.of(CATALOG))
    kept = ~np.isin(snap.verdicts, QUARANTINE_RULES)
    whole = (
        F.build(
            rows,
            [[h] for h in rows["hardware_type"]],
            snap.histories,
            snap.aggregates,
            CATALOG,
            snap.now,
        )
        .loc[kept]
        .reset_index(drop=True)
    )
    whole = whole.drop(columns=list(trainer.UNREAD_COLUMNS))
    assert list(pieces.frame.columns) == list(whole.columns)
    assert len(pieces.frame) == len(whole) > 2500
    assert np.isfinite(whole["agg_cand"]).sum() > 1000  # the aggregates are exercised
    for c in whole.columns:
        got, want = pieces.frame[c].to_numpy(), whole[c].to_numpy()
        if c == "job":
            assert (got == np.arange(len(whole))).all()
        elif want.dtype == object:
            assert (
                pd.Series(got, dtype=object).fillna("").tolist()
                == pd.Series(want, dtype=object).fillna("").tolist()
            ), c
        else:
            np.testing.assert_allclose(
                got.astype(np.float64), want.astype(np.float64), rtol=1e-6, err_msg=c
            )
    assert (pieces.y == rows["samples_per_s"].to_numpy()[kept]).all()


def test_job_columns_are_what_the_feature_build_reads() -> None:
    """Training reads the dataset's `features.JOB_COLUMNS` (through TRAINING_COLUMNS): the
    feature build needs each of them and no other job column."""
    d = _dataset(200, seed=11)
    jobs = d[list(F.JOB_COLUMNS)]
    n = len(jobs)

    def build(frame: pd.DataFrame) -> pd.DataFrame:
        cands = [[h] for h in d["hardware_type"]]
        return F.build(frame, cands, [{}] * n, [{}] * n, CATALOG, np.zeros(n))

    assert len(build(jobs)) == n
    for c in F.JOB_COLUMNS:
        with pytest.raises(KeyError):
            build(jobs.drop(columns=c))
    assert set(F.JOB_COLUMNS) <= set(trainer.TRAINING_COLUMNS)


def test_the_model_reads_no_column_training_leaves_out() -> None:
    """Fit and predict on a training frame without `UNREAD_COLUMNS`: a model that starts to
    read one fails here, before a year of training drops it."""
    tr = trainer.training_rows(_dataset(2000, seed=9))
    assert not set(trainer.UNREAD_COLUMNS) & set(tr.frame.columns)
    model = trainer.fit(tr, num_rounds=10)
    p50, lo, hi = model.predict(tr.frame)
    assert np.isfinite(p50).all() and (lo <= p50).all() and (p50 <= hi).all()


def test_a_year_fits_its_boosters_on_a_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above FIT_ROWS training rows the boosters fit a seeded sample of them; the lineage and
    pair effects come from the sampled rows only; the model still predicts every row."""
    from leap_stream.core import predictor as P
    from leap_stream.core.predictor import fit as fitting

    tr = trainer.training_rows(_dataset(3000, seed=10))
    train = ~P.holdout_mask(tr.rows["lineage_id"].to_numpy(object), 0.15, 0)
    monkeypatch.setattr(fitting, "FIT_ROWS", 900)
    sample = fitting._fit_sample(train, 0)
    assert sample.sum() == 900 and not (sample & ~train).any()
    assert (fitting._fit_sample(train, 0) == sample).all()  # seeded
    model = trainer.fit(tr, num_rounds=10)
    p50, _lo, _hi = model.predict(tr.frame)
    assert np.isfinite(p50).all()
    monkeypatch.setattr(fitting, "FIT_ROWS", 10**9)
    assert (fitting._fit_sample(train, 0) == train).all()


def test_train_publish_promote_then_gate(tmp_path: Path) -> None:
    d = _dataset()
    reg = tmp_path / "registry"
    early = d[d["submitted_at"] < pd.Timestamp("2026-11-08", tz="UTC")]
    first = trainer.train_and_publish(early, reg, holdout_days=2, progress=False)
    assert first["promoted"] is True and first["reason"] == "no current model"
    r = Registry(reg)
    assert r.current_version() == first["version"]
    loaded = r.load_current(read_model)
    assert loaded is not None and loaded[1].version == first["version"]
    assert read_lookup(r.versions / first["version"] / LOOKUP).tables
    # two more days: candidate and current are compared on the rows neither trained on
    second = trainer.train_and_publish(d, reg, holdout_days=2, progress=False)
    assert second["current"] is not None and second["candidate"] is not None
    assert second["current"]["rows"] == second["candidate"]["rows"] == second["gate_rows"]
    assert second["version"] != first["version"]
    expect, _why = trainer.gate(second["candidate"], second["current"])
    assert second["promoted"] is expect
    assert (r.current_version() == second["version"]) is expect
    # no new data since the current model: nothing fair to compare on, keep the current one
    if second["promoted"]:
        third = trainer.train_and_publish(d, reg, holdout_days=2, progress=False)
        assert third["promoted"] is False and "newer than the current" in third["reason"]
        assert r.current_version() == second["version"]


def test_a_row_from_the_future_does_not_stop_the_gate(tmp_path: Path) -> None:
    d = _dataset()
    reg = tmp_path / "registry"
    early = d[d["submitted_at"] < pd.Timestamp("2026-11-08", tz="UTC")]
    trainer.train_and_publish(early, reg, holdout_days=2, progress=False)
    poisoned = d.copy()
    poisoned.loc[0, "submitted_at"] = pd.Timestamp("2031-01-01", tz="UTC")
    poisoned.loc[0, "ended_at"] = pd.Timestamp("2031-01-02", tz="UTC")
    # without a bound the one row is "now": no held-out rows, the current model is kept
    blind = trainer.train_and_publish(poisoned, tmp_path / "r2", holdout_days=2, progress=False)
    blind_gate = trainer.train_and_publish(poisoned, reg, holdout_days=2, progress=False)
    assert blind["promoted"] is True  # (an empty registry promotes anything)
    assert blind_gate["gate_rows"] < 200 and "newer than the current" in blind_gate["reason"]
    latest = pd.Timestamp("2026-12-03", tz="UTC")
    bounded = trainer.train_and_publish(
        poisoned, reg, holdout_days=2, progress=False, latest=latest
    )
    assert bounded["future_rows"] == 1 and bounded["dataset_rows"] == len(d)
    assert bounded["gate_rows"] >= 200 and bounded["candidate"] is not None
    kept, n = trainer.drop_future_rows(poisoned, latest)
    assert n == 1 and len(kept) == len(d) - 1


def test_cli_last_line_is_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _dataset(1500, seed=9)
    path = tmp_path / "dataset.parquet"
    d.to_parquet(path)
    from leap_stream.cli import main

    rc = main(
        ["train", "--dataset", str(path), "--registry", str(tmp_path / "reg"), "--no-progress"]
    )
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    report = orjson.loads(last)
    assert report["promoted"] is True and report["rows"] > 0
