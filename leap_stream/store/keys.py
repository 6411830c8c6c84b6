"""The online store's key names (docs/stores.md), tagged by model type on a Redis Cluster."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class KeyLayout:
    """Key names under ``prefix``. ``tagged`` (a cluster): each key starts with its model type
    as hash tag, ``{p}{llama-7b}:lin:<lineage>``; a model type with braces in its name is tagged
    by its digest, so the tag is always what sits between the first braces. Untagged:
    ``{p}lin:<lineage>`` as before clusters were supported (a standalone Redis keeps its
    data)."""

    prefix: str
    tagged: bool = False

    def __post_init__(self) -> None:
        if self.tagged and ("{" in self.prefix or "}" in self.prefix):
            raise ValueError(f"a cluster key prefix cannot contain braces: {self.prefix!r}")

    def _head(self, model_type: str) -> str:
        if not self.tagged:
            return self.prefix
        tag = model_type
        if not tag or "{" in tag or "}" in tag:
            tag = "h" + hashlib.sha1(model_type.encode()).hexdigest()[:16]
        return f"{self.prefix}{{{tag}}}:"

    def lin(self, lineage_id: str, model_type: str) -> str:
        return f"{self._head(model_type)}lin:{lineage_id}"

    def agg(self, model_type: str) -> str:
        return f"{self._head(model_type)}agg:{model_type}"

    def seen(self, event_id: str, model_type: str) -> str:
        return f"{self._head(model_type)}seen:{event_id}"

    def sub(self, job_id: str, attempt: int, model_type: str) -> str:
        return f"{self._head(model_type)}sub:{job_id}:{attempt}"

    def done(self, job_id: str, attempt: int, model_type: str, probe: str | None = None) -> str:
        """The marker of a job attempt whose completion was taken: an attempt completes once,
        and each of its probes (``probe``: the probed type) once, apart from it."""
        tail = f":probe:{probe}" if probe is not None else ""
        return f"{self._head(model_type)}done:{job_id}:{attempt}{tail}"

    def guard(self, lineage_id: str, model_type: str) -> str:
        """The speed rule's state of a lineage's entries (core.history.Guard), per type."""
        return f"{self._head(model_type)}lguard:{lineage_id}"

    def aggregate_guard(self, model_type: str) -> str:
        return f"{self._head(model_type)}aguard:{model_type}"

    def pred(self, job_id: str, attempt: int, model_type: str) -> str:
        return f"{self._head(model_type)}pred:{job_id}:{attempt}"

    def pattern(self, kind: str) -> str:
        """SCAN pattern of every key of one kind (``lin``, ``agg``, ``seen``, …)."""
        return f"{self.prefix}{{*}}:{kind}:*" if self.tagged else f"{self.prefix}{kind}:*"

    def group(self, model_type: str) -> str:
        """Keys of one group can go to one script call: one per model type on a cluster."""
        return self._head(model_type) if self.tagged else ""
