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
import numpy.typing as npt
import orjson
import pandas as pd

from leap_stream.sim.fleet import SimResult


def _epoch_ms(ts: pd.Series) -> npt.NDArray[np.int64]:
    naive = ts.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
    return np.asarray(naive.astype("datetime64[ms]").astype(np.int64))


def rfc3339(ts: pd.Series) -> list[str]:
    """UTC timestamps → ``2026-11-01T00:00:02.234Z`` (millisecond precision, like the sim)."""
    values = ts.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy().astype("datetime64[ms]")
    strings = np.datetime_as_string(values, unit="ms")
    return [s + "Z" for s in strings.tolist()]


def submission_events(subs: pd.DataFrame) -> list[dict[str, Any]]:
    """One job-submitted event per row of a submissions frame."""
    split_cache: dict[str, list[str]] = {}
    cands = []
    for c in subs["candidate_hardware"].tolist():
        lst = split_cache.get(c)
        if lst is None:
            lst = split_cache[c] = c.split("|")
        cands.append(lst)
    rows = zip(
        subs["submission_event_id"].tolist(),
        subs["job_id"].tolist(),
        subs["attempt"].tolist(),
        subs["lineage_id"].tolist(),
        rfc3339(subs["submitted_at"]),
        subs["team"].tolist(),
        subs["family"].tolist(),
        subs["model_type"].tolist(),
        subs["parameters"].tolist(),
        subs["active_parameters"].tolist(),
        subs["layers"].tolist(),
        subs["hidden_size"].tolist(),
        subs["sequence_length"].tolist(),
        subs["precision"].tolist(),
        subs["optimizer"].tolist(),
        subs["framework"].tolist(),
        subs["framework_version"].tolist(),
        subs["global_batch_size"].tolist(),
        subs["micro_batch_size"].tolist(),
        subs["num_devices"].tolist(),
        subs["data_parallel"].tolist(),
        subs["tensor_parallel"].tolist(),
        subs["pipeline_parallel"].tolist(),
        subs["activation_checkpointing"].tolist(),
        cands,
        subs["default_hardware"].tolist(),
        strict=True,
    )
    return [
        {
            "schema_version": 1,
            "event_id": eid,
            "job_id": jid,
            "attempt": att,
            "lineage_id": lid,
            "submitted_at": ts,
            "team": team,
            "model": {
                "family": fam,
                "model_type": mt,
                "parameters": par,
                "active_parameters": apar,
                "layers": lay,
                "hidden_size": hid,
                "sequence_length": seq,
                "precision": prec,
                "optimizer": opt,
                "framework": fw,
                "framework_version": fwv,
            },
            "training": {
                "global_batch_size": gbs,
                "micro_batch_size": mbs,
                "num_devices": nd,
                "data_parallel": dp,
                "tensor_parallel": tp,
                "pipeline_parallel": pp,
                "activation_checkpointing": ckpt,
            },
            "candidate_hardware": list(cand),
            "default_hardware": dflt,
        }
        for (
            eid,
            jid,
            att,
            lid,
            ts,
            team,
            fam,
            mt,
            par,
            apar,
            lay,
            hid,
            seq,
            prec,
            opt,
            fw,
            fwv,
            gbs,
            mbs,
            nd,
            dp,
            tp,
            pp,
            ckpt,
            cand,
            dflt,
        ) in rows
    ]


def completion_events(comp: pd.DataFrame) -> list[dict[str, Any]]:
    """One job-completed event per row; ``throughput`` only when it was measured."""
    rows = zip(
        comp["event_id"].tolist(),
        comp["job_id"].tolist(),
        comp["attempt"].tolist(),
        comp["lineage_id"].tolist(),
        comp["model_type"].tolist(),
        comp["hardware_type"].tolist(),
        comp["num_devices"].tolist(),
        comp["steps"].tolist(),
        rfc3339(comp["started_at"]),
        rfc3339(comp["ended_at"]),
        comp["status"].tolist(),
        comp["device_hours"].tolist(),
        comp["samples_per_s"].tolist(),
        comp["tokens_per_s"].tolist(),
        strict=True,
    )
    out = []
    isnan = math.isnan
    for eid, jid, att, lid, mt, hw, nd, steps, st, en, status, dh, sps, tps in rows:
        ev: dict[str, Any] = {
            "schema_version": 1,
            "event_id": eid,
            "job_id": jid,
            "attempt": att,
            "lineage_id": lid,
            "model_type": mt,
            "hardware_type": hw,
            "num_devices": nd,
            "steps": steps,
            "started_at": st,
            "ended_at": en,
            "status": status,
            "device_hours": dh,
        }
        if not isnan(sps):
            ev["throughput"] = (
                {"samples_per_s": sps}
                if isnan(tps)
                else {"samples_per_s": sps, "tokens_per_s": tps}
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
    t_sub = _epoch_ms(subs["submitted_at"])
    t_comp = _epoch_ms(comp["ended_at"])
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
