"""The worker's Faust app: the completions agent, the submissions loop as a task, two timers.

Faust owns the completions' consumption, group membership and offset commits; the agent owns
durability. It reads with ``stream.noack()`` so that nothing is acked implicitly: an event is
acked only after every output it caused is durable (dead letters acknowledged by the broker,
dataset rows fsynced, history applied in Redis). Faust commits only acked offsets, handed to it
in offset order (`OrderedAcks`), so a crash anywhere repeats work and never loses it
(docs/worker.md). The submissions are read by `SubmissionLoop` on librdkafka, which keeps the
same contract for its own consumer group.

The blocking work of a completions batch (Redis round trip, Parquet write, producer flush) runs
in a single-thread executor: the event loop keeps fetching meanwhile, and batches stay in order.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import faust

from leap_stream.settings import Settings
from leap_stream.stream.acks import ExplicitAcks, seek_every_partition
from leap_stream.stream.batch import (
    Record,
    SubmissionBatchResult,
)
from leap_stream.stream.completions import CompletionsAgent
from leap_stream.stream.deps import WorkerDeps, count_dead, exit_unfinished, send_all
from leap_stream.stream.metrics import LATENCY_CEILING_S
from leap_stream.stream.output import OutputProducer
from leap_stream.stream.submission_loop import SubmissionLoop

log = logging.getLogger(__name__)
T = TypeVar("T")
# Most submission events held unacked while Redis is down (then the oldest are acked anyway,
# matching SubmissionProcessor.MAX_PENDING_REMEMBER).
MAX_HELD = 100_000


def faust_broker_url(bootstrap: str) -> str:
    """'a:9092,b:9092' → 'kafka://a:9092;b:9092' (Faust's multi-host URL form)."""
    hosts = [h.strip() for h in bootstrap.split(",") if h.strip()]
    return ";".join(f"kafka://{h}" if "://" not in h else h for h in hosts)


def faust_credentials(cfg: Settings) -> Any:
    """SASL/SSL credentials for Faust's aiokafka clients, from the same settings librdkafka uses."""
    protocol = cfg.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=cfg.kafka_ssl_cafile or None)
        if cfg.kafka_ssl_certfile:
            context.load_cert_chain(cfg.kafka_ssl_certfile, cfg.kafka_ssl_keyfile or None)
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    return faust.SASLCredentials(
        username=cfg.kafka_sasl_username,
        password=cfg.kafka_sasl_password,
        mechanism=cfg.kafka_sasl_mechanism or "PLAIN",
        ssl_context=context,
    )


class LeanApp(faust.App):
    """A Faust app without its built-in Monitor sensor.

    The Monitor keeps Faust's own per-message statistics (for its web view, which is off);
    it runs several hooks per message on the event loop, on the same GIL as the batch thread.
    The worker's metrics are its own (stream/metrics.py). Its consumer records only the acks
    the worker gives (``explicit_acks``), and after a rebalance it seeks every partition, also one
    without a commit (``seek_every_partition``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.explicit_acks = ExplicitAcks()
        super().__init__(*args, **kwargs)

    def on_init_dependencies(self) -> Any:
        services = super().on_init_dependencies()
        self.sensors.remove(self.monitor)
        return services

    def _new_consumer(self) -> Any:
        return seek_every_partition(self.explicit_acks.install(super()._new_consumer()))


def tune_consumer(min_bytes: int, max_wait_ms: int) -> None:
    """Settings Faust does not pass to the aiokafka consumer it creates (the completions').

    - ``read_committed``: Faust asks for it only in its own exactly-once mode, so records of an
      aborted producer transaction were applied to the history. The submissions consumer
      (librdkafka) reads committed records by default.
    - fetch_min_bytes / fetch_max_wait_ms: Faust hard-codes fetch_max_wait_ms=1500 and leaves
      fetch_min_bytes at 1, so each fetch returns as soon as one record is there, and each costs
      Python work in the consumer thread and a hop to the event loop (~0.3 ms of GIL at 300/s,
      most of it per fetch, not per record). A larger minimum with a short wait lets a fetch
      carry several records."""
    from faust.transport.drivers import aiokafka as driver

    cls: Any = driver.AIOKafkaConsumerThread
    original = getattr(cls, "_leap_original_create", None) or cls._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        # read by AIOKafkaConsumer.start() when it builds its Fetcher
        consumer._isolation_level = "read_committed"
        consumer._fetch_min_bytes = min_bytes
        consumer._fetch_max_wait_ms = max_wait_ms
        return consumer

    cls._leap_original_create = original
    cls._create_worker_consumer = create


def new_faust_app(deps: WorkerDeps) -> LeanApp:
    """The Faust app of the completions: raw bytes, no tables, commits only what is acked."""
    cfg = deps.cfg
    datadir = cfg.home / "faust" / cfg.consumer_group
    datadir.mkdir(parents=True, exist_ok=True)
    tune_consumer(cfg.fetch_min_bytes, cfg.completions_fetch_max_wait_ms)
    session_s = cfg.kafka_session_timeout_s
    return LeanApp(
        cfg.consumer_group,
        broker=faust_broker_url(deps.kafka.bootstrap),
        broker_credentials=faust_credentials(cfg),
        key_serializer="raw",
        value_serializer="raw",
        # State lives in Redis: no tables, no changelogs, no leader topic. The broker runs with
        # auto.create.topics.enable=false and topics come from `leap-stream topics create`.
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        datadir=str(datadir),
        consumer_auto_offset_reset="earliest",
        # a rebalance does not wait for the batch in hand: what it has not acked stays
        # uncommitted and the partition's next owner redoes it (completions are deduplicated)
        stream_wait_empty=False,
        broker_commit_interval=cfg.commit_interval_s,
        broker_commit_every=cfg.batch_size,
        # a crashed worker's partitions move after this long (aiokafka heartbeats from the
        # event loop, which the executor keeps free, so a long batch does not trip it)
        broker_session_timeout=session_s,
        broker_heartbeat_interval=min(3.0, session_s / 3),
        stream_buffer_maxsize=max(4 * cfg.batch_size, 4096),
        broker_max_poll_records=cfg.batch_size,
        # partitions added to the topic are assigned this soon (aiokafka's default: 5 minutes)
        consumer_metadata_max_age_ms=int(cfg.metadata_refresh_s * 1000),
        producer_acks=-1,
        autodiscover=False,
    )


def observe_submissions(
    deps: WorkerDeps, records: list[Record], res: SubmissionBatchResult, took: float
) -> None:
    """Metrics of a submission batch, once its outputs are durable."""
    m, topic, stats = deps.metrics, deps.cfg.topic_submissions, deps.stats
    skew = deps.clock.skew()
    if skew is not None:
        m.clock_skew.set(skew)
    m.events_in.labels(topic=topic, outcome="valid").inc(res.valid)
    m.events_in.labels(topic=topic, outcome="invalid").inc(len(records) - res.valid)
    count_dead(m, topic, res.dead_letters)
    if res.redis_error is not None:
        if res.redis_error != "backoff":
            m.redis_errors.labels(op="read_and_remember").inc()
        m.history_unavailable.inc(len(res.rankings))
    # one counter update per label value, not per ranking (a label look-up takes a lock)
    sources = Counter(r["source"] for r in res.rankings)
    for source, n in sources.items():
        m.rankings_out.labels(source=source).inc(n)
    fallbacks = Counter(r["reason"] for r in res.rankings if r["source"] != "model")
    for reason, n in fallbacks.items():
        m.fallback.labels(reason=reason).inc(n)
    for r in res.rankings:
        m.ranking_latency.observe(min(max(0.0, float(r["latency_ms"]) / 1000.0), LATENCY_CEILING_S))
        if "explore" in r:
            m.explore_cost.observe(r["explore"]["expected_extra_cost"])
        if "probe" in r:
            m.probe_cost.observe(r["probe"]["cost"])
            m.probe_saving.inc(r["probe"]["expected_saving"])
    m.observe_coverage(len(res.rankings), len(res.rankings) - sources["none"])
    m.batch_size.labels(agent="submissions").observe(len(records))
    m.batch_seconds.labels(agent="submissions").observe(took)
    stats["submissions_in"] = stats.get("submissions_in", 0) + len(records)
    stats["rankings_out"] = stats.get("rankings_out", 0) + len(res.rankings)


def submission_loop(deps: WorkerDeps, out: OutputProducer) -> SubmissionLoop:
    """The submissions loop of a worker, publishing through ``out`` (its own producer)."""
    cfg = deps.cfg
    return SubmissionLoop(
        kafka=deps.kafka,
        group=cfg.consumer_group,
        topic=cfg.topic_submissions,
        processor=deps.submissions,
        send=lambda rankings, dead: send_all(out, cfg, rankings, dead),
        on_batch=lambda records, res, took: observe_submissions(deps, records, res, took),
        on_store_error=lambda op: deps.metrics.redis_errors.labels(op=op).inc(),
        on_replace=lambda _why: deps.metrics.consumer_replaced.inc(),
        batch_size=cfg.batch_size,
        max_held=MAX_HELD,
        retry_cap_s=deps.retry_cap_s,
        stall_s=cfg.consumer_stall_s,
        session_timeout_s=cfg.kafka_session_timeout_s,
        commit_interval_s=cfg.commit_interval_s,
        fetch_max_wait_ms=cfg.fetch_max_wait_ms,
        extra={"topic.metadata.refresh.interval.ms": int(cfg.metadata_refresh_s * 1000)},
        clock=deps.clock,
    )


def polls(deps: WorkerDeps) -> list[tuple[str, float, Callable[[], object]]]:
    """The worker's periodic side work: (name, interval, function), each run in a thread of its
    own (a model that takes minutes to load or compile must not freeze the lag gauge)."""
    cfg = deps.cfg
    found = (
        ("model poll", cfg.model_poll_s, deps.model_poll),
        ("lag poll", cfg.lag_interval_s, deps.lag_poll),
        ("store poll", cfg.lag_interval_s, deps.store_poll),
    )
    return [(name, interval, poll) for name, interval, poll in found if poll is not None]


def poll_in_thread(
    name: str, interval: float, poll: Callable[[], object], stop: threading.Event
) -> threading.Thread:
    """Run ``poll`` every ``interval`` seconds in a daemon thread of its own until ``stop`` is
    set; what it raises is logged and the next round comes (the polls of a process without
    Faust's timers: a submissions-only worker, `leap-stream serve`)."""

    def every() -> None:
        while not stop.wait(interval):
            try:
                poll()
            except Exception as exc:
                log.warning("%s failed: %r", name, exc)

    thread = threading.Thread(target=every, name=f"leap-{name.split()[0]}", daemon=True)
    thread.start()
    return thread


def run_submissions_only(deps: WorkerDeps, stop: threading.Event) -> int:
    """A worker with LEAP_WORKER_ROLES=submissions: the submissions loop and the polls, without
    Faust (which has nothing to consume then). Runs until ``stop`` is set (SIGTERM) or the loop
    fails; exit status as the full worker's: 0, or 3 when work was left unfinished."""
    out = deps.make_output()
    loop = submission_loop(deps, out)
    for name, interval, poll in polls(deps):
        poll_in_thread(name, interval, poll, stop)
    loop.start()
    while loop.running and not stop.wait(0.25):
        pass
    loop.stop()
    stop.set()
    if loop.unfinished:
        exit_unfinished([out])
    out.close()
    if loop.error is not None:
        log.error("submissions loop failed: %r", loop.error)
        return 1
    return 0


def build_app(deps: WorkerDeps) -> faust.App:
    """The worker: the completions agent, the submissions loop (unless LEAP_WORKER_ROLES leaves
    it out), the model and lag timers. A process without the completions role never gets here
    (`run_submissions_only`: Faust would have nothing to consume)."""
    cfg = deps.cfg
    app = new_faust_app(deps)
    # one producer per consumer of the input, each used from one thread only: a flush then
    # covers exactly that side's records and delivery reports
    comp_out = deps.make_output()
    agent = CompletionsAgent(app, deps, comp_out)
    topic = app.topic(cfg.topic_completions, key_type=bytes, value_type=bytes, internal=False)
    app.agent(topic)(agent.consume)
    # a completions-only process (LEAP_WORKER_ROLES) builds no submissions side at all
    sub_out = deps.make_output() if cfg.runs("submissions") else None
    sub_loop = submission_loop(deps, sub_out) if sub_out is not None else None

    async def submissions_loop() -> None:
        assert sub_loop is not None
        sub_loop.start()
        while sub_loop.running:
            await asyncio.sleep(0.25)
        if sub_loop.error is not None:
            await app.crash(sub_loop.error)

    if sub_loop is not None:
        app.task(submissions_loop)
    # a thread each: a model that takes minutes to load or compile must not freeze the lag
    # gauge, which is what on-call reads when something is slow
    for name, interval, poll in polls(deps):
        own = ThreadPoolExecutor(1, thread_name_prefix=f"leap-{name.split()[0]}")
        app.timer(interval, name=name)(_in_aux(own, name, poll))

    async def close(app_: Any, **_kw: Any) -> None:
        agent.stopping.set()
        # finish the batch in hand, commit what is durable, leave the group
        if sub_loop is not None and sub_out is not None:
            await asyncio.get_running_loop().run_in_executor(None, sub_loop.stop)
            if sub_loop.unfinished:
                exit_unfinished([sub_out, comp_out])
        await agent.flush(force=True)
        if sub_out is not None:
            sub_out.close()
        await asyncio.get_running_loop().run_in_executor(agent.pool, comp_out.close)

    app.on_before_shutdown.connect(close)  # type: ignore[arg-type]
    return app


def _in_aux(
    pool: ThreadPoolExecutor, name: str, poll: Callable[[], object]
) -> Callable[[], Coroutine[Any, Any, None]]:
    """A timer body that runs ``poll`` in ``pool`` (its own thread) and logs what it raises."""

    async def tick() -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(pool, poll)
        except Exception as exc:
            log.warning("%s failed: %r", name, exc)

    tick.__name__ = tick.__qualname__ = name.replace(" ", "_")
    return tick


__all__ = [
    "build_app",
    "faust_broker_url",
    "poll_in_thread",
    "polls",
    "run_submissions_only",
    "submission_loop",
]
