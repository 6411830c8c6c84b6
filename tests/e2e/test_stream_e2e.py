"""End to end: the simulator's events through a real broker, a real Redis and the worker process.

The worker runs as `python -m leap_stream worker` with its own topics, consumer group, key
prefix and folders. The figures (events, throughput, batch latency) are printed; run with ``-s``
to see them.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pyarrow.parquet as pq
import pytest

from leap_stream.contracts import parse_ts
from leap_stream.core.history import HistoryBook
from leap_stream.store.artefact import write_model
from leap_stream.store.connection import connect
from leap_stream.store.offline import DatasetSink, read_dataset
from leap_stream.store.online import OnlineStore
from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.lag import LagReader, total_lag, worker_groups
from leap_stream.stream.submission_loop import submissions_group
from leap_stream.stream.worker import EXIT_STOP_DEADLINE
from leap_stream.tools.harness import (
    WorkerStack,
    aggregate_differences,
    dispute_worker_holds,
    free_port,
    lineage_differences,
    wait_for,
    worker_topics,
)
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.events import (
    completion_events,
    completions_in_arrival_order,
    submission_events,
)
from leap_stream.tools.sim.fleet import simulate

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


# quick timers: the tests wait for flushes, lag and reloads
E2E_SETTINGS = {
    "LEAP_DATASET_FLUSH_S": "1",
    "LEAP_LAG_INTERVAL_S": "1",
    "LEAP_MODEL_POLL_S": "1",
    "LEAP_COMMIT_INTERVAL_S": "0.5",
    "LEAP_ORPHAN_GRACE_S": "3",
}


@dataclass
class Stack(WorkerStack):
    """One worker's world (tools/harness.py) with the e2e tests' settings."""

    extra_env: dict[str, str] = field(default_factory=lambda: dict(E2E_SETTINGS))


@pytest.fixture
def stack(
    kafka_bootstrap: str,
    redis_url: str,
    topic_factory: Any,
    redis_prefix: str,
    redis_client: Any,
    tmp_path: Path,
) -> Iterator[Stack]:
    topics = worker_topics(topic_factory)
    s = Stack(
        kafka_bootstrap, redis_url, redis_prefix, tmp_path, topics, f"e2e-{os.urandom(6).hex()}"
    )
    yield s
    if s.alive():
        s.stop(signal.SIGKILL)


@pytest.fixture
def cluster_stack(stack: Stack, redis_cluster_url: str) -> Stack:
    """`stack` with its online store on a real three-master Redis Cluster."""
    stack.redis_url = redis_cluster_url
    stack.extra_env["LEAP_REDIS_CLUSTER"] = "1"
    return stack


class Feeder:
    """Produces events and remembers where each landed (for the dead-letter check)."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer

        self.p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.placed: dict[bytes, tuple[str, int, int]] = {}

    def send(self, topic: str, key: str | None, value: bytes, tag: bytes | None = None) -> None:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            if tag is not None:
                self.placed[tag] = (msg.topic(), msg.partition(), msg.offset())

        self.p.produce(
            topic, key=None if key is None else key.encode(), value=value, on_delivery=done
        )
        self.p.poll(0)

    def flush(self) -> None:
        assert self.p.flush(60) == 0

    def send_events(self, topic: str, events: list[dict[str, Any]]) -> None:
        """Every event, keyed by its job as the services produce them, then flush."""
        for e in events:
            self.send(topic, e["job_id"], orjson.dumps(e))
        self.flush()


def _dead_letters(bootstrap: str, topic: str, expect: int, timeout: float) -> dict[str, Any]:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dlq-reader-{os.urandom(4).hex()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    seen: dict[str, Any] = {}
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for m in c.consume(500, timeout=0.5):
            if m.error() is None:
                d = orjson.loads(m.value())
                seen[d["event_id"]] = d  # the id derives from topic/partition/offset
        if len(seen) >= expect:
            # read a little longer: there must not be more than expected
            for m in c.consume(500, timeout=1.0):
                if m.error() is None:
                    d = orjson.loads(m.value())
                    seen[d["event_id"]] = d
            break
    c.close()
    return seen


def _promote_model(registry_dir: Path, dataset: pd.DataFrame) -> str:
    """What the nightly trainer does, in small: fit, save with a lookup, publish, promote."""
    from leap_stream.core.lookup import LookupTable
    from leap_stream.store.registry import Registry
    from leap_stream.train.trainer import fit, training_rows

    model = fit(training_rows(dataset), num_rounds=60)
    d = write_model(registry_dir.parent / "build", model, LookupTable.fit(dataset))
    reg = Registry(registry_dir)
    version = reg.publish(d)
    reg.promote(version)
    return version


def _histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Upper bound of the bucket holding quantile q (cumulative counts)."""
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


@pytest.mark.parametrize("world", ["stack", "cluster_stack"])
def test_worker_end_to_end(world: str, request: pytest.FixtureRequest) -> None:
    """Every promise of the worker, through the real broker, Redis (one server, and a
    three-master cluster) and files."""
    stack: Stack = request.getfixturevalue(world)
    sim = simulate(SimConfig(seed=5, days=2, rate=1500))
    day2 = sim.submissions["submitted_at"] >= sim.submissions["submitted_at"].min().normalize() + (
        pd.Timedelta(days=1)
    )
    # yesterday's telemetry is already in the dataset: the worker fits its lookup table on it
    past = sim.dataset[
        sim.dataset["submitted_at"] < sim.submissions.loc[day2, "submitted_at"].min()
    ]
    DatasetSink(stack.tmp / "dataset").append(past.to_dict("records"))
    subs = submission_events(sim.submissions.loc[day2])
    keys = {(s["job_id"], s["attempt"]) for s in subs}
    comp_frame = completions_in_arrival_order(sim.completions)
    comps = [c for c in completion_events(comp_frame) if (c["job_id"], c["attempt"]) in keys]
    sub_at = {(s["job_id"], s["attempt"]): s["submitted_at"] for s in subs}
    subs.sort(key=lambda s: s["submitted_at"])

    stack.start()
    feeder = Feeder(stack.bootstrap)
    t = stack.topics
    bad_sub = [
        b"{not json",
        b"",
        orjson.dumps({k: v for k, v in subs[0].items() if k != "training"}),
        orjson.dumps(
            dict(
                subs[1],
                event_id="sub-unknown-hw",
                candidate_hardware=["quantum-9000"],
                default_hardware="quantum-9000",
            )
        ),
    ]
    bad_comp = [
        b"[1, 2, 3]",
        orjson.dumps(dict(comps[0], status="exploded")),
    ]
    orphan = dict(comps[0], event_id="cmp-orphan", job_id="job-nobody-submitted")
    expected_kinds = {
        "not_json": 2,
        "schema": 2,
        "unknown_hardware": 1,
        "not_object": 1,
        "orphan_completion": 1,
    }

    # three windows: submissions of a window, then the completions that ended in it; later
    # windows therefore rank with the history the earlier ones wrote
    n_windows = 3
    applied: list[dict[str, Any]] = []
    rankings = RankingsClient(KafkaClients(stack.bootstrap), t["rank"], keep_all=True)
    lag = LagReader(KafkaClients(stack.bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))
    sent_comp = 0
    model_version = None
    t_start = time.monotonic()
    busy_s = 0.0
    for w in range(n_windows):
        lo, hi = len(subs) * w // n_windows, len(subs) * (w + 1) // n_windows
        t0 = time.monotonic()
        for s in subs[lo:hi]:
            feeder.send(t["sub"], s["job_id"], orjson.dumps(s))
        if w == 0:
            for i, raw in enumerate(bad_sub):
                feeder.send(t["sub"], None, raw, tag=b"sub-bad-%d" % i)
        feeder.flush()
        want = {(s["job_id"], s["attempt"]) for s in subs[:hi]}

        def ranked(want: set[tuple[str, int]] = want) -> bool:
            assert stack.alive(), stack.log_tail()
            rankings.poll(timeout=0.2, max_messages=5000)
            return want <= set(rankings.latest())

        wait_for(f"rankings of window {w}", ranked, 90, every=0.01)
        assert stack.alive(), stack.log_tail()
        # completions whose submission is in this window or before, in arrival order
        cutoff = subs[hi - 1]["submitted_at"]
        eligible = []
        for c in comps[sent_comp:]:
            if w < n_windows - 1 and sub_at[(c["job_id"], c["attempt"])] > cutoff:
                break
            eligible.append(c)
        batch = eligible
        sent_comp += len(batch)
        for c in batch:
            feeder.send(t["comp"], c["job_id"], orjson.dumps(c))
        applied.extend(batch)
        if w == 1:  # a re-sent completion (producer retry) and one nobody submitted
            dup = batch[len(batch) // 2]
            feeder.send(t["comp"], dup["job_id"], orjson.dumps(dup))
            # (an orphan changes no history: it is not in `applied`)
            feeder.send(t["comp"], orphan["job_id"], orjson.dumps(orphan), tag=b"orphan")
            for i, raw in enumerate(bad_comp):
                feeder.send(t["comp"], None, raw, tag=b"comp-bad-%d" % i)
        feeder.flush()
        wait_for(
            f"completions of window {w}",
            lambda: total_lag(lag.read()) == 0,
            90,
            every=0.1,
        )
        busy_s += time.monotonic() - t0
        if w == 0:
            # the nightly job promotes a model trained on yesterday: hot-reloaded, no restart
            model_version = _promote_model(stack.tmp / "registry", past)
            wait_for(
                "the worker to serve the new model",
                lambda v=model_version: any(
                    lab.get("version") == v
                    for lab, _x, _s in stack.metrics().get("leap_model_info", [])
                ),
                30,
            )
    elapsed = time.monotonic() - t_start
    assert sent_comp == len(comps)

    # --- every valid submission has exactly one ranking per (job_id, attempt), after de-dup
    rankings.drain(idle_s=1.5, max_s=30)
    latest = rankings.latest()
    assert set(latest) == keys
    sources = {}
    for r in latest.values():
        sources[r["source"]] = sources.get(r["source"], 0) + 1
    assert sources.get("lookup", 0) > 0 and sources.get("model", 0) > 0
    late = [latest[(s["job_id"], s["attempt"])] for s in subs[len(subs) // n_windows :]]
    assert {r["model_version"] for r in late if r["source"] == "model"} == {model_version}
    early = [latest[(s["job_id"], s["attempt"])] for s in subs[: len(subs) // n_windows]]
    assert not any(r["source"] == "model" for r in early)
    history_used = sum(bool(r.get("history_used")) for r in latest.values())
    assert history_used > 0  # windows 2 and 3 saw what window 1 measured

    # --- the Redis history equals a HistoryBook replay of the completions (arrival order)
    book = HistoryBook()
    for c in applied:
        book.apply_completion(c)
    store = stack.online_store()
    lineages, types = book.lineage_ids, book.model_types
    types_of = {c["lineage_id"]: c["model_type"] for c in applied}
    hist, aggs = store.read_batch(lineages, types, [types_of[x] for x in lineages])
    assert hist == [book.lineage(x) for x in lineages]
    assert aggs == {m: book.aggregates(m) for m in types}

    # --- the dataset has every completion exactly once (plus yesterday's rows, untouched)
    frame = read_dataset(stack.tmp / "dataset")
    ids = frame["event_id"].tolist()
    assert len(ids) == len(set(ids))
    assert set(ids) == {c["event_id"] for c in comps} | set(past["event_id"])
    files = list((stack.tmp / "dataset").rglob("*.parquet"))
    raw_rows = sum(pq.read_metadata(f).num_rows for f in files)

    # --- the dead-letter topic has every invalid event, with its reason and source
    placed = feeder.placed
    dead = _dead_letters(stack.bootstrap, t["dlq"], expect=len(placed), timeout=30)
    got_src = {
        (d["source"]["topic"], d["source"]["partition"], d["source"]["offset"])
        for d in dead.values()
    }
    assert got_src == set(placed.values())
    kinds: dict[str, int] = {}
    for d in dead.values():
        kinds[d["error"]["kind"]] = kinds.get(d["error"]["kind"], 0) + 1
    assert kinds == {k: v for k, v in expected_kinds.items() if v}

    # --- lag is 0 and the worker says the same in its metrics
    rows = lag.read()
    assert total_lag(rows) == 0
    m = stack.metrics()

    def total(name: str, **labels: str) -> float:
        return sum(
            v
            for lab, v, sample in m.get(name, [])
            if sample == name + "_total" and all(lab.get(k) == x for k, x in labels.items())
        )

    assert total("leap_events_in", topic=t["sub"], outcome="valid") == len(subs)
    assert total("leap_events_in", topic=t["sub"], outcome="invalid") == len(bad_sub)
    assert total("leap_events_in", topic=t["comp"], outcome="invalid") == len(bad_comp)
    assert total("leap_completions_duplicate") == 1
    assert total("leap_dead_letter") == len(placed)
    assert total("leap_rankings_out") >= len(subs)
    # the online accuracy: completions of the jobs the model ranked (windows 2 and 3) were
    # compared with the prediction on the hardware they ran on
    compared = total("leap_online_predictions")
    assert 0 < compared <= sum(r["source"] == "model" for r in latest.values())
    assert 0 < total("leap_online_within_10pct") <= compared
    wait_for(
        "lag gauge at 0",
        lambda: all(
            v == 0 for _l, v, _s in stack.metrics().get("leap_consumer_lag", [(None, 1, "")])
        ),
        10,
    )

    # --- SIGTERM: graceful, exit 0
    assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()

    # --- figures
    def buckets(agent: str) -> tuple[list[tuple[float, float]], float, float, float]:
        bs = sorted(
            (float(lab["le"]), v)
            for lab, v, s in m["leap_batch_seconds"]
            if s.endswith("_bucket") and lab.get("agent") == agent
        )
        cnt = next(
            v
            for lab, v, s in m["leap_batch_seconds"]
            if s.endswith("_count") and lab.get("agent") == agent
        )
        sm = next(
            v
            for lab, v, s in m["leap_batch_seconds"]
            if s.endswith("_sum") and lab.get("agent") == agent
        )
        size = next(
            v
            for lab, v, s in m["leap_batch_size"]
            if s.endswith("_sum") and lab.get("agent") == agent
        )
        return bs, cnt, sm, size

    n_events = len(subs) + len(comps) + len(bad_sub) + len(bad_comp) + 2
    print("\n--- e2e figures")
    print(
        f"events: {len(subs)} submissions, {len(comps)} completions (+1 duplicate, +1 orphan), "
        f"{len(bad_sub) + len(bad_comp)} invalid; dataset rows {len(frame)} "
        f"({len(past)} from yesterday; {raw_rows} physical)"
    )
    print(
        f"rankings: {len(latest)} (received {rankings.received}) sources {sources}, "
        f"history_used {history_used}"
    )
    print(f"dead letters: {kinds}")
    assert rankings.all is not None
    for w in range(n_windows):
        lo, hi = len(subs) * w // n_windows, len(subs) * (w + 1) // n_windows
        mine = {(s["job_id"], s["attempt"]) for s in subs[lo:hi]}
        stamps = sorted(
            parse_ts(r["produced_at"]) for r in rankings.all if (r["job_id"], r["attempt"]) in mine
        )
        print(
            f"window {w}: {len(mine)} submissions ranked in {stamps[-1] - stamps[0]:.2f}s of "
            f"worker time ({len(mine) / max(stamps[-1] - stamps[0], 1e-3):.0f} rankings/s)"
            + (" with LightGBM" if w else " with the lookup table")
        )
    print(
        f"wall {elapsed:.1f}s incl. worker start; busy {busy_s:.1f}s -> {n_events / busy_s:.0f} events/s end to end"
    )
    for agent in ("submissions", "completions"):
        bs, cnt, sm, size = buckets(agent)
        print(
            f"batch {agent}: {cnt:.0f} batches, mean {1000 * sm / max(cnt, 1):.1f} ms, "
            f"p50 <= {1000 * _histogram_quantile(bs, 0.5):.0f} ms, p99 <= {1000 * _histogram_quantile(bs, 0.99):.0f} ms, "
            f"mean size {size / max(cnt, 1):.0f}"
        )
    rankings.close()


def _complete_after_a_quarter(
    stack: Stack,
    rankings: RankingsClient,
    feeder: Feeder,
    n_subs: int,
    comps: list[dict[str, Any]],
) -> None:
    """Once a quarter of the submissions is ranked, produce every completion: they join the
    submissions remembered so far, the rest wait for theirs."""

    def some_ranked() -> bool:
        assert stack.alive(), stack.log_tail()
        rankings.poll(timeout=0.2, max_messages=5000)
        return len(rankings.latest()) >= n_subs // 4

    wait_for("a quarter of the rankings", some_ranked, 90, every=0.01)
    feeder.send_events(stack.topics["comp"], comps)


@pytest.mark.parametrize(
    ("sig", "deadline"),
    [(signal.SIGTERM, None), (signal.SIGKILL, None), (signal.SIGTERM, "0.05")],
    ids=["sigterm", "sigkill", "stop-deadline"],
)
def test_worker_restart_loses_nothing(stack: Stack, sig: int, deadline: str | None) -> None:
    """A backlog, a stop in the middle (graceful, a crash, or a graceful stop cut short by
    LEAP_STOP_DEADLINE_S), a restart: nothing is lost."""
    # big enough that the worker cannot finish it between "a quarter ranked" and the stop
    # (with 1,500 and then 4,000 of each, a faster worker sometimes had: lag 0 at the stop)
    sim = simulate(SimConfig(seed=7, days=1, rate=8000))
    subs = submission_events(sim.submissions)
    keys = {(s["job_id"], s["attempt"]) for s in subs}
    comps = completion_events(completions_in_arrival_order(sim.completions))
    t = stack.topics
    feeder = Feeder(stack.bootstrap)
    for s in subs:
        feeder.send(t["sub"], s["job_id"], orjson.dumps(s))
    feeder.flush()
    rankings = RankingsClient(KafkaClients(stack.bootstrap), t["rank"], keep_all=True)
    lag = LagReader(KafkaClients(stack.bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))

    # the default grace, not the e2e's 3 s: the restarted worker's completions wait for the
    # submissions it re-ranks, and on a slow machine a 3 s grace could orphan some of them
    stack.extra_env["LEAP_ORPHAN_GRACE_S"] = "60"
    if deadline is not None:
        stack.extra_env["LEAP_STOP_DEADLINE_S"] = deadline
    stack.start("worker-1")
    stack.extra_env.pop("LEAP_STOP_DEADLINE_S", None)

    _complete_after_a_quarter(stack, rankings, feeder, len(subs), comps)
    time.sleep(0.3)
    rc = stack.stop(sig)
    graceful = sig == signal.SIGTERM and deadline is None
    if graceful:
        assert rc == 0, stack.log_tail()
    if deadline is not None:  # Faust's stop outlived it: exit 4, and where it was waiting
        assert rc == EXIT_STOP_DEADLINE, stack.log_tail()
        log = stack.log_tail(400)
        assert "LEAP_STOP_DEADLINE_S" in log and "(innermost await last):" in log, log
    assert total_lag(lag.read()) > 0  # stopped with work left
    done_before = sum(r.committed or 0 for r in lag.read())

    rankings.drain(idle_s=1.0, max_s=20)
    stack.start("worker-2")
    t_restart = time.monotonic()
    restart_epoch = time.time()

    def caught_up() -> bool:
        assert stack.alive(), stack.log_tail()
        return total_lag(lag.read()) == 0

    wait_for("lag 0 after restart", caught_up, 120, every=0.2)
    t_caught_up = time.monotonic()
    rankings.drain(idle_s=1.5, max_s=30)
    assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()

    latest = rankings.latest()
    assert set(latest) == keys
    repeats = rankings.received - len(latest)
    if graceful:
        # every acked batch was committed before exit, so nothing is redone
        assert repeats == 0
    # completions that overtook their submission waited for the join (or, at the stop, were
    # left uncommitted and redone): none is an orphan, the dataset has every one exactly once
    frame = read_dataset(stack.tmp / "dataset")
    ids = frame["event_id"].tolist()
    assert len(ids) == len(set(ids))
    if set(ids) != {c["event_id"] for c in comps}:
        raise AssertionError(_lost_rows(stack, comps, set(ids), done_before))
    assert not _dead_letters(stack.bootstrap, t["dlq"], expect=0, timeout=2)

    book = HistoryBook()
    for c in comps:
        book.apply_completion(c)
    # a value the worker held (applied later, or in another order, than here) is order-dependent
    dispute_worker_holds(book, frame)
    store = OnlineStore(connect(stack.redis_url), prefix=stack.prefix)
    hist, aggs = store.read_batch(book.lineage_ids, book.model_types)
    differ, disputed = lineage_differences(hist, book, book.lineage_ids)
    if differ:
        lid, stored, replayed = differ[0]
        raise AssertionError(
            f"{len(differ)} lineages differ from a replay; {lid}: Redis {stored!r}, "
            f"replay {replayed!r}; quarantined rows of it: "
            f"{frame.loc[frame['lineage_id'] == lid, 'quarantine'].tolist()}"
        )
    assert disputed <= max(3, len(book.lineage_ids) // 100), disputed
    # completions that overtook their submission were applied when it came: later than here
    want = {m: book.aggregates(m) for m in book.model_types}
    assert not aggregate_differences(aggs, want, skip=book.disputed_types)

    assert rankings.all is not None
    run2 = sorted(
        parse_ts(r["produced_at"])
        for r in rankings.all
        if parse_ts(r["produced_at"]) > restart_epoch
    )
    run2_rate = len(run2) / max(run2[-1] - run2[0], 1e-3) if len(run2) >= 200 else float("nan")
    total_events = len(subs) + len(comps)
    redone = total_events - done_before
    print(
        f"\n--- restart ({signal.Signals(sig).name}): {len(subs)} submissions + {len(comps)} "
        f"completions; {done_before} committed before the stop, {redone} by the restarted "
        f"worker in {t_caught_up - t_restart:.1f}s incl. start-up "
        f"({redone / (t_caught_up - t_restart):.0f} events/s); {repeats} repeated rankings; "
        f"backlog: {len(run2)} rankings at {run2_rate:.0f}/s (no model, completions in parallel)"
    )
    rankings.close()


def _lost_rows(
    stack: Stack, comps: list[dict[str, Any]], ids: set[str], committed: int | None = None
) -> str:
    """What a failed "every completion in the dataset" check needs for a diagnosis: which
    completions are missing (by position in the order produced: their offsets when the topic
    has one partition), the dead letters, and what the first worker logged about its stop."""
    missing = [i for i, c in enumerate(comps) if c["event_id"] not in ids]
    extra = len(ids - {c["event_id"] for c in comps})
    dead = _dead_letters(stack.bootstrap, stack.topics["dlq"], expect=0, timeout=2)
    kinds = Counter(d.get("kind") for d in dead.values())
    first = min(stack.tmp.glob("worker-*.log"), default=None)
    stop_log = [
        line
        for line in (first.read_text(errors="replace").splitlines() if first else [])
        if any(
            k in line
            for k in ("Signal", "uncommitted", "Faust's own ack", "before a rebalance", "DEADLINE")
        )
    ]
    before = "" if committed is None else f"; {committed} events committed before the stop"
    return (
        f"{len(missing)} of {len(comps)} completions have no dataset row (and {extra} rows are "
        f"not ours): positions {missing[:5]}…{missing[-5:]}{before}; dead letters "
        f"{dict(kinds)}; {first.name if first else 'no log'}: {stop_log[-8:]}"
    )


@pytest.mark.parametrize("delay_s", [0.05, 0.3])
def test_a_sigterm_while_the_worker_loads_stops_it_cleanly(stack: Stack, delay_s: float) -> None:
    """A SIGTERM in the first moments of the process, while Python still imports the worker
    (~0.6 s), is held until the worker has its handlers, then stops it like any SIGTERM during
    start-up: exit 0, nothing consumed, instead of death by the signal.

    The delay counts from the moment the process holds the signal: before it, the interpreter
    still starts (20-70 ms, more on a loaded host) and SIGTERM's default action applies; no
    Python code can run there. Counted from the spawn, a 0.05 s delay raced that start."""
    stack.start("early")
    wait_for(
        "the worker holds SIGTERM", lambda: signal.SIGTERM in stack.blocked_signals(), 10, 0.001
    )
    time.sleep(delay_s)
    assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()
    assert "stopped while starting" in stack.log_tail(), stack.log_tail()


def test_worker_without_redis_ranks_and_loses_nothing(stack: Stack) -> None:
    """Redis unreachable: rankings still flow (without history), nothing is committed that only
    lived in memory; restarted with Redis, every completion is joined into the dataset."""
    sim = simulate(SimConfig(seed=13, days=1, rate=300))
    subs = submission_events(sim.submissions)
    keys = {(s["job_id"], s["attempt"]) for s in subs}
    comps = completion_events(completions_in_arrival_order(sim.completions))
    t = stack.topics
    feeder = Feeder(stack.bootstrap)
    for s in subs:
        feeder.send(t["sub"], s["job_id"], orjson.dumps(s))
    feeder.flush()
    rankings = RankingsClient(KafkaClients(stack.bootstrap), t["rank"])
    lag = LagReader(KafkaClients(stack.bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))
    real_redis = stack.redis_url
    stack.redis_url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    stack.start("worker-no-redis")

    def all_ranked() -> bool:
        assert stack.alive(), stack.log_tail()
        rankings.poll(timeout=0.2, max_messages=5000)
        return set(rankings.latest()) == keys

    wait_for("rankings without Redis", all_ranked, 60, every=0.01)
    assert not any(r["history_used"] for r in rankings.latest().values())
    for c in comps:
        feeder.send(t["comp"], c["job_id"], orjson.dumps(c))
    feeder.flush()
    time.sleep(2.0)
    m = stack.metrics()
    unavailable = sum(v for _l, v, s in m["leap_history_unavailable"] if s.endswith("_total"))
    assert unavailable == len(subs)
    assert sum(v for _l, v, s in m["leap_redis_errors"] if s.endswith("_total")) > 0
    assert total_lag(lag.read()) == len(subs) + len(comps)  # nothing committed
    # alive, but not ready: Redis does not answer
    assert stack.probe("/healthz") == (200, {"status": "ok"})
    status, state = stack.probe("/readyz")
    assert status == 503 and state["redis"] is False and state["ready"] is False
    # the completions cannot be applied: the worker says so with its exit status
    assert stack.stop(signal.SIGTERM) == 3, stack.log_tail()

    stack.redis_url = real_redis
    stack.start("worker-redis-back")

    def caught_up() -> bool:
        assert stack.alive(), stack.log_tail()
        return total_lag(lag.read()) == 0

    wait_for("catching up with Redis back", caught_up, 90, every=0.2)
    status, state = stack.probe("/readyz")
    assert state["redis"] is True and state["ready"] is (state["model"] is not None)
    assert status == (200 if state["ready"] else 503)
    assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()
    frame = read_dataset(stack.tmp / "dataset")
    assert sorted(frame["event_id"]) == sorted(c["event_id"] for c in comps)
    assert not _dead_letters(stack.bootstrap, t["dlq"], expect=0, timeout=2)
    rankings.close()


def test_one_process_per_role_loses_nothing(stack: Stack) -> None:
    """LEAP_WORKER_ROLES: a submissions process and a completions process on the same topics,
    group and Redis are one worker: every job ranked once, every completion in the dataset once,
    each process reading only its own topic."""
    sim = simulate(SimConfig(seed=21, days=1, rate=600))
    subs = submission_events(sim.submissions)
    keys = {(s["job_id"], s["attempt"]) for s in subs}
    comps = completion_events(completions_in_arrival_order(sim.completions))
    completions_side = Stack(
        stack.bootstrap,
        stack.redis_url,
        stack.prefix,
        stack.tmp / "completions",
        stack.topics,
        stack.group,
        extra_env={**E2E_SETTINGS, "LEAP_WORKER_ROLES": "completions"},
    )
    completions_side.tmp.mkdir()
    stack.extra_env = {**E2E_SETTINGS, "LEAP_WORKER_ROLES": "submissions"}
    t = stack.topics
    feeder = Feeder(stack.bootstrap)
    for s in subs:
        feeder.send(t["sub"], s["job_id"], orjson.dumps(s))
    for c in comps:
        feeder.send(t["comp"], c["job_id"], orjson.dumps(c))
    feeder.flush()
    rankings = RankingsClient(KafkaClients(stack.bootstrap), t["rank"])
    lag = LagReader(KafkaClients(stack.bootstrap), worker_groups(stack.group, t["sub"], t["comp"]))
    stack.start("submissions-only")
    completions_side.start("completions-only")
    try:

        def done() -> bool:
            assert stack.alive(), stack.log_tail()
            assert completions_side.alive(), completions_side.log_tail()
            rankings.poll(timeout=0.2, max_messages=5000)
            return set(rankings.latest()) == keys and total_lag(lag.read()) == 0

        wait_for("both roles caught up", done, 120)
        # each process consumed its own topic only
        assert stack.metric("leap_events_in", topic=t["comp"]) == 0
        assert stack.metric("leap_events_in", topic=t["sub"], outcome="valid") == len(subs)
        assert completions_side.metric("leap_events_in", topic=t["sub"]) == 0
        assert completions_side.metric("leap_events_in", topic=t["comp"], outcome="valid") > 0
    finally:
        assert completions_side.stop(signal.SIGTERM) == 0, completions_side.log_tail()
        assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()
    frame = read_dataset(stack.tmp / "completions" / "dataset")
    ids = frame["event_id"].tolist()
    assert len(ids) == len(set(ids)) and set(ids) == {c["event_id"] for c in comps}


def _members_with_partitions(bootstrap: str, groups: list[str]) -> Callable[[], bool]:
    """A `wait_for` condition: each of ``groups`` has two members, each holding partitions."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def ready() -> bool:
        for future in admin.describe_consumer_groups(groups).values():
            members = future.result(timeout=10).members
            if len(members) != 2 or not all(m.assignment.topic_partitions for m in members):
                return False
        return True

    return ready


def _one_group(
    bootstrap: str,
    redis_url: str,
    prefix: str,
    tmp: Path,
    make_topic: Any,
    partitions: int,
    settings: dict[str, str],
) -> tuple[Stack, Stack]:
    """Two workers in one group on shared topics (``partitions`` for each input), each with
    its own folder (and so its own dataset)."""
    topics = {
        "sub": make_topic("sub", partitions=partitions),
        "comp": make_topic("comp", partitions=partitions),
        "rank": make_topic("rank", partitions=partitions),
        "dlq": make_topic("dlq", partitions=2),
    }
    group = f"e2e-{os.urandom(6).hex()}"
    pair = []
    for name in ("a", "b"):
        (tmp / name).mkdir()
        pair.append(Stack(bootstrap, redis_url, prefix, tmp / name, topics, group, dict(settings)))
    return pair[0], pair[1]


def _unapplied(stack: Stack, comps: list[dict[str, Any]]) -> list[str]:
    """Completions with no dedup marker in the online store: never applied to the history."""
    store = stack.online_store()
    try:
        return [
            c["event_id"]
            for c in comps
            if not store.r.exists(store.keys.seen(c["event_id"], c["model_type"]))
        ]
    finally:
        store.r.close()


def test_two_workers_on_eight_partitions_of_a_redis_cluster_lose_nothing(
    kafka_bootstrap: str,
    redis_cluster_url: str,
    topic_factory: Any,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    """Scale-out: two worker processes in one group share eight partitions of each input
    topic, their online store a three-master Redis Cluster. Every job is ranked, every
    completion is applied once (its dedup marker is on the cluster) and lands in exactly one
    worker's dataset."""
    settings = {**E2E_SETTINGS, "LEAP_REDIS_CLUSTER": "1"}
    workers = _one_group(
        kafka_bootstrap, redis_cluster_url, redis_prefix, tmp_path, topic_factory, 8, settings
    )
    topics, group = workers[0].topics, workers[0].group
    sim = simulate(SimConfig(seed=23, days=1, rate=1200))
    subs = submission_events(sim.submissions)
    keys = {(s["job_id"], s["attempt"]) for s in subs}
    comps = completion_events(completions_in_arrival_order(sim.completions))
    # both workers hold partitions of both topics before the first event: else the first one
    # up may drain everything before the second joins, and nothing is shared
    for w, name in zip(workers, ("a", "b"), strict=True):
        w.start(f"worker-{name}")
    both = _members_with_partitions(kafka_bootstrap, [submissions_group(group), group])
    wait_for("both workers hold partitions of both topics", both, 120)
    feeder = Feeder(kafka_bootstrap)
    feeder.send_events(topics["sub"], subs)
    feeder.send_events(topics["comp"], comps)
    rankings = RankingsClient(KafkaClients(kafka_bootstrap), topics["rank"])
    lag = LagReader(
        KafkaClients(kafka_bootstrap), worker_groups(group, topics["sub"], topics["comp"])
    )
    try:

        def done() -> bool:
            for w in workers:
                assert w.alive(), w.log_tail()
            rankings.poll(timeout=0.2, max_messages=5000)
            return set(rankings.latest()) == keys and total_lag(lag.read()) == 0

        wait_for("both workers caught up", done, 180)
        # the partitions really were shared: each worker took part of each topic
        for w in workers:
            assert 0 < w.metric("leap_events_in", topic=topics["sub"], outcome="valid") < len(subs)
            assert w.metric("leap_events_in", topic=topics["comp"], outcome="valid") > 0
    finally:
        for w in workers:
            assert w.stop(signal.SIGTERM) == 0, w.log_tail()
    ids: list[str] = []
    for w in workers:
        ids += read_dataset(w.tmp / "dataset")["event_id"].tolist()
    assert len(ids) == len(set(ids)) and set(ids) == {c["event_id"] for c in comps}
    unseen = _unapplied(workers[0], comps)
    assert not unseen, f"{len(unseen)} completions never applied, e.g. {unseen[:3]}"
    assert not _dead_letters(kafka_bootstrap, topics["dlq"], expect=0, timeout=3)


def test_a_worker_joining_mid_backlog_loses_nothing(
    kafka_bootstrap: str,
    redis_url: str,
    topic_factory: Any,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    """A rebalance while the first worker is in the middle of a backlog of completions: its
    agent holds events fetched before the rebalance and rows not yet written, Faust seeks the
    partitions it keeps back to their commit and hands the others to the newcomer. Every
    completion still reaches a dataset (one of the two, or both: redone work is written twice
    and read once), every one is applied to the history, no dead letter."""
    # the default grace: completions wait for submissions the newcomer re-ranks
    settings = {**E2E_SETTINGS, "LEAP_ORPHAN_GRACE_S": "60"}
    first, second = _one_group(
        kafka_bootstrap, redis_url, redis_prefix, tmp_path, topic_factory, 4, settings
    )
    topics, group = first.topics, first.group
    sim = simulate(SimConfig(seed=29, days=1, rate=30000))
    subs = submission_events(sim.submissions)
    keys = {(s["job_id"], s["attempt"]) for s in subs}
    comps = completion_events(completions_in_arrival_order(sim.completions))
    feeder = Feeder(kafka_bootstrap)
    feeder.send_events(topics["sub"], subs)
    rankings = RankingsClient(KafkaClients(kafka_bootstrap), topics["rank"])
    lag = LagReader(
        KafkaClients(kafka_bootstrap), worker_groups(group, topics["sub"], topics["comp"])
    )
    first.start("worker-a")
    try:
        _complete_after_a_quarter(first, rankings, feeder, len(subs), comps)

        def applying() -> bool:
            assert first.alive(), first.log_tail()
            return first.metric("leap_events_in", topic=topics["comp"], outcome="valid") > 0

        wait_for("the first worker applying completions", applying, 60, every=0.05)
        second.start("worker-b")

        def caught_up() -> bool:
            for w in (first, second):
                assert w.alive(), w.log_tail()
            rankings.poll(timeout=0.2, max_messages=5000)
            return set(rankings.latest()) == keys and total_lag(lag.read()) == 0

        wait_for("both workers caught up", caught_up, 180)
        taken = second.metric("leap_events_in", topic=topics["comp"], outcome="valid")
    finally:
        codes = [w.stop(signal.SIGTERM) if w.alive() else None for w in (first, second)]
        rankings.close()
    assert codes == [0, 0], (first.log_tail(), second.log_tail())
    assert taken > 0, "the newcomer took no completions: the rebalance moved nothing"
    ids = set(read_dataset(first.tmp / "dataset")["event_id"])
    if (second.tmp / "dataset").exists():
        ids |= set(read_dataset(second.tmp / "dataset")["event_id"])
    if ids != {c["event_id"] for c in comps}:
        raise AssertionError(_lost_rows(first, comps, ids))
    unseen = _unapplied(first, comps)
    assert not unseen, f"{len(unseen)} completions never applied, e.g. {unseen[:3]}"
    assert not _dead_letters(kafka_bootstrap, topics["dlq"], expect=0, timeout=3)
    print(f"\n--- joining mid-backlog: {len(comps)} completions, {taken:.0f} taken by the newcomer")
