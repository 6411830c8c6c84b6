"""The demo's steps against the real services: every figure of the report comes from here.

One run has its own topics, consumer group, Redis key prefix and state folder (under the
output folder), so reruns start clean and never touch the service's defaults. Timeline:

    days 0..H-1  history: written as the dataset, replayed into Redis, first model trained
    day H        streamed through Kafka → worker → rankings (its completions feed the dataset)
    night        nightly retrain on the dataset the worker extended, promotion gate
    day H+1      the first submissions of the morning, to see which model the worker serves
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from leap_stream.tools.demo.fleet import (
    lookup_predictions,
    poison_events,
    simulate_fleet,
    stream_events,
)
from leap_stream.tools.demo.options import DemoOptions, WorkerDied, say
from leap_stream.tools.harness import WorkerProcess, free_port, wait_for, worker_env
from leap_stream.tools.observe import GroupWatch, RankingCollector, count_dead_letters

MARKER = ".leap-demo-state"  # the state folder is ours to wipe only when it carries this


# ------------------------------------------------------------------ services
def docker_answers(timeout: float = 5.0) -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        r = subprocess.run(["docker", "info"], capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def bring_up(mode: str) -> tuple[str, str, str]:
    """(bootstrap, redis_url, how to stop them). Native by default; Docker when asked (or
    `auto` and an engine answers), through the repository's docker-compose.yml."""
    use_docker = mode == "docker" or (mode == "auto" and docker_answers())
    if use_docker:
        from leap_stream.tools.dev import kafka, redis

        compose = Path(__file__).resolve().parents[2] / "docker-compose.yml"
        if not compose.exists() or not docker_answers():
            raise RuntimeError("--services docker: no Docker engine or no docker-compose.yml")
        # the compose file takes its passwords from the environment and has no defaults
        env = dict(os.environ)
        password = env.setdefault("LEAP_REDIS_PASSWORD", secrets.token_hex(16))
        env.setdefault("GRAFANA_ADMIN_PASSWORD", secrets.token_hex(12))
        subprocess.run(
            ["docker", "compose", "-f", str(compose), "up", "-d", "kafka", "redis"],
            check=True,
            env=env,
        )
        bootstrap, url = "localhost:29092", f"redis://:{password}@localhost:6379/0"
        wait_for("Kafka (docker)", lambda: kafka.is_ready(bootstrap), 120, 1.0)
        wait_for("Redis (docker)", lambda: redis.is_ready(url), 60, 1.0)
        return bootstrap, url, f"docker compose -f {compose} stop kafka redis"
    from leap_stream.tools.dev import ensure_services

    services = ensure_services()  # owner "cli": they stay up for the next run
    started = ", ".join(services.started) or "nothing, both were running"
    say(
        f"services: Kafka {services.kafka_bootstrap}, Redis {services.redis_url} (started {started})"
    )
    return services.kafka_bootstrap, services.redis_url, "leap-stream dev down"


# ------------------------------------------------------------------ the worker process
def model_versions(worker: WorkerProcess) -> dict[str, float]:
    """``leap_model_info`` by version; empty while the worker does not answer yet."""
    try:
        samples = worker.samples().get("leap_model_info", [])
    except OSError:
        return {}
    return {labels.get("version", ""): value for labels, value, _name in samples}


def cleanup(bootstrap: str, redis_url: str, topics: list[str], prefix: str) -> None:
    from leap_stream.store.connection import connect
    from leap_stream.tools.dev.topics import delete_topics

    try:
        delete_topics(bootstrap, topics)
    except Exception as exc:
        say(f"could not delete the run's topics: {exc}")
    try:
        r = connect(redis_url)
        batch: list[Any] = []
        for key in r.scan_iter(match=f"{prefix}*", count=2000):
            batch.append(key)
            if len(batch) >= 2000:
                r.delete(*batch)
                batch = []
        if batch:
            r.delete(*batch)
    except Exception as exc:
        say(f"could not delete the run's Redis keys: {exc}")


def _p(values: Any, q: float) -> float | None:
    v = np.asarray(values, np.float64)
    return round(float(np.percentile(v, q)) * 1000.0, 1) if len(v) else None


def _prepare_state(out: Path) -> Path:
    state = out / "state"
    if state.exists():
        if not (state / MARKER).exists():
            raise RuntimeError(f"{state} exists and was not made by the demo; pick another --out")
        shutil.rmtree(state)
    state.mkdir(parents=True)
    (state / MARKER).write_text("made by leap-stream demo; wiped at the next run\n")
    return state


# ------------------------------------------------------------------ the whole run
def run_demo(opts: DemoOptions) -> tuple[dict[str, Any], dict[str, Path]]:
    """The whole service on one machine (docs/demo.md): services and topics, a simulated
    history in both stores, the first model, the worker on one streamed day, the nightly
    retrain and its hot reload on the next morning, then the report."""
    demo = _Demo(opts)
    demo.set_up()
    try:  # nothing of this run may outlive a failure here either
        demo.seed_and_train()
    except BaseException:
        demo.clean_up()
        raise
    try:
        demo.start_worker()
        demo.stream_the_day()
        demo.retrain_and_reload()
        demo.collect()
    finally:
        demo.stop()
    return demo.write_report()


class _Demo:
    """One demo run's state, step by step (each step timed in ``steps``)."""

    def __init__(self, opts: DemoOptions) -> None:
        self.opts = opts
        self.t_start = time.perf_counter()
        self._t = self.t_start
        self.steps: dict[str, float] = {}
        self.out = opts.out.resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.state = _prepare_state(self.out)
        self.dataset_dir, self.registry_dir = self.state / "dataset", self.state / "registry"
        self.rid = datetime.now(UTC).strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.topics = {
            "submission": f"leap-demo-{self.rid}.job-submissions",
            "completion": f"leap-demo-{self.rid}.job-completions",
            "ranking": f"leap-demo-{self.rid}.rankings",
            "dead_letter": f"leap-demo-{self.rid}.dead-letter",
        }
        self.group, self.prefix = f"leap-demo-{self.rid}", f"leap-demo:{self.rid}:"
        self.collector: RankingCollector | None = None
        self.run: dict[str, Any] = {}

    def step(self, name: str) -> None:
        now = time.perf_counter()
        self.steps[name] = round(now - self._t, 2)
        self._t = now

    # --- before the worker
    def set_up(self) -> None:
        from leap_stream.tools.dev.topics import create_topics

        self.bootstrap, self.redis_url, self.stop_hint = bring_up(self.opts.services)
        create_topics(self.bootstrap, list(self.topics.values()), partitions=4)
        say(f"topics leap-demo-{self.rid}.*, group {self.group}, Redis prefix {self.prefix}")
        self.step("services_and_topics")

    def seed_and_train(self) -> None:
        from leap_stream.store.connection import connect
        from leap_stream.store.offline import DatasetSink, completions_from_frame, read_dataset
        from leap_stream.store.online import OnlineStore
        from leap_stream.tools.sim.events import submission_events
        from leap_stream.train.trainer import train_and_publish

        opts = self.opts
        say(
            f"simulating {opts.days_history} days of history + 2 (seed {opts.seed}, {opts.per_day}/day)"
        )
        self.fleet = fleet = simulate_fleet(opts)
        self.step("simulate")
        rows: list[dict[str, Any]] = fleet.history.to_dict("records")  # type: ignore[assignment]
        DatasetSink(self.dataset_dir).append(rows)
        store = OnlineStore(connect(self.redis_url), self.prefix)
        applied, measured = store.rebuild_history(completions_from_frame(fleet.history))
        if len(fleet.pending):
            store.remember_submissions(submission_events(fleet.pending))
        say(
            f"offline store: {len(fleet.history)} history rows; online store: {applied} completions "
            f"replayed ({measured} measurements), {len(fleet.pending)} running jobs remembered"
        )
        self.step("seed_stores")
        say("training the first model")
        self.first = train_and_publish(
            read_dataset(self.dataset_dir),
            self.registry_dir,
            holdout_days=opts.holdout_days,
            progress=opts.progress,
        )
        say(f"first model {self.first.get('version')}: {self.first.get('reason')}")
        self.step("train_first")

    def clean_up(self) -> None:
        if not self.opts.keep:
            cleanup(self.bootstrap, self.redis_url, list(self.topics.values()), self.prefix)

    # --- the worker
    def start_worker(self) -> None:
        env = worker_env(
            bootstrap=self.bootstrap,
            redis_url=self.redis_url,
            prefix=self.prefix,
            topics={
                "sub": self.topics["submission"],
                "comp": self.topics["completion"],
                "rank": self.topics["ranking"],
                "dlq": self.topics["dead_letter"],
            },
            group=self.group,
            home=self.state / "home",
            dataset_dir=self.dataset_dir,
            registry_dir=self.registry_dir,
            metrics_port=free_port(),
            settings={
                "LEAP_DATASET_FLUSH_S": "2",
                "LEAP_LAG_INTERVAL_S": "2",
                "LEAP_MODEL_POLL_S": "1",
                "LEAP_COMMIT_INTERVAL_S": "0.5",
                "LEAP_ORPHAN_GRACE_S": "5",
            },
        )
        self.worker = worker = WorkerProcess(env, self.state / "worker.log", loglevel="warning")
        worker.start()
        say(
            f"worker started (pid {worker.proc.pid if worker.proc else '?'}, log {worker.log_path})"
        )
        self.watch = GroupWatch(
            self.bootstrap, self.group, [self.topics["submission"], self.topics["completion"]]
        )

        def ready() -> bool:
            self.guard()
            return self.watch.stable() and bool(model_versions(worker))

        wait_for("the worker to join its group", ready, 90, 0.5)
        self.step("worker_start")
        self.collector = RankingCollector(self.bootstrap, self.topics["ranking"]).start()

    def guard(self) -> None:
        if not self.worker.alive():
            raise WorkerDied("the worker exited; its log ends with:\n" + self.worker.log_tail())

    def _wait_or_say(
        self, what: str, cond: Callable[[], bool], timeout: float, every: float = 0.5
    ) -> float | None:
        """`wait_for` that reports a time-out instead of failing the run (the report shows it)."""
        try:
            return wait_for(what, cond, timeout, every, guard=self.guard)
        except TimeoutError as exc:
            say(str(exc))
            return None

    def stream_the_day(self) -> None:
        from leap_stream.store.offline import read_dataset
        from leap_stream.tools.sim.events import timeline

        opts, fleet, collector = self.opts, self.fleet, self.collector
        assert collector is not None
        day = replace(fleet.result, submissions=fleet.stream_subs, completions=fleet.stream_comps)
        total = len(fleet.stream_subs) + len(fleet.stream_comps)
        rate = "as fast as possible" if opts.rate <= 0 else f"{opts.rate:.0f} events/s"
        say(
            f"streaming day {opts.days_history} ({fleet.day_start.date()}): {total} events at {rate}"
        )
        poison = poison_events(fleet.stream_comps) if opts.poison else []
        gate = {
            (str(j), int(a)): str(e)
            for j, a, e in zip(
                fleet.stream_subs["job_id"],
                fleet.stream_subs["attempt"],
                fleet.stream_subs["submission_event_id"],
                strict=True,
            )
        }
        self.stream = stream_events(
            self.bootstrap,
            self.topics,
            timeline(day),
            total,
            opts.rate,
            collector,
            opts.progress,
            poison,
            gate=gate,
        )
        sent_at = self.stream.pop("sent_at")
        self.step("stream")
        ids = set(sent_at)
        self._wait_or_say("every ranking", lambda: collector.has(ids), 120)
        self._wait_or_say("the worker to catch up (lag 0)", lambda: self.watch.lag() == 0, 120, 1.0)
        expected_rows = len(fleet.history) + len(fleet.stream_comps)
        self._wait_or_say(
            "the worker's dataset rows",
            lambda: len(read_dataset(self.dataset_dir)) >= expected_rows,
            30,
            1.0,
        )
        self.rankings, arrived, produced = collector.snapshot()
        got = [e for e in sent_at if e in arrived]
        self.latency_s = [arrived[e] - sent_at[e] for e in got]
        # split: until the worker produced the ranking (broker timestamp), then delivery to us
        to_worker = np.array([produced[e] - sent_at[e] for e in got])
        delivery = np.array([arrived[e] - produced[e] for e in got])
        self.run["latency_split_ms"] = {
            "until_ranking_produced_p50": _p(to_worker, 50),
            "until_ranking_produced_p99": _p(to_worker, 99),
            "delivery_to_scheduler_p50": _p(delivery, 50),
            "delivery_to_scheduler_p99": _p(delivery, 99),
        }
        self.step("drain")

    def retrain_and_reload(self) -> None:
        from leap_stream.store.offline import read_dataset
        from leap_stream.train.trainer import train_and_publish

        say("nightly retrain on the dataset the worker extended")
        dataset = read_dataset(self.dataset_dir)
        self.written = len(dataset) - len(self.fleet.history)
        self.retrain = retrain = train_and_publish(
            dataset,
            self.registry_dir,
            holdout_days=self.opts.holdout_days,
            progress=self.opts.progress,
        )
        verdict = "PROMOTED" if retrain.get("promoted") else "not promoted"
        say(f"retrain {retrain.get('version')} {verdict}: {retrain.get('reason')}")
        self.step("retrain")
        new_version, old_version = str(retrain.get("version")), str(self.first.get("version"))
        reload: dict[str, Any] = {"old_version": old_version, "new_version": new_version}
        if retrain.get("promoted"):
            try:
                reload["seconds_to_metrics"] = round(
                    wait_for(
                        "leap_model_info to show the new version",
                        lambda: model_versions(self.worker).get(new_version) == 1.0,
                        30,
                        0.25,
                    ),
                    2,
                )
            except TimeoutError as exc:
                reload["metrics_error"] = str(exc)
        reload["metrics_versions"] = model_versions(self.worker)
        versions = self._stream_the_morning()
        reload["morning_rankings_by_version"] = versions
        n_morning = len(self.fleet.morning)
        if retrain.get("promoted"):
            ok = reload.get("seconds_to_metrics") is not None and versions.get(new_version, 0) > 0
            reload["ok"] = ok
            reload["summary"] = (
                f"worker serves {new_version} ({'yes' if ok else 'NO'}): /metrics after "
                f"{reload.get('seconds_to_metrics', 'n/a')} s, {versions.get(new_version, 0)}/"
                f"{n_morning} morning rankings"
            )
        else:
            reload["ok"] = versions.get(old_version, 0) > 0
            reload["summary"] = (
                f"not promoted: worker keeps {old_version} "
                f"({versions.get(old_version, 0)}/{n_morning} morning rankings)"
            )
        self.reload = reload
        self.step("reload_check")

    def _stream_the_morning(self) -> dict[str, int]:
        """The next morning's submissions after the retrain: rankings by model version."""
        from leap_stream.tools.sim.events import timeline

        fleet, collector = self.fleet, self.collector
        assert collector is not None
        morning_ids = set(fleet.morning["submission_event_id"].astype(str))
        if len(fleet.morning):
            morning = replace(
                fleet.result,
                submissions=fleet.morning,
                completions=fleet.result.completions.iloc[0:0],
            )
            mo = stream_events(
                self.bootstrap,
                self.topics,
                timeline(morning),
                len(fleet.morning),
                self.opts.rate,
                collector,
                self.opts.progress,
                desc="next morning",
            )
            mo.pop("sent_at")
            try:
                wait_for("the morning's rankings", lambda: collector.has(morning_ids), 60)
            except TimeoutError as exc:
                say(str(exc))
        all_rankings, _, _ = collector.snapshot()
        versions: dict[str, int] = {}
        for r in all_rankings:
            if str(r["submission_event_id"]) in morning_ids:
                v = str(r.get("model_version"))
                versions[v] = versions.get(v, 0) + 1
        return versions

    def collect(self) -> None:
        from leap_stream.tools.demo.report import worker_metrics

        try:
            wait_for("the last commits", lambda: self.watch.lag() == 0, 30, 1.0)
        except TimeoutError as exc:
            say(str(exc))
        lag_end = self.watch.lag()
        try:
            self.run["worker_metrics"] = worker_metrics(self.worker.metrics_text())
        except OSError as exc:
            say(f"could not read the worker's /metrics: {exc}")
        dead = count_dead_letters(self.bootstrap, self.topics["dead_letter"])
        dead["injected"] = self.stream["poison"]
        first, retrain = self.first, self.retrain
        self.run.update(
            stream=self.stream,
            lag_end=lag_end,
            dead_letters=dead,
            dataset_rows_written=self.written,
            completions_streamed=len(self.fleet.stream_comps),
            first_model={
                k: first.get(k) for k in ("version", "rows", "promoted", "reason", "candidate")
            },
            retrain={
                k: retrain.get(k)
                for k in (
                    "version",
                    "rows",
                    "promoted",
                    "reason",
                    "candidate",
                    "current",
                    "gate_rows",
                )
            },
            reload=self.reload,
        )

    def stop(self) -> None:
        if self.collector is not None:
            self.collector.stop()
        worker = getattr(self, "worker", None)
        code = worker.stop() if worker is not None else None
        say(f"worker stopped (exit {code})")
        self.run["worker_exit"] = code
        self.clean_up()
        self.step("stop")

    # --- after the worker
    def write_report(self) -> tuple[dict[str, Any], dict[str, Path]]:
        from leap_stream.catalog import load_catalog
        from leap_stream.tools.demo import plots
        from leap_stream.tools.demo.html import render_html
        from leap_stream.tools.demo.report import DemoInputs, build_report, render_text
        from leap_stream.tools.pyplot import PlotsUnavailable

        opts, fleet, out = self.opts, self.fleet, self.out
        specs = load_catalog().spec_matrix()
        prices = {str(k): float(v) for k, v in specs["cost_per_device_hour"].items()}
        inputs = DemoInputs(
            submissions=fleet.stream_subs,
            completions=fleet.eval_comps,
            truth=fleet.eval_truth,
            rankings=self.rankings,
            lookup=lookup_predictions(fleet.history, fleet.stream_subs, fleet.eval_truth),
            latency_s=self.latency_s,
            prices=prices,
            run={
                "options": {
                    "days_history": opts.days_history,
                    "per_day": opts.per_day,
                    "rate": opts.rate,
                    "seed": opts.seed,
                    "holdout_days": opts.holdout_days,
                },
                "fleet": fleet.summary,
                "run_id": self.rid,
                **self.run,
            },
        )
        report, frames = build_report(inputs)
        try:
            images = plots.all_plots(report, frames, self.latency_s, out)
        except PlotsUnavailable as exc:  # the report stands without its pictures
            say(f"no plots: {exc}")
            images = {}
        self.step("report")
        report["steps_s"] = self.steps
        report["runtime_s"] = round(time.perf_counter() - self.t_start, 1)
        text = render_text(report)
        paths = dict(images)
        paths["json"] = out / "report.json"
        paths["json"].write_bytes(
            orjson.dumps(
                report,
                option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
            )
        )
        paths["html"] = out / "report.html"
        paths["html"].write_text(render_html(report, text, images))
        paths["text"] = out / "report.txt"
        paths["text"].write_text(text + "\n")
        report["_text"] = text
        report["_stop_hint"] = self.stop_hint
        return report, paths


__all__ = ["DemoOptions", "run_demo"]
