"""`leap-stream serve` over the real Redis and broker: the same core as the worker, over HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from fastapi.testclient import TestClient

from leap_stream.core.lookup import LookupTable
from leap_stream.settings import Settings
from leap_stream.store.artefact import write_model
from leap_stream.store.registry import Registry
from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.output import OutputProducer
from leap_stream.stream.serve import Publisher, RankService, create_app
from leap_stream.stream.worker import ranking_core
from leap_stream.tools.harness import free_port
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.events import submission_events
from leap_stream.tools.sim.fleet import simulate
from leap_stream.train.trainer import fit, training_rows

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
RANKING = jsonschema.Draft202012Validator(
    json.loads((ROOT / "schemas" / "hardware-ranking.schema.json").read_text())
)
TOKEN = "t0ken-for-tests"


@pytest.fixture(scope="module")
def fleet() -> Any:
    return simulate(SimConfig(seed=8, days=2, rate=600))


def _settings(tmp: Path, redis_url: str, prefix: str, bootstrap: str, rank_topic: str) -> Settings:
    return Settings.from_env(
        {
            "LEAP_HOME": str(tmp / "home"),
            "LEAP_REDIS_URL": redis_url,
            "LEAP_REDIS_PREFIX": prefix,
            "LEAP_REDIS_TIMEOUT_S": "0.3",
            "LEAP_KAFKA_BOOTSTRAP": bootstrap,
            "LEAP_TOPIC_RANKINGS": rank_topic,
            "LEAP_COMPILED_TREES": "0",
            # the simulator's calendar, not this clock
            "LEAP_EVENT_MAX_AGE_S": "0",
            "LEAP_EVENT_MAX_LEAD_S": "0",
        }
    )


def _client(cfg: Settings, fleet: Any, tokens: frozenset[str] | None) -> Iterator[TestClient]:
    model = fit(training_rows(fleet.dataset), num_rounds=20)
    reg = Registry(cfg.registry_dir)
    d = write_model(cfg.home / "build", model, LookupTable.fit(fleet.dataset))
    reg.promote(reg.publish(d))
    core = ranking_core(cfg)
    publisher = Publisher(OutputProducer(KafkaClients.of(cfg)), cfg.topic_rankings)
    publisher.start()

    service = RankService(core.submissions, publisher.put, core.ready)
    with TestClient(create_app(service, tokens, core.metrics.registry)) as client:
        client.core = core  # type: ignore[attr-defined]
        client.service = service  # type: ignore[attr-defined]
        yield client
    publisher.stop()


@pytest.fixture
def served(
    tmp_path: Path,
    fleet: Any,
    redis_url: str,
    redis_prefix: str,
    redis_client: Any,
    kafka_bootstrap: str,
    topic_factory: Any,
) -> Iterator[tuple[TestClient, Settings]]:
    cfg = _settings(tmp_path, redis_url, redis_prefix, kafka_bootstrap, topic_factory("srank", 2))
    for client in _client(cfg, fleet, frozenset({TOKEN})):
        yield client, cfg


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def test_ranks_remembers_and_publishes(served: tuple[TestClient, Settings], fleet: Any) -> None:
    client, cfg = served
    subs = submission_events(fleet.submissions)[:20]
    resp = client.post("/v1/rank", content=orjson.dumps(subs[0]), headers=_auth())
    assert resp.status_code == 200, resp.text
    ranking = resp.json()
    assert not list(RANKING.iter_errors(ranking))
    assert ranking["job_id"] == subs[0]["job_id"] and ranking["source"] == "model"

    batch = client.post("/v1/rank/batch", content=orjson.dumps(subs[1:]), headers=_auth())
    assert batch.status_code == 200
    results = batch.json()["results"]
    assert [r["ranking"]["job_id"] for r in results] == [s["job_id"] for s in subs[1:]]

    # remembered for the completion join, as the worker does
    store = client.core.store  # type: ignore[attr-defined]
    joined = store.fetch_submissions([(s["job_id"], s["attempt"]) for s in subs])
    assert all(j is not None for j in joined)
    # and produced to the rankings topic (the audit trail)
    with RankingsClient(KafkaClients.of(cfg), cfg.topic_rankings) as reader:
        end = time.monotonic() + 30
        while len(reader.latest()) < len(subs) and time.monotonic() < end:
            reader.poll(timeout=0.5)
        assert {k for k in reader.latest()} == {(s["job_id"], s["attempt"]) for s in subs}


def test_invalid_input_gets_422_with_the_dead_letter_kinds(
    served: tuple[TestClient, Settings], fleet: Any
) -> None:
    client, _cfg = served
    assert (
        client.post("/v1/rank", content=b'{"job_id": ', headers=_auth()).json()["error"]["kind"]
        == "not_json"
    )
    bad = dict(submission_events(fleet.submissions)[0], attempt=0)
    resp = client.post("/v1/rank", content=orjson.dumps(bad), headers=_auth())
    assert resp.status_code == 422 and resp.json()["error"]["kind"] == "schema"
    good = submission_events(fleet.submissions)[1]
    mixed = client.post("/v1/rank/batch", content=orjson.dumps([bad, good]), headers=_auth())
    kinds = ["error" in r for r in mixed.json()["results"]]
    assert mixed.status_code == 200 and kinds == [True, False]
    assert client.post("/v1/rank/batch", content=b"{}", headers=_auth()).status_code == 422


def test_tokens_health_and_readiness(served: tuple[TestClient, Settings], fleet: Any) -> None:
    client, _cfg = served
    sub = orjson.dumps(submission_events(fleet.submissions)[0])
    assert client.post("/v1/rank", content=sub).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert client.post("/v1/rank", content=sub, headers=wrong).status_code == 401
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["redis"] is True and ready.json()["model"]
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "leap_model_info{" in metrics.text


def test_without_redis_it_ranks_without_history_and_is_not_ready(
    tmp_path: Path, fleet: Any, kafka_bootstrap: str, topic_factory: Any
) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    cfg = _settings(tmp_path, down, "serve-down:", kafka_bootstrap, topic_factory("srank", 1))
    for client in _client(cfg, fleet, None):
        sub = submission_events(fleet.submissions)[0]
        resp = client.post("/v1/rank", content=orjson.dumps(sub))
        assert resp.status_code == 200, resp.text
        assert resp.json()["history_used"] is False
        assert resp.json()["source"] == "model"
        assert client.get("/readyz").status_code == 503


def test_concurrent_requests_are_ranked_together_each_gets_its_own(
    served: tuple[TestClient, Settings], fleet: Any
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    client, _cfg = served
    subs = submission_events(fleet.submissions)[:64]
    service = client.service  # type: ignore[attr-defined]
    before = service.batches

    def one(sub: dict[str, Any]) -> str:
        resp = client.post("/v1/rank", content=orjson.dumps(sub), headers=_auth())
        assert resp.status_code == 200, resp.text
        return str(resp.json()["job_id"])

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, subs))
    assert got == [s["job_id"] for s in subs]
    assert service.batches - before < len(subs)  # some requests shared a batch
