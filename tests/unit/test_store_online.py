"""Pure parts of the online store: connection settings and key layout (no Redis needed)."""

from __future__ import annotations

import orjson
import pytest
import redis

from leap_stream.settings import Settings, SettingsError
from leap_stream.store.online import OnlineStore, connect, connect_with
from leap_stream.tools import synthetic_events as synthetic


def test_connect_settings() -> None:
    cfg = Settings.from_env({"LEAP_REDIS_TIMEOUT_S": "0.25", "LEAP_REDIS_PASSWORD": "s3cret"})
    client = connect_with(cfg, "redis://cache.example:6380/2")
    kw = client.connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["db"]) == ("cache.example", 6380, 2)
    assert kw["password"] == "s3cret"
    assert kw["socket_timeout"] == kw["socket_connect_timeout"] == 0.25
    assert kw["retry"].get_retries() == 2

    in_url = connect_with(cfg, "redis://:fromurl@cache.example:6380/0")
    in_url = in_url.connection_pool.connection_kwargs
    assert in_url["password"] == "fromurl"  # the URL wins over LEAP_REDIS_PASSWORD

    tls = connect("rediss://cache.example:6390/0").connection_pool
    assert issubclass(tls.connection_class, redis.SSLConnection)


def test_the_configured_url_is_used() -> None:
    cfg = Settings.from_env({"LEAP_REDIS_URL": "redis://envhost:7000/3"})
    kw = connect_with(cfg).connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["db"]) == ("envhost", 7000, 3)
    with pytest.raises(SettingsError, match="LEAP_REDIS_URL is empty"):
        connect_with(Settings.from_env({}))


def test_the_store_defaults_are_the_documented_settings() -> None:
    cfg = Settings.from_env({})
    store, configured = OnlineStore(redis.Redis(), "p:"), OnlineStore.of(cfg, redis.Redis())
    assert (store.dedup_ttl_s, store.submission_ttl_s) == (
        configured.dedup_ttl_s,
        configured.submission_ttl_s,
    )
    assert configured.prefix == "leap:"


def test_key_layout_is_the_design() -> None:
    store = OnlineStore(redis.Redis(), "leap:")
    assert store.lin_key("L1") == "leap:lin:L1"
    assert store.agg_key("llama-7b") == "leap:agg:llama-7b"
    assert store.seen_key("e1") == "leap:seen:e1"
    assert store.sub_key("job-1", 2) == "leap:sub:job-1:2"


def test_submission_encoding_round_trips() -> None:
    from leap_stream.core.rows import submission_fields
    from leap_stream.store.online import decode_submission, encode_submission

    for sub, _c in synthetic.pairs(20, seed=3):
        fields = submission_fields(sub)
        raw = encode_submission(fields)
        assert decode_submission(raw) == fields
        assert decode_submission(raw.decode()) == fields  # decode_responses=True clients
        assert len(raw) < 0.6 * len(orjson.dumps(fields))
    assert decode_submission(orjson.dumps(fields)) is None  # only the stored format is read
    assert decode_submission(None) is None
    assert decode_submission(b"{broken") is None
    assert decode_submission(orjson.dumps([99, 1, 2])) is None  # unknown format
