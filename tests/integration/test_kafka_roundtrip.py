"""Produce/consume through the real broker the fixtures provide, and topic creation."""

from __future__ import annotations

import time

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from leap_stream.cli import main
from leap_stream.settings import Settings
from leap_stream.tools.dev.topics import create_topics, delete_topics

pytestmark = pytest.mark.services

BIG = 10 * 1024 * 1024  # the fault tests' oversized event must reach the worker


def _consume(
    bootstrap: str, topic: str, n: int, timeout: float = 60.0
) -> list[tuple[bytes, bytes]]:
    consumer = Consumer(
        {
            **Settings.from_env().kafka_client_config(bootstrap),
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
        }
    )
    consumer.subscribe([topic])
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                continue
            got.append((msg.key() or b"", msg.value() or b""))
    finally:
        consumer.close()
    return got


def test_round_trip_keeps_order_and_carries_a_10mb_message(
    kafka_bootstrap: str, topic_factory
) -> None:
    topic = topic_factory("roundtrip", partitions=1)
    producer = Producer(
        {
            **Settings.from_env().kafka_client_config(kafka_bootstrap),
            "message.max.bytes": 16 * 1024 * 1024,
        }
    )
    events = [{"job_id": f"j{i}", "i": i} for i in range(200)]
    for e in events:
        producer.produce(topic, key=e["job_id"].encode(), value=orjson.dumps(e))
    producer.produce(topic, key=b"big", value=b"x" * BIG)
    assert producer.flush(30) == 0

    got = _consume(kafka_bootstrap, topic, len(events) + 1)
    assert [orjson.loads(v) for _k, v in got[:-1]] == events
    assert [k for k, _v in got[:-1]] == [e["job_id"].encode() for e in events]
    assert got[-1][0] == b"big" and len(got[-1][1]) == BIG


def test_create_topics_is_idempotent(kafka_bootstrap: str) -> None:
    name = f"test.idem.{time.time_ns()}"
    try:
        assert create_topics(kafka_bootstrap, [name], partitions=3) == {name: "created"}
        assert create_topics(kafka_bootstrap, [name], partitions=3) == {name: "exists"}
        from confluent_kafka.admin import AdminClient

        md = AdminClient(Settings.from_env().kafka_client_config(kafka_bootstrap)).list_topics(
            name, timeout=10
        )
        assert len(md.topics[name].partitions) == 3
    finally:
        delete_topics(kafka_bootstrap, [name])


def test_topics_create_cli(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    names = [f"test.cli.{time.time_ns()}.{i}" for i in range(2)]
    try:
        argv = ["topics", "create", "--bootstrap", kafka_bootstrap, "--partitions", "2", *names]
        assert main(argv) == 0
        first = capsys.readouterr().out
        assert main(argv) == 0
        second = capsys.readouterr().out
    finally:
        delete_topics(kafka_bootstrap, names)
    assert [line.split()[:2] for line in first.splitlines()] == [["created", n] for n in names]
    assert [line.split()[:2] for line in second.splitlines()] == [["exists", n] for n in names]


def test_auto_create_is_off_on_the_native_broker(kafka_bootstrap: str) -> None:
    """The service creates its topics explicitly; a typo in a topic name must not create one."""
    import os

    from leap_stream.tools.dev import state

    st = state.load_state(state.Paths.from_env(), "kafka")
    if (
        st is None
        or st.address != kafka_bootstrap
        or os.environ.get("LEAP_KAFKA_AUTO_CREATE_TOPICS")
    ):
        pytest.skip("broker not started by leap_stream.tools.dev with default settings")
    producer = Producer(
        {**Settings.from_env().kafka_client_config(kafka_bootstrap), "message.timeout.ms": 1000}
    )
    errors: list[KafkaError] = []
    producer.produce(
        f"test.nonexistent.{time.time_ns()}", value=b"x", on_delivery=lambda e, _m: errors.append(e)
    )
    producer.flush(10)
    assert errors and errors[0] is not None
