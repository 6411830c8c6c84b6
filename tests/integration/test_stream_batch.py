"""The agents' batch logic against a real Redis; output producer, rankings client and lag
against a real broker."""

from __future__ import annotations

import math
import socket
import time
from datetime import UTC, datetime
from functools import cache
from typing import Any

import orjson
import pytest

from leap_stream.catalog import load_catalog
from leap_stream.contracts import validate_event
from leap_stream.core.history import HistoryBook
from leap_stream.core.lookup import LookupTable
from leap_stream.core.ranker import Ranker
from leap_stream.store.connection import connect
from leap_stream.store.online import OnlineStore, OnlineStoreUnavailable
from leap_stream.stream.batch import Record, SubmissionProcessor
from leap_stream.stream.client import RankingsClient
from leap_stream.stream.completion_batch import CompletionProcessor
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.lag import LagReader, total_lag
from leap_stream.stream.output import DeliveryError, OutputProducer
from leap_stream.tools.sim.config import SimConfig, SimResult
from leap_stream.tools.sim.events import (
    completion_events,
    completions_in_arrival_order,
    submission_events,
)
from leap_stream.tools.sim.fleet import simulate

pytestmark = pytest.mark.services

NOW = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)
MAX = 1 << 20


@cache
def _sim() -> SimResult:
    return simulate(SimConfig(seed=11, days=1, rate=300))


@cache
def _ranker() -> Ranker:
    catalog = load_catalog()
    return Ranker(catalog, model=None, lookup=LookupTable.fit(_sim().dataset))


def _records(topic: str, events: list[dict[str, Any]], start: int = 0) -> list[Record]:
    return [
        Record(topic, 0, start + i, str(e["job_id"]).encode(), orjson.dumps(e))
        for i, e in enumerate(events)
    ]


def _processors(store: OnlineStore) -> tuple[SubmissionProcessor, CompletionProcessor]:
    known = set(load_catalog().types)
    return (
        SubmissionProcessor(store, _ranker, max_bytes=MAX, known_hardware=known),
        CompletionProcessor(store, max_bytes=MAX, known_hardware=known),
    )


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_submissions_then_completions_round_trip(
    redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    sim = _sim()
    subs = submission_events(sim.submissions)
    comps = completion_events(completions_in_arrival_order(sim.completions))
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sp, cp = _processors(store)

    bad = [
        Record("subs", 1, 0, None, b"\xff\xfe"),
        Record("subs", 1, 1, None, b'{"schema_version": 1}'),
    ]
    res = sp.process(_records("subs", subs) + bad, NOW)
    assert res.history_available and res.redis_error is None
    assert res.valid == len(subs) == len(res.rankings)
    assert [r["job_id"] for r in res.rankings] == [s["job_id"] for s in subs]
    for r in res.rankings[:50]:
        assert validate_event(r, "hardware-ranking") is None
    assert {r["source"] for r in res.rankings} <= {"model", "lookup", "none"}
    assert any(r["source"] == "lookup" for r in res.rankings)
    assert not any(r.get("history_used") for r in res.rankings)  # nothing measured yet
    assert sorted(d["error"]["kind"] for d in res.dead_letters) == ["not_utf8", "schema"]
    # every submission is remembered for the completion join
    got = store.fetch_submissions([(s["job_id"], s["attempt"]) for s in subs])
    assert all(g is not None for g in got)

    orphan = dict(comps[0], event_id="cmp-orphan-1", job_id="job-never-submitted")
    # another lineage than its submission's: it would write that lineage's history
    stray = dict(comps[1], event_id="cmp-stray-1", lineage_id="lin-someone-else")
    # a known type the job never listed as a candidate
    listed = {s["job_id"]: s["candidate_hardware"] for s in subs}[comps[2]["job_id"]]
    elsewhere = next(t for t in load_catalog().types if t not in listed)
    offlist = dict(comps[2], event_id="cmp-offlist-1", hardware_type=elsewhere)
    dup = comps[3]
    cres = cp.process(_records("comps", [stray, offlist, *comps, dup, orphan]), NOW)
    assert cres.valid == len(comps) + 4
    assert cres.new == len(comps)  # the orphan, the stray and the off-list change nothing
    assert cres.duplicates == 1
    assert cres.orphans == 1 and cres.mismatches == 2
    kinds = [d["error"]["kind"] for d in cres.dead_letters]
    assert kinds == ["completion_mismatch", "completion_mismatch", "orphan_completion"]
    assert "lin-someone-else" in cres.dead_letters[0]["error"]["message"]
    assert "not one of its candidates" in cres.dead_letters[1]["error"]["message"]
    assert cres.dead_letters[0]["source"]["offset"] == 0
    assert cres.dead_letters[2]["source"]["offset"] == len(comps) + 3
    assert "history not updated" in cres.dead_letters[1]["error"]["message"]
    # one row per completion with a known submission; the duplicate's row is the same event
    assert len({r["event_id"] for r in cres.rows}) == len(comps)
    flagged = {r["event_id"]: r["quarantine"] for r in cres.rows}
    assert sum(v is not None for v in flagged.values()) == sum(cres.quarantined.values())
    assert store.read_batch(["lin-someone-else"], [])[0] == [{}]

    # Redis history == HistoryBook replay of the same completions in the same order
    book = HistoryBook()
    for c in comps:
        book.apply_completion(c)
    lineages = book.lineage_ids
    types = book.model_types
    hist, aggs = store.read_batch(lineages, types)
    assert hist == [book.lineage(x) for x in lineages]
    assert aggs == {t: book.aggregates(t) for t in types}

    # a resubmission of a measured lineage now ranks with its history
    measured = [s for s in subs if book.lineage(s["lineage_id"])][:20]
    again = [dict(s, event_id=s["event_id"] + "-r", attempt=s["attempt"] + 1) for s in measured]
    res2 = sp.process(_records("subs", again, start=10_000), NOW)
    assert len(res2.rankings) == len(again)
    assert all(r["history_used"] for r in res2.rankings)


def test_redis_down_ranks_without_history_and_catches_up(
    redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    subs = submission_events(_sim().submissions)[:40]
    down = OnlineStore(connect(f"redis://127.0.0.1:{_closed_port()}/0"), prefix=redis_prefix)
    sp, cp = _processors(down)
    t0 = time.monotonic()
    res = sp.process(_records("subs", subs[:20]), NOW)
    assert time.monotonic() - t0 < 5.0  # a dead Redis fails fast
    assert not res.history_available and res.redis_error
    assert not res.remembered and not res.flushed_pending
    assert len(res.rankings) == 20 and not res.dead_letters
    assert all(r["history_used"] is False for r in res.rankings)
    assert len(sp.pending_remember) == 20
    # within the backoff window the store is not even tried
    res = sp.process(_records("subs", subs[20:30], start=20), NOW)
    assert res.redis_error == "backoff" and len(res.rankings) == 10 and not res.remembered
    assert len(sp.pending_remember) == 30
    # the completion path cannot skip Redis: it raises so the agent retries the batch
    comps = completion_events(completions_in_arrival_order(_sim().completions))[:5]
    with pytest.raises(OnlineStoreUnavailable):
        cp.process(_records("comps", comps), NOW)

    # Redis is back: the submissions ranked meanwhile are remembered with the next batch
    up = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sp.store = up
    sp.backoff.succeeded()
    res = sp.process(_records("subs", subs[30:40], start=30), NOW)
    assert res.history_available and res.remembered and res.flushed_pending
    assert sp.pending_remember == []
    got = up.fetch_submissions([(s["job_id"], s["attempt"]) for s in subs])
    assert all(g is not None for g in got)


def test_ranker_failure_dead_letters_only_the_poison_event(
    redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    subs = submission_events(_sim().submissions)[:6]
    poison_job = subs[2]["job_id"]

    class Fragile:
        """A ranker with a bug on one job (a real Ranker otherwise)."""

        known_types = _ranker().known_types

        def rank_batch(self, submissions: list[Any], *a: Any) -> list[dict[str, Any]]:
            if any(s["job_id"] == poison_job for s in submissions):
                raise ValueError("boom")
            return _ranker().rank_batch(submissions, *a)

    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sp = SubmissionProcessor(store, Fragile, max_bytes=MAX)
    res = sp.process(_records("subs", subs), NOW)
    assert [r["job_id"] for r in res.rankings] == [
        s["job_id"] for s in subs if s["job_id"] != poison_job
    ]
    assert [d["error"]["kind"] for d in res.dead_letters] == ["internal"]
    assert res.dead_letters[0]["source"]["offset"] == 2
    assert res.valid == 5


def test_output_producer_and_rankings_client_latest_wins(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    topic = topic_factory("rankings", partitions=3)
    out = OutputProducer(KafkaClients(kafka_bootstrap))
    base = orjson.loads(
        (
            __import__("pathlib").Path(__file__).resolve().parents[2]
            / "schemas/examples/hardware-ranking/valid"
        )
        .glob("*.json")
        .__next__()
        .read_bytes()
    )
    n = 60
    for version in ("old", "new"):
        for i in range(n):
            r = dict(base, job_id=f"job-{i}", attempt=1 + (i % 2), model_version=version)
            out.send(topic, r["job_id"].encode(), orjson.dumps(r))
    assert out.flush(30) == 2 * n
    with RankingsClient(KafkaClients(kafka_bootstrap), topic) as client:
        client.drain(idle_s=2.0, max_s=60)
        latest = client.latest()
        assert client.received == 2 * n
        assert len(latest) == n
        assert {r["model_version"] for r in latest.values()} == {"new"}
        assert client.get("job-3", 2) is not None


def test_lag_reader_counts_uncommitted_and_committed(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = topic_factory("lag", partitions=2)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(10):
        p.produce(topic, value=b"x", partition=i % 2)
    assert p.flush(30) == 0
    group = f"lag-test-{time.time_ns()}"
    reader = LagReader(KafkaClients(kafka_bootstrap), group, [topic])
    rows = reader.read()
    assert [(r.partition, r.lag, r.committed) for r in rows] == [(0, 5, None), (1, 5, None)]

    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 5)], asynchronous=False)
    c.close()
    rows = reader.read()
    assert [(r.partition, r.lag, r.committed) for r in rows] == [(0, 2, 3), (1, 0, 5)]
    assert total_lag(rows) == 2


def test_completion_before_its_submission_waits_for_the_join(
    redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    sim = _sim()
    subs = submission_events(sim.submissions)[:10]
    keys = {(s["job_id"], s["attempt"]) for s in subs}
    comps = [
        c
        for c in completion_events(completions_in_arrival_order(sim.completions))
        if (c["job_id"], c["attempt"]) in keys
    ]
    assert comps
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sp, cp = _processors(store)
    stranger = dict(comps[0], event_id="cmp-stranger", job_id="job-stranger")
    records = _records("comps", [*comps, stranger])
    res = cp.process(records, NOW, wait_for_join=True)
    # nothing is applied before the submission is known; the completions wait
    assert res.new == 0 and not res.rows and not res.dead_letters
    assert [i for i, _c in res.waiting] == list(range(len(comps) + 1))
    items = [(records[i], c) for i, c in res.waiting]
    lineages = sorted({c["lineage_id"] for c in comps})
    assert store.read_batch(lineages, [])[0] == [{}] * len(lineages)

    waited = cp.join_waiting(items, [False] * len(items), NOW)
    assert [k for k, _v in waited.joined] == ["wait"] * len(items)
    sp.process(_records("subs", subs), NOW)  # the submissions agent catches up
    res = cp.join_waiting(items, [False] * (len(items) - 1) + [True], NOW)
    outcome = res.joined
    assert [k for k, _v in outcome] == ["row"] * len(comps) + ["dead"]
    assert {v["event_id"] for k, v in outcome if k == "row" and v} == {c["event_id"] for c in comps}
    assert res.new == len(comps) and res.orphans == 1  # applied now, once
    book = HistoryBook()
    for c in comps:
        book.apply_completion(c)
    assert store.read_batch(lineages, [])[0] == [book.lineage(x) for x in lineages]
    dead = outcome[-1][1]
    assert dead is not None and dead["error"]["kind"] == "orphan_completion"
    assert dead["source"]["offset"] == len(comps)


def test_output_producer_failed_flush_replaces_the_producer(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    """A failed flush raises (nothing may be acked), discards the producer with what it held,
    and the redo goes through a fresh one: each record of the redo lands, none of the failure's."""
    from confluent_kafka import Consumer

    topic = topic_factory("output-reset", partitions=2)
    resets: list[int] = []
    out = OutputProducer(
        KafkaClients(kafka_bootstrap), timeout_s=2.0, on_reset=lambda: resets.append(1)
    )
    first = out._producer
    # auto-create is off: the records wait for a topic that never appears and time out
    out.send(f"test.missing.{time.time_ns()}", b"k", b"lost")
    with pytest.raises(DeliveryError):
        out.flush()
    assert out.resets == 1 and resets == [1]
    assert out._producer is not first
    for i in range(20):
        out.send(topic, f"job-{i}".encode(), b"redo-%d" % i)
    assert out.flush() == 20
    assert out.resets == 1
    c = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"reset-{time.time_ns()}",
            "auto.offset.reset": "earliest",
        }
    )
    c.subscribe([topic])
    got: list[bytes] = []
    end = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < end:
        got += [m.value() or b"" for m in c.consume(100, timeout=0.5) if m.error() is None]
    c.close()
    assert sorted(got) == sorted(b"redo-%d" % i for i in range(20))
    out.close(5)


def test_output_producer_unreachable_broker_fails_within_timeout() -> None:
    """No broker at all: the flush gives up (delivery.timeout.ms) and replaces the producer."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = OutputProducer(KafkaClients(f"127.0.0.1:{port}"), timeout_s=1.5)
    out.send("t", None, b"x")
    with pytest.raises(DeliveryError):
        out.flush()
    assert out.resets == 1
    out.send("t", None, b"never delivered")
    out.close(0.5)  # drops it: its input was never acked
    out.close(0.5)  # twice is harmless
    # closed means closed: librdkafka's threads do not live on, reconnecting, with the object
    with pytest.raises(RuntimeError, match="closed"):
        out.send("t", None, b"after the close")


def test_online_accuracy_compares_the_ranking_with_the_measurement(
    redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    """What the model predicted on the hardware a job ran on, against what it measured: the
    predictions ride with the next Redis round trip (or the idle flush) and come back with the
    completion's submission."""
    from leap_stream.train.trainer import fit, training_rows

    sim = _sim()
    catalog = load_catalog()
    ranker = Ranker(
        catalog,
        model=fit(training_rows(sim.dataset), num_rounds=20),
        lookup=LookupTable.fit(sim.dataset),
    )
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    known = set(catalog.types)
    sp = SubmissionProcessor(store, lambda: ranker, max_bytes=MAX, known_hardware=known)
    cp = CompletionProcessor(store, max_bytes=MAX, known_hardware=known)
    subs = submission_events(sim.submissions)[:80]
    res = sp.process(_records("subs", subs), NOW)
    by_job = {(r["job_id"], r["attempt"]): r for r in res.rankings if r["source"] == "model"}
    assert by_job and len(sp.pending_predictions) == len(by_job)
    sp.flush_predictions()  # no next batch: the idle flush writes them
    assert not sp.pending_predictions
    keys = {(s["job_id"], s["attempt"]) for s in subs}
    comps = [
        c
        for c in completion_events(completions_in_arrival_order(sim.completions))
        if (c["job_id"], c["attempt"]) in keys
    ]
    cres = cp.process(_records("comps", comps), NOW)
    want = []
    for c in comps:
        r = by_job.get((c["job_id"], c["attempt"]))
        sps = (c.get("throughput") or {}).get("samples_per_s")
        ran = [
            x
            for x in (r or {"candidates": []})["candidates"]
            if x["hardware_type"] == c["hardware_type"]
        ]
        if ran and sps:
            per_device = ran[0]["predicted_throughput"] / ran[0]["num_devices"]
            want.append(per_device / (sps / c["num_devices"]) - 1.0)
    assert want, "no completion of a model-ranked job measured"
    assert sorted(e for _h, _a, e in cres.online) == pytest.approx(sorted(want))
    assert {a for _h, a, _e in cres.online} <= {"self", "transfer", "model"}


def test_the_physics_reference_is_the_same_in_the_script_and_the_replay(
    redis_url: str, redis_prefix: str, redis_client: Any
) -> None:
    """A first-ever measurement of a (model type, type) pair has no lineage value and no
    aggregate to be judged by: only the physics can say that x10 000 is impossible. Two
    impossible values of one lineage do not corroborate each other."""
    import pandas as pd

    from leap_stream.core.features import SpecArrays, log_rate_ceiling
    from leap_stream.core.rows import submission_fields

    sim = _sim()
    catalog = load_catalog()
    specs = SpecArrays.of(catalog.spec_matrix())
    store = OnlineStore(connect(redis_url), prefix=redis_prefix)
    sp = SubmissionProcessor(store, _ranker, max_bytes=MAX, known_hardware=set(catalog.types))
    cp = CompletionProcessor(store, max_bytes=MAX, specs=lambda: specs)
    subs = submission_events(sim.submissions)[:60]
    sp.process(_records("subs", subs), NOW)
    keys = {(s["job_id"], s["attempt"]): submission_fields(s) for s in subs}
    comps = [
        c
        for c in completion_events(completions_in_arrival_order(sim.completions))
        if (c["job_id"], c["attempt"]) in keys and (c.get("throughput") or {}).get("samples_per_s")
    ]

    def x1e4(c: dict[str, Any]) -> dict[str, Any]:
        return dict(c, throughput={"samples_per_s": c["throughput"]["samples_per_s"] * 1e4})

    def ceiling_of(c: dict[str, Any]) -> float:
        flat = keys[(c["job_id"], c["attempt"])]
        return float(log_rate_ceiling(pd.DataFrame([flat]), [c["hardware_type"]], specs)[0])

    def past_physics(c: dict[str, Any], times: float) -> dict[str, Any]:
        """`times` the physics ceiling (the guard's limit is x100)."""
        sps = math.exp(ceiling_of(c)) * c["num_devices"] * times
        return dict(c, throughput={"samples_per_s": sps})

    # a lineage with three completions on one type: an honest one, then two at x1000 and
    # x1200 the ceiling, which agree with each other (within x3) and used to corroborate
    by_pair: dict[tuple[str, str, int], list[int]] = {}
    for i, c in enumerate(comps[1:], start=1):
        by_pair.setdefault((c["lineage_id"], c["hardware_type"], c["num_devices"]), []).append(i)
    pair = next(ix for ix in by_pair.values() if len(ix) >= 3)
    comps = [x1e4(comps[0]), *comps[1:]]
    comps[pair[1]] = past_physics(comps[pair[1]], 1000.0)
    comps[pair[2]] = past_physics(comps[pair[2]], 1200.0)
    poisoned = [comps[0]["event_id"], comps[pair[1]]["event_id"], comps[pair[2]]["event_id"]]
    cres = cp.process(_records("comps", comps), NOW)
    flags = {r["event_id"]: r["quarantine"] for r in cres.rows}
    assert flags[poisoned[0]] == "physics"
    assert flags[poisoned[1]] is not None and flags[poisoned[2]] is not None
    assert sum(cres.quarantined.values()) == 3
    book = HistoryBook()
    for c in comps:
        flat = keys[(c["job_id"], c["attempt"])]
        book.apply_completion(c, flat["num_devices"], ceiling_of(c))
    lineages = book.lineage_ids
    hist, aggs = store.read_batch(lineages, book.model_types)
    assert hist == [book.lineage(x) for x in lineages]
    assert aggs == {t: book.aggregates(t) for t in book.model_types}
