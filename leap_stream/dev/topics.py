"""The service's topics, created explicitly (brokers run with auto.create.topics.enable=false)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from leap_stream import config

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

TOPIC_ENVS = (
    "LEAP_TOPIC_SUBMISSIONS",
    "LEAP_TOPIC_COMPLETIONS",
    "LEAP_TOPIC_RANKINGS",
    "LEAP_TOPIC_DEAD_LETTER",
)


def configured_topics() -> list[str]:
    return [config.get(env) for env in TOPIC_ENVS]


def topic_config(name: str) -> dict[str, str]:
    """Per-topic settings: the dead-letter topic keeps its evidence longer than the event topics."""
    if name == config.get("LEAP_TOPIC_DEAD_LETTER"):
        return {"retention.ms": config.get("LEAP_DLQ_RETENTION_MS")}
    return {"retention.ms": config.get("LEAP_TOPIC_RETENTION_MS")}


def _admin(bootstrap: str | None) -> AdminClient:
    from confluent_kafka.admin import AdminClient

    conf: dict[str, str | int | float | bool] = dict(config.kafka_client_config(bootstrap))
    conf["log_level"] = 3  # errors only: no "connection refused" chatter while a broker starts
    return AdminClient(conf)


def create_topics(
    bootstrap: str | None = None,
    names: list[str] | None = None,
    partitions: int | None = None,
    replication: int | None = None,
    extra_config: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> dict[str, str]:
    """Create each topic unless it exists. Returns name -> "created" | "exists"."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    names = list(names or configured_topics())
    partitions = partitions or int(config.get("LEAP_TOPIC_PARTITIONS"))
    replication = replication or int(config.get("LEAP_TOPIC_REPLICATION"))
    admin = _admin(bootstrap)
    new = [
        NewTopic(
            n,
            num_partitions=partitions,
            replication_factor=replication,
            config={**topic_config(n), **(extra_config or {})},
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


def ensure_topics(
    bootstrap: str | None = None, names: list[str] | None = None, partitions: int | None = None
) -> list[str]:
    """Make sure the topics exist (the four configured ones by default); returns their names."""
    return list(create_topics(bootstrap, names, partitions))


def delete_topics(bootstrap: str | None, names: list[str], timeout: float = 30.0) -> None:
    from confluent_kafka import KafkaError, KafkaException

    admin = _admin(bootstrap)
    if not names:
        return
    for name, fut in admin.delete_topics(names, operation_timeout=timeout).items():
        try:
            fut.result()
        except KafkaException as e:
            err = e.args[0]
            if not (isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise RuntimeError(f"could not delete topic {name}: {err}") from e


__all__ = ["configured_topics", "create_topics", "delete_topics", "ensure_topics", "topic_config"]
