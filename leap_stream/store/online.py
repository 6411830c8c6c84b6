"""The online store: serving-time history in Redis, one round trip per batch.

Layout (docs/design.md): ``{p}lin:{lineage}`` and ``{p}agg:{model_type}`` hashes of hardware →
orjson arrays, ``{p}seen:{event_id}`` dedup markers, ``{p}sub:{job_id}:{attempt}`` submissions
kept for the completion → dataset join. History updates run in a Lua script so each completion
is applied atomically and at most once, with exactly the rules of `leap_stream.core.history`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from leap_stream.contracts.events import JobCompleted, JobSubmitted
from leap_stream.contracts.timestamps import epoch_s
from leap_stream.core.history import (
    HISTORY_EWMA_ALPHA,
    LineageHistory,
    Measurement,
    TypeAggregate,
    TypeAggregates,
    is_measurement,
)
from leap_stream.core.rows import SUBMISSION_COLUMNS, submission_fields
from leap_stream.settings import Settings

T = TypeVar("T")


class OnlineStoreUnavailable(Exception):
    """Redis failed (down, timeout, auth): the worker ranks without history and counts it."""

    def __init__(self, op: str, cause: BaseException) -> None:
        super().__init__(f"online store {op} failed: {type(cause).__name__}: {cause}")
        self.op = op
        self.cause = cause


@dataclass(frozen=True, slots=True)
class ApplyResult:
    event_id: str
    new: bool  # False: seen before (duplicate), nothing changed
    measured: bool  # True: the history was updated


# One call applies many completions in arrival order. Per event: KEYS seen, lin, agg; ARGV
# measured flag, hardware, samples_per_s, num_devices, measured_at, log(samples_per_s/num_devices)
# (computed in Python so both sides use the same libm). Floats leave as %.17g: exact round trip.
# Returns per event 0 duplicate, 1 new without measurement, 2 new and applied.
APPLY_LUA = """
local alpha = tonumber(ARGV[1])
local ttl = ARGV[2]
local out = {}
local n = #KEYS / 3
for i = 0, n - 1 do
  local a = 3 + 6 * i
  if not redis.call('SET', KEYS[3*i+1], '1', 'NX', 'EX', ttl) then
    out[i+1] = 0
  elseif ARGV[a] ~= '1' then
    out[i+1] = 1
  else
    local hw = ARGV[a+1]
    local s = tonumber(ARGV[a+2])
    local nd = tonumber(ARGV[a+3])
    local at = tonumber(ARGV[a+4])
    local x = tonumber(ARGV[a+5])
    local prev = redis.call('HGET', KEYS[3*i+2], hw)
    local m1, m2, m3, m4 = s, nd, at, 1
    if prev then
      local p = cjson.decode(prev)
      m4 = p[4] + 1
      if at < p[3] then m1, m2, m3 = p[1], p[2], p[3] end
    end
    redis.call('HSET', KEYS[3*i+2], hw, string.format('[%.17g,%d,%.17g,%d]', m1, m2, m3, m4))
    local pa = redis.call('HGET', KEYS[3*i+3], hw)
    local e, c, last = x, 1, at
    if pa then
      local q = cjson.decode(pa)
      e = q[1] + alpha * (x - q[1])
      c = q[2] + 1
      last = math.max(q[3], at)
    end
    redis.call('HSET', KEYS[3*i+3], hw, string.format('[%.17g,%d,%.17g]', e, c, last))
    out[i+1] = 2
  end
end
return out
"""

# Read (and remember) in one script: HGETALL of the first ARGV[1] keys, then SET EX of the rest
# (the submissions) with values ARGV[3..]. One reply instead of one per command.
READ_LUA = """
local nread = tonumber(ARGV[1])
local ttl = ARGV[2]
local out = {}
for i = 1, nread do out[i] = redis.call('HGETALL', KEYS[i]) end
for i = nread + 1, #KEYS do redis.call('SET', KEYS[i], ARGV[i - nread + 2], 'EX', ttl) end
return out
"""

_APPLY_CHUNK = 500  # events per EVALSHA: bounds how long one script blocks Redis


def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


Hash = tuple[Sequence[Any], Sequence[Any]]  # (fields, values) of one HGETALL


def _from_flat(flat: Sequence[Any]) -> Hash:
    return flat[0::2], flat[1::2]


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


_SUB_FORMAT = 1  # first element of a stored submission: the column list it was written with


def encode_submission(fields: Mapping[str, Any]) -> bytes:
    """Values only, in `SUBMISSION_COLUMNS` order: half the memory of a JSON object."""
    return orjson.dumps([_SUB_FORMAT, *(fields[c] for c in SUBMISSION_COLUMNS)])


def decode_submission(raw: bytes | str | None) -> dict[str, Any] | None:
    """A stored submission; None when absent or unreadable (the completion becomes an orphan)."""
    if raw is None:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if (
        isinstance(value, list)
        and value
        and value[0] == _SUB_FORMAT
        and len(value) == len(SUBMISSION_COLUMNS) + 1
    ):
        return dict(zip(SUBMISSION_COLUMNS, value[1:], strict=True))
    return None


def connect(
    url: str, *, password: str = "", timeout_s: float = 1.0, retries: int = 2
) -> redis.Redis:
    """A client with short timeouts and a few quick retries: a dead Redis must fail fast.

    ``rediss://`` URLs use TLS (redis-py verifies the server certificate by default); a
    password in the URL wins over ``password``.
    """
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(ExponentialBackoff(cap=0.25, base=0.01), retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "health_check_interval": 30,
    }
    if password and "@" not in url.split("//", 1)[-1]:
        kwargs["password"] = password
    return redis.Redis.from_url(url, **kwargs)


def connect_with(cfg: Settings, url: str | None = None) -> redis.Redis:
    """`connect` with the configured URL (or ``url``), password, timeout and retries."""
    return connect(
        url or cfg.require_redis(),
        password=cfg.redis_password,
        timeout_s=cfg.redis_timeout_s,
        retries=cfg.redis_retries,
    )


class OnlineStore:
    """History reads, submission memory, and idempotent history updates over one Redis client."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        dedup_ttl_s: int = 1_209_600,
        submission_ttl_s: int = 2_592_000,
    ) -> None:
        self.r = client
        self.prefix = prefix
        self.dedup_ttl_s = dedup_ttl_s
        self.submission_ttl_s = submission_ttl_s
        self._use_scripts(APPLY_LUA, READ_LUA)

    @classmethod
    def of(cls, cfg: Settings, client: redis.Redis | None = None) -> OnlineStore:
        """The store the settings describe (prefix, retention), over ``client`` or a new one."""
        return cls(
            client or connect_with(cfg),
            cfg.redis_prefix,
            dedup_ttl_s=cfg.dedup_ttl_s,
            submission_ttl_s=cfg.submission_ttl_s,
        )

    # --- keys
    def lin_key(self, lineage_id: str) -> str:
        return f"{self.prefix}lin:{lineage_id}"

    def agg_key(self, model_type: str) -> str:
        return f"{self.prefix}agg:{model_type}"

    def seen_key(self, event_id: str) -> str:
        return f"{self.prefix}seen:{event_id}"

    def sub_key(self, job_id: str, attempt: int) -> str:
        return f"{self.prefix}sub:{job_id}:{attempt}"

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

    def _load_scripts(self) -> None:
        for script in self._scripts:
            self.r.script_load(script)

    def _execute(self, op: str, build: Callable[[Any], None]) -> list[Any]:
        """Run a pipeline built by ``build``; on NOSCRIPT (Redis restarted/flushed) load and rerun.

        Rerunning is safe: a NOSCRIPT reply means the script did nothing, the rest is reads
        and idempotent SETs.
        """

        def run() -> list[Any]:
            for attempt in range(2):
                pipe = self.r.pipeline(transaction=False)
                build(pipe)
                results: list[Any] = pipe.execute(raise_on_error=False)
                if attempt == 0 and any(
                    isinstance(x, redis.exceptions.NoScriptError) for x in results
                ):
                    self._load_scripts()
                    continue
                for x in results:
                    if isinstance(x, Exception):
                        raise x
                return results
            raise AssertionError("unreachable")

        return self._guard(op, run)

    # --- reads
    def _decode_reads(
        self, hashes: Sequence[Hash], lineage_ids: Sequence[str], model_types: Sequence[str]
    ) -> tuple[list[LineageHistory], dict[str, TypeAggregates]]:
        """All values of the batch go through one orjson call; field names are decoded once."""
        values = [v if isinstance(v, bytes) else v.encode() for _f, vs in hashes for v in vs]
        try:
            decoded = orjson.loads(b"[" + b",".join(values) + b"]")
        except orjson.JSONDecodeError as exc:  # a foreign or corrupt value: degrade, don't crash
            raise OnlineStoreUnavailable("decode", exc) from exc
        names: dict[Any, str] = {}
        it = iter(decoded)
        out: list[dict[str, Any]] = []
        try:
            for i, (fields, _vs) in enumerate(hashes):
                one: dict[str, Any] = {}
                for f in fields:
                    name = names.get(f)
                    if name is None:
                        name = names[f] = _text(f)
                    v = next(it)
                    if i < len(lineage_ids):
                        one[name] = Measurement(float(v[0]), int(v[1]), float(v[2]), int(v[3]))
                    else:
                        one[name] = TypeAggregate(float(v[0]), int(v[1]), float(v[2]))
                out.append(one)
        except (TypeError, ValueError, IndexError) as exc:
            raise OnlineStoreUnavailable("decode", exc) from exc
        n = len(lineage_ids)
        return out[:n], dict(zip(model_types, out[n:], strict=True))

    def read_batch(
        self, lineage_ids: Sequence[str], model_types: Iterable[str]
    ) -> tuple[list[LineageHistory], dict[str, TypeAggregates]]:
        """History of every lineage (in order) and aggregates of every model type, one round trip."""
        return self._read(lineage_ids, _unique(model_types), [])

    def _read(
        self,
        lineage_ids: Sequence[str],
        types: Sequence[str],
        remember: Sequence[dict[str, Any]],
    ) -> tuple[list[LineageHistory], dict[str, TypeAggregates]]:
        """One EVALSHA: every HGETALL and every SET of the batch (it beat a pipeline of
        HGETALLs, docs/stores.md)."""
        keys = [self.lin_key(x) for x in lineage_ids] + [self.agg_key(t) for t in types]
        n_read = len(keys)
        keys += [self.sub_key(f["job_id"], f["attempt"]) for f in remember]
        values = [encode_submission(f) for f in remember]

        def build(p: Any) -> None:
            p.evalsha(self._read_sha, len(keys), *keys, n_read, self.submission_ttl_s, *values)

        results = self._execute("read", build)
        return self._decode_reads([_from_flat(x) for x in results[0]], lineage_ids, types)

    # --- submissions
    def _queue_remember(self, pipe: Any, fields: Iterable[dict[str, Any]]) -> None:
        for f in fields:
            key = self.sub_key(f["job_id"], f["attempt"])
            pipe.set(key, encode_submission(f), ex=self.submission_ttl_s)

    def remember_submissions(self, submissions: Sequence[JobSubmitted]) -> None:
        """Keep each submission's dataset fields until its completion arrives (EX the TTL)."""
        if submissions:
            fields = [submission_fields(s) for s in submissions]
            self._execute("remember", lambda p: self._queue_remember(p, fields))

    def read_and_remember(
        self, submissions: Sequence[JobSubmitted]
    ) -> tuple[list[LineageHistory], dict[str, TypeAggregates]]:
        """The submissions hot path: history reads and submission SETs in one round trip."""
        fields = [submission_fields(s) for s in submissions]
        lineage_ids = [f["lineage_id"] for f in fields]
        types = _unique(f["model_type"] for f in fields)
        return self._read(lineage_ids, types, fields)

    def fetch_submissions(self, keys: Sequence[tuple[str, int]]) -> list[dict[str, Any] | None]:
        """Stored submission fields for (job_id, attempt) pairs; None when unknown or expired."""
        if not keys:
            return []
        names = [self.sub_key(j, a) for j, a in keys]
        results = self._execute("fetch", lambda p: p.mget(names))
        return [decode_submission(v) for v in results[0]]

    # --- completions
    def _queue_apply(self, pipe: Any, completions: Sequence[Mapping[str, Any]]) -> None:
        for start in range(0, len(completions), _APPLY_CHUNK):
            keys: list[str] = []
            args: list[str | int] = [repr(HISTORY_EWMA_ALPHA), self.dedup_ttl_s]
            for c in completions[start : start + _APPLY_CHUNK]:
                keys += [
                    self.seen_key(c["event_id"]),
                    self.lin_key(c["lineage_id"]),
                    self.agg_key(c["model_type"]),
                ]
                sps_raw = (c.get("throughput") or {}).get("samples_per_s")
                sps = None if sps_raw is None else float(sps_raw)
                nd = int(c["num_devices"])
                if is_measurement(c["status"], sps) and nd > 0:
                    assert sps is not None
                    at = epoch_s(c["ended_at"])
                    x = math.log(sps / nd)
                    args += ["1", c["hardware_type"], repr(sps), nd, repr(at), repr(x)]
                else:
                    args += ["0", c["hardware_type"], "0", 0, "0", "0"]
            pipe.evalsha(self._apply_sha, len(keys), *keys, *args)

    def _apply_results(
        self, results: Sequence[Any], completions: Sequence[Mapping[str, Any]]
    ) -> list[ApplyResult]:
        codes = [int(code) for chunk in results for code in chunk]
        return [
            ApplyResult(c["event_id"], new=code > 0, measured=code == 2)
            for c, code in zip(completions, codes, strict=True)
        ]

    def apply_completions(self, completions: Sequence[Mapping[str, Any]]) -> list[ApplyResult]:
        """Dedup and history update, atomic per event, in list (arrival) order, one round trip.

        Takes job-completed events or the completion fields of dataset rows
        (`offline.completions_from_frame`, for a rebuild): only what the history needs."""
        if not completions:
            return []
        results = self._execute("apply", lambda p: self._queue_apply(p, completions))
        return self._apply_results(results, completions)

    def apply_and_fetch(
        self, completions: Sequence[JobCompleted]
    ) -> tuple[list[ApplyResult], list[dict[str, Any] | None]]:
        """The completions hot path: `apply_completions` and `fetch_submissions` in one round trip."""
        if not completions:
            return [], []
        names = [self.sub_key(c["job_id"], int(c["attempt"])) for c in completions]

        def build(p: Any) -> None:
            self._queue_apply(p, completions)
            p.mget(names)

        results = self._execute("apply", build)
        subs = [decode_submission(v) for v in results[-1]]
        return self._apply_results(results[:-1], completions), subs

    def rebuild_history(
        self, completions: Sequence[Mapping[str, Any]], chunk: int = 5000
    ) -> tuple[int, int]:
        """Recreate lineage/aggregate history (and dedup markers) from scratch, e.g. from
        `offline.completions_from_frame(read_dataset(...))` after Redis lost its data.

        Deletes this prefix's ``lin:``, ``agg:`` and ``seen:`` keys first (submissions stay).
        Returns (events applied, measurements). Run it with the completions agent stopped.
        """

        def clear() -> None:
            for kind in ("lin", "agg", "seen"):
                batch: list[Any] = []
                for key in self.r.scan_iter(match=f"{self.prefix}{kind}:*", count=1000):
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


__all__ = [
    "APPLY_LUA",
    "READ_LUA",
    "ApplyResult",
    "OnlineStore",
    "OnlineStoreUnavailable",
    "connect",
]
