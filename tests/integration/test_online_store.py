"""The Redis online store against a real redis-server and a real three-master Redis Cluster
(every test taking `store` runs on both): same state as the pure HistoryBook."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator

import pytest

from leap_stream.contracts.timestamps import epoch_s, format_ts
from leap_stream.core.history import QUARANTINE_RULES, HistoryBook, is_measurement
from leap_stream.core.rows import submission_fields
from leap_stream.store.connection import connect
from leap_stream.store.offline import flatten
from leap_stream.store.online import APPLY_LUA, READ_LUA, OnlineStore, OnlineStoreUnavailable
from leap_stream.tools import synthetic_events as synthetic

pytestmark = pytest.mark.services


@pytest.fixture(params=["single", "cluster"])
def store(request: pytest.FixtureRequest, redis_prefix: str) -> Iterator[OnlineStore]:
    """The store on one Redis (untagged keys) or on a cluster (keys tagged by model type)."""
    if request.param == "cluster":
        client = connect(request.getfixturevalue("redis_cluster_url"), timeout_s=10, cluster=True)
    else:
        client = connect(request.getfixturevalue("redis_url"), timeout_s=10)
    yield OnlineStore(client, redis_prefix, dedup_ttl_s=3600, submission_ttl_s=7200)
    keys = list(client.scan_iter(match=f"{redis_prefix}*", count=1000))
    for key in keys:
        client.delete(key)
    client.close()


def _types(lineage_ids: list[str]) -> list[str]:
    """The model type of each synthetic lineage (`synthetic.pairs`: ``lin-N`` has model type
    N mod their count; the hand-made lineages below are built from ``lin-000000``)."""
    n = len(synthetic.MODEL_TYPES)
    return [synthetic.MODEL_TYPES[int(x[4:]) % n if x[4:].isdigit() else 0] for x in lineage_ids]


def _read(store: OnlineStore, ids: list[str], types: list[str]) -> tuple[list, dict]:
    return store.read_batch(ids, types, _types(ids))


def _replay(completions: list[dict]) -> HistoryBook:
    book = HistoryBook()
    seen: set[str] = set()
    for c in completions:
        if c["event_id"] in seen:
            continue
        seen.add(c["event_id"])
        book.apply_completion(c)
    return book


def test_shuffled_duplicated_completions_match_history_book(store: OnlineStore) -> None:
    completions = [c for _s, c in synthetic.pairs(600, seed=3, lineages=40)]
    rng = random.Random(7)
    arrivals = completions + rng.sample(completions, 200)  # redeliveries
    rng.shuffle(arrivals)

    results = []
    for i in range(0, len(arrivals), 137):  # several batches, duplicates across and within
        results += store.apply_completions(arrivals[i : i + 137])

    book = _replay(arrivals)
    assert sum(r.new for r in results) == len(completions)
    assert sum(not r.new for r in results) == 200
    first_seen: dict[str, int] = {}
    for i, c in enumerate(arrivals):
        first_seen.setdefault(c["event_id"], i)
    for i, (c, r) in enumerate(zip(arrivals, results, strict=True)):
        assert r.event_id == c["event_id"]
        assert r.new == (first_seen[c["event_id"]] == i)

    lineage_ids = sorted({c["lineage_id"] for c in completions})
    histories, aggregates = _read(store, lineage_ids, synthetic.MODEL_TYPES)
    for lid, got in zip(lineage_ids, histories, strict=True):
        assert got == book.lineage(lid)  # newest-wins and counts: exact
    for mt in synthetic.MODEL_TYPES:
        want = book.aggregates(mt)
        assert set(aggregates[mt]) == set(want)
        for hw, agg in aggregates[mt].items():
            assert agg.count == want[hw].count
            assert agg.last_at == want[hw].last_at
            assert math.isclose(
                agg.ewma_log_per_device, want[hw].ewma_log_per_device, rel_tol=1e-12
            )
        # log() is taken in Python and the EWMA is plain IEEE arithmetic both sides: bit-exact.
        assert aggregates[mt] == want


def test_reads_match_the_history_and_remember_submissions(
    store: OnlineStore,
) -> None:
    completions = [c for _s, c in synthetic.pairs(300, seed=5, lineages=50)]
    store.apply_completions(completions)
    book = _replay(completions)
    ids = [f"lin-{i:06d}" for i in range(60)]  # some never seen
    by_lua = _read(store, ids, synthetic.MODEL_TYPES)
    assert by_lua[0] == [book.lineage(x) for x in ids]
    assert sum(len(h) for h in by_lua[0]) > 50
    histories, aggs = _read(store, ids, ["no-such-type"])
    assert histories[-1] == {} and aggs == {"no-such-type": {}}

    subs = [s for s, _c in synthetic.pairs(30, seed=6, lineages=50)]
    for sub in subs:
        store.r.delete(_sub_key(store, sub))
    got = store.read_and_remember(subs)
    assert got[0] == _read(store, [s["lineage_id"] for s in subs], [])[0]
    types = [s["model"]["model_type"] for s in subs]
    assert store.fetch_submissions([(s["job_id"], s["attempt"]) for s in subs], types) == [
        submission_fields(s) for s in subs
    ]
    assert store.r.ttl(_sub_key(store, subs[0])) > 7000


def test_unmeasured_completions_are_marked_but_change_nothing(store: OnlineStore) -> None:
    (_s, c), *_ = synthetic.pairs(1, seed=1)
    c = dict(c, status="failed")
    c.pop("throughput", None)
    [r] = store.apply_completions([c])
    assert r.new and not r.measured
    histories, aggs = _read(store, [c["lineage_id"]], [c["model_type"]])
    assert histories == [{}] and aggs == {c["model_type"]: {}}
    [again] = store.apply_completions([c])
    assert not again.new


def _sub_key(store: OnlineStore, sub: dict) -> str:
    return store.keys.sub(sub["job_id"], sub["attempt"], sub["model"]["model_type"])


def test_ttls_and_submission_join(store: OnlineStore) -> None:
    pairs = synthetic.pairs(20, seed=9)
    subs = [s for s, _c in pairs]
    comps = [c for _s, c in pairs]
    histories, _ = store.read_and_remember(subs)
    assert len(histories) == 20
    assert 7000 < store.r.ttl(_sub_key(store, subs[0])) <= 7200

    results, joined = store.apply_and_fetch(comps)
    assert all(r.new for r in results)
    seen = store.keys.seen(comps[0]["event_id"], comps[0]["model_type"])
    assert 3500 < store.r.ttl(seen) <= 3600
    for sub, comp, got in zip(subs, comps, joined, strict=True):
        assert got == submission_fields(sub)
        assert flatten(got, comp) == flatten(sub, comp)

    mt = subs[1]["model"]["model_type"]
    assert store.fetch_submissions(
        [("no-such-job", 1), (subs[1]["job_id"], subs[1]["attempt"])], [mt, mt]
    ) == [None, submission_fields(subs[1])]


def test_script_loaded_on_noscript(store: OnlineStore, redis_prefix: str) -> None:
    comps = [c for _s, c in synthetic.pairs(10, seed=11)]
    store.apply_completions(comps[:5])
    # A script text Redis has never seen (as after a restart or SCRIPT FLUSH, which we must not
    # do to a shared Redis): EVALSHA gets NOSCRIPT, the store loads it and reruns the batch.
    tag = f"\n-- {redis_prefix}\n"
    store._use_scripts(APPLY_LUA + tag, READ_LUA + tag)
    results = store.apply_completions(comps)
    assert [r.new for r in results] == [False] * 5 + [True] * 5  # nothing applied twice
    ids = [c["lineage_id"] for c in comps]
    fresh = OnlineStore(store.r, redis_prefix)
    assert _read(store, ids, synthetic.MODEL_TYPES) == _read(fresh, ids, synthetic.MODEL_TYPES)


def test_down_redis_raises_quickly() -> None:
    client = connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
    store = OnlineStore(client, "x:")
    t0 = time.monotonic()
    with pytest.raises(OnlineStoreUnavailable) as info:
        _read(store, ["a"], ["b"])
    assert info.value.op == "read"
    with pytest.raises(OnlineStoreUnavailable):
        store.apply_completions([c for _s, c in synthetic.pairs(2)])
    assert time.monotonic() - t0 < 5.0


def test_an_attempt_completes_once_whatever_its_event_id(store: OnlineStore) -> None:
    """Replays of one job attempt's completion under new event ids (×2.9 each, under the
    lineage limit) are repeats: nothing changes, in Lua as in HistoryBook. A redelivery of the
    taken event after its dedup marker expired is still that event (a duplicate)."""
    pairs = synthetic.pairs(30, seed=5, lineages=3)
    store.remember_submissions([s for s, _c in pairs])
    first = [c for _s, c in pairs]
    taken = store.apply_completions(first, require_submission=True)
    assert all(r.applied for r in taken)
    before = _read(store, sorted({c["lineage_id"] for c in first}), synthetic.MODEL_TYPES)
    measured = [c for c in first if c["status"] == "succeeded"][:5]
    replays = [
        dict(
            c,
            event_id=f"{c['event_id']}-replay-{k}",
            throughput=dict(
                c["throughput"], samples_per_s=c["throughput"]["samples_per_s"] * 2.9**k
            ),
        )
        for c in measured
        for k in (1, 2, 3)
    ]
    got = store.apply_completions(replays, require_submission=True)
    assert [r.outcome for r in got] == ["repeat"] * len(replays)
    assert not any(r.applied or r.measured for r in got)
    after = _read(store, sorted({c["lineage_id"] for c in first}), synthetic.MODEL_TYPES)
    assert after == before
    book = HistoryBook()
    for c in first:
        book.apply_completion(c)
    assert [book.apply_completion(c) for c in replays] == ["repeat"] * len(replays)
    # the seen marker gone (its TTL is shorter than the attempt's): still a duplicate
    c = measured[0]
    store.r.delete(store.keys.seen(c["event_id"], c["model_type"]))
    [again] = store.apply_completions([c], require_submission=True)
    assert not again.new and again.outcome == taken[first.index(c)].outcome


def test_a_probe_completes_once_per_type_apart_from_its_attempt(store: OnlineStore) -> None:
    """A probe's completion (`probe: true`) is taken once per (attempt, probed type), in Lua as
    in HistoryBook, and leaves the attempt's own completion to be taken."""
    pairs = [
        (s, c) for s, c in synthetic.pairs(30, seed=6, lineages=3) if c["status"] == "succeeded"
    ]
    s, c = pairs[0]
    store.remember_submissions([s])
    other = next(t for t in s["candidate_hardware"] if t != c["hardware_type"])
    probe = dict(c, event_id=f"{c['event_id']}-probe", hardware_type=other, probe=True)
    again = dict(probe, event_id=f"{c['event_id']}-probe-again")
    got = store.apply_completions([probe, again, c], require_submission=True)
    assert [r.outcome for r in got][1] == "repeat"
    assert got[0].applied and got[2].applied
    book = HistoryBook()
    assert [book.apply_completion(x) for x in (probe, again, c)][1] == "repeat"
    [hist], _ = store.read_batch([c["lineage_id"]], [], [c["model_type"]])
    assert {other, c["hardware_type"]} <= set(hist)


def test_a_probe_on_a_slice_of_its_job_passes_the_devices_rule_in_lua_as_in_python(
    store: OnlineStore,
) -> None:
    """The Lua script takes a probe's completion on a slice of the submission's devices (a
    count dividing it) and holds any other count, as `core.history.slice_of` does."""
    pairs = [
        (s, c) for s, c in synthetic.pairs(60, seed=8, lineages=6) if c["status"] == "succeeded"
    ]
    s, c = next((s, c) for s, c in pairs if s["training"]["num_devices"] % 2 == 0)
    asked = int(s["training"]["num_devices"])
    store.remember_submissions([s])
    others = [t for t in s["candidate_hardware"] if t != c["hardware_type"]]
    half = dict(c, event_id="slice", hardware_type=others[0], num_devices=asked // 2, probe=True)
    odd = dict(half, event_id="odd", hardware_type=others[-1], num_devices=asked + 1)
    own = dict(c, num_devices=asked // 2)
    got = store.apply_completions([half, odd, own], require_submission=True)
    assert [r.outcome for r in got] == ["accepted", "devices", "devices"]
    book = HistoryBook()
    assert [book.apply_completion(x, submitted_devices=asked) for x in (half, odd, own)] == [
        "accepted",
        "devices",
        "devices",
    ]


def test_rebuild_history_from_the_dataset(store: OnlineStore, tmp_path) -> None:
    from leap_stream.store.offline import DatasetSink, completions_from_frame, read_dataset

    pairs = synthetic.pairs(400, seed=13, lineages=30)
    DatasetSink(tmp_path).append([flatten(s, c) for s, c in pairs])
    completions = completions_from_frame(read_dataset(tmp_path))
    assert [c["ended_at"] for c in completions] == sorted(c["ended_at"] for c in completions)

    store.apply_completions([c for _s, c in pairs[:50]])  # stale state, to be replaced
    applied, measured = store.rebuild_history(completions)
    assert applied == 400

    book = HistoryBook()
    outcomes = [book.apply_completion(c) for c in completions]
    assert measured == sum(o in ("accepted", "corroborated") for o in outcomes)
    # the synthetic throughputs are random per run: the guard quarantines many of them
    assert sum(o in QUARANTINE_RULES for o in outcomes) > 10
    assert sum(o != "none" for o in outcomes) == sum(
        is_measurement(c["status"], (c["throughput"] or {}).get("samples_per_s"))
        for c in completions
    )
    assert 0 < measured < applied
    ids = book.lineage_ids
    histories, aggregates = _read(store, ids, synthetic.MODEL_TYPES)
    assert histories == [book.lineage(x) for x in ids]
    assert aggregates == {mt: book.aggregates(mt) for mt in synthetic.MODEL_TYPES}


def test_private_redis_killed_and_restarted(tmp_path) -> None:
    """A Redis that dies mid-run: typed error while down; after a restart (empty, no scripts)
    the same client reconnects, reloads its scripts on NOSCRIPT and carries on."""
    import subprocess

    from leap_stream.tools.dev import redis as dev_redis
    from leap_stream.tools.dev.state import free_port

    binary = dev_redis.find_redis_server(install=False)
    port = free_port()

    def start() -> subprocess.Popen[bytes]:
        cmd = dev_redis.redis_command(
            binary, port, tmp_path, tmp_path / "redis.log", tmp_path / "redis.pid"
        )
        proc = subprocess.Popen(cmd)
        deadline = time.monotonic() + 10
        while not dev_redis.is_ready(f"redis://127.0.0.1:{port}/0", timeout=0.2):
            assert proc.poll() is None and time.monotonic() < deadline, "redis did not start"
            time.sleep(0.05)
        return proc

    comps = [c for _s, c in synthetic.pairs(10, seed=21)]
    proc = start()
    try:
        store = OnlineStore(connect(f"redis://127.0.0.1:{port}/0"), "f:")
        assert all(r.new for r in store.apply_completions(comps[:5]))
        proc.kill()
        proc.wait()
        with pytest.raises(OnlineStoreUnavailable):
            _read(store, [comps[0]["lineage_id"]], [])
        with pytest.raises(OnlineStoreUnavailable):
            store.apply_completions(comps)
        proc = start()
        results = store.apply_completions(comps)  # data and script cache are gone
        assert all(r.new for r in results)
        histories, _ = _read(store, [c["lineage_id"] for c in comps], [])
        assert histories == [_replay(comps).lineage(c["lineage_id"]) for c in comps]
    finally:
        proc.kill()
        proc.wait()


def _telemetry(values: list[tuple[float, int]], lineage: str = "lin-poison") -> list[dict]:
    """Completions of one lineage on one type: (samples_per_s, num_devices), one hour apart."""
    [(_sub, base)] = synthetic.pairs(1, seed=21)
    out = []
    for i, (sps, nd) in enumerate(values):
        out.append(
            dict(
                base,
                event_id=f"cmp-{lineage}-{i}",
                job_id=f"job-{lineage}-{i}",
                lineage_id=lineage,
                hardware_type="h100",
                status="succeeded",
                num_devices=nd,
                throughput={"samples_per_s": sps},
                ended_at=f"2026-11-20T{i:02d}:00:00.000Z",
                started_at="2026-11-19T00:00:00.000Z",
            )
        )
    return out


def test_the_guard_in_lua_is_the_guard_in_python(store: OnlineStore) -> None:
    """Poisoned telemetry (×1000, ×1e-6, one device for eight), a real change corroborated,
    a window overflow: every outcome and the whole state agree with HistoryBook, and the
    history keys carry the retention TTL."""
    values = [(800.0, 8), (820.0, 8), (790.0, 8), (800_000.0, 8), (805.0, 8), (0.0008, 8)]
    values += [(800.0, 1), (800.0, 8), (4000.0, 8), (4100.0, 8), (4050.0, 8)] + [
        (4000.0 + i, 8) for i in range(6)
    ]
    comps = _telemetry(values)
    # a new lineage far off the model type's aggregate (which has enough measurements by then)
    comps += _telemetry([(9.0e6, 8)], lineage="lin-stranger")
    # every job was submitted on 8 devices: the stored submissions say so
    [(sub, _c)] = synthetic.pairs(1, seed=21)
    store.remember_submissions(
        [
            dict(
                sub,
                job_id=c["job_id"],
                attempt=c["attempt"],
                lineage_id=c["lineage_id"],
                candidate_hardware=["h100", "a100"],
                training=dict(sub["training"], num_devices=8),
            )
            for c in comps
        ]
    )
    results = []
    for c in comps:
        results += store.apply_completions([c], require_submission=True)
    book = HistoryBook(store.rules)
    want = [book.apply_completion(c, submitted_devices=8) for c in comps]
    assert [r.outcome for r in results] == want
    assert want[3] == want[5] == want[8] == "lineage" and want[6] == "devices"
    assert want[9] == "corroborated" and want[-1] == "aggregate"
    got, aggs = _read(store, ["lin-poison", "lin-stranger"], [comps[0]["model_type"]])
    assert got == [book.lineage("lin-poison"), {}]
    assert aggs[comps[0]["model_type"]] == book.aggregates(comps[0]["model_type"])
    m = got[0]["h100"]
    assert len(m.recent) == store.rules.recent and m.samples_per_s == pytest.approx(4003.0)
    mt = comps[0]["model_type"]
    for key in (store.keys.lin("lin-poison", mt), store.keys.agg(mt)):
        assert 0 < store.r.ttl(key) <= store.history_ttl_s
    # a redelivery reports the first outcome (for the dataset flag) and changes nothing
    again = store.apply_completions([comps[3]])
    assert not again[0].new and again[0].quarantine == "lineage"
    assert _read(store, ["lin-poison"], [])[0] == [book.lineage("lin-poison")]


def test_an_entry_in_the_single_measurement_layout_still_reads_and_updates(
    store: OnlineStore,
) -> None:
    key = store.keys.lin("lin-old", _types(["lin-old"])[0])
    store.r.hset(key, "h100", "[800,8,1796000000.0,3]")
    [hist], _ = _read(store, ["lin-old"], [])
    assert hist["h100"].count == 3 and hist["h100"].samples_per_s == pytest.approx(800.0)
    [c] = _telemetry([(810.0, 8)], lineage="lin-old")
    [r] = store.apply_completions([c])
    assert r.outcome == "accepted"
    [hist], _ = _read(store, ["lin-old"], [])
    assert hist["h100"].count == 4 and len(hist["h100"].recent) == 2
    assert hist["h100"].recent[-1][0] == hist["h100"].measured_at == 1796000000.0  # newest last


def _attacks(seed: int) -> list[dict]:
    """Completions of honest lineages and of attacks on them, as events in arrival order: walks
    of values ×2.9 the last (a job each, minutes or hours apart), pairs of ×10 and ×1000 values
    from one job or two, ten new lineages agreeing on ×90 the type's aggregate, and honest
    releases (×1.25). Every value is a new job unless a pair shares one."""
    rng = random.Random(seed)
    (_s, template), *_ = synthetic.pairs(1, seed=1)
    start = epoch_s(template["ended_at"]) - 30 * 86_400
    events: list[tuple[float, str, str, float]] = []  # (ended_at, lineage, job, samples/s)
    for k in range(8):
        lin, base = f"lin-{k:06d}", 100.0 * (1 + k)
        events += [(start + 60.0 * i, lin, f"{lin}-h{i}", base) for i in range(4)]
        kind = k % 4
        if kind == 0:  # a walk, a minute a step, then an hour a step
            value = base
            for i in range(30):
                value *= 2.9 if rng.random() < 0.8 else 1 / 2.9
                events.append((start + 3600.0 * (1 + i), lin, f"{lin}-w{i}", value))
        elif kind == 1:  # pairs: one job, two jobs a minute apart, two jobs hours apart
            for i, (factor, gap, same) in enumerate(
                [
                    (10.0, 7200.0, True),
                    (10.0, 60.0, False),
                    (10.0, 7200.0, False),
                    (1000.0, 7200.0, False),
                ]
            ):
                at = start + 86_400.0 * (1 + i)
                events.append((at, lin, f"{lin}-p{i}", base * factor))
                events.append(
                    (at + gap, lin, f"{lin}-p{i}" if same else f"{lin}-q{i}", base * factor)
                )
        elif kind == 2:  # an honest release, then steady
            events += [
                (start + 86_400.0 + 600.0 * i, lin, f"{lin}-r{i}", base * 1.25) for i in range(6)
            ]
    for i in range(10):  # ten new lineages agreeing on ×90
        lin = f"lin-{(10 + i) * len(synthetic.MODEL_TYPES):06d}"  # the model type of lin-000000
        events.append((start + 2 * 86_400.0 + 60.0 * i, lin, f"{lin}-x", 100.0 * 90))
    events.sort()
    out = []
    for n, (at, lin, job, sps) in enumerate(events):
        c = dict(template, event_id=f"atk-{seed}-{n}", job_id=job, attempt=1, lineage_id=lin)
        c.update(
            model_type=_types([lin])[0],
            hardware_type="h100-sxm-80g",
            num_devices=8,
            ended_at=format_ts(at),
            throughput={"samples_per_s": sps},
        )
        out.append(c)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_the_speed_rule_online_is_the_book_s(store: OnlineStore, seed: int) -> None:
    """Walks, pairs and agreeing new lineages get the same verdicts, priors and aggregates
    from the Lua script as from `HistoryBook`, and the attacks are held where the rules say."""
    completions = _attacks(seed)
    results = []
    for i in range(0, len(completions), 41):
        results += store.apply_completions(completions[i : i + 41])
    book = HistoryBook()
    want = [book.apply_completion(c) for c in completions]
    assert [r.outcome for r in results] == want
    assert sum(r.aggregate_held for r in results) == book.aggregate_held > 0
    assert {"speed", "corroborated", "lineage"} <= set(want)
    ids = sorted({c["lineage_id"] for c in completions})
    histories, aggregates = _read(store, ids, synthetic.MODEL_TYPES)
    assert histories == [book.lineage(x) for x in ids]
    assert aggregates == {mt: book.aggregates(mt) for mt in synthetic.MODEL_TYPES}
