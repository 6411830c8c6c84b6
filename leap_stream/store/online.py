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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from operator import itemgetter
from typing import Any, TypeVar

import numpy as np
import orjson
import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from leap_stream.contracts.events import JobCompleted, JobSubmitted
from leap_stream.contracts.timestamps import epoch_s
from leap_stream.core.aggregates import AggregateTable
from leap_stream.core.history import (
    DEFAULT_RULES,
    HISTORY_EWMA_ALPHA,
    QUARANTINE_RULES,
    HistoryRules,
    LineageHistory,
    Measurement,
    event_time,
    is_measurement,
    job_key,
    log_per_device,
    measurement,
)
from leap_stream.core.rows import SUBMISSION_COLUMNS, submission_fields
from leap_stream.settings import Settings

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


# What the script did with one completion (its return codes, see APPLY_LUA)
_OUTCOMES = {
    1: "none",
    2: "accepted",
    3: "corroborated",
    4: "lineage",
    5: "aggregate",
    6: "devices",
    7: "physics",
    8: "mismatch",
    9: "no_submission",
    10: "repeat",
    11: "speed",
}
_AGGREGATE_HELD = 20  # added to an outcome when the aggregate speed bound held the aggregate


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """One completion's fate. ``outcome``: ``none`` (no measurement), ``accepted``,
    ``corroborated``, ``devices`` / ``lineage`` / ``aggregate`` / ``physics`` / ``speed``
    (quarantined by that rule), ``mismatch`` (its stored submission names another lineage or
    model type), ``no_submission`` (none stored and orphans are not allowed) or ``repeat``
    (another completion of the same job attempt was taken before: an attempt completes once);
    for a duplicate, what the first delivery got. ``aggregate_held``: the measurement entered
    the history but the aggregate speed bound held its model type's aggregate back."""

    event_id: str
    new: bool  # False: seen before (duplicate), nothing changed
    outcome: str = "none"
    aggregate_held: bool = False

    @property
    def measured(self) -> bool:
        """The history was updated by this delivery."""
        return self.new and self.outcome in ("accepted", "corroborated")

    @property
    def quarantine(self) -> str | None:
        """The rule that quarantined the measurement (this delivery or the first one)."""
        return self.outcome if self.outcome in QUARANTINE_RULES else None

    @property
    def applied(self) -> bool:
        """The completion was taken (now or before): not a mismatch, not waiting for its
        submission."""
        return self.outcome not in ("mismatch", "no_submission", "repeat")


def _result(event_id: str, code: int) -> ApplyResult:
    new = code < 100
    code = code if new else code - 100
    held = code > _AGGREGATE_HELD
    code = code - _AGGREGATE_HELD if held else code
    outcome = _OUTCOMES[code] if new else _OUTCOMES.get(code, "none")
    return ApplyResult(event_id, new, outcome, held)


def decode_measurement(v: Sequence[Any]) -> Measurement:
    """A stored lineage entry; the 4-value form is the single-measurement layout of 0.x."""
    if len(v) == 4:
        nd = int(v[1])
        x = log_per_device(float(v[0]), nd)
        return measurement(((float(v[2]), x),), nd, float(v[2]), int(v[3]), None)
    pending = (float(v[4]), float(v[5])) if v[3] == 1 else None
    recent = tuple((float(v[j]), float(v[j + 1])) for j in range(6, len(v) - 1, 2))
    return measurement(recent, int(v[0]), float(v[1]), int(v[2]), pending)


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


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


Hash = tuple[Sequence[Any], Sequence[Any]]  # (fields, values) of one HGETALL


def _from_flat(flat: Sequence[Any]) -> Hash:
    return flat[0::2], flat[1::2]


def _aggregate_table(
    hashes: Sequence[Hash], decoded: list[Any], model_types: Sequence[str], names: dict[Any, str]
) -> AggregateTable:
    """The model types' aggregate hashes (in ``model_types`` order) as one flat table."""
    hardware: dict[str, int] = {}
    owner: list[int] = []
    codes: list[int] = []
    for i, (fields, _vs) in enumerate(hashes):
        for f in fields:
            name = names.get(f)
            if name is None:
                name = names[f] = _text(f)
            code = hardware.get(name)
            if code is None:
                code = hardware[name] = len(hardware)
            codes.append(code)
        owner.extend([i] * len(fields))
    if len(decoded) != len(codes):
        raise ValueError(f"{len(decoded)} aggregate values for {len(codes)} fields")
    values = np.asarray(decoded, np.float64).reshape(len(codes), -1) if codes else np.empty((0, 3))
    if values.shape[1] != 3:  # [EWMA, count, last_at] (core.history.apply_aggregate)
        raise ValueError(f"aggregate values of {values.shape[1]} numbers, expected 3")
    return AggregateTable(model_types, list(hardware), np.asarray(owner), np.asarray(codes), values)


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


_SUB_FORMAT = 1  # first element of a stored submission: the column list it was written with
# 1-based positions (the Lua script's) of the fields a completion must agree with
_SUB_LINEAGE = SUBMISSION_COLUMNS.index("lineage_id") + 2
_SUB_MODEL_TYPE = SUBMISSION_COLUMNS.index("model_type") + 2
_SUB_DEVICES = SUBMISSION_COLUMNS.index("num_devices") + 2
_SUB_CANDIDATES = SUBMISSION_COLUMNS.index("candidate_hardware") + 2  # '|'-joined


_SUBMISSION_VALUES = itemgetter(*SUBMISSION_COLUMNS)  # one C call for the 25 values


def encode_submission(fields: Mapping[str, Any]) -> bytes:
    """Values only, in `SUBMISSION_COLUMNS` order: half the memory of a JSON object."""
    return orjson.dumps([_SUB_FORMAT, *_SUBMISSION_VALUES(fields)])


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


Prediction = tuple[str, int, str, bytes]  # (job_id, attempt, model_type, encode_predictions(...))
Client = redis.Redis | RedisCluster
ANCHORS = ("self", "transfer", "model")


def encode_predictions(
    hardware: Sequence[str],
    predicted: Sequence[float],
    num_devices: int,
    history: Collection[str],
) -> bytes:
    """A ranking's predictions, for the online accuracy when the completion comes: the
    candidates' types and whole-job samples/s (one list each, no object per candidate: this
    runs for every ranked job), the job's device count, and the anchor kind, from the types the
    lineage has a prior on (``history``): `self` there, else `transfer` when it has any prior,
    else `model`."""
    own = sorted(set(history).intersection(hardware))
    other = "transfer" if history else "model"
    return orjson.dumps(
        {"hw": hardware, "p": predicted, "nd": num_devices, "self": own, "else": other}
    )


def decode_predictions(raw: bytes | str) -> dict[str, tuple[float, str]]:
    """hw -> (per-device prediction, anchor); empty when unreadable (the metric skips it).
    Reads the list of ``[hw, per-device samples/s, anchor]`` that 0.x stored too."""
    try:
        value = orjson.loads(raw)
        if isinstance(value, list):
            return {str(hw): (float(v), str(a)) for hw, v, a in value}
        nd, own, other = float(value["nd"]), set(value["self"]), str(value["else"])
        return {
            str(hw): (float(p) / nd, "self" if hw in own else other)
            for hw, p in zip(value["hw"], value["p"], strict=True)
        }
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, ZeroDivisionError):
        return {}


def connect(
    url: str,
    *,
    password: str = "",
    timeout_s: float = 1.0,
    retries: int = 2,
    cluster: bool = False,
) -> Client:
    """A client with short timeouts and a few quick retries: a dead Redis must fail fast.

    ``rediss://`` URLs use TLS (redis-py verifies the server certificate by default); a
    password in the URL wins over ``password``. ``cluster``: ``url`` is one node of a Redis
    Cluster, the client discovers the others.
    """
    kwargs: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(ExponentialBackoff(cap=0.25, base=0.01), retries),
        "health_check_interval": 30,
    }
    if password and "@" not in url.split("//", 1)[-1]:
        kwargs["password"] = password
    if cluster:
        return RedisCluster.from_url(url, **kwargs)
    return redis.Redis.from_url(
        url, retry_on_error=[redis.ConnectionError, redis.TimeoutError], **kwargs
    )


def connect_with(cfg: Settings, url: str | None = None) -> Client:
    """`connect` with the configured URL (or ``url``), password, timeout, retries, and
    whether it is a cluster."""
    return connect(
        url or cfg.require_redis(),
        password=cfg.redis_password,
        timeout_s=cfg.redis_timeout_s,
        retries=cfg.redis_retries,
        cluster=cfg.redis_cluster,
    )


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

    def done(self, job_id: str, attempt: int, model_type: str) -> str:
        """The marker of a job attempt whose completion was taken: an attempt completes once."""
        return f"{self._head(model_type)}done:{job_id}:{attempt}"

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


class _NodePipelines:
    """A pipeline over a cluster: redis-py's cluster pipeline refuses EVALSHA, so the commands
    are grouped by the node owning their slot and sent as one plain pipeline per node. Replies
    come back in call order; a command that failed (MOVED after a resharding, NOSCRIPT after a
    node restart) is in the replies as its exception, like `pipeline.execute(raise_on_error=
    False)`."""

    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster
        self.calls: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = []

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> None:
        self.calls.append((str(keys_and_args[0]), "evalsha", (sha, numkeys, *keys_and_args), {}))

    def mget(self, names: Sequence[str]) -> None:
        self.calls.append((names[0], "mget", (list(names),), {}))

    def set(self, name: str, value: Any, ex: int | None = None) -> None:
        self.calls.append((name, "set", (name, value), {"ex": ex}))

    def execute(self, scripts: Sequence[str] = ()) -> list[Any]:
        """Send every call; rerun the calls that did not run: after MOVED / ASK (slots moved:
        the slot map is read again) and NOSCRIPT (``scripts`` are loaded on that node). A slot
        that moved to a node that never ran the script needs both, hence up to `_SENDS` sends.
        Calls that ran are never repeated: other nodes' scripts already applied."""
        replies: list[Any] = [None] * len(self.calls)
        todo = list(range(len(self.calls)))
        for attempt in range(_SENDS):
            retry: list[int] = []
            for node, idx in self._by_node(todo).values():
                pipe = self.cluster.get_redis_connection(node).pipeline(transaction=False)
                for i in idx:
                    _key, name, args, kwargs = self.calls[i]
                    getattr(pipe, name)(*args, **kwargs)
                got = pipe.execute(raise_on_error=False)
                if any(isinstance(x, redis.exceptions.NoScriptError) for x in got):
                    for script in scripts:
                        self.cluster.get_redis_connection(node).script_load(script)
                for i, reply in zip(idx, got, strict=True):
                    replies[i] = reply
                    if isinstance(reply, _NOT_RUN):
                        retry.append(i)
            if not retry or attempt == _SENDS - 1:
                break
            if any(isinstance(replies[i], _MOVED) for i in retry):
                self.cluster.nodes_manager.initialize()
            todo = retry
        return replies

    def _by_node(self, idx: Sequence[int]) -> dict[str, tuple[Any, list[int]]]:
        out: dict[str, tuple[Any, list[int]]] = {}
        for i in idx:
            slot = self.cluster.keyslot(self.calls[i][0])
            node = self.cluster.nodes_manager.get_node_from_slot(slot)  # type: ignore[arg-type]
            out.setdefault(node.name, (node, []))[1].append(i)
        return out


_SENDS = 3  # a first send, a rerun after MOVED, one after NOSCRIPT on the new owner
_MOVED = (redis.exceptions.MovedError, redis.exceptions.AskError)
_NOT_RUN = (redis.exceptions.NoScriptError, *_MOVED)


@dataclass
class _ReadCall:
    """One read script call: the hashes it reads (and where each goes in the batch's reply),
    then the keys it sets with their values."""

    reads: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)

    def read(self, key: str, position: int) -> None:
        self.reads.append(key)
        self.positions.append(position)

    def write(self, key: str, value: bytes) -> None:
        self.writes.append(key)
        self.values.append(value)


@dataclass(frozen=True)
class _MGets:
    """An MGET per key group (one on a single Redis; a cluster's MGET must stay in one slot),
    replies put back in the order of ``names``."""

    calls: list[list[str]]
    positions: list[list[int]]
    n: int

    @classmethod
    def of(cls, names: Sequence[str], groups: Sequence[str]) -> _MGets:
        by: dict[str, list[int]] = {}
        for i, g in enumerate(groups):
            by.setdefault(g, []).append(i)
        positions = list(by.values())
        return cls([[names[i] for i in idx] for idx in positions], positions, len(names))

    def queue(self, pipe: Any) -> None:
        for names in self.calls:
            pipe.mget(names)

    def collect(self, replies: Sequence[Any]) -> list[Any]:
        out: list[Any] = [None] * self.n
        for idx, got in zip(self.positions, replies, strict=True):
            for i, v in zip(idx, got, strict=True):
                out[i] = v
        return out


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
                    self.keys.done(c["job_id"], int(c["attempt"]), mt),
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
                    args += ["1", c["hardware_type"], nd, repr(at), repr(x), *ids]
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


__all__ = [
    "APPLY_LUA",
    "READ_LUA",
    "ApplyResult",
    "OnlineStore",
    "OnlineStoreUnavailable",
    "connect",
    "decode_measurement",
    "decode_predictions",
    "encode_predictions",
    "eviction_problem",
]
