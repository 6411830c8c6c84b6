"""`LearnedRoofline`: the physics rate of a job on a type, its efficiencies learned from measurements.

The feature builder places each job's analytic work on each type's peaks (`features.hw_columns`):
seconds per sample per device of compute (`log_t_compute`), of memory traffic (`log_t_memory`),
of all-reduces (`log_t_comm`) and of an all-to-all (`log_t_a2a`), at fixed textbook
efficiencies. This model learns what those constants cannot know, from the measured rates:

    log rate = −log T − b·log(1 + pp_bubble) + o
    T        = softmax_k(Tc, Ta + Tw) · (1 + S·K / (I + K)) + Tx + Tt    seconds per sample per device
    T_term   = T_term,physics · e^(−e_term)

where each term's efficiency e sums a constant and effects (`TERMS`: of the family, the model
type, the hardware type, the precision × vendor path…; compute also a slope in the type's peak,
big chips being harder to fill), o sums software-maturity effects of (family × vendor) and
(framework × vendor), and softmax_k is a soft maximum of learned sharpness (compute and memory
overlap but for a residue near the ridge). Every effect is a deviation from its term's constant,
shrunk toward it by a ridge of `SHRINK` pseudo-rows; a level never measured (a new type, a new
model type) takes its parents' value. Fitted by robust least squares (soft-l1) with an analytic
sparse Jacobian; no I/O. Its parameters travel as JSON (`to_json` / `from_json`) in the model's
metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, sparse

from leap_stream.core.columns import Frame, column_codes, f64

Effect = tuple[str, ...]  # one or two categorical columns


@dataclass(frozen=True)
class TimeTerm:
    """One part of the time per sample: its physics column, its efficiency's effects and the
    efficiency it starts from."""

    name: str
    column: str
    effects: tuple[Effect, ...]
    start: float = 0.0


COMPUTE = "compute"
MEMORY_TERMS = 2  # the terms after compute that make up memory time (activations, weights)
TERMS = (
    TimeTerm(
        COMPUTE,
        "log_t_compute",
        (("family",), ("model_type",), ("hardware_type",), ("precision", "vendor")),
    ),
    TimeTerm(
        "activations", "log_t_activations", (("family",), ("model_type",), ("hardware_type",))
    ),
    TimeTerm("weights", "log_t_weights", (("family",), ("model_type",))),
    TimeTerm("comm", "log_t_comm", (("family",), ("model_type",))),
    TimeTerm("a2a", "log_t_a2a", (("family",), ("model_type",)), start=3.0),
)
OUTER_EFFECTS: tuple[Effect, ...] = (("family", "vendor"), ("framework", "vendor"))
HW_SIDE = ("hardware_type", "vendor")  # read from the "o_" columns for a prior's type
SCALARS = ("log_sharpness", "log_small", "log_knee", "bubble", "peak_slope")
SCALAR_START = (float(np.log(4.0)), 0.0, float(np.log(0.004)), 1.0, 0.0)
SHARPNESS = (0.0, float(np.log(64.0)))  # log bounds of the soft maximum's sharpness
PEAK_CENTRE = float(np.log(312.0))  # the slope's reference: a 312 TFLOP/s part
ABSENT = -30.0  # log seconds of a term the physics leaves out (no communication: one device)
SHRINK = 30.0  # ridge: pseudo-rows at the term's constant of every effect
FIT_ROWS = 150_000  # rows the fit sees at most (a seeded sample beyond)
PREDICT_ROWS = 500_000  # rows of a training frame predicted at once
# (share of the fitted rows, evaluations at most): a rough fit on a third of the rows, then a
# few steps on all of them; as good as 400 evaluations on every row at a tenth of the time
# (docs/research/2026-12-06-learned-roofline.md)
STAGES = ((1 / 3, 150), (1.0, 30))
ROBUST_SCALE = 0.1  # soft-l1 loss: residuals beyond ~10 % count linearly, not squared


@dataclass(frozen=True)
class _Effect:
    """One effect's parameters: its group ("compute", …, "outer"), columns, levels per column,
    first parameter's index (a flat table over the level combinations)."""

    group: str
    columns: Effect
    levels: tuple[tuple[str, ...], ...]
    start: int

    @property
    def key(self) -> str:
        return self.key_of(self.group, self.columns)

    @staticmethod
    def key_of(group: str, columns: Effect) -> str:
        """An effect's name on disk: its group and columns ("compute:precision|vendor")."""
        return f"{group}:{'|'.join(columns)}"

    @property
    def size(self) -> int:
        return int(np.prod([len(lv) for lv in self.levels]))

    @cached_property
    def luts(self) -> list[dict[str, int]]:
        return [{v: i for i, v in enumerate(lv)} for lv in self.levels]

    def codes(
        self,
        frame: Frame,
        prefix: str,
        known: dict[tuple[str, int], np.ndarray],
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """Per row (of `rows`; every row when None), the flat index of its level combination;
        −1 when one is unseen. `known`: a column's codes over the same levels (the same level
        tuple: `_layout` shares equal ones), as other effects of one call looked them up."""
        parts = []
        for col, lv, lut in zip(self.columns, self.levels, self.luts, strict=True):
            name = prefix + col if col in HW_SIDE else col
            c = known.get((name, id(lv)))
            if c is None:
                c = np.asarray(column_codes(frame, name, lut), np.int64)
                c = known[(name, id(lv))] = c if rows is None else c[rows]
            parts.append(c)
        if len(parts) == 1:  # one column: its codes are the flat index, −1 where unseen
            return parts[0]
        first, second = parts  # two columns (`Effect`): row-major over their levels
        flat = first * len(self.levels[1]) + second
        return np.where((first >= 0) & (second >= 0), flat, -1)


def _groups() -> list[tuple[str, tuple[Effect, ...]]]:
    return [*((t.name, t.effects) for t in TERMS), ("outer", OUTER_EFFECTS)]


@dataclass(frozen=True)
class _Rows:
    """The model's inputs on a frame's rows."""

    times: np.ndarray  # (rows, terms): each term's physics log seconds
    ideal: np.ndarray  # log seconds of a micro-batch at the type's peak
    peak: np.ndarray  # log peak TFLOP/s
    bubble: np.ndarray  # log(1 + pipeline bubble)
    codes: list[np.ndarray]  # per effect, flat level index or −1
    ok: np.ndarray  # compute and memory times known

    def take(self, rows: np.ndarray) -> _Rows:
        return _Rows(
            self.times[rows],
            self.ideal[rows],
            self.peak[rows],
            self.bubble[rows],
            [c[rows] for c in self.codes],
            self.ok[rows],
        )


class LearnedRoofline:
    def __init__(self, effects: Sequence[_Effect], theta: np.ndarray) -> None:
        self.effects = list(effects)
        self.theta = np.asarray(theta, np.float64)
        self._n_effects = sum(e.size for e in self.effects)
        # parameter positions: effects, then one constant per term, then the scalars
        self._const = self._n_effects
        self._scalar = self._n_effects + len(TERMS)

    @classmethod
    def start(cls, effects: Sequence[_Effect]) -> LearnedRoofline:
        n = sum(e.size for e in effects)
        return cls(effects, np.array([*np.zeros(n), *(t.start for t in TERMS), *SCALAR_START]))

    # --- fitting
    @classmethod
    def fit(cls, frame: pd.DataFrame, log_rate: np.ndarray, seed: int = 0) -> LearnedRoofline:
        """Fit on `frame`'s rows (a training frame of the feature builder: each row a job on the
        type it ran on) against `log_rate`, the measured log per-device samples/s. Rows without
        the physics inputs (a table without configuration) are not fitted."""
        y = np.asarray(log_rate, np.float64)
        model = cls.start(_effects(frame))
        rows = model._rows(frame, "")
        use = np.flatnonzero(rows.ok & np.isfinite(y))
        if len(use) == 0:
            return model
        rng = np.random.default_rng(seed)
        if len(use) > FIT_ROWS:
            use = np.sort(rng.choice(use, FIT_ROWS, replace=False))
        theta = model._start_near(rows.take(use), y[use])
        # a rough fit on a sample first, then few steps on every row from there
        for share, evaluations in STAGES:
            some = use if share >= 1.0 else np.sort(rng.choice(use, int(share * len(use)), False))
            theta = model._least_squares(rows.take(some), y[some], theta, evaluations)
        return cls(model.effects, theta)

    def _least_squares(
        self, rows: _Rows, y: np.ndarray, theta0: np.ndarray, evaluations: int
    ) -> np.ndarray:
        ridge = np.full(self._n_effects, np.sqrt(SHRINK))

        def residuals(theta: np.ndarray) -> np.ndarray:
            rate = self._log_rate(rows, theta)
            return np.concatenate([rate - y, ridge * theta[: self._n_effects]])

        fit = optimize.least_squares(
            residuals,
            theta0,
            jac=_SparseJacobian(self, rows, ridge),
            method="trf",
            tr_solver="lsmr",
            loss="soft_l1",
            f_scale=ROBUST_SCALE,
            max_nfev=evaluations,
            x_scale="jac",
        )
        return np.asarray(fit.x)

    def _start_near(self, rows: _Rows, y: np.ndarray) -> np.ndarray:
        """Parameters where each model type's rate matches its median measurement: the model
        type's residual as the same efficiency of every compute and memory term (a model whose
        configuration says too little about its work does more of all of it). From here each
        term keeps a gradient; from zero, a term the physics puts orders of magnitude too
        small has none."""
        theta = self.theta.copy()
        resid = y - self._log_rate(rows, theta)
        theta[self._const : self._const + 1 + MEMORY_TERMS] += float(np.median(resid))
        resid = y - self._log_rate(rows, theta)
        for e, codes in zip(self.effects, rows.codes, strict=True):
            if e.columns == ("model_type",) and e.group in self._memory_and_compute():
                seen = codes >= 0
                per = pd.Series(resid[seen]).groupby(codes[seen]).median()
                theta[e.start + per.index.to_numpy()] = per.to_numpy()
        return theta

    @staticmethod
    def _memory_and_compute() -> set[str]:
        return {t.name for t in TERMS[: 1 + MEMORY_TERMS]}

    # --- prediction
    def predict(self, frame: Frame, prefix: str = "", rows: np.ndarray | None = None) -> np.ndarray:
        """Per row (of `rows`; every row when None), the log per-device samples/s of the job on
        the row's type (``prefix`` "o_": on its prior type); NaN where the physics inputs are
        missing. A training frame of millions of rows goes by slices of `PREDICT_ROWS`: the
        inputs of every row at once would cost a year's training gigabytes at its peak."""
        if rows is None and isinstance(frame, pd.DataFrame) and len(frame) > PREDICT_ROWS:
            parts = range(0, len(frame), PREDICT_ROWS)
            return np.concatenate(
                [self.predict(frame.iloc[i : i + PREDICT_ROWS], prefix) for i in parts]
            )
        inputs = self._rows(frame, prefix, rows)
        out = np.full(len(inputs.ideal), np.nan)
        ok = np.flatnonzero(inputs.ok)
        out[ok] = self._log_rate(inputs.take(ok), self.theta)
        return out

    def _rows(self, frame: Frame, prefix: str, rows: np.ndarray | None = None) -> _Rows:
        """The model's inputs on `frame`'s rows (those of `rows`; every row when None)."""

        def column(name: str) -> np.ndarray:
            values = f64(frame, name)
            return values if rows is None else values[rows]

        times = np.column_stack([column(prefix + t.column) for t in TERMS])
        ok = np.isfinite(times[:, : 1 + MEMORY_TERMS]).all(axis=1)
        times = np.where(np.isfinite(times), times, ABSENT)
        ideal = column(prefix + "log_ideal_micro_s")
        peak = column(prefix + "log_peak_tflops")
        ok &= np.isfinite(ideal) & np.isfinite(peak)
        bubble = column("pp_bubble") if "pp_bubble" in frame else np.zeros(len(ideal))
        bubble = np.log1p(np.fmax(np.where(np.isfinite(bubble), bubble, 0.0), 0.0))
        known: dict[tuple[str, int], np.ndarray] = {}
        codes = [e.codes(frame, prefix, known, rows) for e in self.effects]
        return _Rows(times, ideal, peak, bubble, codes, ok)

    def _efficiency(self, rows: _Rows, theta: np.ndarray, group: str) -> np.ndarray:
        padded = self._padded if theta is self.theta else self._pad(theta)
        out = np.zeros(len(rows.ideal))
        for i in self._by_group[group]:
            out += padded[i][rows.codes[i]]  # −1: the padding, zero
        return out

    @cached_property
    def _by_group(self) -> dict[str, list[int]]:
        """Each group's effects, by position."""
        out: dict[str, list[int]] = {}
        for i, e in enumerate(self.effects):
            out.setdefault(e.group, []).append(i)
        return out

    def _pad(self, theta: np.ndarray) -> list[np.ndarray]:
        """Each effect's values of `theta` with a zero after them (what code −1 looks up)."""
        return [np.append(theta[e.start : e.start + e.size], 0.0) for e in self.effects]

    @cached_property
    def _padded(self) -> list[np.ndarray]:
        return self._pad(self.theta)

    def _times(self, rows: _Rows, theta: np.ndarray) -> dict[str, Any]:
        """The time per sample and what it is made of (what the rate needs)."""
        s = dict(zip(SCALARS, theta[self._scalar :].tolist(), strict=True))
        logs = []
        for i, term in enumerate(TERMS):
            e = theta[self._const + i] + self._efficiency(rows, theta, term.name)
            if term.name == COMPUTE:
                e = e + s["peak_slope"] * (rows.peak - PEAK_CENTRE)
            logs.append(rows.times[:, i] - e)
        # the small-work penalty's knee in the time a micro-batch really takes at the compute
        # efficiency (a job of more work than its configuration says fills a chip better)
        ideal = np.exp(np.fmin(logs[0] - rows.times[:, 0] + rows.ideal, 30.0))
        knee = np.exp(s["log_knee"])
        small = np.exp(s["log_small"]) * knee / (ideal + knee)
        lc = logs[0]
        lm = np.logaddexp.reduce(logs[1 : 1 + MEMORY_TERMS], axis=0)
        k = np.exp(min(max(s["log_sharpness"], SHARPNESS[0]), SHARPNESS[1]))
        # the soft maximum of compute and memory, slower by the small-work penalty
        lcm = np.logaddexp(k * lc, k * lm) / k + np.log1p(small)
        rest = logs[1 + MEMORY_TERMS :]
        t = [np.exp(np.fmin(lcm, 30.0)), *(np.exp(np.fmin(lg, 30.0)) for lg in rest)]
        total = np.sum(t, axis=0)
        return {
            "logs": logs,
            "lc": lc,
            "lm": lm,
            "k": k,
            "lcm": lcm,
            "t": t,
            "small": small,
            "ideal": ideal,
            "knee": knee,
            "total": total,
        }

    def _parts(self, rows: _Rows, theta: np.ndarray) -> dict[str, Any]:
        """`_times` and the shares its derivatives need."""
        p = self._times(rows, theta)
        lm, total = p["lm"], p["total"]
        return p | {
            "memory_shares": [np.exp(lg - lm) for lg in p["logs"][1 : 1 + MEMORY_TERMS]],
            "w": 1.0 / (1.0 + np.exp(np.clip(p["k"] * (lm - p["lc"]), -50.0, 50.0))),  # d lcm/d lc
            "shares": [ti / total for ti in p["t"]],  # of the soft maximum, then each other term
        }

    def _log_rate(self, rows: _Rows, theta: np.ndarray) -> np.ndarray:
        total = self._times(rows, theta)["total"]
        bubble = theta[self._scalar + SCALARS.index("bubble")]
        outer = self._efficiency(rows, theta, "outer")
        return np.asarray(-np.log(total) - bubble * rows.bubble + outer)

    def _jacobian_values(self, rows: _Rows, theta: np.ndarray) -> np.ndarray:
        """d log rate / d theta per row, at `_pattern`'s places: an efficiency's column holds
        the share of the time its term takes (1 for the outer effects), the scalars their own
        derivatives."""
        p = self._parts(rows, theta)
        n = len(p["lc"])
        w, share = p["w"], p["shares"]
        memory = [share[0] * (1.0 - w) * m for m in p["memory_shares"]]
        d_small = p["small"] / (1.0 + p["small"])  # d lcm / d log_small
        at_knee = p["ideal"] / (p["ideal"] + p["knee"])
        compute = share[0] * (w - d_small * at_knee)
        by_term = [compute, *memory, *share[1:]]  # d log rate / d e_term
        scalar_cols = {
            "log_sharpness": _inside(theta[self._scalar], SHARPNESS)
            * -share[0]
            * (w * p["lc"] + (1.0 - w) * p["lm"] - (p["lcm"] - np.log1p(p["small"]))),
            "log_small": -share[0] * d_small,
            "log_knee": -share[0] * d_small * at_knee,
            "bubble": -rows.bubble,
            "peak_slope": by_term[0] * (rows.peak - PEAK_CENTRE),
        }
        weight = {t.name: by_term[i] for i, t in enumerate(TERMS)} | {"outer": np.ones(n)}
        data = [weight[e.group][c >= 0] for e, c in zip(self.effects, rows.codes, strict=True)]
        data += [*by_term, *(scalar_cols[k] for k in SCALARS)]
        return np.concatenate(data)

    def _pattern(self, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        """(row, column) of every value `_jacobian_values` returns, in its order."""
        n = len(rows.ideal)
        ridx = [np.flatnonzero(c >= 0) for c in rows.codes]
        cols = [e.start + c[c >= 0] for e, c in zip(self.effects, rows.codes, strict=True)]
        for j in range(len(self.theta) - self._const):
            ridx.append(np.arange(n))
            cols.append(np.full(n, self._const + j))
        return np.concatenate(ridx), np.concatenate(cols)

    def without_types(self, types: Sequence[str]) -> LearnedRoofline:
        """This model as if `types` had never been measured: their own effects at zero (their
        parents' value), what a fit without their rows knows of them."""
        theta = self.theta.copy()
        for e in self.effects:
            if "hardware_type" not in e.columns:
                continue
            at = e.columns.index("hardware_type")
            for i, level in enumerate(e.levels[at]):
                if level in types:
                    table = theta[e.start : e.start + e.size].reshape([len(lv) for lv in e.levels])
                    np.moveaxis(table, at, 0)[i] = 0.0
        return type(self)(self.effects, theta)

    # --- artefact
    def to_json(self) -> dict[str, Any]:
        return {
            "effects": {
                e.key: {
                    "levels": [list(lv) for lv in e.levels],
                    "values": [round(float(v), 6) for v in self.theta[e.start : e.start + e.size]],
                }
                for e in self.effects
            },
            "constants": {
                t.name: round(float(self.theta[self._const + i]), 6) for i, t in enumerate(TERMS)
            },
            "scalars": {
                k: round(float(v), 6)
                for k, v in zip(SCALARS, self.theta[self._scalar :], strict=True)
            },
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> LearnedRoofline:
        entries = doc["effects"]
        effects = _layout(lambda key, _col, i: tuple(str(v) for v in entries[key]["levels"][i]))
        values: list[float] = []
        for e in effects:
            stored = entries[e.key]["values"]
            if len(stored) != e.size:
                raise ValueError(f"roofline effect {e.key}: {e.size} values expected")
            values.extend(float(v) for v in stored)
        values.extend(float(doc["constants"][t.name]) for t in TERMS)
        values.extend(float(doc["scalars"][k]) for k in SCALARS)
        return cls(effects, np.asarray(values))


class _SparseJacobian:
    """The fit's Jacobian (the rows', then the ridge's) as CSR, its pattern built once: each
    call only places the new values."""

    def __init__(self, model: LearnedRoofline, rows: _Rows, ridge: np.ndarray) -> None:
        self._model, self._rows, self._ridge = model, rows, ridge
        r, c = model._pattern(rows)
        n = len(rows.ideal)
        r = np.concatenate([r, n + np.arange(len(ridge))])
        c = np.concatenate([c, np.arange(len(ridge))])
        self._shape = (n + len(ridge), len(model.theta))
        order = sparse.csr_matrix((np.arange(len(r), dtype=np.float64), (r, c)), self._shape)
        self._order = order.data.astype(np.int64)  # CSR position -> value position
        self._indices, self._indptr = order.indices, order.indptr

    def __call__(self, theta: np.ndarray) -> sparse.csr_matrix:
        values = np.concatenate([self._model._jacobian_values(self._rows, theta), self._ridge])
        return sparse.csr_matrix(
            (values[self._order], self._indices, self._indptr), shape=self._shape
        )


def _inside(x: float, bounds: tuple[float, float]) -> float:
    """1 where a clipped parameter moves its output, 0 at a bound."""
    return float(bounds[0] < x < bounds[1])


def _layout(levels: Callable[[str, str, int], tuple[str, ...]]) -> list[_Effect]:
    """Every effect in parameter order, each with `levels(key, column, i)` of its i-th column
    and its first parameter's index."""
    out: list[_Effect] = []
    shared: dict[tuple[str, ...], tuple[str, ...]] = {}  # equal levels, one tuple (`codes`)
    start = 0
    for group, cols in _groups():
        for columns in cols:
            key = _Effect.key_of(group, columns)
            found = (levels(key, c, i) for i, c in enumerate(columns))
            lv = tuple(shared.setdefault(v, v) for v in found)
            out.append(_Effect(group, columns, lv, start))
            start += out[-1].size
    return out


def _effects(frame: pd.DataFrame) -> list[_Effect]:
    """Every effect with the levels `frame` has of its columns."""
    return _layout(lambda _key, col, _i: _levels_of(frame, col))


def _levels_of(frame: pd.DataFrame, col: str) -> tuple[str, ...]:
    values = pd.Series(np.asarray(frame[col], object)).dropna().astype(str).unique()
    return tuple(sorted(values.tolist()))
