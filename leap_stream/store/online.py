"""The online store: serving-time history in Redis, one round trip per batch.

Layout (docs/design.md, docs/stores.md): ``lin`` (per lineage) and ``agg`` (per model type)
hashes of hardware → orjson arrays, ``seen`` dedup markers per completion event, ``sub``
submissions kept for the completion → dataset join, ``pred`` the ranking's predictions. History
updates run in a Lua script so each completion is applied atomically and at most once, with
exactly the rules of `leap_stream.core.history`.

On a Redis Cluster (``LEAP_REDIS_CLUSTER=1``) every key carries its model type as hash tag
(`KeyLayout`): the keys one completion touches, and one model type's reads, share one slot, so
each script call stays on one node. A batch then makes one script call per model type, sent
as one pipeline per node (`_NodePipelines`).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, TypeVar

import orjson
import redis
from redis.cluster import RedisCluster

from leap_stream.contracts.events import JobCompleted, JobSubmitted
from leap_stream.contracts.timestamps import epoch_s
from leap_stream.core.aggregates import AggregateTable
from leap_stream.core.history import (
    DEFAULT_RULES,
    HISTORY_EWMA_ALPHA,
    HistoryRules,
    LineageHistory,
    event_time,
    is_measurement,
    job_key,
    log_per_device,
)
from leap_stream.core.rows import submission_fields
from leap_stream.settings import Settings
from leap_stream.store.connection import Client, connect_with
from leap_stream.store.keys import KeyLayout
from leap_stream.store.pipelines import _MGets, _NodePipelines, _ReadCall
from leap_stream.store.values import (
    _SUB_CANDIDATES,
    _SUB_DEVICES,
    _SUB_LINEAGE,
    _SUB_MODEL_TYPE,
    ApplyResult,
    Hash,
    Prediction,
    _aggregate_table,
    _from_flat,
    _result,
    _text,
    decode_measurement,
    decode_predictions,
    decode_submission,
    encode_submission,
)

T = TypeVar("T")


def _lua(name: str) -> str:
    """One of the store's Redis scripts (leap_stream/store/lua/), read once at import."""
    return (resources.files("leap_stream.store") / "lua" / name).read_text(encoding="utf-8")


class OnlineStoreUnavailable(Exception):
    """Redis failed (down, timeout, auth): the worker ranks without history and counts it."""

    def __init__(self, op: str, cause: BaseException) -> None:
        super().__init__(f"online store {op} failed: {type(cause).__name__}: {cause}")
        self.op = op
        self.cause = cause


# The completions script (its arguments and return codes: the head of lua/apply.lua)
APPLY_LUA = _lua("apply.lua")

# The read-and-remember script (lua/read.lua)
READ_LUA = _lua("read.lua")

_APPLY_CHUNK = 500  # events per EVALSHA: bounds how long one script blocks Redis


def _raise_first(results: list[Any]) -> list[Any]:
    for x in results:
        if isinstance(x, Exception):
            raise x
    return results


def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


class OnlineStore:
    """History reads, submission memory, and idempotent history updates over one Redis client."""

    def __init__(
        self,
        client: Client,
        prefix: str,
        *,
        dedup_ttl_s: int = 1_209_600,
        submission_ttl_s: int = 2_592_000,
        history_ttl_s: int = 15_552_000,
        rules: HistoryRules = DEFAULT_RULES,
        allow_orphans: bool = False,
    ) -> None:
        self.r = client
        self.prefix = prefix
        self.keys = KeyLayout(prefix, tagged=isinstance(client, RedisCluster))
        self.dedup_ttl_s = dedup_ttl_s
        self.submission_ttl_s = submission_ttl_s
        self.history_ttl_s = history_ttl_s
        self.rules = rules
        self.allow_orphans = allow_orphans
        self._use_scripts(APPLY_LUA, READ_LUA)

    @classmethod
    def of(cls, cfg: Settings, client: Client | None = None) -> OnlineStore:
        """The store the settings describe (prefix, retention), over ``client`` or a new one."""
        return cls(
            client or connect_with(cfg),
            cfg.redis_prefix,
            dedup_ttl_s=cfg.dedup_ttl_s,
            submission_ttl_s=cfg.submission_ttl_s,
            history_ttl_s=cfg.history_ttl_s,
            rules=cfg.history_rules(),
            allow_orphans=cfg.allow_orphans,
        )

    # --- plumbing
    def _guard(self, op: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (redis.RedisError, OSError) as exc:
            raise OnlineStoreUnavailable(op, exc) from exc

    def _use_scripts(self, apply_lua: str, read_lua: str) -> None:
        """Scripts are sent by SHA (EVALSHA); the text is loaded only after a NOSCRIPT reply."""
        self._scripts = (apply_lua, read_lua)
        self._apply_sha = _sha1(apply_lua)
        self._read_sha = _sha1(read_lua)

    def _load_scripts(self, client: redis.Redis) -> None:
        for script in self._scripts:
            client.script_load(script)

    def _execute(self, op: str, build: Callable[[Any], None]) -> list[Any]:
        """Run a pipeline built by ``build``; on NOSCRIPT (Redis restarted/flushed) load and rerun.

        Rerunning is safe: on one server a NOSCRIPT reply means no script of the pipeline ran,
        the rest is reads and idempotent SETs. A cluster reruns only what did not run
        (`_NodePipelines`).
        """

        def run() -> list[Any]:
            if isinstance(self.r, RedisCluster):
                nodes = _NodePipelines(self.r)
                build(nodes)
                return _raise_first(nodes.execute(self._scripts))
            client = self.r
            for attempt in range(2):
                pipe = client.pipeline(transaction=False)
                build(pipe)
                results: list[Any] = pipe.execute(raise_on_error=False)
                if attempt == 0 and any(
                    isinstance(x, redis.exceptions.NoScriptError) for x in results
                ):
                    self._load_scripts(client)
                    continue
                return _raise_first(results)
            raise AssertionError("unreachable")

        return self._guard(op, run)

    # --- reads
    def _decode_reads(
        self, hashes: Sequence[Hash], lineage_ids: Sequence[str], model_types: Sequence[str]
    ) -> tuple[list[LineageHistory], AggregateTable]:
        """All values of the batch go through one orjson call; field names are decoded once;
        the aggregates stay flat arrays (`AggregateTable`)."""
        values = [v if isinstance(v, bytes) else v.encode() for _f, vs in hashes for v in vs]
        try:
            decoded = orjson.loads(b"[" + b",".join(values) + b"]")
        except orjson.JSONDecodeError as exc:  # a foreign or corrupt value: degrade, don't crash
            raise OnlineStoreUnavailable("decode", exc) from exc
        n = len(lineage_ids)
        names: dict[Any, str] = {}
        try:
            histories, used = self._decode_lineages(hashes[:n], decoded, names)
            aggregates = _aggregate_table(hashes[n:], decoded[used:], model_types, names)
        except (TypeError, ValueError, IndexError) as exc:
            raise OnlineStoreUnavailable("decode", exc) from exc
        return histories, aggregates

    @staticmethod
    def _decode_lineages(
        hashes: Sequence[Hash], decoded: list[Any], names: dict[Any, str]
    ) -> tuple[list[LineageHistory], int]:
        """The lineages' histories, and how many of ``decoded`` they took."""
        out: list[LineageHistory] = []
        pos = 0
        for fields, _vs in hashes:
            one: LineageHistory = {}
            for f in fields:
                name = names.get(f)
                if name is None:
                    name = names[f] = _text(f)
                m = decode_measurement(decoded[pos])
                pos += 1
                if m.recent:  # an entry with only a quarantined value is no prior
                    one[name] = m
            out.append(one)
        return out, pos

    def read_batch(
        self,
        lineage_ids: Sequence[str],
        model_types: Iterable[str],
        lineage_types: Sequence[str] | None = None,
    ) -> tuple[list[LineageHistory], AggregateTable]:
        """History of every lineage (in order) and aggregates of every model type, one round
        trip. ``lineage_types``: each lineage's model type, which a cluster's keys need."""
        if lineage_types is None:
            if self.keys.tagged and lineage_ids:
                raise ValueError("on a Redis Cluster, reading a lineage needs its model type")
            lineage_types = [""] * len(lineage_ids)
        return self._read(lineage_ids, lineage_types, _unique(model_types), [])

    def _read(
        self,
        lineage_ids: Sequence[str],
        lineage_types: Sequence[str],
        types: Sequence[str],
        remember: Sequence[dict[str, Any]],
        predictions: Sequence[Prediction] = (),
    ) -> tuple[list[LineageHistory], AggregateTable]:
        """One EVALSHA per key group (one on a single Redis; one per model type on a
        cluster): every HGETALL and every SET of the batch (it beat a pipeline of HGETALLs,
        docs/stores.md)."""
        groups: dict[str, _ReadCall] = {}
        by_type: dict[str, _ReadCall] = {}

        def call(model_type: str) -> _ReadCall:
            # by model type first: a batch has thousands of keys and a few hundred types
            got = by_type.get(model_type)
            if got is None:
                group = self.keys.group(model_type)
                got = groups.get(group)
                if got is None:
                    got = groups[group] = _ReadCall()
                by_type[model_type] = got
            return got

        for i, (lin, mt) in enumerate(zip(lineage_ids, lineage_types, strict=True)):
            call(mt).read(self.keys.lin(lin, mt), i)
        n = len(lineage_ids)
        for k, t in enumerate(types):
            call(t).read(self.keys.agg(t), n + k)
        for f in remember:
            mt = f["model_type"]
            call(mt).write(self.keys.sub(f["job_id"], f["attempt"], mt), encode_submission(f))
        for job, attempt, mt, value in predictions:
            call(mt).write(self.keys.pred(job, attempt, mt), value)
        ttl = self.submission_ttl_s

        def build(p: Any) -> None:
            for g in groups.values():
                keys = g.reads + g.writes
                p.evalsha(self._read_sha, len(keys), *keys, len(g.reads), ttl, *g.values)

        results = self._execute("read", build)
        hashes: list[Hash] = [((), ())] * (n + len(types))
        for g, got in zip(groups.values(), results, strict=True):
            for pos, flat in zip(g.positions, got, strict=True):
                hashes[pos] = _from_flat(flat)
        return self._decode_reads(hashes, lineage_ids, types)

    # --- submissions
    def _queue_remember(self, pipe: Any, fields: Iterable[dict[str, Any]]) -> None:
        for f in fields:
            key = self.keys.sub(f["job_id"], f["attempt"], f["model_type"])
            pipe.set(key, encode_submission(f), ex=self.submission_ttl_s)

    def remember_submissions(self, submissions: Sequence[JobSubmitted]) -> None:
        """Keep each submission's dataset fields until its completion arrives (EX the TTL)."""
        if submissions:
            fields = [submission_fields(s) for s in submissions]
            self._execute("remember", lambda p: self._queue_remember(p, fields))

    def read_and_remember(
        self, submissions: Sequence[JobSubmitted], predictions: Sequence[Prediction] = ()
    ) -> tuple[list[LineageHistory], AggregateTable]:
        """The submissions hot path: history reads and submission SETs in one round trip, and
        the ``predictions`` of an earlier batch riding along (`encode_predictions`)."""
        fields = [submission_fields(s) for s in submissions]
        lineage_ids = [f["lineage_id"] for f in fields]
        lineage_types = [f["model_type"] for f in fields]
        types = _unique(lineage_types)
        return self._read(lineage_ids, lineage_types, types, fields, predictions)

    def remember_predictions(self, predictions: Sequence[Prediction]) -> None:
        """The predictions no submission batch carried (the loop was idle)."""
        if predictions:
            ttl = self.submission_ttl_s

            def build(pipe: Any) -> None:
                for job, attempt, mt, value in predictions:
                    pipe.set(self.keys.pred(job, attempt, mt), value, ex=ttl)

            self._execute("remember", build)

    def fetch_submissions(
        self, keys: Sequence[tuple[str, int]], model_types: Sequence[str] | None = None
    ) -> list[dict[str, Any] | None]:
        """Stored submission fields for (job_id, attempt) pairs; None when unknown or expired.
        ``model_types``: each pair's model type, which a cluster's keys need."""
        if not keys:
            return []
        if model_types is None:
            if self.keys.tagged:
                raise ValueError("on a Redis Cluster, fetching a submission needs its model type")
            model_types = [""] * len(keys)
        names = [self.keys.sub(j, a, mt) for (j, a), mt in zip(keys, model_types, strict=True)]
        plan = _MGets.of(names, [self.keys.group(mt) for mt in model_types])
        results = self._execute("fetch", plan.queue)
        return [decode_submission(v) for v in plan.collect(results)]

    # --- completions
    def _apply_args(self, require_submission: bool) -> list[str | int]:
        r = self.rules
        return [
            repr(HISTORY_EWMA_ALPHA),
            self.dedup_ttl_s,
            self.history_ttl_s,
            r.recent,
            repr(r.lineage_limit),
            repr(r.aggregate_limit),
            r.aggregate_min_count,
            "0" if require_submission else "1",
            _SUB_LINEAGE,
            _SUB_MODEL_TYPE,
            _SUB_DEVICES,
            _SUB_CANDIDATES,
            repr(r.physics_limit),
            self.submission_ttl_s,
            repr(r.speed_limit),
            repr(r.aggregate_speed_limit),
            repr(r.speed_period_s),
            repr(r.corroboration_gap_s),
            repr(r.corroborated_limit),
        ]

    def _apply_order(self, completions: Sequence[Mapping[str, Any]]) -> list[list[int]]:
        """Script calls of an apply, as lists of completion indices: arrival order inside a
        call, at most `_APPLY_CHUNK` per call, one key group per call (a cluster's calls hold
        one model type each; completions of different model types touch no common key)."""
        by_group: dict[str, list[int]] = {}
        for i, c in enumerate(completions):
            by_group.setdefault(self.keys.group(c["model_type"]), []).append(i)
        return [
            idx[k : k + _APPLY_CHUNK]
            for idx in by_group.values()
            for k in range(0, len(idx), _APPLY_CHUNK)
        ]

    def _queue_apply(
        self,
        pipe: Any,
        completions: Sequence[Mapping[str, Any]],
        calls: Sequence[Sequence[int]],
        require_submission: bool,
        ceilings: Sequence[float | None] | None = None,
        now: float = math.inf,
    ) -> None:
        for idx in calls:
            keys: list[str] = []
            args = self._apply_args(require_submission)
            for i in idx:
                c = completions[i]
                mt = c["model_type"]
                keys += [
                    self.keys.seen(c["event_id"], mt),
                    self.keys.lin(c["lineage_id"], mt),
                    self.keys.agg(mt),
                    self.keys.sub(c["job_id"], int(c["attempt"]), mt),
                    self.keys.done(
                        c["job_id"],
                        int(c["attempt"]),
                        mt,
                        c["hardware_type"] if c.get("probe") else None,
                    ),
                    self.keys.guard(c["lineage_id"], mt),
                    self.keys.aggregate_guard(mt),
                ]
                sps_raw = (c.get("throughput") or {}).get("samples_per_s")
                sps = None if sps_raw is None else float(sps_raw)
                nd = int(c["num_devices"])
                ceiling = None if ceilings is None else ceilings[i]
                ids = [c["lineage_id"], mt]
                ids.append("" if ceiling is None or not math.isfinite(ceiling) else repr(ceiling))
                if is_measurement(c["status"], sps) and nd > 0:
                    assert sps is not None
                    at = epoch_s(c["ended_at"])
                    x = log_per_device(sps, nd)
                    flag = "2" if c.get("probe") else "1"
                    args += [flag, c["hardware_type"], nd, repr(at), repr(x), *ids]
                    args += [c["event_id"], repr(event_time(at, now)), job_key(str(c["job_id"]))]
                else:
                    args += ["0", c["hardware_type"], nd, "0", "0", *ids, c["event_id"], "0", 0]
            pipe.evalsha(self._apply_sha, len(keys), *keys, *args)

    def _apply_results(
        self,
        results: Sequence[Any],
        completions: Sequence[Mapping[str, Any]],
        calls: Sequence[Sequence[int]],
    ) -> list[ApplyResult]:
        codes = [0] * len(completions)
        for idx, got in zip(calls, results, strict=True):
            for i, code in zip(idx, got, strict=True):
                codes[i] = int(code)
        return [_result(c["event_id"], code) for c, code in zip(completions, codes, strict=True)]

    def apply_completions(
        self,
        completions: Sequence[Mapping[str, Any]],
        *,
        require_submission: bool = False,
        now: float = math.inf,
    ) -> list[ApplyResult]:
        """Dedup and history update, atomic per event, in arrival order per model type, one
        round trip.

        Takes job-completed events or the completion fields of dataset rows
        (`offline.completions_from_frame`, for a rebuild): only what the history needs. A
        stored submission that disagrees is a mismatch either way; its absence only matters
        with ``require_submission`` (a rebuild replays rows whose submissions have expired).
        ``now``: the reader's clock, which bounds the speed rule's time (`event_time`; a
        rebuild has none: its rows' ``ended_at`` is the time)."""
        if not completions:
            return []
        calls = self._apply_order(completions)
        results = self._execute(
            "apply",
            lambda p: self._queue_apply(p, completions, calls, require_submission, None, now),
        )
        return self._apply_results(results, completions, calls)

    def apply_and_fetch(
        self,
        completions: Sequence[JobCompleted],
        ceilings: Callable[[Sequence[dict[str, Any] | None]], Sequence[float | None]] | None = None,
        now: float = math.inf,
    ) -> tuple[list[ApplyResult], list[dict[str, Any] | None]]:
        """The completions hot path: `apply_completions` and `fetch_submissions`; each
        submission carries the ranking's predictions under ``_predictions`` when they were
        stored (`decode_predictions`).

        One round trip; two with ``ceilings``, which gives each completion its physics ceiling
        from the submissions read first (the guard's last reference, core.history.judge).
        ``now`` as in `apply_completions`."""
        if not completions:
            return [], []
        n = len(completions)
        names = [
            self.keys.sub(c["job_id"], int(c["attempt"]), c["model_type"]) for c in completions
        ]
        names += [
            self.keys.pred(c["job_id"], int(c["attempt"]), c["model_type"]) for c in completions
        ]
        groups = [self.keys.group(c["model_type"]) for c in completions]
        plan = _MGets.of(names, groups + groups)
        calls = self._apply_order(completions)
        require = not self.allow_orphans

        def decode(got: Sequence[Any]) -> list[dict[str, Any] | None]:
            subs = [decode_submission(v) for v in got[:n]]
            for sub, raw in zip(subs, got[n:], strict=True):
                if sub is not None and raw is not None:
                    sub["_predictions"] = decode_predictions(raw)
            return subs

        if ceilings is None:

            def build(p: Any) -> None:
                self._queue_apply(p, completions, calls, require, None, now)
                plan.queue(p)

            results = self._execute("apply", build)
            applied = self._apply_results(results[: len(calls)], completions, calls)
            return applied, decode(plan.collect(results[len(calls) :]))
        subs = decode(plan.collect(self._execute("fetch", plan.queue)))
        limits = ceilings(subs)
        results = self._execute(
            "apply", lambda p: self._queue_apply(p, completions, calls, require, limits, now)
        )
        return self._apply_results(results, completions, calls), subs

    def rebuild_history(
        self, completions: Sequence[Mapping[str, Any]], chunk: int = 5000
    ) -> tuple[int, int]:
        """Recreate lineage/aggregate history (and dedup markers) from scratch, e.g. from
        `offline.completions_from_frame(read_dataset(...))` after Redis lost its data.

        Deletes this prefix's ``lin``, ``agg``, ``seen``, ``done`` and guard keys first (submissions
        stay; on a cluster, on every master). Returns (events applied, measurements). Run it
        with the completions agent stopped.
        """

        def clear() -> None:
            for kind in ("lin", "agg", "seen", "done", "lguard", "aguard"):
                batch: list[Any] = []
                for key in self.r.scan_iter(match=self.keys.pattern(kind), count=1000):
                    batch.append(key)
                    if len(batch) >= 1000:
                        self.r.delete(*batch)
                        batch = []
                if batch:
                    self.r.delete(*batch)

        self._guard("rebuild", clear)
        applied = measured = 0
        for i in range(0, len(completions), chunk):
            for r in self.apply_completions(completions[i : i + chunk]):
                applied += r.new
                measured += r.measured
        return applied, measured

    def ping(self) -> bool:
        return bool(self._guard("ping", self.r.ping))

    def _nodes(self) -> list[redis.Redis]:
        """One client per server: the cluster's masters, or the one Redis."""
        if isinstance(self.r, RedisCluster):
            return [self.r.get_redis_connection(n) for n in self.r.get_primaries()]
        return [self.r]

    def eviction_policy(self) -> str | None:
        """Redis's ``maxmemory-policy`` (on a cluster, the first master's that is not
        ``noeviction``); None when CONFIG is not allowed (managed services often disable it:
        the operator then answers for the policy)."""
        policies: list[str] = []
        for node in self._nodes():
            try:
                got = node.config_get("maxmemory-policy")
            except redis.ResponseError:
                return None
            except (redis.RedisError, OSError) as exc:
                raise OnlineStoreUnavailable("config", exc) from exc
            value = got.get("maxmemory-policy") or got.get(b"maxmemory-policy")
            if value is None:
                return None
            policies.append(_text(value))
        return next((p for p in policies if p != "noeviction"), "noeviction")

    def evicted_keys(self) -> int | None:
        """Keys Redis evicted since it started (INFO stats ``evicted_keys``; summed over a
        cluster's masters)."""
        total = 0
        for node in self._nodes():
            stats = self._guard("info", functools.partial(node.info, "stats"))
            value = stats.get("evicted_keys")
            if value is None:
                return None
            total += int(value)
        return total


def eviction_problem(policy: str | None, allowed: bool) -> str | None:
    """Why the worker must not start on a Redis with this ``maxmemory-policy`` (None: fine).

    Every key leap-stream writes carries a TTL, so ``volatile-*`` policies evict them as
    readily as ``allkeys-*``: a lost ``seen:`` marker applies a redelivered completion twice, a
    lost ``sub:`` makes an orphan, a lost ``lin:`` drops a prior, all without an error."""
    if policy is None or policy == "noeviction" or allowed:
        return None
    return (
        f"Redis maxmemory-policy is {policy!r}: it silently evicts dedup markers, remembered "
        "submissions and histories. Set it to noeviction (and size maxmemory, docs/stores.md), "
        "or accept the losses with LEAP_REDIS_ALLOW_EVICTION=1"
    )


__all__ = ["APPLY_LUA", "READ_LUA", "OnlineStore", "OnlineStoreUnavailable", "eviction_problem"]
