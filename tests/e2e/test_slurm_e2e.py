"""Slurm, for real: sbatch through the leap-stream plugins of deploy/slurm to a ranked partition.

A single-host Slurm (munged, slurmctld and slurmd from Debian's packages, `LocalSlurm`) loads
cli_filter.lua and job_submit.lua from deploy/slurm. `leap-stream serve` ranks over HTTP (the
cli_filter path) and `leap-stream rankings cache` keeps the cache job_submit.lua reads (the
server-side path), both against the real broker and Redis. Where a job landed is read back with
`scontrol show job`.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from _served import Served

from leap_stream.contracts.job_spec import spec_of
from leap_stream.core.placement import choose
from leap_stream.schedulers.slurm import file_name
from leap_stream.stream.client import RankingsClient
from leap_stream.tools.dev.slurm import LocalSlurm, SlurmUnavailable
from leap_stream.tools.harness import WorkerProcess, free_port, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SlurmWorld:
    slurm: LocalSlurm
    served: Served

    @property
    def serve_url(self) -> str:
        return self.served.url

    @property
    def cache_dir(self) -> Path:
        return self.served.cache_dir

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
        return self.served.rank(event)

    def wait_cached(self, kind: str, ident: str) -> None:
        """Until `leap-stream rankings cache` has written the ranking of a job or lineage."""
        path = self.cache_dir / file_name(kind, ident)
        wait_for(f"the {kind} {ident}'s ranking in the cache", path.exists, 60)

    def fresh(self, index: int) -> dict[str, Any]:
        return self.served.fresh(index, self.slurm.partitions)

    @property
    def submissions(self) -> list[dict[str, Any]]:
        return self.served.submissions


def spec_comment(event: dict[str, Any], keep_job_id: bool = False) -> str:
    spec = spec_of(event)
    if keep_job_id:
        spec["job_id"] = event["job_id"]
    return "leap:" + orjson.dumps(spec).decode()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, served: Served) -> Iterator[SlurmWorld]:
    tmp = tmp_path_factory.mktemp("slurm-e2e")
    partitions = sorted({t for s in served.submissions for t in s["candidate_hardware"]})[:6]
    slurm = LocalSlurm(tmp / "slurm", ROOT / "deploy" / "slurm", partitions)
    cache = WorkerProcess(served.env, tmp / "cache.log", tmp, command=("rankings", "cache"))
    try:
        slurm.start()
    except SlurmUnavailable as exc:
        pytest.fail(f"the Slurm end-to-end test needs Slurm: {exc}")
    cache.start()
    try:
        yield SlurmWorld(slurm, served)
    finally:
        cache.stop()
        slurm.stop()


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
    with RankingsClient(world.served.kafka, world.served.rank_topic) as reader:

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
    world.wait_cached("lineage", earlier["lineage_id"])
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
    world.wait_cached("job", portal["job_id"])
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
    world.wait_cached("lineage", probe["lineage_id"])
    (world.slurm.etc / "leap-stream.conf").write_text(
        (world.slurm.etc / "leap-stream.conf").read_text().replace(f"partition.{ranked[1]} =", "#")
    )
    asked = f"{ranked[1]},{ranked[0]}"
    job_id, _ = world.slurm.sbatch("--hold", "-p", asked, "--comment", spec_comment(probe))
    assert world.slurm.job(job_id)["Partition"] == asked


def test_a_serve_that_never_answers_costs_one_timeout(world: SlurmWorld) -> None:
    """cli_filter waits serve_timeout_s at most, then the job keeps what the user asked (without
    the timeout curl would wait for ever, and sbatch's 60 s limit in `LocalSlurm` fails this)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    try:
        world.configure(f"http://127.0.0.1:{silent.getsockname()[1]}/v1/rank")
        conf = world.slurm.etc / "leap-stream.conf"
        conf.write_text(conf.read_text().replace("serve_timeout_s = 5", "serve_timeout_s = 1"))
        asked = ",".join(world.slurm.partitions[:3])
        job_id, _ = world.slurm.sbatch(
            "--hold", "-p", asked, "--comment", spec_comment(world.fresh(2))
        )
    finally:
        silent.close()
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


def test_a_rankings_probes_run_as_short_jobs_and_report_as_completions(world: SlurmWorld) -> None:
    """A long job's ranking names probes: each runs as a short job on its type's partition
    (real slurmctld and slurmd), reports what it measured as a completion marked `probe`
    (taken by the real store once per type, leaving the attempt its own completion), and the
    job then goes where `after_probes` puts the types."""
    from datetime import UTC, datetime

    from leap_stream.core.placement import after_probes
    from leap_stream.schedulers.probes import probe_completion, slurm_probe_args
    from leap_stream.store.connection import connect
    from leap_stream.store.online import OnlineStore

    world.configure(None)
    for i in range(len(world.submissions)):
        event, _ranked = _ranked_event(world, i)
        event["training"]["planned_samples"] = 1e15  # months of work: a probe pays
        ranking = world.rank(event)
        if "probe" in ranking:
            break
    else:
        raise AssertionError("no long job's ranking names a probe")
    types = ranking["probe"]["hardware_types"]
    assert len(types) >= 2, ranking["probe"]  # months of work: every close candidate is worth it
    # each probe "measures" half the model's prediction where it ran, except the last probed
    # type: three times it
    # with LEAP_PROBE_SIZE=slice each probe runs the slice its `runs` entry names (the
    # integration tests run the store's side of that); by default, the whole job
    predicted = {c["hardware_type"]: c["predicted_throughput"] for c in ranking["candidates"]}
    whole = {"num_devices": event["training"]["num_devices"]}
    runs = dict(zip(types, ranking["probe"].get("runs") or [whole] * len(types), strict=True))
    at_slice = {t: runs[t].get("predicted_throughput", predicted[t]) for t in types}
    rates = {t: round(at_slice[t] * (3.0 if t == types[-1] else 0.5), 3) for t in types}
    out = world.slurm.folder / "probes"
    out.mkdir(exist_ok=True)
    started = datetime.now(UTC)
    jobs = {}
    for t, args in zip(types, slurm_probe_args(ranking), strict=True):
        # the script sees the slice to launch in its environment
        wrap = f'echo {rates[t]} "${{LEAP_PROBE_DEVICES:-all}}" > {out}/"$LEAP_PROBE_TYPE"'
        jobs[t], _ = world.slurm.sbatch(*args, wrap=wrap)
        job = world.slurm.job(jobs[t])
        assert job["Partition"] == t and job["TimeLimit"].startswith("00:0"), job
    for t, job_id in jobs.items():
        wait_for(f"probe {t}", lambda j=job_id: world.slurm.job(j)["JobState"] == "COMPLETED", 60)
    said = {t: (out / t).read_text().split() for t in types}
    measured = {t: float(said[t][0]) for t in types}
    assert measured == rates
    assert {t: said[t][1] for t in types} == {
        t: str(runs[t]["num_devices"]) if "data_parallel" in runs[t] else "all" for t in types
    }
    ended = datetime.now(UTC)
    completions = [
        probe_completion(event, t, measured[t], started, ended, runs[t]["num_devices"])
        for t in types
    ]
    env = world.served.env
    store = OnlineStore(connect(env["LEAP_REDIS_URL"]), prefix=env["LEAP_REDIS_PREFIX"])
    try:
        store.remember_submissions([event])
        again = dict(completions[0], event_id=completions[0]["event_id"] + ".again")
        got = store.apply_completions([*completions, again], require_submission=True)
        assert [r.outcome for r in got][-1] == "repeat"
        # a slice of the job passes the devices rule of the real store's script
        assert all(r.applied and r.outcome not in ("devices", "none") for r in got[:-1]), [
            r.outcome for r in got
        ]
        [hist], _ = store.read_batch([event["lineage_id"]], [], [event["model"]["model_type"]])
        assert set(types) <= set(hist)
    finally:
        store.r.close()
    order = after_probes(ranking, measured)
    assert order[0] == types[-1] != ranking["candidates"][0]["hardware_type"], (ranking, order)
    job_id, _ = world.slurm.sbatch("-p", order[0])
    assert world.slurm.job(job_id)["Partition"] == order[0]
