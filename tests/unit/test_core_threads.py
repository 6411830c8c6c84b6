"""OpenMP threads follow the cores a process may run on, not the machine's count."""

from __future__ import annotations

import os

from leap_stream.core.predictor.params import _threads, predict_threads, usable_cores
from leap_stream.tools.bench.capacity import pinned


def test_a_process_pinned_to_one_core_scores_big_batches_on_one_thread() -> None:
    mine = os.sched_getaffinity(0)
    with pinned([os.getpid()], (min(mine),)):
        assert usable_cores() == 1
        assert predict_threads(100_000) == 1
        assert _threads(10_000_000) == 1
    assert usable_cores() == len(mine)
    assert predict_threads(10) == 1  # small work: one thread whatever the cores
    assert predict_threads(100_000) == min(2, len(mine))
