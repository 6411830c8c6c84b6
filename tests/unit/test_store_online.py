"""Pure parts of the online store: connection settings and key layout (no Redis needed)."""

from __future__ import annotations

import orjson
import pytest
import redis

from leap_stream.settings import Settings, SettingsError
from leap_stream.store.connection import connect, connect_with
from leap_stream.store.keys import KeyLayout
from leap_stream.store.online import OnlineStore
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
    keys = OnlineStore(redis.Redis(), "leap:").keys
    assert not keys.tagged  # a single Redis: untagged
    assert keys.lin("L1", "llama-7b") == "leap:lin:L1"
    assert keys.agg("llama-7b") == "leap:agg:llama-7b"
    assert keys.seen("e1", "llama-7b") == "leap:seen:e1"
    assert keys.sub("job-1", 2, "llama-7b") == "leap:sub:job-1:2"
    assert keys.pred("job-1", 2, "llama-7b") == "leap:pred:job-1:2"
    tagged = KeyLayout("leap:", tagged=True)
    assert tagged.lin("L1", "llama-7b") == "leap:{llama-7b}:lin:L1"
    assert tagged.agg("llama-7b") == "leap:{llama-7b}:agg:llama-7b"


def test_submission_encoding_round_trips() -> None:
    from leap_stream.core.rows import submission_fields
    from leap_stream.store.values import decode_submission, encode_submission

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


def test_cluster_keys_of_one_model_type_share_a_slot() -> None:
    """The rule a cluster's scripts need: everything one completion touches, and one model
    type's reads, hash to one slot, whatever the model type's name holds."""
    from redis.crc import key_slot

    tagged = KeyLayout("leap:", tagged=True)
    for mt in ("llama-7b", "weird}{name", "{", "}x", "a{b}c"):
        keys = [
            tagged.seen("evt-1", mt),
            tagged.lin("lin-1", mt),
            tagged.agg(mt),
            tagged.sub("job-1", 2, mt),
            tagged.pred("job-1", 2, mt),
        ]
        assert len({key_slot(k.encode()) for k in keys}) == 1, keys
    slots = {key_slot(tagged.agg(f"model-{i}").encode()) for i in range(50)}
    assert len(slots) > 40  # model types spread over the slots
    assert tagged.group("a") != tagged.group("b")
    # a single Redis keeps the layout it always had (no migration for existing stores)
    plain = KeyLayout("leap:")
    assert plain.lin("lin-1", "llama-7b") == "leap:lin:lin-1"
    assert plain.sub("job-1", 2, "x") == "leap:sub:job-1:2"
    assert plain.group("a") == plain.group("b") == ""
    assert plain.pattern("lin") == "leap:lin:*"
    assert tagged.pattern("lin") == "leap:{*}:lin:*"


def test_a_cluster_prefix_with_braces_is_refused() -> None:

    with pytest.raises(ValueError, match="braces"):
        KeyLayout("leap:{x}:", tagged=True)
    KeyLayout("leap:{x}:")  # a single Redis does not care


def test_predictions_round_trip_with_their_anchor_kinds() -> None:
    from leap_stream.store.values import decode_predictions, encode_predictions

    raw = encode_predictions(["h100", "a100", "t4"], [800.0, 400.0, 80.0], 8, {"a100": "x"})
    assert decode_predictions(raw) == {
        "h100": (100.0, "transfer"),
        "a100": (50.0, "self"),
        "t4": (10.0, "transfer"),
    }
    never_ran = decode_predictions(encode_predictions(["h100"], [8.0], 4, {}))
    assert never_ran == {"h100": (2.0, "model")}
    # the list of triples stored before: still read
    assert decode_predictions(b'[["h100", 100.0, "self"]]') == {"h100": (100.0, "self")}
    for bad in (
        b"not json",
        b'{"hw": ["h100"]}',
        b'{"hw":["a"],"p":[1],"nd":0,"self":[],"else":"model"}',
    ):
        assert decode_predictions(bad) == {}
