"""The backtest's scenarios: a new accelerator type, software releases (drift)."""

from __future__ import annotations

from typing import Any

import numpy as np


def new_hardware_summary(
    per_night: list[dict[str, Any]], hw_type: str, from_day: int, warmup_days: int
) -> dict[str, Any]:
    """The nights from the type's first day: the per-night figures, the first night on which
    the model's top choice is the new type for at least half the jobs the oracle would send
    there (routed), and the model's savings as a share of the oracle's over those nights."""
    first = max(0, from_day - warmup_days)
    nights = [n for n in per_night[first:] if "new_hardware" in n]
    routed = next(
        (
            i
            for i, n in enumerate(nights)
            if n["new_hardware"]["oracle_top"] > 0
            and n["new_hardware"]["model_top"] >= 0.5 * n["new_hardware"]["oracle_top"]
        ),
        None,
    )
    model_savings = float(np.mean([n["model"]["savings"] for n in nights])) if nights else 0.0
    oracle_savings = float(np.mean([n["oracle"]["savings"] for n in nights])) if nights else 0.0
    return {
        "type": hw_type,
        "from_day": from_day,
        "nights_until_routed": routed,
        "savings_share_of_oracle": round(model_savings / oracle_savings, 4)
        if oracle_savings
        else None,
        "per_night": [{"night": first + i + 1, **n["new_hardware"]} for i, n in enumerate(nights)],
    }


DRIFT_OFFSETS = (-1, 0, 1, 2, 3, 5, 7)


def parse_drift(text: str) -> Any:
    """FAMILY:VENDOR:DAY:FACTOR → the simulator's DriftEvent (ValueError naming what is off)."""
    from leap_stream.contracts.vocab import FAMILIES, VENDORS
    from leap_stream.tools.sim.config import DriftEvent

    parts = text.split(":")
    if len(parts) != 4:
        raise ValueError(f"--drift {text!r}: expected FAMILY:VENDOR:DAY:FACTOR")
    family, vendor, day, factor = parts
    if family not in FAMILIES or vendor not in VENDORS:
        raise ValueError(f"--drift {text!r}: family one of {FAMILIES}, vendor one of {VENDORS}")
    try:
        event = DriftEvent(int(day), vendor, family, float(factor), "scenario")
    except ValueError:
        raise ValueError(f"--drift {text!r}: DAY is a whole number, FACTOR a number") from None
    if event.day < 0 or not event.factor > 0:
        raise ValueError(f"--drift {text!r}: DAY ≥ 0 and FACTOR > 0")
    return event


def drift_recovery(
    per_night: list[dict[str, Any]], events: list[Any], warmup_days: int
) -> list[dict[str, Any]]:
    """For each drift event inside the scored nights: the model's accuracy on the rows of the
    family and vendor it changed, on the hardware the jobs ran on and over every candidate, at
    nights relative to the event (night 0: the first day at the new speed, ranked by a model
    trained before it). How many nights until it is back is what on-call wants to know."""
    out = []
    for e in events:
        night0 = e.day - warmup_days
        if not 0 <= night0 < len(per_night):
            continue
        key = f"fv={e.family}|{e.vendor}"
        row: dict[str, Any] = {
            "day": e.day,
            "night": night0 + 1,
            "family": e.family,
            "vendor": e.vendor,
            "factor": round(e.factor, 4),
        }
        for scope in ("ran", "all"):
            acc = {}
            for off in DRIFT_OFFSETS:
                n = night0 + off
                if 0 <= n < len(per_night):
                    counts = per_night[n].get("by_anchor", {}).get(scope, {}).get(key)
                    if counts and counts[0]:
                        acc[str(off)] = round(counts[1] / counts[0], 4)
            row[f"accuracy_{scope}_by_offset"] = acc
        out.append(row)
    return out
