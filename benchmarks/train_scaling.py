"""How `leap-stream train` grows with the dataset: wall time and peak memory per size.

    .venv/bin/leap-stream simulate --seed 3 --days 365 --rate 30000 --dataset-dir /tmp/y365
    .venv/bin/python benchmarks/train_scaling.py --dataset /tmp/y365 --days 34,100 \\
        --plot docs/img/train_scaling.png

For each --days N: a dataset of the first N days of --dataset (symlinked day= folders), then
`leap-stream train` on it in a fresh registry under /usr/bin/time -v, as the nightly job runs
(point-in-time replay, features, the gate's candidate fit, the published refit). Prints one
line per size and one JSON line; optionally a plot with both axes against rows. Sizes whose
projected peak does not fit the machine (--max-gib) are skipped and reported, not run.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

PEAK = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
WALL = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)")


def seconds(clock: str) -> float:
    parts = [float(p) for p in clock.split(":")]
    return sum(p * 60**i for i, p in enumerate(reversed(parts)))


def run_one(days: list[Path], work: Path) -> dict[str, float]:
    data = work / "dataset"
    data.mkdir(parents=True)
    for d in days:
        (data / d.name).symlink_to(d)
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "leap_stream", "train"]
    cmd += ["--dataset", str(data), "--registry", str(work / "registry"), "--no-progress"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"train failed:\n{res.stderr[-3000:]}")
    report = orjson.loads(res.stdout.strip().splitlines()[-1])
    peak, wall = PEAK.search(res.stderr), WALL.search(res.stderr)
    assert peak is not None and wall is not None, res.stderr[-2000:]
    return {
        "days": len(days),
        "dataset_rows": report["dataset_rows"],
        "rows": report["rows"],
        "wall_s": round(seconds(wall.group(1)), 1),
        "peak_gib": round(int(peak.group(1)) / 2**20, 2),
    }


def plot(
    points: list[dict[str, float]],
    projected: list[dict[str, float]],
    path: Path,
    targets: tuple[float, float],
) -> None:
    """Measured sizes as filled dots, skipped ones at their linear projection as open ones;
    the targets as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, scale, target, label in (
        (axes[0], "wall_s", 60.0, targets[0], "wall time (min)"),
        (axes[1], "peak_gib", 1.0, targets[1], "peak memory (GiB)"),
    ):
        xs = [p["rows"] / 1e6 for p in points]
        ax.plot(xs, [p[key] / scale for p in points], "o-", label="measured")
        if projected:
            px = [xs[-1]] + [p["rows"] / 1e6 for p in projected]
            py = [points[-1][key] / scale] + [p[key] / scale for p in projected]
            ax.plot(px, py, "o--", mfc="none", c="C0", label="projected (not run)")
        ax.axhline(target, ls=":", c="grey", label="target")
        ax.set(xlabel="training rows (millions)", ylabel=label)
        ax.legend(fontsize=8)
    axes[0].set_title("leap-stream train: wall time")
    axes[1].set_title("peak RSS")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", type=Path, required=True, help="day= folders (simulate)")
    ap.add_argument("--days", default="34,100", help="comma-separated dataset sizes in days")
    ap.add_argument("--max-gib", type=float, default=20.0, help="do not run a larger projection")
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    folders = sorted(a.dataset.glob("day=*"))
    points: list[dict[str, float]] = []
    skipped: list[dict[str, float]] = []
    for n in (int(x) for x in a.days.split(",")):
        if points:  # linear projection from the last measured size
            last = points[-1]
            grow = n / last["days"]
            if last["peak_gib"] * grow > a.max_gib:
                skipped.append(
                    {
                        "days": n,
                        "rows": round(last["rows"] * grow),
                        "wall_s": round(last["wall_s"] * grow, 1),
                        "peak_gib": round(last["peak_gib"] * grow, 1),
                    }
                )
                print(f"{n:4d} days: skipped, projected {skipped[-1]}", flush=True)
                continue
        with tempfile.TemporaryDirectory() as tmp:
            p = run_one(folders[:n], Path(tmp))
        points.append(p)
        print(
            f"{n:4d} days: {p['rows']:>10,.0f} rows  {p['wall_s']:7.1f} s  {p['peak_gib']:5.2f} GiB",
            flush=True,
        )
    if a.plot and points:
        plot(points, skipped, a.plot, (15.0, 8.0))
    print(orjson.dumps({"points": points, "skipped": skipped}).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
