"""The worker's HTTP endpoints on its metrics port: /metrics, /healthz and /readyz."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from leap_stream.stream.metrics import Metrics
from leap_stream.tools.dev.state import free_port


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_health_readiness_and_metrics() -> None:
    state: dict[str, Any] = {"ready": False, "model": None, "redis": True}
    metrics = Metrics()
    metrics.events_in.labels(topic="t", outcome="ok").inc()
    port = free_port()
    server = metrics.serve(port, ready=lambda: dict(state))
    assert server is not None
    try:
        status, body = _get(port, "/metrics")
        assert status == 200 and b'leap_events_in_total{outcome="ok",topic="t"} 1.0' in body
        assert _get(port, "/healthz") == (200, b'{"status":"ok"}')
        status, body = _get(port, "/readyz")
        assert status == 503 and json.loads(body) == state
        state.update(ready=True, model="v1")
        status, body = _get(port, "/readyz?verbose=1")
        assert status == 200 and json.loads(body)["model"] == "v1"
        assert _get(port, "/nothing")[0] == 404
    finally:
        server.shutdown()
    assert Metrics().serve(0) is None
