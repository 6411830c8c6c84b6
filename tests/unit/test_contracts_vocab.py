"""The vocabularies the simulator and the features use are the schemas' enums, in order."""

from __future__ import annotations

import orjson
import pytest

from leap_stream.contracts import vocab
from leap_stream.contracts.schemas import schema_dir


def _enum(schema: str, *path: str) -> list[str]:
    node = orjson.loads((schema_dir() / f"{schema}.schema.json").read_bytes())
    for key in path:
        node = node[key]
    return list(node["enum"])


@pytest.mark.parametrize(
    ("values", "schema", "path"),
    [
        (vocab.FAMILIES, "job-submitted", ("properties", "model", "properties", "family")),
        (vocab.PRECISIONS, "job-submitted", ("properties", "model", "properties", "precision")),
        (vocab.OPTIMIZERS, "job-submitted", ("properties", "model", "properties", "optimizer")),
        (vocab.FRAMEWORKS, "job-submitted", ("properties", "model", "properties", "framework")),
        (
            vocab.VENDORS,
            "hardware-catalog",
            ("properties", "hardware", "items", "properties", "vendor"),
        ),
    ],
)
def test_vocabulary_is_the_schema_enum_in_order(
    values: tuple[str, ...], schema: str, path: tuple[str, ...]
) -> None:
    assert list(values) == _enum(schema, *path)


def test_simulator_and_features_use_the_same_vocabulary() -> None:
    from leap_stream.core import features
    from leap_stream.tools.sim import models

    assert models.FAMILIES is vocab.FAMILIES
    assert features.CATEGORIES["family"] is vocab.FAMILIES
    assert features.CATEGORIES["vendor"] is vocab.VENDORS
