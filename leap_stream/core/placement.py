"""Where a ranked job goes: the scheduler-side reading of a hardware-ranking event (pure).

Every integration (the Slurm plugins, the SkyPilot policy, the Kueue gate) asks the same
question of a ranking: which of the types the user allowed, best first (an exploration the
ranking marks before them; once a ranking's probes ran, `after_probes`). A ranking with source
``none`` has no opinion, and an unranked type is never preferred over a ranked one; when nothing
the user allowed was ranked, the answer is empty and the job keeps what the user asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from leap_stream.core.probe import ProbeSettings, carry, choose_after_probes


def ranked_types(ranking: Mapping[str, Any]) -> list[str]:
    """The ranking's hardware types in the order to try them: the type it marks to explore
    (``explore``, within the noise of the first and the operator's budget) first, then best
    first (by ``rank``, then by position)."""
    if ranking.get("source") == "none":
        return []
    candidates: Sequence[Mapping[str, Any]] = ranking.get("candidates") or []
    order = sorted(range(len(candidates)), key=lambda i: (candidates[i].get("rank", i + 1), i))
    types = [str(candidates[i]["hardware_type"]) for i in order]
    explore = (ranking.get("explore") or {}).get("hardware_type")
    if explore in types:
        types.remove(explore)
        types.insert(0, explore)
    return types


def choose(
    ranking: Mapping[str, Any] | None, allowed: Collection[str] | None = None, k: int = 1
) -> list[str]:
    """Up to ``k`` types of ``allowed`` (every type when None), best first; empty when the
    ranking is missing, says nothing, or ranks none of them."""
    if ranking is None or k < 1:
        return []
    types = ranked_types(ranking)
    if allowed is not None:
        types = [t for t in types if t in allowed]
    return types[:k]


def candidate_of(ranking: Mapping[str, Any], hardware_type: str) -> Mapping[str, Any] | None:
    """The ranked candidate of ``hardware_type``, if the ranking has it."""
    for c in ranking.get("candidates") or []:
        if c.get("hardware_type") == hardware_type:
            return c
    return None


def after_probes(ranking: Mapping[str, Any], measured: Mapping[str, float]) -> list[str]:
    """The ranking's types once its probes are in (``measured``: samples/s per probed type, as
    its probe ran: the slice its `runs` entry names, or the whole job without one): the type
    `core.probe.choose_after_probes` picks first (a probed type's prediction weighed with what
    its probe measured, carried to the job's size by the model's predictions at both), then
    the others in ranked order. A ranking without a probe, or probes that measured nothing
    usable, keep `ranked_types`."""
    types = ranked_types(ranking)
    probe = ranking.get("probe")
    if not types or not probe:
        return types
    cands = [candidate_of(ranking, t) or {} for t in types]

    def column(get: Any) -> np.ndarray:
        return np.asarray([get(c) for c in cands], np.float64)

    interval = [c.get("interval") or {} for c in cands]
    pred = column(lambda c: c.get("predicted_throughput", np.nan))
    # per type, the model's samples/s at the slice its probe ran (the whole job: its own)
    at_probe = dict(zip(probe.get("hardware_types") or [], probe.get("runs") or [], strict=False))
    sliced = bool(probe.get("runs"))
    pick = choose_after_probes(
        np.zeros(len(types), np.int64),
        pred,
        np.asarray([i.get("low", np.nan) for i in interval], np.float64),
        np.asarray([i.get("high", np.nan) for i in interval], np.float64),
        column(lambda c: c.get("cost_per_device_hour", np.nan) * c.get("num_devices", np.nan)),
        carry(
            np.asarray([measured.get(t, np.nan) for t in types], np.float64),
            pred,
            np.asarray(
                [
                    at_probe[t]["predicted_throughput"] if t in at_probe else p
                    for t, p in zip(types, pred.tolist(), strict=True)
                ],
                np.float64,
            ),
        ),
        ProbeSettings(minutes=float(probe.get("minutes", 5.0)), size="slice" if sliced else "job"),
        1,
    )[0]
    if pick < 0:
        return types
    return [types[pick], *(t for i, t in enumerate(types) if i != pick)]


__all__ = ["after_probes", "candidate_of", "choose", "ranked_types"]
