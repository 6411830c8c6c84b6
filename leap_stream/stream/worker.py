"""`leap-stream worker`: build the dependencies, check the topics, run the Faust worker.

A thin wrapper over ``faust.Worker``: SIGTERM/SIGINT go to Faust's graceful shutdown (finish
the batch in hand, flush, commit, exit 0); one that arrives while the worker still starts
stops it before it consumes anything, exit 0. A stop that outlives LEAP_STOP_DEADLINE_S ends the
process with status 4 (`StopDeadline`).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from leap_stream.settings import Settings
from leap_stream.store.online import OnlineStore, OnlineStoreUnavailable, eviction_problem
from leap_stream.stream.batch import SubmissionProcessor
from leap_stream.stream.clock import BrokerClock
from leap_stream.stream.deps import WorkerDeps
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.metrics import Metrics
from leap_stream.stream.models import RankerHolder

log = logging.getLogger(__name__)

# Exit status when a graceful stop outlived LEAP_STOP_DEADLINE_S (docs/worker.md "Shutdown").
EXIT_STOP_DEADLINE = 4


def missing_topics(kafka: KafkaClients, names: list[str], timeout: float = 15.0) -> list[str]:
    meta = kafka.admin().list_topics(timeout=timeout)
    return [n for n in names if n not in meta.topics or meta.topics[n].error is not None]


@dataclass
class RankingCore:
    """What ranks a submission, for the worker and for `leap-stream serve` alike."""

    metrics: Metrics
    store: OnlineStore
    holder: RankerHolder
    submissions: SubmissionProcessor

    def ready(self) -> dict[str, Any]:
        """/readyz of the worker and of `leap-stream serve`: a model is loaded and Redis
        answers a PING (the lookup table and an absent history would still rank, but worse)."""
        try:
            redis_ok = bool(self.store.r.ping())
        except Exception:
            redis_ok = False
        version = self.holder.version
        return {"ready": redis_ok and version is not None, "model": version, "redis": redis_ok}


class RefusedToStart(Exception):
    """A configuration the worker must not run with; the message says what to change."""


def check_eviction(store: OnlineStore, cfg: Settings) -> None:
    """Refuse a Redis that evicts keys (unless allowed); a Redis down now is checked later."""
    try:
        policy = store.eviction_policy()
    except OnlineStoreUnavailable as exc:
        log.warning("could not read Redis's maxmemory-policy (%s); checked again later", exc)
        return
    problem = eviction_problem(policy, cfg.redis_allow_eviction)
    if problem is not None:
        raise RefusedToStart(problem)
    if policy not in (None, "noeviction"):
        log.warning("Redis maxmemory-policy is %r (allowed by LEAP_REDIS_ALLOW_EVICTION)", policy)


def store_poll(store: OnlineStore, metrics: Metrics, cfg: Settings) -> Callable[[], None]:
    """What the worker watches on Redis: evictions (a gauge) and a policy changed since start."""
    warned: list[str] = []

    def poll() -> None:
        evicted = store.evicted_keys()
        if evicted is not None:
            metrics.redis_evicted_keys.set(evicted)
        policy = store.eviction_policy()
        problem = eviction_problem(policy, cfg.redis_allow_eviction)
        if problem is not None and policy not in warned:
            warned.append(str(policy))
            log.error("%s", problem)

    return poll


def ranking_core(cfg: Settings) -> RankingCore:
    """The catalog, the online store, the hot-reloaded model (its current one loaded now) and
    the submissions processor over them. Raises `RefusedToStart` on an evicting Redis."""
    from leap_stream.catalog import CatalogError, CatalogFile
    from leap_stream.store.registry import Registry
    from leap_stream.stream import compiled
    from leap_stream.stream.models import lookup_from_dataset

    metrics = Metrics()
    catalog_file = CatalogFile(cfg.catalog_file or None)
    try:
        catalog = catalog_file.load()
    except CatalogError as exc:
        raise RefusedToStart(f"LEAP_CATALOG_FILE: {exc}") from exc
    store = OnlineStore.of(cfg)
    check_eviction(store, cfg)
    holder = RankerHolder(
        catalog,
        Registry(cfg.registry_dir),
        metrics,
        lookup_from_dataset(cfg.dataset_dir),
        compile_trees=compiled.wanted(cfg.compiled_trees),
        catalog_file=catalog_file,
        explore_budget=cfg.explore_budget,
        probe=cfg.probe_settings(),
    )
    holder.poll()  # serve the current model from the first request on
    # the known types follow the serving ranker's catalog (hot-reloaded)
    processor = SubmissionProcessor(
        store, holder.get, max_bytes=cfg.max_message_bytes, window=cfg.time_window()
    )
    return RankingCore(metrics, store, holder, processor)


def build_deps(cfg: Settings, kafka: KafkaClients) -> WorkerDeps:
    from leap_stream.store.offline import DatasetSink
    from leap_stream.stream.completion_batch import CompletionProcessor
    from leap_stream.stream.lag import LagReader, worker_groups
    from leap_stream.stream.output import OutputProducer

    core = ranking_core(cfg)
    metrics, store = core.metrics, core.store
    sink = DatasetSink(cfg.dataset_dir)
    clock = BrokerClock(offset_s=cfg.fault_clock_offset_s)
    lag = LagReader(
        kafka, worker_groups(cfg.consumer_group, cfg.topic_submissions, cfg.topic_completions)
    )

    def lag_poll() -> None:
        for row in lag.read(ages=True, now=clock.now(clock.host())):
            labels = {"topic": row.topic, "partition": str(row.partition)}
            metrics.consumer_lag.labels(**labels).set(row.lag)
            metrics.consumer_lag_seconds.labels(**labels).set(row.age_s)

    return WorkerDeps(
        cfg=cfg,
        kafka=kafka,
        submissions=core.submissions,
        # no catalog check: a completion must name one of its submission's candidates
        # (checked in the store's script), so a type retired since keeps its history
        completions=CompletionProcessor(
            store,
            max_bytes=cfg.max_message_bytes,
            window=cfg.time_window(),
            specs=lambda: core.holder.get().spec_arrays,
        ),
        dataset_append=sink.append,
        make_output=lambda: OutputProducer(
            kafka,
            timeout_s=cfg.produce_timeout_s,
            max_message_bytes=cfg.max_message_bytes,
            on_reset=metrics.producer_resets.inc,
        ),
        metrics=metrics,
        model_poll=core.holder.poll,
        lag_poll=lag_poll,
        store_poll=store_poll(store, metrics, cfg),
        ready=core.ready,
        clock=clock,
    )


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="default LEAP_METRICS_PORT (0: off)"
    )
    parser.add_argument("-l", "--loglevel", default=None, help="log level (default LEAP_LOG_LEVEL)")


def run(args: argparse.Namespace, cfg: Settings) -> int:
    faulthandler.enable()  # a crash in a C extension prints every thread's stack
    level = (args.loglevel or cfg.log_level).lower()
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # from here a SIGTERM stops the worker cleanly, also while it starts (loading the model,
    # freezing the collector): an orchestrator sends it whenever it likes, and nothing is
    # consumed before the loop (or Faust, which takes the signals over) runs; the deadline
    # bounds how long that stop may take
    deadline = StopDeadline(cfg.stop_deadline_s)
    stop = stop_on_signals(deadline.arm)
    try:
        status = _run(args, cfg, level, stop, deadline)
    except SystemExit:
        raise  # Faust's exit: the deadline stays armed through the interpreter's shutdown
    except BaseException:
        deadline.cancel()
        raise
    deadline.cancel()
    return status


def _run(
    args: argparse.Namespace,
    cfg: Settings,
    level: str,
    stop: threading.Event,
    deadline: StopDeadline,
) -> int:
    import faust

    from leap_stream.stream.app import build_app, run_submissions_only

    kafka = KafkaClients.of(cfg, cfg.require_kafka())
    cfg.require_redis()
    missing = missing_topics(kafka, list(cfg.topics))
    if missing:
        print(
            f"missing topics {', '.join(missing)}: run `leap-stream topics create` first",
            file=sys.stderr,
        )
        return 2
    try:
        deps = build_deps(cfg, kafka)
    except RefusedToStart as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    deps.metrics.serve(
        cfg.metrics_port if args.metrics_port is None else args.metrics_port,
        cfg.metrics_addr,
        ready=deps.ready,
    )
    tune_gc(cfg)
    if not cfg.runs("completions"):  # nothing for Faust to consume: the loop alone
        return run_submissions_only(deps, stop)
    app = build_app(deps)
    worker = with_deadline(faust.Worker, deadline)(app, loglevel=level, redirect_stdouts=False)
    if stop.is_set():
        log.info("stopped while starting: nothing consumed")
        return 0
    worker.execute_from_commandline()  # raises SystemExit with Faust's exit status
    return 0


def tune_gc(cfg: Settings) -> None:
    """The garbage-collector policy of the worker and `serve`, applied once started: what start-up
    allocated (libraries, model, catalog) frozen out of the collector's reach
    (`LEAP_GC_FREEZE`), and young collections every `LEAP_GC_THRESHOLD` allocations. The bench
    applies it too, so that its pipeline stage costs what the worker's batches cost."""
    if cfg.gc_freeze:
        gc.collect()
        gc.freeze()
    _gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(cfg.gc_threshold, gen1, gen2)


def stop_on_signals(on_signal: Callable[[], None] = lambda: None) -> threading.Event:
    """An event SIGTERM and SIGINT set (after calling ``on_signal``): the graceful stop of a
    worker without Faust, and of any worker still starting (Faust takes the signals over once
    it runs)."""
    stop = threading.Event()

    def handle(_signum: int, _frame: object) -> None:
        on_signal()
        stop.set()

    stop_signals = (signal.SIGTERM, signal.SIGINT)
    for sig in stop_signals:
        signal.signal(sig, handle)
    # the CLI blocks them while it imports the worker (cli.HOLDS_STOP_SIGNALS): one that came
    # meanwhile is delivered now, to `handle`
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    return stop


class StopDeadline:
    """Ends the process when a graceful stop takes longer than ``seconds`` (0: never).

    A stop can wait on something outside our code (Faust's consumer joining its group, say),
    and an orchestrator kills the worker after its grace period anyway. Ending it
    here first says why: a log line, every thread's stack, exit status EXIT_STOP_DEADLINE.
    Nothing is lost either way, as with a SIGKILL: offsets are committed only for durable work,
    so the next worker redoes the rest. ``arm`` and ``cancel`` run on the main thread (signal
    handlers, Faust's loop), so they need no lock."""

    def __init__(self, seconds: float, exit: Callable[[int], object] = os._exit) -> None:
        self.seconds = seconds
        self._exit = exit
        self._timer: threading.Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def arm(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the countdown; only the first call of a stop does. With the event loop that
        stops (Faust's), its waiting tasks are printed too: a coroutine that waits is on no
        thread's stack."""
        if self.seconds <= 0 or self._timer is not None:
            return
        self._loop = loop
        self._timer = threading.Timer(self.seconds, self._expire)
        self._timer.name = "leap-stop-deadline"
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        """The stop finished in time (a worker that returns rather than exiting the process)."""
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        try:  # the diagnosis is best effort; the exit is not
            log.error(
                "the stop took longer than LEAP_STOP_DEADLINE_S=%g s: exiting with status %d, "
                "the next worker redoes what was not committed; every thread's stack follows",
                self.seconds,
                EXIT_STOP_DEADLINE,
            )
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            if self._loop is not None:
                _print_tasks(self._loop)
        finally:
            self._exit(EXIT_STOP_DEADLINE)


def _print_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Every unfinished task of ``loop`` with where it waits, on stderr. Read from another
    thread while the loop runs: a diagnosis on the way out, so a task list that changes under
    it is skipped rather than retried."""
    try:
        tasks = asyncio.all_tasks(loop)
    except RuntimeError:
        return
    for task in tasks:
        print(f"Task {task.get_name()} (innermost await last):", file=sys.stderr)
        for frame in _awaited_frames(task.get_coro()):
            code = frame.f_code
            where = f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
            print(where, file=sys.stderr)
    sys.stderr.flush()


def _awaited_frames(coro: object) -> Iterator[FrameType]:
    """The frames of a suspended coroutine and of what it awaits, outermost first (a task's
    own stack stops at its first frame)."""
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def with_deadline(worker_class: type[Any], deadline: StopDeadline) -> type[Any]:
    """``worker_class`` (faust.Worker, or any mode.Worker) whose stop signals also arm
    ``deadline``: Faust installs its own handlers in place of `stop_on_signals`."""

    class DeadlineWorker(worker_class):
        def _schedule_shutdown(self, signum: signal.Signals) -> None:
            deadline.arm(self.loop)
            super()._schedule_shutdown(signum)

    return DeadlineWorker


__all__ = [
    "EXIT_STOP_DEADLINE",
    "RankingCore",
    "RefusedToStart",
    "StopDeadline",
    "build_deps",
    "missing_topics",
    "ranking_core",
    "register",
    "run",
    "stop_on_signals",
    "tune_gc",
    "with_deadline",
]
