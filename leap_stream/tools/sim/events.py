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
import pyarrow as pa
import pyarrow.compute as pc

from leap_stream.contracts.events import JobSubmitted
from leap_stream.contracts.timestamps import epoch_ms, format_column
from leap_stream.tools.sim.config import SimResult


def submission_events(subs: pd.DataFrame) -> list[JobSubmitted]:
    """One job-submitted event per row of a submissions frame (with its ``planned_samples``
    where the frame has them)."""
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
        format_column(subs["submitted_at"]),
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
    events: list[JobSubmitted] = [
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
    if "planned_samples" in subs.columns:
        for ev, planned in zip(events, subs["planned_samples"].tolist(), strict=True):
            if planned == planned and planned > 0:  # not NaN
                ev["training"]["planned_samples"] = float(planned)
    return events


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
        format_column(comp["started_at"]),
        format_column(comp["ended_at"]),
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


# ---------------------------------------------------------------- fast JSON lines
# The same bytes orjson.dumps(event) gives (tests compare every line), assembled column-wise by
# Arrow kernels: literal JSON fragments and encoded columns joined element-wise in C++, so the
# per-event Python work disappears. Floats are encoded by orjson (one call per column) so their
# text is exactly orjson's; strings are quoted without escaping only after a vectorised check that
# none needs it (otherwise the dict path is used).

_LS = pa.large_string()
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def _sa(values: pd.Series) -> pa.Array:
    arr = pa.array(values, type=_LS) if values.dtype == object else pa.array(values).cast(_LS)
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _plain(arrays: list[pa.Array]) -> bool:
    """True when no string needs JSON escaping (then quoting is enough)."""
    return not any(pc.any(pc.match_substring_regex(a, _NEEDS_ESCAPE)).as_py() for a in arrays)


def _floats(values: pd.Series) -> pa.Array:
    """Finite floats as orjson writes them."""
    vals = values.to_numpy(np.float64).tolist()
    text = orjson.dumps(vals).decode()[1:-1].split(",") if vals else []
    return pa.array(text, type=_LS)


def _ints(values: pd.Series) -> pa.Array:
    return pc.cast(pa.array(values.to_numpy(np.int64)), _LS)


def _timestamps(values: pd.Series) -> pa.Array:
    return pa.array(format_column(values), type=_LS)


def _join(pieces: list[str | pa.Array]) -> pa.Array:
    args = [pa.scalar(p, _LS) if isinstance(p, str) else p for p in pieces]
    return pc.binary_join_element_wise(*args, pa.scalar("", _LS))


def _to_bytes(lines: pa.Array) -> list[bytes]:
    out: list[bytes] = lines.cast(pa.large_binary()).to_pylist()
    return out


def _submission_array(subs: pd.DataFrame) -> pa.Array | None:
    strings = {
        c: _sa(subs[c])
        for c in (
            "submission_event_id",
            "job_id",
            "lineage_id",
            "team",
            "family",
            "model_type",
            "precision",
            "optimizer",
            "framework",
            "framework_version",
            "candidate_hardware",
            "default_hardware",
        )
    }
    if not _plain(list(strings.values())):
        return None
    cands = _join(['["', pc.replace_substring(strings["candidate_hardware"], "|", '","'), '"]'])
    ckpt = pc.if_else(
        pa.array(subs["activation_checkpointing"].to_numpy(bool)),
        pa.scalar("true", _LS),
        pa.scalar("false", _LS),
    )
    planned: list[Any] = []
    if "planned_samples" in subs.columns:
        values = subs["planned_samples"].to_numpy(np.float64)
        if not (np.isfinite(values) & (values > 0)).all():
            return None  # the per-event path leaves the field out where it has none
        planned = [',"planned_samples":', _floats(subs["planned_samples"])]
    return _join(
        [
            '{"schema_version":1,"event_id":"',
            strings["submission_event_id"],
            '","job_id":"',
            strings["job_id"],
            '","attempt":',
            _ints(subs["attempt"]),
            ',"lineage_id":"',
            strings["lineage_id"],
            '","submitted_at":"',
            _timestamps(subs["submitted_at"]),
            '","team":"',
            strings["team"],
            '","model":{"family":"',
            strings["family"],
            '","model_type":"',
            strings["model_type"],
            '","parameters":',
            _floats(subs["parameters"]),
            ',"active_parameters":',
            _floats(subs["active_parameters"]),
            ',"layers":',
            _ints(subs["layers"]),
            ',"hidden_size":',
            _ints(subs["hidden_size"]),
            ',"sequence_length":',
            _ints(subs["sequence_length"]),
            ',"precision":"',
            strings["precision"],
            '","optimizer":"',
            strings["optimizer"],
            '","framework":"',
            strings["framework"],
            '","framework_version":"',
            strings["framework_version"],
            '"},"training":{"global_batch_size":',
            _ints(subs["global_batch_size"]),
            ',"micro_batch_size":',
            _ints(subs["micro_batch_size"]),
            ',"num_devices":',
            _ints(subs["num_devices"]),
            ',"data_parallel":',
            _ints(subs["data_parallel"]),
            ',"tensor_parallel":',
            _ints(subs["tensor_parallel"]),
            ',"pipeline_parallel":',
            _ints(subs["pipeline_parallel"]),
            ',"activation_checkpointing":',
            ckpt,
            *planned,
            '},"candidate_hardware":',
            cands,
            ',"default_hardware":"',
            strings["default_hardware"],
            '"}',
        ]
    )


def _completion_array(comp: pd.DataFrame) -> pa.Array | None:
    strings = {
        c: _sa(comp[c])
        for c in ("event_id", "job_id", "lineage_id", "model_type", "hardware_type", "status")
    }
    if not _plain(list(strings.values())):
        return None
    sps = comp["samples_per_s"].to_numpy(np.float64)
    tps = comp["tokens_per_s"].to_numpy(np.float64)
    has_s = ~np.isnan(sps)
    has_t = has_s & ~np.isnan(tps)
    s_txt = _floats(pd.Series(np.where(has_s, sps, 0.0)))
    t_txt = _floats(pd.Series(np.where(has_t, tps, 0.0)))
    both = _join([',"throughput":{"samples_per_s":', s_txt, ',"tokens_per_s":', t_txt, "}}"])
    only = _join([',"throughput":{"samples_per_s":', s_txt, "}}"])
    tail = pc.if_else(pa.array(has_t), both, pc.if_else(pa.array(has_s), only, pa.scalar("}", _LS)))
    return _join(
        [
            '{"schema_version":1,"event_id":"',
            strings["event_id"],
            '","job_id":"',
            strings["job_id"],
            '","attempt":',
            _ints(comp["attempt"]),
            ',"lineage_id":"',
            strings["lineage_id"],
            '","model_type":"',
            strings["model_type"],
            '","hardware_type":"',
            strings["hardware_type"],
            '","num_devices":',
            _ints(comp["num_devices"]),
            ',"steps":',
            _ints(comp["steps"]),
            ',"started_at":"',
            _timestamps(comp["started_at"]),
            '","ended_at":"',
            _timestamps(comp["ended_at"]),
            '","status":"',
            strings["status"],
            '","device_hours":',
            _floats(comp["device_hours"]),
            tail,
        ]
    )


def submission_lines(subs: pd.DataFrame) -> list[bytes]:
    """``[orjson.dumps(e) for e in submission_events(subs)]``, much faster."""
    arr = _submission_array(subs) if len(subs) else None
    if arr is None:
        return [orjson.dumps(e) for e in submission_events(subs)]
    return _to_bytes(arr)


def completion_lines(comp: pd.DataFrame) -> list[bytes]:
    """``[orjson.dumps(e) for e in completion_events(comp)]``, much faster."""
    arr = _completion_array(comp) if len(comp) else None
    if arr is None:
        return [orjson.dumps(e) for e in completion_events(comp)]
    return _to_bytes(arr)


def _write_array_or_lines(path: Path, arr: pa.Array | None, fallback: list[bytes]) -> None:
    """JSONL: one event per line; straight from the Arrow buffer when there is one."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as fh:
        if arr is not None:
            lines = _join([arr, "\n"]).cast(pa.large_binary())
            if isinstance(lines, pa.ChunkedArray):
                lines = lines.combine_chunks()
            offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)
            first, last = offsets[lines.offset], offsets[lines.offset + len(lines)]
            fh.write(memoryview(lines.buffers()[2])[first:last])
        else:
            fh.write(b"\n".join(fallback))
            if fallback:
                fh.write(b"\n")
    tmp.replace(path)


def completions_in_arrival_order(comp: pd.DataFrame) -> pd.DataFrame:
    """Telemetry arrives when a run ends: order by ended_at (ties by event_id, deterministic)."""
    return comp.sort_values(["ended_at", "event_id"], kind="stable").reset_index(drop=True)


def timeline(result: SimResult) -> Iterator[tuple[str, str, bytes]]:
    """(kind, key, value) of every event in time order: submissions at submitted_at,
    completions at ended_at, a submission before anything at the same instant."""
    subs = result.submissions
    comp = result.completions
    sub_lines = submission_lines(subs)
    comp_lines = completion_lines(comp)
    sub_keys = subs["job_id"].tolist()
    comp_keys = comp["job_id"].tolist()
    t_sub = epoch_ms(subs["submitted_at"])
    t_comp = epoch_ms(comp["ended_at"])
    times = np.concatenate([t_sub, t_comp])
    kind = np.concatenate([np.zeros(len(t_sub), np.int8), np.ones(len(t_comp), np.int8)])
    idx = np.concatenate([np.arange(len(t_sub)), np.arange(len(t_comp))])
    order = np.lexsort((idx, kind, times))
    for k, i in zip(kind[order].tolist(), idx[order].tolist(), strict=True):
        if k == 0:
            yield "submission", sub_keys[i], sub_lines[i]
        else:
            yield "completion", comp_keys[i], comp_lines[i]


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
    subs = result.submissions
    sub_arr = _submission_array(subs) if len(subs) else None
    sub_fb = submission_lines(subs) if sub_arr is None else []
    _write_array_or_lines(paths["submissions"], sub_arr, sub_fb)
    comp = completions_in_arrival_order(result.completions)
    comp_arr = _completion_array(comp) if len(comp) else None
    comp_fb = completion_lines(comp) if comp_arr is None else []
    _write_array_or_lines(paths["completions"], comp_arr, comp_fb)
    pq.write_table(
        pa.Table.from_pandas(result.truth, preserve_index=False), paths["truth"], compression="zstd"
    )
    pq.write_table(
        pa.Table.from_pandas(result.dataset, schema=SCHEMA, preserve_index=False),
        paths["dataset"],
        compression="zstd",
    )
    return paths


__all__ = [
    "completion_events",
    "completion_lines",
    "completions_in_arrival_order",
    "submission_events",
    "submission_lines",
    "timeline",
    "write_jsonl",
]
