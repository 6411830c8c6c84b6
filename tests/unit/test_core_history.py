"""History rules (pure): the robust prior, the plausibility guard, corroboration; and
HistoryBook applied from events is the field-by-field apply."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from leap_stream.contracts.timestamps import epoch_s
from leap_stream.core.aggregates import AggregateTable
from leap_stream.core.history import (
    HistoryBook,
    HistoryRules,
    TypeAggregate,
    job_key,
    median,
)
from leap_stream.tools import synthetic_events as synthetic


def test_apply_completion_is_apply_with_the_event_fields() -> None:
    completions = [c for _s, c in synthetic.pairs(300, seed=4, lineages=20)]
    by_event, by_fields = HistoryBook(), HistoryBook()
    measured = [by_event.apply_completion(c) for c in completions]
    for c in completions:
        by_fields.apply(
            c["lineage_id"],
            c["model_type"],
            c["hardware_type"],
            c["status"],
            (c.get("throughput") or {}).get("samples_per_s"),
            c["num_devices"],
            epoch_s(c["ended_at"]),
            job=job_key(c["job_id"]),
        )
    # failed attempts measure nothing
    assert 0 < sum(m != "none" for m in measured) < len(completions)
    assert by_event.lineage_ids == by_fields.lineage_ids
    assert [by_event.lineage(x) for x in by_event.lineage_ids] == [
        by_fields.lineage(x) for x in by_fields.lineage_ids
    ]
    for mt in by_event.model_types:
        assert by_event.aggregates(mt) == by_fields.aggregates(mt)


def _book(rules: HistoryRules | None = None) -> HistoryBook:
    return HistoryBook(rules or HistoryRules())


def _run(
    book: HistoryBook,
    sps: float,
    nd: int = 8,
    at: float = 0.0,
    lin: str = "L",
    asked: int | None = None,
    job: int | None = None,
) -> str:
    """One measurement; each from a job of its own unless ``job`` says otherwise."""
    job = next(_JOBS) if job is None else job
    return book.apply(lin, "mt", "h100", "succeeded", sps, nd, at, asked, job=job)


_JOBS = itertools.count(1)
HOUR = 3600.0


def test_median_is_the_middle_or_the_mean_of_the_two_middles() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([7.0]) == 7.0


def test_the_prior_is_the_median_of_the_last_few_per_device_values() -> None:
    book = _book(HistoryRules(recent=3))
    for i, sps in enumerate([800.0, 880.0, 720.0, 840.0]):
        assert _run(book, sps, at=float(i)) == "accepted"
    m = book.lineage("L")["h100"]
    assert m.count == 4 and len(m.recent) == 3  # the oldest (800) left the window
    assert m.samples_per_s == pytest.approx(840.0)  # median of 880, 720, 840 (8 devices each)
    assert m.measured_at == 3.0 and m.pending is None


@pytest.mark.parametrize(
    ("sps", "nd", "rule"),
    # ×1000, ×1e-6, one device for a job submitted on eight
    [(800_000.0, 8, "lineage"), (0.0008, 8, "lineage"), (800.0, 1, "devices")],
)
def test_one_wrong_measurement_is_quarantined_and_leaves_the_prior_alone(
    sps: float, nd: int, rule: str
) -> None:
    book = _book()
    for i in range(3):
        _run(book, 800.0, at=float(i), asked=8)
    before_lin, before_agg = book.lineage("L"), book.aggregates("mt")
    assert _run(book, sps, nd=nd, at=10.0, asked=8) == rule
    after = book.lineage("L")["h100"]
    assert after.samples_per_s == before_lin["h100"].samples_per_s
    assert after.recent == before_lin["h100"].recent and after.count == 3
    assert after.pending == (10.0, pytest.approx(math.log(sps / nd)))
    assert book.aggregates("mt") == before_agg  # the aggregate did not move either
    # an honest one next: accepted, and the quarantined value is forgotten
    assert _run(book, 810.0, at=11.0, asked=8) == "accepted"
    assert book.lineage("L")["h100"].pending is None
    assert _run(book, sps, nd=nd, at=12.0, asked=8) == rule  # so it must start over


def test_another_device_count_is_judged_by_the_aggregate_not_the_lineage() -> None:
    book = _book(HistoryRules(aggregate_min_count=3))
    for i in range(3):
        _run(book, 800.0, at=float(i))
    # 16 devices at a third of the per-device rate: poor scaling, not an error
    assert _run(book, 800.0 * 2 / 3, nd=16, at=5.0, asked=16) == "accepted"
    assert book.lineage("L")["h100"].num_devices == 16
    # an elastic job that really ran on another count than submitted: accepted the second time
    assert _run(book, 1600.0, nd=16, at=6.0, asked=8) == "devices"
    assert _run(book, 1650.0, nd=16, at=6.0 + HOUR, asked=8) == "corroborated"


def test_a_real_change_is_accepted_once_a_second_measurement_corroborates_it() -> None:
    book = _book()
    for i in range(4):
        _run(book, 800.0, at=float(i))
    assert _run(book, 4000.0, at=10.0) == "lineage"
    assert _run(book, 4100.0, at=10.0 + HOUR) == "corroborated"
    m = book.lineage("L")["h100"]
    assert len(m.recent) == 2 and m.count == 6  # the window restarts from the two
    assert m.samples_per_s == pytest.approx(8 * math.exp(median([x for _t, x in m.recent])))
    assert m.samples_per_s == pytest.approx(math.sqrt(4000.0 * 4100.0))
    assert book.aggregates("mt")["h100"].count == 5  # the corroborating value entered it


def test_a_new_lineage_is_judged_against_its_model_types_aggregate() -> None:
    rules = HistoryRules(aggregate_min_count=3)
    book = _book(rules)
    for i in range(3):
        _run(book, 800.0, at=float(i), lin=f"other-{i}")
    assert _run(book, 40_000.0, lin="new") == "accepted"  # ×50 is within the wider factor 100
    assert _run(book, 800_000.0, lin="newer") == "aggregate"
    assert "h100" not in book.lineage("newer")  # a quarantined value alone is no prior
    assert book.entries("newer")["h100"].pending is not None
    # below the minimum count the aggregate judges nothing
    young = _book(HistoryRules(aggregate_min_count=10))
    _run(young, 800.0, lin="a")
    assert _run(young, 800_000.0, lin="b") == "accepted"


def test_rules_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        HistoryRules(recent=0)
    with pytest.raises(ValueError):
        HistoryRules(lineage_factor=1.0)


def test_honest_telemetry_gives_the_same_priors_in_any_arrival_order() -> None:
    import random

    values = [
        (float(i), 800.0 * (1 + 0.03 * ((i * 7) % 5 - 2)), 8 if i < 6 else 16) for i in range(9)
    ]
    first, shuffled = _book(), _book()
    for at, sps, nd in values:
        _run(first, sps, nd=nd, at=at)
    order = values[:]
    random.Random(3).shuffle(order)
    for at, sps, nd in order:
        _run(shuffled, sps, nd=nd, at=at)
    a, b = first.lineage("L")["h100"], shuffled.lineage("L")["h100"]
    assert a == b  # the newest five by ended_at, the newest's device count
    assert [t for t, _x in a.recent] == [4.0, 5.0, 6.0, 7.0, 8.0] and a.num_devices == 16


def test_physics_judges_every_measurement_the_other_rules_let_through() -> None:
    book = _book(HistoryRules(aggregate_min_count=3))
    ceiling = math.log(500.0)  # per device, at the full matrix peak
    run = lambda sps, lin, at=0.0: book.apply(  # noqa: E731
        lin, "mt", "h100", "succeeded", sps, 8, at, None, ceiling
    )
    assert run(8 * 500.0 * 1000, "first") == "physics"  # x1000 past the ceiling: impossible
    assert "h100" not in book.lineage("first") and book.aggregates("mt") == {}
    assert run(8 * 500.0 * 50, "second") == "accepted"  # x50: a rough FLOPs estimate allows it
    # an established aggregate does not make the impossible possible
    for i in range(3):
        run(8 * 500.0 * 60, f"other-{i}")
    assert book.aggregates("mt")["h100"].count == 4
    assert run(8 * 500.0 * 1000, "third") == "physics"  # x17 from the aggregate, x1000 physics
    assert run(8 * 500.0 * 90, "fourth") == "accepted"
    # a lineage walked up x1.5 a step (within its x3 limit) stops at the ceiling (x100):
    # x20, x30, x45, x67.5 accepted; x101 past physics, and nothing past it corroborates it
    steps = [run(8 * 500.0 * 20 * 1.5**k, "walked", at=float(k)) for k in range(8)]
    assert steps[:4] == ["accepted"] * 4 and steps[4] == "physics"
    assert not {"accepted", "corroborated"} & set(steps[4:])
    assert book.lineage("walked")["h100"].samples_per_s < 8 * 500.0 * 100
    with pytest.raises(ValueError):
        HistoryRules(physics_factor=1.0)


def test_the_aggregate_table_reads_as_the_dicts_it_holds() -> None:
    dicts = {
        "llama-7b": {"h100": TypeAggregate(1.5, 3, 100.0), "a100": TypeAggregate(0.5, 1, 50.0)},
        "bert": {},
        "gpt-2": {"a100": TypeAggregate(-2.0, 7, 70.0)},
    }
    table = AggregateTable.of(dicts)
    assert table == dicts and list(table) == ["llama-7b", "bert", "gpt-2"] and len(table) == 3
    assert table["gpt-2"] == {"a100": TypeAggregate(-2.0, 7, 70.0)}
    assert table.get("unknown") is None and table["bert"] == {}
    as_of = table.as_of(["gpt-2", "unknown", "llama-7b"])
    codes = {"h100": 0, "a100": 1}
    hw = np.asarray([1, 1, 0])
    ewma, count = as_of.log.at(as_of.model_type, hw, as_of.marks, codes)
    assert ewma[0] == -2.0 and count[0] == 7
    assert np.isnan(ewma[1]) and np.isnan(count[1])  # a model type without aggregates
    assert ewma[2] == 1.5 and count[2] == 3


def test_a_second_completion_of_one_attempt_is_a_repeat_and_changes_nothing() -> None:
    [c] = [c for _s, c in synthetic.pairs(40, seed=9, lineages=1) if c["status"] == "succeeded"][:1]
    book = HistoryBook()
    assert book.apply_completion(c) in ("accepted", "corroborated")
    state = book.lineage(c["lineage_id"])
    sps = c["throughput"]["samples_per_s"]
    replay = dict(c, event_id="another", throughput={"samples_per_s": sps * 1.5})
    assert book.apply_completion(replay) == "repeat"
    assert book.lineage(c["lineage_id"]) == state
    other = dict(replay, attempt=c["attempt"] + 1)  # the next attempt is a new measurement
    assert book.apply_completion(other) != "repeat"


def test_a_probe_completes_once_per_type_and_leaves_the_attempt_its_own_run() -> None:
    [c] = [c for _s, c in synthetic.pairs(40, seed=9, lineages=1) if c["status"] == "succeeded"][:1]
    book = HistoryBook()
    probe = dict(c, event_id="probe-1", hardware_type="probed-type", probe=True)
    assert book.apply_completion(probe) == "accepted"
    assert "probed-type" in book.lineage(c["lineage_id"])  # a measurement like any other
    assert book.apply_completion(dict(probe, event_id="probe-2")) == "repeat"
    assert book.apply_completion(dict(probe, event_id="probe-3", hardware_type="b")) != "repeat"
    assert book.apply_completion(c) != "repeat"  # the attempt's own completion still counts
    assert book.apply_completion(dict(c, event_id="own-again")) == "repeat"


def test_a_probe_on_a_slice_of_its_job_passes_the_devices_rule_and_nothing_else_does() -> None:
    """A probe may run a whole number of the job's replicas (a count dividing the submitted
    one); any other count, or a slice's count on the attempt's own completion, is held."""
    from leap_stream.core.history import slice_of

    assert slice_of(8, 64) and slice_of(64, 64) and not slice_of(24, 64) and not slice_of(128, 64)
    [c] = [c for _s, c in synthetic.pairs(40, seed=9, lineages=1) if c["status"] == "succeeded"][:1]
    asked = 64
    probe = dict(c, event_id="p-1", hardware_type="a", num_devices=8, probe=True)
    assert HistoryBook().apply_completion(probe, submitted_devices=asked) == "accepted"
    odd = dict(probe, event_id="p-2", hardware_type="b", num_devices=24)
    assert HistoryBook().apply_completion(odd, submitted_devices=asked) == "devices"
    own = dict(c, num_devices=8)
    assert HistoryBook().apply_completion(own, submitted_devices=asked) == "devices"


DAY = 86_400.0


def _walk(
    book: HistoryBook, steps: int, start: float, every: float = 60.0, factor: float = 2.9
) -> list[str]:
    """An attacker's walk: each completion (a job of its own, ``every`` seconds apart)
    ``factor`` × the prior as it stands."""
    out = []
    for k in range(steps):
        prior = book.lineage("L")["h100"].samples_per_s
        out.append(_run(book, prior * factor, at=start + every * k))
    return out


def test_a_walk_moves_a_prior_no_further_than_the_speed_factor_a_day() -> None:
    rules = HistoryRules()
    book = _book(rules)
    for i in range(3):
        _run(book, 800.0, at=float(i))
    verdicts = _walk(book, 21, start=HOUR)
    assert "speed" in verdicts
    prior = book.lineage("L")["h100"].samples_per_s
    assert 800.0 < prior <= 800.0 * rules.speed_factor * (1 + 1e-12)
    # a patient walk, an hour a step for a day, gets one corroborated change in besides
    day = _walk(book, 23, start=HOUR + DAY, every=HOUR)
    assert day.count("corroborated") == 1
    bound = rules.speed_factor * rules.corroborated_factor * (1 + 1e-12)
    assert book.lineage("L")["h100"].samples_per_s <= prior * bound
    # an honest release (×1.25) is not held
    honest = _book(rules)
    for i in range(5):
        _run(honest, 800.0, at=float(i))
    assert {_run(honest, 1000.0, at=HOUR + 60.0 * k) for k in range(5)} == {"accepted"}
    assert honest.lineage("L")["h100"].samples_per_s == pytest.approx(1000.0)


def test_only_an_independent_value_corroborates() -> None:
    """Two values ×10 agreeing move a prior only when they are independent: another job, at
    least the gap apart, and one corroborated change per period."""
    rules = HistoryRules()

    def held_then(second_job: int | None, gap: float) -> str:
        book = _book(rules)
        for i in range(3):
            _run(book, 800.0, at=float(i))
        assert _run(book, 8_000.0, at=HOUR, job=7) == "lineage"
        return _run(book, 8_200.0, at=HOUR + gap, job=second_job)

    assert held_then(None, 60.0) == "lineage"  # another job, but a minute later
    assert held_then(7, 2 * HOUR) == "lineage"  # the same job (another attempt)
    assert held_then(None, rules.corroboration_gap_s) == "corroborated"
    book = _book(rules)
    for i in range(3):
        _run(book, 800.0, at=float(i))
    _run(book, 8_000.0, at=HOUR)
    assert _run(book, 8_200.0, at=2 * HOUR) == "corroborated"
    # a second change the same day waits for the next
    _run(book, 40_000.0, at=3 * HOUR)
    assert _run(book, 40_000.0, at=5 * HOUR) == "lineage"
    assert book.lineage("L")["h100"].samples_per_s == pytest.approx(math.sqrt(8_000 * 8_200))
    assert _run(book, 41_000.0, at=2 * HOUR + DAY) == "corroborated"
    # a ×1000 error agreed on by two independent jobs is too far a change: held
    far = _book(rules)
    for i in range(3):
        _run(far, 800.0, at=float(i))
    assert _run(far, 800_000.0, at=HOUR) == "lineage"
    assert _run(far, 800_000.0, at=3 * HOUR) == "speed"
    assert far.lineage("L")["h100"].samples_per_s == pytest.approx(800.0)


def test_new_lineages_agreeing_move_an_aggregate_no_further_than_its_speed_factor() -> None:
    rules = HistoryRules()
    book = _book(rules)
    for i in range(10):
        _run(book, 800.0, at=float(i), lin=f"honest-{i}")
    before = book.aggregate("mt", "h100")
    assert before is not None
    for i in range(10):  # ×90: within the aggregate factor, each lineage new to the type
        assert _run(book, 72_000.0, at=HOUR + i, lin=f"new-{i}") == "accepted"
    after = book.aggregate("mt", "h100")
    assert after is not None and book.aggregate_held > 0
    moved = after.ewma_log_per_device - before.ewma_log_per_device
    assert 0 < moved <= rules.aggregate_speed_limit + 1e-12
    # an honest new lineage is still judged by an aggregate near the honest ones
    assert _run(book, 820.0, at=2 * HOUR, lin="honest-new") == "accepted"


def test_the_honest_telemetry_benchmark_runs_on_a_tiny_fleet() -> None:
    """benchmarks/history_guard.py, on two days of a small simulated fleet: its counts add up."""
    import runpy
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "history_guard.py"
    measure = runpy.run_path(str(path))["measure"]
    got = measure(seed=0, days=2, rate=300)
    assert got["measurements"] == sum(got["verdicts"].values()) > 100
    assert 0 <= got["held_back"] <= got["measurements"]
    assert got["held_back_share"] <= 0.01
