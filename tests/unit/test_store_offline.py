"""Pure parts of the offline store: the row contract and the table it becomes."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pyarrow as pa

from leap_stream.contracts.timestamps import epoch_s, to_ns, to_timestamp
from leap_stream.store.offline import (
    DATASET_COLUMNS,
    SCHEMA,
    SUBMISSION_COLUMNS,
    flatten,
    rows_to_table,
    submission_fields,
)
from leap_stream.tools import synthetic_events as synthetic

DESIGN_COLUMNS = [
    "event_id",
    "job_id",
    "attempt",
    "lineage_id",
    "submitted_at",
    "team",
    "family",
    "model_type",
    "parameters",
    "active_parameters",
    "layers",
    "hidden_size",
    "sequence_length",
    "precision",
    "optimizer",
    "framework",
    "framework_version",
    "global_batch_size",
    "micro_batch_size",
    "num_devices",
    "data_parallel",
    "tensor_parallel",
    "pipeline_parallel",
    "activation_checkpointing",
    "candidate_hardware",
    "default_hardware",
    "hardware_type",
    "status",
    "samples_per_s",
    "tokens_per_s",
    "steps",
    "started_at",
    "ended_at",
    "device_hours",
    "quarantine",
    "probe",
]


def test_columns_are_the_design_contract() -> None:
    assert list(DATASET_COLUMNS) == DESIGN_COLUMNS
    assert set(SUBMISSION_COLUMNS) < set(DATASET_COLUMNS)
    for col in ("submitted_at", "started_at", "ended_at"):
        assert SCHEMA.field(col).type == pa.timestamp("ns", tz="UTC")


def test_flatten_one_row() -> None:
    [(sub, comp)] = synthetic.pairs(1, seed=2)
    comp = dict(comp, status="succeeded", throughput={"samples_per_s": 120.5}, num_devices=3)
    row = flatten(sub, comp)
    assert list(row) == DESIGN_COLUMNS
    assert row["event_id"] == comp["event_id"]  # the completion's id: the dedup key
    assert row["candidate_hardware"] == "|".join(sub["candidate_hardware"])
    assert row["active_parameters"] == sub["model"]["parameters"]  # default when absent
    assert row["num_devices"] == 3  # measured at the completion's device count
    assert row["samples_per_s"] == 120.5 and math.isnan(row["tokens_per_s"])
    assert row["submitted_at"] == pd.Timestamp(sub["submitted_at"])
    assert str(row["ended_at"].tz) == "UTC"


def test_a_probes_row_is_marked_and_keeps_its_mark_in_a_table() -> None:
    [(sub, comp)], [(sub2, comp2)] = synthetic.pairs(1, seed=2), synthetic.pairs(1, seed=3)
    probe = dict(comp, status="succeeded", throughput={"samples_per_s": 80.0}, probe=True)
    rows = [flatten(sub, probe), flatten(sub2, comp2)]
    assert rows[0]["probe"] is True and rows[1]["probe"] is None  # the attempt's own: null
    back = rows_to_table(rows).to_pylist()
    assert [r["probe"] for r in back] == [True, None]


def test_a_probe_on_a_slice_has_the_slices_shape_in_its_row() -> None:
    [(sub, comp)] = synthetic.pairs(1, seed=2)
    sub = copy.deepcopy(sub)
    sub["training"].update(num_devices=64, data_parallel=16, tensor_parallel=4, pipeline_parallel=1)
    sub["training"]["global_batch_size"] = 1024
    measured = dict(comp, status="succeeded", throughput={"samples_per_s": 80.0}, probe=True)
    row = flatten(sub, dict(measured, num_devices=8))  # two of its 16 replicas
    assert (row["num_devices"], row["data_parallel"], row["global_batch_size"]) == (8, 2, 128)
    whole = flatten(sub, dict(measured, num_devices=64))
    assert (whole["data_parallel"], whole["global_batch_size"]) == (16, 1024)
    # the attempt's own completion keeps its submission's shape, whatever it reports
    own = flatten(sub, dict(measured, probe=False, num_devices=8))
    assert (own["data_parallel"], own["global_batch_size"]) == (16, 1024)


def test_flatten_unmeasured_and_offset_timestamps() -> None:
    [(sub, comp)] = synthetic.pairs(1, seed=4)
    comp = dict(comp, status="failed", ended_at="2026-11-21T02:00:00+02:00")
    comp.pop("throughput", None)
    row = flatten(sub, comp)
    assert math.isnan(row["samples_per_s"])
    assert row["ended_at"] == pd.Timestamp("2026-11-21T00:00:00Z")
    assert epoch_s("1970-01-01T00:00:01.5Z") == 1.5


def test_submission_fields_are_idempotent_and_json_friendly() -> None:
    import orjson

    for sub, comp in synthetic.pairs(20, seed=6):
        fields = submission_fields(sub)
        assert tuple(fields) == SUBMISSION_COLUMNS
        stored = orjson.loads(orjson.dumps(fields))
        assert submission_fields(stored) == fields
        assert flatten(stored, comp) == flatten(sub, comp)


def test_rows_to_table_has_exact_schema() -> None:
    rows = [flatten(s, c) for s, c in synthetic.pairs(50, seed=8)]
    table = rows_to_table(rows)
    assert table.schema == SCHEMA
    assert table.num_rows == 50
    back = table.to_pylist()
    assert back[0]["event_id"] == rows[0]["event_id"]
    assert pd.Timestamp(back[7]["ended_at"]) == rows[7]["ended_at"]
    nan_rows = [i for i, r in enumerate(rows) if math.isnan(r["samples_per_s"])]
    assert all(
        back[i]["samples_per_s"] is None or math.isnan(back[i]["samples_per_s"]) for i in nan_rows
    )


def test_timestamps_parse_like_pandas() -> None:
    for text in (
        "2026-11-20T10:11:12.123Z",
        "2026-11-20T12:11:12.123456+02:00",
        "2026-11-20T10:11:12.123456789Z",  # sub-microsecond digits are kept
        "2026-11-20T10:11:12.1234567-01:00",
        "2026-11-20T10:11:12",  # naive: UTC
    ):
        want = pd.Timestamp(text)
        want = want.tz_localize("UTC") if want.tzinfo is None else want.tz_convert("UTC")
        assert to_ns(text) == want.value, text
        assert to_timestamp(text) == want and str(to_timestamp(text).tz) == "UTC"
    assert epoch_s("2026-11-20T10:11:12.5Z") == to_ns("2026-11-20T10:11:12.5Z") / 1e9


def test_vectorised_epoch_seconds_match_scalar_bit_for_bit() -> None:
    import numpy as np

    from leap_stream.contracts.timestamps import epoch_seconds

    texts = [c["ended_at"] for _s, c in synthetic.pairs(2000, seed=12)]
    col = pd.Series([to_timestamp(t) for t in texts])
    got = epoch_seconds(col)
    want = np.array([epoch_s(t) for t in texts])
    assert np.array_equal(got, want)
    assert np.array_equal(epoch_seconds(col.astype("datetime64[us, UTC]")), want)
