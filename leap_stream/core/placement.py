"""Where a ranked job goes: the scheduler-side reading of a hardware-ranking event (pure).

Every integration (the Slurm plugins, the SkyPilot policy, the Kueue gate) asks the same
question of a ranking: which of the types the user allowed, best first (an exploration the
ranking marks before them). A ranking with source
``none`` has no opinion, and an unranked type is never preferred over a ranked one; when nothing
the user allowed was ranked, the answer is empty and the job keeps what the user asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any


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


__all__ = ["candidate_of", "choose", "ranked_types"]
