"""A cheap, strict "certainly valid" check derived from a JSON Schema, in front of fastjsonschema.

Why: on the worker's hot path nearly every event is valid, and most of the compiled validator's
time goes to generic work (``isinstance`` with tuples, a set of keys per object, the
``uniqueItems`` helper, an item path built per array element). A check that only has to answer
"valid for certain" or "not sure" can skip all that; "not sure" goes to the compiled validator,
which then gives the verdict and, for a rejected event, the exact error. So the fast path can
only ever make decode faster, never change its answer, provided it is never more lenient than
the compiled validator.

Why it is never more lenient: ``compile_fast`` builds checks (closures over tables, no generated
source: the package does not exec) for a subset of keywords and gives up (``None``: no fast
path) on any other keyword. For JSON values (what orjson returns: dict, list, str, int, float,
bool, None) each test implies the test fastjsonschema generates for the same keyword:

- ``type`` by ``type(x) is T`` (an integral float such as 8.0 is "not sure", though the schema
  calls it an integer; bool is never a number);
- ``const`` and ``enum`` only of strings and ints, by exact type then ``==``;
- numeric bounds by the same comparisons (a NaN fails them all here), string lengths by the same
  ``len``, ``pattern`` by the same regex (fastjsonschema's ``$`` → ``\\Z`` rewrite), ``format`` by
  the same function;
- objects only with ``additionalProperties: false``: every required key is read (a missing one
  raises, "not sure"), and then the object has no other key iff its size is the number of
  properties present; arrays only with one ``items`` schema; ``uniqueItems`` only over strings,
  where Python equality is JSON equality.

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
valgrind (instructions per decode of a 20-candidate event, catalog check on): lists and items
115k with 4 eligibility sets, 130k with a new list per event; items alone 126k and 123k; the
compiled validator alone ~320k.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

Check: TypeAlias = Callable[[Any], bool]

# fastjsonschema (draft04.generate_pattern) rewrites every unescaped "$" to "\Z" so a pattern
# cannot match before a trailing newline; same rewrite here, same regex.
_DOLLAR_FINDER: Final = re.compile(r"(?<!\\)\$")
_INF: Final = float("inf")

_ANNOTATIONS: Final = frozenset(
    {"title", "description", "$comment", "examples", "$schema", "$id", "$defs", "definitions"}
)
_NO_BOUND: Final = {
    "minimum": -_INF,
    "exclusiveMinimum": -_INF,
    "maximum": _INF,
    "exclusiveMaximum": _INF,
}
_BOUNDS: Final = frozenset(_NO_BOUND)
_BY_TYPE: Final[dict[str, frozenset[str]]] = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "integer": _BOUNDS,
    "number": _BOUNDS,
    "boolean": frozenset(),
    "null": frozenset(),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems", "uniqueItems"}),
}


class Unsupported(Exception):
    """The schema uses something the fast path does not implement: use the validator alone."""


@dataclass(frozen=True, slots=True)
class FastCheck:
    """``check(value)``: True if ``value`` is certainly valid, False if not sure. Never raises."""

    check: Check
    depth: int  # containers nested in anything ``check`` accepts (a flat object is 1)
    memos: tuple[set[Any], ...]  # per array of strings: lists (tuples) that passed, items
    regexes: dict[str, re.Pattern[str]]  # schema pattern → the regex used (same as fastjsonschema)


# --- the checks. Each returns False for "not sure"; an exception also means "not sure".


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _is_null(v: Any) -> bool:
    return v is None


def _literal_check(py: type, allowed: frozenset[Any]) -> Check:
    def check(v: Any) -> bool:
        return type(v) is py and v in allowed

    return check


def _string_check(
    lo: int, hi: int, search: Callable[[str], Any] | None, fmt: Check | None
) -> Check:
    def check(v: Any) -> bool:
        return (
            type(v) is str
            and lo <= len(v) <= hi
            and (search is None or search(v) is not None)
            and (fmt is None or fmt(v))
        )

    return check


def _number_check(types: tuple[type, ...], ge: float, gt: float, le: float, lt: float) -> Check:
    def check(v: Any) -> bool:
        return type(v) in types and v >= ge and v > gt and v <= le and v < lt

    return check


# Rows of an object's table, one loop per kind (a call per field would cost ~2 µs an event):
_IntRow: TypeAlias = tuple[str, float, float]  # key, minimum, maximum (both inclusive)
_EnumRow: TypeAlias = tuple[str, frozenset[str]]  # key, allowed strings
_StrRow: TypeAlias = tuple[str, int, int, Callable[[str], Any] | None, Check | None]
_SubRow: TypeAlias = tuple[str, Check]  # key, any other check


def _object_check(
    ints: tuple[_IntRow, ...],
    enums: tuple[_EnumRow, ...],
    strings: tuple[_StrRow, ...],
    others: tuple[_SubRow, ...],
    optional: tuple[_SubRow, ...],
) -> Check:
    """Rows hold each required property once (by kind), ``optional`` the others."""
    size = len(ints) + len(enums) + len(strings) + len(others)

    def check(d: Any) -> bool:
        if type(d) is not dict:
            return False
        for key, lo, hi in ints:
            v = d[key]
            if type(v) is not int or not lo <= v <= hi:
                return False
        for key, allowed in enums:
            v = d[key]
            if type(v) is not str or v not in allowed:
                return False
        for key, lo_len, hi_len, search, fmt in strings:
            v = d[key]
            if type(v) is not str or not lo_len <= len(v) <= hi_len:
                return False
            if search is not None and search(v) is None:
                return False
            if fmt is not None and not fmt(v):
                return False
        for key, sub in others:
            if not sub(d[key]):
                return False
        present = size
        for key, sub in optional:
            if key in d:
                if not sub(d[key]):
                    return False
                present += 1
        return len(d) == present

    return check


def _array_check(item: Check, lo: int, hi: int) -> Check:
    def check(v: Any) -> bool:
        return type(v) is list and lo <= len(v) <= hi and all(map(item, v))

    return check


def _string_array_check(
    item: Check, lo: int, hi: int, unique: bool, lists: set[Any], items: set[Any], size: int
) -> Check:
    """An array of strings, with the memo of lists and of items (see the module docstring)."""

    def check(v: Any) -> bool:
        if type(v) is not list:
            return False
        t = tuple(v)
        if t in lists:
            return True
        if not lo <= len(v) <= hi:
            return False
        for x in v:
            if x not in items:
                if not item(x):
                    return False
                if len(items) >= size:
                    items.clear()
                items.add(x)
        if unique and len(set(v)) != len(v):
            return False
        if len(lists) >= size:
            lists.clear()
        lists.add(t)
        return True

    return check


def _never_raises(inner: Check) -> Check:
    def check(v: Any) -> bool:
        try:
            return inner(v)
        except Exception:  # a missing key, an unhashable item, a memo cleared meanwhile
            return False

    return check


# --- the compiler


@dataclass
class _Node:
    check: Check
    depth: int
    row: tuple[str, tuple[Any, ...]] | None = None  # "int" | "enum" | "str", row without key


@dataclass
class _Compiler:
    formats: Mapping[str, Check]
    memo_size: int
    memos: list[set[Any]] = field(default_factory=list)
    regexes: dict[str, re.Pattern[str]] = field(default_factory=dict)

    def node(self, schema: Any) -> _Node:
        if not isinstance(schema, dict):
            raise Unsupported(f"schema {schema!r}")
        kind = schema.get("type")
        if kind is not None and (not isinstance(kind, str) or kind not in _BY_TYPE):
            raise Unsupported(f"type {kind!r}")
        allowed = _ANNOTATIONS | {"type", "const", "enum"} | _BY_TYPE.get(kind or "", frozenset())
        if extra := set(schema) - allowed:
            raise Unsupported(f"keywords {sorted(extra)}")
        literals = self.literals(schema)
        if literals is not None:
            py, values = literals
            if kind is not None and kind != {str: "string", int: "integer"}[py]:
                raise Unsupported(f"type {kind} with const/enum of {py.__name__}")
            if set(schema) & (_BY_TYPE.get(kind or "", frozenset())):
                raise Unsupported("const/enum with other keywords")
            row = ("enum", (values,)) if py is str else None
            return _Node(_literal_check(py, values), 0, row)
        if kind is None:
            raise Unsupported("no type, const or enum: anything would be valid")
        if kind == "string":
            return self.string(schema)
        if kind in ("integer", "number"):
            return self.number(schema, kind)
        if kind == "boolean":
            return _Node(_is_bool, 0)
        if kind == "null":
            return _Node(_is_null, 0)
        if kind == "object":
            return self.object(schema)
        return self.array(schema)

    @staticmethod
    def literals(schema: dict[str, Any]) -> tuple[type, frozenset[Any]] | None:
        if "const" in schema and "enum" in schema:
            raise Unsupported("const and enum")
        values = [schema["const"]] if "const" in schema else schema.get("enum")
        if values is None:
            return None
        if not isinstance(values, list) or not values:
            raise Unsupported(f"enum {values!r}")
        types = {type(x) for x in values}
        if types not in ({str}, {int}):  # bool, float, null, containers: equality differs from JSON
            raise Unsupported(f"const/enum of {types}")
        (py,) = types
        return py, frozenset(values)

    def string(self, schema: dict[str, Any]) -> _Node:
        lo, hi = self.count(schema, "minLength", 0), self.count(schema, "maxLength", sys.maxsize)
        search = fmt = None
        if "pattern" in schema:
            pattern = schema["pattern"]
            if not isinstance(pattern, str):
                raise Unsupported(f"pattern {pattern!r}")
            regex = self.regexes[pattern] = re.compile(_DOLLAR_FINDER.sub(r"\\Z", pattern))
            search = regex.search
        if "format" in schema:
            fmt = self.formats.get(schema["format"])
            if fmt is None:  # fastjsonschema's own format regexes are not ours to copy
                raise Unsupported(f"format {schema['format']!r}")
        return _Node(_string_check(lo, hi, search, fmt), 0, ("str", (lo, hi, search, fmt)))

    @staticmethod
    def count(schema: dict[str, Any], key: str, default: int) -> int:
        value = schema.get(key, default)
        if type(value) is not int or value < 0:
            raise Unsupported(f"{key} {value!r}")
        return value

    @staticmethod
    def number(schema: dict[str, Any], kind: str) -> _Node:
        bounds: dict[str, float] = {}
        for key, default in _NO_BOUND.items():
            value = schema.get(key, default)
            if type(value) not in (int, float):  # a bool is the draft-04 exclusive flag
                raise Unsupported(f"{key} {value!r}")
            bounds[key] = value
        ge, le = bounds["minimum"], bounds["maximum"]
        gt, lt = bounds["exclusiveMinimum"], bounds["exclusiveMaximum"]
        types = (int,) if kind == "integer" else (int, float)
        check = _number_check(types, ge, gt, le, lt)
        inclusive = "exclusiveMinimum" not in schema and "exclusiveMaximum" not in schema
        return _Node(check, 0, ("int", (ge, le)) if kind == "integer" and inclusive else None)

    def object(self, schema: dict[str, Any]) -> _Node:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if schema.get("additionalProperties") is not False:
            raise Unsupported("objects need additionalProperties: false")
        if not isinstance(props, dict) or not isinstance(required, list):
            raise Unsupported("properties/required")
        if not all(isinstance(k, str) for k in required) or not set(required) <= set(props):
            raise Unsupported("a required key that is not a property")  # never valid here
        rows: dict[str, list[Any]] = {"int": [], "enum": [], "str": [], "other": [], "opt": []}
        depth = 0
        for key, sub in props.items():
            node = self.node(sub)
            depth = max(depth, node.depth)
            if key not in required:
                rows["opt"].append((key, node.check))
            elif node.row is None:
                rows["other"].append((key, node.check))
            else:
                rows[node.row[0]].append((key, *node.row[1]))
        check = _object_check(*(tuple(rows[k]) for k in ("int", "enum", "str", "other", "opt")))
        return _Node(check, 1 + depth)

    def array(self, schema: dict[str, Any]) -> _Node:
        lo, hi = self.count(schema, "minItems", 0), self.count(schema, "maxItems", sys.maxsize)
        unique = schema.get("uniqueItems", False)
        if type(unique) is not bool:
            raise Unsupported(f"uniqueItems {unique!r}")
        item = self.node(schema.get("items"))
        if not (isinstance(schema["items"], dict) and schema["items"].get("type") == "string"):
            if unique:
                raise Unsupported("uniqueItems over non-strings")  # 1 == True == 1.0 in Python
            return _Node(_array_check(item.check, lo, hi), 1 + item.depth)
        lists: set[Any] = set()
        items: set[Any] = set()
        self.memos += [lists, items]
        memo = self.memo_size
        return _Node(_string_array_check(item.check, lo, hi, unique, lists, items, memo), 1)


def compile_fast(
    schema: dict[str, Any],
    formats: Mapping[str, Check],
    *,
    memo_size: int = 256,
) -> FastCheck | None:
    """The fast check of ``schema`` (refs already inlined), or None if it uses other keywords.

    ``formats`` must be the custom formats the compiled validator was given; ``memo_size``
    bounds each memo (lists, items) of each array of strings.
    """
    compiler = _Compiler(formats, memo_size)
    try:
        root = compiler.node(schema)
    except Unsupported:
        return None
    return FastCheck(_never_raises(root.check), root.depth, tuple(compiler.memos), compiler.regexes)


__all__ = ["Check", "FastCheck", "Unsupported", "compile_fast"]
