"""Session fixtures for the real services (docs/development.md).

Kafka and Redis come from, in order: LEAP_KAFKA_BOOTSTRAP / LEAP_REDIS_URL when set; testcontainers
when a Docker engine answers (LEAP_TEST_DOCKER=0 skips the check); else the native services of
`leap_stream.tools.dev` under $LEAP_HOME. All fixtures are lazy: a pure unit run starts nothing. A
session stops only what it started, and not while another session still holds a lease on it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

_DIR_MARKERS = {"integration": "services", "e2e": "e2e", "faults": "faults"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by folder, so `-m "not services"` works even where a module forgot pytestmark."""
    root = Path(__file__).parent
    for item in items:
        try:
            folder = Path(str(item.fspath)).relative_to(root).parts[0]
        except ValueError:
            continue
        marker = _DIR_MARKERS.get(folder)
        if marker and marker not in item.keywords:
            item.add_marker(getattr(pytest.mark, marker))


@functools.cache
def _docker_answers() -> bool:
    if os.environ.get("LEAP_TEST_DOCKER", "") == "0" or shutil.which("docker") is None:
        return False
    try:
        subprocess.run(["docker", "info"], capture_output=True, timeout=5, check=True)
    except (subprocess.SubprocessError, OSError):
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    from leap_stream.tools.dev import ensure_services, kafka, stop_services

    configured = os.environ.get("LEAP_KAFKA_BOOTSTRAP", "")
    if configured:
        if not kafka.is_ready(configured, timeout=5.0):
            pytest.fail(f"LEAP_KAFKA_BOOTSTRAP={configured} is set but no broker answers there")
        yield configured
        return
    mp = pytest.MonkeyPatch()
    if _docker_answers():
        try:
            from testcontainers.community.kafka import KafkaContainer
        except ImportError:  # testcontainers < 4.10
            from testcontainers.kafka import KafkaContainer  # type: ignore[no-redef]

        container = KafkaContainer().with_kraft()
        for key in ("KAFKA_MESSAGE_MAX_BYTES", "KAFKA_REPLICA_FETCH_MAX_BYTES"):
            container = container.with_env(key, str(kafka.MAX_MESSAGE_BYTES))
        with container:
            bootstrap = container.get_bootstrap_server()
            mp.setenv("LEAP_KAFKA_BOOTSTRAP", bootstrap)  # subprocesses (worker, CLI) see it too
            yield bootstrap
        mp.undo()
        return
    services = ensure_services(kafka=True, redis=False, lease=True)
    mp.setenv("LEAP_KAFKA_BOOTSTRAP", services.kafka_bootstrap)
    try:
        yield services.kafka_bootstrap
    finally:
        mp.undo()
        stop_services(services)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    from leap_stream.tools.dev import ensure_services, stop_services
    from leap_stream.tools.dev import redis as dev_redis

    configured = os.environ.get("LEAP_REDIS_URL", "")
    if configured:
        if not dev_redis.is_ready(configured, timeout=3.0):
            pytest.fail(f"LEAP_REDIS_URL={configured} is set but no Redis answers there")
        yield configured
        return
    mp = pytest.MonkeyPatch()
    if _docker_answers():
        try:
            from testcontainers.community.redis import RedisContainer
        except ImportError:
            from testcontainers.redis import RedisContainer  # type: ignore[no-redef]

        with RedisContainer() as container:
            host = container.get_container_host_ip()
            url = f"redis://{host}:{container.get_exposed_port(6379)}/0"
            mp.setenv("LEAP_REDIS_URL", url)
            yield url
        mp.undo()
        return
    services = ensure_services(kafka=False, redis=True, lease=True)
    mp.setenv("LEAP_REDIS_URL", services.redis_url)
    try:
        yield services.redis_url
    finally:
        mp.undo()
        stop_services(services)


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A seed node of a real Redis Cluster (three masters): LEAP_REDIS_CLUSTER_URL when set,
    else a `LocalRedisCluster` started for this session."""
    from leap_stream.tools.dev.redis_cluster import LocalRedisCluster

    configured = os.environ.get("LEAP_REDIS_CLUSTER_URL", "")
    if configured:
        yield configured
        return
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.stop()


TopicFactory = Callable[..., str]


@pytest.fixture
def topic_factory(kafka_bootstrap: str) -> Iterator[TopicFactory]:
    """make(hint="t", partitions=1, config=None) -> a new, uniquely named topic; deleted after."""
    from leap_stream.tools.dev.topics import create_topics, delete_topics

    created: list[str] = []

    def make(hint: str = "t", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"test.{hint}.{uuid.uuid4().hex[:12]}"
        create_topics(kafka_bootstrap, [name], partitions=partitions, extra_config=config)
        created.append(name)
        return name

    yield make
    delete_topics(kafka_bootstrap, created)


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix no other test (or engineer) uses: tests share one Redis."""
    return f"test:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def redis_client(redis_url: str, redis_prefix: str) -> Iterator[redis.Redis]:
    """redis-py client (bytes replies); every key under redis_prefix is deleted afterwards."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    yield client
    try:
        keys = list(client.scan_iter(match=f"{redis_prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()
