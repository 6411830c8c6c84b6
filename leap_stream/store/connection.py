"""Connecting to Redis: short timeouts and quick retries (a dead Redis must fail fast), TLS
with `rediss://`, a cluster client when asked."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from leap_stream.settings import Settings

Client = redis.Redis | RedisCluster


def connect(
    url: str,
    *,
    password: str = "",
    timeout_s: float = 1.0,
    retries: int = 2,
    cluster: bool = False,
) -> Client:
    """A client with short timeouts and a few quick retries: a dead Redis must fail fast.

    ``rediss://`` URLs use TLS (redis-py verifies the server certificate by default); a
    password in the URL wins over ``password``. ``cluster``: ``url`` is one node of a Redis
    Cluster, the client discovers the others.
    """
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(ExponentialBackoff(cap=0.25, base=0.01), retries),
        "health_check_interval": 30,
    }
    if password and "@" not in url.split("//", 1)[-1]:
        kwargs["password"] = password
    if cluster:
        return RedisCluster.from_url(url, **kwargs)
    return redis.Redis.from_url(
        url, retry_on_error=[redis.ConnectionError, redis.TimeoutError], **kwargs
    )


def connect_with(cfg: Settings, url: str | None = None) -> Client:
    """`connect` with the configured URL (or ``url``), password, timeout, retries, and
    whether it is a cluster."""
    return connect(
        url or cfg.require_redis(),
        password=cfg.redis_password,
        timeout_s=cfg.redis_timeout_s,
        retries=cfg.redis_retries,
        cluster=cfg.redis_cluster,
    )
