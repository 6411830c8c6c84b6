"""The demo's simulated fleet: its history and streamed day, the lookup table's predictions,
the poison it injects, and streaming the day through Kafka at the demo's pace."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import pandas as pd

from leap_stream.stream.kafka import KafkaClients, produce_waiting
from leap_stream.tools.demo.options import KEY, DemoOptions
from leap_stream.tools.observe import RankingCollector


# ------------------------------------------------------------------ the simulated fleet
@dataclass
class Fleet:
    history: pd.DataFrame  # dataset rows known before the streamed day (ended before it)
    pending: pd.DataFrame  # earlier submissions whose completion arrives during the day
    stream_subs: pd.DataFrame
    stream_comps: pd.DataFrame  # completions that end during the streamed day
    morning: pd.DataFrame  # submissions of the next morning
    eval_comps: pd.DataFrame  # every completion of the streamed day's submissions
    eval_truth: pd.DataFrame
    result: Any  # SimResult
    day_start: pd.Timestamp
    summary: dict[str, Any] = field(default_factory=dict)


def simulate_fleet(opts: DemoOptions) -> Fleet:
    from leap_stream.tools.sim.config import SimConfig
    from leap_stream.tools.sim.fleet import simulate

    cfg = SimConfig(seed=opts.seed, days=opts.days_history + 2, rate=opts.per_day)
    res = simulate(cfg)
    start = pd.Timestamp(datetime(cfg.start.year, cfg.start.month, cfg.start.day, tzinfo=UTC))
    t0 = start + pd.Timedelta(days=opts.days_history)
    t1 = t0 + pd.Timedelta(days=1)
    subs, comps, ds = res.submissions, res.completions, res.dataset
    sub_at = pd.to_datetime(subs["submitted_at"], utc=True)
    ended = pd.to_datetime(comps["ended_at"], utc=True)
    ds_ended = pd.to_datetime(ds["ended_at"], utc=True)
    stream_subs = subs[((sub_at >= t0) & (sub_at < t1)).to_numpy()].reset_index(drop=True)
    stream_comps = comps[((ended >= t0) & (ended < t1)).to_numpy()].reset_index(drop=True)
    keys = pd.MultiIndex.from_frame(stream_comps[KEY])
    early = subs[(sub_at < t0).to_numpy()]
    pending = early[pd.MultiIndex.from_frame(early[KEY]).isin(keys)].reset_index(drop=True)
    morning = subs[(sub_at >= t1).to_numpy()].head(opts.morning).reset_index(drop=True)
    day_keys = pd.MultiIndex.from_frame(stream_subs[KEY])
    eval_comps = comps[pd.MultiIndex.from_frame(comps[KEY]).isin(day_keys)].reset_index(drop=True)
    truth = res.truth
    eval_truth = truth[pd.MultiIndex.from_frame(truth[KEY]).isin(day_keys)].reset_index(drop=True)
    summary = res.summary()
    return Fleet(
        history=ds[(ds_ended < t0).to_numpy()].reset_index(drop=True),
        pending=pending,
        stream_subs=stream_subs,
        stream_comps=stream_comps,
        morning=morning,
        eval_comps=eval_comps,
        eval_truth=eval_truth,
        result=res,
        day_start=t0,
        summary={k: summary[k] for k in ("seed", "days", "start", "submissions", "lineages")},
    )


def lookup_predictions(
    history: pd.DataFrame, subs: pd.DataFrame, truth: pd.DataFrame
) -> pd.DataFrame:
    """The lookup baseline on every candidate of the streamed day, fitted on the same history
    the first model saw (the table the worker falls back to)."""
    from leap_stream.core.lookup import LookupTable

    table = LookupTable.fit(history)
    pairs = truth[[*KEY, "hardware_type"]].merge(
        subs[[*KEY, "model_type", "family", "num_devices"]], on=KEY
    )
    pred, _level = table.predict(
        pairs["model_type"], pairs["family"], pairs["hardware_type"], pairs["num_devices"]
    )
    return pairs[[*KEY, "hardware_type"]].assign(lookup=pred)


# ------------------------------------------------------------------ Kafka helpers
def _producer(bootstrap: str) -> Any:
    kafka = KafkaClients(bootstrap)
    return kafka.producer({"linger.ms": 2, "compression.type": "lz4", "enable.idempotence": True})


def poison_events(stream_comps: pd.DataFrame) -> list[tuple[str, str, bytes]]:
    """(topic kind, key, value): one undecodable, one against the schema, and a completion on a
    type its submission did not list (a completion_mismatch)."""
    from leap_stream.tools.sim.events import completion_lines

    out: list[tuple[str, str, bytes]] = [
        ("submission", "poison-not-json", b'{"job_id": "poison-1", '),
        ("submission", "poison-schema", orjson.dumps({"schema_version": 1, "job_id": "p-2"})),
    ]
    if len(stream_comps):
        ev = orjson.loads(completion_lines(stream_comps.head(1))[0])
        ev["event_id"] = "poison-hardware-not-a-candidate"
        ev["hardware_type"] = "tpu-v9-imaginary"
        out.append(("completion", str(ev["job_id"]), orjson.dumps(ev)))
    return out


def stream_events(
    bootstrap: str,
    topics: dict[str, str],
    events: Iterator[tuple[str, str, bytes]],
    total: int,
    rate: float,
    collector: RankingCollector,
    progress: bool,
    poison: list[tuple[str, str, bytes]] | None = None,
    desc: str = "streaming",
    gate: dict[tuple[str, int], str] | None = None,
    hold_timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Produce in time order at `rate` events/s; returns counts and submission send times.

    A job only runs once the scheduler has its ranking, so the completion of a submission in
    `gate` ((job_id, attempt) -> submission event_id) is held back until that ranking has
    arrived. Replayed faster than real time, a completion could otherwise reach the history
    before its own submission is ranked, and the ranking would "predict" its own measurement.
    """
    from tqdm import tqdm

    producer = _producer(bootstrap)
    sent_at: dict[str, float] = {}
    counts = {"submission": 0, "completion": 0, "poison": 0, "held": 0, "held_timeout": 0}
    poison = list(poison or [])
    poison_at = total // 3
    held: list[tuple[str, str, bytes, str]] = []
    bar = tqdm(
        total=total, desc=desc, unit="ev", file=sys.stderr, disable=not progress, mininterval=0.5
    )

    def send(kind: str, key: str, value: bytes) -> None:
        produce_waiting(producer, topics[kind], key, value)
        counts[kind] += 1
        bar.update(1)

    def release() -> None:
        nonlocal held
        if held:
            ready = collector.arrived_many([h[3] for h in held])
            for (kind, key, value, _eid), ok in zip(held, ready, strict=True):
                if ok:
                    send(kind, key, value)
            held = [h for h, ok in zip(held, ready, strict=True) if not ok]

    start = time.perf_counter()
    last_post = last_release = 0.0
    for i, (kind, key, value) in enumerate(events):
        if rate > 0:
            ahead = i / rate - (time.perf_counter() - start)
            if ahead > 0.002:
                time.sleep(ahead)
        if kind == "submission":
            sent_at[str(orjson.loads(value)["event_id"])] = time.time()
            send(kind, key, value)
        else:
            eid = None
            if gate:
                ev = orjson.loads(value)
                eid = gate.get((str(ev["job_id"]), int(ev["attempt"])))
            if eid is not None and not collector.arrived_many([eid])[0]:
                held.append((kind, key, value, eid))
                counts["held"] += 1
            else:
                send(kind, key, value)
        if poison and i >= poison_at:
            for pk, pkey, pval in poison:
                produce_waiting(producer, topics[pk], pkey, pval)
                counts["poison"] += 1
            poison = []
        now = time.perf_counter()
        if now - last_release > 0.02:
            release()
            last_release = now
        if progress and now - last_post > 0.5:
            bar.set_postfix(rankings=collector.count(), held=len(held), refresh=False)
            last_post = now
    deadline = time.monotonic() + hold_timeout_s
    while held and time.monotonic() < deadline:
        release()
        time.sleep(0.02)
    for kind, key, value, _eid in held:  # rankings that never came: the jobs run anyway
        send(kind, key, value)
        counts["held_timeout"] += 1
    remaining = producer.flush(60)
    elapsed = time.perf_counter() - start
    bar.set_postfix(rankings=collector.count(), held=0)
    bar.close()
    if remaining:
        raise RuntimeError(f"{remaining} events not delivered after 60 s")
    n = counts["submission"] + counts["completion"]
    return {
        "submissions": counts["submission"],
        "completions": counts["completion"],
        "poison": counts["poison"],
        "completions_held_for_ranking": counts["held"],
        "held_timeout": counts["held_timeout"],
        "seconds": round(elapsed, 2),
        "events_per_s": round(n / elapsed, 1) if elapsed > 0 else None,
        "sent_at": sent_at,
    }
