"""What the scheduler end-to-end tests share: `leap-stream serve` on a promoted model, over the
real broker and Redis, with a rankings topic of its own and the fleet its model was fitted on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from leap_stream.core.lookup import LookupTable
from leap_stream.store.artefact import write_model
from leap_stream.store.registry import Registry
from leap_stream.stream.kafka import KafkaClients
from leap_stream.tools.dev.topics import create_topics, delete_topics
from leap_stream.tools.harness import (
    WorkerProcess,
    free_port,
    serve_ready,
    wait_for,
    worker_env,
)
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.events import submission_events
from leap_stream.tools.sim.fleet import simulate
from leap_stream.train.trainer import fit, training_rows


@dataclass
class Served:
    """A running `leap-stream serve`: its URL, rankings topic, folders and the fleet's events."""

    url: str
    rank_topic: str
    kafka: KafkaClients
    tmp: Path
    cache_dir: Path
    submissions: list[dict[str, Any]]
    env: dict[str, str]

    def rank(self, event: dict[str, Any]) -> dict[str, Any]:
        resp = httpx.post(f"{self.url}/v1/rank", content=orjson.dumps(event), timeout=30)
        assert resp.status_code == 200, resp.text
        ranking: dict[str, Any] = resp.json()
        return ranking

    def fresh(self, index: int, candidates: list[str]) -> dict[str, Any]:
        """Submission ``index`` as a new job of a new lineage, allowed ``candidates``."""
        event = dict(self.submissions[index])
        event["lineage_id"] = f"lineage/sched-test/{uuid.uuid4().hex[:10]}"
        event["job_id"] = f"job/sched-test/{uuid.uuid4().hex[:10]}"
        event["event_id"] = f"sub-sched-test-{uuid.uuid4().hex[:10]}"
        event["candidate_hardware"] = list(candidates)
        event["default_hardware"] = candidates[0]
        return event


def start_served(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, redis_url: str
) -> Iterator[Served]:
    """The body of the ``served`` fixture (tests/e2e/conftest.py)."""
    tmp = tmp_path_factory.mktemp("served")
    fleet = simulate(SimConfig(seed=8, days=2, rate=600))
    registry = Registry(tmp / "registry")
    model = fit(training_rows(fleet.dataset), num_rounds=20)
    registry.promote(
        registry.publish(write_model(tmp / "build", model, LookupTable.fit(fleet.dataset)))
    )
    rank_topic = f"test.sched-rank.{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, [rank_topic], partitions=2)
    port = free_port()
    env = worker_env(
        bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        prefix=f"test:{uuid.uuid4().hex[:10]}:",
        topics={"sub": rank_topic, "comp": rank_topic, "rank": rank_topic, "dlq": rank_topic},
        group=f"sched-e2e-{uuid.uuid4().hex[:8]}",
        home=tmp / "home",
        dataset_dir=tmp / "dataset",
        registry_dir=tmp / "registry",
        metrics_port=0,
        settings={
            "LEAP_SERVE_PORT": str(port),
            "LEAP_COMPILED_TREES": "0",
            "LEAP_RANKINGS_CACHE_DIR": str(tmp / "cache"),
            # the fleet's submissions carry the simulator's calendar; the schedulers date now
            "LEAP_EVENT_MAX_AGE_S": "0",
        },
    )
    serve = WorkerProcess(env, tmp / "serve.log", tmp, command=("serve",))
    serve.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("leap-stream serve ready", serve_ready(serve, url), 120)
        yield Served(
            url,
            rank_topic,
            KafkaClients(kafka_bootstrap),
            tmp,
            tmp / "cache",
            [dict(s) for s in submission_events(fleet.submissions)],
            env,
        )
    finally:
        serve.stop()
        delete_topics(kafka_bootstrap, [rank_topic])
