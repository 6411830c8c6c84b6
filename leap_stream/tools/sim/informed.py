"""The informed oracle: the best prediction a perfect learner could make from a fleet's data.

A fleet's data, given enough of it, determines the physics and software stack, every (model
type × hardware) factor and the drift in force: the truth's `known_samples_per_s`. Of a
lineage's own hidden factors (one that moves it on every type, one per vendor) it determines
only what the lineage's measurements so far say: the posterior mean under the simulator's
priors, from the residuals log(measured ÷ known) of its runs that ended before the
submission. A vendor's factor the lineage was never measured on, the input-pipeline cap (it
reads as part of the lineage factor) and the measurement noise stay unknown.

The backtest reports it beside the model as the ceiling of every figure. It reads the
simulator's hidden state; the model never does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

_KEY = ["job_id", "attempt", "hardware_type"]


@dataclass
class InformedOracle:
    """Residuals of every measured run so far (`add`), and predictions from them (`predict`).

    Model of a residual r of lineage l on vendor k: r = u_l + v_lk + e, u ~ N(0, σ_f²),
    v ~ N(0, σ_v²), e ~ N(0, σ_n²), all independent (`SimConfig`'s lineage_sigma,
    lineage_vendor_sigma, noise_sigma)."""

    lineage_sigma: float
    vendor_sigma: float
    noise_sigma: float
    _runs: list[pd.DataFrame] = field(default_factory=list)

    def add(self, completions: pd.DataFrame, truth: pd.DataFrame, vendor: dict[str, str]) -> None:
        """The day's measured runs (a completion with a throughput) and their residuals."""
        c = completions[np.isfinite(completions["samples_per_s"].to_numpy(np.float64))]
        c = c[c["samples_per_s"].to_numpy(np.float64) > 0]
        t = c[[*_KEY, "lineage_id", "samples_per_s", "ended_at"]].merge(
            truth[[*_KEY, "known_samples_per_s"]], on=_KEY, how="inner"
        )
        self._runs.append(
            pd.DataFrame(
                {
                    "lineage_id": t["lineage_id"].to_numpy(object),
                    "vendor": t["hardware_type"].map(vendor).to_numpy(object),
                    "residual": np.log(
                        t["samples_per_s"].to_numpy(np.float64)
                        / t["known_samples_per_s"].to_numpy(np.float64)
                    ),
                    "ended": pd.to_datetime(t["ended_at"], utc=True).to_numpy("datetime64[ns]"),
                }
            )
        )

    def posterior(self, subs: pd.DataFrame) -> pd.DataFrame:
        """Per (submission position `sub`, vendor) measured before it: the posterior mean of
        u + v_k (`shift`); and per submission with any run, u's (`vendor` None)."""
        if not self._runs or not len(subs):
            return pd.DataFrame({"sub": [], "vendor": [], "shift": []})
        runs = pd.concat(self._runs, ignore_index=True)
        s = pd.DataFrame(
            {
                "sub": np.arange(len(subs)),
                "lineage_id": subs["lineage_id"].to_numpy(object),
                "at": pd.to_datetime(subs["submitted_at"], utc=True).to_numpy("datetime64[ns]"),
            }
        )
        j = s.merge(runs, on="lineage_id")
        j = j[j["ended"] < j["at"]]
        g = j.groupby(["sub", "vendor"], sort=False)["residual"].agg(["mean", "count"])
        var_k = self.vendor_sigma**2 + self.noise_sigma**2 / g["count"].to_numpy(np.float64)
        g = g.assign(prec=1.0 / var_k, weighted=g["mean"].to_numpy() / var_k)
        by_sub = g.groupby(level="sub")[["prec", "weighted"]].sum()
        u = by_sub["weighted"] / (1.0 / self.lineage_sigma**2 + by_sub["prec"])
        u_k = u.reindex(g.index.get_level_values("sub")).to_numpy()
        # E[v_k | r] = w_k (m_k − E[u | r]), w_k = σ_v² / (σ_v² + σ_n² / n_k)
        shift = u_k + self.vendor_sigma**2 / var_k * (g["mean"].to_numpy() - u_k)
        per_vendor = pd.DataFrame(
            {
                "sub": g.index.get_level_values("sub"),
                "vendor": g.index.get_level_values("vendor"),
                "shift": shift,
            }
        )
        lineage = pd.DataFrame({"sub": u.index.to_numpy(), "vendor": None, "shift": u.to_numpy()})
        return pd.concat([per_vendor, lineage], ignore_index=True)

    def predict(
        self, subs: pd.DataFrame, job: np.ndarray, vendor: np.ndarray, known: np.ndarray
    ) -> np.ndarray:
        """Per (submission `job` × candidate on `vendor`) row with the truth's `known` rate,
        the informed prediction (samples/s): known × e^(posterior mean of the lineage's
        factors on that vendor); known alone for a lineage never measured."""
        post = self.posterior(subs)
        rows = pd.DataFrame({"sub": np.asarray(job, np.int64), "vendor": vendor})
        has_vendor = post["vendor"].notna().to_numpy()
        per_vendor = post[has_vendor].astype({"sub": np.int64})
        lineage = post[~has_vendor].astype({"sub": np.int64}).set_index("sub")["shift"]
        on_vendor = rows.merge(per_vendor, on=["sub", "vendor"], how="left")["shift"]
        u = lineage.reindex(rows["sub"]).to_numpy(np.float64)
        shift = np.where(on_vendor.notna(), on_vendor.to_numpy(np.float64), np.nan_to_num(u))
        return np.asarray(known, np.float64) * np.exp(shift)
