"""The lag reader against the real broker: partitions added while it runs, lag in seconds."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.lag import METADATA_REFRESH_MS, LagReader

pytestmark = pytest.mark.services


def _produce(bootstrap: str, topic: str, partition: int, n: int, ts_ms: int | None = None) -> None:
    producer = KafkaClients(bootstrap).producer()
    for i in range(n):
        kwargs: dict[str, Any] = {"partition": partition}
        if ts_ms is not None:
            kwargs["timestamp"] = ts_ms
        producer.produce(topic, value=b"%d" % i, **kwargs)
    assert producer.flush(30) == 0


def test_added_partitions_reach_the_reading_within_a_minute(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    """It used to raise "Unknown partition" for 5-15 minutes after `--alter --partitions`
    (librdkafka's metadata refresh), so the worker's lag gauge froze exactly then."""
    from confluent_kafka.admin import NewPartitions

    topic = topic_factory("lag-grow", partitions=1)
    _produce(kafka_bootstrap, topic, 0, 3)
    reader = LagReader(KafkaClients(kafka_bootstrap), f"g-{os.urandom(4).hex()}", [topic])
    assert [(r.partition, r.lag) for r in reader.read()] == [(0, 3)]
    admin = KafkaClients(kafka_bootstrap).admin()
    for fut in admin.create_partitions([NewPartitions(topic, 3)]).values():
        fut.result(30)
    _produce(kafka_bootstrap, topic, 2, 5)
    t0 = time.monotonic()
    rows = reader.read()
    while len(rows) < 3 and time.monotonic() - t0 < 60:
        time.sleep(1)
        rows = reader.read()
    took = time.monotonic() - t0
    assert [(r.partition, r.lag) for r in rows] == [(0, 3), (1, 0), (2, 5)]
    print(
        f"\n--- new partitions in the lag reading after {took:.1f} s "
        f"(metadata refresh {METADATA_REFRESH_MS / 1000:.0f} s)"
    )
    reader.close()


def test_lag_in_seconds_is_the_age_of_the_oldest_unprocessed_record(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    topic = topic_factory("lag-age", partitions=2)
    two_minutes_ago = int((time.time() - 120) * 1000)
    _produce(kafka_bootstrap, topic, 0, 4, ts_ms=two_minutes_ago)
    _produce(kafka_bootstrap, topic, 0, 4)  # newer records behind them do not matter
    group = f"g-{os.urandom(4).hex()}"
    reader = LagReader(KafkaClients(kafka_bootstrap), group, [topic])
    rows = {r.partition: r for r in reader.read(ages=True)}
    assert rows[0].lag == 8 and rows[0].age_s == pytest.approx(120, abs=15)
    assert rows[1].lag == 0 and rows[1].age_s == 0.0
    # the group processes the old ones: the age is now that of the newer records
    from confluent_kafka import TopicPartition

    consumer = KafkaClients(kafka_bootstrap).consumer(group, {"enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    consumer.close()
    rows = {r.partition: r for r in reader.read(ages=True)}
    assert rows[0].lag == 4 and rows[0].age_s < 30
    reader.close()
