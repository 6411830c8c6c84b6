"""Benchmark tables → one normalised frame: a row per measurement, per-device throughput.

The documented input shape (docs/evaluate.md) has the columns `workload`, `accelerator_type`,
`accelerator_count` and either `throughput` or `time_to_train`, with optional `group`,
`batch_size`, `precision`, `family`, `parameters`, `sequence_length`. The public tables under
shared/data keep their own shapes; `FORMATS` turns each into the documented one, so a fleet's
own table and a public one go through the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from leap_stream.catalog import HardwareCatalog

REQUIRED = ("workload", "accelerator_type", "accelerator_count")
RATES = ("throughput", "time_to_train")
OPTIONAL = (
    "group",
    "batch_size",
    "precision",
    "family",
    "parameters",
    "layers",
    "hidden_size",
    "sequence_length",
)
# the optional columns the production model reads as the job's configuration (NaN: absent)
NUMERIC = ("parameters", "layers", "hidden_size", "sequence_length", "batch_size")
# Rows are compared only when these match (where the table has them): one "job".
JOB_KEYS = ("group", "workload", "batch_size", "precision", "parameters", "sequence_length")


class TableError(ValueError):
    """The table cannot be read as a benchmark table (missing columns, unknown format)."""


@dataclass(frozen=True)
class Table:
    """Measurements with a known accelerator type: `group`, `workload`, `job` (rows compared
    only within one), `type_id`, `vendor`, `precision`, `family`, `log_pd` (log per-device
    throughput), `count` (devices), the `NUMERIC` configuration columns (NaN: not given),
    `repeats` (measurements folded into the row). `skipped`
    counts what was left out, by reason; `unknown_types` names the accelerator types without
    specs (reported, never guessed); `repeats_folded` counts the measurements that repeated
    another of the same job, type and device count (their median is the row)."""

    name: str
    rows: pd.DataFrame
    skipped: dict[str, int] = field(default_factory=dict)
    unknown_types: dict[str, int] = field(default_factory=dict)
    repeats_folded: int = 0


def _gavel(raw: pd.DataFrame) -> pd.DataFrame:
    """Gavel: steps/s of one job type alone on k80/p100/v100; one group per scale and placement
    (per-device rates of 1 and 8 GPUs are different jobs)."""
    return pd.DataFrame(
        {
            "group": raw["num_gpus"].astype(str) + "gpu-" + raw["placement"].astype(str),
            "workload": raw["model"],
            "batch_size": raw["batch_size"],
            "accelerator_type": raw["hardware"],
            "accelerator_count": raw["num_gpus"],
            "throughput": raw["throughput_steps_per_s"],
        }
    )


def _mlperf(raw: pd.DataFrame) -> pd.DataFrame:
    """MLPerf Training / HPC: closed division, accepted scores, no resubmitted logs; one group
    per round; throughput = 1 ÷ time to train (the logs' convergence points are not in one unit
    within a benchmark: BERT's span 18 orders of magnitude)."""
    keep = (
        (raw["division"] == "closed")
        & (raw["score_status"] == "ok")
        & (raw["same_logs_as"].isna() | (raw["same_logs_as"].astype(str) == ""))
    )
    r = raw[keep]
    return pd.DataFrame(
        {
            "group": r["round"],
            "workload": r["benchmark"],
            "accelerator_type": r["accelerator_type"],
            "accelerator_count": r["accelerator_count"],
            "time_to_train": r["time_to_train_min"],
        }
    )


def _neusight(raw: pd.DataFrame) -> pd.DataFrame:
    """NeuSight: samples/s of one iteration; training and inference are separate groups."""
    return pd.DataFrame(
        {
            "group": raw["mode"],
            "workload": raw["model"],
            "batch_size": raw["batch_size"],
            "sequence_length": raw["seq_len"],
            "layers": raw["num_layers"],
            "precision": raw["precision"],
            "accelerator_type": raw["accelerator_type"],
            "accelerator_count": raw["accelerator_count"],
            "throughput": raw["samples_per_s"],
        }
    )


def _zeus(raw: pd.DataFrame) -> pd.DataFrame:
    """Zeus: epoch time at the maximum power limit (the others are power-capped runs)."""
    r = raw[raw["is_max_power_limit"].astype(str).str.lower() == "true"]
    return pd.DataFrame(
        {
            "workload": r["workload"],
            "batch_size": r["batch_size"],
            "accelerator_type": r["accelerator_type"],
            "accelerator_count": r["accelerator_count"],
            "time_to_train": r["time_per_epoch_s"],
        }
    )


def _standard(raw: pd.DataFrame) -> pd.DataFrame:
    return raw


# format -> (columns that identify it, converter to the documented shape)
FORMATS: dict[str, tuple[tuple[str, ...], Callable[[pd.DataFrame], pd.DataFrame]]] = {
    "standard": (REQUIRED, _standard),
    "gavel": (("model", "hardware", "num_gpus", "throughput_steps_per_s"), _gavel),
    "mlperf": (("benchmark", "round", "time_to_train_min", "accelerator_type"), _mlperf),
    "neusight": (("latency_ms", "mode", "samples_per_s", "accelerator_type"), _neusight),
    "zeus": (("time_per_epoch_s", "is_max_power_limit", "accelerator_type"), _zeus),
}


def detect_format(columns: pd.Index) -> str:
    """The public tables' own shapes first (Zeus also has `workload` and `accelerator_count`),
    then the documented one."""
    for name, (needed, _convert) in sorted(FORMATS.items(), key=lambda kv: kv[0] == "standard"):
        if all(c in columns for c in needed):
            return name
    raise TableError(
        "not a benchmark table: expected the columns "
        f"{', '.join(REQUIRED)} and one of {', '.join(RATES)} (docs/evaluate.md), "
        f"or one of the known formats {', '.join(f for f in FORMATS if f != 'standard')}"
    )


def read_table(path: str | Path, catalog: HardwareCatalog, fmt: str = "auto") -> Table:
    """Read, convert and normalise one CSV (see the module docstring)."""
    try:
        raw = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise TableError(f"{path}: not a CSV table ({exc})") from None
    fmt = detect_format(raw.columns) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise TableError(f"unknown format {fmt!r}; known: auto, {', '.join(FORMATS)}")
    return normalise(FORMATS[fmt][1](raw), catalog, name=Path(path).name)


def normalise(table: pd.DataFrame, catalog: HardwareCatalog, name: str = "table") -> Table:
    """The documented shape → a `Table`: per-device log throughput, catalog type ids."""
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing or not any(c in table.columns for c in RATES):
        need = ", ".join(missing) if missing else " or ".join(RATES)
        raise TableError(f"{name}: missing column(s) {need}")
    t = table.reset_index(drop=True)
    count = pd.to_numeric(t["accelerator_count"], errors="coerce").to_numpy(np.float64)
    rate = _rate(t)
    skipped: dict[str, int] = {}
    ok = np.isfinite(rate) & (rate > 0) & np.isfinite(count) & (count > 0)
    skipped["no_throughput_or_count"] = int((~ok).sum())
    names = t["accelerator_type"].astype(str).to_numpy(object)
    type_id = np.asarray([catalog.resolve(n) for n in names], object)
    unknown = ok & (type_id == None)  # noqa: E711 (elementwise)
    unknown_types = pd.Series(names[unknown]).value_counts().to_dict()
    skipped["no_specs"] = int(unknown.sum())
    ok &= ~unknown
    t = t[ok].reset_index(drop=True)
    ids = type_id[ok]
    rows = pd.DataFrame(
        {
            "group": _text(t, "group"),
            "workload": t["workload"].astype(str).to_numpy(object),
            "precision": _text(t, "precision"),
            "family": _text(t, "family"),
            "type_id": ids,
            "vendor": np.asarray([catalog[i].vendor for i in ids], object),
            "log_pd": np.log(rate[ok] / count[ok]),
            "count": count[ok],
        }
    )
    for column in NUMERIC:
        rows[column] = _number(t, column)
    keys = [_text(t, c) for c in JOB_KEYS]
    rows["job"] = pd.factorize(pd.Series(["\x1f".join(k) for k in zip(*keys, strict=True)]))[0]
    folded = fold_repeats(rows)
    return Table(
        name,
        folded,
        {k: v for k, v in skipped.items() if v},
        {str(k): int(v) for k, v in unknown_types.items()},
        repeats_folded=len(rows) - len(folded),
    )


def fold_repeats(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (job, type, device count): the median log throughput of its repeated
    measurements, `repeats` how many there were. Pairs are then formed once per measured
    configuration, not once per repeat (k repeats on each side would weigh a pair k² times)."""
    by = ["job", "type_id", "count"]
    grouped = rows.groupby(by, sort=False)
    out = grouped.first().reset_index()
    out["log_pd"] = grouped["log_pd"].median().to_numpy()
    out["repeats"] = grouped.size().to_numpy()
    return out[[*rows.columns, "repeats"]]


def _rate(t: pd.DataFrame) -> np.ndarray:
    """Throughput, or 1 / time to train where the table gives that instead."""
    rate = np.full(len(t), np.nan)
    if "throughput" in t.columns:
        rate = pd.to_numeric(t["throughput"], errors="coerce").to_numpy(np.float64)
    if "time_to_train" in t.columns:
        ttt = pd.to_numeric(t["time_to_train"], errors="coerce").to_numpy(np.float64)
        with np.errstate(divide="ignore"):
            rate = np.where(np.isfinite(rate), rate, 1.0 / ttt)
    return np.asarray(rate)


def _number(t: pd.DataFrame, column: str) -> np.ndarray:
    """A numeric column (NaN where absent or not a number)."""
    if column not in t.columns:
        return np.full(len(t), np.nan)
    return np.asarray(pd.to_numeric(t[column], errors="coerce").to_numpy(np.float64))


def _text(t: pd.DataFrame, column: str) -> np.ndarray:
    """A column as strings ("" where absent or empty): optional columns key jobs and levels."""
    if column not in t.columns:
        return np.full(len(t), "", object)
    v = t[column]
    return np.asarray(v.where(v.notna(), "").astype(str).str.strip().to_numpy(object))
