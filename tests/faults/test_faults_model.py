"""The current model goes bad under a running worker: it keeps serving the good one and counts it."""

from __future__ import annotations

import shutil
import signal
import time
from typing import Any

import orjson
import pytest
from _stack import Feeder, Stack, fleet, promote_model

from leap_stream.store.files import write_atomic
from leap_stream.store.registry import MANIFEST, Registry, _manifest
from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.tools.harness import wait_for
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.fleet import simulate

pytestmark = pytest.mark.faults


def _serving(stack: Stack) -> set[str]:
    for _ in range(5):
        try:
            labels = stack.metric_labels("leap_model_info")
            return {lab["version"] for lab in labels if "version" in lab}
        except OSError:  # /metrics not up yet, or slow on the busy box
            time.sleep(0.5)
    return set()


def _rank_some(
    stack: Stack, feeder: Feeder, rankings: RankingsClient, subs: list[dict[str, Any]], tag: str
) -> list[dict[str, Any]]:
    """Send fresh copies of some submissions and wait for their rankings."""
    sent = []
    for i, s in enumerate(subs):
        s = dict(s, job_id=f"{s['job_id']}-{tag}-{i}", event_id=f"{s['event_id']}-{tag}-{i}")
        sent.append(s)
        feeder.send(stack.topics["sub"], s["job_id"], orjson.dumps(s))
    feeder.flush()
    want = {(s["job_id"], s["attempt"]) for s in sent}

    def ranked() -> bool:
        assert stack.alive(), stack.log_tail()
        rankings.poll(timeout=0.1, max_messages=5000)
        return want <= set(rankings.latest())

    wait_for(f"rankings of {tag}", ranked, 60, every=0.05)
    latest = rankings.latest()
    return [latest[k] for k in want]


def _publish_copy(reg: Registry, good: str, version: str, model_txt: bytes | None) -> str:
    """A copy of a good version under a new name, with model.txt replaced (manifest matching)."""
    src = reg.versions / good
    build = reg.root.parent / f"build-{version}"
    shutil.copytree(src, build)
    (build / MANIFEST).unlink()
    meta = orjson.loads((build / "metadata.json").read_bytes())
    meta["version"] = version
    (build / "metadata.json").write_bytes(orjson.dumps(meta))
    if model_txt is not None:
        (build / "model.txt").write_bytes(model_txt)
    return reg.publish(build)


def test_corrupt_or_truncated_model_keeps_the_old_one(stack: Stack) -> None:
    sim = simulate(SimConfig(seed=51, days=1, rate=3000))
    reg = Registry(stack.tmp / "registry")
    v1 = promote_model(reg.root, sim.dataset)
    fl = fleet(seed=52, rate=400)
    feeder = Feeder(stack.bootstrap)
    rankings = RankingsClient(KafkaClients(stack.bootstrap), stack.topics["rank"])
    stack.start()
    wait_for("the worker to serve v1", lambda: stack.alive() and _serving(stack) == {v1}, 60)
    got = _rank_some(stack, feeder, rankings, fl.subs[:50], "before")
    assert {r["model_version"] for r in got if r["source"] == "model"} == {v1}
    assert stack.metric("leap_model_load_failures") == 0

    cases = []
    # 1) truncated after it was published: the checksum no longer matches MANIFEST.json
    v2 = _publish_copy(reg, v1, "v2-truncated", None)
    model = reg.versions / v2 / "model.txt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    cases.append((v2, "truncated after publish"))
    # 2) garbage published with a matching manifest: LightGBM's parser refuses it
    v3 = _publish_copy(reg, v1, "v3-garbage", b"tree\nthis is not a model\n\x00\xff")
    cases.append((v3, "garbage with a valid checksum"))
    # 3) a model.txt cut mid-tree, republished consistently (a torn copy upstream)
    text = (reg.versions / v1 / "model.txt").read_bytes()
    v4 = _publish_copy(reg, v1, "v4-cut", text[: len(text) // 3])
    cases.append((v4, "cut mid-tree with a valid checksum"))

    failures = 0.0
    for version, what in cases:
        # the pointer is switched the way promote() does, minus its verify() (a bad disk,
        # a hand edit): the worker is the last line of defence
        write_atomic(reg.pointer, version.encode() + b"\n")
        wait_for(
            f"a load failure for {what}",
            lambda f=failures: stack.alive() and stack.metric("leap_model_load_failures") > f,
            30,
        )
        failures = stack.metric("leap_model_load_failures")
        assert _serving(stack) == {v1}, what
        got = _rank_some(stack, feeder, rankings, fl.subs[50:80], version)
        assert {r["model_version"] for r in got if r["source"] == "model"} == {v1}, what
        assert all(r["source"] == "model" for r in got), what

    assert failures >= len(cases)
    # a good model promoted properly is picked up again: the worker did not get stuck
    v5 = _publish_copy(reg, v1, "v5-good", None)
    assert _manifest(reg.versions / v5)
    reg.promote(v5)
    wait_for("the worker to serve v5", lambda: _serving(stack) == {v5}, 30)
    got = _rank_some(stack, feeder, rankings, fl.subs[80:100], "after")
    assert {r["model_version"] for r in got if r["source"] == "model"} == {v5}
    assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()
    rankings.close()
    print(
        f"\n--- model faults: {len(cases)} bad current models ({', '.join(w for _v, w in cases)}); "
        f"leap_model_load_failures_total {failures:.0f}; served {v1} throughout, then {v5}"
    )
