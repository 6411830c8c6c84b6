"""The JSON Schemas (``schemas/*.schema.json``, the source of truth) compiled once per process.

fastjsonschema turns each schema into generated Python, about 10x faster than an interpreting
validator, which matters on the hot path. It implements drafts 4, 6 and 7 and, for a ``$schema``
it does not know (our 2020-12 URL), uses its latest generator (draft-07 keywords plus formats).
That is exact for our schemas because they only use keywords whose meaning is the same in
draft-07 and 2020-12 (``tests/unit/test_contracts.py`` enforces the list); ``$defs`` is resolved
as a plain JSON pointer, so ``#/$defs/...`` refs work.

``format: date-time`` is checked by our own function rather than fastjsonschema's regex, which
accepts offsets without a colon and lower-case ``t``/``z``, and does not know that
``datetime.fromisoformat`` (what ``parse_ts`` uses) rejects year 0 and leap seconds. Accepting
exactly what the service can parse keeps "valid" meaning "usable".
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import fastjsonschema
import orjson

from leap_stream.contracts.fastpath import FastCheck, compile_fast

SCHEMA_NAMES: Final = (
    "job-submitted",
    "job-completed",
    "hardware-ranking",
    "dead-letter",
    "hardware-catalog",
)

# RFC 3339 date-time, the subset we emit and accept: upper-case T and Z, a colon in the offset,
# at most nanoseconds. Calendar validity (Feb 30, year 0, second 60) is left to fromisoformat.
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)")


def is_rfc3339(value: str) -> bool:
    """The ``date-time`` format: an RFC 3339 timestamp that ``parse_ts`` can turn into epoch s."""
    if _RFC3339.fullmatch(value) is None:
        return False
    try:
        datetime.fromisoformat(value).timestamp()
    except (ValueError, OverflowError):
        return False
    return True


def schema_dir() -> Path:
    """Installed wheel: ``leap_stream/_schemas`` (pyproject force-include); checkout: ``schemas/``."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_schemas", package.parent / "schemas"):
        if (candidate / "job-submitted.schema.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"no schemas folder: looked for {package / '_schemas'} and {package.parent / 'schemas'}"
    )


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    """The parsed schema document ``name`` (one of ``SCHEMA_NAMES``)."""
    if name not in SCHEMA_NAMES:
        raise KeyError(f"unknown schema {name!r}; known: {', '.join(SCHEMA_NAMES)}")
    doc: dict[str, Any] = orjson.loads((schema_dir() / f"{name}.schema.json").read_bytes())
    return doc


def inline_defs(node: Any, defs: dict[str, Any], _seen: tuple[str, ...] = ()) -> Any:
    """``node`` with every local ``#/$defs/x`` ref replaced by the definition (siblings kept).

    Why: fastjsonschema compiles a ref into a function call whose error-path argument is built
    eagerly with ``str.format(**locals())`` for each array item; inlined, that work happens only
    when an error is raised. Validation of a job-submitted event takes about half the time.
    Equivalent for our schemas: a ref's siblings are annotations only, and no def is recursive
    (a recursive or non-local ref is left as it is).
    """
    if isinstance(node, list):
        return [inline_defs(item, defs, _seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        key = ref.removeprefix("#/$defs/")
        if key in defs and key not in _seen:
            target = inline_defs(defs[key], defs, (*_seen, key))
            siblings = {k: inline_defs(v, defs, _seen) for k, v in node.items() if k != "$ref"}
            return {**target, **siblings}
    return {k: inline_defs(v, defs, _seen) for k, v in node.items()}


# The custom formats given to fastjsonschema, and to the fast path (which must use the same ones).
FORMATS: Final[dict[str, Callable[[str], bool]]] = {"date-time": is_rfc3339}


@functools.cache
def validator(name: str) -> Callable[[Any], Any]:
    """The compiled validator of ``name``; raises ``fastjsonschema.JsonSchemaValueException``.

    ``use_default=False``: a validator must never change the event it checks. The copy: the
    compiler rewrites ``$ref`` values in the document it is given to absolute URIs (and
    ``inline_defs`` builds a new document anyway; ``$defs`` stays, for any ref left).
    """
    doc = load_schema(name)
    compiled: Callable[[Any], Any] = fastjsonschema.compile(
        copy.deepcopy(inline_defs(doc, doc.get("$defs", {}))),
        formats=FORMATS,
        use_default=False,
    )
    return compiled


@functools.cache
def fast_validator(name: str) -> FastCheck | None:
    """The fast "certainly valid" check of ``name`` (see ``fastpath``), None if it has none.

    Derived from the same document as ``validator`` when first asked for, never hand-written.
    """
    doc = load_schema(name)
    return compile_fast(inline_defs(doc, doc.get("$defs", {})), FORMATS)


__all__ = [
    "FORMATS",
    "SCHEMA_NAMES",
    "fast_validator",
    "inline_defs",
    "is_rfc3339",
    "load_schema",
    "schema_dir",
    "validator",
]
