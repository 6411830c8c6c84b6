"""Optional: the serving model's trees compiled to machine code (lleaves, over LLVM).

LightGBM's predict was the largest single cost of a ranking: about 4 µs per (job × candidate)
row for the fleet's model, ~110 µs of a 20-candidate job's ~300 µs (docs/benchmarks.md). The
same trees compiled run the row in ~1.2 µs. The model stays what the trainer wrote (LightGBM's
text format, trained by LightGBM); the compiled form is built in memory from that text when a
model loads (nothing compiled is ever read from disk) and serves only after it gave exactly
LightGBM's output, bit for bit, on probe rows that take both sides of every split.

``LEAP_COMPILED_TREES=auto`` (the default) uses them when the ``compiled`` extra is installed
(``pip install 'leap-stream[compiled]'``, the image has it); ``1`` asks for them (a missing
extra is then a counted compile failure), ``0`` never. Compiling takes seconds (about 3 s for
60 trees on the 2-core box): the worker serves with LightGBM meanwhile and swaps when the
compiled trees are checked (`stream/models.py`). Training on millions of rows scores its own
rows with the same compiler (`fit_scorer`, handed to `ThroughputModel.fit` by the trainer).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from leap_stream.core.predictor import (
    COMPILED_KIND,
    ThroughputModel,
    lightgbm_predict,
    predict_threads,
)

log = logging.getLogger(__name__)

KIND = COMPILED_KIND
# LightGBM takes |x| <= 1e-35 as zero in some splits (kZeroThreshold) where the compiled trees
# compare the value itself; no feature lands there in practice, and a row that does is scored
# by LightGBM (the probe rows include such values).
ZERO_BAND = 1e-30
PROBE_ROWS = 4096
# rows converted to float64 and scored at a time: ~100 MB of a training matrix, not all of it
SCORE_CHUNK = 262_144
# Summing tree by tree (block size 1) without inlining keeps LightGBM's order of additions:
# the output is then identical, not only close, and compiling is ~5x faster than the defaults.
_COMPILE_OPTIONS: dict[str, Any] = {"fblocksize": 1, "finline": False}


class CompileError(RuntimeError):
    """The trees could not be compiled, or the compiled trees disagree with LightGBM."""


def available() -> bool:
    """Whether lleaves (the optional `compiled` extra) can be imported."""
    try:
        import lleaves  # noqa: F401
    except Exception:
        return False
    return True


def wanted(setting: str) -> bool:
    """``LEAP_COMPILED_TREES`` (auto, 1 or 0): whether the worker and the bench compile the
    serving trees; auto means when the compiled extra is installed."""
    return available() if setting == "auto" else setting == "1"


def _trees(model: ThroughputModel, ratio: bool) -> tuple[Any, list[str], dict[str, Any]]:
    """(booster, feature names, categories by feature) of the main or the ratio model."""
    cats = model.metadata.get("categories", {})
    if not ratio:
        return model.booster, model.feature_names, dict(cats)
    names = model.ratio_features
    return model.ratio, names, {n: cats.get(n[2:] if n.startswith("o_") else n, ()) for n in names}


def probe_matrix(
    model: ThroughputModel, rows: int = PROBE_ROWS, seed: int = 0, ratio: bool = False
) -> np.ndarray:
    """Rows on both sides of every split threshold, NaN, and unseen categories, at random (of
    the main booster, or of the ratio model with `ratio`)."""
    return _probe_rows(*_trees(model, ratio), rows=rows, seed=seed)


def _probe_rows(
    booster: Any,
    feature_names: Sequence[str],
    categories: Mapping[str, Sequence[str]],
    rows: int = PROBE_ROWS,
    seed: int = 0,
) -> np.ndarray:
    dump = booster.dump_model()
    n_feat = int(dump["max_feature_idx"]) + 1
    cuts: list[list[float]] = [[] for _ in range(n_feat)]
    categorical = set()
    stack = [t["tree_structure"] for t in dump["tree_info"]]
    while stack:
        node = stack.pop()
        if "split_feature" not in node:
            continue
        f = int(node["split_feature"])
        if node.get("decision_type") == "==":
            categorical.add(f)
        else:
            cuts[f].append(float(node["threshold"]))
        stack += [node["left_child"], node["right_child"]]
    rng = np.random.default_rng(seed)
    X = np.empty((rows, n_feat), np.float64)
    for f in range(n_feat):
        if f in categorical:
            name = feature_names[f] if f < len(feature_names) else ""
            n_levels = len(categories.get(name, ())) or 32
            pool = np.append(np.arange(n_levels + 2, dtype=np.float64), np.nan)
        else:
            t = np.asarray(cuts[f] or [0.0])
            t = np.where(np.abs(t) < ZERO_BAND, 0.0, t)  # the band itself: below
            up = np.where(t == 0.0, 0.0, np.nextafter(t, np.inf))
            pool = np.concatenate([t, up, t - 1e-3, t + 1e-3, [np.nan]])
        X[:, f] = rng.choice(pool, rows)
    # a few rows with a value in LightGBM's zero band (scored by LightGBM, see `score`)
    some = rng.choice(rows, rows // 32, replace=False)
    X[some, rng.integers(0, n_feat, len(some))] = rng.choice([1e-36, -1e-36], len(some))
    return X


def compile_scorer(
    model: ThroughputModel, ratio: bool = False
) -> Callable[[np.ndarray], np.ndarray]:
    """The model's trees (the ratio model's with `ratio`) compiled; raises `CompileError`
    unless they match LightGBM exactly."""
    reference = model.ratio_lightgbm if ratio else model.score_lightgbm
    return compile_booster(*_trees(model, ratio), reference)


def compile_booster(
    booster: Any,
    feature_names: Sequence[str],
    categories: Mapping[str, Sequence[str]],
    reference: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Callable[[np.ndarray], np.ndarray]:
    """A LightGBM booster's trees compiled (`reference`: its own predict unless given); raises
    `CompileError` unless they match it exactly on probe rows. The scorer takes a matrix of
    any float dtype and size: it converts `SCORE_CHUNK` rows at a time, so a year's matrix is
    never copied whole."""
    try:
        import lleaves
    except Exception as exc:
        raise CompileError(
            f"lleaves is not installed ({exc}); pip install 'leap-stream[compiled]'"
        ) from exc
    fd, path = tempfile.mkstemp(prefix="leap-model-", suffix=".txt")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(booster.model_to_string())
        compiled = lleaves.Model(model_file=path)
        compiled.compile(**_COMPILE_OPTIONS)
    except Exception as exc:
        raise CompileError(f"compiling the trees failed: {exc!r}") from exc
    finally:
        os.unlink(path)
    if reference is None:

        def reference(X: np.ndarray) -> np.ndarray:
            return lightgbm_predict(booster, X, predict_threads(len(X)))

    def score_chunk(X: np.ndarray) -> np.ndarray:
        X = np.ascontiguousarray(X, np.float64)
        out = np.asarray(compiled.predict(X, n_jobs=predict_threads(len(X))))
        tiny = ((np.abs(X) < ZERO_BAND) & (X != 0.0)).any(axis=1)
        if tiny.any():  # LightGBM's zero band: those rows are scored by LightGBM itself
            out[tiny] = reference(X[tiny])
        return out

    def score(X: np.ndarray) -> np.ndarray:
        if len(X) <= SCORE_CHUNK:
            return score_chunk(X)
        return np.concatenate(
            [score_chunk(X[i : i + SCORE_CHUNK]) for i in range(0, len(X), SCORE_CHUNK)]
        )

    X = _probe_rows(booster, feature_names, categories)
    want, got = reference(X), score(X)
    if not np.array_equal(want, got, equal_nan=True):
        worst = float(np.nanmax(np.abs(want - got)))
        raise CompileError(f"compiled trees differ from LightGBM on probe rows (max |d| {worst})")
    return score


def fit_scorer(
    booster: Any, categories: Mapping[str, Sequence[str]]
) -> Callable[[np.ndarray], np.ndarray] | None:
    """For `ThroughputModel.fit` (its `compile_trees`): a booster it scores on every training
    row, compiled; None, logged, when that cannot be done (training never fails over a
    speed-up: it scores with LightGBM then)."""
    try:
        return compile_booster(booster, booster.feature_name(), categories)
    except CompileError as exc:
        log.warning("training scores with LightGBM: %s", exc)
        return None


def compiled_model(model: ThroughputModel) -> ThroughputModel:
    """`model` scoring with its compiled trees (`compile_scorer`), the ratio model's too."""
    ratio = compile_scorer(model, ratio=True) if model.ratio is not None else None
    return model.with_scorer(compile_scorer(model), KIND, ratio)


__all__ = [
    "KIND",
    "CompileError",
    "available",
    "compile_booster",
    "compile_scorer",
    "compiled_model",
    "fit_scorer",
    "probe_matrix",
    "wanted",
]
