"""A cheap, strict "certainly valid" check derived from a JSON Schema, in front of fastjsonschema.

Why: on the worker's hot path nearly every event is valid, and most of the compiled validator's
time goes to generic work (``isinstance`` with tuples, a set of keys per object, the
``uniqueItems`` helper, an item path built per array element). A check that only has to answer
"valid for certain" or "not sure" can skip all that; "not sure" goes to the compiled validator,
which then gives the verdict and, for a rejected event, the exact error. So the fast path can
only ever make decode faster, never change its answer, provided it is never more lenient than
the compiled validator.

Why it is never more lenient: ``compile_fast`` turns a schema into Python source for a subset of
keywords and gives up (``None``: no fast path) on any other keyword. For JSON values (what
orjson returns: dict, list, str, int, float, bool, None) each generated test implies the test
fastjsonschema generates for the same keyword:

- ``type`` by ``type(x) is T`` (an integral float such as 8.0 is "not sure", though the schema
  calls it an integer; bool is never a number);
- ``const`` and ``enum`` only of strings and ints, by exact type then ``==``;
- numeric bounds by the same comparisons (a NaN fails them all here), string lengths by the same
  ``len``, ``pattern`` by the same regex (fastjsonschema's ``$`` → ``\\Z`` rewrite), ``format`` by
  the same function;
- objects only with ``additionalProperties: false``; arrays only with one ``items`` schema;
  ``uniqueItems`` only over strings, where Python equality is JSON equality.

Two consequences the codec relies on: whatever the check accepts has an ``int`` in every
integer field (so there is nothing to normalise) and is at most ``FastCheck.depth`` containers
deep (so the nesting check cannot fail).

Memo: arrays of strings (``candidate_hardware``) repeat heavily across events (a fleet has a few
eligibility sets), and checking 20 items was the largest single cost. The tuple of a list that
passed its sub-schema is remembered, and a later list with an equal tuple skips the item checks;
items that passed are remembered too, so a new combination of known ids is cheap as well. That
is exact: an array's or an item's sub-schema depends on nothing but that value, the lookup
happens only for a ``list`` (a string ``"a10"`` also makes the tuple ``("a", "1", "0")``), and a
value equal to a string, or a tuple equal to a tuple of strings, holds equal strings (no number,
bool or None equals a str; a list or dict is unhashable, which means "not sure"). Only "valid"
is remembered, at most ``memo_size`` entries per memo, cleared when full. Measured with
valgrind (instructions per decode of a 20-candidate event): lists and items 108k with 4
eligibility sets, 120k with a new list per event; items alone 117k either way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

# fastjsonschema (draft04.generate_pattern) rewrites every unescaped "$" to "\Z" so a pattern
# cannot match before a trailing newline; same rewrite here, same regex.
_DOLLAR_FINDER: Final = re.compile(r"(?<!\\)\$")

_ANNOTATIONS: Final = frozenset(
    {"title", "description", "$comment", "examples", "$schema", "$id", "$defs", "definitions"}
)
_BY_TYPE: Final[dict[str, frozenset[str]]] = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "boolean": frozenset(),
    "null": frozenset(),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems", "uniqueItems"}),
}
_PY_TYPE: Final = {
    "string": "type({v}) is str",
    "integer": "type({v}) is int",
    "number": "(type({v}) is float or type({v}) is int)",
    "boolean": "type({v}) is bool",
    "null": "{v} is None",
    "object": "type({v}) is dict",
    "array": "type({v}) is list",
}
_BOUNDS: Final = {
    "minimum": ">=",
    "maximum": "<=",
    "exclusiveMinimum": ">",
    "exclusiveMaximum": "<",
}


class Unsupported(Exception):
    """The schema uses something the fast path does not implement: use the validator alone."""


@dataclass(frozen=True, slots=True)
class FastCheck:
    """``check(value)``: True if ``value`` is certainly valid, False if not sure. Never raises."""

    check: Callable[[Any], bool]
    depth: int  # containers nested in anything ``check`` accepts (a flat object is 1)
    memos: tuple[set[Any], ...]  # per memoised array: passed lists (tuples), passed items
    regexes: dict[str, re.Pattern[str]]  # schema pattern → the regex used (same as fastjsonschema)
    source: str  # the generated Python, for reading and debugging


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


class _Generator:
    def __init__(self, formats: Mapping[str, Callable[[str], bool]], memo_size: int) -> None:
        self.formats = formats
        self.memo_size = memo_size
        self.namespace: dict[str, Any] = {}
        self.helpers: list[str] = []
        self.memos: list[set[Any]] = []
        self.regexes: dict[str, re.Pattern[str]] = {}
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def constant(self, value: Any) -> str:
        name = self.name("_k")
        self.namespace[name] = value
        return name

    def node(self, schema: Any, v: str, out: list[str], pad: str) -> int:
        """Append lines that ``return False`` unless ``v`` certainly fits ``schema``; its depth."""
        if not isinstance(schema, dict):
            raise Unsupported(f"schema {schema!r}")
        kind = schema.get("type")
        if kind is not None and (not isinstance(kind, str) or kind not in _BY_TYPE):
            raise Unsupported(f"type {kind!r}")
        allowed = _ANNOTATIONS | {"type", "const", "enum"} | _BY_TYPE.get(kind or "", frozenset())
        if extra := set(schema) - allowed:
            raise Unsupported(f"keywords {sorted(extra)}")
        conds = [] if kind is None else [_PY_TYPE[kind].format(v=v)]
        if "const" in schema:
            conds.append(self.literal(v, [schema["const"]]))
        if "enum" in schema:
            conds.append(self.literal(v, schema["enum"]))
        if not conds:
            raise Unsupported("no type, const or enum: anything would be valid")
        if kind == "string":
            conds += self.string(schema, v)
        elif kind in ("integer", "number"):
            for key, op in _BOUNDS.items():
                if key in schema:
                    if not _is_number(schema[key]):
                        raise Unsupported(f"{key} {schema[key]!r}")
                    conds.append(f"{v} {op} {self.number(schema[key])}")
        elif kind == "array" and self.is_string_array(schema):
            memo, func = self.memoised_array(schema)
            conds.append(f"((t := tuple({v})) in {memo} or {func}({v}, t))")
            out.append(f"{pad}if not ({' and '.join(conds)}): return False")
            return 1
        out.append(f"{pad}if not ({' and '.join(conds)}): return False")
        if kind == "object":
            return 1 + self.object(schema, v, out, pad)
        if kind == "array":
            return 1 + self.array(schema, v, out, pad)
        return 0

    def number(self, value: float) -> str:
        """A bound as a literal (a global lookup per use costs more) unless repr cannot say it."""
        return repr(value) if math.isfinite(value) else self.constant(value)

    def literal(self, v: str, values: Any) -> str:
        if not isinstance(values, list) or not values:
            raise Unsupported(f"enum {values!r}")
        types = {type(x) for x in values}
        if types not in ({str}, {int}):  # bool, float, null, containers: equality differs from JSON
            raise Unsupported(f"const/enum of {types}")
        (py,) = types
        return f"type({v}) is {py.__name__} and {v} in {self.constant(frozenset(values))}"

    def string(self, schema: dict[str, Any], v: str) -> list[str]:
        conds = []
        for key, op in (("minLength", ">="), ("maxLength", "<=")):
            if key in schema:
                if not _is_count(schema[key]):
                    raise Unsupported(f"{key} {schema[key]!r}")
                conds.append(f"len({v}) {op} {schema[key]}")
        if "pattern" in schema:
            pattern = schema["pattern"]
            if not isinstance(pattern, str):
                raise Unsupported(f"pattern {pattern!r}")
            regex = self.regexes[pattern] = re.compile(_DOLLAR_FINDER.sub(r"\\Z", pattern))
            conds.append(f"{self.constant(regex.search)}({v}) is not None")
        if "format" in schema:
            check = self.formats.get(schema["format"])
            if check is None:  # fastjsonschema's own format regexes are not ours to copy
                raise Unsupported(f"format {schema['format']!r}")
            conds.append(f"{self.constant(check)}({v})")
        return conds

    def object(self, schema: dict[str, Any], v: str, out: list[str], pad: str) -> int:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if schema.get("additionalProperties") is not False:
            raise Unsupported("objects need additionalProperties: false")
        if not isinstance(props, dict) or not isinstance(required, list):
            raise Unsupported("properties/required")
        if not all(isinstance(k, str) for k in [*props, *required]):
            raise Unsupported("property names")
        if not set(required) <= set(props):
            raise Unsupported("a required key that is not a property")  # never valid here
        # Required keys are read with d[key] (a missing one raises KeyError: "not sure"), and
        # with those present the object has no other key iff its size is that of the keys read.
        size = self.name("n")
        out.append(f"{pad}{size} = {len(set(required))}")
        depth = 0
        for key, sub in props.items():
            child = self.name("v")
            if key in required:
                out.append(f"{pad}{child} = {v}[{key!r}]")
                depth = max(depth, self.node(sub, child, out, pad))
            else:
                out.append(f"{pad}if {key!r} in {v}:")
                out.append(f"{pad}    {size} += 1")
                out.append(f"{pad}    {child} = {v}[{key!r}]")
                depth = max(depth, self.node(sub, child, out, pad + "    "))
        out.append(f"{pad}if len({v}) != {size}: return False")
        return depth

    def array_bounds(self, schema: dict[str, Any], v: str) -> list[str]:
        conds = []
        for key, op in (("minItems", ">="), ("maxItems", "<=")):
            if key in schema:
                if not _is_count(schema[key]):
                    raise Unsupported(f"{key} {schema[key]!r}")
                conds.append(f"len({v}) {op} {schema[key]}")
        return conds

    def array(self, schema: dict[str, Any], v: str, out: list[str], pad: str) -> int:
        if schema.get("uniqueItems", False) is not False:
            raise Unsupported("uniqueItems over non-strings")  # 1 == True == 1.0 in Python
        if conds := self.array_bounds(schema, v):
            out.append(f"{pad}if not ({' and '.join(conds)}): return False")
        item = self.name("v")
        out.append(f"{pad}for {item} in {v}:")
        return self.node(schema.get("items"), item, out, pad + "    ")

    @staticmethod
    def is_string_array(schema: dict[str, Any]) -> bool:
        items = schema.get("items")
        return isinstance(items, dict) and items.get("type") == "string"

    def memoised_array(self, schema: dict[str, Any]) -> tuple[str, str]:
        """Names of a memo of lists and of the helper that checks a list of strings and fills it.

        The helper also remembers single items that passed (an item's verdict depends on the
        item alone), so a new combination of known hardware ids is cheap as well.
        """
        if type(schema.get("uniqueItems", False)) is not bool:
            raise Unsupported(f"uniqueItems {schema['uniqueItems']!r}")
        func, lists, items = self.name("_array"), self.name("_lists"), self.name("_items")
        lines = [f"def {func}(a, t):"]
        if conds := self.array_bounds(schema, "a"):
            lines.append(f"    if not ({' and '.join(conds)}): return False")
        lines += ["    for x in a:", f"        if x not in {items}:"]
        if self.node(schema["items"], "x", lines, "            "):
            raise Unsupported("string items cannot be containers")
        lines.append(f"            if len({items}) >= {self.memo_size}: {items}.clear()")
        lines.append(f"            {items}.add(x)")
        if schema.get("uniqueItems"):
            lines.append("    if len(set(a)) != len(a): return False")
        lines += [
            f"    if len({lists}) >= {self.memo_size}: {lists}.clear()",
            f"    {lists}.add(t)",
            "    return True",
        ]
        self.helpers.append("\n".join(lines))
        for name in (lists, items):
            store: set[Any] = set()
            self.namespace[name] = store
            self.memos.append(store)
        return lists, func


def compile_fast(
    schema: dict[str, Any],
    formats: Mapping[str, Callable[[str], bool]],
    *,
    memo_size: int = 256,
) -> FastCheck | None:
    """The fast check of ``schema`` (refs already inlined), or None if it uses other keywords.

    ``formats`` must be the custom formats the compiled validator was given.
    """
    gen = _Generator(formats, memo_size)
    body: list[str] = []
    try:
        depth = gen.node(schema, "d", body, "        ")
    except Unsupported:
        return None
    source = "\n\n".join(
        [
            *gen.helpers,
            "def check(d):\n    try:\n"
            + "\n".join(body)
            + "\n        return True\n    except Exception:\n        return False",
        ]
    )
    namespace = dict(gen.namespace)
    exec(compile(source, "<fast-path>", "exec"), namespace)  # our own source, from our schema
    return FastCheck(namespace["check"], depth, tuple(gen.memos), gen.regexes, source)


__all__ = ["FastCheck", "Unsupported", "compile_fast"]
