"""The worker's output: rankings and dead letters through one idempotent confluent-kafka producer.

Faust's own producer would do, but librdkafka batches in C and its idempotence keeps a retried
send from duplicating or reordering within a partition. The contract with the agents is
`flush()`: when it returns, every record sent since the previous flush is acknowledged by all
in-sync replicas, and only then are the input offsets acked. If it raises, nothing is acked
and the batch is redone.

After a failed flush the librdkafka producer is thrown away and a fresh one (a new producer
ID) takes the redo. An idempotent producer whose in-flight requests were cut by a broker
restart can stay wedged on its old producer ID and sequence numbers: in the fault test every
retry of the same batch timed out for minutes while a new client connected at once. A new
producer ID is safe here: rankings and dead letters are keyed and idempotent downstream, a
record that did land before the failure is only repeated, and acks still wait for a flush of
the fresh producer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from leap_stream.stream.kafka import KafkaClients

log = logging.getLogger(__name__)


class DeliveryError(RuntimeError):
    """Some records of a batch were not acknowledged by the broker."""


class _Reports:
    """Delivery errors of one librdkafka producer (a late report of a discarded producer must not
    fail the flush of its successor)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: list[str] = []

    def on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            with self.lock:
                self.errors.append(str(err))

    def take(self) -> list[str]:
        with self.lock:
            errors, self.errors = self.errors, []
        return errors


class OutputProducer:
    def __init__(
        self,
        kafka: KafkaClients,
        extra: dict[str, Any] | None = None,
        *,
        timeout_s: float = 20.0,
        max_message_bytes: int = 1_048_576,
        on_reset: Callable[[], object] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._kafka = kafka
        conf: dict[str, Any] = dict(
            {
                "enable.idempotence": True,  # implies acks=all, bounded in-flight, retries
                "acks": "all",
                "linger.ms": 2,
                "compression.type": "lz4",
                "message.max.bytes": max(1_048_576, max_message_bytes),
                # give up on a record after this long; flush() then reports it and the batch
                # is redone on a fresh producer (message.timeout.ms is the same setting)
                "delivery.timeout.ms": max(1000, int(self.timeout_s * 1000)),
                # a report (a Python call and a Message object) only for a record that
                # failed: flush() counts what is still undelivered, the reports say why
                "delivery.report.only.error": True,
            }
        )
        conf.update(extra or {})
        self._conf = conf
        self._on_reset = on_reset
        self.resets = 0
        self._pending = 0
        self._closed = False
        self._producer, self._reports = self._build()

    def _build(self) -> tuple[Any, _Reports]:
        reports = _Reports()  # one per producer: a replaced one's late reports stay its own
        return self._kafka.producer({**self._conf, "on_delivery": reports.on_delivery}), reports

    def send(self, topic: str, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key)
                self._pending += 1
                return
            except BufferError:
                # local queue full: let librdkafka deliver some, then retry
                self._producer.poll(0.05)

    def flush(self, timeout: float | None = None) -> int:
        """Block until every record sent so far is acknowledged; returns how many.

        The default wait is a little longer than delivery.timeout.ms, so that every record has
        either been acknowledged or reported failed when it returns."""
        if timeout is None:
            timeout = self.timeout_s + 5.0
        remaining = self._producer.flush(timeout)
        errors = self._reports.take()
        sent, self._pending = self._pending, 0
        if remaining or errors:
            self._reset(f"{remaining} undelivered, {len(errors)} failed")
            raise DeliveryError(
                f"{remaining} records not delivered in {timeout}s, {len(errors)} failed: "
                + "; ".join(errors[:3])
            )
        return sent

    def _reset(self, why: str) -> None:
        """Discard the producer and what it still holds; the caller redoes the batch."""
        old = self._producer
        try:
            old.purge(in_queue=True, in_flight=True, blocking=False)
            old.flush(0)  # serve the purge reports (to the old producer's own _Reports)
        except Exception as exc:  # a broken client must not stop the recovery
            log.warning("purging the failed output producer raised %r", exc)
        self._producer, self._reports = self._build()
        self.resets += 1
        log.warning(
            "output producer replaced after a failed flush (%s); reset #%d", why, self.resets
        )
        if self._on_reset is not None:
            self._on_reset()

    def close(self, timeout: float = 30.0) -> None:
        """Deliver what is queued (for up to ``timeout``), then stop the client: its threads
        would otherwise live on with the object, reconnecting to a broker that may be gone.
        Records still undelivered are dropped; their inputs were never acked, so they are
        redone. Closing twice is harmless; sending after a close raises."""
        if self._closed:
            return
        self._closed = True
        if self._producer.flush(timeout):
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)
            self._producer.flush(0)
        self._producer.close()


__all__ = ["DeliveryError", "OutputProducer"]
