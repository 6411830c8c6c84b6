"""`leap-stream serve`: rank over HTTP, for schedulers that ask at their own hook.

The same core as the worker: a request's submissions are decoded and checked by the contracts,
their lineage history read and the submissions remembered for the completion join in one Redis
round trip, ranked with one model call by the hot-reloaded model, and the rankings produced to
the rankings topic (the audit trail and the accuracy figures include HTTP-ranked jobs). It
degrades like the worker: without Redis it ranks without history (``history_used`` false),
without a model it uses the lookup table.

The response does not wait for the broker: a publisher thread produces the rankings, retrying
like the worker, so a Kafka outage slows no scheduler; at most ``PUBLISH_BACKLOG`` rankings
wait, then requests get 503 until the broker is back. TLS is a reverse proxy's job
(docs/serve.md); bearer tokens are optional (``LEAP_SERVE_TOKENS_FILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hmac
import itertools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from leap_stream.contracts import DeadLetter, HardwareRanking, load_schema
from leap_stream.settings import Settings, SettingsError
from leap_stream.stream.batch import Record, SubmissionProcessor
from leap_stream.stream.kafka import KafkaClients
from leap_stream.stream.output import OutputProducer
from leap_stream.stream.retry import Retry, Unfinished

log = logging.getLogger(__name__)

PUBLISH_BACKLOG = 50_000  # rankings waiting for the broker before requests are refused
HTTP_TOPIC = "http"  # the source topic of a request's records (dead letters name it)


class Busy(RuntimeError):
    """The rankings backlog is full: the broker has been unreachable for a while."""


class Publisher:
    """Produces rankings to the rankings topic from its own thread, in batches, retrying a
    failed flush on a fresh producer until it succeeds or the service stops."""

    def __init__(self, out: OutputProducer, topic: str, retry_cap_s: float = 10.0) -> None:
        self.out = out
        self.topic = topic
        self._queue: queue.Queue[HardwareRanking] = queue.Queue(PUBLISH_BACKLOG)
        self._stop = threading.Event()
        self._retry = Retry(self._stop.is_set, self._stop.wait, cap_s=retry_cap_s)
        self._thread = threading.Thread(target=self._main, name="leap-serve-publish", daemon=True)
        self.published = 0

    def start(self) -> None:
        self._thread.start()

    def put(self, rankings: Sequence[HardwareRanking]) -> None:
        """Queue rankings without waiting (it runs on the event loop); Busy when full."""
        try:
            for r in rankings:
                self._queue.put_nowait(r)
        except queue.Full:
            raise Busy("the rankings topic is not reachable; try again") from None

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    def _main(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            try:
                batch = [self._queue.get(timeout=0.1)]
            except queue.Empty:
                continue
            while len(batch) < 1000:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._retry.run("produce", self._send, batch)
            except Unfinished:
                log.error("stopping with %d rankings not published", len(batch) + self.backlog)
                return
            self.published += len(batch)

    def _send(self, batch: list[HardwareRanking]) -> int:
        for r in batch:
            self.out.send(self.topic, str(r["job_id"]).encode(), orjson.dumps(r))
        return self.out.flush()

    def stop(self, timeout: float = 30.0) -> None:
        """Publish what is queued (for up to ``timeout``), then close the producer."""
        deadline = time.monotonic() + timeout
        while not self._queue.empty() and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.05)
        self._stop.set()
        self._thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        self.out.close(5.0)


class RankService:
    """Raw request bodies → one outcome each: a ranking, or the dead-letter error of the input.

    Ranking runs on the event loop itself: a request queues its bodies and schedules one drain
    (``call_soon``), so every request that arrived in the same loop iteration is ranked in one
    batch, with one Redis round trip and one model call, as the worker's batches are. No thread
    hop on the way: each would wait for the GIL behind whatever else runs (up to the 5 ms switch
    interval), which is where the latency tail was. The processor is used from the loop only."""

    def __init__(
        self,
        processor: SubmissionProcessor,
        publish: Callable[[Sequence[HardwareRanking]], object],
        ready: Callable[[], dict[str, Any]],
        max_batch: int = 500,
    ) -> None:
        self.processor = processor
        self.publish = publish
        self.ready = ready
        self.max_batch = max_batch
        self.batches = 0
        self._pending: collections.deque[_Request] = collections.deque()
        self._scheduled = False
        self._offsets = itertools.count()

    async def rank(self, bodies: Sequence[bytes]) -> list[HardwareRanking | DeadLetter]:
        loop = asyncio.get_running_loop()
        request = _Request(list(bodies), loop.create_future())
        self._pending.append(request)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._drain)
        return await request.future

    def _drain(self) -> None:
        batch: list[_Request] = []
        size = 0
        while self._pending and (
            not batch or size + len(self._pending[0].bodies) <= self.max_batch
        ):
            batch.append(self._pending.popleft())
            size += len(batch[-1].bodies)
        if self._pending:
            asyncio.get_running_loop().call_soon(self._drain)
        else:
            self._scheduled = False
        try:
            self._rank(batch)
        except Exception as exc:  # a bug: every caller of the batch gets it, the service goes on
            log.exception("ranking a batch of %d requests failed", len(batch))
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(exc)

    def _rank(self, batch: list[_Request]) -> None:
        per_request = [
            [Record(HTTP_TOPIC, 0, next(self._offsets), None, b) for b in r.bodies] for r in batch
        ]
        records = [rec for recs in per_request for rec in recs]
        res = self.processor.process(records, datetime.now(UTC))
        self.batches += 1
        self.publish(res.rankings)
        dead = {d["source"]["offset"]: d for d in res.dead_letters}
        rankings = iter(res.rankings)
        for request, recs in zip(batch, per_request, strict=True):
            outcomes = [dead[r.offset] if r.offset in dead else next(rankings) for r in recs]
            if not request.future.done():  # the client may have gone
                request.future.set_result(outcomes)


@dataclass
class _Request:
    """One HTTP request's bodies and the future of its outcomes."""

    bodies: list[bytes]
    future: asyncio.Future[list[HardwareRanking | DeadLetter]]


def read_tokens(path: Path) -> frozenset[str]:
    """One bearer token per line; blank lines and ``#`` comments skipped; none is an error."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SettingsError(f"LEAP_SERVE_TOKENS_FILE={str(path)!r}: {exc.strerror}") from None
    tokens = frozenset(t.strip() for t in lines if t.strip() and not t.startswith("#"))
    if not tokens:
        raise SettingsError(f"LEAP_SERVE_TOKENS_FILE={str(path)!r}: no token in the file")
    return tokens


def authorized(header: str | None, tokens: frozenset[str] | None) -> bool:
    """Whether an ``Authorization`` header carries one of the tokens (any, when there are none)."""
    if tokens is None:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    given = header.removeprefix("Bearer ").strip().encode()
    return any(hmac.compare_digest(given, t.encode()) for t in tokens)


def _json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error_body(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The HTTP body of a dead-letter outcome: its error only."""
    return {"error": dict(outcome["error"])}


def create_app(
    service: RankService,
    tokens: frozenset[str] | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """The ASGI app: POST /v1/rank, POST /v1/rank/batch, GET /healthz, GET /readyz, and
    GET /metrics when a metrics ``registry`` is given."""
    from leap_stream import __version__

    app = FastAPI(
        title="leap-stream",
        version=__version__,
        description="Ranks the candidate accelerator types of a training job by predicted "
        "throughput per unit cost (docs/serve.md).",
    )
    submitted = load_schema("job-submitted")
    ranking = load_schema("hardware-ranking")
    error = {
        "type": "object",
        "properties": {"error": load_schema("dead-letter")["properties"]["error"]},
        "required": ["error"],
    }

    def denied(request: Request) -> Any:
        if authorized(request.headers.get("authorization"), tokens):
            return None
        return _json_response({"error": {"kind": "unauthorized", "message": "bearer token"}}, 401)

    @app.post(
        "/v1/rank",
        summary="Rank one job-submitted event",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": submitted}},
            },
            "responses": {
                "200": {
                    "description": "The hardware-ranking event",
                    "content": {"application/json": {"schema": ranking}},
                },
                "422": {
                    "description": "Not a valid job-submitted event (the dead-letter error kinds)",
                    "content": {"application/json": {"schema": error}},
                },
            },
        },
    )
    async def rank(request: Request) -> Any:
        if (no := denied(request)) is not None:
            return no
        body = await request.body()
        [out] = await service.rank([body])
        if "error" in out:
            return _json_response(_error_body(out), 422)
        return _json_response(out)

    @app.post(
        "/v1/rank/batch",
        summary="Rank many job-submitted events in one request",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"type": "array", "items": submitted}}},
            },
            "responses": {
                "200": {
                    "description": "One result per event, in order: a ranking or an error",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "results": {
                                        "type": "array",
                                        "items": {
                                            "oneOf": [
                                                {
                                                    "type": "object",
                                                    "properties": {"ranking": ranking},
                                                    "required": ["ranking"],
                                                },
                                                error,
                                            ]
                                        },
                                    }
                                },
                                "required": ["results"],
                            }
                        }
                    },
                },
                "422": {
                    "description": "The body is not a JSON array",
                    "content": {"application/json": {"schema": error}},
                },
            },
        },
    )
    async def rank_batch(request: Request) -> Any:
        if (no := denied(request)) is not None:
            return no
        try:
            events = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _json_response({"error": {"kind": "not_json", "message": str(exc)}}, 422)
        if not isinstance(events, list):
            message = "a batch is a JSON array of job-submitted events"
            return _json_response({"error": {"kind": "not_object", "message": message}}, 422)
        outs = await service.rank([orjson.dumps(e) for e in events])
        results = [_error_body(o) if "error" in o else {"ranking": o} for o in outs]
        return _json_response({"results": results})

    @app.post(
        "/v1/skypilot/policy",
        summary="SkyPilot admin policy: order the task's accelerators by the ranking",
        description="The endpoint of SkyPilot's RestfulAdminPolicy (docs/schedulers.md). "
        "SkyPilot sends no headers of its own, so a bearer token may also come as the `token` "
        "query parameter here.",
    )
    async def skypilot_policy(request: Request) -> Any:
        from leap_stream.schedulers.skypilot import policy_answer

        if not authorized(request.headers.get("authorization"), tokens):
            query = request.query_params.get("token")
            if query is None or not authorized(f"Bearer {query}", tokens):
                return denied(request)
        body = await request.body()

        async def rank_one(submission: bytes) -> Any:
            [out] = await service.rank([submission])
            if "error" in out:
                return _error_body(out)
            return out

        status, answer, outcome = await policy_answer(body, rank_one, datetime.now(UTC))
        if outcome != "ranked":
            log.info("skypilot policy: task returned as it came: %s", outcome)
        return Response(answer, status_code=status, media_type="application/json")

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> Any:
        return _json_response({"status": "ok"})

    @app.get("/readyz", summary="A model is loaded and Redis answers")
    async def readyz() -> Any:
        state = await _in_thread(service.ready)
        return _json_response(state, 200 if state["ready"] else 503)

    if registry is not None:

        @app.get("/metrics", include_in_schema=False)
        async def metrics() -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(Busy)
    async def busy(_request: Request, exc: Busy) -> Any:
        return _json_response({"error": {"kind": "busy", "message": str(exc)}}, 503)

    return app


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    import anyio

    return await anyio.to_thread.run_sync(fn, *args)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="default LEAP_SERVE_HOST")
    parser.add_argument("--port", type=int, default=None, help="default LEAP_SERVE_PORT")
    parser.add_argument(
        "--openapi", action="store_true", help="print the OpenAPI document and exit"
    )


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of the service (docs/openapi.json is this, committed)."""
    service = RankService(None, lambda _r: None, lambda: {"ready": False})  # type: ignore[arg-type]
    doc: dict[str, Any] = create_app(service).openapi()
    return doc


def run(args: argparse.Namespace, cfg: Settings) -> int:
    if args.openapi:
        print(orjson.dumps(openapi_document(), option=orjson.OPT_INDENT_2).decode())
        return 0
    import uvicorn

    from leap_stream.stream.app import poll_in_thread
    from leap_stream.stream.worker import RefusedToStart, ranking_core, tune_gc

    logging.basicConfig(
        level=cfg.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    tokens = read_tokens(Path(cfg.serve_tokens_file)) if cfg.serve_tokens_file else None
    kafka = KafkaClients.of(cfg, cfg.require_kafka())
    try:
        core = ranking_core(cfg)
    except RefusedToStart as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    publisher = Publisher(
        OutputProducer(
            kafka,
            timeout_s=cfg.produce_timeout_s,
            max_message_bytes=cfg.max_message_bytes,
            on_reset=core.metrics.producer_resets.inc,
        ),
        cfg.topic_rankings,
    )
    publisher.start()
    tune_gc(cfg)
    stop = threading.Event()
    poll_in_thread("model poll", cfg.model_poll_s, core.holder.poll, stop)

    app = create_app(
        RankService(core.submissions, publisher.put, core.ready), tokens, core.metrics.registry
    )
    host = args.host or cfg.serve_host
    port = cfg.serve_port if args.port is None else args.port
    try:
        uvicorn.run(app, host=host, port=port, log_level=cfg.log_level.lower(), access_log=False)
    finally:
        stop.set()
        publisher.stop()
    return 0


__all__ = [
    "Busy",
    "Publisher",
    "RankService",
    "authorized",
    "create_app",
    "openapi_document",
    "read_tokens",
    "register",
    "run",
]
