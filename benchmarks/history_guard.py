"""What the history rules hold back of honest telemetry: the simulator's completions over many
days replayed through `core.history` (the rules the online store runs), counted by verdict.

    .venv/bin/python benchmarks/history_guard.py --seed 0 --days 44 [--rate 30000] [--json]

Every simulated completion is honest, so every quarantine is a false alarm; those a later
measurement corroborated were let in after all. Prints the verdicts, the measurements still
held back (quarantined and never corroborated by the end: the value an honest run lost), the
aggregate updates the aggregate speed bound held, and both as shares of the measurements. The
target (issue #39): held back ≤ 0.1 %.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from typing import Any

import numpy as np

from leap_stream.core.history import QUARANTINE_RULES, HistoryBook, HistoryRules
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.fleet import simulate
from leap_stream.train import pit


def measure(seed: int, days: int, rate: int, rules: HistoryRules | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    sim = simulate(SimConfig(seed=seed, days=days, rate=rate))
    rows = pit.measured(sim.dataset)
    t1 = time.perf_counter()
    book = HistoryBook(rules or HistoryRules())
    snap = pit.replay(rows, rows.iloc[:0], book, finish=True)
    verdicts = Counter(v for v in snap.verdicts.tolist() if v != "none")
    quarantined = np.isin(snap.verdicts, QUARANTINE_RULES)
    # a quarantined value stays out unless the next one corroborated it (then both count)
    held = int(quarantined.sum()) - verdicts["corroborated"]
    n = int(sum(verdicts.values()))
    return {
        "seed": seed,
        "days": days,
        "rate": rate,
        "measurements": n,
        "verdicts": dict(sorted(verdicts.items())),
        "held_back": held,
        "held_back_share": held / max(n, 1),
        "aggregate_held": book.aggregate_held,
        "aggregate_held_share": book.aggregate_held / max(n, 1),
        "simulate_s": round(t1 - t0, 1),
        "replay_s": round(time.perf_counter() - t1, 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--days", type=int, default=44)
    ap.add_argument("--rate", type=int, default=SimConfig.rate)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    got = measure(args.seed, args.days, args.rate)
    if args.json:
        print(json.dumps(got))
        return
    for key, value in got.items():
        print(f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
