"""What the worker's agents use (`WorkerDeps`, built by the worker command or a test), and
what both do with their outputs: publish them, count their dead letters, leave with status 3
when they cannot be made durable."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import orjson

from leap_stream.contracts import DeadLetter, HardwareRanking
from leap_stream.settings import Settings
from leap_stream.stream.batch import SubmissionProcessor
from leap_stream.stream.clock import BrokerClock
from leap_stream.stream.completion_batch import CompletionBatchResult, CompletionProcessor
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.metrics import Metrics
from leap_stream.stream.output import OutputProducer

log = logging.getLogger(__name__)
T = TypeVar("T")


# Exit status when the worker had to stop with work it could not make durable (e.g. SIGTERM
# while Redis is down): the offsets of that work are not committed and it is redone on restart.
EXIT_UNFINISHED = 3


def dead_letter_key(dl: DeadLetter) -> bytes:
    s = dl["source"]
    return f"{s['topic']}/{s['partition']}/{s['offset']}".encode()


@dataclass
class WorkerDeps:
    """Everything the agents use, built by the worker command (or a test) before the app starts."""

    cfg: Settings
    kafka: KafkaClients
    submissions: SubmissionProcessor
    completions: CompletionProcessor
    dataset_append: Callable[[list[dict[str, Any]]], object]
    make_output: Callable[[], OutputProducer]  # one producer per agent (see send_all)
    metrics: Metrics
    model_poll: Callable[[], object] | None = None  # runs in a thread; hot reload
    lag_poll: Callable[[], object] | None = None  # runs in a thread; updates the lag gauge
    store_poll: Callable[[], object] | None = None  # runs in a thread; Redis evictions
    ready: Callable[[], dict[str, Any]] | None = None  # /readyz (RankingCore.ready)
    retry_cap_s: float = 10.0
    stats: dict[str, float] = field(default_factory=dict)
    # the time events are judged by: the host's, or the broker's where the host is behind
    clock: BrokerClock = field(default_factory=BrokerClock)


def send_all(
    out: OutputProducer,
    topics: Settings,
    rankings: Sequence[HardwareRanking],
    dead: Sequence[DeadLetter],
) -> int:
    """Publish rankings and dead letters and wait until the broker has them all."""
    for r in rankings:
        out.send(topics.topic_rankings, str(r["job_id"]).encode(), orjson.dumps(r))
    for dl in dead:
        out.send(topics.topic_dead_letter, dead_letter_key(dl), orjson.dumps(dl))
    return out.flush()


def count_dead(m: Metrics, topic: str, dead: Sequence[DeadLetter]) -> None:
    for dl in dead:
        m.dead_letter.labels(topic=topic, kind=dl["error"]["kind"]).inc()


def count_applied(m: Metrics, res: CompletionBatchResult) -> None:
    """What applying completions did (on arrival or at a late join): duplicates, quarantines."""
    m.completions_duplicate.inc(res.duplicates)
    for rule, n in res.quarantined.items():
        m.quarantined.labels(rule=rule).inc(n)
    m.aggregate_held.inc(res.aggregate_held)
    m.probe_completions.inc(res.probes)
    m.observe_online(res.online)


def exit_unfinished(outputs: list[OutputProducer]) -> NoReturn:
    """Leave now with status 3: what is not durable stays uncommitted and is redone."""
    for out in outputs:
        out.close(5.0)
    os._exit(EXIT_UNFINISHED)
