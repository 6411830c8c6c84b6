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

from leap_stream.tools.harness import worker_topics


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
        worker_topics(topic_factory, "f"),
        f"faults-{os.urandom(6).hex()}",
    )
    yield s
    if s.alive():
        s.stop(signal.SIGKILL)


@pytest.fixture
def cluster_stack(stack: Stack, redis_cluster_url: str) -> Stack:
    """`stack` with its online store on a real three-master Redis Cluster."""
    stack.redis_url = redis_cluster_url
    stack.extra_env["LEAP_REDIS_CLUSTER"] = "1"
    return stack
