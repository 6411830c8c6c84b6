"""Hot reload: the worker's current `Ranker`, rebuilt when the registry's `current` changes.

`poll()` runs in a worker thread (LightGBM parses the model text there, off the event loop)
and swaps `self.ranker` with one assignment, which is atomic in Python: a batch that already
took the old ranker finishes with it, the next batch gets the new one. A failed load keeps the
old model and counts `leap_model_load_failures_total`.

Fallback chain when there is no model: the lookup table saved beside the model
(``lookup.json``), else one fitted from the dataset at start-up, else ``source=none``.

With ``compile_trees`` (``LEAP_COMPILED_TREES=1``) each new model first serves with LightGBM's
predict while a daemon thread compiles its trees (`stream/compiled.py`, seconds); the compiled
ranker replaces it only if that model is still the current one. A failed compile is counted
(`leap_model_compile_failures_total`) and LightGBM keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from leap_stream.catalog import CatalogError, CatalogFile
from leap_stream.contracts import parse_ts
from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import LIGHTGBM_KIND, ThroughputModel
from leap_stream.core.probe import ProbeSettings
from leap_stream.core.ranker import Ranker
from leap_stream.store.artefact import read_artefact
from leap_stream.store.registry import CurrentModel, ModelLoadError, Registry
from leap_stream.stream.metrics import Metrics

log = logging.getLogger(__name__)


def lookup_from_dataset(dataset_dir: Path) -> LookupTable | None:
    """A lookup table fitted on the training dataset; None when there is none yet."""
    try:
        from leap_stream.store.offline import read_dataset

        frame = read_dataset(dataset_dir)
        if len(frame) == 0:
            return None
        return LookupTable.fit(frame)
    except Exception as exc:
        log.warning("no lookup table from the dataset at %s: %r", dataset_dir, exc)
        return None


class RankerHolder:
    def __init__(
        self,
        catalog: Any,
        registry: Registry | None,
        metrics: Metrics,
        fallback_lookup: LookupTable | None = None,
        compile_trees: bool = False,
        catalog_file: CatalogFile | None = None,
        explore_budget: float = 0.0,
        probe: ProbeSettings | None = None,
    ) -> None:
        self.catalog = catalog
        self.explore_budget = explore_budget  # LEAP_EXPLORE_BUDGET, for every ranker it makes
        self.probe = probe  # LEAP_PROBE_BUDGET and LEAP_PROBE_MINUTES, likewise
        self.catalog_file = catalog_file
        self.metrics = metrics
        self.compile_trees = compile_trees
        self.compiling: threading.Thread | None = None
        self._swap = threading.Lock()  # a compile finishing must not replace a newer model
        self.fallback_lookup = fallback_lookup
        self._current = CurrentModel(registry, read_artefact) if registry is not None else None
        self.ranker = self._ranker(catalog, None, fallback_lookup)
        self.version: str | None = None
        metrics.set_model(None, None, time.time())
        metrics.catalog_types.set(len(catalog.types))

    def get(self) -> Ranker:
        return self.ranker

    def _ranker(self, catalog: Any, model: Any, lookup: LookupTable | None) -> Ranker:
        return Ranker(
            catalog,
            model=model,
            lookup=lookup,
            explore_budget=self.explore_budget,
            probe=self.probe,
        )

    def poll_catalog(self) -> bool:
        """Swap in the catalog file's new version (same model); a bad edit keeps the old one.

        A type removed is no longer offered from the next batch on; its completions are still
        taken (the completion is checked against its submission's candidates, not the catalog),
        so the history and dataset of jobs still running on it are kept."""
        if self.catalog_file is None:
            return False
        try:
            new = self.catalog_file.poll()
        except CatalogError as exc:
            self.metrics.catalog_load_failures.inc()
            log.error("catalog not reloaded, the previous one serves: %s", exc)
            return False
        if new is None:
            return False
        with self._swap:
            self.catalog = new
            current = self.ranker
            self.ranker = self._ranker(new, current.model, current.lookup)
        self.metrics.catalog_types.set(len(new.types))
        log.info("catalog reloaded from %s: %d types", self.catalog_file.path, len(new.types))
        return True

    def poll(self) -> bool:
        """True when a new model is now serving (the catalog file is checked first)."""
        self.poll_catalog()
        if self._current is None:
            return False
        try:
            changed = self._current.poll()
        except ModelLoadError as exc:
            self.metrics.model_load_failures.inc()
            log.error("model load failed, keeping %s: %s", self.version or "no model", exc)
            return False
        if changed and self._current.model is not None:
            model, lookup = self._current.model
            with self._swap:
                self.ranker = self._ranker(self.catalog, model, lookup or self.fallback_lookup)
                self.version = self._current.version
                self.metrics.model_compiled.set(0)
            log.info("serving model %s", self.version)
            if self.compile_trees:
                self.compiling = threading.Thread(
                    target=self._compile,
                    args=(self.version, model, lookup),
                    name="leap-compile",
                    daemon=True,
                )
                self.compiling.start()
        self._refresh_age()
        return changed

    def _compile(self, version: str | None, model: ThroughputModel, lookup: Any) -> None:
        from leap_stream.stream.compiled import compiled_model

        t0 = time.perf_counter()
        try:
            fast = compiled_model(model)
        except Exception as exc:
            self.metrics.model_compile_failures.inc()
            log.error("model %s: compiled trees not used, LightGBM serves: %s", version, exc)
            return
        with self._swap:
            if self.version != version:  # a newer model arrived meanwhile: its own thread runs
                return
            self.ranker = self._ranker(self.catalog, fast, lookup or self.fallback_lookup)
            self.metrics.model_compiled.set(1)
        log.info("model %s: compiled trees serving (%.1fs)", version, time.perf_counter() - t0)

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Block until the current compile attempt ended; True when compiled trees serve."""
        if self.compiling is not None:
            self.compiling.join(timeout)
        model = self.ranker.model
        return model is not None and model.scorer_kind != LIGHTGBM_KIND

    def _refresh_age(self) -> None:
        trained_at = None
        if self._current is not None and self.version is not None:
            try:
                meta = self._current.registry.metadata(self.version)
                trained_at = parse_ts(str(meta["trained_at"]))
            except Exception:
                trained_at = None
        self.metrics.set_model(self.version, trained_at, time.time())


__all__ = ["RankerHolder", "lookup_from_dataset"]
