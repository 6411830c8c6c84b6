"""The submissions consumer's group watch (stream/group_health.py): which librdkafka group
states count as settled, when a consumer counts as stuck, and the setting that bounds it."""

from __future__ import annotations

import orjson
import pytest

from leap_stream.stream.group_health import GroupHealth, group_state, stats_interval_ms


def _stats(state: str, join_state: str, assigned: int = 2) -> bytes:
    # the shape librdkafka emits (other sections elided)
    return orjson.dumps(
        {
            "name": "rdkafka#consumer-1",
            "type": "consumer",
            "brokers": {},
            "topics": {},
            "cgrp": {
                "state": state,
                "stateage": 1234,
                "join_state": join_state,
                "rebalance_age": 10,
                "rebalance_cnt": 1,
                "rebalance_reason": "",
                "assignment_size": assigned,
            },
        }
    )


def test_group_state_reads_the_cgrp_section() -> None:
    assert group_state(_stats("up", "steady")) == ("up", "steady")
    assert group_state(_stats("query-coord", "wait-join").decode()) == ("query-coord", "wait-join")
    assert group_state(orjson.dumps({"type": "producer"})) is None  # no group: nothing to say
    assert group_state(b"not json") is None
    assert group_state(b"[1, 2]") is None


def test_a_settled_group_is_healthy_even_without_partitions() -> None:
    h = GroupHealth(limit_s=30)
    h.restart(now=0.0)
    h.observe(("up", "steady"), now=2.0)
    assert not h.stalled(1000.0)
    assert h.unsettled_for(1000.0) == 0.0
    # more workers than partitions: settled, with nothing assigned, stays healthy
    h.observe(group_state(_stats("up", "steady", assigned=0)) or ("", ""), now=1000.0)
    assert not h.stalled(5000.0)


def test_unsettled_longer_than_the_limit_is_a_stall() -> None:
    h = GroupHealth(limit_s=30)
    h.restart(now=0.0)
    h.observe(("up", "steady"), now=1.0)
    # a session timeout: the consumer rejoins, and the rejoin never completes
    h.observe(("up", "wait-join"), now=100.0)
    h.observe(("up", "wait-join"), now=110.0)
    assert not h.stalled(129.9)
    assert h.stalled(130.0)
    assert h.unsettled_for(130.0) == pytest.approx(30.0)
    assert h.last == ("up", "wait-join")


def test_a_rebalance_that_completes_in_time_is_not_a_stall() -> None:
    h = GroupHealth(limit_s=30)
    h.restart(now=0.0)
    h.observe(("up", "steady"), now=1.0)
    for t, state in [(50.0, "wait-join"), (60.0, "wait-sync"), (75.0, "wait-assign-call")]:
        h.observe(("up", state), now=t)
    h.observe(("up", "steady"), now=79.0)  # 29 s out of the group: fine
    assert not h.stalled(79.0)
    h.observe(("up", "wait-join"), now=200.0)  # the clock restarts at each new departure
    assert not h.stalled(229.0)
    assert h.stalled(230.0)


def test_a_new_consumer_that_never_joins_is_a_stall() -> None:
    """No statistics at all (never joined) counts from the consumer's creation."""
    h = GroupHealth(limit_s=30)
    h.restart(now=500.0)
    assert not h.stalled(529.0)
    assert h.stalled(530.0)
    h.observe(("query-coord", "init"), now=540.0)  # unsettled observations keep the first time
    assert h.unsettled_for(540.0) == pytest.approx(40.0)


def test_a_limit_of_zero_never_stalls() -> None:
    h = GroupHealth(limit_s=0)
    assert not h.watching
    h.restart(now=0.0)
    h.observe(("query-coord", "init"), now=1.0)
    assert not h.stalled(10_000.0)


def test_statistics_interval_follows_the_limit() -> None:
    assert stats_interval_ms(120) == 5000  # at most every 5 s
    assert stats_interval_ms(8) == 2000  # a quarter of the limit
    assert stats_interval_ms(1) == 500  # at least 0.5 s apart


def test_consumer_stall_setting() -> None:
    from leap_stream.settings import Settings

    assert Settings.from_env({}).consumer_stall_s == 120.0  # the documented default
    assert Settings.from_env({"LEAP_CONSUMER_STALL_S": "0"}).consumer_stall_s == 0.0  # off
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ValueError, match="LEAP_CONSUMER_STALL_S"):
            Settings.from_env({"LEAP_CONSUMER_STALL_S": bad})
