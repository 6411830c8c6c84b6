"""Bad input against the running worker: every message has exactly one outcome, none crash it.

Hand-made cases (not JSON, invalid UTF-8, deep nesting, huge numbers, NaN/Infinity, bad
throughput, unknown hardware, missing and mistyped fields, 10 MB, duplicates, completions before
their submission) and hypothesis-generated ones (random bytes, valid events with a field
replaced by a random JSON value or removed). Every message sent must end as a dead letter with
its source offset, or as a ranking / dataset row where the contract says it is valid; the worker
stays up; `leap_dead_letter_total` equals the number of dead letters.
"""

from __future__ import annotations

import copy
import glob
import json
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from _stack import Feeder, Stack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leap_stream.store.offline import read_dataset
from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients
from leap_stream.tools.harness import wait_for
from leap_stream.tools.observe import dead_letters

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
TEN_MB = 10 * 1024 * 1024


def _example(kind: str, name: str) -> dict[str, Any]:
    path = sorted(glob.glob(str(ROOT / "schemas" / "examples" / kind / "valid" / f"{name}*")))[0]
    return dict(orjson.loads(Path(path).read_bytes()))


SUB = _example("job-submitted", "llama-70b")
COMP = _example("job-completed", "llama-70b")


def _sub(i: str, **over: Any) -> dict[str, Any]:
    s = copy.deepcopy(SUB)
    s.update(event_id=f"sub-bad-{i}", job_id=f"job-bad-{i}")
    s.update(over)
    return s


def _comp(i: str, **over: Any) -> dict[str, Any]:
    c = copy.deepcopy(COMP)
    c.update(event_id=f"cmp-bad-{i}", job_id=f"job-bad-{i}")
    c.update(over)
    return c


def _with_tp(i: str, value: float) -> dict[str, Any]:
    c = _comp(i)
    c["throughput"] = dict(c.get("throughput") or {}, samples_per_s=value)
    return c


def hand_made() -> list[tuple[str, str, bytes | None, str]]:
    """(name, topic kind "sub"/"comp", payload, expected dead-letter kind)."""
    valid = orjson.dumps(_sub("x"))
    deep_model = _sub("deep")
    node: dict[str, Any] = deep_model["model"]
    for _ in range(100):
        node["x"] = {}
        node = node["x"]
    return [
        ("not json", "sub", b"{not json", "not_json"),
        ("empty", "sub", b"", "not_json"),
        ("null value", "comp", None, "not_json"),
        ("invalid utf-8", "sub", b'{"event_id": "\xff\xfe"}', "not_utf8"),
        (
            "invalid utf-8 in a valid event",
            "comp",
            orjson.dumps(_comp("u"))[:-1] + b',"x":"\xc3"}',
            "not_utf8",
        ),
        ("deep arrays", "sub", b"[" * 5000 + b"]" * 5000, "not_json"),
        ("deep objects", "sub", orjson.dumps(deep_model), "not_json"),
        ("huge float", "sub", valid.replace(b'"layers":80', b'"layers":1e400'), "not_json"),
        (
            "huge integer",
            "sub",
            valid.replace(b'"layers":80', b'"layers":' + b"9" * 40),
            "not_json",
        ),
        (
            "NaN",
            "comp",
            orjson.dumps(_comp("nan")).replace(b'"steps":', b'"steps":NaN,"y":'),
            "not_json",
        ),
        ("Infinity", "sub", valid.replace(b'"layers":80', b'"layers":Infinity'), "not_json"),
        ("-Infinity", "comp", b'{"samples_per_s": -Infinity}', "not_json"),
        ("negative throughput", "comp", orjson.dumps(_with_tp("neg", -5.0)), "schema"),
        ("zero throughput", "comp", orjson.dumps(_with_tp("zero", 0.0)), "schema"),
        (
            # completions are checked against their submission's candidates, not the catalog
            # (a retired type keeps its history): this one has no submission at all
            "unknown hardware (completion)",
            "comp",
            orjson.dumps(_comp("hw", hardware_type="quantum-9000")),
            "orphan_completion",
        ),
        (
            "no known candidate",
            "sub",
            orjson.dumps(
                _sub("hw", candidate_hardware=["quantum-9000"], default_hardware="quantum-9000")
            ),
            "unknown_hardware",
        ),
        (
            "missing field",
            "sub",
            orjson.dumps({k: v for k, v in _sub("m").items() if k != "training"}),
            "schema",
        ),
        (
            "missing nested field",
            "comp",
            orjson.dumps({k: v for k, v in _comp("m").items() if k != "ended_at"}),
            "schema",
        ),
        ("mistyped field", "sub", orjson.dumps(_sub("t", attempt="one")), "schema"),
        (
            "mistyped nested",
            "sub",
            orjson.dumps(_sub("t2", training={**SUB["training"], "num_devices": "64"})),
            "schema",
        ),
        ("top-level array", "comp", b"[1, 2, 3]", "not_object"),
        ("top-level string", "sub", b'"hello"', "not_object"),
        ("10 MB", "sub", b'{"pad": "' + b"x" * TEN_MB + b'"}', "too_large"),
        (
            "inconsistent parallelism",
            "sub",
            orjson.dumps(_sub("p", training={**SUB["training"], "data_parallel": 3})),
            "semantic",
        ),
    ]


def test_bad_input_lands_in_the_dlq_and_the_worker_survives(stack: Stack) -> None:
    t = stack.topics
    stack.extra_env["LEAP_ORPHAN_GRACE_S"] = "4"
    feeder = Feeder(stack.bootstrap, **{"message.max.bytes": 20 * 1024 * 1024})
    rankings = RankingsClient(KafkaClients(stack.bootstrap), t["rank"], keep_all=True)
    stack.start()
    topic = {"sub": t["sub"], "comp": t["comp"]}

    expected: dict[Any, str] = {}
    for name, where, payload, kind in hand_made():
        feeder.send(topic[where], None, payload, tag=name)
        expected[name] = kind

    # a duplicate submission event_id: ranked (twice, same ranking event_id); consumers keep one
    dup_sub = _sub("dup")
    # a duplicate completion event_id: history and dataset take it once
    dup_comp = _comp("dup")
    # an unknown candidate among known ones: ranked over the known ones, the unknown excluded
    partial = _sub("partial", candidate_hardware=[*SUB["candidate_hardware"], "quantum-9000"])
    feeder.send(t["sub"], partial["job_id"], orjson.dumps(partial))
    # a completion before its submission: it waits for the join, then gets its dataset row
    early = _comp("early")
    early_sub = _sub("early")
    # a completion whose submission never comes: history updated, orphan dead letter
    never = _comp("never")
    expected["orphan"] = "orphan_completion"
    feeder.send(t["comp"], early["job_id"], orjson.dumps(early))
    feeder.send(t["comp"], never["job_id"], orjson.dumps(never), tag="orphan")
    feeder.send(t["sub"], dup_sub["job_id"], orjson.dumps(dup_sub))
    feeder.send(t["sub"], dup_sub["job_id"], orjson.dumps(dup_sub))
    feeder.flush()
    time.sleep(1.0)
    feeder.send(t["sub"], early_sub["job_id"], orjson.dumps(early_sub))
    feeder.send(t["comp"], dup_comp["job_id"], orjson.dumps(dup_comp))
    feeder.send(t["comp"], dup_comp["job_id"], orjson.dumps(dup_comp))
    feeder.flush()

    # generated: every message gets exactly one outcome
    valid_subs: dict[str, Any] = {}
    counter = [0]
    json_values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=10,
    )
    paths = [("model",), ("training",), ("candidate_hardware",), ("attempt",), ("submitted_at",)]
    paths += [("model", k) for k in SUB["model"]] + [("training", k) for k in SUB["training"]]
    small_ints = [
        ("attempt",),
        ("model", "layers"),
        ("model", "hidden_size"),
        ("model", "sequence_length"),
    ]

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.one_of(
            st.binary(max_size=300).map(lambda b: ("bytes", b, None)),
            st.tuples(st.sampled_from(paths), json_values).map(
                lambda pv: ("replace", pv[0], pv[1])
            ),
            st.sampled_from(paths).map(lambda p: ("delete", p, None)),
            # plausible edits that stay valid: those must come out as rankings
            st.tuples(st.sampled_from(small_ints), st.integers(1, 4096)).map(
                lambda pv: ("replace", pv[0], pv[1])
            ),
        )
    )
    def send_generated(case: tuple[str, Any, Any]) -> None:
        counter[0] += 1
        n = counter[0]
        how, a, b = case
        if how == "bytes":
            payload = a
        else:
            s = _sub(f"gen-{n}")
            node = s
            for k in a[:-1]:
                node = node[k]
            if how == "replace":
                node[a[-1]] = b
            else:
                node.pop(a[-1], None)
            payload = json.dumps(s).encode()  # stdlib: integers beyond 64 bits too
            valid_subs[s["event_id"]] = (s["job_id"], s.get("attempt"))
        feeder.send(t["sub"], None, payload, tag=("gen", n))

    send_generated()
    feeder.flush()
    # a valid submission after all of it: still ranked
    last = _sub("last")
    feeder.send(t["sub"], last["job_id"], orjson.dumps(last))
    feeder.flush()

    want = {(dup_sub["job_id"], 1), (early_sub["job_id"], 1), (last["job_id"], 1)}
    want.add((partial["job_id"], 1))

    def done() -> bool:
        assert stack.alive(), stack.log_tail()
        rankings.poll(timeout=0.2, max_messages=5000)
        return want <= set(rankings.latest())

    wait_for("the valid submissions ranked", done, 90)
    time.sleep(6)  # the orphan's grace (4 s) and the dataset flush (1 s)
    assert stack.alive(), stack.log_tail()

    dead = dead_letters(stack.bootstrap, t["dlq"])
    placed = feeder.placed
    kinds: dict[str, int] = {}
    for name, kind in expected.items():
        src = placed[name]
        assert src in dead, f"{name}: no dead letter"
        assert dead[src]["error"]["kind"] == kind, (name, dead[src]["error"])
        kinds[kind] = kinds.get(kind, 0) + 1
    latest = rankings.latest()
    ranked_events = {r["submission_event_id"] for r in latest.values()}
    generated = [k for k in placed if isinstance(k, tuple)]
    gen_dead = gen_ranked = 0
    for tag in generated:
        src = placed[tag]
        if src in dead:
            gen_dead += 1
            continue
        # not dead: it must have been a valid event and ranked
        n = tag[1]
        eid = f"sub-bad-gen-{n}"
        assert eid in ranked_events, f"generated message {n} has no outcome"
        gen_ranked += 1
    assert gen_dead + gen_ranked == len(generated) == counter[0]
    assert gen_ranked > 0 and gen_dead > 0  # both outcomes were exercised

    r_partial = latest[(partial["job_id"], 1)]
    considered = {c["hardware_type"] for c in r_partial["candidates"]} | {
        e["hardware_type"] for e in r_partial["excluded"] if e["reason"] != "unknown_hardware"
    }
    assert considered == set(SUB["candidate_hardware"])  # (no model here: no_prediction)
    assert {"hardware_type": "quantum-9000", "reason": "unknown_hardware"} in r_partial["excluded"]
    # the duplicates and the early completion
    dups = [r for r in (rankings.all or []) if r["job_id"] == dup_sub["job_id"]]
    assert len(dups) == 2 and dups[0]["event_id"] == dups[1]["event_id"]
    frame = read_dataset(stack.tmp / "dataset")
    ids = frame["event_id"].tolist()
    assert ids.count(dup_comp["event_id"]) == 1
    assert early["event_id"] in ids  # joined once its submission arrived
    assert never["event_id"] not in ids
    dup_metric = stack.metric("leap_completions_duplicate")
    assert dup_metric == 1

    # the worker counted every dead letter it produced
    counted = stack.metric("leap_dead_letter")
    assert counted == len(dead)
    assert stack.stop(signal.SIGTERM) == 0, stack.log_tail()
    rankings.close()
    print(
        f"\n--- bad input: {len(expected)} hand-made ({kinds}), {len(generated)} generated "
        f"({gen_dead} dead-lettered, {gen_ranked} valid and ranked); "
        f"leap_dead_letter_total {counted:.0f} == {len(dead)} dead letters; worker alive"
    )
