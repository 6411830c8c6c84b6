"""Nightly training: dataset → point-in-time rows → LightGBM → registry, behind a promotion gate.

The gate compares the candidate recipe and the current model on the same held-out last nights
(rows neither has trained on), and promotes only when the candidate is not worse. The published
model is then refit on everything (the recipe was judged, the freshest nights matter most under
drift). `leap-stream train` prints a tqdm bar on stderr and one JSON object as its last stdout line.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd
from pandas.api.types import union_categoricals

from leap_stream.contracts.timestamps import isoformat_z
from leap_stream.core import features as F
from leap_stream.core.columns import Columns
from leap_stream.core.history import DEFAULT_RULES, QUARANTINE_RULES, HistoryBook, HistoryRules
from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import NUM_ROUNDS, BoosterCompiler, ThroughputModel
from leap_stream.core.specs import SpecArrays
from leap_stream.settings import Settings
from leap_stream.store.artefact import read_model, write_model
from leap_stream.train import pit

log = logging.getLogger(__name__)

# Candidate may be this much below the current model's ±10 % accuracy and still pass (noise).
GATE_TOLERANCE = 0.005
MIN_GATE_ROWS = 200
# The dataset columns training reads: the job's configuration (features), what the history
# replay applies, the look-up table's keys. A year of history is read with only these.
TRAINING_COLUMNS = (
    *F.JOB_COLUMNS,
    "lineage_id",
    "submitted_at",
    "ended_at",
    "hardware_type",
    "status",
    "samples_per_s",
)
# What `TrainingRows.rows` keeps of a dataset row once its features are built.
ROW_KEYS = ("lineage_id", "model_type", "hardware_type", "submitted_at", "ended_at")
# Feature columns the model never reads (the ranker's checks, extras of the prior group): a
# year of rows does not keep them. A test fits and predicts on a frame without them.
UNREAD_COLUMNS = frozenset(
    {
        "known",
        "fits",
        "self_count",
        "self_age_days",
        "other_log_flops_ratio",
        "other_log_bw_ratio",
        "hist_types",
        "est_transfer",
        "agg_prior",
        "agg_ratio",
    }
)
# Submissions replayed and turned into features at a time (bounds the snapshots held).
CHUNK_ROWS = 200_000


@dataclass
class TrainingRows:
    """Measured dataset rows with their point-in-time features (candidate = where it ran)."""

    rows: pd.DataFrame  # their `ROW_KEYS`
    frame: pd.DataFrame
    y: np.ndarray  # measured whole-job samples/s

    def known_before(self, cutoff: pd.Timestamp) -> TrainingRows:
        """The rows submitted and measured before ``cutoff``: what `training_rows` of the
        dataset cut there gives, without a second replay. A row's history holds only what
        ended before its submission, and a verdict only what ended before it, so for a row
        submitted before the cutoff neither depends on anything the cut removes."""
        keep = _known_before(self.rows, cutoff)
        m = int(keep.sum())
        if keep[:m].all():  # they come first (`train_and_publish` orders them): no copies
            return TrainingRows(self.rows.iloc[:m], self.frame.iloc[:m], self.y[:m])
        frame = self.frame.loc[keep].reset_index(drop=True)
        frame["job"] = np.arange(len(frame))  # one row per job: its row in `rows`
        return TrainingRows(self.rows.loc[keep].reset_index(drop=True), frame, self.y[keep])


def _known_before(rows: pd.DataFrame, cutoff: pd.Timestamp) -> np.ndarray:
    """Rows submitted and measured before ``cutoff``."""
    ended = pd.to_datetime(rows["ended_at"], utc=True)
    submitted = pd.to_datetime(rows["submitted_at"], utc=True)
    return np.asarray(((ended < cutoff) & (submitted < cutoff)).to_numpy(), bool)


def training_rows(
    dataset: pd.DataFrame,
    known_before: pd.Timestamp | None = None,
    rules: HistoryRules = DEFAULT_RULES,
    chunk_rows: int = CHUNK_ROWS,
) -> TrainingRows:
    """Rows whose measurement had arrived before `known_before` (all when None).

    A row the history rules quarantine (core.history) is no training target either: a ×1000
    telemetry error must not teach the model what it keeps out of the priors. The rules run
    twice: the online store's verdict (the row's ``quarantine``) stands, and the replay judges
    what is left with the same rules, so neither a value held online nor a pair of poisoned
    rows that would corroborate each other in a replay becomes a target or a prior.

    The replay and the features go ``chunk_rows`` submissions at a time and each piece's
    snapshots are dropped once it is features, so memory grows with the feature columns
    (float32, strings as categoricals), not with a year of history dicts."""
    completions = dataset
    if known_before is not None:
        ended = pd.to_datetime(dataset["ended_at"], utc=True)
        completions = dataset.loc[(ended < known_before).to_numpy()]
    rows = _not_quarantined_online(pit.measured(completions))
    del completions, dataset
    specs = SpecArrays.of(catalog_specs())
    columns = _FeatureColumns(len(rows))
    verdicts = np.empty(0, object)
    book = HistoryBook(rules)
    with pit.collector_paused():
        for pos, snap in pit.replay_chunks(rows, rows, book, True, specs, chunk_rows, True):
            part = rows.iloc[pos]
            candidates = [[h] for h in part["hardware_type"].tolist()]
            aggregates = snap.aggregates_as_of or snap.aggregates
            cols = F.build_columns(part, candidates, snap.histories, aggregates, specs, snap.now)
            columns.put(pos, cols)
            verdicts = snap.verdicts
    kept = ~np.isin(verdicts, QUARANTINE_RULES)
    if not kept.all():
        log.info("%d quarantined measurements are not training targets", int((~kept).sum()))
    y = rows["samples_per_s"].to_numpy(np.float64)[kept]
    rows = rows.loc[kept, list(ROW_KEYS)].reset_index(drop=True)
    frame = columns.frame(kept)
    frame["job"] = np.arange(len(frame))  # one candidate per job: the job is its row in `rows`
    return TrainingRows(rows, frame, y)


def _not_quarantined_online(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows the online store did not quarantine when they arrived."""
    if "quarantine" not in rows.columns:
        return rows
    held = rows["quarantine"].notna().to_numpy()
    if not held.any():
        return rows
    log.info("%d measurements quarantined online are not training targets", int(held.sum()))
    return rows.loc[~held].reset_index(drop=True)


class _FeatureColumns:
    """Feature columns of ``n`` rows filled a piece at a time: floats as float32 (half the
    memory; the booster bins them far coarser), strings as categoricals (a few hundred values
    in millions of rows), in the column order of the first piece, `UNREAD_COLUMNS` left out."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.order: list[str] = []
        self.dense: dict[str, np.ndarray] = {}
        self.strings: dict[str, list[tuple[np.ndarray, pd.Categorical]]] = {}

    def put(self, pos: np.ndarray, cols: Columns) -> None:
        for name in cols:
            if name in UNREAD_COLUMNS:
                continue
            v = cols[name]
            if name not in self.order:
                self.order.append(name)
            if v.dtype == object:
                self.strings.setdefault(name, []).append((pos, pd.Categorical(v)))
                continue
            if name not in self.dense:
                dtype = np.float32 if v.dtype.kind == "f" else v.dtype
                self.dense[name] = np.empty(self.n, dtype)
            self.dense[name][pos] = v

    def frame(self, kept: np.ndarray) -> pd.DataFrame:
        """The rows where ``kept``, one column at a time (no second copy of the whole)."""
        out: dict[str, Any] = {}
        everything = bool(kept.all())
        for name in self.order:
            if name in self.dense:
                col = self.dense.pop(name)
                out[name] = col if everything else col[kept]
            else:
                parts = self.strings.pop(name)
                whole = union_categoricals([c for _p, c in parts])
                at = np.argsort(np.concatenate([p for p, _c in parts]), kind="stable")
                out[name] = pd.Series(whole[at[kept] if not everything else at], copy=False)
        return pd.DataFrame(out, copy=False)


_SPECS: pd.DataFrame | None = None


def catalog_specs() -> pd.DataFrame:
    global _SPECS
    if _SPECS is None:
        from leap_stream.catalog import load_catalog

        _SPECS = load_catalog().spec_matrix()
    return _SPECS


def use_catalog_file(path: str) -> None:
    """Train on the catalog the workers serve (LEAP_CATALOG_FILE) instead of the packaged one."""
    global _SPECS
    from leap_stream.catalog import CatalogFile

    _SPECS = CatalogFile(path).load().spec_matrix()


def _specs_for(_rows: pd.DataFrame) -> pd.DataFrame:
    return catalog_specs()


# From this many training rows a fit scores its boosters on its own rows with their compiled
# trees (`compile_trees`): scoring gets ~3x faster but each booster takes seconds to compile
# and check. At 1.9M rows that still lost (fit 80.1 s against 72.7 s with LightGBM's
# predict); a year (10M rows) gained (docs/benchmarks.md)
COMPILE_MIN_ROWS = 3_000_000


def fit(
    tr: TrainingRows,
    groups: Sequence[str] = tuple(F.GROUPS),
    seed: int = 0,
    num_rounds: int = NUM_ROUNDS,
    progress: bool = False,
    compile_trees: BoosterCompiler | None = None,
) -> ThroughputModel:
    window = (
        (isoformat_z(tr.rows["submitted_at"].min()), isoformat_z(tr.rows["submitted_at"].max()))
        if len(tr.rows)
        else None
    )
    bar: Any = None
    cb = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=num_rounds, desc="boosting", unit="tree", file=sys.stderr, leave=False)

        def cb(i: int, _total: int) -> None:
            bar.update(i - bar.n)

    try:
        return ThroughputModel.fit(
            tr.frame,
            tr.y,
            tr.rows["lineage_id"].to_numpy(object),
            groups=groups,
            seed=seed,
            num_rounds=num_rounds,
            data_window=window,
            progress=cb,
            compile_trees=compile_trees if len(tr.y) >= COMPILE_MIN_ROWS else None,
        )
    finally:
        if bar is not None:
            bar.close()


def evaluate(model: ThroughputModel, frame: pd.DataFrame, y: np.ndarray) -> dict[str, float]:
    """±10 % accuracy, MAPE, median APE and realised coverage of the nominal 80 % interval."""
    p50, lo, hi = model.predict(frame)
    return metrics(p50, y, lo, hi)


def metrics(
    pred: np.ndarray,
    y: np.ndarray,
    lo: np.ndarray | None = None,
    hi: np.ndarray | None = None,
) -> dict[str, float]:
    y = np.asarray(y, np.float64)
    pred = np.asarray(pred, np.float64)
    have = np.isfinite(pred) & (pred > 0)
    ape = np.abs(pred[have] / y[have] - 1.0)
    out = {
        "rows": float(len(y)),
        "predicted": float(have.mean()) if len(y) else 0.0,
        # a missing prediction counts as a miss: accuracy is over every row
        "accuracy": float(np.sum(ape <= 0.10) / len(y)) if len(y) else float("nan"),
        "mape": float(np.mean(ape)) if len(ape) else float("nan"),
        "median_ape": float(np.median(ape)) if len(ape) else float("nan"),
    }
    if lo is not None and hi is not None:
        inside = (y >= lo) & (y <= hi)
        out["interval_coverage"] = float(np.mean(inside[have])) if have.any() else float("nan")
    return out


def gate(cand: dict[str, float], cur: dict[str, float] | None) -> tuple[bool, str]:
    """Promote when the candidate is not worse than the current model on the same rows."""
    if cur is None:
        return True, "no current model"
    if cand["accuracy"] + GATE_TOLERANCE < cur["accuracy"]:
        return False, (
            f"accuracy {cand['accuracy']:.4f} < current {cur['accuracy']:.4f} - {GATE_TOLERANCE}"
        )
    if cand["mape"] > cur["mape"] * 1.05:
        return False, f"MAPE {cand['mape']:.4f} > 1.05 × current {cur['mape']:.4f}"
    return True, (
        f"accuracy {cand['accuracy']:.4f} vs current {cur['accuracy']:.4f}, "
        f"MAPE {cand['mape']:.4f} vs {cur['mape']:.4f}"
    )


def drop_future_rows(dataset: pd.DataFrame, latest: pd.Timestamp) -> tuple[pd.DataFrame, int]:
    """The rows whose submitted_at and ended_at are not after ``latest``, and how many were not."""
    ok = np.ones(len(dataset), bool)
    for col in ("submitted_at", "ended_at"):
        ok &= (pd.to_datetime(dataset[col], utc=True) <= latest).to_numpy()
    if ok.all():
        return dataset, 0
    log.warning("left out %d dataset rows dated after %s", int((~ok).sum()), latest)
    return dataset.loc[ok].reset_index(drop=True), int((~ok).sum())


def train_and_publish(
    dataset: pd.DataFrame,
    registry_root: Path,
    holdout_days: float = 2.0,
    seed: int = 0,
    refit: bool = True,
    progress: bool = True,
    now: pd.Timestamp | None = None,
    latest: pd.Timestamp | None = None,
    rules: HistoryRules = DEFAULT_RULES,
    compile_trees: BoosterCompiler | None = None,
) -> dict[str, Any]:
    """Fit, gate against the current model on the held-out last nights, publish, promote.

    ``latest``: rows submitted or ended after it are impossible (a producer's clock ran ahead,
    e.g. before the worker's time window existed) and are left out; one such row would
    otherwise become "now" and leave every later retrain without held-out rows.
    """
    from leap_stream.store.registry import ModelLoadError, Registry

    t0 = time.perf_counter()
    registry = Registry(registry_root)
    report: dict[str, Any] = {"dataset_rows": len(dataset)}
    if latest is not None:
        dataset, report["future_rows"] = drop_future_rows(dataset, latest)
    sub = pd.to_datetime(dataset["submitted_at"], utc=True)
    now = now or sub.max()  # the last submission: "the held-out last nights" are submission days
    lookup = LookupTable.fit(dataset)
    cutoff = now - pd.Timedelta(days=holdout_days)
    measured = pit.measured(dataset)
    del dataset, sub  # a year of it: the training rows hold what is still needed
    # the gate's candidate rows first, so that its fit takes them as views of the whole
    first = np.argsort(~_known_before(measured, cutoff), kind="stable")
    measured = measured.iloc[first].reset_index(drop=True)
    everything = training_rows(measured, rules=rules)
    del measured  # what training still needs of it is in `everything`
    report["rows"] = len(everything.rows)
    if len(everything.rows) == 0:
        report.update(promoted=False, reason="no measured rows")
        return report
    current: ThroughputModel | None = None
    try:
        loaded = registry.load_current(read_model)
        current = loaded[1] if loaded else None
    except ModelLoadError as exc:
        report["current_error"] = str(exc)
    rows_sub = pd.to_datetime(everything.rows["submitted_at"], utc=True)
    holdout = (rows_sub >= cutoff).to_numpy()
    fresh = holdout.copy()
    window = current.metadata.get("data_window") if current is not None else None
    if window:
        fresh &= (rows_sub > pd.Timestamp(window[1])).to_numpy()
    report["gate_rows"] = int(fresh.sum())
    cand_metrics: dict[str, float] | None = None
    cand_model: ThroughputModel | None = None
    cur_metrics: dict[str, float] | None = None
    if holdout_days > 0 and fresh.sum() >= MIN_GATE_ROWS:
        # the candidate recipe only learns from measurements that had arrived by the cutoff
        before = everything.known_before(cutoff)
        if len(before.rows) >= MIN_GATE_ROWS:
            cand_model = fit(before, seed=seed, progress=progress, compile_trees=compile_trees)
            hold_frame = everything.frame.loc[fresh].reset_index(drop=True)
            hold_y = everything.y[fresh]
            cand_metrics = evaluate(cand_model, hold_frame, hold_y)
            if current is not None:
                try:
                    cur_metrics = evaluate(current, hold_frame, hold_y)
                except Exception as exc:  # an incompatible old model: replace it
                    report["current_error"] = f"{type(exc).__name__}: {exc}"
    promote, why = gate(cand_metrics, cur_metrics) if cand_metrics else (True, "no gate rows")
    if cand_metrics is None and current is not None:
        # rows the current model trained on would flatter it; without new ones, keep it
        promote, why = (
            False,
            (
                f"only {int(fresh.sum())} held-out rows newer than the current model's data; keeping it"
            ),
        )
    report.update(candidate=cand_metrics, current=cur_metrics)
    model = cand_model if cand_model is not None and not refit else None
    if model is None:
        model = fit(everything, seed=seed, progress=progress, compile_trees=compile_trees)
    model.metadata["gate"] = {"candidate": cand_metrics, "current": cur_metrics, "reason": why}
    with tempfile.TemporaryDirectory() as tmp:
        d = write_model(Path(tmp) / model.version, model, lookup)
        version = registry.publish(d)
    report["version"] = version
    if promote:
        registry.promote(version, reason=why, candidate=cand_metrics, current=cur_metrics)
    report.update(promoted=promote, reason=why, train_s=round(time.perf_counter() - t0, 2))
    report["calibration"] = model.metadata["metrics"]
    return report


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", type=Path, help="dataset dir (Parquet by day) or file")
    parser.add_argument("--registry", type=Path, help="model registry dir")
    parser.add_argument(
        "--holdout-days", type=float, default=2.0, help="nights held out by the gate"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-refit", action="store_true", help="publish the gated model as is")
    parser.add_argument("--no-progress", action="store_true")


def _latest_plausible(cfg: Settings) -> pd.Timestamp | None:
    """The wall clock plus the accepted clock skew (LEAP_EVENT_MAX_LEAD_S; 0: no bound)."""
    if cfg.event_max_lead_s <= 0:
        return None
    return pd.Timestamp.now(tz="UTC") + pd.Timedelta(seconds=cfg.event_max_lead_s)


def run(args: argparse.Namespace, cfg: Settings) -> int:
    from leap_stream.store.offline import read_dataset
    from leap_stream.stream import compiled

    if cfg.catalog_file:
        use_catalog_file(cfg.catalog_file)
    dataset_dir = args.dataset or cfg.dataset_dir
    registry_dir = args.registry or cfg.registry_dir
    print(f"train: reading {dataset_dir}", file=sys.stderr)
    report = train_and_publish(
        # not held here: training drops what it no longer needs as it goes
        read_dataset(dataset_dir, columns=TRAINING_COLUMNS, categorical=True),
        Path(registry_dir),
        holdout_days=args.holdout_days,
        seed=args.seed,
        refit=not args.no_refit,
        progress=not args.no_progress,
        latest=_latest_plausible(cfg),
        rules=cfg.history_rules(),  # the worker's, so training sees the history it serves
        compile_trees=compiled.fit_scorer if compiled.wanted(cfg.compiled_trees) else None,
    )
    print(f"train: {report['dataset_rows']} dataset rows", file=sys.stderr)
    verdict = "promoted" if report.get("promoted") else "NOT promoted"
    print(f"train: {report.get('version')} {verdict}: {report.get('reason')}", file=sys.stderr)
    print(orjson.dumps(report, option=orjson.OPT_SERIALIZE_NUMPY).decode())
    return 0
