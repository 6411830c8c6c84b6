"""`leap-stream evaluate`: reading benchmark tables, the fixed protocol, the estimators."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from leap_stream.catalog import load_reference_catalog
from leap_stream.cli import main
from leap_stream.tools.evaluate import methods as M
from leap_stream.tools.evaluate import production
from leap_stream.tools.evaluate.metrics import OrderPairs
from leap_stream.tools.evaluate.protocol import (
    FOLDS,
    METHODS,
    evaluate,
    order_accuracy,
    pairs,
    predict_held_out,
    predict_left_out_types,
    workload_folds,
)
from leap_stream.tools.evaluate.table import TableError, normalise, read_table
from leap_stream.tools.sim.real import TABLES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "benchmarks"
CATALOG = load_reference_catalog()


def _standard(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["workload", "accelerator_type", "throughput"]).assign(
        accelerator_count=1
    )


@pytest.mark.parametrize(
    ("path", "fmt", "min_rows"),
    [
        (TABLES["simulation"], "gavel", 400),
        (FIXTURES / "neusight_train_cut.csv", "neusight", 30),
        (FIXTURES / "mlperf_v3.0_cut.csv", "mlperf", 60),
        (FIXTURES / "zeus_cut.csv", "zeus", 50),
    ],
)
def test_each_public_shape_is_read(path: Path, fmt: str, min_rows: int) -> None:
    t = read_table(path, CATALOG)
    assert len(t.rows) >= min_rows, fmt
    assert np.isfinite(t.rows["log_pd"]).all()
    assert set(t.rows["type_id"]) <= set(CATALOG.types)
    assert t.rows["job"].nunique() < len(t.rows)  # rows of one job exist to be compared


def test_zeus_keeps_only_the_uncapped_power_limit() -> None:
    raw = pd.read_csv(FIXTURES / "zeus_cut.csv")
    t = read_table(FIXTURES / "zeus_cut.csv", CATALOG)
    assert len(t.rows) + t.repeats_folded == int(raw["is_max_power_limit"].sum())


def test_types_without_specs_are_reported_not_guessed() -> None:
    t = normalise(
        _standard([("w", "H100-SXM", 10.0), ("w", "IPU-Bow", 9.0), ("w", "ipu-bow", 8.0)]),
        CATALOG,
    )
    assert list(t.rows["type_id"]) == ["h100-sxm"]
    assert t.skipped == {"no_specs": 2}
    assert t.unknown_types == {"IPU-Bow": 1, "ipu-bow": 1}


def test_repeated_measurements_fold_into_their_median_before_pairs() -> None:
    """Three repeats on one side and two on the other are one pair each way, at the medians
    of the log throughputs; another device count of the same type is another configuration, not a repeat."""
    t = normalise(
        pd.DataFrame(
            {
                "workload": ["w"] * 6,
                "accelerator_type": ["a100-80g"] * 3 + ["h100-sxm"] * 2 + ["a100-80g"],
                "accelerator_count": [1, 1, 1, 1, 1, 8],
                "throughput": [10.0, 11.0, 30.0, 20.0, 24.0, 64.0],
            }
        ),
        CATALOG,
    )
    assert t.repeats_folded == 3
    by = {(r.type_id, r.count): r for r in t.rows.itertuples()}
    assert set(by) == {("a100-80g", 1.0), ("h100-sxm", 1.0), ("a100-80g", 8.0)}
    assert by[("a100-80g", 1.0)].log_pd == pytest.approx(np.log(11.0))
    assert by[("h100-sxm", 1.0)].log_pd == pytest.approx(np.log(np.sqrt(20.0 * 24.0)))
    assert [by[k].repeats for k in sorted(by)] == [3, 1, 2]
    p = pairs(t.rows, CATALOG)
    assert len(p) == 4  # (a100 x1, h100), (a100 x8, h100) and back


def test_time_to_train_is_a_rate_and_counts_make_it_per_device() -> None:
    t = normalise(
        pd.DataFrame(
            {
                "workload": ["w", "w"],
                "accelerator_type": ["a100-80g", "h100-sxm"],
                "accelerator_count": [8, 4],
                "time_to_train": [10.0, 5.0],
            }
        ),
        CATALOG,
    )
    np.testing.assert_allclose(np.exp(t.rows["log_pd"]), [1 / 80, 1 / 20])


def test_a_table_without_the_columns_is_refused() -> None:
    with pytest.raises(TableError, match="missing column"):
        normalise(pd.DataFrame({"workload": ["w"], "accelerator_type": ["t4"]}), CATALOG)


def test_pairs_stay_inside_a_job_and_across_types() -> None:
    df = _standard([("w", "a100-80g", 1.0), ("w", "h100-sxm", 2.0), ("w", "h100-sxm", 2.2)])
    df["batch_size"] = [8, 8, 16]
    p = pairs(normalise(df, CATALOG).rows, CATALOG)
    # batch 16 is another job; a100 ↔ h100 of batch 8, both ways
    assert sorted(zip(p["a_type"], p["b_type"], strict=True)) == [
        ("a100-80g", "h100-sxm"),
        ("h100-sxm", "a100-80g"),
    ]
    np.testing.assert_allclose(sorted(p["log_ratio"]), [-np.log(2), np.log(2)])


def test_held_out_workload_is_never_learned_from() -> None:
    """The median of the *other* workloads' ratios: each workload here has its own ratio, so
    a leak of its own pairs would show as an exact prediction."""
    rows = []
    for i, ratio in enumerate((1.5, 2.0, 3.0)):
        rows += [(f"w{i}", "a100-80g", 1.0), (f"w{i}", "h100-sxm", ratio)]
    p = pairs(normalise(_standard(rows), CATALOG).rows, CATALOG)
    pred = predict_held_out(p, "median_ratio_others")
    up = p["a_type"].to_numpy() == "a100-80g"
    got = dict(zip(p["workload"][up], np.exp(pred[up]), strict=True))
    assert got == pytest.approx(
        {"w0": np.sqrt(2.0 * 3.0), "w1": np.sqrt(1.5 * 3.0), "w2": np.sqrt(1.5 * 2.0)}
    )


def test_a_left_out_type_is_never_learned_from() -> None:
    """mi300x runs every workload 1.8× faster than h100-sxm, which its datasheet does not
    say: with workloads left out the other workloads teach it; with the type left out nothing
    does: no pair left to learn from has mi300x on either side."""
    rows = []
    for i in range(4):
        rows += [(f"w{i}", "h100-sxm", 10.0), (f"w{i}", "mi300x", 18.0), (f"w{i}", "a100-80g", 5.0)]
    p = pairs(normalise(_standard(rows), CATALOG).rows, CATALOG)
    into = p["b_type"].to_numpy() == "mi300x"
    by_workload = predict_held_out(p, "median_ratio_others")
    by_type = predict_left_out_types(p, "median_ratio_others")
    np.testing.assert_allclose(by_workload[into], p["log_ratio"][into])
    # a type pair never seen looks up 0: the ratio 1, whatever mi300x really does
    np.testing.assert_allclose(by_type[into], 0.0)


def test_leaving_types_out_reports_each_type_and_skips_a_lone_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Per type: its predictions and every method's figures; two types only: a type left out
    leaves nothing to learn from, so nothing is predicted and no figure is made up."""
    rows = [(f"w{i}", t, v * (1 + i)) for i in range(3) for t, v in
            (("h100-sxm", 10.0), ("mi300x", 18.0), ("a100-80g", 5.0))]  # fmt: skip
    _standard(rows).to_csv(tmp_path / "t.csv", index=False)
    assert (
        main(["evaluate", "--table", str(tmp_path / "t.csv"), "--leave-out", "type", "--json"]) == 0
    )
    text = capsys.readouterr().out
    out = orjson.loads(text.strip().splitlines()[-1])
    assert out["leave_out"] == "type"
    assert set(out["by_type"]) == {"h100-sxm", "mi300x", "a100-80g"}
    assert sum(r["predictions"] for r in out["by_type"].values()) == out["predictions"] == 18
    assert set(out["by_type"]["mi300x"]["methods"]) == set(METHODS)
    assert "type left out" in text
    two = normalise(_standard([("w0", "h100-sxm", 1.0), ("w0", "a100-80g", 2.0)]), CATALOG)
    lone = evaluate(two.rows, CATALOG, leave_out="type")
    assert lone["by_type"] == {}
    assert lone["methods"]["model"] == {}  # nothing predicted, no figure
    with pytest.raises(ValueError, match="leave_out"):
        evaluate(two.rows, CATALOG, leave_out="group")


def test_the_inner_selection_fits_a_bounded_number_of_folds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty training workloads: INNER_FOLDS folds of them, never a held-out workload in its
    own training set, and each workload held out exactly once."""
    rows = []
    for i in range(20):
        rows += [(f"w{i}", "a100-80g", 1.0), (f"w{i}", "h100-sxm", 1.5 + i / 10)]
    p = pairs(normalise(_standard(rows), CATALOG).rows, CATALOG)
    held: list[frozenset[str]] = []
    real = M._Model.on.__func__  # type: ignore[attr-defined]

    def on(cls: type, train: pd.DataFrame, *args: object, **kw: object) -> object:
        held.append(frozenset(p["workload"]) - frozenset(train["workload"]))
        return real(cls, train, *args, **kw)

    monkeypatch.setattr(M._Model, "on", classmethod(on))
    M.fit("table_estimator", p)
    inner = {h for h in held if h}  # the final fit on every workload holds none out
    assert len(inner) == M.INNER_FOLDS
    assert sorted(w for h in inner for w in h) == sorted(set(p["workload"]))


def test_order_accuracy_counts_right_wrong_and_ties() -> None:
    p = pd.DataFrame({"a": [0, 0, 0], "b_type": ["x", "y", "z"], "log_ratio": [0.1, 0.2, 0.3]})
    assert order_accuracy(p, np.array([1.0, 2.0, 3.0])) == 1.0
    assert order_accuracy(p, np.array([3.0, 2.0, 1.0])) == 0.0
    assert order_accuracy(p, np.array([1.0, 1.0, 1.0])) == 0.5


def test_the_model_learns_a_pair_effect_that_physics_misses() -> None:
    """Every workload runs 1.8× faster on mi300x than on h100-sxm whatever the datasheets say:
    the model, fitted on the other workloads, finds it; the spec ratios cannot."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):
        base = float(rng.uniform(1, 100))
        noise = np.exp(rng.normal(0, 0.02, 3))
        rows += [
            (f"w{i}", "h100-sxm", base * noise[0]),
            (f"w{i}", "mi300x", 1.8 * base * noise[1]),
            (f"w{i}", "a100-80g", 0.5 * base * noise[2]),
        ]
    out = evaluate(normalise(_standard(rows), CATALOG).rows, CATALOG)["methods"]
    assert out["table_estimator"]["mape"] < 0.05
    assert out["table_estimator"]["mape"] < out["bandwidth_ratio"]["mape"]
    assert out["table_estimator"]["mape"] < out["geomean_ratio"]["mape"]


def test_the_model_learns_how_per_device_throughput_falls_with_scale() -> None:
    """Per-device throughput ∝ devices^-0.3 in every workload (a larger system of one job
    communicates more): the model learns the exponent from the other workloads, the spec
    ratios know nothing of device counts."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(8):
        base = float(rng.uniform(1, 100))
        for t, speed in (("h100-sxm", 1.0), ("a100-80g", 0.5)):
            for n in (8, 64, 512):
                rows.append((f"w{i}", t, n, n * base * speed * n**-0.3 * rng.lognormal(0, 0.02)))
    table = pd.DataFrame(
        rows, columns=["workload", "accelerator_type", "accelerator_count", "throughput"]
    )
    p = pairs(normalise(table, CATALOG).rows, CATALOG)
    out = evaluate(normalise(table, CATALOG).rows, CATALOG)["methods"]
    assert out["table_estimator"]["mape"] < 0.05
    assert out["table_estimator"]["mape"] < 0.5 * out["median_ratio_others"]["mape"]
    assert M._Model.fit(p).physics.scaling == pytest.approx(-0.3)


def test_the_estimate_sits_below_an_uncertain_ratio_and_on_a_certain_one() -> None:
    """The shift that minimises MAPE is negative where the other workloads' ratios spread
    (APE punishes over-prediction more) and zero where they agree."""
    rng = np.random.default_rng(2)

    def shift(spread: float) -> float:
        rows = []
        for i in range(10):
            ratio = 2.0 * float(np.exp(rng.normal(0, spread)))
            rows += [(f"w{i}", "a100-80g", 1.0), (f"w{i}", "h100-sxm", ratio)]
        p = pairs(normalise(_standard(rows), CATALOG).rows, CATALOG)
        return M._inner_choice(p)[2]

    assert shift(0.6) < 0
    assert shift(0.0) == 0


def test_order_pairs_match_every_comparison_counted_by_hand() -> None:
    rng = np.random.default_rng(3)
    n = 60
    frame = pd.DataFrame(
        {
            "a": rng.integers(0, 6, n),
            "b_type": rng.choice(["x", "y", "z", "w"], n),
            "log_ratio": rng.choice([0.0, 0.1, 0.2, 0.5], n),
        }
    )
    pred = rng.choice([0.0, 0.3, 0.6], n)
    right = total = 0.0
    for i in range(n):
        for j in range(i + 1, n):
            a, b = frame.iloc[i], frame.iloc[j]
            if a.a != b.a or a.b_type == b.b_type or a.log_ratio == b.log_ratio:
                continue
            total += 1
            dq = np.sign(pred[i] - pred[j])
            right += 0.5 if dq == 0 else float(dq == np.sign(a.log_ratio - b.log_ratio))
    assert total > 20
    assert OrderPairs.of_frame(frame).right(pred) == right
    assert order_accuracy(frame, pred) == pytest.approx(right / total)


def test_a_level_is_the_shrunk_median_of_finite_residuals_and_0_where_unseen() -> None:
    keys = np.array([3, 3, 3, 3, 7, 7, 7])
    values = np.array([1.0, 5.0, 2.0, np.nan, 4.0, 0.0, 1.0])
    table = M._Table.of(keys, values, shrink=1.0)
    # key 3: median of 1, 2, 5 (the NaN carries nothing) × 3 / 4; key 7: median 1 × 3 / 4
    assert table.look_up(np.array([3, 7, 5, 99])).tolist() == [1.5, 0.75, 0.0, 0.0]
    assert M._Table.of(keys[:0], values[:0], 1.0).look_up(keys).tolist() == [0.0] * 7


@pytest.mark.parametrize("shift", [-50.0, 0.0, 0.3, 50.0])
def test_a_level_median_is_the_same_whatever_the_values_sign(shift: float) -> None:
    """The per-key medians of one float sort equal those of a two-key lexsort, for values all
    negative, mixed, or all positive and far from 0."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 40, 2000)
    values = rng.normal(shift, 0.2, 2000)
    table = M._Table.of(keys, values, 0.0)
    for key, effect in zip(table.keys, table.effects, strict=True):
        assert effect == pytest.approx(np.median(values[keys == key]))


def test_unknown_method_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        M.fit("magic", pd.DataFrame())


def test_cli_json_is_the_documented_object(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["evaluate", "--table", str(FIXTURES / "neusight_train_cut.csv"), "--json"])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    out = orjson.loads(last)
    assert {"table", "rows", "predictions", "skipped", "methods"} <= set(out)
    assert set(out["methods"]) == set(METHODS)
    for figures in out["methods"].values():
        assert set(figures) == {"mape", "median_ape", "within_10", "order_accuracy"}
    assert out["predictions"] > 0
    # what `table_estimator` chose for each held-out workload, and nothing for the fixed methods
    workloads = set(pd.read_csv(FIXTURES / "neusight_train_cut.csv")["model"].astype(str))
    assert set(out["table_estimator_choices"]) == workloads
    for chosen in out["table_estimator_choices"].values():
        assert chosen["prior"] in M.PRIOR_NAMES
        assert -1.0 <= chosen["device_exponent"] <= 0.0
        assert chosen["shift"] in M.SHIFTS.round(3).tolist()
        assert chosen["shrinkage"] in (*M.SHRINK_SCALES[:-1], None)


def test_the_readable_table_says_what_the_model_chose(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--table", str(FIXTURES / "neusight_train_cut.csv")]) == 0
    assert "table_estimator, over " in capsys.readouterr().out


def test_gavels_colocated_table_is_refused_not_read_as_single_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the header and two rows of Gavel's space-sharing table (../shared/data, MIT): two jobs on
    # one GPU per row, which says nothing about one job moved to another type
    (tmp_path / "colocated.csv").write_text(
        "job_type,num_gpus,hardware,placement,other_job_type,other_num_gpus,"
        "throughput_steps_per_s,other_throughput_steps_per_s\n"
        "A3C,1,k80,consolidated,A3C,1,1.62224017930913,1.62224017930913\n"
        "A3C,1,k80,consolidated,CycleGAN,1,1.465712052727541,0.2929245217707302\n"
    )
    assert main(["evaluate", "--table", str(tmp_path / "colocated.csv")]) == 2
    assert "expected the columns workload, accelerator_type" in capsys.readouterr().err


def test_cli_specs_add_a_type_and_a_bad_table_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = CATALOG.to_dict()
    new = dict(doc["hardware"][0], type_id="x9000", aliases=["X-9000"])
    (tmp_path / "specs.json").write_bytes(orjson.dumps({"schema_version": 1, "hardware": [new]}))
    _standard(
        [
            *[("w", "X-9000", 1.0), ("w", "t4", 2.0), ("w", "l4", 3.0)],
            *[("v", "X-9000", 1.0), ("v", "t4", 3.0), ("v", "l4", 5.0)],
        ]
    ).to_csv(tmp_path / "t.csv", index=False)
    argv = ["evaluate", "--table", str(tmp_path / "t.csv"), "--json"]
    assert main([*argv, "--specs", str(tmp_path / "specs.json")]) == 0
    assert orjson.loads(capsys.readouterr().out.splitlines()[-1])["rows"] == 6
    assert main(argv) == 0  # without the specs: the X-9000 rows are skipped, not guessed
    out = orjson.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["skipped"]["types_without_specs"] == {"X-9000": 2}
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    assert main(["evaluate", "--table", str(tmp_path / "bad.csv")]) == 2
    # one type per job: nothing to predict, said so
    _standard([("w", "t4", 1.0), ("v", "t4", 2.0)]).to_csv(tmp_path / "one_type.csv", index=False)
    assert main(["evaluate", "--table", str(tmp_path / "one_type.csv")]) == 2
    assert "nothing to predict" in capsys.readouterr().err


def _pair_effect_table(workloads: int, seed: int = 0) -> pd.DataFrame:
    """mi300x runs every workload 1.8× h100-sxm whatever the datasheets say."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(workloads):
        base = float(rng.uniform(1, 100))
        noise = np.exp(rng.normal(0, 0.02, 4))
        for k, (t, speed) in enumerate(
            (("h100-sxm", 1.0), ("mi300x", 1.8), ("a100-80g", 0.5), ("l4", 0.1))
        ):
            rows.append((f"w{i}", t, speed * base * noise[k]))
    return _standard(rows)


def test_model_is_the_production_model_and_never_sees_its_held_out_workloads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`model` fits `ThroughputModel` on the feature builder's rows, one fit a fold of
    workloads, and predicts each workload with a model that never saw it."""
    rows = normalise(_pair_effect_table(24), CATALOG).rows
    p = pairs(rows, CATALOG)
    trained_on: list[set[str]] = []
    real = production.ThroughputModel.fit.__func__  # type: ignore[attr-defined]

    def fit(cls: type, frame: pd.DataFrame, *args: object, **kw: object) -> object:
        trained_on.append(set(frame["model_type"].astype(str)))
        return real(cls, frame, *args, **kw)

    monkeypatch.setattr(production.ThroughputModel, "fit", classmethod(fit))
    splits = workload_folds(p)
    pred = production.predict(rows, p, CATALOG, splits)
    assert len(trained_on) == len(splits) == FOLDS
    for seen, (_train, test) in zip(trained_on, splits, strict=True):
        assert not seen & set(p["workload"][test])
    assert np.isfinite(pred).all()


def test_the_production_model_learns_a_pair_effect_from_enough_workloads() -> None:
    """With 30 other workloads the production model finds the 1.8× (and the other types'
    factors) that the datasheets miss; with 4 it moves part of the way from the physics prior
    it has without a configuration (the datasheets' geometric mean): the effects are shrunk
    toward it by how often each pair of types was measured."""
    many = evaluate(normalise(_pair_effect_table(30), CATALOG).rows, CATALOG)["methods"]
    assert many["model"]["mape"] < 0.05 < many["geomean_ratio"]["mape"]
    few = evaluate(normalise(_pair_effect_table(4), CATALOG).rows, CATALOG)["methods"]
    assert many["model"]["mape"] < few["model"]["mape"] < few["geomean_ratio"]["mape"]
