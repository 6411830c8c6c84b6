"""The `serve` stage: single-job requests at a fixed rate (open loop), then the most requests a
second one process answers."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from leap_stream.tools.bench.capacity import (
    SERVE_P99_MS,
    CapacityPlan,
    Cores,
    pinned,
    search,
)
from leap_stream.tools.bench.stats import percentile_ms, rate
from leap_stream.tools.bench.world import BenchWorld
from leap_stream.tools.harness import (
    WorkerProcess,
    free_port,
    serve_ready,
    wait_for,
    worker_env,
)

T = TypeVar("T")


@contextmanager
def serving(world: BenchWorld, rank_topic: str) -> Iterator[tuple[str, WorkerProcess]]:
    """`leap-stream serve` on this world, ready (and serving compiled trees where they are
    wanted): its base URL and process; stopped on exit."""
    import httpx

    from leap_stream.stream.compiled import wanted

    port = free_port()
    env = worker_env(
        bootstrap=world.bootstrap,
        redis_url=world.redis_url,
        prefix=world.prefix,
        topics={"sub": rank_topic, "comp": rank_topic, "rank": rank_topic, "dlq": rank_topic},
        group=f"bench-serve-{uuid.uuid4().hex[:8]}",
        home=world.tmp / "serve-home",
        dataset_dir=world.tmp / "dataset",
        registry_dir=world.registry_dir,
        metrics_port=0,
        settings={
            "LEAP_SERVE_PORT": str(port),
            "LEAP_LOG_LEVEL": "WARNING",
            "LEAP_REDIS_CLUSTER": "1" if world.settings.redis_cluster else "0",
        },
        inherit_leap=True,
    )
    serve = WorkerProcess(env, world.tmp / "serve.log", world.tmp, command=("serve",))
    serve.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("leap-stream serve ready", serve_ready(serve, base), 120)
        if wanted(world.settings.compiled_trees):  # the compile would run during the figures

            def compiled() -> bool:
                text = httpx.get(base + "/metrics", timeout=2.0).text
                return "\nleap_model_compiled 1.0" in text

            wait_for("compiled trees serving in leap-stream serve", compiled, 180)
        yield base, serve
    finally:
        serve.stop()


def http_latency(
    world: BenchWorld, rank_topic: str, per_s: float, seconds: float
) -> dict[str, Any]:
    """`leap-stream serve` on this world: single-job requests open-loop at ``per_s`` for
    ``seconds`` (latency = request sent → ranking received), then the most requests one
    process answers a second with 4 clients back to back."""
    with serving(world, rank_topic) as (base, _serve):
        lat = _http_open_loop(base, world.lines, per_s, seconds)
        rps = _http_max_rate(base, world.lines, clients=4, seconds=min(seconds, 5.0))
    return {
        "offered_per_s": per_s,
        "seconds": seconds,
        "requests": len(lat),
        "p50_ms": percentile_ms(lat, 50),
        "p90_ms": percentile_ms(lat, 90),
        "p99_ms": percentile_ms(lat, 99),
        "max_ms": percentile_ms(lat, 100),
        "max_rps": rps,
    }


def serve_capacity(
    world: BenchWorld, rank_topic: str, plan: CapacityPlan, cores: Cores
) -> dict[str, Any]:
    """The most single-job requests/s `serve` answers with p99 under `SERVE_P99_MS` in
    `plan.need` of `plan.runs` open-loop runs, `serve` pinned to `cores.service` and this
    process (the callers) to `cores.rest`."""
    with (
        serving(world, rank_topic) as (base, serve),
        pinned([serve.proc.pid] if serve.proc else [], cores.service) as on_service,
        pinned([os.getpid()], cores.rest),
    ):

        def one_run(per_s: float) -> float:
            return percentile_ms(_http_open_loop(base, world.lines, per_s, plan.seconds), 99)

        found, tried = search(plan, SERVE_P99_MS, one_run)
    return {"capacity": found, "pinned": on_service, "p99_ms_by_rate": tried}


class _Caller:
    """One keep-alive HTTP/1.1 connection posting job-submitted events to /v1/rank.

    The stdlib client, not httpx: the load generator shares the two cores with the service,
    and httpx's own per-request work (~0.5 ms of Python) showed up in the measured tail."""

    def __init__(self, base: str) -> None:
        import http.client
        from urllib.parse import urlsplit

        url = urlsplit(base)
        self._conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
        self._headers = {"Content-Type": "application/json"}

    def post(self, body: bytes) -> int:
        self._conn.request("POST", "/v1/rank", body=body, headers=self._headers)
        resp = self._conn.getresponse()
        resp.read()
        return resp.status

    def close(self) -> None:
        self._conn.close()


def _http_open_loop(base: str, bodies: list[bytes], per_s: float, seconds: float) -> list[float]:
    """Requests sent on schedule (i / per_s) by a small pool, so a slow answer does not delay
    the next one (open loop); latency counts from the scheduled send time, so a request that
    waited for a free caller is not flattered (no coordinated omission)."""
    from concurrent.futures import ThreadPoolExecutor

    total = int(per_s * seconds)
    lat: list[float] = []
    lock = threading.Lock()
    local = threading.local()
    t0 = time.perf_counter()

    def one(i: int) -> None:
        caller = getattr(local, "caller", None)
        if caller is None:
            caller = local.caller = _Caller(base)
        status = caller.post(bodies[i % len(bodies)])
        took = time.perf_counter() - (t0 + i / per_s)
        if status == 200:
            with lock:
                lat.append(took)

    with ThreadPoolExecutor(8) as pool:
        for i in range(total):
            wait = i / per_s - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)
            pool.submit(one, i)
    return lat


def _http_max_rate(base: str, bodies: list[bytes], clients: int, seconds: float) -> float:
    """Answers per second with ``clients`` callers each sending the next request at once."""
    done = [0] * clients
    end = time.perf_counter() + seconds

    def call(k: int) -> None:
        caller = _Caller(base)
        i = k
        while time.perf_counter() < end:
            done[k] += caller.post(bodies[i % len(bodies)]) == 200
            i += clients
        caller.close()

    threads = [threading.Thread(target=call, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return rate(sum(done), time.perf_counter() - t0)


__all__ = ["http_latency"]
