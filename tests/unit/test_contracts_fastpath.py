"""The decode fast path (``contracts.fastpath``): same answers as the compiled validator, cheaper.

The promise is that ``decode`` returns exactly what the plain route (``_decode_plain``: orjson,
the pre-checks, the compiled fastjsonschema validator) returns, Ok event or DecodeError with its
kind, message and path, for any input. These tests try to break that: mutated events, tricky
values, duplicate keys, and events that share a memoised part with a valid one.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import fastjsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leap_stream.catalog import load_catalog
from leap_stream.contracts import MAX_DEPTH, DecodeError, Ok, decode, validator
from leap_stream.contracts.codec import _decode_plain
from leap_stream.contracts.fastpath import compile_fast
from leap_stream.contracts.schemas import (
    FORMATS,
    SCHEMA_NAMES,
    fast_validator,
    inline_defs,
    load_schema,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
LIMIT = 1 << 20
HARDWARE = sorted(load_catalog().types)
KNOWN = frozenset(HARDWARE)
FAST_SCHEMAS = [name for name in SCHEMA_NAMES if fast_validator(name) is not None]
SEEDS = {
    name: [orjson.loads(f.read_bytes()) for f in sorted(EXAMPLES.glob(f"{name}/valid/*.json"))]
    for name in FAST_SCHEMAS
}
# a fleet has a few eligibility sets: most events repeat one of these lists (memo hits)
ELIGIBILITY = [HARDWARE[:20], HARDWARE[-20:], HARDWARE[3:23], HARDWARE[:2]]

MANY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

tricky = st.one_of(
    st.sampled_from(
        [
            0,
            1,
            -1,
            8.0,
            1.5,
            True,
            False,
            None,
            "",
            "h100",
            "H100",
            "h100\n",
            "-h100",
            "a" * 64,
            "a" * 65,
            "x" * 129,
            "sub-01\n",
            "2026-12-02T13:14:00Z",
            "2026-12-02T13:14:00",
            "2026-12-02T13:14:00Z\n",
            "bf16",
            2**63 - 1,
            2**63,
            2**64,
            -(2**63) - 1,
            10**30,
            1e14,
            1e15,
            100000,
            100001,
            1024.0,
            float("nan"),
            float("inf"),
            [],
            {},
            ["h100"],
            ["h100", "h100"],
            [1],
            [True],
            {"x": 1},
        ]
    ),
    st.sampled_from(HARDWARE),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
).map(copy.deepcopy)  # a fresh copy each draw: `mutated` appends to the lists it inserted


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in ``node``: its keys and indexes, containers included, the root as ()."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def seeds(draw: st.DrawFn, name: str) -> dict[str, Any]:
    event: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(SEEDS[name])))
    if name == "job-submitted":
        if draw(st.booleans()):
            candidates = list(draw(st.sampled_from(ELIGIBILITY)))
        else:
            candidates = draw(st.lists(st.sampled_from(HARDWARE), min_size=1, max_size=20))
            candidates = list(dict.fromkeys(candidates))
        event["candidate_hardware"] = candidates
        event["default_hardware"] = draw(st.sampled_from(candidates))
    return event


@st.composite
def mutated(draw: st.DrawFn, name: str) -> tuple[dict[str, Any], bytes]:
    """A valid seed and raw bytes of it with 0 to 3 changes (replace, delete, add, append)."""
    seed = draw(seeds(name))
    event = copy.deepcopy(seed)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(event)))
        if not path:
            continue
        parent = event
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add", "append"]))
        if action == "replace":
            parent[path[-1]] = draw(tricky)
        elif action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "priority", *parent]))] = draw(tricky)
        elif action == "append" and isinstance(parent[path[-1]], list):
            parent[path[-1]].append(draw(tricky))
    raw = json.dumps(event).encode()  # the stdlib writes NaN, Infinity and 2**64 as they are
    if draw(st.integers(0, 9)) == 0:  # a duplicate key: obj keeps the last, the bytes keep both
        key = draw(st.sampled_from(sorted(event) or ["x"]))
        value = json.dumps(draw(tricky)).encode()
        raw = b"{" + json.dumps(key).encode() + b": " + value + b", " + raw[1:]
    return seed, raw


def _same(a: Any, b: Any) -> bool:
    """Equal results, ints and floats told apart (8 == 8.0 in Python, not for a Redis key)."""
    if isinstance(a, Ok) and isinstance(b, Ok):
        return repr(a.event) == repr(b.event) and a.event == b.event
    return isinstance(a, DecodeError) and a == b


def test_job_submitted_has_a_fast_path_within_max_depth() -> None:
    fast = fast_validator("job-submitted")
    assert fast is not None
    assert fast.depth == 2 <= MAX_DEPTH  # the event and its model/training/candidate_hardware
    assert len(fast.memos) == 2  # candidate_hardware: lists and items


@pytest.mark.parametrize("name", FAST_SCHEMAS)
def test_fast_path_accepts_every_valid_example(name: str) -> None:
    """Otherwise the comparisons below would pass with a fast path that never says yes."""
    fast = fast_validator(name)
    assert fast is not None
    for event in SEEDS[name]:
        assert fast.check(orjson.loads(orjson.dumps(event))), event


@pytest.mark.parametrize("name", FAST_SCHEMAS)
def test_fast_path_patterns_are_the_compiled_validators(name: str) -> None:
    """The same regex as fastjsonschema (its "$" → "\\Z" rewrite), read from the compiled code."""
    fast = fast_validator(name)
    assert fast is not None and fast.regexes
    theirs = validator(name).func.__globals__["REGEX_PATTERNS"]  # type: ignore[attr-defined]
    for pattern, regex in fast.regexes.items():
        assert regex.pattern == theirs[pattern].pattern
        assert regex.flags == theirs[pattern].flags


@pytest.mark.parametrize("name", FAST_SCHEMAS)
@MANY
@given(data=st.data())
def test_decode_matches_the_compiled_validator_path(name: str, data: Any) -> None:
    seed, raw = data.draw(mutated(name))
    known = data.draw(st.sampled_from([None, KNOWN, HARDWARE, frozenset(HARDWARE[:5])]))
    decode(orjson.dumps(seed), name, max_bytes=LIMIT, known_hardware=known)  # memo the seed
    fast = decode(raw, name, max_bytes=LIMIT, known_hardware=known)
    plain = _decode_plain(raw, name, max_bytes=LIMIT, known_hardware=known)
    assert _same(fast, plain), (raw, fast, plain)


@pytest.mark.parametrize("name", FAST_SCHEMAS)
@MANY
@given(data=st.data())
def test_fast_check_is_never_more_lenient_than_the_validator(name: str, data: Any) -> None:
    _seed, raw = data.draw(mutated(name))
    fast = fast_validator(name)
    assert fast is not None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    if fast.check(obj):
        validator(name)(obj)  # must not raise


def _submitted(candidates: Any, **changes: Any) -> bytes:
    event = copy.deepcopy(SEEDS["job-submitted"][0])
    event["candidate_hardware"] = candidates
    event["default_hardware"] = candidates[0] if isinstance(candidates, list) else "a"
    event.update(changes)
    return json.dumps(event).encode()


def _both(raw: bytes, known: Any = None) -> tuple[Any, Any]:
    fast = decode(raw, "job-submitted", max_bytes=LIMIT, known_hardware=known)
    plain = _decode_plain(raw, "job-submitted", max_bytes=LIMIT, known_hardware=known)
    assert _same(fast, plain), (fast, plain)
    return fast, plain


def test_memo_does_not_accept_a_string_that_spells_a_cached_list() -> None:
    """tuple("a10") == ("a", "1", "0"): the memo is only asked about lists."""
    assert isinstance(_both(_submitted(["a", "1", "0"]))[0], Ok)
    fast, _ = _both(_submitted("a10"))
    assert isinstance(fast, DecodeError) and fast.path == "data.candidate_hardware"
    assert "must be array" in fast.message


@pytest.mark.parametrize(
    "changes, path",
    [
        ({"default_hardware": "H100"}, "data.default_hardware"),
        ({"team": ""}, "data.team"),
        ({"attempt": 0}, "data.attempt"),
        ({"priority": 1}, "data"),
    ],
)
def test_memo_hit_does_not_excuse_the_rest_of_the_event(changes: dict[str, Any], path: str) -> None:
    candidates = HARDWARE[:20]
    assert isinstance(_both(_submitted(candidates))[0], Ok)
    fast, _ = _both(_submitted(candidates, **changes))
    assert isinstance(fast, DecodeError) and fast.kind == "schema" and fast.path == path


@pytest.mark.parametrize(
    "bad, path",
    [
        ([*HARDWARE[:19], "H100"], "data.candidate_hardware[19]"),  # a cached list's items + one
        ([*HARDWARE[:19], HARDWARE[0]], "data.candidate_hardware"),  # cached items, repeated
        ([*HARDWARE[:19], 7], "data.candidate_hardware[19]"),
        (HARDWARE[:20] + HARDWARE[:20] + HARDWARE[:25], "data.candidate_hardware"),  # > 64
        ([*HARDWARE[:19], ["h100"]], "data.candidate_hardware[19]"),  # unhashable: not sure
    ],
)
def test_cached_items_do_not_excuse_a_bad_list(bad: list[Any], path: str) -> None:
    assert isinstance(_both(_submitted(HARDWARE[:20]))[0], Ok)
    fast, _ = _both(_submitted(bad))
    assert isinstance(fast, DecodeError) and fast.kind == "schema" and fast.path == path


def test_memo_cannot_turn_unknown_hardware_into_known() -> None:
    """The memo holds schema verdicts only; the catalog check runs for every event."""
    assert isinstance(_both(_submitted(HARDWARE[:20]))[0], Ok)
    fast, _ = _both(_submitted(HARDWARE[:20]), known=frozenset(HARDWARE[1:]))
    assert isinstance(fast, DecodeError) and fast.kind == "unknown_hardware"


def test_integral_floats_take_the_full_route_and_become_ints() -> None:
    raw = _submitted(HARDWARE[:3], attempt=2.0)
    fast_check = fast_validator("job-submitted")
    assert fast_check is not None and not fast_check.check(orjson.loads(raw))
    fast, _ = _both(raw)
    assert isinstance(fast, Ok) and type(fast.event["attempt"]) is int


def test_a_duplicate_key_cannot_hide_an_oversized_integer() -> None:
    """obj keeps the last "attempt" (valid), the bytes still hold the first: not_json, as before."""
    raw = b'{"attempt": 99999999999999999999, ' + _submitted(HARDWARE[:3])[1:]
    fast_check = fast_validator("job-submitted")
    assert fast_check is not None and fast_check.check(orjson.loads(raw))
    fast, _ = _both(raw)
    assert isinstance(fast, DecodeError) and fast.kind == "not_json"


def test_memo_holds_only_what_the_sub_schema_accepts() -> None:
    """Whatever got into the memo (lists, items) passes candidate_hardware's own sub-schema."""
    doc = inline_defs(load_schema("job-submitted"), load_schema("job-submitted")["$defs"])
    sub = doc["properties"]["candidate_hardware"]
    lists, items = fastjsonschema.compile(sub), fastjsonschema.compile(sub["items"])
    for candidates in [*ELIGIBILITY, HARDWARE[:1], HARDWARE[5:6], ["a"], HARDWARE]:
        for bad in ([], [*candidates, "H100"], [*candidates, candidates[0]], candidates[:-1]):
            _both(_submitted(candidates))
            _both(_submitted(bad or ["x"], candidate_hardware=bad))
    fast = fast_validator("job-submitted")
    assert fast is not None and fast.memos[0] and fast.memos[1]
    for cached in fast.memos[0]:
        lists(list(cached))
    for item in fast.memos[1]:
        items(item)


def test_memos_stay_bounded() -> None:
    doc = load_schema("job-submitted")
    fast = compile_fast(inline_defs(doc, doc["$defs"]), FORMATS, memo_size=8)
    assert fast is not None
    event = orjson.loads(_submitted(["a"]))
    for i in range(100):
        event["candidate_hardware"] = [f"hw{i}", f"hw{i + 1}"]
        event["default_hardware"] = f"hw{i}"
        assert fast.check(event)
        assert all(len(memo) <= 8 for memo in fast.memos)


def _fast(schema: dict[str, Any]) -> Any:
    return compile_fast(schema, FORMATS)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "integer"}}},  # extra keys allowed
        {"type": ["string", "null"]},
        {"type": "string", "format": "email"},  # fastjsonschema's own regex, not ours
        {"enum": [True, 1]},  # True == 1 in Python
        {"const": 1.0},
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        {"type": "array"},  # any items
        {"anyOf": [{"type": "string"}]},
        {"type": "integer", "multipleOf": 2},
        {"type": "integer", "exclusiveMinimum": True},  # draft-04 style
        {"type": "object", "required": ["a"], "additionalProperties": False},
        {"$ref": "#/$defs/x"},
        {},
        {"minLength": 1},  # no type: any non-string would be valid
        {"type": "string", "minimum": 1},  # a keyword of another type
    ],
)
def test_compiler_gives_up_on_what_it_does_not_implement(schema: dict[str, Any]) -> None:
    assert _fast(schema) is None


def test_compiler_gives_up_on_job_completed() -> None:
    """if/then (a succeeded job needs throughput): no fast path, decode unchanged for it."""
    assert fast_validator("job-completed") is None


@pytest.mark.parametrize(
    "schema, value, expected",
    [
        ({"type": "integer", "maximum": 3}, 3, True),
        ({"type": "integer", "maximum": 3}, 3.0, False),  # valid, but "not sure"
        ({"type": "integer"}, True, False),
        ({"type": "number", "exclusiveMinimum": 0}, 0, False),
        ({"type": "number", "exclusiveMinimum": 0}, float("nan"), False),
        ({"type": "string", "pattern": "^[a-z]+$"}, "abc\n", False),
        ({"type": "string", "pattern": "b"}, "abc", True),  # search, not match
        ({"type": "string", "maxLength": 2}, "abc", False),
        ({"enum": ["a", "b"]}, "b", True),
        ({"const": 1}, 1.0, False),
        ({"const": 1}, True, False),
        (
            {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            ["a", "a"],
            False,
        ),
        ({"type": "array", "items": {"type": "integer", "minimum": 0}}, [0, 1, -1], False),
        ({"type": "array", "items": {"type": "integer", "minimum": 0}}, [0, 1], True),
        ({"type": "array", "items": {"type": "string"}}, ("a",), False),
    ],
)
def test_compiler_small_schemas(schema: dict[str, Any], value: Any, expected: bool) -> None:
    fast = _fast(schema)
    assert fast is not None
    assert fast.check(value) is expected
    if expected:
        fastjsonschema.compile(schema)(value)


class _Catalog:
    """A Container that is not a set: the catalog check must not depend on the type."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def __contains__(self, item: object) -> bool:
        return item in self.ids


@pytest.mark.parametrize("make", [frozenset, set, list, tuple, _Catalog])
def test_unknown_hardware_is_the_same_for_any_container(make: Any) -> None:
    known = make(HARDWARE[1:])
    raw = _submitted([*HARDWARE[1:4], HARDWARE[0], "zz-unknown"])
    fast, _ = _both(raw, known=known)
    assert isinstance(fast, DecodeError) and fast.kind == "unknown_hardware"
    assert fast.path == "data.candidate_hardware[3]" and repr(HARDWARE[0]) in fast.message
    assert isinstance(_both(_submitted(HARDWARE[1:4]), known=known)[0], Ok)
