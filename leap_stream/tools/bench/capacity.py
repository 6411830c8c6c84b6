"""Capacity at a latency objective: the highest offered rate at which the p99 latency stays
under a limit in `need` of `runs` runs, found by bisection, with the service under test on
cores of its own (docs/benchmarks.md says how to read the figure).

`bisect_rate`, `runs_pass` and `split_cores` are pure; `pinned` sets processes' CPU
affinity for a while.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

WORKER_P99_MS = 50.0  # the worker's objective: submission produced → ranking received
SERVE_P99_MS = 10.0  # serve's: request sent → ranking received


@dataclass(frozen=True)
class CapacityPlan:
    """What one capacity search runs: `runs` runs of `seconds` at each rate tried, `need` of
    them under the objective; the rate bisected `steps` times within [low, high]."""

    low: float
    high: float
    steps: int = 5
    runs: int = 10
    need: int = 9
    seconds: float = 20.0


def bisect_rate(passes: Callable[[float], bool], low: float, high: float, steps: int) -> float:
    """The highest rate seen to pass: `high` if it passes, 0 if `low` fails, else `steps`
    halvings of [low, high] keeping the passing end (latency grows with the rate)."""
    if not passes(low):
        return 0.0
    if passes(high):
        return high
    for _ in range(steps):
        mid = 0.5 * (low + high)
        if passes(mid):
            low = mid
        else:
            high = mid
    return low


def runs_pass(run_p99_ms: Callable[[int], float], runs: int, need: int, limit_ms: float) -> bool:
    """Whether `need` of `runs` runs keep their p99 under `limit_ms`; stops as soon as the
    answer is known (a run is `run_p99_ms(k)`)."""
    good = bad = 0
    for k in range(runs):
        if run_p99_ms(k) <= limit_ms:
            good += 1
        else:
            bad += 1
        if good >= need:
            return True
        if bad > runs - need:
            return False
    return False


def search(
    plan: CapacityPlan, limit_ms: float, one_run: Callable[[float], float]
) -> tuple[float, dict[float, list[float]]]:
    """(the highest rate that keeps the p99 under `limit_ms` in `plan.need` of `plan.runs`
    runs, every rate tried with its runs' p99s); `one_run(rate)` makes one run, its p99."""
    tried: dict[float, list[float]] = {}

    def passes(rate: float) -> bool:
        def run(_k: int) -> float:
            p99 = one_run(rate)
            tried.setdefault(rate, []).append(p99)
            return p99

        return runs_pass(run, plan.runs, plan.need, limit_ms)

    return bisect_rate(passes, plan.low, plan.high, plan.steps), tried


@dataclass(frozen=True)
class Cores:
    """The cores of the service under test and those of everything else (the broker, Redis,
    the load generator); on one core, both are that core."""

    service: tuple[int, ...]
    rest: tuple[int, ...]

    def describe(self) -> dict[str, Any]:
        return {"service": list(self.service), "rest": list(self.rest)}


def split_cores(available: Iterable[int], service_cores: int = 1) -> Cores:
    """The first `service_cores` of the available cores for the service, the others for the
    rest (at least one each when there are two or more)."""
    cores = tuple(sorted(available))
    if len(cores) < 2:
        return Cores(cores, cores)
    n = min(max(1, service_cores), len(cores) - 1)
    return Cores(cores[:n], cores[n:])


def _tids(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


@contextmanager
def pinned(pids: Iterable[int], cores: tuple[int, ...]) -> Iterator[list[int]]:
    """Each live pid (every thread of it) on `cores` while the block runs, as it was after:
    the broker and Redis may serve others, and the bench's own process goes on. Yields the
    pids pinned; one gone (or not ours) is skipped."""
    before: dict[int, set[int]] = {}
    done: list[int] = []
    for pid in pids:
        try:
            for tid in _tids(pid):
                before[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, cores)
            done.append(pid)
        except (OSError, ValueError):
            continue
    try:
        yield done
    finally:
        for tid, cpus in before.items():
            with suppress(OSError):
                os.sched_setaffinity(tid, cpus)


def available_cores() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))
