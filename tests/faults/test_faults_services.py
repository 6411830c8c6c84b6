"""The services under the worker fail mid-run: Redis killed and restarted, the broker restarted.

Each test runs its own service instance (its own port, data folder) so the session's shared
Redis and broker are never touched, and checks the same thing: every valid submission ranked,
every completion once in the dataset, the Redis history equal to a replay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _stack import Feeder, Fleet, Stack, check_nothing_lost, feed, fleet

from leap_stream.core.history import HistoryBook
from leap_stream.store.connection import connect
from leap_stream.store.online import OnlineStore
from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.lag import LagReader, total_lag, worker_groups
from leap_stream.tools.dev import redis as dev_redis
from leap_stream.tools.harness import free_port, wait_for, worker_topics
from leap_stream.tools.observe import dead_letters

pytestmark = pytest.mark.faults


class OwnRedis:
    """A redis-server of this test only, with an fsync-always append-only file, so a kill -9
    loses nothing Redis acknowledged (the production setting for the online store)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        binary = dev_redis.find_redis_server(install=False)
        cmd = [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--dir", str(self.root),
            "--logfile", str(self.root / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for("own redis-server", lambda: dev_redis.is_ready(self.url, 0.5), 20, every=0.1)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    r = OwnRedis(tmp_path / "own-redis")
    r.start()
    yield r
    r.stop()


def _run_until_caught_up(
    stack: Stack, rankings: RankingsClient, lag: LagReader, timeout: float = 240
) -> None:
    def caught_up() -> bool:
        assert stack.alive(), stack.log_tail()
        rankings.poll(timeout=0.1, max_messages=5000)
        return total_lag(lag.read()) == 0

    try:
        wait_for("lag 0", caught_up, timeout, every=0.2)
    except (AssertionError, TimeoutError):  # a dead worker, or time out
        rows = [r for r in lag.read() if r.lag]
        raise AssertionError(
            f"not caught up: lag {rows}; {len(rankings.latest())} ranked; "
            f"metrics:\n{_interesting(stack)}\nworker log:\n{stack.log_tail(30)}"
        ) from None


def _wait_ranked(stack: Stack, rankings: RankingsClient, share: float, total: int) -> None:
    """Until `share` of the `total` submissions have a ranking (the worker must stay up)."""

    def ranked() -> bool:
        assert stack.alive(), stack.log_tail()
        rankings.poll(timeout=0.1, max_messages=5000)
        return len(rankings.latest()) >= share * total

    wait_for(f"{share:.0%} ranked", ranked, 120, every=0.05)


def _stop_and_check(
    stack: Stack, fl: Fleet, rankings: RankingsClient
) -> tuple[dict[str, int], int]:
    """Read the last rankings, stop the worker cleanly, check that nothing is lost and nothing
    dead-lettered; returns `check_nothing_lost`'s figures and the repeated rankings."""
    rankings.drain(idle_s=1.5, max_s=30)
    assert stack.alive(), stack.log_tail()
    assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()
    figures = check_nothing_lost(stack, fl, rankings.latest())
    assert not dead_letters(stack.bootstrap, stack.topics["dlq"])
    return figures, rankings.received - len(rankings.latest())


def _interesting(stack: Stack) -> str:
    keep = (
        "leap_events_in",
        "leap_redis",
        "leap_dead",
        "leap_dataset",
        "leap_history",
        "leap_batch_size_count",
    )
    return "\n".join(line for line in stack.metrics_text().splitlines() if line.startswith(keep))


def test_redis_killed_and_restarted_mid_run(stack: Stack, own_redis: OwnRedis) -> None:
    stack.redis_url = own_redis.url
    fl = fleet(seed=41, rate=4000)
    t = stack.topics
    feed(Feeder(stack.bootstrap), stack, fl.subs, fl.comps)
    rankings = RankingsClient(KafkaClients(stack.bootstrap), t["rank"], keep_all=True)
    lag = LagReader(KafkaClients(stack.bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))
    stack.start()

    _wait_ranked(stack, rankings, 0.3, len(fl.subs))
    own_redis.kill()
    t_down = time.monotonic()
    ranked_before = len(rankings.latest())
    time.sleep(3.0)  # the worker ranks without history, retries the completions
    own_redis.start()
    down_s = time.monotonic() - t_down
    _run_until_caught_up(stack, rankings, lag, timeout=90)
    errors = stack.metric("leap_redis_errors")
    no_history = stack.metric("leap_history_unavailable")
    figures, _repeats = _stop_and_check(stack, fl, rankings)
    assert errors > 0  # the outage was seen, not skipped
    blind = sum(not r["history_used"] for r in rankings.latest().values())
    print(
        f"\n--- Redis kill -9 + restart: {fl.events} events; Redis down {down_s:.1f}s after "
        f"{ranked_before} rankings; leap_redis_errors_total {errors:.0f}, "
        f"leap_history_unavailable_total {no_history:.0f}; lost 0; "
        f"{figures['dataset_rows']} dataset rows; history equal to a replay; "
        f"{blind} final rankings without history"
    )
    rankings.close()


@pytest.fixture
def own_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> Iterator[dict[str, Any]]:
    """A second broker (its own LEAP_HOME and ports) that the test may stop and start.

    Depends on ``redis_url`` so the session's Redis is resolved before LEAP_HOME moves."""
    from leap_stream.settings import Settings
    from leap_stream.tools.dev import ensure_services, stop_services
    from leap_stream.tools.dev.state import Paths, load_state

    home = tmp_path / "broker-home"
    version = Settings.from_env().kafka_version
    shared = Paths.from_env().kafka_dist(version)  # the session's jars, before LEAP_HOME moves
    with monkeypatch.context() as mp:
        mp.delenv("LEAP_KAFKA_BOOTSTRAP", raising=False)
        mp.setenv("LEAP_HOME", str(home))
        mp.setenv("LEAP_KAFKA_PORT", str(free_port()))
        mp.setenv("LEAP_KAFKA_CONTROLLER_PORT", str(free_port()))
        # share the session's downloaded jars instead of fetching them again
        mine = Paths.from_env(home).kafka_dist(version)
        if shared.is_dir() and not mine.exists():
            home.mkdir(parents=True, exist_ok=True)
            mine.symlink_to(shared, target_is_directory=True)
        services = ensure_services(kafka=True, redis=False, home=home)

        def restart(down_s: float) -> float:
            t0 = time.monotonic()
            stop_services(names=["kafka"], home=home)
            time.sleep(down_s)
            ensure_services(kafka=True, redis=False, home=home)
            return time.monotonic() - t0

        def freeze(sig: int) -> None:
            """SIGSTOP: connections stay open and nothing answers (a VM or GC pause); SIGCONT."""
            state = load_state(Paths.from_env(home), "kafka")
            assert state is not None and state.pid > 0
            os.kill(state.pid, sig)

        try:
            yield {
                "bootstrap": services.kafka_bootstrap,
                "restart": restart,
                "freeze": freeze,
                "home": home,
            }
        finally:
            stop_services(names=["kafka"], home=home)


def _stack_on(bootstrap: str, redis_url: str, redis_prefix: str, tmp_path: Path) -> Stack:
    """A worker stack whose topics live on `bootstrap` (the test's own broker)."""
    from leap_stream.tools.dev.topics import create_topics

    def topic_factory(hint: str, partitions: int = 1) -> str:
        name = f"faults.{hint}.{os.urandom(5).hex()}"
        create_topics(bootstrap, [name], partitions=partitions)
        return name

    return Stack(
        bootstrap,
        redis_url,
        redis_prefix,
        tmp_path,
        worker_topics(topic_factory, "f"),
        f"faults-{os.urandom(6).hex()}",
    )


def test_broker_restarted_mid_run(
    own_broker: dict[str, Any],
    redis_url: str,
    redis_prefix: str,
    redis_client: Any,
    tmp_path: Path,
) -> None:
    bootstrap = own_broker["bootstrap"]
    stack = _stack_on(bootstrap, redis_url, redis_prefix, tmp_path)
    fl = fleet(seed=43, rate=4000)
    half_s, half_c = len(fl.subs) // 2, len(fl.comps) // 2
    t = stack.topics
    feeder = Feeder(bootstrap)
    feed(feeder, stack, fl.subs[:half_s], fl.comps[:half_c])
    stack.start()
    try:
        rankings = RankingsClient(KafkaClients(bootstrap), t["rank"], keep_all=True)

        _wait_ranked(stack, rankings, 0.25, len(fl.subs))
        ranked_before = len(rankings.latest())
        outage = own_broker["restart"](2.0)
        # the second half arrives after the restart, through the same worker process
        feed(feeder, stack, fl.subs[half_s:], fl.comps[half_c:])
        lag = LagReader(KafkaClients(bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))
        _run_until_caught_up(stack, rankings, lag, timeout=300)
        figures, repeats = _stop_and_check(stack, fl, rankings)
        print(
            f"\n--- broker restart: {fl.events} events; broker down/up took {outage:.1f}s after "
            f"{ranked_before} rankings; same worker process throughout; lost 0; {repeats} "
            f"repeated rankings; {figures['dataset_rows']} dataset rows; history equal to a replay"
        )
        rankings.close()
    finally:
        if stack.alive():
            stack.stop(signal.SIGKILL)


@pytest.mark.parametrize("when", ["idle", "busy"])
def test_broker_frozen_mid_run(
    when: str,
    own_broker: dict[str, Any],
    redis_url: str,
    redis_prefix: str,
    redis_client: Any,
    tmp_path: Path,
) -> None:
    """The broker stops answering (SIGSTOP: connections open, no replies) for longer than the
    session timeout (6 s) and the stall limit (4 s), then answers again; afterwards every
    submission is ranked, every completion is in the dataset once, and nothing is lost.

    ``idle``: frozen once the backlog is done, so the loop is polling: the submissions consumer
    drops out of its group, cannot rejoin, and the worker replaces it (LEAP_CONSUMER_STALL_S)
    while the broker is still frozen. ``busy``: frozen with a backlog, so the loop is inside a
    batch whose rankings cannot be acknowledged: it retries the produce on fresh producers
    (the consumer is not polled, so its group state is not judged) until the broker is back;
    or, caught waiting on a fetch, it replaces its consumer as in ``idle``: which one depends
    on whether librdkafka had records queued at the freeze. CI's first run of this test froze
    a busy loop and waited for a replacement that cannot happen there."""
    bootstrap = own_broker["bootstrap"]
    stack = _stack_on(bootstrap, redis_url, redis_prefix, tmp_path)
    stack.extra_env["LEAP_CONSUMER_STALL_S"] = "4"
    # completions whose submission is in the second half wait through the freeze: not orphans
    stack.extra_env["LEAP_ORPHAN_GRACE_S"] = "600"
    # and every completion of the fleet may wait at once: busy, the completions run ahead of a
    # submissions loop held up by the freeze, past the default 10,000 (then `waiting_overflow`
    # dead letters, which this test does not expect; their own test is test_faults_telemetry)
    stack.extra_env["LEAP_MAX_WAITING_COMPLETIONS"] = "50000"
    # busy: a backlog that a fast worker cannot clear before 5 % of it is seen ranked
    fl = fleet(seed=47, rate=4000 if when == "idle" else 12000)
    half_s, half_c = len(fl.subs) // 2, len(fl.comps) // 2
    t = stack.topics
    feeder = Feeder(bootstrap)
    feed(feeder, stack, fl.subs[:half_s], fl.comps[:half_c])
    lag = LagReader(KafkaClients(bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))
    stack.start()
    try:
        rankings = RankingsClient(KafkaClients(bootstrap), t["rank"], keep_all=True)
        if when == "idle":

            def submissions_done() -> bool:
                assert stack.alive(), stack.log_tail()
                rankings.poll(timeout=0.1, max_messages=5000)
                return total_lag(r for r in lag.read() if r.topic == t["sub"]) == 0

            # every submission fed so far ranked and committed: the loop is polling (completions
            # whose submission comes in the second half are still waiting, unacked)
            wait_for("the submissions backlog done", submissions_done, 120, every=0.2)
        else:
            _wait_ranked(stack, rankings, 0.05, len(fl.subs))
            # the premise: a backlog of submissions is left to rank
            assert total_lag(r for r in lag.read() if r.topic == t["sub"]) > 0
        assert stack.metric("leap_consumer_replaced") == 0  # a healthy group is left alone
        own_broker["freeze"](signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            if when == "idle":
                # session timeout + stall limit + a statistics interval, with margin
                wait_for(
                    "the stuck consumer replaced",
                    lambda: stack.metric("leap_consumer_replaced") >= 1,
                    60,
                    every=0.5,
                )
            else:
                # a batch in hand fails over to a fresh producer (LEAP_PRODUCE_TIMEOUT_S + 5 s);
                # a loop caught between batches (waiting on a fetch) replaces its consumer
                wait_for(
                    "the worker reacting to the frozen broker",
                    lambda: (
                        stack.metric("leap_producer_resets") >= 1
                        or stack.metric("leap_consumer_replaced") >= 1
                    ),
                    60,
                    every=0.5,
                )
        finally:
            own_broker["freeze"](signal.SIGCONT)
        frozen_s = time.monotonic() - frozen_at
        feed(feeder, stack, fl.subs[half_s:], fl.comps[half_c:])
        _run_until_caught_up(stack, rankings, lag, timeout=240)
        replaced = stack.metric("leap_consumer_replaced")
        resets = stack.metric("leap_producer_resets")
        figures, repeats = _stop_and_check(stack, fl, rankings)
        print(
            f"\n--- broker frozen ({when}): {fl.events} events; broker frozen {frozen_s:.1f}s; "
            f"{replaced:.0f} consumers replaced; {resets:.0f} producers reset; same worker "
            f"process throughout; lost 0; {repeats} repeated rankings; "
            f"{figures['dataset_rows']} dataset rows"
        )
        rankings.close()
        lag.close()
    finally:
        if stack.alive():
            stack.stop(signal.SIGKILL)


def test_dataset_sink_down_does_not_stop_the_history(stack: Stack) -> None:
    """A full, read-only or lost dataset folder used to stop the Redis history updates too
    (the completions agent waited on the write), so priors froze. Now the history goes on, the
    rows wait unacked, the outage is counted, and when the sink is back every completion is in
    the dataset once."""
    fl = fleet(seed=43, rate=3000)
    t = stack.topics
    dataset = stack.tmp / "dataset"
    dataset.mkdir(parents=True, exist_ok=True)
    first, second = fl.comps[: len(fl.comps) // 3], fl.comps[len(fl.comps) // 3 :]
    feeder = Feeder(stack.bootstrap)
    feed(feeder, stack, fl.subs, first)
    rankings = RankingsClient(KafkaClients(stack.bootstrap), t["rank"], keep_all=True)
    lag = LagReader(KafkaClients(stack.bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))
    stack.start()
    _run_until_caught_up(stack, rankings, lag, timeout=120)
    store = OnlineStore(connect(stack.redis_url), prefix=stack.prefix)

    def measured() -> int:
        ids = sorted({c["lineage_id"] for c in fl.comps})
        hist, _ = store.read_batch(ids, [])
        return sum(m.count for h in hist for m in h.values())

    before = measured()
    # the folder is gone and a file stands in its way: every write fails (root ignores modes)
    dataset.rename(stack.tmp / "dataset.away")
    dataset.write_text("not a folder")
    t_down = time.monotonic()
    feed(feeder, stack, [], second[: len(second) // 2])
    time.sleep(3)  # past LEAP_DATASET_FLUSH_S: a write has been tried and has failed
    feed(feeder, stack, [], second[len(second) // 2 :])

    book = HistoryBook()
    for c in fl.comps:
        book.apply_completion(c)
    everything = sum(m.count for x in book.lineage_ids for m in book.lineage(x).values())

    def history_complete() -> bool:  # every batch applied, not only the one in hand
        assert stack.alive(), stack.log_tail()
        return measured() == everything and stack.metric("leap_dataset_write_failures") > 0

    wait_for("all history applied while the sink fails", history_complete, 60, every=0.5)
    held = stack.metric("leap_dataset_pending_rows")
    assert held > 0
    assert total_lag(lag.read()) > 0  # the completions stay uncommitted meanwhile
    dataset.unlink()
    (stack.tmp / "dataset.away").rename(dataset)
    down_s = time.monotonic() - t_down
    _run_until_caught_up(stack, rankings, lag, timeout=120)
    failures = stack.metric("leap_dataset_write_failures")
    figures, _repeats = _stop_and_check(stack, fl, rankings)
    store.r.close()
    print(
        f"\n--- dataset sink down {down_s:.1f}s: {fl.events} events; history went from "
        f"{before} to all {everything} measurements meanwhile; {held:.0f} rows held; "
        f"leap_dataset_write_failures_total {failures:.0f}; lost 0; "
        f"{figures['dataset_rows']} dataset rows"
    )
    rankings.close()
