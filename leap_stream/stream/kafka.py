"""The one place Kafka clients are built: librdkafka producers, consumers and admin clients share
the connection settings (bootstrap servers, TLS, SASL) of `KafkaClients`, made once from the
`Settings`; each caller adds only what is its own (group, offsets, delivery)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leap_stream.settings import Settings


@dataclass(frozen=True)
class KafkaClients:
    bootstrap: str
    security: Mapping[str, Any] = field(default_factory=dict)  # TLS / SASL, empty: PLAINTEXT

    @classmethod
    def of(cls, settings: Settings, bootstrap: str | None = None) -> KafkaClients:
        conf = settings.kafka_client_config(bootstrap)
        return cls(str(conf.pop("bootstrap.servers")), conf)

    def conf(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """librdkafka configuration: the connection, then ``extra``."""
        return {"bootstrap.servers": self.bootstrap, **self.security, **(extra or {})}

    def producer(self, extra: Mapping[str, Any] | None = None) -> Any:
        from confluent_kafka import Producer

        return Producer(self.conf(extra))

    def consumer(self, group: str, extra: Mapping[str, Any] | None = None) -> Any:
        """A consumer of ``group`` that never sees records of aborted transactions (librdkafka's
        default, stated so that no ``extra`` drops it by accident)."""
        from confluent_kafka import Consumer

        conf = {"group.id": group, "isolation.level": "read_committed", **(extra or {})}
        return Consumer(self.conf(conf))

    def admin(self, extra: Mapping[str, Any] | None = None) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.conf(extra))


def produce_waiting(
    producer: Any,
    topic: str,
    key: bytes | str | None,
    value: bytes,
    on_delivery: Callable[..., object] | None = None,
) -> None:
    """Produce one record; while librdkafka's local queue is full, serve delivery reports
    (0.05 s at a time) until it has room, then serve what is ready without waiting."""
    while True:
        try:
            if on_delivery is None:
                producer.produce(topic, key=key, value=value)
            else:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
            break
        except BufferError:
            producer.poll(0.05)
    producer.poll(0)


__all__ = ["KafkaClients", "produce_waiting"]
