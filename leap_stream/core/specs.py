"""`SpecArrays`: the hardware catalog's spec columns as arrays indexed by hardware code, with
their logs, built once per catalog and read by the feature builder and the history's physics
ceiling."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from leap_stream.core.physics import QUIET_LOGS, _bf16_native, _log


@dataclass(frozen=True)
class SpecArrays:
    """The catalog's spec columns as arrays indexed by hardware code (one extra NaN / None
    slot at the end for an unknown type). Built once per catalog by the ranker, not per batch."""

    types: tuple[str, ...]
    code: dict[str, int]
    names: np.ndarray  # object, + None
    vendor: np.ndarray  # object, + None
    flops: np.ndarray
    bw: np.ndarray
    mem: np.ndarray
    ic: np.ndarray
    cost: np.ndarray
    fp8: np.ndarray  # fp8 peak TFLOP/s, NaN without an fp8 path
    bf16_native: np.ndarray  # bool: bf16 runs on the matrix units (not pre-Ampere NVIDIA)
    # how the fleet deploys the part: devices per scale-up domain and scale-out GB/s per
    # device between domains (NaN where the catalog does not say)
    domain: np.ndarray
    network: np.ndarray
    # the logs the features use, once per catalog rather than once per batch and side
    log_flops: np.ndarray = field(init=False)
    log_bw: np.ndarray = field(init=False)
    log_mem: np.ndarray = field(init=False)
    log_ic: np.ndarray = field(init=False)
    log_cost: np.ndarray = field(init=False)
    log_network: np.ndarray = field(init=False)

    @QUIET_LOGS
    def __post_init__(self) -> None:
        for name in ("flops", "bw", "mem", "ic", "cost", "network"):
            object.__setattr__(self, f"log_{name}", _log(getattr(self, name)))

    @classmethod
    def of(cls, specs: pd.DataFrame | SpecArrays) -> SpecArrays:
        if isinstance(specs, SpecArrays):
            return specs
        types = tuple(str(t) for t in specs.index)

        def col(name: str) -> np.ndarray:
            return np.append(specs[name].to_numpy(np.float64), np.nan)

        def optional(name: str) -> np.ndarray:
            return col(name) if name in specs else np.full(len(types) + 1, np.nan)

        none = np.asarray([None], dtype=object)
        return cls(
            types=types,
            code={t: i for i, t in enumerate(types)},
            names=np.append(np.asarray(types, dtype=object), none),
            vendor=np.append(specs["vendor"].to_numpy(object), none),
            flops=col("peak_bf16_tflops"),
            bw=col("memory_bandwidth_gbps"),
            mem=col("device_memory_gib"),
            ic=col("interconnect_gbps"),
            cost=col("cost_per_device_hour"),
            fp8=optional("peak_fp8_tflops"),
            bf16_native=np.append(_bf16_native(specs), True),
            domain=optional("scale_up_domain"),
            network=optional("network_gbps"),
        )
