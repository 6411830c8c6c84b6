"""How long `leap-stream evaluate` takes on a fleet-sized table with repeated measurements.

A synthetic table in the documented shape: WORKLOADS workloads × 5 single-GPU types × BATCHES
batch sizes, each measured REPEATS times with ~3 % noise (a fleet team's own table: many
workloads, few types, every configuration run more than once). Prints the rows, the repeats
folded, the pairs and the wall time of the whole command, one JSON line last.

    python benchmarks/evaluate_speed.py [--workloads 88] [--batches 11] [--repeats 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

TYPES = {"T4": 1.0, "V100-PCIe-32GB": 1.9, "A100-PCIe-40GB": 3.6, "L4": 1.4, "A40": 2.6}


def table(workloads: int, batches: int, repeats: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for w in range(workloads):
        base = rng.lognormal(3.0, 1.0)
        tilt = rng.normal(0.0, 0.25, len(TYPES))  # each workload moves between types its own way
        for b in range(batches):
            batch = 2 ** (b + 2)
            for (name, speed), t in zip(TYPES.items(), tilt, strict=True):
                mean = base * speed * np.exp(t) * batch**0.1
                for _ in range(repeats):
                    rows.append((f"w{w}", name, 1, batch, mean * rng.lognormal(0.0, 0.03)))
    return pd.DataFrame(
        rows,
        columns=["workload", "accelerator_type", "accelerator_count", "batch_size", "throughput"],
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", type=int, default=88)
    ap.add_argument("--batches", type=int, default=11)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    frame = table(args.workloads, args.batches, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.csv"
        frame.to_csv(path, index=False)
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "leap_stream", "evaluate", "--table", str(path), "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        took = time.monotonic() - t0
    result = orjson.loads(out.stdout.strip().splitlines()[-1])
    model = result["methods"]["model"]
    print(
        f"{len(frame)} rows ({result.get('repeats_folded', 0)} repeats folded), "
        f"{result['predictions']} predictions: evaluate took {took:.1f} s; model median APE "
        f"{model['median_ape']:.3f}, order {model['order_accuracy']:.3f}"
    )
    print(orjson.dumps({"rows": len(frame), "seconds": round(took, 1), **result}).decode())


if __name__ == "__main__":
    main()
