"""Completions waiting for their submission (stream/waiting.py): bounded per partition, and
looked up again only when due."""

from __future__ import annotations

from leap_stream.stream.batch import Record
from leap_stream.stream.waiting import WaitingCompletions


def _items(partition: int, n: int, tag: str = "") -> list[tuple[object, Record, dict[str, object]]]:
    return [
        (f"ev-{tag}{partition}-{i}", Record("comps", partition, i, None, b"{}"), {"i": i})
        for i in range(n)
    ]


def test_each_partition_holds_at_most_its_capacity() -> None:
    w = WaitingCompletions(capacity=3, grace_s=60.0)
    over = w.add(_items(0, 5), now=0.0)
    assert [r.offset for _e, r, _c in over] == [3, 4]
    assert w.add(_items(1, 2), now=0.0) == []  # another partition has its own room
    assert len(w) == 5
    w.remove(w.due(now=1.0)[:1])  # one of partition 0 decided: room for one more
    assert len(w.add(_items(0, 2, "b"), now=1.0)) == 1


def test_a_waiting_completion_is_retried_after_a_doubling_delay() -> None:
    w = WaitingCompletions(capacity=10, grace_s=60.0, first_retry_s=0.25, max_retry_s=1.0)
    w.add(_items(0, 1), now=0.0)
    assert w.due(now=0.1) == []  # not before its first delay
    (item,) = w.due(now=0.3)
    w.retry_later(item, now=0.3)
    assert w.due(now=0.7) == [] and w.due(now=0.81) == [item]  # 0.5 s later
    for t in (0.81, 1.82, 2.83):
        w.retry_later(item, now=t)
    assert item.delay == 1.0  # capped
    assert w.due(now=3.5) == [] and w.due(now=3.84) == [item]


def test_a_flood_costs_a_round_only_the_items_that_are_due() -> None:
    w = WaitingCompletions(capacity=100_000, grace_s=60.0, first_retry_s=0.25, max_retry_s=5.0)
    w.add(_items(0, 10_000, "flood"), now=0.0)
    for t in (0.3, 0.6, 1.1, 2.2, 4.3, 8.4):
        for item in w.due(now=t):
            w.retry_later(item, now=t)
    w.add(_items(0, 1, "honest"), now=8.4)
    assert w.due(now=8.5) == []  # the flood waits out its backoff; the newcomer is not due
    assert len(w.due(now=8.7)) == 1  # the newcomer alone, at its first retry


def test_every_waiting_completion_is_due_when_its_grace_ends() -> None:
    w = WaitingCompletions(capacity=10, grace_s=2.0, first_retry_s=0.25, max_retry_s=60.0)
    w.add(_items(0, 2), now=0.0)
    for item in w.due(now=0.3):
        w.retry_later(item, now=0.3)  # next try at 0.8
        w.retry_later(item, now=0.8)  # next try at 1.8
        w.retry_later(item, now=1.8)  # next try at 3.8, after the grace
    assert len(w.due(now=2.0)) == 2
    assert all(w.expired(item, 2.0) for item in w.due(now=2.0))
    w.clear()
    assert len(w) == 0 and w.add(_items(0, 10), now=3.0) == []
