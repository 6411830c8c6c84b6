"""The informed and the attainable oracle: the best predictions a perfect learner could make
from a fleet's data, given enough of it (informed) and given the runs it has so far
(attainable).

A fleet's data, given enough of it, determines the physics and software stack, every (model
type × hardware) factor and the drift in force: the truth's `known_samples_per_s`. Of a
lineage's own hidden factors (one that moves it on every type, one per vendor) it determines
only what the lineage's measurements so far say: the posterior mean under the simulator's
priors, from the residuals log(measured ÷ known) of its runs that ended before the
submission. A vendor's factor the lineage was never measured on, the input-pipeline cap (it
reads as part of the lineage factor) and the measurement noise stay unknown.

The attainable oracle knows the physics, software stack and drift (the truth's
`physics_samples_per_s`), but not the (model type × hardware) factors: it has only their
posterior mean given the fleet's runs so far, fitted jointly with every lineage's factors. A
pair nobody measured stays at its prior mean; a pair measured only by lineages that never ran
elsewhere is confounded with their own factors and shrunk accordingly.

The backtest reports both beside the model as the ceilings of every figure. They read the
simulator's hidden state; the model never does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import sparse
from scipy.sparse.linalg import cg

from leap_stream.core.predictor.pairs import pair_keys

_KEY = ["job_id", "attempt", "hardware_type"]
# The attainable oracle's joint fit: conjugate-gradient iterations at most, and the relative
# residual of its normal equations at which it stops.
FIT_ITERATIONS = 2000
FIT_TOLERANCE = 1e-10


@dataclass(frozen=True)
class Priors:
    """The simulator's priors of a residual r of lineage l on vendor k: r = u_l + v_lk + e,
    u ~ N(0, σ_f²), v ~ N(0, σ_v²), e ~ N(0, σ_n²), all independent (`SimConfig`'s
    lineage_sigma, lineage_vendor_sigma, noise_sigma)."""

    lineage_sigma: float
    vendor_sigma: float
    noise_sigma: float


def measured_runs(
    completions: pd.DataFrame, truth: pd.DataFrame, vendor: dict[str, str]
) -> pd.DataFrame:
    """The measured runs (a completion with a throughput): their lineage, vendor, pair
    ("model type|type"), log(measured ÷ the truth's known rate) `log_known` and ÷ its physics
    rate `log_physics`, and when they ended."""
    c = completions[np.isfinite(completions["samples_per_s"].to_numpy(np.float64))]
    c = c[c["samples_per_s"].to_numpy(np.float64) > 0]
    t = c[[*_KEY, "lineage_id", "model_type", "samples_per_s", "ended_at"]].merge(
        truth[[*_KEY, "known_samples_per_s", "physics_samples_per_s"]], on=_KEY, how="inner"
    )
    log_measured = np.log(t["samples_per_s"].to_numpy(np.float64))
    return pd.DataFrame(
        {
            "lineage_id": t["lineage_id"].to_numpy(object),
            "vendor": t["hardware_type"].map(vendor).to_numpy(object),
            "pair": pair_keys(t["model_type"], t["hardware_type"]).to_numpy(object),
            "log_known": log_measured - np.log(t["known_samples_per_s"].to_numpy(np.float64)),
            "log_physics": log_measured - np.log(t["physics_samples_per_s"].to_numpy(np.float64)),
            "ended": pd.to_datetime(t["ended_at"], utc=True).to_numpy("datetime64[ns]"),
        }
    )


@dataclass
class FleetRuns:
    """Every measured run so far (`add` a day's), one frame both oracles read (`frame`)."""

    _days: list[pd.DataFrame] = field(default_factory=list)
    _all: pd.DataFrame | None = None

    def add(self, completions: pd.DataFrame, truth: pd.DataFrame, vendor: dict[str, str]) -> None:
        """The day's measured runs (`measured_runs`)."""
        self._days.append(measured_runs(completions, truth, vendor))
        self._all = None

    def frame(self) -> pd.DataFrame:
        """Every run added so far, concatenated once per `add`."""
        if self._all is None:
            self._all = pd.concat(self._days, ignore_index=True) if self._days else pd.DataFrame()
        return self._all


def lineage_posterior(
    runs: pd.DataFrame, residual: np.ndarray, subs: pd.DataFrame, priors: Priors
) -> pd.DataFrame:
    """Per (submission position `sub`, vendor) measured before it: the posterior mean of
    u + v_k (`shift`) from the ``residual`` of its lineage's runs (one per row of ``runs``);
    and per submission with any run, u's (`vendor` None)."""
    if not len(runs) or not len(subs):
        return pd.DataFrame({"sub": [], "vendor": [], "shift": []})
    s = pd.DataFrame(
        {
            "sub": np.arange(len(subs)),
            "lineage_id": subs["lineage_id"].to_numpy(object),
            "at": pd.to_datetime(subs["submitted_at"], utc=True).to_numpy("datetime64[ns]"),
        }
    )
    j = s.merge(runs[["lineage_id", "vendor", "ended"]].assign(residual=residual), on="lineage_id")
    j = j[j["ended"] < j["at"]]
    g = j.groupby(["sub", "vendor"], sort=False)["residual"].agg(["mean", "count"])
    var_k = priors.vendor_sigma**2 + priors.noise_sigma**2 / g["count"].to_numpy(np.float64)
    g = g.assign(prec=1.0 / var_k, weighted=g["mean"].to_numpy() / var_k)
    by_sub = g.groupby(level="sub")[["prec", "weighted"]].sum()
    u = by_sub["weighted"] / (1.0 / priors.lineage_sigma**2 + by_sub["prec"])
    u_k = u.reindex(g.index.get_level_values("sub")).to_numpy()
    # E[v_k | r] = w_k (m_k − E[u | r]), w_k = σ_v² / (σ_v² + σ_n² / n_k)
    shift = u_k + priors.vendor_sigma**2 / var_k * (g["mean"].to_numpy() - u_k)
    per_vendor = pd.DataFrame(
        {
            "sub": g.index.get_level_values("sub"),
            "vendor": g.index.get_level_values("vendor"),
            "shift": shift,
        }
    )
    lineage = pd.DataFrame({"sub": u.index.to_numpy(), "vendor": None, "shift": u.to_numpy()})
    return pd.concat([per_vendor, lineage], ignore_index=True)


def shifted(
    post: pd.DataFrame, job: np.ndarray, vendor: np.ndarray, base: np.ndarray
) -> np.ndarray:
    """Per (submission `job` × candidate on `vendor`) row, ``base`` × e^(the posterior shift
    of the lineage's factors on that vendor, from `lineage_posterior`); the lineage's u alone
    on a vendor it never ran on, ``base`` alone for a lineage never measured."""
    rows = pd.DataFrame({"sub": np.asarray(job, np.int64), "vendor": vendor})
    has_vendor = post["vendor"].notna().to_numpy()
    per_vendor = post[has_vendor].astype({"sub": np.int64})
    lineage = post[~has_vendor].astype({"sub": np.int64}).set_index("sub")["shift"]
    on_vendor = rows.merge(per_vendor, on=["sub", "vendor"], how="left")["shift"]
    u = lineage.reindex(rows["sub"]).to_numpy(np.float64)
    shift = np.where(on_vendor.notna(), on_vendor.to_numpy(np.float64), np.nan_to_num(u))
    return np.asarray(base, np.float64) * np.exp(shift)


@dataclass(frozen=True)
class InformedOracle:
    """Predictions from the residuals of the fleet's `runs` against the known rate."""

    priors: Priors
    runs: FleetRuns

    def predict(
        self, subs: pd.DataFrame, job: np.ndarray, vendor: np.ndarray, known: np.ndarray
    ) -> np.ndarray:
        """Per (submission `job` × candidate on `vendor`) row with the truth's `known` rate,
        the informed prediction (samples/s): known × e^(posterior mean of the lineage's
        factors on that vendor); known alone for a lineage never measured."""
        runs = self.runs.frame()
        residual = runs["log_known"].to_numpy(np.float64) if len(runs) else np.empty(0)
        return shifted(lineage_posterior(runs, residual, subs, self.priors), job, vendor, known)


@dataclass(frozen=True)
class AttainableOracle:
    """Each night the (model type × hardware) factors' posterior mean from the fleet's `runs`
    that ended before it (against the physics rate), jointly with every lineage's factors,
    and predictions from both (`predict`). Prior of a pair's factor: N(0, `pair_sigma`²)."""

    priors: Priors
    pair_sigma: float
    runs: FleetRuns

    def predict(
        self,
        subs: pd.DataFrame,
        job: np.ndarray,
        vendor: np.ndarray,
        hardware: np.ndarray,
        physics: np.ndarray,
    ) -> np.ndarray:
        """Per (submission `job` × candidate `hardware` on `vendor`) row with the truth's
        `physics` rate: physics × e^(the pair's factor + the lineage's posterior shift), the
        pair factors fitted on the runs that ended before the first submission."""
        runs = self.runs.frame()
        if not len(runs) or not len(subs):
            return np.asarray(physics, np.float64).copy()
        first = pd.to_datetime(subs["submitted_at"], utc=True).min().to_datetime64()
        factors = self.pair_factors(runs[runs["ended"].to_numpy() < first])
        residual = runs["log_physics"] - runs["pair"].map(factors).fillna(0.0)
        model_type = subs["model_type"].to_numpy(object)[np.asarray(job, np.int64)]
        at = factors.reindex(pair_keys(model_type, hardware)).fillna(0.0)
        level = np.exp(at.to_numpy(np.float64))
        base = np.asarray(physics, np.float64) * level
        post = lineage_posterior(runs, residual.to_numpy(np.float64), subs, self.priors)
        return shifted(post, job, vendor, base)

    def pair_factors(self, runs: pd.DataFrame) -> pd.Series:
        """Posterior mean of every measured pair's factor given ``runs`` (their
        `log_physics`): the Gaussian posterior over every pair factor, lineage factor u and
        (lineage, vendor) factor v at once, by conjugate gradients on its normal equations."""
        pair, pairs = pd.factorize(runs["pair"])
        lin, lineages = pd.factorize(runs["lineage_id"])
        lv, blocks = pd.factorize(runs["lineage_id"].astype(str) + "|" + runs["vendor"])
        n, p = len(runs), self.priors
        offsets = np.cumsum([0, len(pairs), len(lineages)])
        rows = np.repeat(np.arange(n), 3)
        cols = np.column_stack([pair + offsets[0], lin + offsets[1], lv + offsets[2]]).ravel()
        X = sparse.csr_matrix((np.ones(3 * n), (rows, cols)))
        prior_var = np.concatenate(
            [
                np.full(len(pairs), self.pair_sigma**2),
                np.full(len(lineages), p.lineage_sigma**2),
                np.full(len(blocks), p.vendor_sigma**2),
            ]
        )
        A = (X.T @ X) / p.noise_sigma**2 + sparse.diags(1.0 / prior_var)
        b = X.T @ runs["log_physics"].to_numpy(np.float64) / p.noise_sigma**2
        jacobi = sparse.diags(1.0 / A.diagonal())
        x, _info = cg(A, b, M=jacobi, rtol=FIT_TOLERANCE, maxiter=FIT_ITERATIONS)
        return pd.Series(x[: len(pairs)], index=pairs)
