"""The worker's time against the records' (stream/clock.py): a host behind is corrected, a host
ahead is corrected once a caught-up batch shows it, a lagging consumer is reported, and a few
wrong producer clocks move nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from leap_stream.stream.batch import Record
from leap_stream.stream.clock import BrokerClock, WindowMin

T0 = 1_800_000_000.0  # the records' clock
HOUR = 3600.0


def _records(times: list[float], log_append: bool = True) -> list[Record]:
    return [Record("t", 0, i, None, b"{}", ts, log_append) for i, ts in enumerate(times)]


def test_a_host_behind_the_broker_judges_by_the_broker() -> None:
    clock = BrokerClock(tolerance_s=60.0)
    host = T0 - 2 * HOUR  # the worker's clock two hours behind
    clock.observe(host, _records([T0 - 30.0, T0 - 0.2]))  # appended before they are read
    skew = clock.skew()
    assert skew is not None and -2 * HOUR - 1 < skew < -2 * HOUR + 1
    assert abs(clock.now(host) - (T0 - 0.2)) < 1e-6  # the freshest record's time, at least


def test_a_host_ahead_or_a_lagging_consumer_is_reported_not_corrected() -> None:
    clock = BrokerClock(tolerance_s=60.0)
    host = T0 + 2 * HOUR  # ahead, or reading records two hours old: the same gap
    clock.observe(host, _records([T0]))
    assert clock.skew() == 2 * HOUR
    assert clock.now(host) == host


def test_a_host_ahead_is_corrected_once_a_caught_up_batch_shows_it() -> None:
    """A batch read at its partitions' ends waited no longer than the read: its gap is the
    host's lead. A lagging batch after it (records two hours old) does not move the estimate."""
    clock = BrokerClock(tolerance_s=60.0)
    host = T0 + 2 * HOUR
    clock.observe(host, _records([T0 - 0.5]), caught_up=True)
    ahead = clock.ahead()
    assert ahead is not None and 2 * HOUR < ahead < 2 * HOUR + 1
    assert abs(clock.now(host) - (T0 - 0.5)) < 1e-6
    clock.observe(host + 10, _records([T0 - 2 * HOUR]), caught_up=False)
    assert clock.ahead() == ahead
    # within the tolerance, a caught-up host stands
    near = BrokerClock(tolerance_s=60.0)
    near.observe(T0 + 30.0, _records([T0]), caught_up=True)
    assert near.now(T0 + 30.0) == T0 + 30.0


def test_within_the_tolerance_the_host_time_stands() -> None:
    clock = BrokerClock(tolerance_s=60.0)
    clock.observe(T0 - 20.0, _records([T0]))
    assert clock.now(T0 - 20.0) == T0 - 20.0
    assert BrokerClock().now(T0) == T0  # nothing observed yet


def test_the_freshest_gap_of_the_horizon_counts_and_old_ones_expire() -> None:
    clock = BrokerClock(tolerance_s=60.0, horizon_s=600.0)
    clock.observe(T0, _records([T0 - 300.0]))  # a backlog: records five minutes old
    clock.observe(T0 + 10.0, _records([T0 + 9.9]))  # caught up
    assert abs(clock.skew() - 0.1) < 1e-6  # type: ignore[operator]
    clock.observe(T0 - 2 * HOUR + 1000.0, _records([T0 + 1000.0]))  # the host jumps back
    assert clock.skew() == -2 * HOUR
    clock.observe(T0 + 2000.0, _records([T0 + 1999.0]))  # fixed: the old gaps are past
    assert abs(clock.skew() - 1.0) < 1e-6  # type: ignore[operator]


def test_a_minority_of_producer_clocks_does_not_move_create_times() -> None:
    clock = BrokerClock(tolerance_s=60.0)
    honest = [T0 - 1.0] * 8
    hostile = [T0 + 5 * HOUR, T0 + 9 * HOUR]  # future create times
    clock.observe(T0, _records(honest + hostile, log_append=False))
    assert clock.skew() == 1.0
    assert clock.now(T0) == T0


def test_records_without_a_timestamp_say_nothing() -> None:
    clock = BrokerClock()
    clock.observe(T0, [Record("t", 0, 0, None, b"{}")])
    assert clock.skew() is None


def test_reading_a_batch_on_a_host_behind_gives_the_records_time() -> None:
    import time

    clock = BrokerClock(offset_s=-2 * HOUR)  # the host's reading two hours behind
    now = time.time()
    judged = clock.read(_records([now - 0.5])).timestamp()
    assert now - 1.0 < judged < now + 5.0
    assert abs(clock.current().timestamp() - judged) < 5.0


@given(
    st.lists(st.tuples(st.floats(0.0, 50.0), st.floats(-1e4, 1e4, allow_nan=False)), max_size=60),
    st.floats(1.0, 200.0),
)
def test_the_window_minimum_is_the_minimum_of_the_window(
    steps: list[tuple[float, float]], horizon: float
) -> None:
    window, pushed, at = WindowMin(horizon), [], 0.0
    for step, value in steps:
        at += step
        window.push(at, value)
        pushed.append((at, value))
        in_window = [v for t, v in pushed if t >= at - horizon]
        assert window.min() == min(in_window)
