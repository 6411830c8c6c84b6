"""The on-call commands against a real broker: `rankings tail`, `lag`, and `worker` refusing to
start without its topics."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import orjson
import pytest

pytestmark = pytest.mark.services


def _cli(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leap_stream", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_rankings_tail_and_lag(kafka_bootstrap: str, topic_factory: Any) -> None:
    from confluent_kafka import Producer

    topic = topic_factory("rank", partitions=2)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        r = {
            "job_id": f"j{i}",
            "attempt": 1,
            "source": "lookup",
            "reason": "no_model",
            "candidates": [{"hardware_type": "h100-80g"}],
            "produced_at": "2026-12-02T00:00:00Z",
        }
        p.produce(topic, key=r["job_id"].encode(), value=orjson.dumps(r))
    p.produce(topic, value=b"garbage")
    assert p.flush(30) == 0
    env = {"LEAP_KAFKA_BOOTSTRAP": kafka_bootstrap}

    out = _cli(
        ["rankings", "tail", "--from-beginning", "--json", "--idle-exit", "3", "--topic", topic],
        env,
    )
    assert out.returncode == 0, out.stderr
    got = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert sorted(r["job_id"] for r in got) == [f"j{i}" for i in range(5)]
    out = _cli(["rankings", "tail", "--from-beginning", "--idle-exit", "3", "--topic", topic], env)
    assert out.returncode == 0 and "best=h100-80g" in out.stdout

    out = _cli(["lag", "--group", "nobody-reads-this", "--topic", topic, "--json"], env)
    assert out.returncode == 0, out.stderr
    doc = orjson.loads(out.stdout)
    assert doc["total"] == 6 and len(doc["partitions"]) == 2
    out = _cli(["lag", "--group", "nobody-reads-this", "--topic", topic], env)
    assert out.returncode == 0 and "total lag 6" in out.stdout


def test_lag_reads_each_input_topic_from_the_group_that_commits_it(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    """Without --group: submissions from <group>.submissions (the loop), completions from the
    group itself (Faust)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    sub, comp = topic_factory("lag-sub"), topic_factory("lag-comp")
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for topic in (sub, comp):
        for _ in range(4):
            p.produce(topic, value=b"x")
    assert p.flush(30) == 0
    group = f"lag-cli-{os.urandom(4).hex()}"
    for g, topic, done in ((group + ".submissions", sub, 3), (group, comp, 1)):
        c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": g})
        c.commit(offsets=[TopicPartition(topic, 0, done)], asynchronous=False)
        c.close()
    env = {
        "LEAP_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LEAP_CONSUMER_GROUP": group,
        "LEAP_TOPIC_SUBMISSIONS": sub,
        "LEAP_TOPIC_COMPLETIONS": comp,
        "LEAP_SUBMISSIONS_CONSUMER": "librdkafka",
    }
    out = _cli(["lag", "--json"], env)
    assert out.returncode == 0, out.stderr
    doc = orjson.loads(out.stdout)
    assert doc["groups"] == {sub: group + ".submissions", comp: group}
    assert {r["topic"]: r["lag"] for r in doc["partitions"]} == {sub: 1, comp: 3}
    out = _cli(["lag"], env)
    assert out.returncode == 0 and "total lag 4" in out.stdout
    assert f"group {group}.submissions: {sub}" in out.stdout


def test_worker_refuses_to_start_without_its_topics(kafka_bootstrap: str, redis_url: str) -> None:
    env = {
        "LEAP_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LEAP_REDIS_URL": redis_url,
        "LEAP_TOPIC_SUBMISSIONS": f"absent.{os.urandom(4).hex()}",
        "LEAP_METRICS_PORT": "0",
    }
    out = _cli(["worker"], env)
    assert out.returncode == 2
    assert "leap-stream topics create" in out.stderr and env["LEAP_TOPIC_SUBMISSIONS"] in out.stderr


def _bench(args: list[str], kafka_bootstrap: str, redis_url: str) -> tuple[dict[str, Any], Any]:
    """`leap-stream bench ARGS` against the session's services: its last line (the figures) and
    the finished process. LightGBM's own trees: compiling them (the image's default) would add
    its wait to the worker and serve stages; the compiled path has its own tests
    (test_stream_compiled)."""
    env = {
        "LEAP_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LEAP_REDIS_URL": redis_url,
        "LEAP_COMPILED_TREES": "0",
    }
    res = _cli(["bench", *args], env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return orjson.loads(res.stdout.strip().splitlines()[-1]), res


def test_bench_runs_every_stage_small_and_prints_its_figures(
    kafka_bootstrap: str, redis_url: str, tmp_path: Any
) -> None:
    """`leap-stream bench` end to end on tiny sizes: each stage runs against the real services
    and the last line holds every documented figure (a renamed or removed figure fails here).

    Sizes: 1,500 events (three batches of 500: the worker stage's rate needs a span) and a burst
    of 3,000 (more than the 1,000 whose latency the burst figures report)."""
    from leap_stream.tools.bench.stats import FINAL_KEYS

    # the worker stage's rate is over the span of its rankings' produced_at: a backlog that fits
    # one batch (500) has no span, so three batches at least
    args = ["--events", "1500", "--seconds", "1", "--naive-events", "30", "--burst", "3000"]
    last, _res = _bench(args, kafka_bootstrap, redis_url)
    assert set(last) == set(FINAL_KEYS)
    for key in (
        "passthrough_eps",
        "pipeline_eps",
        "worker_eps",
        "naive_eps",
        "p99_ms_at_1000",
        "http_p99_ms_at_200",
        "http_max_rps",
    ):
        assert last[key] is not None and last[key] > 0, key


def test_bench_capacity_bisects_both_objectives_with_the_service_on_its_own_core(
    kafka_bootstrap: str, redis_url: str
) -> None:
    """`leap-stream bench --capacity` on tiny sizes against the real services: one run a rate,
    the two ends of each range only; the figures are in the last line and every rate tried is
    reported with its p99 (a capacity is a rate it tried, or 0 when even the lowest failed);
    ``--json`` prints the full detail, each rate tried with its runs' p99s, before it."""
    args = ["--capacity", "--json", "--events", "600", "--seconds", "1", "--capacity-runs", "1:1"]
    args += ["--capacity-steps", "0", "--capacity-range", "50:400", "--serve-range", "20:200"]
    last, res = _bench(args, kafka_bootstrap, redis_url)
    assert last["capacity_cores"]["service"] and last["capacity_cores"]["rest"]
    assert last["capacity_at_p99_50ms"] is not None and last["capacity_at_p99_50ms"] >= 0
    assert last["serve_capacity_at_p99_10ms"] in (0.0, 20.0, 200.0)
    assert "mixed events/s" in res.stderr and "serve capacity" in res.stderr
    assert last["pipeline_eps"] is None  # --capacity runs only its own stages
    detail = orjson.loads(res.stdout.strip().splitlines()[-2])
    tried = detail["capacity"]["worker"]["p99_ms_by_rate"]
    assert set(tried) <= {"50.0", "400.0"} and all(len(v) == 1 for v in tried.values())
