"""The broker goes away under a running worker and comes back: the worker survives (aiokafka
and librdkafka reconnect), loses nothing, and exits 0 on SIGTERM. Uses a private broker of its
own (`leap_stream.tools.dev` under a temporary LEAP_HOME) so that stopping it disturbs nobody."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.lag import LagReader, total_lag, worker_groups
from leap_stream.tools.sim.events import submission_events
from leap_stream.tools.sim.fleet import SimConfig, simulate

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
    proc = None
    try:
        topics = {k: f"outage.{k}" for k in ("sub", "comp", "rank", "dlq")}
        create_topics(bootstrap, list(topics.values()), partitions=2)
        subs = submission_events(simulate(SimConfig(seed=3, days=1, rate=400)).submissions)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEAP_")}
        env.update(
            LEAP_KAFKA_BOOTSTRAP=bootstrap,
            LEAP_REDIS_URL=redis_url,
            LEAP_REDIS_PREFIX=redis_prefix,
            LEAP_TOPIC_SUBMISSIONS=topics["sub"],
            LEAP_TOPIC_COMPLETIONS=topics["comp"],
            LEAP_TOPIC_RANKINGS=topics["rank"],
            LEAP_TOPIC_DEAD_LETTER=topics["dlq"],
            LEAP_CONSUMER_GROUP="outage-worker",
            LEAP_HOME=str(tmp_path / "worker-home"),
            LEAP_METRICS_PORT="0",
            LEAP_COMMIT_INTERVAL_S="0.5",
        )
        log = tmp_path / "worker.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "leap_stream", "worker"],
            env=env,
            cwd=tmp_path,
            stdout=open(log, "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
        )
        half = len(subs) // 2
        _produce(bootstrap, topics["sub"], subs[:half])
        with RankingsClient(KafkaClients(bootstrap), topics["rank"]) as client:
            _wait_ranked(client, half, proc, 90)

        assert stop_services(names=["kafka"], home=home)["kafka"]
        time.sleep(8)  # the worker's consumer, producer and lag timer all see the outage
        assert proc.poll() is None, log.read_text()[-3000:]
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
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        stop_services(names=["kafka"], home=home)
