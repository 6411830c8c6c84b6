"""matplotlib for the tools' plots, an optional dependency: the service never draws.

`pyplot()` is matplotlib.pyplot on the non-interactive Agg backend, or a clear error naming the
extra that installs it (`leap-stream[tools]`; `make demo` and `make test` install it)."""

from __future__ import annotations

import importlib.util
from typing import Any

INSTALL_HINT = "plots need matplotlib: pip install 'leap-stream[tools]'"


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plots_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotsUnavailable(INSTALL_HINT) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


__all__ = ["INSTALL_HINT", "PlotsUnavailable", "plots_available", "pyplot"]
