"""The hardware catalog: which accelerator types exist, their specs and what they cost.

The catalog is package data (``hardware.json``) validated against
``schemas/hardware-catalog.schema.json`` at load time, so a bad edit fails loudly at start-up
instead of producing silently wrong cost rankings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import fastjsonschema
import orjson
import pandas as pd

CATALOG_PATH = Path(__file__).with_name("hardware.json")
# Parts of public benchmark tables that the fleet catalog lacks: for `leap-stream evaluate`
# only, never offered to the fleet.
REFERENCE_PATH = Path(__file__).with_name("reference.json")
SCHEMA_NAME = "hardware-catalog"

NUMERIC_COLUMNS = (
    "device_memory_gib",
    "peak_bf16_tflops",
    "memory_bandwidth_gbps",
    "interconnect_gbps",
    "cost_per_device_hour",
)


@functools.cache
def _validator() -> Callable[[Any], Any]:
    from leap_stream.contracts.schemas import validator

    return validator(SCHEMA_NAME)


class CatalogError(ValueError):
    """The catalog file is not valid against its schema or is inconsistent."""


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator type, exactly the catalog fields."""

    type_id: str
    vendor: str
    name: str
    device_memory_gib: float
    peak_bf16_tflops: float
    memory_bandwidth_gbps: float
    interconnect_gbps: float
    cost_per_device_hour: float
    source: str
    generation_year: int | None = None
    peak_fp8_tflops: float | None = None
    peak_fp32_tflops: float | None = None
    scale_up_domain: int | None = None
    network_gbps: float | None = None
    aliases: tuple[str, ...] = ()


_SPEC_FIELDS = tuple(f.name for f in fields(HardwareSpec))


def _spec_fields(item: dict[str, Any]) -> dict[str, Any]:
    """A validated catalog entry as `HardwareSpec` arguments (aliases as a tuple)."""
    out: dict[str, Any] = {k: v for k, v in item.items() if k in _SPEC_FIELDS}
    out["aliases"] = tuple(item.get("aliases", ()))
    return out


class HardwareCatalog:
    """Immutable, ordered set of hardware types (order = file order, used for stable output)."""

    def __init__(self, specs: list[HardwareSpec]) -> None:
        ids = [s.type_id for s in specs]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise CatalogError(f"duplicate type_id in catalog: {dupes}")
        self._specs = {s.type_id: s for s in specs}
        self.types: tuple[str, ...] = tuple(ids)
        self._names: dict[str, str] = {}
        for s in specs:
            for n in {a.strip().lower() for a in (*s.aliases, s.type_id)}:
                if self._names.setdefault(n, s.type_id) != s.type_id:
                    raise CatalogError(f"{n!r} names both {self._names[n]} and {s.type_id}")

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> HardwareCatalog:
        try:
            _validator()(doc)
        except fastjsonschema.JsonSchemaException as exc:
            raise CatalogError(f"hardware catalog invalid: {exc}") from exc
        specs = [HardwareSpec(**_spec_fields(item)) for item in doc["hardware"]]
        return cls(specs)

    def merged(self, other: HardwareCatalog) -> HardwareCatalog:
        """This catalog with `other`'s types added, and replacing ours where the ids match."""
        specs = dict(self._specs)
        specs.update({s.type_id: s for s in other})
        return HardwareCatalog(list(specs.values()))

    def resolve(self, name: str) -> str | None:
        """The type id a table or telemetry calls `name`: a type id or an alias, matched
        case-insensitively; None when the catalog has no such type."""
        return self._names.get(name.strip().lower())

    def __getitem__(self, type_id: str) -> HardwareSpec:
        return self._specs[type_id]

    def __contains__(self, type_id: object) -> bool:
        return type_id in self._specs

    def __iter__(self) -> Iterator[HardwareSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    @property
    def vendors(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.vendor for s in self._specs.values()))

    def spec_matrix(self) -> pd.DataFrame:
        """Numeric specs indexed by type_id: the features and cost inputs the core uses."""
        rows = [{c: float(getattr(s, c)) for c in NUMERIC_COLUMNS} for s in self]
        frame = pd.DataFrame(rows, index=pd.Index(self.types, name="type_id"))
        frame["vendor"] = [s.vendor for s in self]
        # optional specs: NaN when the datasheet gives none (no fp8 path, year unknown) or the
        # catalog does not say how the part is deployed
        frame["peak_fp8_tflops"] = [float(s.peak_fp8_tflops or "nan") for s in self]
        frame["generation_year"] = [float(s.generation_year or "nan") for s in self]
        frame["scale_up_domain"] = [float(s.scale_up_domain or "nan") for s in self]
        frame["network_gbps"] = [float(s.network_gbps or "nan") for s in self]
        return frame

    def to_dict(self) -> dict[str, Any]:
        items = []
        for s in self:
            item = {k: getattr(s, k) for k in _SPEC_FIELDS}
            item["aliases"] = list(s.aliases)
            items.append(
                {
                    k: v
                    for k, v in item.items()
                    if (v is not None and v != []) or k == "peak_fp8_tflops"
                }
            )
        return {"schema_version": 1, "hardware": items}


def load_catalog(path: Path | None = None) -> HardwareCatalog:
    """Load and validate a catalog file; no path: the packaged default (cached)."""
    if path is None:
        return _default_catalog()
    return HardwareCatalog.from_dict(orjson.loads(Path(path).read_bytes()))


class CatalogFile:
    """A catalog file the worker hot-reloads: `poll()` returns the new catalog when the file
    changed (one stat per call) and loads cleanly; a bad edit raises `CatalogError` and the
    caller keeps the catalog it has. No path: the packaged catalog, which never changes."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._token: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self) -> HardwareCatalog:
        """The catalog now (at start: a missing or bad file is an error, not a fallback)."""
        self._token = self._stat()
        if self.path is None:
            return _default_catalog()
        try:
            return load_catalog(self.path)
        except (OSError, orjson.JSONDecodeError) as exc:
            raise CatalogError(f"{self.path}: {exc}") from exc

    def poll(self) -> HardwareCatalog | None:
        """The new catalog when the file changed since the last load or poll, else None."""
        token = self._stat()
        if self.path is None or token == self._token or token is None:
            return None
        return self.load()


def load_reference_catalog() -> HardwareCatalog:
    """The fleet catalog with the reference parts of public benchmark tables added."""
    return _default_catalog().merged(_reference_catalog())


@functools.cache
def _reference_catalog() -> HardwareCatalog:
    return HardwareCatalog.from_dict(orjson.loads(REFERENCE_PATH.read_bytes()))


@functools.cache
def _default_catalog() -> HardwareCatalog:
    return HardwareCatalog.from_dict(orjson.loads(CATALOG_PATH.read_bytes()))


__all__ = [
    "CATALOG_PATH",
    "NUMERIC_COLUMNS",
    "REFERENCE_PATH",
    "CatalogError",
    "CatalogFile",
    "HardwareCatalog",
    "HardwareSpec",
    "load_catalog",
    "load_reference_catalog",
]
