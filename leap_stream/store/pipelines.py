"""A batch's commands to Redis: one pipeline per node on a cluster (redis-py's cluster pipeline
refuses EVALSHA), MGETs grouped by slot, the read script's calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster


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
