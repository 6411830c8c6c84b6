"""Contract tests: the examples, the two validators, and the TypedDicts against the schemas.

Every example is checked by our compiled fastjsonschema validator *and* the reference
``jsonschema`` Draft 2020-12 validator, so a keyword fastjsonschema silently ignores (it
implements drafts 4/6/7) cannot make the two disagree unnoticed. An invalid example's file name
starts with the kind ``decode`` must report: ``schema-*``, ``semantic-*``, ``unknown_hardware-*``,
``not_json-*``, ``not_object-*``.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import fastjsonschema
import jsonschema
import orjson
import pytest

from leap_stream.catalog import load_catalog
from leap_stream.contracts import (
    DecodeError,
    Ok,
    decode,
    events,
    load_schema,
    schema_dir,
    validator,
)
from leap_stream.contracts.schemas import SCHEMA_NAMES, inline_defs

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
EVENT_SCHEMAS = ("job-submitted", "job-completed", "hardware-ranking", "dead-letter")
KNOWN_HARDWARE = frozenset(load_catalog().types)
KINDS = typing.get_args(events.ErrorKind)


def _examples(validity: str) -> list[Any]:
    files = sorted(EXAMPLES.glob(f"*/{validity}/*.json"))
    return [pytest.param(f, id=f"{f.parent.parent.name}/{f.name}") for f in files]


def _reference(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        load_schema(name), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def _kind(path: Path) -> str:
    kind = path.stem.split("-", 1)[0]
    assert kind in KINDS, f"{path.name}: file name must start with an error kind"
    return kind


def test_reference_validator_checks_date_time() -> None:
    # without rfc3339-validator installed jsonschema skips date-time silently; this must fail then
    ref = _reference("job-completed")
    assert ref.is_valid(_valid("job-completed"))
    assert not ref.is_valid(_valid("job-completed") | {"started_at": "yesterday"})


def _valid(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(
        next((EXAMPLES / name / "valid").glob("*.json")).read_bytes()
    )
    return doc


@pytest.mark.parametrize("name", EVENT_SCHEMAS)
def test_enough_examples_of_each_event(name: str) -> None:
    valid = list((EXAMPLES / name / "valid").glob("*.json"))
    invalid = list((EXAMPLES / name / "invalid").glob("*.json"))
    assert len(valid) >= 2
    assert len(invalid) >= 3
    assert len({_kind(p) for p in invalid}) >= 2, "invalid examples of at least two kinds"


@pytest.mark.parametrize("path", _examples("valid"))
def test_valid_example_passes_both_validators_and_decode(path: Path) -> None:
    name = path.parent.parent.name
    raw = path.read_bytes()
    doc = orjson.loads(raw)
    validator(name)(doc)  # raises when invalid
    errors = [e.message for e in _reference(name).iter_errors(doc)]
    assert errors == []
    result = decode(raw, name, max_bytes=1 << 20, known_hardware=KNOWN_HARDWARE)
    assert isinstance(result, Ok), result
    assert result.event == doc


@pytest.mark.parametrize("path", _examples("invalid"))
def test_invalid_example_fails_decode_with_its_kind(path: Path) -> None:
    name = path.parent.parent.name
    raw = path.read_bytes()
    kind = _kind(path)
    result = decode(raw, name, max_bytes=1 << 20, known_hardware=KNOWN_HARDWARE)
    assert isinstance(result, DecodeError), f"{path.name} decoded fine"
    assert result.kind == kind, result
    assert result.schema == name
    if kind in ("schema", "semantic", "unknown_hardware"):
        assert result.path is not None and result.path.startswith("data")
        doc = orjson.loads(raw)
        reference_ok = _reference(name).is_valid(doc)
        try:
            validator(name)(doc)
            fast_ok = True
        except fastjsonschema.JsonSchemaValueException:
            fast_ok = False
        # schema errors are errors for both validators; the rest is valid JSON Schema-wise
        assert reference_ok == fast_ok == (kind != "schema")


@pytest.mark.parametrize("path", _examples("invalid"))
def test_semantic_and_catalog_examples_pass_without_catalog(path: Path) -> None:
    """Without ``known_hardware`` the catalog check is off, and only that check."""
    kind = _kind(path)
    result = decode(path.read_bytes(), path.parent.parent.name, max_bytes=1 << 20)
    if kind == "unknown_hardware":
        assert isinstance(result, Ok)
    else:
        assert isinstance(result, DecodeError) and result.kind == kind


# --- the schemas themselves

# Keywords whose meaning is identical in draft-07 (what fastjsonschema implements) and 2020-12.
# A 2020-12-only keyword (prefixItems, unevaluatedProperties, dependentRequired, ...) would be
# silently ignored by fastjsonschema: adding one must fail here first.
PORTABLE_KEYWORDS = {
    "$schema", "$id", "$ref", "$defs", "title", "description", "type", "enum", "const",
    "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "if", "then", "else",
}  # fmt: skip


def _keywords(node: Any, under_properties: bool = False) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if not under_properties:
                found.add(key)
            found |= _keywords(value, under_properties=key in ("properties", "$defs"))
    elif isinstance(node, list):
        for item in node:
            found |= _keywords(item)
    return found


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_schema_uses_only_portable_keywords(name: str) -> None:
    doc = load_schema(name)
    jsonschema.Draft202012Validator.check_schema(doc)
    assert _keywords(doc) - PORTABLE_KEYWORDS == set()
    assert doc["title"] == name
    assert (schema_dir() / f"{name}.schema.json").is_file()


def test_refs_to_defs_are_followed() -> None:
    doc = _valid("job-submitted")
    doc["job_id"] = "has spaces"  # only the $defs/id pattern forbids it
    with pytest.raises(fastjsonschema.JsonSchemaValueException, match="pattern"):
        validator("job-submitted")(doc)


@pytest.mark.parametrize(
    "ts",
    [
        "2026-12-02 13:14:00Z",  # no T
        "2026-12-02T13:14:00",  # no offset
        "2026-12-02T13:14:00+0100",  # offset without colon (fastjsonschema's own regex allows it)
        "2026-02-30T00:00:00Z",  # no such day
        "0000-01-01T00:00:00Z",  # year 0: datetime cannot hold it
        "2026-12-31T23:59:60Z",  # leap second: datetime cannot hold it
        "2026-12-02t13:14:00z",  # lower case: we emit and accept upper case only
        "2026-12-02T13:14:00.1234567890Z",  # more than nanoseconds
    ],
)
def test_date_time_format_is_enforced(ts: str) -> None:
    doc = _valid("job-submitted") | {"submitted_at": ts}
    result = decode(orjson.dumps(doc), "job-submitted", max_bytes=1 << 20)
    assert isinstance(result, DecodeError)
    assert (result.kind, result.path) == ("schema", "data.submitted_at")


@pytest.mark.parametrize(
    "ts",
    ["2026-12-02T13:14:00Z", "2026-12-02T13:14:00.5+05:30", "2026-12-02T13:14:00.123456789-08:00"],
)
def test_date_time_format_accepts_rfc3339(ts: str) -> None:
    doc = _valid("job-submitted") | {"submitted_at": ts}
    assert isinstance(decode(orjson.dumps(doc), "job-submitted", max_bytes=1 << 20), Ok)
    assert _reference("job-submitted").is_valid(doc)


# --- TypedDicts mirror the schemas

TYPED: list[tuple[Any, str, tuple[str | int, ...]]] = [
    (events.JobSubmitted, "job-submitted", ()),
    (events.ModelSpec, "job-submitted", ("properties", "model")),
    (events.TrainingSpec, "job-submitted", ("properties", "training")),
    (events.JobCompleted, "job-completed", ()),
    (events.Throughput, "job-completed", ("properties", "throughput")),
    (events.HardwareRanking, "hardware-ranking", ()),
    (events.RankedCandidate, "hardware-ranking", ("properties", "candidates", "items")),
    (
        events.Interval,
        "hardware-ranking",
        ("properties", "candidates", "items", "properties", "interval"),
    ),
    (events.Excluded, "hardware-ranking", ("properties", "excluded", "items")),
    (events.DeadLetter, "dead-letter", ()),
    (events.DeadLetterSource, "dead-letter", ("properties", "source")),
    (events.DeadLetterError, "dead-letter", ("properties", "error")),
    (events.HardwareCatalogDocument, "hardware-catalog", ()),
    (events.HardwareEntry, "hardware-catalog", ("properties", "hardware", "items")),
]


def _node(name: str, pointer: tuple[str | int, ...]) -> dict[str, Any]:
    node: Any = load_schema(name)
    for part in pointer:
        node = node[part]
    return typing.cast(dict[str, Any], node)


def _literal_values(tp: Any) -> set[Any] | None:
    """The values of a Literal (possibly inside ``X | None``), else None."""
    if typing.get_origin(tp) is typing.Literal:
        return set(typing.get_args(tp))
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        for arg in typing.get_args(tp):
            if (values := _literal_values(arg)) is not None:
                return values
    return None


@pytest.mark.parametrize("typed, name, pointer", TYPED, ids=[t[0].__name__ for t in TYPED])
def test_typeddict_matches_schema(typed: Any, name: str, pointer: tuple[str | int, ...]) -> None:
    node = _node(name, pointer)
    assert set(typed.__annotations__) == set(node["properties"])
    assert typed.__required_keys__ == set(node["required"])
    hints = typing.get_type_hints(typed)
    defs = load_schema(name).get("$defs", {})
    for key, prop in node["properties"].items():
        if "$ref" in prop:
            prop = defs[prop["$ref"].removeprefix("#/$defs/")]
        expected = set(prop["enum"]) if "enum" in prop else None
        if "const" in prop:
            expected = {prop["const"]}
        if expected is not None:
            assert _literal_values(hints[key]) == expected, key
        nullable = "null" in (prop.get("type") or [])
        hint_nullable = type(None) in typing.get_args(hints[key])
        assert nullable == hint_nullable, f"{typed.__name__}.{key}: nullable in schema {nullable}"


def test_error_kinds_match_dead_letter_enum() -> None:
    enum = load_schema("dead-letter")["properties"]["error"]["properties"]["kind"]["enum"]
    assert list(KINDS) == enum


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_inlined_schema_has_no_refs_left(name: str) -> None:
    doc = load_schema(name)
    assert '"$ref"' not in orjson.dumps(inline_defs(doc, doc.get("$defs", {}))).decode()


def test_inline_defs_keeps_siblings_and_leaves_recursion_alone() -> None:
    defs = {"id": {"type": "string"}, "tree": {"items": {"$ref": "#/$defs/tree"}}}
    node = {"a": {"$ref": "#/$defs/id", "description": "x"}, "t": {"$ref": "#/$defs/tree"}}
    out = inline_defs(node, defs)
    assert out["a"] == {"type": "string", "description": "x"}
    assert out["t"] == {"items": {"$ref": "#/$defs/tree"}}  # one level, then the ref stays


def test_examples_in_docs_events_md_are_valid() -> None:
    """Each ```json block of docs/events.md decodes against the event of its section."""
    text = (EXAMPLES.parents[1] / "docs" / "events.md").read_text()
    checked = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        name = section.split("\n", 1)[0].strip()
        for block in re.findall(r"```json\n(.*?)```", section, flags=re.S):
            result = decode(block.encode(), name, max_bytes=1 << 20, known_hardware=KNOWN_HARDWARE)
            assert isinstance(result, Ok), (name, result)
            checked.append(name)
    assert checked == ["job-submitted", "job-completed", "hardware-ranking"]
