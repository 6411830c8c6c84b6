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
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients, produce_waiting
from leap_stream.tools.harness import WorkerProcess, free_port, wait_for, worker_env

KEY = ["job_id", "attempt"]
MARKER = ".leap-demo-state"  # the state folder is ours to wipe only when it carries this


@dataclass
class DemoOptions:
    out: Path = Path("demo-report")
    days_history: int = 7
    per_day: int = 10000
    rate: float = 250.0  # events/s produced to Kafka (0: as fast as possible)
    seed: int = 7
    morning: int = 300  # submissions of the next morning streamed after the retrain
    poison: bool = True  # a few bad events, to show the dead-letter path
    services: str = "native"  # native | docker | auto
    keep: bool = False  # keep the run's topics and Redis keys
    progress: bool = True
    holdout_days: float = 1.0  # nights the promotion gate holds out


def say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


class WorkerDied(RuntimeError):
    pass


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


# ------------------------------------------------------------------ the simulated fleet
@dataclass
class Fleet:
    history: pd.DataFrame  # dataset rows known before the streamed day (ended before it)
    pending: pd.DataFrame  # earlier submissions whose completion arrives during the day
    stream_subs: pd.DataFrame
    stream_comps: pd.DataFrame  # completions that end during the streamed day
    morning: pd.DataFrame  # submissions of the next morning
    eval_comps: pd.DataFrame  # every completion of the streamed day's submissions
    eval_truth: pd.DataFrame
    result: Any  # SimResult
    day_start: pd.Timestamp
    summary: dict[str, Any] = field(default_factory=dict)


def simulate_fleet(opts: DemoOptions) -> Fleet:
    from leap_stream.tools.sim.fleet import SimConfig, simulate

    cfg = SimConfig(seed=opts.seed, days=opts.days_history + 2, rate=opts.per_day)
    res = simulate(cfg)
    start = pd.Timestamp(datetime(cfg.start.year, cfg.start.month, cfg.start.day, tzinfo=UTC))
    t0 = start + pd.Timedelta(days=opts.days_history)
    t1 = t0 + pd.Timedelta(days=1)
    subs, comps, ds = res.submissions, res.completions, res.dataset
    sub_at = pd.to_datetime(subs["submitted_at"], utc=True)
    ended = pd.to_datetime(comps["ended_at"], utc=True)
    ds_ended = pd.to_datetime(ds["ended_at"], utc=True)
    stream_subs = subs[((sub_at >= t0) & (sub_at < t1)).to_numpy()].reset_index(drop=True)
    stream_comps = comps[((ended >= t0) & (ended < t1)).to_numpy()].reset_index(drop=True)
    keys = pd.MultiIndex.from_frame(stream_comps[KEY])
    early = subs[(sub_at < t0).to_numpy()]
    pending = early[pd.MultiIndex.from_frame(early[KEY]).isin(keys)].reset_index(drop=True)
    morning = subs[(sub_at >= t1).to_numpy()].head(opts.morning).reset_index(drop=True)
    day_keys = pd.MultiIndex.from_frame(stream_subs[KEY])
    eval_comps = comps[pd.MultiIndex.from_frame(comps[KEY]).isin(day_keys)].reset_index(drop=True)
    truth = res.truth
    eval_truth = truth[pd.MultiIndex.from_frame(truth[KEY]).isin(day_keys)].reset_index(drop=True)
    summary = res.summary()
    return Fleet(
        history=ds[(ds_ended < t0).to_numpy()].reset_index(drop=True),
        pending=pending,
        stream_subs=stream_subs,
        stream_comps=stream_comps,
        morning=morning,
        eval_comps=eval_comps,
        eval_truth=eval_truth,
        result=res,
        day_start=t0,
        summary={k: summary[k] for k in ("seed", "days", "start", "submissions", "lineages")},
    )


def lookup_predictions(
    history: pd.DataFrame, subs: pd.DataFrame, truth: pd.DataFrame
) -> pd.DataFrame:
    """The lookup baseline on every candidate of the streamed day, fitted on the same history
    the first model saw (the table the worker falls back to)."""
    from leap_stream.core.lookup import LookupTable

    table = LookupTable.fit(history)
    pairs = truth[[*KEY, "hardware_type"]].merge(
        subs[[*KEY, "model_type", "family", "num_devices"]], on=KEY
    )
    pred, _level = table.predict(
        pairs["model_type"], pairs["family"], pairs["hardware_type"], pairs["num_devices"]
    )
    return pairs[[*KEY, "hardware_type"]].assign(lookup=pred)


# ------------------------------------------------------------------ Kafka helpers
def _producer(bootstrap: str) -> Any:
    kafka = KafkaClients(bootstrap)
    return kafka.producer({"linger.ms": 2, "compression.type": "lz4", "enable.idempotence": True})


class RankingCollector:
    """Reads the rankings topic in a thread (`RankingsClient.poll_stamped`) and keeps the first
    arrival of each submission's ranking: the demo's latency is measured from these stamps."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.client = RankingsClient(
            KafkaClients(bootstrap), topic, consumer_extra={"fetch.wait.max.ms": 10}
        )
        self.rankings: list[dict[str, Any]] = []
        self.arrived: dict[str, float] = {}  # submission_event_id -> first arrival (epoch s)
        self.produced: dict[str, float] = {}  # ... -> the ranking's Kafka timestamp (epoch s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="rankings", daemon=True)

    @property
    def undecodable(self) -> int:
        return self.client.undecodable

    def start(self) -> RankingCollector:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            for arrival in self.client.poll_stamped(0.1):
                eid = arrival.ranking.get("submission_event_id")
                with self._lock:
                    self.rankings.append(arrival.ranking)
                    if eid is not None and eid not in self.arrived:
                        self.arrived[str(eid)] = arrival.arrived
                        self.produced[str(eid)] = arrival.produced

    def count(self) -> int:
        with self._lock:
            return len(self.arrived)

    def arrived_many(self, event_ids: list[str]) -> list[bool]:
        with self._lock:
            return [e in self.arrived for e in event_ids]

    def has(self, event_ids: set[str]) -> bool:
        with self._lock:
            return event_ids.issubset(self.arrived.keys())

    def snapshot(self) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, float]]:
        with self._lock:
            return list(self.rankings), dict(self.arrived), dict(self.produced)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


def poison_events(stream_comps: pd.DataFrame) -> list[tuple[str, str, bytes]]:
    """(topic kind, key, value): one undecodable, one against the schema, and a completion on a
    type its submission did not list (a completion_mismatch)."""
    from leap_stream.tools.sim.events import completion_lines

    out: list[tuple[str, str, bytes]] = [
        ("submission", "poison-not-json", b'{"job_id": "poison-1", '),
        ("submission", "poison-schema", orjson.dumps({"schema_version": 1, "job_id": "p-2"})),
    ]
    if len(stream_comps):
        ev = orjson.loads(completion_lines(stream_comps.head(1))[0])
        ev["event_id"] = "poison-hardware-not-a-candidate"
        ev["hardware_type"] = "tpu-v9-imaginary"
        out.append(("completion", str(ev["job_id"]), orjson.dumps(ev)))
    return out


def stream_events(
    bootstrap: str,
    topics: dict[str, str],
    events: Iterator[tuple[str, str, bytes]],
    total: int,
    rate: float,
    collector: RankingCollector,
    progress: bool,
    poison: list[tuple[str, str, bytes]] | None = None,
    desc: str = "streaming",
    gate: dict[tuple[str, int], str] | None = None,
    hold_timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Produce in time order at `rate` events/s; returns counts and submission send times.

    A job only runs once the scheduler has its ranking, so the completion of a submission in
    `gate` ((job_id, attempt) -> submission event_id) is held back until that ranking has
    arrived. Replayed faster than real time, a completion could otherwise reach the history
    before its own submission is ranked, and the ranking would "predict" its own measurement.
    """
    from tqdm import tqdm

    producer = _producer(bootstrap)
    sent_at: dict[str, float] = {}
    counts = {"submission": 0, "completion": 0, "poison": 0, "held": 0, "held_timeout": 0}
    poison = list(poison or [])
    poison_at = total // 3
    held: list[tuple[str, str, bytes, str]] = []
    bar = tqdm(
        total=total, desc=desc, unit="ev", file=sys.stderr, disable=not progress, mininterval=0.5
    )

    def send(kind: str, key: str, value: bytes) -> None:
        produce_waiting(producer, topics[kind], key, value)
        counts[kind] += 1
        bar.update(1)

    def release() -> None:
        nonlocal held
        if held:
            ready = collector.arrived_many([h[3] for h in held])
            for (kind, key, value, _eid), ok in zip(held, ready, strict=True):
                if ok:
                    send(kind, key, value)
            held = [h for h, ok in zip(held, ready, strict=True) if not ok]

    start = time.perf_counter()
    last_post = last_release = 0.0
    for i, (kind, key, value) in enumerate(events):
        if rate > 0:
            ahead = i / rate - (time.perf_counter() - start)
            if ahead > 0.002:
                time.sleep(ahead)
        if kind == "submission":
            sent_at[str(orjson.loads(value)["event_id"])] = time.time()
            send(kind, key, value)
        else:
            eid = None
            if gate:
                ev = orjson.loads(value)
                eid = gate.get((str(ev["job_id"]), int(ev["attempt"])))
            if eid is not None and not collector.arrived_many([eid])[0]:
                held.append((kind, key, value, eid))
                counts["held"] += 1
            else:
                send(kind, key, value)
        if poison and i >= poison_at:
            for pk, pkey, pval in poison:
                produce_waiting(producer, topics[pk], pkey, pval)
                counts["poison"] += 1
            poison = []
        now = time.perf_counter()
        if now - last_release > 0.02:
            release()
            last_release = now
        if progress and now - last_post > 0.5:
            bar.set_postfix(rankings=collector.count(), held=len(held), refresh=False)
            last_post = now
    deadline = time.monotonic() + hold_timeout_s
    while held and time.monotonic() < deadline:
        release()
        time.sleep(0.02)
    for kind, key, value, _eid in held:  # rankings that never came: the jobs run anyway
        send(kind, key, value)
        counts["held_timeout"] += 1
    remaining = producer.flush(60)
    elapsed = time.perf_counter() - start
    bar.set_postfix(rankings=collector.count(), held=0)
    bar.close()
    if remaining:
        raise RuntimeError(f"{remaining} events not delivered after 60 s")
    n = counts["submission"] + counts["completion"]
    return {
        "submissions": counts["submission"],
        "completions": counts["completion"],
        "poison": counts["poison"],
        "completions_held_for_ranking": counts["held"],
        "held_timeout": counts["held_timeout"],
        "seconds": round(elapsed, 2),
        "events_per_s": round(n / elapsed, 1) if elapsed > 0 else None,
        "sent_at": sent_at,
    }


def count_dead_letters(bootstrap: str, topic: str, idle_s: float = 3.0) -> dict[str, Any]:
    consumer = KafkaClients(bootstrap).consumer(
        f"leap-demo-dlq-{uuid.uuid4().hex[:8]}",
        {"enable.auto.commit": False, "auto.offset.reset": "earliest"},
    )
    consumer.subscribe([topic])
    kinds: dict[str, int] = {}
    n = 0
    last = time.monotonic()
    deadline = last + 60
    while time.monotonic() < deadline and time.monotonic() - last < idle_s:
        for msg in consumer.consume(num_messages=500, timeout=0.5):
            if msg.error() is not None:
                continue
            last = time.monotonic()
            n += 1
            try:
                kind = str(orjson.loads(msg.value() or b"")["error"]["kind"])
            except Exception:
                kind = "undecodable"
            kinds[kind] = kinds.get(kind, 0) + 1
    consumer.close()
    return {"count": n, "by_kind": kinds}


class GroupWatch:
    """One AdminClient for the run's group state and lag (clients are not cheap to make)."""

    def __init__(self, bootstrap: str, group: str, topics: list[str]) -> None:
        from leap_stream.stream.lag import LagReader, worker_groups

        submissions, completions = topics
        self.groups = worker_groups(group, submissions, completions)
        self._admin = KafkaClients(bootstrap).admin()
        self._lag = LagReader(KafkaClients(bootstrap), self.groups)

    def stable(self) -> bool:
        """The worker's groups have members and finished their rebalance (listing: describe
        can stall)."""
        from confluent_kafka import ConsumerGroupState

        try:
            listing = self._admin.list_consumer_groups(request_timeout=5).result(timeout=10)
        except Exception:
            return False
        stable = {g.group_id for g in listing.valid if g.state == ConsumerGroupState.STABLE}
        return set(self.groups.values()) <= stable

    def lag(self) -> int:
        from leap_stream.stream.lag import total_lag

        return int(total_lag(self._lag.read()))


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
