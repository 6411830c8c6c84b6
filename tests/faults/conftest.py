"""Fixtures of the fault tests: a fresh worker world per test (own topics, group, prefix, dirs)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _stack import Stack


def make_topics(topic_factory: Any) -> dict[str, str]:
    return {
        "sub": topic_factory("fsub", partitions=4),
        # one partition: completions are applied in the order produced, so the order-dependent
        # EWMA aggregates can be compared bit for bit with a replay
        "comp": topic_factory("fcomp", partitions=1),
        "rank": topic_factory("frank", partitions=4),
        "dlq": topic_factory("fdlq", partitions=2),
    }


@pytest.fixture
def stack(
    kafka_bootstrap: str,
    redis_url: str,
    topic_factory: Any,
    redis_prefix: str,
    redis_client: Any,
    tmp_path: Path,
) -> Iterator[Stack]:
    s = Stack(
        kafka_bootstrap,
        redis_url,
        redis_prefix,
        tmp_path,
        make_topics(topic_factory),
        f"faults-{os.urandom(6).hex()}",
    )
    yield s
    if s.alive():
        s.stop(signal.SIGKILL)
