"""Pure pieces of the stream package: lag arithmetic, backoff, decode split, metrics names."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from prometheus_client import generate_latest

from leap_stream.contracts import validate_event
from leap_stream.stream.app import faust_broker_url
from leap_stream.stream.batch import Backoff, Record, decode_records
from leap_stream.stream.client import summary_line
from leap_stream.stream.clock import BrokerClock
from leap_stream.stream.completions import _Pending
from leap_stream.stream.deps import dead_letter_key
from leap_stream.stream.lag import compute_lag, total_lag, while_coordinator_moves
from leap_stream.stream.metrics import Metrics
from leap_stream.stream.waiting import WaitingCompletions

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "schemas" / "examples"
NOW = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)


def _example(schema: str, kind: str, name: str) -> bytes:
    return (EXAMPLES / schema / kind / name).read_bytes()


def test_lag_committed_and_uncommitted_partitions() -> None:
    rows = compute_lag(
        {("a", 0): 7, ("a", 1): None, ("b", 0): 2},
        {("a", 0): (0, 10), ("a", 1): (3, 9), ("b", 0): (5, 12)},
    )
    got = {(r.topic, r.partition): r.lag for r in rows}
    # committed: high - committed; never committed: the retained range; committed below the
    # log start (retention deleted the rest): only what is still there counts
    assert got == {("a", 0): 3, ("a", 1): 6, ("b", 0): 7}
    assert [(r.topic, r.partition) for r in rows] == [("a", 0), ("a", 1), ("b", 0)]
    assert total_lag(rows) == 16
    assert rows[1].committed is None


def test_lag_read_retries_while_the_coordinator_moves() -> None:
    from confluent_kafka import KafkaError, KafkaException

    now = [0.0]
    answers: list[Any] = [
        KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)),
        KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)),
        "offsets",
    ]

    def committed() -> Any:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    def sleep(s: float) -> None:
        now[0] += s

    assert while_coordinator_moves(committed, 10, clock=lambda: now[0], sleep=sleep) == "offsets"
    assert now[0] == pytest.approx(0.4)
    # past the timeout, the coordinator's answer is the caller's
    now[0] = 0.0
    answers[:] = [KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))] * 100
    with pytest.raises(KafkaException):
        while_coordinator_moves(committed, 1, every=0.3, clock=lambda: now[0], sleep=sleep)
    assert len(answers) == 96  # tried at 0, 0.3, 0.6 and 0.9 s
    # any other error is not retried
    answers[:] = [KafkaException(KafkaError(KafkaError._TIMED_OUT)), "offsets"]
    with pytest.raises(KafkaException):
        while_coordinator_moves(committed, 10, clock=lambda: now[0], sleep=sleep)


def test_lag_zero_when_caught_up() -> None:
    rows = compute_lag({("a", 0): 10}, {("a", 0): (0, 10)})
    assert total_lag(rows) == 0


def test_backoff_grows_caps_and_resets() -> None:
    t = [100.0]
    b = Backoff(base_s=0.5, cap_s=3.0, clock=lambda: t[0])
    assert b.ready()
    assert [b.failed() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert not b.ready()
    t[0] += 3.0
    assert b.ready()
    b.succeeded()
    assert b.failed() == 0.5


def test_faust_broker_url() -> None:
    assert faust_broker_url("a:9092, b:9093") == "kafka://a:9092;kafka://b:9093"
    assert faust_broker_url("kafka://x:1") == "kafka://x:1"


def test_decode_records_splits_good_and_dead_with_source() -> None:
    good_raw = _example("job-submitted", "valid", "llama-70b-64xh100.json")
    bad_schema = _example("job-submitted", "invalid", "schema-missing-training.json")
    records = [
        Record("subs", 2, 40, b"job-1", good_raw),
        Record("subs", 2, 41, None, b"{not json"),
        Record("subs", 3, 7, b"k", bad_schema),
        Record("subs", 3, 8, None, None),
    ]
    good, dead = decode_records(records, "job-submitted", NOW, max_bytes=1 << 20)
    assert [r.offset for r, _ in good] == [40]
    assert good[0][1]["job_id"] == orjson.loads(good_raw)["job_id"]
    assert [(d["source"]["partition"], d["source"]["offset"]) for d in dead] == [
        (2, 41),
        (3, 7),
        (3, 8),
    ]
    assert [d["error"]["kind"] for d in dead] == ["not_json", "schema", "not_json"]
    for d in dead:
        assert validate_event(d, "dead-letter") is None
    assert dead_letter_key(dead[1]) == b"subs/3/7"


def test_decode_records_too_large_and_unknown_hardware() -> None:
    raw = _example("job-submitted", "valid", "resnet-50-8xa100.json")
    good, dead = decode_records(
        [Record("s", 0, 1, None, raw)], "job-submitted", NOW, max_bytes=len(raw) - 1
    )
    assert not good and dead[0]["error"]["kind"] == "too_large"
    good, dead = decode_records(
        [Record("s", 0, 2, None, raw)],
        "job-submitted",
        NOW,
        max_bytes=1 << 20,
        known_hardware=set(),
    )
    assert not good and dead[0]["error"]["kind"] == "unknown_hardware"


def _design_metric_names() -> list[str]:
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("## Metrics", 1)[1].split("```", 2)[1]
    return [m.group(1) for m in re.finditer(r"^(leap_[a-z0-9_]+)", block, re.M)]


def test_metrics_names_are_exactly_the_design_contract() -> None:
    names = _design_metric_names()
    assert len(names) >= 15
    m = Metrics()
    # touch labelled metrics so they are exported
    m.events_in.labels(topic="t", outcome="valid").inc()
    m.dead_letter.labels(topic="t", kind="schema").inc()
    m.rankings_out.labels(source="model").inc()
    m.fallback.labels(reason="no_model").inc()
    m.batch_seconds.labels(agent="submissions").observe(0.01)
    m.batch_size.labels(agent="submissions").observe(3)
    m.redis_errors.labels(op="read").inc()
    m.consumer_lag.labels(topic="t", partition="0").set(4)
    m.consumer_lag_seconds.labels(topic="t", partition="0").set(1.5)
    m.quarantined.labels(rule="lineage").inc()
    m.observe_online([("h100-sxm", "self", 0.05), ("h100-sxm", "transfer", -0.3)])
    m.redis_evicted_keys.set(0)
    m.catalog_types.set(20)
    m.set_model("v1", 0.0, 10.0)
    exported = {
        (fam.name + "_total" if fam.type == "counter" else fam.name) for fam in m.registry.collect()
    }
    assert exported == set(names)
    text = generate_latest(m.registry).decode()
    for name in names:
        assert re.search(rf"^{name}(_bucket|_sum|_count)?[{{ ]", text, re.M), name


def test_model_info_keeps_one_version_and_age() -> None:
    m = Metrics()
    m.set_model("v1", 100.0, 160.0)
    m.set_model("v2", 150.0, 160.0)
    text = generate_latest(m.registry).decode()
    assert 'leap_model_info{version="v2"} 1.0' in text
    assert 'version="v1"' not in text
    assert "leap_model_age_seconds 10.0" in text


def test_coverage_ratio_accumulates() -> None:
    m = Metrics()
    m.observe_coverage(4, 3)
    m.observe_coverage(6, 6)
    assert m.coverage_ratio._value.get() == pytest.approx(0.9)


def test_pending_keeps_first_row_per_event_id() -> None:
    p = _Pending(WaitingCompletions(capacity=10, grace_s=60.0))
    p.add(["e1"], [{"event_id": "c1", "v": 1}])
    p.add(["e2", "e3"], [{"event_id": "c1", "v": 2}, {"event_id": "c2", "v": 3}])
    assert p.events == ["e1", "e2", "e3"]
    assert [r["v"] for r in p.rows.values()] == [1, 3]
    assert p.since is not None


def test_summary_line_names_best_candidate() -> None:
    r = orjson.loads(next((EXAMPLES / "hardware-ranking" / "valid").glob("*.json")).read_bytes())
    line = summary_line(r)
    assert r["job_id"] in line and f"source={r['source']}" in line
    if r["candidates"]:
        assert f"best={r['candidates'][0]['hardware_type']}" in line


def test_ordered_acks_release_only_contiguous_prefixes() -> None:
    from leap_stream.stream.acks import OrderedAcks

    acked: list[tuple[int, int]] = []
    gate = OrderedAcks(lambda e: e[0], lambda e: e[1], acked.append)
    evs = [(0, o) for o in range(5)] + [(1, o) for o in (7, 8)]
    gate.track(evs)
    assert gate.done([(0, 1), (0, 2), (1, 8)]) == 0  # (0,0) and (1,7) still open
    assert acked == []
    assert gate.done([(0, 0)]) == 3
    assert acked == [(0, 0), (0, 1), (0, 2)]
    assert gate.done([(0, 4)]) == 0  # (0,3) waits, e.g. for its submission
    assert gate.done([(1, 7)]) == 2
    assert acked[-2:] == [(1, 7), (1, 8)]
    assert gate.pending() == [(0, 3), (0, 4)]
    assert gate.forget() == [(0, 3), (0, 4)]
    assert gate.pending() == []
    # forgotten (or never tracked): not acked, it may follow an unfinished forgotten event
    assert gate.done([(0, 4), (2, 0)]) == 0
    assert acked[-1] == (1, 8)
    gate.track([(0, 5)])  # after a rebalance: the partition starts again from its commit
    assert gate.done([(0, 5)]) == 1


def test_a_closed_gate_acks_nothing_more() -> None:
    """At a stop, after the last write: what is still being processed is not acked past what
    was forgotten unfinished (the next worker redoes it)."""
    from leap_stream.stream.acks import OrderedAcks

    acked: list[tuple[int, int]] = []
    gate = OrderedAcks(lambda e: e[0], lambda e: e[1], acked.append)
    gate.track([(0, 0), (0, 1)])
    gate.done([(0, 1)])
    assert gate.close() == [(0, 0), (0, 1)] and gate.closed
    gate.track([(0, 2)])
    assert gate.done([(0, 2)]) == 0 and gate.pending() == [] and acked == []


def test_the_worker_s_faust_consumer_records_only_the_acks_it_gives() -> None:
    """Faust acks an event its stream skips (flow control suspended at a stop or rebalance, an
    earlier consumer generation) without it being processed; with no commit yet on the
    partition its next commit would then skip every earlier event still queued. The worker's
    consumer records no ack but the gate's."""
    import faust
    from faust.types import TP
    from faust.types.tuples import ConsumerMessage

    from leap_stream.stream.app import LeanApp

    app = LeanApp("leap-test-acks", broker="kafka://127.0.0.1:1", autodiscover=False)
    app.topics.acking_topics.add("comps")  # as once the agent has subscribed
    tp = TP("comps", 0)

    def event(offset: int) -> faust.Event:
        message = ConsumerMessage("comps", 0, offset, 0.0, 0, {}, b"k", b"v", None, tp=tp)
        message.incref()  # delivered to one stream, as Faust's conductor does
        return faust.Event(app, b"k", b"v", {}, message)

    recorded = cast(Any, app.consumer)._acked  # Faust's acked offsets per partition
    skipped = event(5)
    skipped.ack()  # what Faust's stream does with an event it skips
    assert recorded.get(tp) is None and not skipped.message.acked
    assert app.explicit_acks.refused == 1
    app.explicit_acks.give(event(3))
    assert recorded[tp] == [3]


def test_batcher_accumulates_while_busy_and_applies_backpressure() -> None:
    import asyncio

    from leap_stream.stream.completions import Batcher

    async def scenario() -> tuple[list[int], list[int], bool]:
        b = Batcher(max_batch=5, max_backlog=8)
        await b.feed([1, 2])
        first = await b.next_batch()  # what is there, not waiting for a full batch
        await b.feed([3, 4, 5])
        await b.feed([6, 7, 8, 9])  # arrives while "processing": accumulates
        second = await b.next_batch()
        assert second == [3, 4, 5, 6, 7]  # capped at max_batch
        # 2 left; feeding 7 more reaches the backlog bound: feed waits for the consumer
        feeder = asyncio.ensure_future(b.feed(list(range(10, 17))))
        await asyncio.sleep(0.01)
        blocked = not feeder.done()
        await b.next_batch()
        await asyncio.wait_for(feeder, 1.0)
        return first, second, blocked

    first, second, blocked = asyncio.run(scenario())
    assert len(second) == 5
    assert first == [1, 2]
    assert blocked


def test_faust_credentials_follow_the_kafka_settings() -> None:
    import ssl

    import faust

    from leap_stream.settings import Settings
    from leap_stream.stream.app import faust_credentials

    assert faust_credentials(Settings.from_env({})) is None
    sasl = {
        "LEAP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LEAP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "LEAP_KAFKA_SASL_USERNAME": "leap",
        "LEAP_KAFKA_SASL_PASSWORD": "s3cret",
    }
    cred = faust_credentials(Settings.from_env(sasl))
    assert isinstance(cred, faust.SASLCredentials)
    assert (cred.username, cred.password) == ("leap", "s3cret")
    assert cred.mechanism.value == "SCRAM-SHA-512" and cred.ssl_context is None
    cred = faust_credentials(
        Settings.from_env({**sasl, "LEAP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    )
    assert isinstance(cred.ssl_context, ssl.SSLContext)
    assert cred.protocol.value == "SASL_SSL"
    ssl_only = Settings.from_env({"LEAP_KAFKA_SECURITY_PROTOCOL": "SSL"})
    assert isinstance(faust_credentials(ssl_only), faust.SSLCredentials)


def test_consumer_fetch_settings_reach_the_aiokafka_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from faust.transport.drivers import aiokafka as driver

    from leap_stream.stream.app import tune_consumer

    cls = driver.AIOKafkaConsumerThread
    made = SimpleNamespace(
        _fetch_min_bytes=1, _fetch_max_wait_ms=1500, _isolation_level="read_uncommitted"
    )

    def original(self: object, transport: object) -> SimpleNamespace:
        return made

    monkeypatch.setattr(cls, "_create_worker_consumer", original)
    monkeypatch.delattr(cls, "_leap_original_create", raising=False)
    tune_consumer(4096, 9)
    tune_consumer(65536, 5)  # a second app in the same process: wraps the original once
    assert cls._leap_original_create is original  # type: ignore[attr-defined]
    consumer = cls._create_worker_consumer(object(), object())  # type: ignore[arg-type]
    assert consumer is made
    assert (made._fetch_min_bytes, made._fetch_max_wait_ms) == (65536, 5)
    assert made._isolation_level == "read_committed"  # aborted transactions stay unseen


def test_after_a_rebalance_a_partition_without_a_commit_is_sought_to_its_start() -> None:
    """aiokafka's seek to the committed offsets moves only partitions with a commit above 0;
    the records Faust dropped right after the assignment would never come again on the others
    (lost: the new generation commits past them). The worker's consumer seeks those to their
    earliest offsets, and leaves a partition with a commit to aiokafka's own seek."""
    import asyncio
    from types import SimpleNamespace

    from faust.types import TP

    from leap_stream.stream.acks import seek_every_partition
    from leap_stream.stream.app import LeanApp

    never, at_zero, committed_tp = TP("c", 0), TP("c", 1), TP("c", 2)
    seeks: list[tuple[TP, int]] = []

    async def seek_to_committed() -> dict[TP, int | None]:
        return {never: None, at_zero: 0, committed_tp: 7}

    async def earliest_offsets(*tps: TP) -> dict[TP, int]:
        return {tp: 3 for tp in tps}

    async def seek(tp: TP, offset: int) -> None:
        seeks.append((tp, offset))

    consumer = seek_every_partition(
        SimpleNamespace(
            seek_to_committed=seek_to_committed, earliest_offsets=earliest_offsets, seek=seek
        )
    )
    committed = asyncio.run(consumer.seek_to_committed())
    assert committed == {never: None, at_zero: 0, committed_tp: 7}  # Faust's read offsets
    assert seeks == [(never, 3), (at_zero, 3)]

    app = LeanApp("leap-test-seek", broker="kafka://127.0.0.1:1", autodiscover=False)
    assert cast(Any, app.consumer).seek_to_committed.__name__ == "seek_from_commit_or_start"


def test_lean_app_has_no_faust_monitor_sensor() -> None:
    from leap_stream.stream.app import LeanApp

    app = LeanApp("leap-test-lean", broker="kafka://127.0.0.1:1", autodiscover=False)
    app.on_init_dependencies()
    assert app.monitor not in set(app.sensors)


def test_worker_groups_name_the_group_that_commits_each_input() -> None:
    from leap_stream.stream.lag import worker_groups

    assert worker_groups("g", "subs", "comps") == {"subs": "g.submissions", "comps": "g"}


def test_held_acks_wait_for_redis_in_offset_order() -> None:
    """The submissions loop's acks: a batch not in Redis holds its acks
    (and every later one of the partition, in order) until Redis takes it; past max_held the
    oldest go anyway; forget drops everything unacked."""
    from leap_stream.stream.acks import HeldAcks, OrderedAcks

    acked: list[tuple[str, int]] = []
    acks = HeldAcks(OrderedAcks(lambda e: e[0], lambda e: e[1], acked.append), max_held=3)
    b1, b2, b3 = [("p", 0), ("p", 1)], [("p", 2)], [("p", 3), ("p", 4)]
    for b in (b1, b2, b3):
        acks.gate.track(b)
    acks.batch_done(b1, remembered=False, flushed_pending=False)
    assert acked == [] and acks.held == b1
    acks.batch_done(b2, remembered=True, flushed_pending=False)
    assert acked == []  # done, but behind the held batch
    acks.batch_done(b3, remembered=False, flushed_pending=False)
    assert acked == [("p", 0)]  # four held, max_held 3: the oldest one goes
    assert acks.held == [("p", 1), *b3]
    acks.release()  # flush_pending succeeded
    assert acked == [("p", 0), ("p", 1), ("p", 2), ("p", 3), ("p", 4)] and acks.held == []

    b4, b5 = [("p", 5)], [("p", 6)]
    acks.gate.track(b4 + b5)
    acks.batch_done(b4, remembered=False, flushed_pending=False)
    acks.batch_done(b5, remembered=True, flushed_pending=True)  # b4 written with b5's batch
    assert acked[-2:] == [("p", 5), ("p", 6)] and acks.held == []

    acks.gate.track([("p", 7)])
    acks.batch_done([("p", 7)], remembered=False, flushed_pending=False)
    assert acks.forget() == [("p", 7)] and acks.held == []
    assert acked[-1] == ("p", 6)


def test_a_submission_batch_counts_its_rankings_by_source_and_fallback() -> None:
    from types import SimpleNamespace

    from leap_stream.stream.app import observe_submissions
    from leap_stream.stream.batch import SubmissionBatchResult

    m = Metrics()
    clock = BrokerClock()
    clock.observe(1000.0, [Record("subs", 0, 0, None, b"{}", 1007.5, True)])  # 7.5 s behind
    cfg = SimpleNamespace(topic_submissions="subs")
    deps: Any = SimpleNamespace(metrics=m, cfg=cfg, stats={}, clock=clock)
    kinds = [("model", "ok")] * 3 + [("lookup", "no_model")] * 2 + [("none", "no_candidate_fits")]
    # the last submission is 29 days old (inside the 30-day window): counted, but it adds at
    # most the top bucket (60 s) to the sum, not 2.5 million seconds
    latencies = [5.0 * (i + 1) for i in range(5)] + [29 * 86_400_000.0]
    res = SubmissionBatchResult(
        rankings=[
            cast(Any, {"source": s, "reason": r, "latency_ms": ms})
            for (s, r), ms in zip(kinds, latencies, strict=True)
        ],
        valid=6,
    )
    observe_submissions(deps, [cast(Any, None)] * 7, res, 0.01)

    def value(name: str, **labels: str) -> float:
        got = m.registry.get_sample_value(name, labels)
        return 0.0 if got is None else got

    assert value("leap_rankings_out_total", source="model") == 3
    assert value("leap_rankings_out_total", source="lookup") == 2
    assert value("leap_rankings_out_total", source="none") == 1
    assert value("leap_fallback_total", reason="no_model") == 2
    assert value("leap_fallback_total", reason="no_candidate_fits") == 1
    assert value("leap_fallback_total", reason="ok") == 0
    assert value("leap_coverage_ratio") == 5 / 6
    assert value("leap_ranking_latency_seconds_count") == 6
    assert value("leap_ranking_latency_seconds_sum") == pytest.approx(0.075 + 60.0)
    assert value("leap_ranking_latency_seconds_bucket", le="60.0") == 5
    assert value("leap_events_in_total", topic="subs", outcome="invalid") == 1
    assert value("leap_clock_skew_seconds") == -7.5  # the worker's clock against the records'
    assert deps.stats == {"submissions_in": 7, "rankings_out": 6}


def test_a_new_consumer_generation_starts_the_completions_gate_over() -> None:
    """After a rebalance Faust redelivers from the commit: the first batch of the new
    generation forgets what the gate tracked (even when the flusher never saw the rebalance),
    and events still held from the old generation are not processed."""
    from types import SimpleNamespace

    from leap_stream.stream.acks import ExplicitAcks
    from leap_stream.stream.completions import CompletionsAgent

    app = SimpleNamespace(consumer_generation_id=1, explicit_acks=ExplicitAcks())
    cfg = SimpleNamespace(max_waiting_completions=10, orphan_grace_s=60.0)
    agent = CompletionsAgent(app, SimpleNamespace(retry_cap_s=1.0, cfg=cfg), out=None)  # type: ignore[arg-type]

    def event(offset: int, generation: int) -> Any:
        message = SimpleNamespace(tp=("comps", 0), offset=offset, generation_id=generation)
        return SimpleNamespace(message=message)

    old = [event(o, 1) for o in range(4)]
    assert agent._current(old) == old
    agent.gate.track(old)
    agent.gate.done(old[1:])  # old[0] waits, e.g. for its submission
    agent.pending.waiting.add([(old[0], Record("comps", 0, 0, None, b"{}"), {})], 0.0)
    app.consumer_generation_id = 2
    fresh = [event(0, 2)]
    assert agent._current([event(4, 1), *fresh]) == fresh
    assert agent.gate.pending() == [] and len(agent.pending.waiting) == 0
