"""A real local Redis Cluster (three masters, `LocalRedisCluster`): the ground the online store
will stand on for issue #14. It checks the tooling and pins the rule the store's keys must
follow: a script may touch keys of one hash slot only, so a completion's keys share a hash tag."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from leap_stream.core.history import HistoryBook
from leap_stream.tools.dev.redis_cluster import MASTERS, LocalRedisCluster

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    c = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_three_masters_share_the_slots(cluster: LocalRedisCluster) -> None:
    client = RedisCluster.from_url(cluster.url)
    try:
        masters = [n for n in client.get_nodes() if n.server_type == "primary"]
        assert len(masters) == MASTERS
        info = client.cluster_info(target_nodes=RedisCluster.RANDOM)
        assert info["cluster_state"] == "ok" and int(info["cluster_slots_assigned"]) == 16384
        keys = [f"k{i}" for i in range(200)]
        for k in keys:
            client.set(k, k)
        assert [client.get(k) for k in keys] == [k.encode() for k in keys]
        owners = {client.get_node_from_key(k).name for k in keys}
        assert len(owners) == MASTERS  # the keys really are spread over the masters
    finally:
        client.close()


def test_a_script_touches_one_slot_only(cluster: LocalRedisCluster) -> None:
    client = RedisCluster.from_url(cluster.url)
    script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('SET', KEYS[2], ARGV[1])"
    try:
        # one hash tag ({llama-7b}): one slot, one node, the script runs
        assert client.eval(script, 2, "leap:{llama-7b}:lin:a", "leap:{llama-7b}:agg", "1")
        # redis-py refuses it before sending (the server would answer CROSSSLOT)
        refused = (redis.RedisError, redis.exceptions.RedisClusterException)
        with pytest.raises(refused, match=r"(?i)slot"):
            client.eval(script, 2, "leap:lin:a", "leap:agg:llama-7b", "1")
    finally:
        client.close()


def test_a_master_killed_is_noticed(tmp_path: Path) -> None:
    c = LocalRedisCluster(tmp_path / "c")
    try:
        c.start()
        c.kill(0)
        client = redis.Redis(port=c.ports[0], socket_connect_timeout=1)
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        c.stop()


def test_the_store_follows_a_slot_moved_under_it(cluster: LocalRedisCluster) -> None:
    """Resharding while a worker runs: the store's client still routes a model type's slot to
    its old master, which answers MOVED; the calls are rerun on the new owner once the slot map
    is read again, and nothing is applied twice."""
    from redis.crc import key_slot

    from leap_stream.store.connection import connect
    from leap_stream.store.online import OnlineStore
    from leap_stream.tools import synthetic_events as synthetic

    store = OnlineStore(connect(cluster.url, timeout_s=10, cluster=True), "moved:")
    admin = RedisCluster.from_url(cluster.url)
    try:
        comps = [c for _s, c in synthetic.pairs(40, seed=17)]
        mt = comps[0]["model_type"]
        mine = [c for c in comps if c["model_type"] == mt]
        assert store.apply_completions(mine[:1])[0].new  # the client has learnt the slot map
        slot = key_slot(store.keys.agg(mt).encode())
        source = admin.nodes_manager.get_node_from_slot(slot)
        target = next(n for n in admin.get_primaries() if n.name != source.name)
        src, dst = admin.get_redis_connection(source), admin.get_redis_connection(target)
        src_id, dst_id = src.cluster("MYID"), dst.cluster("MYID")
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
        assert keys  # the first completion's keys move with the slot
        src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
        for node in admin.get_primaries():
            admin.get_redis_connection(node).execute_command(
                "CLUSTER SETSLOT", slot, "NODE", dst_id
            )
        # the store's client still believes the old master owns the slot
        assert store.r.nodes_manager.get_node_from_slot(slot).name == source.name
        results = store.apply_completions(mine)
        assert [r.new for r in results] == [False] + [True] * (len(mine) - 1)
        assert store.r.nodes_manager.get_node_from_slot(slot).name == target.name
        lineages = sorted({c["lineage_id"] for c in mine})
        book = HistoryBook()
        for c in mine:
            book.apply_completion(c)
        hist, aggs = store.read_batch(lineages, [mt], [mt] * len(lineages))
        assert hist == [book.lineage(x) for x in lineages]
        assert aggs == {mt: book.aggregates(mt)}
    finally:
        admin.close()
        store.r.close()
