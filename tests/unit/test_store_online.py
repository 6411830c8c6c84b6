"""Pure parts of the online store: connection settings and key layout (no Redis needed)."""

from __future__ import annotations

import orjson
import pytest
import redis

from leap_stream.store.online import OnlineStore, connect


def test_connect_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAP_REDIS_TIMEOUT_S", "0.25")
    monkeypatch.setenv("LEAP_REDIS_PASSWORD", "s3cret")
    client = connect("redis://cache.example:6380/2")
    kw = client.connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["db"]) == ("cache.example", 6380, 2)
    assert kw["password"] == "s3cret"
    assert kw["socket_timeout"] == kw["socket_connect_timeout"] == 0.25
    assert kw["retry"].get_retries() == 2

    in_url = connect("redis://:fromurl@cache.example:6380/0").connection_pool.connection_kwargs
    assert in_url["password"] == "fromurl"  # the URL wins over LEAP_REDIS_PASSWORD

    tls = connect("rediss://cache.example:6390/0").connection_pool
    assert issubclass(tls.connection_class, redis.SSLConnection)


def test_env_url_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAP_REDIS_URL", "redis://envhost:7000/3")
    kw = connect().connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["db"]) == ("envhost", 7000, 3)


def test_key_layout_is_the_design() -> None:
    store = OnlineStore(redis.Redis(), "leap:")
    assert store.lin_key("L1") == "leap:lin:L1"
    assert store.agg_key("llama-7b") == "leap:agg:llama-7b"
    assert store.seen_key("e1") == "leap:seen:e1"
    assert store.sub_key("job-1", 2) == "leap:sub:job-1:2"


def test_submission_encoding_round_trips() -> None:
    from leap_stream.store import synthetic
    from leap_stream.store.offline import submission_fields
    from leap_stream.store.online import decode_submission, encode_submission

    for sub, _c in synthetic.pairs(20, seed=3):
        fields = submission_fields(sub)
        raw = encode_submission(fields)
        assert decode_submission(raw) == fields
        assert decode_submission(raw.decode()) == fields  # decode_responses=True clients
        assert len(raw) < 0.6 * len(orjson.dumps(fields))
    assert decode_submission(orjson.dumps(fields)) == fields  # an object written by hand
    assert decode_submission(None) is None
    assert decode_submission(b"{broken") is None
    assert decode_submission(orjson.dumps([99, 1, 2])) is None  # unknown format
