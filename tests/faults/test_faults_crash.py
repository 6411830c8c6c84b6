"""kill -9 of the worker, three times in one 20k-event run: nothing lost, nothing doubled."""

from __future__ import annotations

import signal
import time

import pytest
from _stack import Feeder, Stack, check_nothing_lost, feed, fleet

from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.lag import LagReader, total_lag, worker_groups
from leap_stream.tools.harness import wait_for
from leap_stream.tools.observe import dead_letters

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("world", ["stack", "cluster_stack"])
def test_kill9_three_times_loses_nothing(world: str, request: pytest.FixtureRequest) -> None:
    """On one Redis and on a Redis Cluster (keys tagged by model type, one script call per
    model type)."""
    stack: Stack = request.getfixturevalue(world)
    fl = fleet(seed=31, rate=10_000)  # ~10k submissions + ~10k completions
    assert fl.events >= 19_000
    t = stack.topics
    feeder = Feeder(stack.bootstrap)
    feed(feeder, stack, fl.subs, fl.comps)
    rankings = RankingsClient(KafkaClients(stack.bootstrap), t["rank"], keep_all=True)
    lag = LagReader(KafkaClients(stack.bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))

    def done() -> int:
        return fl.events - total_lag(lag.read())

    t0 = time.monotonic()
    stack.start()
    kills: list[int] = []
    ranked_at_kill: list[int] = []
    for frac, jitter in ((0.2, 0.13), (0.45, 0.29), (0.7, 0.41)):
        # by rankings, so every kill lands while both agents are busy

        def progressed(frac: float = frac) -> bool:
            assert stack.alive(), stack.log_tail()
            rankings.poll(timeout=0.1, max_messages=5000)
            return len(rankings.latest()) >= frac * len(fl.subs)

        wait_for(f"{frac:.0%} of the submissions ranked", progressed, 180, every=0.05)
        time.sleep(jitter)  # not in step with the commits this process happens to see
        kills.append(done())
        ranked_at_kill.append(len(rankings.latest()))
        stack.stop(signal.SIGKILL)
        stack.start()

    def caught_up() -> bool:
        assert stack.alive(), stack.log_tail()
        rankings.poll(timeout=0.1, max_messages=5000)
        return total_lag(lag.read()) == 0

    wait_for("lag 0 after the last restart", caught_up, 240, every=0.2)
    elapsed = time.monotonic() - t0
    rankings.drain(idle_s=1.5, max_s=30)
    assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()

    figures = check_nothing_lost(stack, fl, rankings.latest())
    assert not dead_letters(stack.bootstrap, t["dlq"])  # no orphan: waiting ones were redone
    repeats = rankings.received - len(rankings.latest())
    rankings.close()
    print(
        f"\n--- kill -9 x3 ({world}): {fl.events} events ({len(fl.subs)} submissions, {len(fl.comps)} "
        f"completions), kills at {kills} events committed / {ranked_at_kill} ranked; lost 0; {repeats} repeated rankings "
        f"(at-least-once); dataset {figures['dataset_rows']} rows, history of "
        f"{figures['lineages']} lineages equal to a replay; {elapsed:.0f}s incl. 4 starts"
    )
