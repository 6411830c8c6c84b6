"""The closed vocabularies of the events, as tuples in schema order.

Derived from the Literal types of `contracts/events.py` (the one Python definition of each
list; `tests/unit/test_contracts_vocab.py` checks them against the enums in `schemas/`). The
simulator indexes its tables by these and the feature builder encodes categoricals with them,
so their order is part of a trained model.
"""

from __future__ import annotations

from typing import get_args

from leap_stream.contracts.events import Family, Framework, Optimizer, Precision, Vendor

FAMILIES: tuple[str, ...] = get_args(Family)
PRECISIONS: tuple[str, ...] = get_args(Precision)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
FRAMEWORKS: tuple[str, ...] = get_args(Framework)
VENDORS: tuple[str, ...] = get_args(Vendor)

__all__ = ["FAMILIES", "FRAMEWORKS", "OPTIMIZERS", "PRECISIONS", "VENDORS"]
