"""Schema-shaped submission/completion pairs for the store tests and `benchmarks/bench_stores.py`.

Not a fleet model (that is `leap_stream.tools.sim`): just varied, valid events, including failed
attempts, preemptions, out-of-order completions and repeated lineages.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from leap_stream.contracts.timestamps import format_ts

HARDWARE = ("h100-sxm-80g", "a100-sxm-80g", "l4-24g", "mi300x-192g", "tpu-v5e")
MODEL_TYPES = ("llama-7b", "resnet-50", "dlrm-large", "vit-b16", "t5-base")
_T0 = datetime(2026, 11, 20, tzinfo=UTC)


def pairs(
    n: int, seed: int = 0, lineages: int | None = None
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """n (submission, completion) pairs; about n/3 lineages unless told, spread over ~10 days."""
    rng = random.Random(seed)
    n_lin = lineages or max(1, n // 3)
    out = []
    for i in range(n):
        lin = rng.randrange(n_lin)
        model_type = MODEL_TYPES[lin % len(MODEL_TYPES)]
        submitted = _T0 + timedelta(seconds=rng.uniform(0, 10 * 86400))
        started = submitted + timedelta(seconds=rng.uniform(1, 600))
        ended = started + timedelta(seconds=rng.uniform(60, 86400))
        devices = rng.choice((1, 2, 4, 8, 16, 64))
        hw = rng.choice(HARDWARE)
        status = rng.choices(("succeeded", "failed", "preempted"), (0.8, 0.1, 0.1))[0]
        job_id = f"job-{i:07d}"
        sub: dict[str, Any] = {
            "schema_version": 1,
            "event_id": f"sub-{i:07d}",
            "job_id": job_id,
            "attempt": 1 + rng.randrange(2),
            "lineage_id": f"lin-{lin:06d}",
            "submitted_at": format_ts(submitted),
            "team": f"team-{lin % 7}",
            "model": {
                "family": "dense_llm",
                "model_type": model_type,
                "parameters": 7e9 * (1 + lin % 3),
                "layers": 32,
                "hidden_size": 4096,
                "sequence_length": 4096,
                "precision": "bf16",
                "optimizer": "adamw",
                "framework": "pytorch",
                "framework_version": "2.5.1",
            },
            "training": {
                "global_batch_size": 512,
                "micro_batch_size": 4,
                "num_devices": devices,
                "data_parallel": devices,
                "tensor_parallel": 1,
                "pipeline_parallel": 1,
                "activation_checkpointing": bool(lin % 2),
            },
            "candidate_hardware": [*HARDWARE[:3], *([hw] if hw not in HARDWARE[:3] else [])],
            "default_hardware": HARDWARE[0],
        }
        comp: dict[str, Any] = {
            "schema_version": 1,
            "event_id": f"done-{i:07d}",
            "job_id": job_id,
            "attempt": sub["attempt"],
            "lineage_id": sub["lineage_id"],
            "model_type": model_type,
            "hardware_type": hw,
            "num_devices": devices,
            "steps": rng.randrange(0, 100000),
            "started_at": format_ts(started),
            "ended_at": format_ts(ended),
            "status": status,
            "device_hours": devices * (ended - started).total_seconds() / 3600,
        }
        if status != "failed" or rng.random() < 0.3:
            sps = devices * rng.lognormvariate(3, 1)
            comp["throughput"] = {"samples_per_s": sps, "tokens_per_s": sps * 4096}
        out.append((sub, comp))
    return out
