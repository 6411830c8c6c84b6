"""What a demo run is asked to do (`leap-stream demo` options), and how it talks."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

KEY = ["job_id", "attempt"]  # a submission's identity in the demo's frames


@dataclass
class DemoOptions:
    out: Path = Path("demo-report")
    days_history: int = 7
    per_day: int = 10000
    rate: float = 250.0  # events/s produced to Kafka (0: as fast as possible)
    seed: int = 7
    morning: int = 300  # submissions of the next morning streamed after the retrain
    poison: bool = True  # a few bad events, to show the dead-letter path
    services: str = "native"  # native | docker | auto
    keep: bool = False  # keep the run's topics and Redis keys
    progress: bool = True
    holdout_days: float = 1.0  # nights the promotion gate holds out


def say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


class WorkerDied(RuntimeError):
    pass
