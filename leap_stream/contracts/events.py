"""Static types of the events, mirroring ``schemas/*.schema.json`` key for key.

Events stay plain dicts at run time (orjson in, orjson out, no object construction on the hot
path); these TypedDicts only let mypy check the code that reads and builds them.
``tests/unit/test_contracts.py`` fails when a TypedDict and its schema disagree on keys,
required keys or enum values.
"""

from typing import Literal, NotRequired, TypedDict

Family = Literal[
    "dense_llm",
    "moe_llm",
    "encoder",
    "vision_cnn",
    "vision_vit",
    "diffusion",
    "recsys",
    "speech",
    "gnn",
]
Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
Optimizer = Literal["adamw", "adam", "sgd", "adafactor", "lamb", "lion", "adagrad"]
Framework = Literal["pytorch", "jax", "tensorflow"]
CompletionStatus = Literal["succeeded", "failed", "preempted"]
RankingSource = Literal["model", "lookup", "none"]
ErrorKind = Literal[
    "too_large",
    "not_utf8",
    "not_json",
    "not_object",
    "schema",
    "unknown_hardware",
    "semantic",
    "orphan_completion",
    "time_out_of_bounds",
    "completion_mismatch",
    "attempt_completed",
    "waiting_overflow",
    "internal",
]
Vendor = Literal["nvidia", "amd", "google", "aws", "intel"]


# --- job-submitted (leap.job-submissions)


class ModelSpec(TypedDict):
    family: Family
    model_type: str
    parameters: float
    active_parameters: NotRequired[float]
    layers: int
    hidden_size: int
    sequence_length: int
    precision: Precision
    optimizer: Optimizer
    framework: Framework
    framework_version: str


class TrainingSpec(TypedDict):
    global_batch_size: int
    micro_batch_size: int
    num_devices: int
    data_parallel: int
    tensor_parallel: int
    pipeline_parallel: int
    activation_checkpointing: bool
    planned_samples: NotRequired[float]  # the user's estimate of the samples it will train on


class JobSubmitted(TypedDict):
    schema_version: Literal[1]
    event_id: str
    job_id: str
    attempt: int
    lineage_id: str
    submitted_at: str
    team: str
    model: ModelSpec
    training: TrainingSpec
    candidate_hardware: list[str]
    default_hardware: str


# --- job-completed (leap.job-completions)


class Throughput(TypedDict):
    samples_per_s: float
    tokens_per_s: NotRequired[float]


class JobCompleted(TypedDict):
    schema_version: Literal[1]
    event_id: str
    job_id: str
    attempt: int
    lineage_id: str
    model_type: str
    hardware_type: str
    num_devices: int
    throughput: NotRequired[Throughput]  # required when status == "succeeded"
    steps: int
    started_at: str
    ended_at: str
    status: CompletionStatus
    device_hours: float
    probe: NotRequired[bool]  # a probe's short run, not the attempt's own


# --- hardware-ranking (leap.rankings)


class Interval(TypedDict):
    low: float
    high: float
    level: float


class Exploration(TypedDict):
    hardware_type: str
    reason: Literal["never_measured"]
    expected_extra_cost: float


class ProbeRun(TypedDict):
    num_devices: int
    data_parallel: int
    global_batch_size: int
    predicted_throughput: float


class Probe(TypedDict):
    hardware_types: list[str]
    minutes: float
    cost: float
    expected_saving: float
    runs: NotRequired[list[ProbeRun]]


class RankedCandidate(TypedDict):
    hardware_type: str
    predicted_throughput: float
    interval: Interval | None
    cost_per_device_hour: float
    num_devices: int
    throughput_per_cost: float
    rank: int
    few_measurements: NotRequired[bool]
    within_noise_of_best: NotRequired[bool]


class Excluded(TypedDict):
    hardware_type: str
    reason: str


class HardwareRanking(TypedDict):
    schema_version: Literal[1]
    event_id: str
    job_id: str
    attempt: int
    lineage_id: str
    submission_event_id: str
    submitted_at: str
    produced_at: str
    model_version: str | None
    source: RankingSource
    reason: str
    history_used: NotRequired[bool]
    out_of_distribution: NotRequired[bool]
    explore: NotRequired[Exploration]
    probe: NotRequired[Probe]
    candidates: list[RankedCandidate]
    excluded: list[Excluded]
    latency_ms: float


# --- dead-letter (leap.dead-letter)


class DeadLetterSource(TypedDict):
    topic: str
    partition: int
    offset: int
    key_b64: NotRequired[str | None]


class DeadLetterError(TypedDict):
    kind: ErrorKind
    message: str
    path: NotRequired[str | None]
    schema: NotRequired[str | None]


class DeadLetter(TypedDict):
    schema_version: Literal[1]
    event_id: str
    failed_at: str
    source: DeadLetterSource
    error: DeadLetterError
    payload_b64: str
    payload_size: int
    payload_truncated: bool
    payload_sha256: str


# --- hardware-catalog (package data, leap_stream/catalog/hardware.json)


class HardwareEntry(TypedDict):
    type_id: str
    vendor: Vendor
    name: str
    generation_year: NotRequired[int]
    device_memory_gib: float
    peak_bf16_tflops: float
    peak_fp8_tflops: NotRequired[float | None]
    peak_fp32_tflops: NotRequired[float | None]
    aliases: NotRequired[list[str]]
    memory_bandwidth_gbps: float
    interconnect_gbps: float
    scale_up_domain: NotRequired[int]
    network_gbps: NotRequired[float]
    cost_per_device_hour: float
    source: str


class HardwareCatalogDocument(TypedDict):
    schema_version: Literal[1]
    description: NotRequired[str]
    hardware: list[HardwareEntry]


__all__ = [
    "CompletionStatus",
    "DeadLetter",
    "DeadLetterError",
    "DeadLetterSource",
    "ErrorKind",
    "Excluded",
    "Exploration",
    "Family",
    "Framework",
    "HardwareCatalogDocument",
    "HardwareEntry",
    "HardwareRanking",
    "Interval",
    "JobCompleted",
    "JobSubmitted",
    "ModelSpec",
    "Optimizer",
    "Precision",
    "Probe",
    "ProbeRun",
    "RankedCandidate",
    "RankingSource",
    "Throughput",
    "TrainingSpec",
    "Vendor",
]
