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


_SPEC_FIELDS = tuple(f.name for f in fields(HardwareSpec))


class HardwareCatalog:
    """Immutable, ordered set of hardware types (order = file order, used for stable output)."""

    def __init__(self, specs: list[HardwareSpec]) -> None:
        ids = [s.type_id for s in specs]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise CatalogError(f"duplicate type_id in catalog: {dupes}")
        self._specs = {s.type_id: s for s in specs}
        self.types: tuple[str, ...] = tuple(ids)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> HardwareCatalog:
        try:
            _validator()(doc)
        except fastjsonschema.JsonSchemaException as exc:
            raise CatalogError(f"hardware catalog invalid: {exc}") from exc
        specs = [
            HardwareSpec(**{k: v for k, v in item.items() if k in _SPEC_FIELDS})
            for item in doc["hardware"]
        ]
        return cls(specs)

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
        return frame

    def to_dict(self) -> dict[str, Any]:
        items = []
        for s in self:
            item = {k: getattr(s, k) for k in _SPEC_FIELDS}
            items.append({k: v for k, v in item.items() if v is not None or k == "peak_fp8_tflops"})
        return {"schema_version": 1, "hardware": items}


def load_catalog(path: Path | None = None) -> HardwareCatalog:
    """Load and validate a catalog file; no path: the packaged default (cached)."""
    if path is None:
        return _default_catalog()
    return HardwareCatalog.from_dict(orjson.loads(Path(path).read_bytes()))


@functools.cache
def _default_catalog() -> HardwareCatalog:
    return HardwareCatalog.from_dict(orjson.loads(CATALOG_PATH.read_bytes()))


__all__ = [
    "CATALOG_PATH",
    "NUMERIC_COLUMNS",
    "CatalogError",
    "HardwareCatalog",
    "HardwareSpec",
    "load_catalog",
]
