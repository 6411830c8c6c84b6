"""A round trip through the real Redis the fixtures provide."""

from __future__ import annotations

import orjson
import pytest
import redis

pytestmark = pytest.mark.services


def test_round_trip_pipeline_hash_ttl_and_lua(redis_client: redis.Redis, redis_prefix: str) -> None:
    key = f"{redis_prefix}lin:abc"
    with redis_client.pipeline(transaction=False) as pipe:
        pipe.hset(key, mapping={"h100": orjson.dumps([123.5, 8, 1.0, 1])})
        pipe.set(f"{redis_prefix}seen:e1", 1, nx=True, ex=60)
        pipe.set(f"{redis_prefix}seen:e1", 1, nx=True, ex=60)
        results = pipe.execute()
    assert results == [1, True, None]  # the second SET NX is the duplicate
    assert orjson.loads(redis_client.hget(key, "h100")) == [123.5, 8, 1.0, 1]
    assert 0 < redis_client.ttl(f"{redis_prefix}seen:e1") <= 60
    incr = redis_client.register_script("return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)")
    assert incr(keys=[f"{redis_prefix}agg"], args=["n"]) == 1
    assert incr(keys=[f"{redis_prefix}agg"], args=["n"]) == 2


def test_native_redis_keeps_nothing_on_disk(redis_client: redis.Redis, redis_url: str) -> None:
    from leap_stream.tools.dev import state

    st = state.load_state(state.Paths.from_env(), "redis")
    if st is None or st.address != redis_url:
        pytest.skip("Redis not started by leap_stream.tools.dev")
    cfg = redis_client.config_get("save") | redis_client.config_get("appendonly")
    assert cfg == {"save": "", "appendonly": "no"}


def test_prefix_is_unique_per_test(redis_prefix: str, redis_client: redis.Redis) -> None:
    assert redis_prefix.startswith("test:") and redis_prefix.endswith(":")
    assert list(redis_client.scan_iter(match=f"{redis_prefix}*")) == []
