"""`TypePairEffects`: what moving a job from one hardware type to another does beyond the
physics ratio: slopes in the peak-FLOP/s and bandwidth ratios (how far this fleet's jobs sit
from the physics' balance of the two) and a device-count exponent (per-device rates fall as
one job spreads over more devices), then shrunk medians down a hierarchy: vendor pair → the
two types' efficiencies → type pair → family × type pair.

Each level is the median residual of the pairs it groups, times n / (n + k) (`LEVELS`: k
pseudo-pairs at zero), fitted on what the levels above left; a level seen often moves far from
physics, one never seen stays on its parent. The efficiencies are one number per type, a
pair's residual their difference: what a type does beyond its datasheet is learned from all
its pairs, so a pair never measured, or a type's pairs with a type never seen, get it too
(decision 0020). Inner passes choose, per fit, how hard the levels shrink and whether the
slopes are free, by folds of lineages (decisions 0013, 0021), and whether a model type the fit
never saw gets its family's level, by folds of model types (decision 0023). It is the ratio
model's form where trees cannot generalise to a new model type (few model types, or pairs
without the job's work: a benchmark table, a fleet's first weeks): a prior then moves by the
physics ratio plus these effects (decisions 0012, 0022). The same
medians make `evaluate`'s `table_estimator`. Pure: arrays in, arrays out; JSON in the model's
metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.core.columns import Frame, column_codes, f64

# per-device rate ∝ (devices now ÷ the prior's)^e: the exponents tried, 0 first (a table of one
# size, or a fleet whose jobs keep their size, stays at 0); and slopes in the log ratios of
# peak FLOP/s and of bandwidth on top of the physics, 0 first. The least absolute residual
# on at most SLOPE_ROWS pairs (evenly spaced) wins; the first of equals.
EXPONENTS = np.linspace(0.0, -1.0, 21)
SLOPES = np.array([0.0, 0.1, -0.1, 0.2, -0.2, 0.3, -0.3, 0.4, -0.4, 0.5, -0.5])
SLOPE_ROWS = 2000
# (level, pseudo-pairs at zero residual): a level seen k times moves half-way to its median
LEVELS: tuple[tuple[str, float], ...] = (
    ("vendor_pair", 4.0),
    ("type_pair", 2.0),
    ("family_type_pair", 2.0),
)
# multipliers of every level's pseudo-pairs, one chosen per fit by predicting each fold of the
# training lineages from the others (`TypePairEffects._best`; 1 unless another clearly
# wins); inf: the slopes alone. Pairs that move differently for every lineage end near
# physics, pairs that move alike near their measured medians (docs/decisions/0013).
SHRINK_SCALES = (1.0, 0.25, 4.0, 16.0, float("inf"))
# per type, an efficiency e with a pair's residual ≈ e(candidate) − e(prior), fitted after the
# vendor pair and before the type pair: a pair never measured gets it through the types'
# other pairs, a type never measured (0) moves from a known type by what that type is known
# to do; pseudo-pairs at zero per type, and the damped backfitting passes
EFFICIENCY_SHRINK = 4.0
EFFICIENCY_PASSES = 20
# the slopes free, or held at 0 (the exponent alone): a few workloads can pick slopes that
# overstate a move for the next one; chosen with the scale (`TypePairEffects._best`)
SLOPE_CHOICES = (True, False)
INNER_FOLDS = 8  # folds of the labels (lineages, model types), round robin; fewer: one each
INNER_MIN_GROUPS = 3  # fewer labels: the first choice
INNER_ROWS = 200_000  # pairs an inner pass reads at most (whole labels, seeded)
INNER_MIN_GAIN = 0.02  # of the first choice's mean APE: a smaller gain keeps the first


def _by_key_then_value(k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The order of `np.lexsort((v, k))` from one float sort: integer key + value scaled
    into [0, 0.5), below one key step."""
    if not len(v):
        return np.zeros(0, np.int64)
    scaled = (v - v.min()) / (2.0 * float(np.ptp(v)) + 1e-300)
    return np.argsort(k + np.minimum(scaled, 0.49999))


def shrunk_medians(
    keys: np.ndarray, values: np.ndarray, shrink: float
) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique keys, per key the median of its finite `values` × n / (n + shrink))."""
    ok = np.isfinite(values)
    k, v = keys[ok], values[ok]
    order = _by_key_then_value(k, v)
    k, v = k[order], v[order]
    uniq, start, n = np.unique(k, return_index=True, return_counts=True)
    median = 0.5 * (v[start + (n - 1) // 2] + v[start + n // 2])
    return uniq, median * n / (n + shrink)


def _efficiencies(
    resid: np.ndarray, cand: np.ndarray, prior: np.ndarray, n: int, shrink: float
) -> np.ndarray:
    """Per type code (n of them, the last the padding: 0), e with `resid` ≈ e(cand) −
    e(prior) over the finite pairs, by damped backfitting: a type's e is the median, over the
    pairs it is on either side of (each ordered type pair its median residual, weighted by its
    count), of what the pair and the other side's e say it is, times k / (k + `shrink`)."""
    e = np.zeros(n)
    pair = cand * n + prior
    keys, medians = shrunk_medians(pair, resid, 0.0)
    if not len(keys):
        return e
    counts = np.bincount(pair[np.isfinite(resid)])[keys]
    c, p = keys // n, keys % n
    side = np.concatenate([c, p])
    weight = np.concatenate([counts, counts]).astype(np.float64)
    total = np.bincount(side, weight, n)
    for _ in range(EFFICIENCY_PASSES):
        values = np.concatenate([medians + e[p], e[c] - medians])
        new = _weighted_medians(side, values, weight, n) * total / (total + shrink)
        new[-1] = 0.0
        e = 0.5 * (e + new)
    return e


def _weighted_medians(
    keys: np.ndarray, values: np.ndarray, weight: np.ndarray, n: int
) -> np.ndarray:
    """Per key in range(n), the weighted median of its values (the mean of the two middle
    ones at an even split: weights are counts, so the split is exact); 0 for a key without
    any."""
    order = _by_key_then_value(keys, values)
    k, v = keys[order], values[order]
    cum = np.cumsum(weight[order])
    total = np.bincount(keys, weight, n)
    half = np.cumsum(total) - 0.5 * total  # the cumulative weight at each key's middle
    lo = np.searchsorted(cum, half[k], side="left")  # per entry, its key's middle entries
    hi = np.minimum(np.searchsorted(cum, half[k], side="right"), len(v) - 1)
    out = np.zeros(n)
    out[k] = 0.5 * (v[lo] + v[hi])
    return out


@dataclass(frozen=True)
class _Indices:
    """Each pair's indices into the levels' tables (-1 codes → the padding)."""

    vendor_pair: np.ndarray  # flat, into (V + 1, V + 1)
    cand: np.ndarray  # into type_efficiency
    prior: np.ndarray
    type_pair: np.ndarray  # flat, into (T + 1, T + 1)
    family_type_pair: np.ndarray  # flat, into (F + 1, T + 1, T + 1)

    def take(self, rows: np.ndarray) -> _Indices:
        return _Indices(*(getattr(self, f.name)[rows] for f in fields(self)))


@dataclass(frozen=True)
class _SlopeGrid:
    """The absolute residual of every (device exponent, FLOP/s slope, bandwidth slope) of the
    grid on an evenly spaced sample of the finite pairs (`free` False: the slopes stay 0, the
    exponent alone is fitted), so that the best weights on any subset of the pairs (an inner
    fold's training pairs) cost a sum, not a refit."""

    rows: np.ndarray  # the sampled pair indices
    grid: np.ndarray  # (3, combinations)
    misfit: np.ndarray  # (sample, combinations)

    @classmethod
    def of(cls, residual: np.ndarray, c: PairCodes, free: bool = True) -> _SlopeGrid:
        ok = np.flatnonzero(np.isfinite(residual))
        ok = ok[np.linspace(0, len(ok) - 1, min(len(ok), SLOPE_ROWS)).astype(np.int64)]
        slopes = SLOPES if free else np.zeros(1)
        grid = np.stack([g.ravel() for g in np.meshgrid(EXPONENTS, slopes, slopes, indexing="ij")])
        x = np.stack([c.log_dev_ratio[ok], c.d_flops[ok], c.d_bw[ok]], axis=1)
        return cls(ok, grid, np.abs(residual[ok, None] - x @ grid))

    def best(self, use: np.ndarray | None = None) -> tuple[float, float, float]:
        """The weights with the least absolute residual on the sampled pairs where `use` (a
        mask over all pairs) holds; the first of equals; zeros without any such pair."""
        pick = np.ones(len(self.rows), bool) if use is None else use[self.rows]
        if not pick.any():
            return 0.0, 0.0, 0.0
        best = self.grid[:, int(np.argmin(pick.astype(np.float64) @ self.misfit))]
        return float(best[0]), float(best[1]), float(best[2])


@dataclass(frozen=True)
class PairCodes:
    """Per pair: the candidate's and the prior's type and vendor, and the job's family, as
    codes into the effects' levels (-1: a level they do not have)."""

    cand: np.ndarray
    prior: np.ndarray
    cand_vendor: np.ndarray
    prior_vendor: np.ndarray
    family: np.ndarray
    log_dev_ratio: np.ndarray  # log(devices now ÷ the prior's devices); 0 where unknown
    d_flops: np.ndarray  # log peak FLOP/s, candidate ÷ prior type; 0 where unknown
    d_bw: np.ndarray  # log memory bandwidth, candidate ÷ prior type; 0 where unknown

    def reversed(self) -> PairCodes:
        """The same pairs seen from the other side."""
        return PairCodes(
            self.prior,
            self.cand,
            self.prior_vendor,
            self.cand_vendor,
            self.family,
            -self.log_dev_ratio,
            -self.d_flops,
            -self.d_bw,
        )

    def take(self, mask: np.ndarray) -> PairCodes:
        return PairCodes(*(part[mask] for part in self.parts()))

    def stacked(self, other: PairCodes) -> PairCodes:
        return PairCodes(
            *(np.concatenate([a, b]) for a, b in zip(self.parts(), other.parts(), strict=True))
        )

    def parts(self) -> tuple[np.ndarray, ...]:
        return (
            self.cand,
            self.prior,
            self.cand_vendor,
            self.prior_vendor,
            self.family,
            self.log_dev_ratio,
            self.d_flops,
            self.d_bw,
        )


@dataclass(frozen=True)
class _Choice:
    """What the inner passes choose: the slopes free or 0, the levels' shrinkage scale, and
    whether a model type the fit never saw gets its family × type pair level."""

    free: bool
    scale: float
    family_for_new: bool

    @staticmethod
    def scales() -> list[_Choice]:
        """The lineage pass's choices, the first the default: `SLOPE_CHOICES` × `SHRINK_SCALES`."""
        return [_Choice(free, scale, True) for free in SLOPE_CHOICES for scale in SHRINK_SCALES]

    def for_new_model_types(self) -> list[_Choice]:
        """The model-type pass's choices: this one with a new model type left without its
        family level (the default), then with it."""
        return [_Choice(self.free, self.scale, False), _Choice(self.free, self.scale, True)]


@dataclass(frozen=True)
class TypePairEffects:
    """Dense tables of the three levels over `types`, `vendors` and `families`; the last
    index of every axis is the padding a level never seen looks up (0)."""

    types: tuple[str, ...]
    vendors: tuple[str, ...]
    families: tuple[str, ...]
    vendor_pair: np.ndarray  # (V + 1, V + 1): candidate vendor, prior vendor
    type_pair: np.ndarray  # (T + 1, T + 1)
    family_type_pair: np.ndarray  # (F + 1, T + 1, T + 1)
    type_efficiency: np.ndarray  # (T + 1,)
    device_exponent: float = 0.0
    flops_slope: float = 0.0
    bandwidth_slope: float = 0.0
    shrink_scale: float = 1.0  # the inner choice of SHRINK_SCALES the levels were fitted with
    # whether a model type the fit never saw gets the family × type pair level (the model-type
    # pass's choice; metadata without it: yes), and the model types it saw
    family_for_new: bool = True
    model_types: tuple[str, ...] = ()
    _model_type_code: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        code = {m: i for i, m in enumerate(self.model_types)}
        object.__setattr__(self, "_model_type_code", code)

    @classmethod
    def levels_of(
        cls, types: list[str], vendors: list[str], families: list[str]
    ) -> TypePairEffects:
        """Zero effects over these levels (what `fit` fills)."""
        t, v, f = len(types) + 1, len(vendors) + 1, len(families) + 1
        return cls(
            tuple(types),
            tuple(vendors),
            tuple(families),
            np.zeros((v, v)),
            np.zeros((t, t)),
            np.zeros((f, t, t)),
            np.zeros(t),
        )

    def codes(self, frame: Frame, rows: np.ndarray | None = None) -> PairCodes:
        """The pair codes of `rows` of a feature frame (candidate: `hardware_type`; prior:
        `o_hardware_type`)."""

        def of(col: str, levels: tuple[str, ...]) -> np.ndarray:
            c = column_codes(frame, col, {x: i for i, x in enumerate(levels)})
            return c if rows is None else c[rows]

        def finite(x: np.ndarray) -> np.ndarray:
            x = np.where(np.isfinite(x), x, 0.0)
            return x if rows is None else x[rows]

        # from the hardware inputs both forms of the ratio model read, not the feature
        # builder's other_log_*_ratio: the trainer keeps only the columns a model reads
        def ratio(col: str) -> np.ndarray:
            return finite(f64(frame, col) - f64(frame, "o_" + col))

        return PairCodes(
            of("hardware_type", self.types),
            of("o_hardware_type", self.types),
            of("vendor", self.vendors),
            of("o_vendor", self.vendors),
            of("family", self.families),
            finite(f64(frame, "other_log_dev_ratio")),
            ratio("log_peak_tflops"),
            ratio("log_mem_bw"),
        )

    def _indices(self, c: PairCodes) -> _Indices:
        """Each pair's indices into the tables (-1 → the padding)."""
        t, v, f = len(self.types) + 1, len(self.vendors) + 1, len(self.families) + 1
        cand, prior = np.where(c.cand < 0, t - 1, c.cand), np.where(c.prior < 0, t - 1, c.prior)
        cv = np.where(c.cand_vendor < 0, v - 1, c.cand_vendor)
        pv = np.where(c.prior_vendor < 0, v - 1, c.prior_vendor)
        fam = np.where(c.family < 0, f - 1, c.family)
        return _Indices(cv * v + pv, cand, prior, cand * t + prior, (fam * t + cand) * t + prior)

    def fit(
        self,
        residual: np.ndarray,
        c: PairCodes,
        groups: np.ndarray | None = None,
        model_types: np.ndarray | None = None,
    ) -> TypePairEffects:
        """The slopes, then the levels fitted on `residual` (the measured log ratio less the
        physics ratio) of pairs `c`, each on what the levels above left: with the slopes free
        or the exponent alone, and shrunk by the scale of `SHRINK_SCALES`, whichever best
        predicts each lineage (`groups`, one label per pair) from the others; the family ×
        type pair level only where it predicts each model type (`model_types`) from the others
        clearly better (it pools model types, so only they can judge it; kept when no model
        types are given)."""
        resid = np.asarray(residual, np.float64)
        indices = self._indices(c)
        choice = _Choice(True, 1.0, True)
        if groups is not None:
            choice = self._best(resid, c, indices, groups, _Choice.scales())
        seen: tuple[str, ...] = ()
        if model_types is not None:
            choice = self._best(resid, c, indices, model_types, choice.for_new_model_types())
            seen = tuple(sorted({str(m) for m in np.asarray(model_types)[np.isfinite(resid)]}))
        exponent, flops, bandwidth = _SlopeGrid.of(resid, c, choice.free).best()
        resid = resid - exponent * c.log_dev_ratio - flops * c.d_flops - bandwidth * c.d_bw
        vendor_pair, efficiency, type_pair, family_type_pair = self._tables(
            resid, indices, choice.scale
        )
        return TypePairEffects(
            self.types,
            self.vendors,
            self.families,
            vendor_pair,
            type_pair,
            family_type_pair,
            efficiency,
            exponent,
            flops,
            bandwidth,
            choice.scale,
            choice.family_for_new,
            seen,
        )

    def _tables(self, resid: np.ndarray, indices: _Indices, scale: float) -> list[np.ndarray]:
        """The levels of `resid` (NaN: not a training pair), each on what the levels above
        left, with `scale` × their pseudo-pairs (inf: all zero): the vendor pair, the types'
        efficiencies, the type pair, the family × type pair."""
        tables = [self._level(resid, indices.vendor_pair, LEVELS[0][1] * scale, 0)]
        resid = resid - tables[0].ravel()[indices.vendor_pair]
        efficiency = np.zeros(len(self.types) + 1)
        if np.isfinite(scale):
            efficiency = _efficiencies(
                resid, indices.cand, indices.prior, len(efficiency), EFFICIENCY_SHRINK * scale
            )
        tables.append(efficiency)
        resid = resid - efficiency[indices.cand] + efficiency[indices.prior]
        for i, idx in ((1, indices.type_pair), (2, indices.family_type_pair)):
            tables.append(self._level(resid, idx, LEVELS[i][1] * scale, i))
            resid = resid - tables[-1].ravel()[idx]
        return tables

    def _level(self, resid: np.ndarray, idx: np.ndarray, shrink: float, i: int) -> np.ndarray:
        """Level `LEVELS[i]` of `resid`: per flat index its shrunk median (all zero with an
        infinite `shrink`), the padding 0 (a level never seen is its parent's)."""
        table = np.zeros(getattr(self, LEVELS[i][0]).shape)
        if np.isfinite(shrink):
            keys, effects = shrunk_medians(idx, resid, shrink)
            table.ravel()[keys] = effects
        for axis in range(table.ndim):
            table[(slice(None),) * axis + (-1,)] = 0.0
        return table

    def _best(
        self,
        resid: np.ndarray,
        c: PairCodes,
        indices: _Indices,
        labels: np.ndarray,
        choices: list[_Choice],
    ) -> _Choice:
        """Of `choices`, the one that best predicts each fold of the `labels` (lineages, model
        types) from the others' pairs (mean APE per fold), taken only where its gain over the
        first exceeds one standard error of the per-fold gains (a choice the folds do not
        agree on is noise) and `INNER_MIN_GAIN` of the first's error; the first with fewer
        than `INNER_MIN_GROUPS` labels. Past `INNER_ROWS` pairs, a seeded share of the labels,
        each whole."""
        ok = np.isfinite(resid)
        codes, names = pd.factorize(np.asarray(labels, object)[ok])
        if len(names) < INNER_MIN_GROUPS:
            return choices[0]
        if ok.sum() > INNER_ROWS:
            keep = np.zeros(len(names), bool)
            share = max(INNER_MIN_GROUPS, len(names) * INNER_ROWS // int(ok.sum()))
            keep[np.random.default_rng(0).permutation(len(names))[:share]] = True
            rows = np.flatnonzero(ok)[keep[codes]]
            codes, names = pd.factorize(codes[keep[codes]])
            resid, c, indices = resid[rows], c.take(rows), indices.take(rows)
            ok = np.ones(len(rows), bool)
        fold = np.full(len(resid), -1, np.int64)
        fold[ok] = codes % INNER_FOLDS
        folds = min(len(names), INNER_FOLDS)
        err = np.zeros((folds, len(choices)))  # mean APE of each fold under each choice
        grids = {free: _SlopeGrid.of(resid, c, free) for free in {ch.free for ch in choices}}
        for f in range(folds):
            test = fold == f
            train = np.where(test, np.nan, resid)
            for free in grids:
                e, fl, bw = grids[free].best(~test)
                term = e * c.log_dev_ratio + fl * c.d_flops + bw * c.d_bw
                for i, ch in enumerate(choices):
                    if ch.free != free:
                        continue
                    levels = self._tables(train - term, indices, ch.scale)
                    if not ch.family_for_new:  # the model-type pass: the held out are new
                        levels[3] = np.zeros_like(levels[3])
                    pred = term[test] + self._with_tables(levels, indices, test)
                    err[f, i] = np.abs(np.expm1(pred - resid[test])).mean()
        gain = err[:, :1] - err  # per fold, how much each choice beats the first
        mean, se = gain.mean(axis=0), gain.std(axis=0, ddof=1) / np.sqrt(folds)
        best = int(np.argmax(mean))
        enough = max(se[best], INNER_MIN_GAIN * float(err[:, 0].mean()))
        return choices[best] if mean[best] > enough else choices[0]

    def new_model_types(self, frame: Frame, rows: np.ndarray) -> np.ndarray:
        """Per row of `rows`, whether its model type is none of those the effects were fitted
        on."""
        return np.asarray(column_codes(frame, "model_type", self._model_type_code)[rows] < 0)

    def predict(self, c: PairCodes, new_model_type: np.ndarray | None = None) -> np.ndarray:
        """Per pair, its device-count term and the sum of its levels; a pair of a model type
        the fit never saw (`new_model_type`, `new_model_types`) without the family level
        unless `family_for_new`."""
        ix = self._indices(c)
        tables = [self.vendor_pair, self.type_efficiency, self.type_pair, self.family_type_pair]
        out = (
            self.device_exponent * c.log_dev_ratio
            + self.flops_slope * c.d_flops
            + self.bandwidth_slope * c.d_bw
            + self._with_tables(tables, ix)
        )
        if new_model_type is not None and not self.family_for_new:
            family = self.family_type_pair.ravel()[ix.family_type_pair]
            out = out - np.where(new_model_type, family, 0.0)
        return np.asarray(out)

    @staticmethod
    def _with_tables(
        tables: list[np.ndarray], ix: _Indices, rows: np.ndarray | slice = slice(None)
    ) -> np.ndarray:
        """Per pair of `rows`, the sum of its levels in `tables` (`_tables`' order)."""
        vendor_pair, efficiency, type_pair, family_type_pair = tables
        return np.asarray(
            vendor_pair.ravel()[ix.vendor_pair[rows]]
            + efficiency[ix.cand[rows]]
            - efficiency[ix.prior[rows]]
            + type_pair.ravel()[ix.type_pair[rows]]
            + family_type_pair.ravel()[ix.family_type_pair[rows]]
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "types": list(self.types),
            "vendors": list(self.vendors),
            "families": list(self.families),
            **{name: getattr(self, name).round(6).tolist() for name, _k in LEVELS},
            "type_efficiency": self.type_efficiency.round(6).tolist(),
            "device_exponent": self.device_exponent,
            "flops_slope": self.flops_slope,
            "bandwidth_slope": self.bandwidth_slope,
            "shrink_scale": self.shrink_scale if np.isfinite(self.shrink_scale) else None,
            "family_for_new": self.family_for_new,
            "model_types": list(self.model_types),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TypePairEffects:
        vendor_pair, type_pair, family_type_pair = (
            np.asarray(doc[name], np.float64) for name, _k in LEVELS
        )
        return cls(
            tuple(doc["types"]),
            tuple(doc["vendors"]),
            tuple(doc["families"]),
            vendor_pair,
            type_pair,
            family_type_pair,
            np.asarray(doc.get("type_efficiency") or np.zeros(len(type_pair)), np.float64),
            float(doc.get("device_exponent", 0.0)),
            float(doc.get("flops_slope", 0.0)),
            float(doc.get("bandwidth_slope", 0.0)),
            float("inf") if (scale := doc.get("shrink_scale", 1.0)) is None else float(scale),
            bool(doc.get("family_for_new", True)),
            tuple(doc.get("model_types") or ()),
        )
