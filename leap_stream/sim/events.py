"""Simulator frames → schema-valid events (job-submitted, job-completed), and JSONL output.

Column-wise conversion (``tolist`` once per column, timestamps formatted by numpy) keeps the
per-event Python work to building one dict, which is what makes >100k events/s possible.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from leap_stream.sim.fleet import SimResult


def rfc3339(ts: pd.Series) -> list[str]:
    """UTC timestamps → ``2026-11-01T00:00:02.234Z`` (millisecond precision, like the sim)."""
    values = ts.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy().astype("datetime64[ms]")
    strings = np.datetime_as_string(values, unit="ms")
    return [s + "Z" for s in strings.tolist()]


def submission_events(subs: pd.DataFrame) -> list[dict[str, Any]]:
    """One job-submitted event per row of a submissions frame."""
    cols = {c: subs[c].tolist() for c in subs.columns if c not in ("submitted_at", "has_prior")}
    ts = rfc3339(subs["submitted_at"])
    split_cache: dict[str, list[str]] = {}
    cands = []
    for c in cols["candidate_hardware"]:
        lst = split_cache.get(c)
        if lst is None:
            lst = split_cache[c] = c.split("|")
        cands.append(lst)
    out = []
    for i in range(len(subs)):
        out.append(
            {
                "schema_version": 1,
                "event_id": cols["submission_event_id"][i],
                "job_id": cols["job_id"][i],
                "attempt": cols["attempt"][i],
                "lineage_id": cols["lineage_id"][i],
                "submitted_at": ts[i],
                "team": cols["team"][i],
                "model": {
                    "family": cols["family"][i],
                    "model_type": cols["model_type"][i],
                    "parameters": cols["parameters"][i],
                    "active_parameters": cols["active_parameters"][i],
                    "layers": cols["layers"][i],
                    "hidden_size": cols["hidden_size"][i],
                    "sequence_length": cols["sequence_length"][i],
                    "precision": cols["precision"][i],
                    "optimizer": cols["optimizer"][i],
                    "framework": cols["framework"][i],
                    "framework_version": cols["framework_version"][i],
                },
                "training": {
                    "global_batch_size": cols["global_batch_size"][i],
                    "micro_batch_size": cols["micro_batch_size"][i],
                    "num_devices": cols["num_devices"][i],
                    "data_parallel": cols["data_parallel"][i],
                    "tensor_parallel": cols["tensor_parallel"][i],
                    "pipeline_parallel": cols["pipeline_parallel"][i],
                    "activation_checkpointing": cols["activation_checkpointing"][i],
                },
                "candidate_hardware": list(cands[i]),
                "default_hardware": cols["default_hardware"][i],
            }
        )
    return out


def completion_events(comp: pd.DataFrame) -> list[dict[str, Any]]:
    """One job-completed event per row; ``throughput`` only when it was measured."""
    names = ("event_id", "job_id", "attempt", "lineage_id", "model_type", "hardware_type")
    cols = {c: comp[c].tolist() for c in names}
    nd = comp["num_devices"].tolist()
    sps = comp["samples_per_s"].tolist()
    tps = comp["tokens_per_s"].tolist()
    steps = comp["steps"].tolist()
    status = comp["status"].tolist()
    dev_h = comp["device_hours"].tolist()
    started = rfc3339(comp["started_at"])
    ended = rfc3339(comp["ended_at"])
    out = []
    for i in range(len(comp)):
        ev: dict[str, Any] = {
            "schema_version": 1,
            "event_id": cols["event_id"][i],
            "job_id": cols["job_id"][i],
            "attempt": cols["attempt"][i],
            "lineage_id": cols["lineage_id"][i],
            "model_type": cols["model_type"][i],
            "hardware_type": cols["hardware_type"][i],
            "num_devices": nd[i],
            "steps": steps[i],
            "started_at": started[i],
            "ended_at": ended[i],
            "status": status[i],
            "device_hours": dev_h[i],
        }
        s = sps[i]
        if not math.isnan(s):
            t = tps[i]
            ev["throughput"] = (
                {"samples_per_s": s} if math.isnan(t) else {"samples_per_s": s, "tokens_per_s": t}
            )
        out.append(ev)
    return out


def completions_in_arrival_order(comp: pd.DataFrame) -> pd.DataFrame:
    """Telemetry arrives when a run ends: order by ended_at (ties by event_id, deterministic)."""
    return comp.sort_values(["ended_at", "event_id"], kind="stable").reset_index(drop=True)


def timeline(result: SimResult) -> Iterator[tuple[str, str, bytes]]:
    """(kind, key, value) of every event in time order: submissions at submitted_at,
    completions at ended_at, a submission before anything at the same instant."""
    subs = result.submissions
    comp = result.completions
    sub_ev = submission_events(subs)
    comp_ev = completion_events(comp)
    t_sub = subs["submitted_at"].to_numpy().astype("datetime64[ns]").astype(np.int64)
    t_comp = comp["ended_at"].to_numpy().astype("datetime64[ns]").astype(np.int64)
    times = np.concatenate([t_sub, t_comp])
    kind = np.concatenate([np.zeros(len(t_sub), np.int8), np.ones(len(t_comp), np.int8)])
    idx = np.concatenate([np.arange(len(t_sub)), np.arange(len(t_comp))])
    order = np.lexsort((idx, kind, times))
    dumps = orjson.dumps
    for j in order.tolist():
        if kind[j] == 0:
            ev = sub_ev[idx[j]]
            yield "submission", ev["job_id"], dumps(ev)
        else:
            ev = comp_ev[idx[j]]
            yield "completion", ev["job_id"], dumps(ev)


def write_jsonl(result: SimResult, out_dir: Path | str) -> dict[str, Path]:
    """``submissions.jsonl`` (submitted_at order), ``completions.jsonl`` (ended_at order),
    ``truth.parquet`` and ``dataset.parquet`` (offline-store schema) in ``out_dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from leap_stream.store.offline import SCHEMA

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "submissions": out / "submissions.jsonl",
        "completions": out / "completions.jsonl",
        "truth": out / "truth.parquet",
        "dataset": out / "dataset.parquet",
    }
    _write_lines(paths["submissions"], submission_events(result.submissions))
    comp = completions_in_arrival_order(result.completions)
    _write_lines(paths["completions"], completion_events(comp))
    pq.write_table(
        pa.Table.from_pandas(result.truth, preserve_index=False), paths["truth"], compression="zstd"
    )
    pq.write_table(
        pa.Table.from_pandas(result.dataset, schema=SCHEMA, preserve_index=False),
        paths["dataset"],
        compression="zstd",
    )
    return paths


def _write_lines(path: Path, events: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    dumps = orjson.dumps
    with open(tmp, "wb") as fh:
        fh.write(b"\n".join(dumps(e) for e in events))
        if events:
            fh.write(b"\n")
    tmp.replace(path)


__all__ = [
    "completion_events",
    "completions_in_arrival_order",
    "rfc3339",
    "submission_events",
    "timeline",
    "write_jsonl",
]
