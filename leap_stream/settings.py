"""Every setting leap-stream reads from the environment: one frozen, typed `Settings`.

`Settings.from_env()` parses and checks every ``LEAP_*`` variable once, at start (the CLI does
it before it runs a command), and the result is passed to whatever needs it; nothing else reads
the environment. ``leap-stream config`` prints the effective values and
``leap-stream config --markdown`` the table of docs/configuration.md, both made from the field
declarations below, so the documentation and the code cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leap_stream.contracts.window import TimeWindow
from leap_stream.core.history import HistoryRules
from leap_stream.core.probe import PROBE_SIZES, ProbeSettings, ProbeSize

Parser = Callable[[str, str], Any]  # (env name, raw value) -> value; raises SettingsError

SECRETS = ("LEAP_KAFKA_SASL_PASSWORD", "LEAP_REDIS_PASSWORD")


class SettingsError(ValueError):
    """One or more settings do not parse; the message names each variable and what it expects."""


def _str(_env: str, raw: str) -> str:
    return raw


def _path(_env: str, raw: str) -> Path:
    return Path(raw).expanduser() if raw else Path()


def _int(minimum: int) -> Parser:
    def parse(env: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise SettingsError(f"{env}={raw!r}: expected a whole number >= {minimum}")
        return value

    return parse


def _port(env: str, raw: str) -> int:
    value = _int(0)(env, raw)
    if value > 65535:
        raise SettingsError(f"{env}={raw!r}: expected a port, 0 to 65535")
    return value


def _float(minimum: float, above: bool = False) -> Parser:
    def parse(env: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > minimum if above else value >= minimum)
        if not ok:
            bound = f"> {minimum:g}" if above else f">= {minimum:g}"
            what = "a finite number of seconds" if env.endswith("_S") else "a finite number"
            raise SettingsError(f"{env}={raw!r}: expected {what} {bound}")
        return value

    return parse


def _choice(*allowed: str, upper: bool = False) -> Parser:
    def parse(env: str, raw: str) -> str:
        value = raw.upper() if upper else raw
        if value not in allowed:
            names = ", ".join(repr(a) for a in allowed)
            raise SettingsError(f"{env}={raw!r}: expected one of {names}")
        return value

    return parse


WORKER_ROLES = ("submissions", "completions")


def _roles(env: str, raw: str) -> str:
    """A comma-separated, non-empty subset of the worker's roles, written back in order."""
    given = {r.strip() for r in raw.split(",") if r.strip()}
    if not given or not given <= set(WORKER_ROLES):
        raise SettingsError(
            f"{env}={raw!r}: expected a comma-separated choice of {', '.join(WORKER_ROLES)}"
        )
    return ",".join(r for r in WORKER_ROLES if r in given)


class _Bool:
    """A yes/no setting spelled ``true``/``false`` (or ``1``/``0``), written back the same way."""

    def __init__(self, true: str, false: str) -> None:
        self.true, self.false = true, false

    def __call__(self, env: str, raw: str) -> bool:
        value = raw.lower()
        if value not in (self.true, self.false):
            raise SettingsError(f"{env}={raw!r}: expected {self.true} or {self.false}")
        return value == self.true

    def spell(self, value: bool) -> str:
        return self.true if value else self.false


def _bool(true: str, false: str) -> _Bool:
    return _Bool(true, false)


def _setting(env: str, default: str, help: str, parse: Parser = _str) -> Any:
    """A field of `Settings`: its variable, its default as it would be set, what it is for."""
    return field(metadata={"env": env, "default": default, "help": help, "parse": parse})


@dataclass(frozen=True)
class Setting:
    """One documented variable (the rows of docs/configuration.md)."""

    name: str
    env: str
    default: str
    help: str


@dataclass(frozen=True)
class Settings:
    """The effective configuration of one process (see the module doc)."""

    # --- Kafka
    kafka_bootstrap: str = _setting(
        "LEAP_KAFKA_BOOTSTRAP",
        "",
        "Kafka bootstrap servers. Empty: `dev up` starts a local broker and tools use it.",
    )
    kafka_security_protocol: str = _setting(
        "LEAP_KAFKA_SECURITY_PROTOCOL",
        "PLAINTEXT",
        "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
        _choice("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL", upper=True),
    )
    kafka_sasl_mechanism: str = _setting(
        "LEAP_KAFKA_SASL_MECHANISM",
        "",
        "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 when SASL is used.",
        _choice("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", upper=True),
    )
    kafka_sasl_username: str = _setting(
        "LEAP_KAFKA_SASL_USERNAME",
        "",
        "SASL user name.",
    )
    kafka_sasl_password: str = _setting(
        "LEAP_KAFKA_SASL_PASSWORD",
        "",
        "SASL password (prefer a mounted Secret).",
    )
    kafka_ssl_cafile: str = _setting(
        "LEAP_KAFKA_SSL_CAFILE",
        "",
        "CA bundle for SSL.",
    )
    kafka_ssl_certfile: str = _setting(
        "LEAP_KAFKA_SSL_CERTFILE",
        "",
        "Client certificate for mutual TLS.",
    )
    kafka_ssl_keyfile: str = _setting(
        "LEAP_KAFKA_SSL_KEYFILE",
        "",
        "Client key for mutual TLS.",
    )
    topic_submissions: str = _setting(
        "LEAP_TOPIC_SUBMISSIONS",
        "leap.job-submissions",
        "Job-submission events (input).",
    )
    topic_completions: str = _setting(
        "LEAP_TOPIC_COMPLETIONS",
        "leap.job-completions",
        "Job-completion telemetry (input).",
    )
    topic_rankings: str = _setting(
        "LEAP_TOPIC_RANKINGS",
        "leap.rankings",
        "Hardware rankings (output, read by the scheduler).",
    )
    topic_dead_letter: str = _setting(
        "LEAP_TOPIC_DEAD_LETTER",
        "leap.dead-letter",
        "Rejected input with the reason.",
    )
    topic_partitions: int = _setting(
        "LEAP_TOPIC_PARTITIONS",
        "4",
        "Partitions per topic for `topics create`.",
        _int(1),
    )
    topic_replication: int = _setting(
        "LEAP_TOPIC_REPLICATION",
        "1",
        "Replication factor for `topics create`.",
        _int(1),
    )
    topic_retention_ms: int = _setting(
        "LEAP_TOPIC_RETENTION_MS",
        "604800000",
        "Retention of the event topics (7 days).",
        _int(1),
    )
    dlq_retention_ms: int = _setting(
        "LEAP_DLQ_RETENTION_MS",
        "2592000000",
        "Retention of the dead-letter topic (30 days).",
        _int(1),
    )
    consumer_group: str = _setting(
        "LEAP_CONSUMER_GROUP",
        "leap-stream",
        "Consumer group (Faust app id) of the worker.",
    )
    max_message_bytes: int = _setting(
        "LEAP_MAX_MESSAGE_BYTES",
        "1048576",
        "Largest event accepted; larger ones go to the dead-letter topic.",
        _int(1),
    )
    # --- Redis (online store)
    redis_url: str = _setting(
        "LEAP_REDIS_URL",
        "",
        "Redis URL (redis:// or rediss://, password in the URL or LEAP_REDIS_PASSWORD). Empty: `dev up` starts one.",
    )
    redis_password: str = _setting(
        "LEAP_REDIS_PASSWORD",
        "",
        "Redis AUTH password when not in the URL.",
    )
    redis_timeout_s: float = _setting(
        "LEAP_REDIS_TIMEOUT_S",
        "1.0",
        "Redis socket and connect timeout (seconds).",
        _float(0, above=True),
    )
    redis_retries: int = _setting(
        "LEAP_REDIS_RETRIES",
        "2",
        "Quick retries (exponential backoff) on a Redis connection error.",
        _int(0),
    )
    redis_prefix: str = _setting(
        "LEAP_REDIS_PREFIX",
        "leap:",
        "Key prefix of every key leap-stream writes.",
    )
    dedup_ttl_s: int = _setting(
        "LEAP_DEDUP_TTL_S",
        "1209600",
        "How long a completion event_id is remembered for de-duplication (14 days).",
        _int(1),
    )
    submission_ttl_s: int = _setting(
        "LEAP_SUBMISSION_TTL_S",
        "2592000",
        "How long a submission's config is kept to join its completion (30 days).",
        _int(1),
    )
    redis_cluster: bool = _setting(
        "LEAP_REDIS_CLUSTER",
        "0",
        "1: LEAP_REDIS_URL is one node of a Redis Cluster; keys carry their model type as hash tag, so a store written without it must be rebuilt (docs/stores.md).",
        _bool("1", "0"),
    )
    redis_allow_eviction: bool = _setting(
        "LEAP_REDIS_ALLOW_EVICTION",
        "0",
        "1: start even when Redis's maxmemory-policy evicts keys (dedup markers, submissions and histories are then lost silently; evictions are still counted in leap_redis_evicted_keys).",
        _bool("1", "0"),
    )
    history_ttl_s: int = _setting(
        "LEAP_HISTORY_TTL_S",
        "15552000",
        "Retention of a lineage's and a model type's history (lin: and agg: keys): dropped this long after their last update (180 days), so invented ids cannot grow Redis without bound.",
        _int(1),
    )
    history_recent: int = _setting(
        "LEAP_HISTORY_RECENT",
        "5",
        "Accepted measurements kept per (lineage, hardware type); the prior is their median.",
        _int(1),
    )
    quarantine_lineage_factor: float = _setting(
        "LEAP_QUARANTINE_LINEAGE_FACTOR",
        "3",
        "A measurement off by more than this factor from its lineage's recent median on the type (same device count) is quarantined until a later one corroborates it.",
        _float(1, above=True),
    )
    quarantine_aggregate_factor: float = _setting(
        "LEAP_QUARANTINE_AGGREGATE_FACTOR",
        "100",
        "For a lineage new to the type (or at another device count): quarantined when off by more than this factor from the model type's aggregate on it (lineages of one model type differ by sequence length and batch: wide).",
        _float(1, above=True),
    )
    quarantine_physics_factor: float = _setting(
        "LEAP_QUARANTINE_PHYSICS_FACTOR",
        "100",
        "Every measurement: quarantined when faster than this factor times the device's full matrix peak for the job's FLOPs per sample (a rough estimate: honest simulated jobs reached ×50), and never corroborated.",
        _float(1, above=True),
    )
    quarantine_min_aggregate: int = _setting(
        "LEAP_QUARANTINE_MIN_AGGREGATE",
        "5",
        "Measurements an aggregate needs before it can quarantine.",
        _int(1),
    )
    prior_speed_factor: float = _setting(
        "LEAP_PRIOR_SPEED_FACTOR",
        "2",
        "Within a day, accepted measurements move a lineage's prior at most this factor from where it stood when the day began; a value past it is quarantined as `speed` (an honest release, ×1.25, passes).",
        _float(1, above=True),
    )
    aggregate_speed_factor: float = _setting(
        "LEAP_AGGREGATE_SPEED_FACTOR",
        "8",
        "Within a day, an established model type's aggregate moves at most this factor; the excess of an update is held (leap_aggregate_updates_held_total). Why 8: docs/decisions/0010.",
        _float(1, above=True),
    )
    corroboration_gap_s: float = _setting(
        "LEAP_CORROBORATION_GAP_S",
        "3600",
        "A quarantined value is corroborated only by a value of another job at least this many seconds later (and at most once a day per lineage and type).",
        _float(0),
    )
    corroborated_factor: float = _setting(
        "LEAP_CORROBORATED_FACTOR",
        "20",
        "A corroborated change may move a prior at most this factor from where it stood when the day began (why 20: docs/decisions/0010); a larger one stays quarantined as `speed`.",
        _float(1, above=True),
    )
    allow_orphans: bool = _setting(
        "LEAP_ALLOW_ORPHANS",
        "0",
        "1: a completion whose submission was never stored still updates the history (it is dead-lettered as orphan_completion either way, with no dataset row).",
        _bool("1", "0"),
    )
    # --- Files
    home: Path = _setting(
        "LEAP_HOME",
        "~/.cache/leap-stream",
        "Folder for local state: broker and Redis data, pid files, logs.",
        _path,
    )
    dataset_dir: Path = _setting(
        "LEAP_DATASET_DIR",
        "",
        "Training dataset (Parquet, partitioned by day). Empty: $LEAP_HOME/dataset.",
        _path,
    )
    catalog_file: str = _setting(
        "LEAP_CATALOG_FILE",
        "",
        "Hardware catalog (JSON, schemas/hardware-catalog.schema.json); the worker reloads it when it changes (checked with the model poll), a bad edit keeps the previous one. Empty: the packaged catalog.",
    )
    registry_dir: Path = _setting(
        "LEAP_REGISTRY_DIR",
        "",
        "Model registry. Empty: $LEAP_HOME/registry.",
        _path,
    )
    # --- Local services (`leap-stream dev`)
    kafka_version: str = _setting(
        "LEAP_KAFKA_VERSION",
        "4.1.0",
        "Apache Kafka version fetched from Maven Central by `dev up`.",
    )
    kafka_port: int = _setting(
        "LEAP_KAFKA_PORT",
        "0",
        "Broker port for `dev up`; 0 picks 9092 if free, else a free port.",
        _port,
    )
    kafka_heap: str = _setting(
        "LEAP_KAFKA_HEAP",
        "-Xms256m -Xmx768m",
        "JVM heap of the local broker.",
    )
    kafka_jvm_opts: str = _setting(
        "LEAP_KAFKA_JVM_OPTS",
        "-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1",
        "Other JVM options of the local broker (C1 only: starts in about a third of the time).",
    )
    redis_port: int = _setting(
        "LEAP_REDIS_PORT",
        "0",
        "Redis port for `dev up`; 0 picks 6379 if free, else a free port.",
        _port,
    )
    kafka_controller_port: int = _setting(
        "LEAP_KAFKA_CONTROLLER_PORT",
        "0",
        "KRaft controller port of the local broker; 0: 9093 or a free one.",
        _port,
    )
    kafka_auto_create_topics: bool = _setting(
        "LEAP_KAFKA_AUTO_CREATE_TOPICS",
        "false",
        "auto.create.topics.enable of the local broker.",
        _bool("true", "false"),
    )
    dev_ready_timeout_s: float = _setting(
        "LEAP_DEV_READY_TIMEOUT_S",
        "90",
        "How long `dev up` waits for a service to answer.",
        _float(0, above=True),
    )
    # --- Worker
    worker_roles: str = _setting(
        "LEAP_WORKER_ROLES",
        "submissions,completions",
        "What a worker process consumes: submissions (rank), completions (history and dataset), or both. Run one process of each to keep the completions off the rankings' interpreter (docs/worker.md).",
        _roles,
    )
    batch_size: int = _setting(
        "LEAP_BATCH_SIZE",
        "500",
        "Most events taken per batch.",
        _int(1),
    )
    batch_within_s: float = _setting(
        "LEAP_BATCH_WITHIN_S",
        "0",
        "Longest wait to fill a batch (seconds); 0: events go to the batcher as they arrive.",
        _float(0),
    )
    fetch_min_bytes: int = _setting(
        "LEAP_FETCH_MIN_BYTES",
        "65536",
        "fetch_min_bytes of Faust's consumer (the completions): the broker answers a fetch once this much is there, or after LEAP_COMPLETIONS_FETCH_MAX_WAIT_MS.",
        _int(1),
    )
    fetch_max_wait_ms: int = _setting(
        "LEAP_FETCH_MAX_WAIT_MS",
        "5",
        "fetch.wait.max.ms of the submissions consumer (librdkafka answers on the first byte).",
        _int(0),
    )
    completions_fetch_max_wait_ms: int = _setting(
        "LEAP_COMPLETIONS_FETCH_MAX_WAIT_MS",
        "100",
        "Fetch max wait of Faust's consumer (the completions): they are not latency-critical, and each empty fetch is parsed in Python on the interpreter lock the ranking needs.",
        _int(0),
    )
    metrics_addr: str = _setting(
        "LEAP_METRICS_ADDR",
        "127.0.0.1",
        "Address the Prometheus /metrics endpoint listens on. The image sets 0.0.0.0 so a scraper on the container network reaches it; publish it no further (docs/security.md).",
    )
    metrics_port: int = _setting(
        "LEAP_METRICS_PORT",
        "9108",
        "Port of the Prometheus /metrics endpoint; 0 disables it.",
        _port,
    )
    compiled_trees: str = _setting(
        "LEAP_COMPILED_TREES",
        "auto",
        "1: score with the model's trees compiled to machine code (lleaves, the `compiled` extra), checked bit-identical to LightGBM; LightGBM serves while they compile; `train` on millions of rows scores its own boosters with them too (the model is the same). auto: 1 when the extra is installed (as in the image), else 0. 0: LightGBM's predict.",
        _choice("auto", "1", "0"),
    )
    gc_freeze: bool = _setting(
        "LEAP_GC_FREEZE",
        "1",
        "1: the worker and `serve` move everything allocated at start-up (libraries, model, catalog) out of the garbage collector's reach (gc.freeze), so full collections scan only what it made since: shorter pauses (docs/benchmarks.md).",
        _bool("1", "0"),
    )
    gc_threshold: int = _setting(
        "LEAP_GC_THRESHOLD",
        "50000",
        "Allocations of container objects between two young-generation collections in the worker and `serve` (Python's default is 700). A batch of rankings allocates tens of thousands of short-lived dicts; at 700 the collector scans them dozens of times a batch (docs/benchmarks.md). Only reference cycles wait longer to be freed.",
        _int(1),
    )
    model_poll_s: float = _setting(
        "LEAP_MODEL_POLL_S",
        "5",
        "How often the worker checks the registry for a new current model.",
        _float(0, above=True),
    )
    dataset_flush_rows: int = _setting(
        "LEAP_DATASET_FLUSH_ROWS",
        "5000",
        "Rows buffered before the dataset sink writes a Parquet file.",
        _int(1),
    )
    dataset_flush_s: float = _setting(
        "LEAP_DATASET_FLUSH_S",
        "10",
        "Longest time rows wait in the dataset buffer.",
        _float(0, above=True),
    )
    dataset_max_pending_rows: int = _setting(
        "LEAP_DATASET_MAX_PENDING_ROWS",
        "200000",
        "Rows held while the dataset sink fails before the completions agent stops taking new batches and waits for it (the history keeps updating until then; nothing is acked unwritten).",
        _int(1),
    )
    commit_interval_s: float = _setting(
        "LEAP_COMMIT_INTERVAL_S",
        "1.0",
        "How often the worker commits acked offsets.",
        _float(0, above=True),
    )
    metadata_refresh_s: float = _setting(
        "LEAP_METADATA_REFRESH_S",
        "30",
        "How often the worker's Kafka clients refresh topic metadata: partitions added to the input topics (scaling out) are consumed and in the lag gauge this soon (the clients' own default is 5 minutes).",
        _float(0, above=True),
    )
    lag_interval_s: float = _setting(
        "LEAP_LAG_INTERVAL_S",
        "15",
        "How often the worker measures its consumer lag.",
        _float(0, above=True),
    )
    orphan_grace_s: float = _setting(
        "LEAP_ORPHAN_GRACE_S",
        "60",
        "How long a completion waits for its submission to be joined before it is dead-lettered as orphan_completion.",
        _float(0),
    )
    max_waiting_completions: int = _setting(
        "LEAP_MAX_WAITING_COMPLETIONS",
        "10000",
        "Completions of one partition that may wait for their submission at once; more are dead-lettered as waiting_overflow (a flood of completions whose submission never comes must not stall the others).",
        _int(1),
    )
    explore_budget: float = _setting(
        "LEAP_EXPLORE_BUDGET",
        "0.05",
        "The largest extra cost share an exploration may expect: among the candidates within the noise of the first, a ranking marks `explore` on the best one that neither the lineage nor its model type has run on, when the first candidate's throughput per cost ÷ its − 1 is at most this; the integrations try it first (docs/decisions/0014). 0: no exploration.",
        _float(0),
    )
    probe_budget: float = _setting(
        "LEAP_PROBE_BUDGET",
        "0.01",
        "The largest share of a job's expected compute cost its probes may take: a ranking marks `probe` (a short run on a few candidates) where the expected regret of choosing now, weighed by the job's `planned_samples`, exceeds what the probes cost, and they cost at most this share (docs/decisions/0015). A job without `planned_samples` is never probed. 0: no probes.",
        _float(0),
    )
    probe_minutes: float = _setting(
        "LEAP_PROBE_MINUTES",
        "5",
        "A probe's length in minutes, after its warm-up: what a probe costs, and how long the job waits for its choice.",
        _float(0),
    )
    probe_size: str = _setting(
        "LEAP_PROBE_SIZE",
        "job",
        "What a probe runs: `job`, the whole job on its own devices (the first candidate's probe is then the job's own start); `slice`, the fewest of the job's data-parallel replicas that fit the type (one, unless its model state needs more devices), its measurement carried to the job's size by the model's own prediction at both: far cheaper, but over 30 nights in closed loop its measurements entering the lineages' histories cost more than they saved (docs/decisions/0016).",
        _choice(*PROBE_SIZES),
    )
    fault_clock_offset_s: float = _setting(
        "LEAP_FAULT_CLOCK_OFFSET_S",
        "0",
        "Fault injection, for tests only: seconds added to the worker's reading of its host clock (a host running ahead or behind; the worker then judges events by the records' time, stream/clock.py). Never set in production.",
        _float(-1e9),
    )
    event_max_age_s: float = _setting(
        "LEAP_EVENT_MAX_AGE_S",
        "2592000",
        "Oldest submitted_at / ended_at accepted, in seconds before the worker's clock (30 days); older events are dead-lettered as time_out_of_bounds. 0: no bound (replays of old data).",
        _float(0),
    )
    event_max_lead_s: float = _setting(
        "LEAP_EVENT_MAX_LEAD_S",
        "3600",
        "Latest event time accepted, in seconds past the worker's clock (a producer's clock skew); later events are dead-lettered as time_out_of_bounds. 0: no bound.",
        _float(0),
    )
    kafka_session_timeout_s: float = _setting(
        "LEAP_KAFKA_SESSION_TIMEOUT_S",
        "10",
        "Consumer-group session timeout of the worker: how soon a dead worker's partitions move.",
        _float(0, above=True),
    )
    consumer_stall_s: float = _setting(
        "LEAP_CONSUMER_STALL_S",
        "120",
        "Longest time the submissions consumer may stay outside a settled group (e.g. stuck rejoining after a broker restart) before the worker replaces it with a new one.",
        _float(0),
    )
    stop_deadline_s: float = _setting(
        "LEAP_STOP_DEADLINE_S",
        "45",
        "Longest the worker's graceful stop (SIGTERM, SIGINT) may take; past it the worker prints every thread's stack and exits with status 4, as a SIGKILL would end it (what was not committed is redone). Keep it under the orchestrator's grace period (60 s in deploy/k8s). 0: no deadline.",
        _float(0),
    )
    produce_timeout_s: float = _setting(
        "LEAP_PRODUCE_TIMEOUT_S",
        "20",
        "Worker output: delivery timeout per record; a failed batch is redone on a fresh producer.",
        _float(0, above=True),
    )
    # --- HTTP (`leap-stream serve`)
    serve_host: str = _setting(
        "LEAP_SERVE_HOST",
        "127.0.0.1",
        "Address `leap-stream serve` listens on (0.0.0.0 in a container, behind a proxy for TLS).",
    )
    serve_port: int = _setting("LEAP_SERVE_PORT", "8080", "Port of `leap-stream serve`.", _port)
    serve_tokens_file: str = _setting(
        "LEAP_SERVE_TOKENS_FILE",
        "",
        "File of bearer tokens, one per line, that `leap-stream serve` accepts. Empty: no auth.",
    )
    # --- scheduler integrations
    rankings_cache_dir: Path = _setting(
        "LEAP_RANKINGS_CACHE_DIR",
        "",
        "Folder `leap-stream rankings cache` keeps one file per job and per lineage in, for the Slurm job_submit plugin (deploy/slurm). Empty: $LEAP_HOME/rankings-cache.",
        _path,
    )
    rankings_cache_max_age_s: float = _setting(
        "LEAP_RANKINGS_CACHE_MAX_AGE_S",
        "604800",
        "Rankings older than this (7 days) are not written to the rankings cache, and their files are removed.",
        _float(0, above=True),
    )
    log_level: str = _setting(
        "LEAP_LOG_LEVEL",
        "INFO",
        "Log level.",
        _choice("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", upper=True),
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Parse every variable (``os.environ`` by default); every bad one is named at once."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        errors: list[str] = []
        for f in dataclasses.fields(cls):
            meta = f.metadata
            raw = env.get(meta["env"], meta["default"])
            try:
                values[f.name] = meta["parse"](meta["env"], raw)
            except SettingsError as exc:
                errors.append(str(exc))
        if errors:
            raise SettingsError("; ".join(errors))
        home = Path(values["home"]).resolve()
        values["home"] = home
        for name, sub in (
            ("dataset_dir", "dataset"),
            ("registry_dir", "registry"),
            ("rankings_cache_dir", "rankings-cache"),
        ):
            if values[name] == Path():
                values[name] = home / sub
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def raw(self) -> dict[str, str]:
        """Each variable's effective value as a string, secrets masked (``leap-stream config``)."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            env = f.metadata["env"]
            parse = f.metadata["parse"]
            text = parse.spell(value) if isinstance(parse, _Bool) else str(value)
            out[env] = "***" if env in SECRETS and text else text
        return out

    def require_kafka(self) -> str:
        """The bootstrap servers; a command that needs a broker stops here when none is set."""
        if not self.kafka_bootstrap:
            raise SettingsError(
                "LEAP_KAFKA_BOOTSTRAP is empty and no `leap-stream dev up` broker runs"
            )
        return self.kafka_bootstrap

    def require_redis(self) -> str:
        """The Redis URL; a command that needs Redis stops here when none is set."""
        if not self.redis_url:
            raise SettingsError("LEAP_REDIS_URL is empty and no `leap-stream dev up` Redis runs")
        return self.redis_url

    def history_rules(self) -> HistoryRules:
        """What may become a prior (LEAP_HISTORY_RECENT, LEAP_QUARANTINE_*, the speed rule's
        LEAP_PRIOR_SPEED_FACTOR, LEAP_AGGREGATE_SPEED_FACTOR, LEAP_CORROBORATION_GAP_S and
        LEAP_CORROBORATED_FACTOR)."""
        return HistoryRules(
            recent=self.history_recent,
            lineage_factor=self.quarantine_lineage_factor,
            aggregate_factor=self.quarantine_aggregate_factor,
            aggregate_min_count=self.quarantine_min_aggregate,
            physics_factor=self.quarantine_physics_factor,
            speed_factor=self.prior_speed_factor,
            aggregate_speed_factor=self.aggregate_speed_factor,
            corroboration_gap_s=self.corroboration_gap_s,
            corroborated_factor=self.corroborated_factor,
        )

    def probe_settings(self) -> ProbeSettings:
        """What a probe may cost, how long it runs and on what (LEAP_PROBE_BUDGET,
        LEAP_PROBE_MINUTES, LEAP_PROBE_SIZE)."""
        size: ProbeSize = "job" if self.probe_size == "job" else "slice"
        return ProbeSettings(budget=self.probe_budget, minutes=self.probe_minutes, size=size)

    def time_window(self) -> TimeWindow:
        """The accepted window of event times (LEAP_EVENT_MAX_AGE_S / LEAP_EVENT_MAX_LEAD_S)."""
        return TimeWindow(self.event_max_age_s, self.event_max_lead_s)

    def kafka_client_config(self, bootstrap: str | None = None) -> dict[str, Any]:
        """librdkafka settings shared by every producer, consumer and admin client."""
        conf: dict[str, Any] = {"bootstrap.servers": bootstrap or self.kafka_bootstrap}
        if self.kafka_security_protocol != "PLAINTEXT":
            conf["security.protocol"] = self.kafka_security_protocol
        optional = {
            "sasl.mechanism": self.kafka_sasl_mechanism,
            "sasl.username": self.kafka_sasl_username,
            "sasl.password": self.kafka_sasl_password,
            "ssl.ca.location": self.kafka_ssl_cafile,
            "ssl.certificate.location": self.kafka_ssl_certfile,
            "ssl.key.location": self.kafka_ssl_keyfile,
        }
        conf.update({key: value for key, value in optional.items() if value})
        return conf

    def runs(self, role: str) -> bool:
        """Whether this worker process takes ``role`` (LEAP_WORKER_ROLES)."""
        return role in self.worker_roles.split(",")

    @property
    def input_topics(self) -> tuple[str, str]:
        return (self.topic_submissions, self.topic_completions)

    @property
    def topics(self) -> tuple[str, str, str, str]:
        """The worker's four topics, inputs first."""
        return (
            self.topic_submissions,
            self.topic_completions,
            self.topic_rankings,
            self.topic_dead_letter,
        )


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(f.name, f.metadata["env"], f.metadata["default"], f.metadata["help"])
    for f in dataclasses.fields(Settings)
)


def config_table_markdown() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS:
        default = "`" + s.default + "`" if s.default else "(empty)"
        rows.append(f"| `{s.env}` | {default} | {s.help} |")
    return "\n".join(rows) + "\n"


__all__ = ["SETTINGS", "Setting", "Settings", "SettingsError", "config_table_markdown"]
