"""Prometheus metrics of the worker; the names are an interface (docs/design.md).

One `Metrics` object per process holds every collector on its own registry, so tests can build
as many as they like without clashing on the global default registry.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A ranking latency is observed within [0, just past the top bucket]: a slower one counts in +Inf
# and adds the top bucket to the sum, so a submission replayed days late (its submitted_at inside
# the 30-day window) cannot move the mean by millions of seconds.
LATENCY_CEILING_S = math.nextafter(_LATENCY_BUCKETS[-1], math.inf)
_BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_ERROR_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5)
_SIZE_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events_in = Counter(
            "leap_events_in", "Input events by topic and outcome.", ["topic", "outcome"], registry=r
        )
        self.dead_letter = Counter(
            "leap_dead_letter",
            "Events sent to the dead-letter topic.",
            ["topic", "kind"],
            registry=r,
        )
        self.rankings_out = Counter(
            "leap_rankings_out", "Rankings produced by source.", ["source"], registry=r
        )
        self.fallback = Counter(
            "leap_fallback", "Rankings not made by the model, by reason.", ["reason"], registry=r
        )
        self.explore_cost = Histogram(
            "leap_explore_extra_cost",
            "Rankings that mark an exploration (core/explore.py), by the extra cost share it "
            "expects (the first candidate's throughput per cost over the explored one's, less 1).",
            buckets=(0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2),
            registry=r,
        )
        self.probe_cost = Histogram(
            "leap_probe_cost_usd",
            "Rankings that name a probe (core/probe.py), by what the probes cost together (USD); "
            "the sum over the count is the mean cost, the sum the spend the rankings ask for.",
            buckets=(1, 3, 10, 30, 100, 300, 1000, 3000),
            registry=r,
        )
        self.probe_saving = Counter(
            "leap_probe_expected_saving_usd",
            "What the probes named by rankings are expected to save, net of their cost (USD).",
            registry=r,
        )
        self.probe_completions = Counter(
            "leap_probe_completions",
            "Completions of probes taken into the history (job-completed with probe: true).",
            registry=r,
        )
        self.ranking_latency = Histogram(
            "leap_ranking_latency_seconds",
            "submitted_at to ranking produced (on the broker's time; above the top bucket "
            "counted in +Inf with the top bucket's value).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.clock_skew = Gauge(
            "leap_clock_skew_seconds",
            "The worker's clock less the records' (broker append or producers' create) time, "
            "at the freshest record of the last 10 minutes; below -60 the worker judges events "
            "on the broker's time (stream/clock.py).",
            registry=r,
        )
        self.batch_seconds = Histogram(
            "leap_batch_seconds",
            "Wall time of one batch, decode to durable output.",
            ["agent"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "leap_batch_size", "Events per batch.", ["agent"], buckets=_SIZE_BUCKETS, registry=r
        )
        self.coverage_ratio = Gauge(
            "leap_coverage_ratio",
            "Rankings with source != none / valid submissions since start.",
            registry=r,
        )
        self.model_info = Gauge(
            "leap_model_info", "The loaded model version (value 1).", ["version"], registry=r
        )
        self.model_age = Gauge(
            "leap_model_age_seconds", "now - trained_at of the loaded model.", registry=r
        )
        self.model_load_failures = Counter(
            "leap_model_load_failures", "Model loads that failed (old model kept).", registry=r
        )
        self.model_compiled = Gauge(
            "leap_model_compiled",
            "1 while the serving model scores with its compiled trees (LEAP_COMPILED_TREES).",
            registry=r,
        )
        self.model_compile_failures = Counter(
            "leap_model_compile_failures",
            "Models whose trees did not compile or did not match LightGBM (LightGBM serves).",
            registry=r,
        )
        self.catalog_types = Gauge(
            "leap_catalog_types", "Hardware types in the serving catalog.", registry=r
        )
        self.catalog_load_failures = Counter(
            "leap_catalog_load_failures",
            "Catalog file edits that did not load (the previous catalog serves).",
            registry=r,
        )
        self.redis_errors = Counter(
            "leap_redis_errors", "Redis operations that failed.", ["op"], registry=r
        )
        self.redis_evicted_keys = Gauge(
            "leap_redis_evicted_keys",
            "Keys the online store's Redis evicted since it started (INFO evicted_keys).",
            registry=r,
        )
        self.history_unavailable = Counter(
            "leap_history_unavailable",
            "Rankings made without history because Redis failed.",
            registry=r,
        )
        self.consumer_lag = Gauge(
            "leap_consumer_lag",
            "High watermark minus committed offset of the worker's group.",
            ["topic", "partition"],
            registry=r,
        )
        self.consumer_lag_seconds = Gauge(
            "leap_consumer_lag_seconds",
            "Age of the oldest record of the partition the worker's group has not processed.",
            ["topic", "partition"],
            registry=r,
        )
        self.completions_duplicate = Counter(
            "leap_completions_duplicate", "Completions already seen (ignored).", registry=r
        )
        self.quarantined = Counter(
            "leap_measurements_quarantined",
            "Measurements kept out of the history by a rule (devices, lineage, aggregate, "
            "physics, speed).",
            ["rule"],
            registry=r,
        )
        self.aggregate_held = Counter(
            "leap_aggregate_updates_held",
            "Accepted measurements whose model type's aggregate the speed bound held back.",
            registry=r,
        )
        self.online_predictions = Counter(
            "leap_online_predictions",
            "Completions compared with the model's ranking on the hardware the job ran on.",
            ["hardware_type", "anchor"],
            registry=r,
        )
        self.online_within_10pct = Counter(
            "leap_online_within_10pct",
            "Of those, predictions within ±10 % of the measured throughput.",
            ["hardware_type", "anchor"],
            registry=r,
        )
        self.online_abs_log_error = Histogram(
            "leap_online_abs_log_error",
            "|log(predicted / measured)| per device on the hardware the job ran on.",
            ["anchor"],
            buckets=_ERROR_BUCKETS,
            registry=r,
        )
        self.dataset_rows_written = Counter(
            "leap_dataset_rows_written", "Rows made durable in the dataset.", registry=r
        )
        self.dataset_write_failures = Counter(
            "leap_dataset_write_failures",
            "Dataset writes that failed (rows kept, unacked, retried; history updates go on).",
            registry=r,
        )
        self.dataset_pending_rows = Gauge(
            "leap_dataset_pending_rows",
            "Rows waiting for the dataset sink (their completions are not committed yet).",
            registry=r,
        )
        self.consumer_replaced = Counter(
            "leap_consumer_replaced",
            "Submissions consumers replaced because their group did not settle in LEAP_CONSUMER_STALL_S.",
            registry=r,
        )
        self.producer_resets = Counter(
            "leap_producer_resets", "Output producers replaced after a failed flush.", registry=r
        )
        self._valid_submissions = 0
        self._covered = 0
        self._model_version: str | None = None

    def observe_online(self, scored: list[tuple[str, str, float]]) -> None:
        """The online accuracy: per compared completion, (hardware, anchor, relative error)."""
        for hw, anchor, rel in scored:
            self.online_predictions.labels(hardware_type=hw, anchor=anchor).inc()
            if abs(rel) <= 0.10:
                self.online_within_10pct.labels(hardware_type=hw, anchor=anchor).inc()
            self.online_abs_log_error.labels(anchor=anchor).observe(abs(math.log1p(rel)))

    def observe_coverage(self, valid: int, covered: int) -> None:
        self._valid_submissions += valid
        self._covered += covered
        if self._valid_submissions:
            self.coverage_ratio.set(self._covered / self._valid_submissions)

    def set_model(self, version: str | None, trained_at_epoch: float | None, now: float) -> None:
        # remove only on a change: every poll calls this, and a scrape between a remove and the
        # set would see no model at all
        if self._model_version is not None and self._model_version != version:
            self.model_info.remove(self._model_version)
        self._model_version = version
        if version is not None:
            self.model_info.labels(version=version).set(1)
        self.model_age.set(max(0.0, now - trained_at_epoch) if trained_at_epoch else 0.0)

    def serve(
        self,
        port: int,
        addr: str = "127.0.0.1",
        ready: Callable[[], dict[str, Any]] | None = None,
    ) -> ThreadingHTTPServer | None:
        """Start /metrics, /healthz (alive) and /readyz (``ready()``: 200 when its "ready" is
        true, else 503) in a daemon thread; None when ``port`` is 0 (off)."""
        if not port:
            return None
        server = ThreadingHTTPServer((addr, port), _handler(self.registry, ready))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="leap-metrics", daemon=True).start()
        return server


def _handler(
    registry: CollectorRegistry, ready: Callable[[], dict[str, Any]] | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b'{"status":"ok"}')
            elif path == "/readyz":
                state = ready() if ready is not None else {"ready": True}
                self._send(200 if state.get("ready") else 503, orjson.dumps(state))
            else:
                self._send(404, b'{"error":"not found"}')

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


__all__ = ["Metrics"]
