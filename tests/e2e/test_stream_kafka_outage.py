"""The broker goes away under a running worker and comes back: the worker survives (aiokafka
and librdkafka reconnect), loses nothing, and exits 0 on SIGTERM. Uses a private broker of its
own (`leap_stream.tools.dev` under a temporary LEAP_HOME) so that stopping it disturbs nobody."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.lag import LagReader, total_lag, worker_groups
from leap_stream.tools.harness import WorkerStack
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.events import submission_events
from leap_stream.tools.sim.fleet import simulate

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


def _produce(bootstrap: str, topic: str, events: list[dict[str, Any]]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    for e in events:
        p.produce(topic, key=e["job_id"].encode(), value=orjson.dumps(e))
    assert p.flush(60) == 0


def _wait_ranked(
    client: RankingsClient, n: int, proc: subprocess.Popen[bytes], timeout: float
) -> None:
    end = time.monotonic() + timeout
    while len(client.latest()) < n and time.monotonic() < end:
        assert proc.poll() is None, "worker died"
        client.poll(timeout=0.5)
    assert len(client.latest()) == n


def test_worker_survives_a_broker_outage(
    redis_url: str, redis_prefix: str, redis_client: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from leap_stream.tools.dev import ensure_services, stop_services
    from leap_stream.tools.dev.topics import create_topics

    monkeypatch.delenv("LEAP_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("LEAP_KAFKA_PORT", "0")
    monkeypatch.setenv("LEAP_KAFKA_CONTROLLER_PORT", "0")
    home = tmp_path / "broker-home"
    services = ensure_services(kafka=True, redis=False, home=home)
    bootstrap = services.kafka_bootstrap
    topics = {k: f"outage.{k}" for k in ("sub", "comp", "rank", "dlq")}
    stack = WorkerStack(
        bootstrap,
        redis_url,
        redis_prefix,
        tmp_path,
        topics,
        "outage-worker",
        extra_env={"LEAP_COMMIT_INTERVAL_S": "0.5"},
    )
    try:
        create_topics(bootstrap, list(topics.values()), partitions=2)
        subs = submission_events(simulate(SimConfig(seed=3, days=1, rate=400)).submissions)
        stack.start()
        proc = stack.proc
        assert proc is not None
        half = len(subs) // 2
        _produce(bootstrap, topics["sub"], subs[:half])
        with RankingsClient(KafkaClients(bootstrap), topics["rank"]) as client:
            _wait_ranked(client, half, proc, 90)

        assert stop_services(names=["kafka"], home=home)["kafka"]
        time.sleep(8)  # the worker's consumer, producer and lag timer all see the outage
        assert stack.alive(), stack.log_tail()
        again = ensure_services(kafka=True, redis=False, home=home)
        assert again.kafka_bootstrap == bootstrap  # same port, same data

        _produce(bootstrap, topics["sub"], subs[half:])
        with RankingsClient(KafkaClients(bootstrap), topics["rank"]) as client:
            _wait_ranked(client, len(subs), proc, 120)
        lag = LagReader(
            KafkaClients(bootstrap), worker_groups("outage-worker", topics["sub"], topics["comp"])
        )
        end = time.monotonic() + 30
        while total_lag(lag.read()) and time.monotonic() < end:
            time.sleep(0.5)
        assert total_lag(lag.read()) == 0
        assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()
    finally:
        if stack.alive():
            stack.stop(signal.SIGKILL)
        stop_services(names=["kafka"], home=home)
