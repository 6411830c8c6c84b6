"""`leap-stream bench`: pass-through ceiling, pipeline, real worker, naive, and latency at 1,000/s;
with `--capacity`, the highest rates that keep the worker's and `serve`'s p99 objectives.

Figures go to stderr as the stages finish; the last stdout line is one JSON object (the keys of
`stats.FINAL_KEYS`), so scripts can `tail -1`. docs/benchmarks.md has the measured figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from typing import Any

import orjson

from leap_stream.settings import Settings
from leap_stream.tools.bench.stats import final_figures, mixed_summary, overhead


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events", type=int, default=20_000, help="backlog per stage (default 20000)"
    )
    parser.add_argument(
        "--naive-events",
        type=int,
        default=0,
        help="events of the naive stage (default events/500: it runs at a few events/s)",
    )
    parser.add_argument("--candidates", type=int, default=20, help="candidate types per job")
    parser.add_argument("--rate", type=float, default=1000.0, help="offered load, submissions/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of the offered load")
    parser.add_argument(
        "--http-rate", type=float, default=200.0, help="single-job requests/s to `serve`"
    )
    parser.add_argument(
        "--burst", type=int, default=100_000, help="submissions of the burst stage (at once)"
    )
    parser.add_argument(
        "--mixed-runs",
        type=int,
        default=1,
        help="runs of the load with completions mixed in (the target counts 9 of 10)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes in the group (worker and load)"
    )
    parser.add_argument(
        "--split-roles",
        action="store_true",
        help="each worker as two processes: submissions and completions (LEAP_WORKER_ROLES)",
    )
    parser.add_argument("--batch", type=int, default=500, help="consume(num_messages=…) size")
    parser.add_argument(
        "--only",
        default="passthrough,pipeline,worker,naive,load,burst,http",
        help="comma-separated stages to run (default all)",
    )
    parser.add_argument(
        "--profile",
        default="",
        help="write a pyinstrument profile of the pipeline stage here (.html/.txt)",
    )
    parser.add_argument(
        "--capacity",
        action="store_true",
        help="find the highest mixed rate with the worker's p99 under 50 ms and the highest "
        "request rate with serve's p99 under 10 ms, each pinned to a core of its own "
        "(runs only these stages; set --events to at least the top rate × --seconds)",
    )
    parser.add_argument(
        "--capacity-range",
        default="200:4000",
        help="LOW:HIGH submissions/s the worker's search bisects (default 200:4000)",
    )
    parser.add_argument(
        "--serve-range", default="100:2000", help="LOW:HIGH requests/s for serve (default 100:2000)"
    )
    parser.add_argument("--capacity-steps", type=int, default=5, help="bisection steps")
    parser.add_argument(
        "--capacity-runs", default="9:10", help="NEED:RUNS under the objective at a rate"
    )
    parser.add_argument("--json", action="store_true", help="print the full figures as JSON too")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from leap_stream.stream.compiled import wanted as wanted_compiled
    from leap_stream.tools.bench.http import http_latency
    from leap_stream.tools.bench.loops import (
        batch_loop,
        load_topic,
        naive_loop,
        passthrough_work,
        pipeline_work,
        worker_gc,
    )
    from leap_stream.tools.bench.worker_stages import (
        WorkerProc,
        burst,
        offered_load,
        worker_backlog,
    )
    from leap_stream.tools.bench.world import build_world, log
    from leap_stream.tools.dev import ensure_services, stop_services

    stages = {s.strip() for s in args.only.split(",") if s.strip()}
    if args.capacity:
        stages = {"capacity"}
    if args.profile and importlib.util.find_spec("pyinstrument") is None:
        # a developer's option: the profiler comes with the dev extra, not with the service
        print("bench: --profile needs pyinstrument (pip install pyinstrument)", file=sys.stderr)
        return 2
    cluster = settings.redis_cluster  # LEAP_REDIS_CLUSTER=1: the store on a Redis Cluster
    services = ensure_services(
        kafka=True, redis=not cluster, redis_cluster=cluster, lease=True, cfg=settings
    )
    redis_url = services.redis_cluster_url or services.redis_url
    figs: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    world = None
    worker = None
    try:
        world = build_world(
            services.kafka_bootstrap, redis_url, args.events, args.candidates, settings
        )
        figs["hardware_types"] = len(world.types)
        figs["candidates_per_job"] = args.candidates
        figs["workers"] = args.workers
        figs["redis_cluster"] = cluster
        figs["split_roles"] = args.split_roles
        compiled = wanted_compiled(settings.compiled_trees)
        figs["compiled_trees"] = compiled
        n = len(world.submissions)
        naive_n = args.naive_events or max(30, n // 500)

        if "passthrough" in stages:
            src, dst = world.topic("pt-in"), world.topic("pt-out")
            load_topic(world.bootstrap, src, world.submissions, world.lines)
            d = batch_loop(world.bootstrap, src, dst, dst, n, passthrough_work, args.batch)
            detail["passthrough"] = d
            log(
                f"passthrough: {d['events']} events in {d['seconds']}s = {d['eps']:.0f}/s "
                f"({d['eps_per_cpu_s']:.0f} per CPU-second)"
            )
        if "pipeline" in stages:
            src, dst, dlq = world.topic("pl-in"), world.topic("pl-out"), world.topic("pl-dlq")
            load_topic(world.bootstrap, src, world.submissions, world.lines)
            work, st = pipeline_work(world)
            profiler = None
            if args.profile:
                from pyinstrument import Profiler

                profiler = Profiler(interval=0.002)
                profiler.start()
            with worker_gc(world.settings):  # the worker's collector policy
                d = batch_loop(world.bootstrap, src, dst, dlq, n, work, args.batch)
            if profiler is not None:
                profiler.stop()
                text = (
                    profiler.output_html()
                    if args.profile.endswith(".html")
                    else profiler.output_text(unicode=False, color=False, show_all=False)
                )
                with open(args.profile, "w") as fh:
                    fh.write(text)
                log(f"profile written to {args.profile}")
            d.update(st)
            d.update(overhead(d["cpu_s"], st["trees_cpu_s"], d["events"]))
            detail["pipeline"] = d
            log(
                f"pipeline: {d['events']} events in {d['seconds']}s = {d['eps']:.0f}/s "
                f"({d['eps_per_cpu_s']:.0f} per CPU-second; {d['batches']} batches, {st['model']} ranked by the model, {st['dead']} dead)"
            )
            log(
                f"pipeline CPU {d['pipeline_cpu_us_per_job']:.0f} us per job, of which the "
                f"trees {d['trees_cpu_us_per_job']:.0f} us: overhead ratio "
                f"{d['overhead_ratio']:.1f}"
            )
        if stages & {"worker", "load", "burst"}:
            topics = {
                "sub": world.topic("wk-sub"),
                "comp": world.topic("wk-comp"),
                "rank": world.topic("wk-rank"),
                "dlq": world.topic("wk-dlq"),
            }
            worker = WorkerProc(world, topics, count=args.workers, split_roles=args.split_roles)
            if compiled:  # the backlog waits until the workers serve compiled trees
                worker.start()
                log(f"workers serving compiled trees after {worker.wait_compiled():.1f}s")
            load_topic(world.bootstrap, topics["sub"], world.submissions, world.lines)
            d = worker_backlog(world, worker, n)
            detail["worker"] = d
            log(
                f"worker x{args.workers}: "
                f"{n} events in {d['span_s']}s = {d['eps']:.0f}/s "
                f"({d['eps_per_cpu_s']:.0f} per worker CPU-second); "
                f"start to first ranking {d['start_to_first_s']}s; sources {d['sources']}"
            )
            if "load" in stages:
                time.sleep(1.0)
                d = offered_load(world, worker, args.rate, args.seconds)
                detail["load"] = d
                log(
                    f"offered {args.rate:.0f}/s for {args.seconds:.0f}s: {d['ranked']}/{d['sent']} "
                    f"ranked, p50 {d['p50_ms']:.1f} ms, p90 {d['p90_ms']:.1f} ms, "
                    f"p99 {d['p99_ms']:.1f} ms, max {d['max_ms']:.1f} ms"
                )
                runs = []
                for k in range(args.mixed_runs):
                    time.sleep(1.0)
                    d = offered_load(world, worker, args.rate, args.seconds, mixed_run=k)
                    runs.append(d)
                    log(
                        f"mixed run {k + 1}/{args.mixed_runs}: {args.rate:.0f} submissions/s + "
                        f"{d['completions'] / args.seconds:.0f} completions/s: "
                        f"{d['ranked']}/{d['sent']} ranked, p50 {d['p50_ms']:.1f} ms, "
                        f"p99 {d['p99_ms']:.1f} ms, max {d['max_ms']:.1f} ms"
                    )
                detail["mixed"] = mixed_summary(runs)
                detail["mixed_runs"] = runs
                log(
                    f"mixed: p99 under 50 ms in {detail['mixed']['runs_under_50ms']} of "
                    f"{len(runs)} runs; p99 of the runs {detail['mixed']['p99_ms_runs']}"
                )
            if "burst" in stages:
                time.sleep(1.0)
                d = burst(world, worker, args.burst)
                detail["burst"] = d
                log(
                    f"burst: {d['ranked']}/{d['events']} submissions at once (produced in "
                    f"{d['produce_s']}s) cleared in {d['clear_s']}s = {d['eps']:.0f}/s; first "
                    f"1000: p50 {d['p50_ms_first_1000']:.1f} ms, p99 {d['p99_ms_first_1000']:.1f} ms"
                )
            worker.stop()
        if "http" in stages:
            d = http_latency(world, world.topic("http-rank"), args.http_rate, args.seconds)
            detail["http"] = d
            log(
                f"serve: {args.http_rate:.0f} requests/s for {args.seconds:.0f}s: {d['requests']} "
                f"answered, p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms, max "
                f"{d['max_ms']:.1f} ms; one process answers {d['max_rps']:.0f} requests/s"
            )
        if "capacity" in stages:
            detail["capacity"] = _capacity(args, world, services, settings)
            figs.update(
                capacity_at_p99_50ms=detail["capacity"]["worker"]["capacity"],
                serve_capacity_at_p99_10ms=detail["capacity"]["serve"]["capacity"],
                capacity_cores=detail["capacity"]["cores"],
            )
        if "naive" in stages:
            src, dst = world.topic("nv-in"), world.topic("nv-out")
            load_topic(world.bootstrap, src, world.submissions[:naive_n], world.lines[:naive_n])
            d = naive_loop(world, src, dst, naive_n)
            detail["naive"] = d
            log(
                f"naive: {d['events']} events in {d['seconds']}s = {d['eps']:.1f}/s "
                f"({d['predict_calls']} predict calls)"
            )
    finally:
        if worker is not None:
            worker.stop()
        if world is not None:
            world.close()
        stop_services(services)
    nan = float("nan")
    figs.update(
        passthrough_eps=detail.get("passthrough", {}).get("eps", nan),
        pipeline_eps=detail.get("pipeline", {}).get("eps", nan),
        worker_eps=detail.get("worker", {}).get("eps", nan),
        naive_eps=detail.get("naive", {}).get("eps", nan),
        p50_ms_at_1000=detail.get("load", {}).get("p50_ms", nan),
        p99_ms_at_1000=detail.get("load", {}).get("p99_ms", nan),
        http_p50_ms_at_200=detail.get("http", {}).get("p50_ms", nan),
        http_p99_ms_at_200=detail.get("http", {}).get("p99_ms", nan),
        http_max_rps=detail.get("http", {}).get("max_rps", nan),
        p99_ms_mixed_at_1000=detail.get("mixed", {}).get("p99_ms", nan),
        burst_clear_s=detail.get("burst", {}).get("clear_s", nan),
        burst_p99_ms_first_1000=detail.get("burst", {}).get("p99_ms_first_1000", nan),
        overhead_ratio=detail.get("pipeline", {}).get("overhead_ratio", nan),
        pipeline_cpu_us_per_job=detail.get("pipeline", {}).get("pipeline_cpu_us_per_job", nan),
        trees_cpu_us_per_job=detail.get("pipeline", {}).get("trees_cpu_us_per_job", nan),
    )
    if args.json:
        opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS  # rates tried key their p99s
        print(orjson.dumps(detail, option=opts, default=str).decode())
    sys.stdout.write(orjson.dumps(final_figures(figs)).decode() + "\n")
    return 0


__all__ = ["register", "run"]


def _plan(args: argparse.Namespace, span: str) -> Any:
    from leap_stream.tools.bench.capacity import CapacityPlan

    low, high = (float(x) for x in span.split(":"))
    need, runs = (int(x) for x in args.capacity_runs.split(":"))
    return CapacityPlan(low, high, args.capacity_steps, runs, need, args.seconds)


def _capacity(args: argparse.Namespace, world: Any, services: Any, settings: Settings) -> Any:
    """The worker's and serve's capacity at their objectives (tools/bench/capacity.py)."""
    from leap_stream.stream.compiled import wanted as wanted_compiled
    from leap_stream.tools.bench.capacity import available_cores, split_cores
    from leap_stream.tools.bench.http import serve_capacity
    from leap_stream.tools.bench.loops import load_topic
    from leap_stream.tools.bench.worker_stages import WorkerProc, worker_backlog, worker_capacity
    from leap_stream.tools.bench.world import log
    from leap_stream.tools.dev import state

    cores = split_cores(available_cores(), service_cores=1)
    paths = state.Paths.from_env(services.home, settings)
    others = [
        st.pid
        for name in ("kafka", "redis", "redis-cluster")
        if (st := state.load_state(paths, name)) is not None and st.pid
    ]
    topics = {k: world.topic(f"cap-{k}") for k in ("sub", "comp", "rank", "dlq")}
    worker = WorkerProc(world, topics, count=args.workers, split_roles=args.split_roles)
    try:
        if wanted_compiled(settings.compiled_trees):  # the figures with the trees compiled
            worker.start()
            worker.wait_compiled()
        load_topic(world.bootstrap, topics["sub"], world.submissions, world.lines)
        worker_backlog(world, worker, len(world.submissions))  # the completions' submissions
        w = worker_capacity(world, worker, _plan(args, args.capacity_range), cores, others)
    finally:
        worker.stop()
    log(
        f"capacity: {w['capacity']:.0f} mixed events/s ({w['submissions_per_s']:.0f} "
        f"submissions/s + completions) with p99 under 50 ms in {args.capacity_runs} "
        f"(need:runs), {args.workers} worker process(es) on core(s) "
        f"{list(cores.service)}, the rest "
        f"on {list(cores.rest)}; p99 by rate {w['p99_ms_by_rate']}"
    )
    h = serve_capacity(world, world.topic("cap-http"), _plan(args, args.serve_range), cores)
    log(
        f"serve capacity: {h['capacity']:.0f} requests/s with p99 under 10 ms on core(s) "
        f"{list(cores.service)}, callers on {list(cores.rest)}; p99 by rate "
        f"{h['p99_ms_by_rate']}"
    )
    return {"worker": w, "serve": h, "cores": cores.describe(), "others_pinned": others}
