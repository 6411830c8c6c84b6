"""Every setting leap-stream reads from the environment, with its default, in one place.

`leap-stream config` prints the effective values; docs/configuration.md is generated from
``SETTINGS`` below, so the table and the code cannot drift apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    env: str
    default: str
    help: str


# (env var, default, what it is for). Defaults are strings exactly as they would be set.
SETTINGS: tuple[Setting, ...] = (
    # --- Kafka
    Setting(
        "LEAP_KAFKA_BOOTSTRAP",
        "",
        "Kafka bootstrap servers. Empty: `dev up` starts a local broker and tools use it.",
    ),
    Setting(
        "LEAP_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    ),
    Setting(
        "LEAP_KAFKA_SASL_MECHANISM", "", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 when SASL is used."
    ),
    Setting("LEAP_KAFKA_SASL_USERNAME", "", "SASL user name."),
    Setting("LEAP_KAFKA_SASL_PASSWORD", "", "SASL password (prefer a mounted Secret)."),
    Setting("LEAP_KAFKA_SSL_CAFILE", "", "CA bundle for SSL."),
    Setting("LEAP_KAFKA_SSL_CERTFILE", "", "Client certificate for mutual TLS."),
    Setting("LEAP_KAFKA_SSL_KEYFILE", "", "Client key for mutual TLS."),
    Setting("LEAP_TOPIC_SUBMISSIONS", "leap.job-submissions", "Job-submission events (input)."),
    Setting("LEAP_TOPIC_COMPLETIONS", "leap.job-completions", "Job-completion telemetry (input)."),
    Setting(
        "LEAP_TOPIC_RANKINGS", "leap.rankings", "Hardware rankings (output, read by the scheduler)."
    ),
    Setting("LEAP_TOPIC_DEAD_LETTER", "leap.dead-letter", "Rejected input with the reason."),
    Setting("LEAP_TOPIC_PARTITIONS", "4", "Partitions per topic for `topics create`."),
    Setting("LEAP_TOPIC_REPLICATION", "1", "Replication factor for `topics create`."),
    Setting("LEAP_TOPIC_RETENTION_MS", "604800000", "Retention of the event topics (7 days)."),
    Setting("LEAP_DLQ_RETENTION_MS", "2592000000", "Retention of the dead-letter topic (30 days)."),
    Setting("LEAP_CONSUMER_GROUP", "leap-stream", "Consumer group (Faust app id) of the worker."),
    Setting(
        "LEAP_MAX_MESSAGE_BYTES",
        "1048576",
        "Largest event accepted; larger ones go to the dead-letter topic.",
    ),
    # --- Redis (online store)
    Setting(
        "LEAP_REDIS_URL",
        "",
        "Redis URL (redis:// or rediss://, password in the URL or LEAP_REDIS_PASSWORD). Empty: `dev up` starts one.",
    ),
    Setting("LEAP_REDIS_PASSWORD", "", "Redis AUTH password when not in the URL."),
    Setting("LEAP_REDIS_TIMEOUT_S", "1.0", "Redis socket and connect timeout (seconds)."),
    Setting(
        "LEAP_REDIS_RETRIES",
        "2",
        "Quick retries (exponential backoff) on a Redis connection error.",
    ),
    Setting("LEAP_REDIS_PREFIX", "leap:", "Key prefix of every key leap-stream writes."),
    Setting(
        "LEAP_DEDUP_TTL_S",
        "1209600",
        "How long a completion event_id is remembered for de-duplication (14 days).",
    ),
    Setting(
        "LEAP_SUBMISSION_TTL_S",
        "2592000",
        "How long a submission's config is kept to join its completion (30 days).",
    ),
    # --- Files
    Setting(
        "LEAP_HOME",
        "~/.cache/leap-stream",
        "Folder for local state: broker and Redis data, pid files, logs.",
    ),
    Setting(
        "LEAP_DATASET_DIR",
        "",
        "Training dataset (Parquet, partitioned by day). Empty: $LEAP_HOME/dataset.",
    ),
    Setting("LEAP_REGISTRY_DIR", "", "Model registry. Empty: $LEAP_HOME/registry."),
    # --- Local services (`leap-stream dev`)
    Setting(
        "LEAP_KAFKA_VERSION",
        "4.1.0",
        "Apache Kafka version fetched from Maven Central by `dev up`.",
    ),
    Setting(
        "LEAP_KAFKA_PORT", "0", "Broker port for `dev up`; 0 picks 9092 if free, else a free port."
    ),
    Setting("LEAP_KAFKA_HEAP", "-Xms256m -Xmx768m", "JVM heap of the local broker."),
    Setting(
        "LEAP_KAFKA_JVM_OPTS",
        "-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1",
        "Other JVM options of the local broker (C1 only: starts in about a third of the time).",
    ),
    Setting(
        "LEAP_REDIS_PORT", "0", "Redis port for `dev up`; 0 picks 6379 if free, else a free port."
    ),
    Setting(
        "LEAP_KAFKA_CONTROLLER_PORT",
        "0",
        "KRaft controller port of the local broker; 0: 9093 or a free one.",
    ),
    Setting(
        "LEAP_KAFKA_AUTO_CREATE_TOPICS", "false", "auto.create.topics.enable of the local broker."
    ),
    Setting("LEAP_DEV_READY_TIMEOUT_S", "90", "How long `dev up` waits for a service to answer."),
    # --- Worker
    Setting("LEAP_BATCH_SIZE", "500", "Most events taken per batch."),
    Setting(
        "LEAP_BATCH_WITHIN_S",
        "0",
        "Longest wait to fill a batch (seconds); 0: events go to the batcher as they arrive.",
    ),
    Setting(
        "LEAP_FETCH_MIN_BYTES",
        "65536",
        "fetch_min_bytes of Faust's consumer (the completions): the broker answers a fetch once "
        "this much is there, or after LEAP_COMPLETIONS_FETCH_MAX_WAIT_MS.",
    ),
    Setting(
        "LEAP_FETCH_MAX_WAIT_MS",
        "5",
        "fetch.wait.max.ms of the submissions consumer (librdkafka answers on the first byte).",
    ),
    Setting(
        "LEAP_COMPLETIONS_FETCH_MAX_WAIT_MS",
        "100",
        "Fetch max wait of Faust's consumer (the completions): they are not latency-critical, "
        "and each empty fetch is parsed in Python on the interpreter lock the ranking needs.",
    ),
    Setting(
        "LEAP_METRICS_PORT", "9108", "Port of the Prometheus /metrics endpoint; 0 disables it."
    ),
    Setting(
        "LEAP_COMPILED_TREES",
        "auto",
        "1: score with the model's trees compiled to machine code (lleaves, the `compiled` "
        "extra), checked bit-identical to LightGBM; LightGBM serves while they compile. auto: "
        "1 when the extra is installed (as in the image), else 0. 0: LightGBM's predict.",
    ),
    Setting(
        "LEAP_GC_FREEZE",
        "1",
        "1: the worker moves everything allocated at start-up (libraries, model, catalog) out of "
        "the garbage collector's reach (gc.freeze), so full collections scan only what it made "
        "since: shorter pauses (docs/benchmarks.md).",
    ),
    Setting(
        "LEAP_MODEL_POLL_S",
        "5",
        "How often the worker checks the registry for a new current model.",
    ),
    Setting(
        "LEAP_DATASET_FLUSH_ROWS",
        "5000",
        "Rows buffered before the dataset sink writes a Parquet file.",
    ),
    Setting("LEAP_DATASET_FLUSH_S", "10", "Longest time rows wait in the dataset buffer."),
    Setting("LEAP_COMMIT_INTERVAL_S", "1.0", "How often the worker commits acked offsets."),
    Setting("LEAP_LAG_INTERVAL_S", "15", "How often the worker measures its consumer lag."),
    Setting(
        "LEAP_ORPHAN_GRACE_S",
        "60",
        "How long a completion waits for its submission to be joined before it is dead-lettered as orphan_completion.",
    ),
    Setting(
        "LEAP_KAFKA_SESSION_TIMEOUT_S",
        "10",
        "Consumer-group session timeout of the worker: how soon a dead worker's partitions move.",
    ),
    Setting(
        "LEAP_CONSUMER_STALL_S",
        "120",
        "Longest time the submissions consumer may stay outside a settled group (e.g. stuck rejoining after a broker restart) before the worker replaces it with a new one.",
    ),
    Setting(
        "LEAP_PRODUCE_TIMEOUT_S",
        "20",
        "Worker output: delivery timeout per record; a failed batch is redone on a fresh producer.",
    ),
    Setting("LEAP_LOG_LEVEL", "INFO", "Log level."),
)

_BY_ENV = {s.env: s for s in SETTINGS}


def get(env: str) -> str:
    """The value of a documented setting: the environment, else its default."""
    setting = _BY_ENV[env]  # KeyError: an undocumented setting is a bug
    return os.environ.get(env, setting.default)


@dataclass(frozen=True)
class Config:
    """Typed view of the settings, read once at start-up."""

    kafka_bootstrap: str
    redis_url: str
    redis_prefix: str
    topic_submissions: str
    topic_completions: str
    topic_rankings: str
    topic_dead_letter: str
    consumer_group: str
    max_message_bytes: int
    home: Path
    dataset_dir: Path
    registry_dir: Path
    batch_size: int
    batch_within_s: float
    metrics_port: int
    model_poll_s: float

    @classmethod
    def from_env(cls) -> Config:
        home = Path(get("LEAP_HOME")).expanduser()
        return cls(
            kafka_bootstrap=get("LEAP_KAFKA_BOOTSTRAP"),
            redis_url=get("LEAP_REDIS_URL"),
            redis_prefix=get("LEAP_REDIS_PREFIX"),
            topic_submissions=get("LEAP_TOPIC_SUBMISSIONS"),
            topic_completions=get("LEAP_TOPIC_COMPLETIONS"),
            topic_rankings=get("LEAP_TOPIC_RANKINGS"),
            topic_dead_letter=get("LEAP_TOPIC_DEAD_LETTER"),
            consumer_group=get("LEAP_CONSUMER_GROUP"),
            max_message_bytes=int(get("LEAP_MAX_MESSAGE_BYTES")),
            home=home,
            dataset_dir=Path(get("LEAP_DATASET_DIR") or home / "dataset"),
            registry_dir=Path(get("LEAP_REGISTRY_DIR") or home / "registry"),
            batch_size=int(get("LEAP_BATCH_SIZE")),
            batch_within_s=float(get("LEAP_BATCH_WITHIN_S")),
            metrics_port=int(get("LEAP_METRICS_PORT")),
            model_poll_s=float(get("LEAP_MODEL_POLL_S")),
        )


def kafka_client_config(bootstrap: str | None = None) -> dict[str, str]:
    """librdkafka settings shared by every producer, consumer and admin client we create."""
    conf: dict[str, str] = {"bootstrap.servers": bootstrap or get("LEAP_KAFKA_BOOTSTRAP")}
    protocol = get("LEAP_KAFKA_SECURITY_PROTOCOL")
    if protocol != "PLAINTEXT":
        conf["security.protocol"] = protocol
    optional = {
        "sasl.mechanism": "LEAP_KAFKA_SASL_MECHANISM",
        "sasl.username": "LEAP_KAFKA_SASL_USERNAME",
        "sasl.password": "LEAP_KAFKA_SASL_PASSWORD",
        "ssl.ca.location": "LEAP_KAFKA_SSL_CAFILE",
        "ssl.certificate.location": "LEAP_KAFKA_SSL_CERTFILE",
        "ssl.key.location": "LEAP_KAFKA_SSL_KEYFILE",
    }
    for key, env in optional.items():
        if value := get(env):
            conf[key] = value
    return conf


def config_table_markdown() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS:
        default = "`" + s.default + "`" if s.default else "(empty)"
        rows.append(f"| `{s.env}` | {default} | {s.help} |")
    return "\n".join(rows) + "\n"


__all__ = ["SETTINGS", "Config", "Setting", "config_table_markdown", "get", "kafka_client_config"]
