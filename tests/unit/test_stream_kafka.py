"""KafkaClients: every client gets the connection settings, then only what is its own."""

from __future__ import annotations

from leap_stream.settings import Settings
from leap_stream.stream.kafka import KafkaClients


def test_the_connection_settings_reach_every_client_conf() -> None:
    cfg = Settings.from_env(
        {
            "LEAP_KAFKA_BOOTSTRAP": "b1:9093,b2:9093",
            "LEAP_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "LEAP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "LEAP_KAFKA_SASL_USERNAME": "leap",
            "LEAP_KAFKA_SASL_PASSWORD": "s3cret",
            "LEAP_KAFKA_SSL_CAFILE": "/etc/ca.pem",
        }
    )
    kafka = KafkaClients.of(cfg)
    assert kafka.bootstrap == "b1:9093,b2:9093"
    conf = kafka.conf({"group.id": "g", "linger.ms": 5})
    assert conf == {
        "bootstrap.servers": "b1:9093,b2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "leap",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/ca.pem",
        "group.id": "g",
        "linger.ms": 5,
    }
    # another broker for the same security (a tool pointed elsewhere)
    assert KafkaClients.of(cfg, "other:9092").conf()["bootstrap.servers"] == "other:9092"


def test_plaintext_by_default_and_clients_are_built() -> None:
    kafka = KafkaClients("127.0.0.1:1")
    assert kafka.conf() == {"bootstrap.servers": "127.0.0.1:1"}
    consumer = kafka.consumer("g-test", {"enable.auto.commit": False})
    producer = kafka.producer({"linger.ms": 1})
    admin = kafka.admin()
    assert consumer is not None and producer is not None and admin is not None
    consumer.close()
