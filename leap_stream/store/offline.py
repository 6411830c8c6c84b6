"""The offline store: the training dataset, one Parquet row per completion joined with its submission.

Writes are atomic and idempotent (temp file, fsync, ``os.replace`` to a name derived from the
batch's event ids, fsync of the folder), reads de-duplicate by ``event_id``, so a worker that
crashes after writing but before committing its Kafka offsets never produces a duplicate row.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from leap_stream.contracts.timestamps import to_ns, to_timestamp
from leap_stream.core.probe import slice_shape
from leap_stream.core.rows import SUBMISSION_COLUMNS, submission_fields
from leap_stream.store.files import fsync_dir, write_atomic

_TS = pa.timestamp("ns", tz="UTC")

# The dataset contract of docs/design.md, in order. The simulator writes the same columns.
SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("job_id", pa.string()),
        ("attempt", pa.int64()),
        ("lineage_id", pa.string()),
        ("submitted_at", _TS),
        ("team", pa.string()),
        ("family", pa.string()),
        ("model_type", pa.string()),
        ("parameters", pa.float64()),
        ("active_parameters", pa.float64()),
        ("layers", pa.int64()),
        ("hidden_size", pa.int64()),
        ("sequence_length", pa.int64()),
        ("precision", pa.string()),
        ("optimizer", pa.string()),
        ("framework", pa.string()),
        ("framework_version", pa.string()),
        ("global_batch_size", pa.int64()),
        ("micro_batch_size", pa.int64()),
        ("num_devices", pa.int64()),
        ("data_parallel", pa.int64()),
        ("tensor_parallel", pa.int64()),
        ("pipeline_parallel", pa.int64()),
        ("activation_checkpointing", pa.bool_()),
        ("candidate_hardware", pa.string()),
        ("default_hardware", pa.string()),
        ("hardware_type", pa.string()),
        ("status", pa.string()),
        ("samples_per_s", pa.float64()),
        ("tokens_per_s", pa.float64()),
        ("steps", pa.int64()),
        ("started_at", _TS),
        ("ended_at", _TS),
        ("device_hours", pa.float64()),
        # the history rule that quarantined the measurement (core.history), null when accepted
        ("quarantine", pa.string()),
        # a probe's measurement (a short run on a candidate before the attempt ran), null when
        # the attempt's own run
        ("probe", pa.bool_()),
    ]
)
DATASET_COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
TIMESTAMP_COLUMNS = ("submitted_at", "started_at", "ended_at")
# Columns added after the first release: files written before them read as null.
LATER_COLUMNS = ("quarantine", "probe")


def flatten(
    submission: Mapping[str, Any], completion: Mapping[str, Any], quarantine: str | None = None
) -> dict[str, Any]:
    """One dataset row. ``num_devices`` is the completion's: the count the throughput was measured
    at (a probe's slice of the job has its data-parallel degree and global batch too);
    ``quarantine`` the rule that kept its measurement out of the history, if one did."""
    row = submission_fields(submission)
    if completion.get("probe"):
        _as_slice(row, int(completion["num_devices"]))
    throughput = completion.get("throughput") or {}
    sps = throughput.get("samples_per_s")
    tps = throughput.get("tokens_per_s")
    row.update(
        event_id=completion["event_id"],
        num_devices=int(completion["num_devices"]),
        hardware_type=completion["hardware_type"],
        status=completion["status"],
        samples_per_s=math.nan if sps is None else float(sps),
        tokens_per_s=math.nan if tps is None else float(tps),
        steps=int(completion["steps"]),
        started_at=completion["started_at"],
        ended_at=completion["ended_at"],
        device_hours=float(completion["device_hours"]),
        quarantine=quarantine,
        probe=True if completion.get("probe") else None,
    )
    for col in TIMESTAMP_COLUMNS:
        row[col] = to_timestamp(row[col])
    return {col: row[col] for col in DATASET_COLUMNS}


def _as_slice(row: dict[str, Any], num_devices: int) -> None:
    """A probe's row at its slice's shape (`core.probe.slice_shape`) when it ran on a whole
    number of the job's data-parallel replicas, fewer than all."""
    asked, dp = int(row["num_devices"]), max(int(row["data_parallel"]), 1)
    per_replica = max(asked // dp, 1)
    if num_devices >= asked or num_devices % per_replica:
        return
    k = num_devices // per_replica
    _nd, batch = slice_shape(
        np.asarray([asked]),
        np.asarray([dp]),
        np.asarray([int(row["global_batch_size"])]),
        np.asarray([k]),
    )
    row["data_parallel"], row["global_batch_size"] = k, int(batch[0])


def completions_from_frame(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Dataset rows → the completion fields the history needs, in ``ended_at`` order.

    For rebuilding the online history after Redis lost it: the replay order is the one the
    trainer uses, which is also the order completions normally arrive in.
    """
    cols = ["event_id", "job_id", "attempt", "lineage_id", "model_type", "hardware_type"]
    cols += ["num_devices", "status", "samples_per_s", "ended_at"]
    f = frame[cols].sort_values(["ended_at", "event_id"], kind="stable")
    out = []
    for r in f.to_dict("records"):
        sps = float(r["samples_per_s"])
        r["attempt"] = int(r["attempt"])
        r["num_devices"] = int(r["num_devices"])
        r["throughput"] = None if math.isnan(sps) else {"samples_per_s": sps}
        del r["samples_per_s"]
        out.append({str(k): v for k, v in r.items()})
    return out


def rows_to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts) → a table with exactly ``SCHEMA``, timestamps normalised to ns UTC."""
    columns: dict[str, list[Any]] = {c: [] for c in DATASET_COLUMNS}
    for row in rows:
        for c in DATASET_COLUMNS:
            columns[c].append(row.get(c) if c in LATER_COLUMNS else row[c])
    arrays = []
    for field in SCHEMA:
        values = columns[field.name]
        if field.name in TIMESTAMP_COLUMNS:
            values = [to_ns(v) for v in values]
            arrays.append(pa.array(values, type=pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, type=field.type, from_pandas=True))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def conform(table: pa.Table, schema: pa.Schema = SCHEMA) -> pa.Table:
    """Cast a table read from disk (ours or the simulator's) to ``schema`` (``SCHEMA`` or a
    selection of its fields), dropping extra columns."""
    arrays = []
    for field in schema:
        if field.name in LATER_COLUMNS and field.name not in table.column_names:
            arrays.append(pa.nulls(table.num_rows, field.type))
            continue
        col = table.column(field.name)
        if col.type != field.type:
            if pa.types.is_timestamp(col.type) and col.type.tz is None:
                col = col.cast(pa.timestamp(col.type.unit)).cast(pa.timestamp(col.type.unit, "UTC"))
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            col = col.cast(field.type)
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


def _batch_name(event_ids: Iterable[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(event_ids)).encode()).hexdigest()[:32]
    return f"part-{digest}.parquet"


_WRITTEN_KEY = b"leap.written_ns"
_last_stamp = 0


def _stamp() -> bytes:
    """Strictly increasing write stamp (ns): mtimes can tie within one clock tick."""
    global _last_stamp
    _last_stamp = max(time.time_ns(), _last_stamp + 1)
    return str(_last_stamp).encode()


def _write_table(table: pa.Table, folder: Path, name: str) -> Path:
    table = table.replace_schema_metadata({_WRITTEN_KEY: _stamp()})
    return write_atomic(folder / name, lambda fh: pq.write_table(table, fh, compression="zstd"))


def _day_of(ts: pd.Timestamp) -> str:
    return ts.strftime("%Y-%m-%d")


class DatasetSink:
    """Appends rows to ``root/day=YYYY-MM-DD/part-<hash>.parquet``; durable when `append` returns."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def append(self, rows: Iterable[Mapping[str, Any]]) -> list[Path]:
        by_day: dict[str, list[Mapping[str, Any]]] = {}
        for row in rows:
            by_day.setdefault(_day_of(to_timestamp(row["submitted_at"])), []).append(row)
        written = []
        for day, day_rows in sorted(by_day.items()):
            table = rows_to_table(day_rows)
            name = _batch_name(str(r["event_id"]) for r in day_rows)
            written.append(_write_table(table, self.root / f"day={day}", name))
        if written:
            fsync_dir(self.root)
        return written

    def append_frame(self, frame: pd.DataFrame) -> list[Path]:
        """`append` for rows already in a frame with the dataset's columns (the simulator's):
        no dict per row, the same files."""
        if frame.empty:
            return []
        table = conform(pa.Table.from_pandas(frame, preserve_index=False))
        days = pd.to_datetime(frame["submitted_at"], utc=True).dt.strftime("%Y-%m-%d")
        written = []
        for day in sorted(days.unique()):
            rows = np.flatnonzero((days == day).to_numpy())
            part = table.take(pa.array(rows))
            name = _batch_name(part.column("event_id").to_pylist())
            written.append(_write_table(part, self.root / f"day={day}", name))
        fsync_dir(self.root)
        return written


def _as_day(value: str | date | datetime | pd.Timestamp | None) -> str | None:
    if value is None:
        return None
    return _day_of(to_timestamp(value))


def _files(root: Path, start_day: str | None, end_day: str | None) -> list[Path]:
    """Data files within the day-partition range (temp files of a crashed write excluded)."""
    files: list[Path] = []
    for folder in sorted(root.glob("day=*")):
        day = folder.name.removeprefix("day=")
        if (start_day and day < start_day) or (end_day and day > end_day):
            continue
        files.extend(p for p in folder.glob("*.parquet") if not p.name.startswith("."))
    files.extend(p for p in root.glob("*.parquet") if not p.name.startswith("."))
    return files


def _written_key(table: pa.Table, path: Path) -> tuple[int, str]:
    """Write order: our stamp in the file metadata, else the mtime (files of other writers)."""
    meta = table.schema.metadata or {}
    stamp = meta.get(_WRITTEN_KEY)
    if stamp is not None:
        return (int(stamp), path.name)
    return (path.stat().st_mtime_ns, path.name)


def _read_file(path: Path, schema: pa.Schema) -> pa.Table:
    """One Parquet file's columns of ``schema`` (a column the file lacks is read as null)."""
    have = set(pq.read_schema(path).names)
    return pq.read_table(path, columns=[c for c in schema.names if c in have])


def _read_tables(
    files: list[Path], schema: pa.Schema = SCHEMA, categorical: bool = False
) -> pa.Table:
    """All files concatenated earliest written first, so `_dedup` keeps the earliest copy.
    ``categorical``: string columns but the event id dictionary-encoded file by file, so a
    year's strings are never in memory in full."""
    keyed = []
    for path in files:
        try:
            raw = _read_file(path, schema)
            table = conform(raw, schema)
            keyed.append((_written_key(raw, path), _encoded(table) if categorical else table))
        except FileNotFoundError:
            continue  # removed by a concurrent compact; its rows live in the compacted file
    if not keyed:
        return schema.empty_table()
    keyed.sort(key=lambda kt: kt[0])
    return pa.concat_tables([t for _k, t in keyed])


def _encoded(table: pa.Table) -> pa.Table:
    """String columns (but the event id, the dedup key) dictionary-encoded."""
    for i, field in enumerate(table.schema):
        if pa.types.is_string(field.type) and field.name != "event_id":
            table = table.set_column(i, field.name, pc.dictionary_encode(table.column(i)))
    return table


def _narrowed(table: pa.Table) -> pa.Table:
    """Integer columns as int32 where every value fits (layer counts, batch sizes, devices)."""
    for i, field in enumerate(table.schema):
        col = table.column(i)
        if field.type != pa.int64() or col.null_count or len(col) == 0:
            continue
        bounds = pc.min_max(col)
        if bounds["min"].as_py() >= -(2**31) and bounds["max"].as_py() < 2**31:
            table = table.set_column(i, field.name, col.cast(pa.int32()))
    return table


def _dedup(table: pa.Table) -> pa.Table:
    """Keep the first row of every event_id (tables are concatenated earliest file first)."""
    if table.num_rows == 0:
        return table
    idx = pa.array(range(table.num_rows), type=pa.int64())
    firsts = (
        table.select(["event_id"])
        .append_column("_i", idx)
        .group_by("event_id", use_threads=False)
        .aggregate([("_i", "min")])
        .column("_i_min")
    )
    if len(firsts) == table.num_rows:
        return table  # nothing repeated: no copy
    return table.take(firsts.take(pc.array_sort_indices(firsts)))


def to_frame(table: pa.Table) -> pd.DataFrame:
    """Dictionary-encoded columns become pandas categoricals."""
    frame = table.to_pandas()
    for col in TIMESTAMP_COLUMNS:
        if col in frame.columns:
            frame[col] = frame[col].astype("datetime64[ns, UTC]")
    return frame


def read_dataset(
    root: str | os.PathLike[str],
    start: str | date | datetime | pd.Timestamp | None = None,
    end: str | date | datetime | pd.Timestamp | None = None,
    columns: Sequence[str] | None = None,
    categorical: bool = False,
) -> pd.DataFrame:
    """Rows with ``start <= submitted_at < end`` (either bound optional), one per event_id.

    ``root`` is a dataset folder (``day=`` partitions) or a single Parquet file (the simulator's).
    ``columns``: only these dataset columns (all when None); ``categorical``: string columns
    as pandas categoricals and integer columns as int32 where they fit. Both keep a year of
    history small in memory: the string columns are most of a row and have a few hundred
    distinct values each (training reads so).
    """
    root = Path(root)
    wanted = SCHEMA if columns is None else _schema_of([*columns, "event_id", "submitted_at"])
    if root.is_file():
        table = conform(_read_file(root, wanted), wanted)
        table = _encoded(table) if categorical else table
    elif root.is_dir():
        table = _read_tables(_files(root, _as_day(start), _as_day(end)), wanted, categorical)
    else:
        table = wanted.empty_table()
    table = _dedup(table)
    if start is not None or end is not None:
        sub = table.column("submitted_at")
        mask = pa.array([True] * table.num_rows, type=pa.bool_())
        if start is not None:
            lo = pa.scalar(to_timestamp(start).value, pa.int64()).cast(_TS)
            mask = pc.and_(mask, pc.greater_equal(sub, lo))
        if end is not None:
            hi = pa.scalar(to_timestamp(end).value, pa.int64()).cast(_TS)
            mask = pc.and_(mask, pc.less(sub, hi))
        table = table.filter(mask)
    if columns is not None:
        table = table.select(list(dict.fromkeys(columns)))
    frame = to_frame(_narrowed(table) if categorical else table)
    del table
    pa.default_memory_pool().release_unused()  # the Arrow copy of a year, back to the system
    return frame


def _schema_of(columns: Sequence[str]) -> pa.Schema:
    """The fields of ``SCHEMA`` named in ``columns``, in the dataset's order."""
    unknown = set(columns) - set(SCHEMA.names)
    if unknown:
        raise ValueError(f"not dataset columns: {sorted(unknown)}")
    return pa.schema([f for f in SCHEMA if f.name in set(columns)])


def compact(root: str | os.PathLike[str], day: str | date | datetime | pd.Timestamp) -> Path | None:
    """Rewrite one day partition as a single de-duplicated file; None when the day is empty.

    The new file is durable before the old ones go, so a crash in between leaves duplicates
    that `read_dataset` drops (same rows), never a loss.
    """
    day_s = _as_day(day)
    folder = Path(root) / f"day={day_s}"
    files = _files(Path(root), day_s, day_s)
    files = [p for p in files if p.parent == folder]
    if not files:
        return None
    table = _dedup(_read_tables(files))
    table = table.take(pc.sort_indices(table, sort_keys=[("submitted_at", "ascending")]))
    name = _batch_name(table.column("event_id").to_pylist())
    if len(files) == 1 and files[0].name == name:
        return files[0]
    final = _write_table(table, folder, name)
    for path in files:
        if path != final:
            path.unlink(missing_ok=True)
    fsync_dir(folder)
    return final


__all__ = [
    "DATASET_COLUMNS",
    "SCHEMA",
    "SUBMISSION_COLUMNS",
    "DatasetSink",
    "compact",
    "completions_from_frame",
    "flatten",
    "read_dataset",
    "rows_to_table",
    "submission_fields",
]
