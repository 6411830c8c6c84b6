"""The mixed load's completions: each for a ranked attempt that has not completed."""

from __future__ import annotations

from leap_stream.tools.bench.pending import PendingCompletions

WORLD = [{"job_id": f"w{j}", "attempt": 1, "event_id": f"sub-w{j}"} for j in range(3)]
# the simulator's order: w2 ended first; w1 never ran on a candidate (no completion)
DONE = [
    {"job_id": "w2", "attempt": 1, "event_id": "c-w2", "hardware_type": "h100"},
    {"job_id": "w0", "attempt": 1, "event_id": "c-w0", "hardware_type": "a100"},
]


def _run(kind: str, n: int) -> list[dict[str, object]]:
    """A run's submissions as the bench makes them: renamed copies of the world's, cycling."""
    return [dict(WORLD[i % 3], job_id=f"{kind}-{i}", event_id=f"sub-{kind}-{i}") for i in range(n)]


def test_no_attempt_is_completed_twice_across_runs() -> None:
    pool = PendingCompletions(WORLD, DONE)
    sent: set[tuple[object, object]] = set()
    event_ids: set[object] = set()
    ranked = {(s["job_id"], s["attempt"]) for s in WORLD}
    for k in range(4):
        subs = _run(f"m{k}", 5)
        for c in pool.take(len(subs)):
            key = (c["job_id"], c["attempt"])
            assert key not in sent, f"{key} completed twice"
            assert key in ranked, f"{key} completes a job no run submitted"
            assert c["event_id"] not in event_ids
            sent.add(key)
            event_ids.add(c["event_id"])
        ranked |= {(s["job_id"], s["attempt"]) for s in subs}
        pool.add_run(subs)
    assert len(sent) >= 8


def test_a_run_completes_as_the_world_job_it_copies_in_the_simulators_order() -> None:
    pool = PendingCompletions(WORLD, DONE)
    assert [c["job_id"] for c in pool.take(10)] == ["w2", "w0"]  # the backlog first
    pool.add_run(_run("m0", 5))  # copies of w0, w1, w2, w0, w1
    got = pool.take(10)
    assert [(c["job_id"], c["hardware_type"]) for c in got] == [
        ("m0-2", "h100"),
        ("m0-0", "a100"),
        ("m0-3", "a100"),
    ]
    assert pool.take(1) == [] and len(pool) == 0
