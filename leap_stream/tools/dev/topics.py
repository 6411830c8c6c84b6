"""The service's topics, created explicitly (brokers run with auto.create.topics.enable=false)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from leap_stream.settings import Settings
from leap_stream.stream.kafka import KafkaClients

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient


def topic_config(name: str, cfg: Settings) -> dict[str, str]:
    """Per-topic settings: the dead-letter topic keeps its evidence longer than the event topics."""
    if name == cfg.topic_dead_letter:
        return {"retention.ms": str(cfg.dlq_retention_ms)}
    return {"retention.ms": str(cfg.topic_retention_ms)}


def _admin(bootstrap: str | None, cfg: Settings) -> AdminClient:
    # errors only: no "connection refused" chatter while a broker starts
    admin: AdminClient = KafkaClients.of(cfg, bootstrap).admin({"log_level": 3})
    return admin


def create_topics(
    bootstrap: str | None = None,
    names: list[str] | None = None,
    partitions: int | None = None,
    replication: int | None = None,
    extra_config: dict[str, str] | None = None,
    timeout: float = 30.0,
    cfg: Settings | None = None,
) -> dict[str, str]:
    """Create each topic (the worker's four by default) unless it exists.

    Returns name -> "created" | "exists"."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    cfg = cfg or Settings.from_env()
    names = list(names or cfg.topics)
    partitions = partitions or cfg.topic_partitions
    replication = replication or cfg.topic_replication
    admin = _admin(bootstrap, cfg)
    new = [
        NewTopic(
            n,
            num_partitions=partitions,
            replication_factor=replication,
            config={**topic_config(n, cfg), **(extra_config or {})},
        )
        for n in names
    ]
    futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
    outcome: dict[str, str] = {}
    for name, fut in futures.items():
        try:
            fut.result()
            outcome[name] = "created"
        except KafkaException as e:
            err = e.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                outcome[name] = "exists"
            else:
                raise RuntimeError(f"could not create topic {name}: {err}") from e
    _wait_visible(admin, names, timeout)
    return {n: outcome[n] for n in names}


def _wait_visible(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait until metadata lists every partition with a leader, so a produce right after works."""
    deadline = time.monotonic() + timeout
    missing = list(names)
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=5)
        missing = [
            n
            for n in names
            if n not in md.topics
            or md.topics[n].error is not None
            or any(p.leader < 0 for p in md.topics[n].partitions.values())
        ]
        if not missing:
            return
        time.sleep(0.1)
    raise RuntimeError(f"topics not visible after {timeout:.0f} s: {missing}")


def delete_topics(
    bootstrap: str | None, names: list[str], timeout: float = 30.0, cfg: Settings | None = None
) -> None:
    from confluent_kafka import KafkaError, KafkaException

    admin = _admin(bootstrap, cfg or Settings.from_env())
    if not names:
        return
    for name, fut in admin.delete_topics(names, operation_timeout=timeout).items():
        try:
            fut.result()
        except KafkaException as e:
            err = e.args[0]
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise RuntimeError(f"could not delete topic {name}: {err}") from e


__all__ = ["create_topics", "delete_topics", "topic_config"]
