"""The scheduler end-to-end tests share one `leap-stream serve` per module (_served.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _served import Served, start_served


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str, redis_url: str
) -> Iterator[Served]:
    yield from start_served(tmp_path_factory, kafka_bootstrap, redis_url)
