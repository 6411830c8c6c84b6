"""A model artefact on disk: the one place that knows its files (names from the registry).

``model.txt`` (LightGBM text), ``ratio_model.txt`` (the ratio model, when there is one),
``metadata.json`` (features, categories, intervals, version) and,
when the trainer made one, ``lookup.json`` (the fallback table). The core classes only turn
themselves into text and back; this module does the file I/O, each file written atomically.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import ThroughputModel
from leap_stream.store.files import write_atomic
from leap_stream.store.registry import LOOKUP, METADATA, MODEL_TEXT, RATIO_TEXT


def write_model(
    directory: str | os.PathLike[str], model: ThroughputModel, lookup: LookupTable | None = None
) -> Path:
    """Write the artefact's files into ``directory`` (created) and return it."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / MODEL_TEXT, model.model_text().encode())
    ratio = model.ratio_text()
    if ratio is not None:
        write_atomic(d / RATIO_TEXT, ratio.encode())
    write_atomic(
        d / METADATA,
        orjson.dumps(model.metadata, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY),
    )
    if lookup is not None:
        write_lookup(d / LOOKUP, lookup)
    return d


def write_lookup(path: str | os.PathLike[str], lookup: LookupTable) -> Path:
    return write_atomic(Path(path), orjson.dumps(lookup.to_dict()))


def read_lookup(path: str | os.PathLike[str]) -> LookupTable:
    return LookupTable.from_dict(orjson.loads(Path(path).read_bytes()))


def read_model(directory: str | os.PathLike[str]) -> ThroughputModel:
    """The model of an artefact; its text is checked before LightGBM parses it."""
    d = Path(directory)
    metadata = orjson.loads((d / METADATA).read_bytes())
    ratio = (d / RATIO_TEXT).read_bytes() if (d / RATIO_TEXT).exists() else None
    return ThroughputModel.from_text((d / MODEL_TEXT).read_bytes(), metadata, ratio)


def read_artefact(directory: str | os.PathLike[str]) -> tuple[ThroughputModel, LookupTable | None]:
    """The model and, when the artefact has one, its lookup table."""
    d = Path(directory)
    lookup = read_lookup(d / LOOKUP) if (d / LOOKUP).exists() else None
    return read_model(d), lookup


__all__ = ["read_artefact", "read_lookup", "read_model", "write_lookup", "write_model"]
