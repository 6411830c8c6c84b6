"""Slurm, for real: sbatch through the leap-stream plugins of deploy/slurm to a ranked partition.

A single-host Slurm (munged, slurmctld and slurmd from Debian's packages, `LocalSlurm`) loads
cli_filter.lua and job_submit.lua from deploy/slurm. `leap-stream serve` ranks over HTTP (the
cli_filter path) and `leap-stream rankings cache` keeps the cache job_submit.lua reads (the
server-side path), both against the real broker and Redis. Where a job landed is read back with
`scontrol show job`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from leap_stream.contracts.job_spec import SCHEDULER_FIELDS
from leap_stream.core.lookup import LookupTable
from leap_stream.core.placement import choose
from leap_stream.schedulers.slurm import file_name
from leap_stream.store.artefact import write_model
from leap_stream.store.registry import Registry
from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.tools.dev.slurm import LocalSlurm, SlurmUnavailable
from leap_stream.tools.dev.topics import create_topics, delete_topics
from leap_stream.tools.harness import (
    WorkerProcess,
    free_port,
    serve_ready,
    wait_for,
    worker_env,
)
from leap_stream.tools.sim.events import submission_events
from leap_stream.tools.sim.fleet import SimConfig, simulate
from leap_stream.train.trainer import fit, training_rows

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SlurmWorld:
    slurm: LocalSlurm
    serve_url: str
    cache_dir: Path
    rank_topic: str
    kafka: KafkaClients
    submissions: list[dict[str, Any]]

    def configure(self, serve_url: str | None) -> None:
        """leap-stream.conf beside the plugins: the serve (None: cli_filter off) and the cache."""
        lines = [
            f"serve_url = {serve_url or ''}",
            "serve_timeout_s = 5",
            f"cache_dir = {self.cache_dir}",
            "cache_max_age_s = 604800",
            *(f"partition.{p} = {p}" for p in self.slurm.partitions),
        ]
        (self.slurm.etc / "leap-stream.conf").write_text("\n".join(lines) + "\n")

    def rank(self, event: dict[str, Any]) -> dict[str, Any]:
        resp = httpx.post(f"{self.serve_url}/v1/rank", content=orjson.dumps(event), timeout=30)
        assert resp.status_code == 200, resp.text
        ranking: dict[str, Any] = resp.json()
        return ranking

    def fresh(self, index: int) -> dict[str, Any]:
        """A submission of a lineage no other test uses, with at least three ranked types."""
        event = dict(self.submissions[index])
        event["lineage_id"] = f"lineage/slurm-test/{uuid.uuid4().hex[:10]}"
        event["job_id"] = f"job/slurm-test/{uuid.uuid4().hex[:10]}"
        event["event_id"] = f"sub-slurm-test-{uuid.uuid4().hex[:10]}"
        event["candidate_hardware"] = list(self.slurm.partitions)
        event["default_hardware"] = self.slurm.partitions[0]
        return event


def spec_comment(event: dict[str, Any], keep_job_id: bool = False) -> str:
    spec = {k: v for k, v in event.items() if k not in SCHEDULER_FIELDS}
    if keep_job_id:
        spec["job_id"] = event["job_id"]
    return "leap:" + orjson.dumps(spec).decode()


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, redis_url: str
) -> Iterator[SlurmWorld]:
    tmp = tmp_path_factory.mktemp("slurm-e2e")
    fleet = simulate(SimConfig(seed=8, days=2, rate=600))
    subs = [dict(s) for s in submission_events(fleet.submissions)]
    partitions = sorted({t for s in subs for t in s["candidate_hardware"]})[:6]
    registry = Registry(tmp / "registry")
    built = write_model(tmp / "build", fit(training_rows(fleet.dataset), num_rounds=20),
                        LookupTable.fit(fleet.dataset))  # fmt: skip
    registry.promote(registry.publish(built))

    rank_topic = f"test.slurm-rank.{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, [rank_topic], partitions=2)
    slurm = LocalSlurm(tmp / "slurm", ROOT / "deploy" / "slurm", partitions)
    try:
        slurm.start()
    except SlurmUnavailable as exc:
        pytest.fail(f"the Slurm end-to-end test needs Slurm: {exc}")
    port = free_port()
    env = worker_env(
        bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        prefix=f"test:{uuid.uuid4().hex[:10]}:",
        topics={"sub": rank_topic, "comp": rank_topic, "rank": rank_topic, "dlq": rank_topic},
        group=f"slurm-e2e-{uuid.uuid4().hex[:8]}",
        home=tmp / "home",
        dataset_dir=tmp / "dataset",
        registry_dir=tmp / "registry",
        metrics_port=0,
        settings={
            "LEAP_SERVE_PORT": str(port),
            "LEAP_COMPILED_TREES": "0",
            "LEAP_RANKINGS_CACHE_DIR": str(tmp / "cache"),
            # the submissions carry the simulator's calendar; the plugins date theirs now
            "LEAP_EVENT_MAX_AGE_S": "0",
        },
    )
    serve = WorkerProcess(env, tmp / "serve.log", tmp, command=("serve",))
    cache = WorkerProcess(env, tmp / "cache.log", tmp, command=("rankings", "cache"))
    serve.start()
    cache.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("leap-stream serve ready", serve_ready(serve, base), 120)
        yield SlurmWorld(
            slurm, base, tmp / "cache", rank_topic, KafkaClients(kafka_bootstrap), subs
        )
    finally:
        serve.stop()
        cache.stop()
        slurm.stop()
        delete_topics(kafka_bootstrap, [rank_topic])


def _ranked_event(world: SlurmWorld, index: int) -> tuple[dict[str, Any], list[str]]:
    """A fresh submission and its ranked types among the partitions (at least three)."""
    for i in range(index, len(world.submissions)):
        event = world.fresh(i)
        ranked = choose(world.rank(event), world.slurm.partitions, k=len(world.slurm.partitions))
        if len(ranked) >= 3:
            return event, ranked
    raise AssertionError("no submission ranks three partitions")


def test_cli_filter_asks_serve_and_the_job_runs_on_the_best_type(world: SlurmWorld) -> None:
    world.configure(world.serve_url + "/v1/rank")
    probe, ranked = _ranked_event(world, 0)
    best = ranked[0]
    # the user allows three types, the best one last: the plugin must move the job
    allowed = [ranked[2], ranked[1], best]
    job_id, stderr = world.slurm.sbatch("-p", ",".join(allowed), "--comment", spec_comment(probe))

    job = world.slurm.job(job_id)
    assert job["Partition"] == best, (stderr, world.slurm.log_tail())
    wait_for("the job ran", lambda: world.slurm.job(job_id)["JobState"] == "COMPLETED", 60)

    # the serve published the plugin's ranking of the job (audit trail, accuracy figures)
    with RankingsClient(world.kafka, world.rank_topic) as reader:

        def published() -> bool:
            reader.poll(timeout=0.5)
            return any(
                r["lineage_id"] == probe["lineage_id"] and r["job_id"].startswith("slurm/")
                for r in reader.latest().values()
            )

        wait_for("the plugin's ranking on the topic", published, 30)
        [theirs] = [
            r for r in reader.latest().values()
            if r["lineage_id"] == probe["lineage_id"] and r["job_id"].startswith("slurm/")
        ]  # fmt: skip
    assert theirs["candidates"] and choose(theirs, allowed) == [best]


def test_job_submit_places_from_the_cache_without_the_network(world: SlurmWorld) -> None:
    world.configure(None)  # no cli_filter: only the server-side plugin and its cache
    # the lineage ran before: its ranking reached the cache through the rankings topic
    earlier, ranked = _ranked_event(world, 3)
    wait_for(
        "the lineage's ranking in the cache",
        lambda: (world.cache_dir / file_name("lineage", earlier["lineage_id"])).exists(),
        60,
    )
    allowed = [ranked[1], ranked[0]]
    again = dict(earlier, job_id=f"job/slurm-test/{uuid.uuid4().hex[:10]}")
    job_id, _ = world.slurm.sbatch(
        "--hold", "-p", ",".join(allowed), "--comment", spec_comment(again)
    )
    job = world.slurm.job(job_id)
    assert job["Partition"] == ranked[0], (job, world.slurm.log_tail())
    assert f"from=lineage;ranking={earlier['job_id']};" in job["AdminComment"]

    # a portal ranked this very job before sbatch: the job's own ranking is used
    portal, p_ranked = _ranked_event(world, 6)
    wait_for(
        "the job's ranking in the cache",
        lambda: (world.cache_dir / file_name("job", portal["job_id"])).exists(),
        60,
    )
    allowed = [p_ranked[2], p_ranked[0]]
    job_id, _ = world.slurm.sbatch(
        "--hold", "-p", ",".join(allowed), "--comment", spec_comment(portal, keep_job_id=True)
    )
    job = world.slurm.job(job_id)
    assert job["Partition"] == p_ranked[0], (job, world.slurm.log_tail())
    assert job["AdminComment"].startswith(f"leap-stream:type={p_ranked[0]};from=job;")


def test_no_ranking_in_time_keeps_what_the_user_asked(world: SlurmWorld) -> None:
    world.configure(f"http://127.0.0.1:{free_port()}/v1/rank")  # nothing listens there
    event = world.fresh(0)  # a lineage never ranked: nothing in the cache either
    asked = ",".join(world.slurm.partitions[:2])
    job_id, _ = world.slurm.sbatch("--hold", "-p", asked, "--comment", spec_comment(event))
    job = world.slurm.job(job_id)
    assert job["Partition"] == asked and job["JobState"] == "PENDING"
    assert job.get("AdminComment", "(null)") == "(null)"

    # a job without -p may go anywhere leap-stream knows; with no ranking it stays on the default
    job_id, _ = world.slurm.sbatch("--hold", "--comment", spec_comment(world.fresh(1)))
    assert world.slurm.job(job_id)["Partition"] == world.slurm.partitions[0]

    # a partition leap-stream does not know: the plugins stay out of the way
    world.configure(world.serve_url + "/v1/rank")
    probe, ranked = _ranked_event(world, 9)
    wait_for(
        "the lineage's ranking in the cache",
        lambda: (world.cache_dir / file_name("lineage", probe["lineage_id"])).exists(),
        60,
    )
    (world.slurm.etc / "leap-stream.conf").write_text(
        (world.slurm.etc / "leap-stream.conf").read_text().replace(f"partition.{ranked[1]} =", "#")
    )
    asked = f"{ranked[1]},{ranked[0]}"
    job_id, _ = world.slurm.sbatch("--hold", "-p", asked, "--comment", spec_comment(probe))
    assert world.slurm.job(job_id)["Partition"] == asked


@pytest.mark.parametrize(
    "comment",
    [
        'leap:{"model": {"model_type": "x"}',  # not JSON
        'leap:{"model": {"model_type": "x"}}',  # no lineage_id
        'leap:{"lineage_id": "lineage/slurm-test/bad", "training": 3}',  # serve says 422
        "leap:",
    ],
)
def test_a_malformed_job_spec_never_fails_the_job(world: SlurmWorld, comment: str) -> None:
    world.configure(world.serve_url + "/v1/rank")
    asked = ",".join(world.slurm.partitions[1:3])
    job_id, stderr = world.slurm.sbatch("--hold", "-p", asked, "--comment", comment)
    job = world.slurm.job(job_id)
    assert job["Partition"] == asked and job["JobState"] == "PENDING"
    if "lineage_id" not in comment:
        assert "job spec ignored" in stderr
