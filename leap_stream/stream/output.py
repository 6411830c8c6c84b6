"""The worker's output: rankings and dead letters through one idempotent confluent-kafka producer.

Faust's own producer would do, but librdkafka batches in C and its idempotence keeps a retried
send from duplicating or reordering within a partition. The contract with the agents is
`flush()`: when it returns, every record sent since the previous flush is acknowledged by all
in-sync replicas, and only then are the input offsets acked. If it raises, nothing is acked
and the batch is redone.
"""

from __future__ import annotations

import threading
from typing import Any

from leap_stream import config


class DeliveryError(RuntimeError):
    """Some records of a batch were not acknowledged by the broker."""


class OutputProducer:
    def __init__(self, bootstrap: str, extra: dict[str, Any] | None = None) -> None:
        from confluent_kafka import Producer

        conf: dict[str, Any] = dict(config.kafka_client_config(bootstrap))
        conf.update(
            {
                "enable.idempotence": True,  # implies acks=all, bounded in-flight, retries
                "acks": "all",
                "linger.ms": 2,
                "compression.type": "lz4",
                "message.max.bytes": max(1_048_576, int(config.get("LEAP_MAX_MESSAGE_BYTES"))),
                # give up on a record after this long; flush() then reports it
                "delivery.timeout.ms": 120_000,
            }
        )
        conf.update(extra or {})
        self._producer = Producer(conf)
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self._pending = 0

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            with self._lock:
                self._errors.append(str(err))

    def send(self, topic: str, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                self._pending += 1
                return
            except BufferError:
                # local queue full: let librdkafka deliver some, then retry
                self._producer.poll(0.05)

    def flush(self, timeout: float = 60.0) -> int:
        """Block until every record sent so far is acknowledged; returns how many."""
        remaining = self._producer.flush(timeout)
        with self._lock:
            errors, self._errors = self._errors, []
        sent, self._pending = self._pending, 0
        if remaining or errors:
            raise DeliveryError(
                f"{remaining} records not delivered in {timeout}s, {len(errors)} failed: "
                + "; ".join(errors[:3])
            )
        return sent

    def close(self, timeout: float = 30.0) -> None:
        self._producer.flush(timeout)


__all__ = ["DeliveryError", "OutputProducer"]
