"""Capacity search: bisection over the rate, runs counted against the objective, cores split;
no services."""

from __future__ import annotations

import os

import pytest

from leap_stream.tools.bench.capacity import (
    CapacityPlan,
    bisect_rate,
    pinned,
    runs_pass,
    search,
    split_cores,
)


def test_bisection_closes_in_on_the_highest_passing_rate() -> None:
    tried: list[float] = []

    def passes(rate: float) -> bool:
        tried.append(rate)
        return rate <= 1234.0

    found = bisect_rate(passes, 100.0, 4000.0, steps=8)
    assert found <= 1234.0 < found + (4000.0 - 100.0) / 2**8
    assert tried[:2] == [100.0, 4000.0] and len(tried) == 10


def test_bisection_reports_the_ends_when_they_decide() -> None:
    assert bisect_rate(lambda r: True, 100.0, 4000.0, steps=5) == 4000.0
    assert bisect_rate(lambda r: False, 100.0, 4000.0, steps=5) == 0.0


@pytest.mark.parametrize(
    ("p99s", "verdict", "runs_made"),
    [
        ([10.0] * 10, True, 9),  # nine good runs decide
        ([60.0, 60.0] + [10.0] * 8, False, 2),  # two bad runs of ten already fail 9 of 10
        ([60.0] + [10.0] * 9, True, 10),  # one bad run is allowed
    ],
)
def test_runs_stop_as_soon_as_the_verdict_is_known(
    p99s: list[float], verdict: bool, runs_made: int
) -> None:
    made: list[int] = []

    def run(k: int) -> float:
        made.append(k)
        return p99s[k]

    assert runs_pass(run, runs=10, need=9, limit_ms=50.0) is verdict
    assert len(made) == runs_made


def test_the_service_gets_its_own_core_and_the_rest_the_others() -> None:
    assert split_cores([1, 0]).service == (0,) and split_cores([1, 0]).rest == (1,)
    four = split_cores(range(4), service_cores=2)
    assert four.service == (0, 1) and four.rest == (2, 3)
    assert split_cores([3], service_cores=1).rest == (3,)  # one core: shared, and said so
    assert split_cores(range(2), service_cores=5).rest == (1,)  # never every core


def test_pinned_holds_a_live_pid_on_the_cores_and_restores_it_after() -> None:
    mine = os.sched_getaffinity(0)
    one = (min(mine),)
    with pinned([os.getpid(), 2**22 + 12345], one) as done:
        assert done == [os.getpid()]  # the dead pid is skipped
        assert os.sched_getaffinity(0) == set(one)
    assert os.sched_getaffinity(0) == mine


def test_search_reports_every_run_of_every_rate_it_tried() -> None:
    """p99 = rate / 10 ms: 400/s is the last under 50 ms at 0 steps from [400, 800]; each
    rate's runs stop at the verdict (three good of three, or the first bad of three)."""
    plan = CapacityPlan(400.0, 800.0, steps=1, runs=3, need=3, seconds=1.0)
    found, tried = search(plan, 50.0, lambda rate: rate / 10.0)
    assert found == 400.0
    assert tried == {400.0: [40.0] * 3, 800.0: [80.0], 600.0: [60.0]}
