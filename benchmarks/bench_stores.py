"""Store figures: history read latency (pipeline vs Lua), completion apply rate, dataset append rate.

    .venv/bin/python benchmarks/bench_stores.py --redis-url redis://localhost:6379/0

Uses a unique key prefix and deletes its keys at the end; the dataset goes to a temp folder.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import cast

from leap_stream.contracts import JobSubmitted
from leap_stream.store.connection import connect
from leap_stream.store.offline import DatasetSink, flatten, read_dataset
from leap_stream.store.online import OnlineStore
from leap_stream.tools import synthetic_events as synthetic


def _lat(fn: Callable[[], object], n: int) -> tuple[float, float, float, float]:
    fn()  # warm (script load, connection)
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    xs.sort()
    return (
        xs[0] * 1e3,
        statistics.median(xs) * 1e3,
        xs[int(0.99 * (len(xs) - 1))] * 1e3,
        statistics.mean(xs) * 1e3,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", default=None, help="default: LEAP_REDIS_URL")
    ap.add_argument("--lineages", type=int, default=500)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--completions", type=int, default=20000)
    ap.add_argument("--rows", type=int, default=50000)
    args = ap.parse_args()

    client = connect(args.redis_url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    store = OnlineStore(client, prefix)
    try:
        # history for the lineages: ~3 hardware types each
        pairs = synthetic.pairs(args.lineages * 6, seed=1, lineages=args.lineages)
        store.apply_completions([c for _s, c in pairs])
        subs = cast(list[JobSubmitted], [s for s, _c in pairs[: args.lineages]])
        ids = [s["lineage_id"] for s in subs]
        types = list(synthetic.MODEL_TYPES)
        hist, _ = store.read_batch(ids, types)
        filled = sum(len(h) for h in hist) / len(hist)
        print(
            f"read_batch, {len(ids)} lineages (avg {filled:.1f} hw each) + {len(types)} aggregates:"
        )
        for name, fn in (
            ("read_batch       ", lambda: store.read_batch(ids, types)),
            ("read_and_remember", lambda: store.read_and_remember(subs)),
        ):
            best, p50, p99, mean = _lat(fn, args.iterations)
            print(f"  {name}: min {best:6.2f}  p50 {p50:6.2f}  p99 {p99:6.2f}  mean {mean:6.2f} ms")

        comps = [c for _s, c in synthetic.pairs(args.completions, seed=2, lineages=5000)]
        for i, c in enumerate(comps):
            c["event_id"] = f"bench-{i}"
        t0 = time.perf_counter()
        for i in range(0, len(comps), 500):
            store.apply_completions(comps[i : i + 500])
        dt = time.perf_counter() - t0
        print(f"apply_completions, batches of 500: {len(comps) / dt:,.0f} events/s (new)")
        t0 = time.perf_counter()
        for i in range(0, len(comps), 500):
            store.apply_completions(comps[i : i + 500])
        dt = time.perf_counter() - t0
        print(f"apply_completions, all duplicates: {len(comps) / dt:,.0f} events/s")
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=5000))
        for i in range(0, len(keys), 5000):
            client.delete(*keys[i : i + 5000])

    pairs = synthetic.pairs(args.rows, seed=3)
    t0 = time.perf_counter()
    rows = [flatten(s, c) for s, c in pairs]
    t_flat = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as root:
        sink = DatasetSink(root)
        t0 = time.perf_counter()
        files = 0
        for i in range(0, len(rows), 5000):
            files += len(sink.append(rows[i : i + 5000]))
        t_app = time.perf_counter() - t0
        t0 = time.perf_counter()
        frame = read_dataset(root)
        t_read = time.perf_counter() - t0
    print(f"flatten: {len(rows) / t_flat:,.0f} rows/s")
    print(
        f"DatasetSink.append, batches of 5000 (fsync each file, {files} files): "
        f"{len(rows) / t_app:,.0f} rows/s"
    )
    print(f"read_dataset (dedup): {len(frame) / t_read:,.0f} rows/s ({len(frame)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
