"""`leap-stream backtest`: its arguments, its plots and its JSON line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from leap_stream.core import features as F
from leap_stream.core.probe import PROBE_SIZES
from leap_stream.settings import Settings
from leap_stream.tools.backtest.loop import run_backtest
from leap_stream.tools.backtest.params import (
    ATTAINABLE,
    CEILINGS,
    DEFAULT_RATE,
    INFORMED,
    PREDICTORS,
    TRAIN_ROWS,
    TRAIN_WINDOW_DAYS,
)
from leap_stream.tools.backtest.scenarios import parse_drift


def plots(summary: dict[str, Any], scored: list[pd.DataFrame], out_dir: Path) -> list[Path]:
    from leap_stream.tools.pyplot import pyplot

    plt = pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    nights = summary["per_night"]
    x = np.arange(1, len(nights) + 1)
    paths = []
    for metric, fname, ylabel in (
        ("accuracy", "accuracy_per_night.png", "share within ±10 % of measured"),
        ("savings", "savings_per_night.png", "cost saved vs default hardware"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name in PREDICTORS:
            ax.plot(x, [n[name][metric] for n in nights], marker="o", ms=3, label=name)
        ax.set_xlabel("night")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        p = out_dir / fname
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    allsc = pd.concat(scored, ignore_index=True) if scored else pd.DataFrame()
    if len(allsc):
        sample = allsc.sample(min(len(allsc), 20000), random_state=0)
        fig, ax = plt.subplots(figsize=(6, 6))
        for name in ("lookup", "model"):
            ok = np.isfinite(sample[name]) & (sample[name] > 0)
            ax.scatter(sample["measured"][ok], sample[name][ok], s=2, alpha=0.3, label=name)
        lim = [max(1e-3, float(sample["measured"].min())), float(sample["measured"].max())]
        ax.plot(lim, lim, "k--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured samples/s")
        ax.set_ylabel("predicted samples/s")
        ax.legend()
        fig.tight_layout()
        p = out_dir / "calibration.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--warmup-days", type=int, default=14)
    parser.add_argument(
        "--rate",
        type=int,
        default=DEFAULT_RATE,
        help="submissions per simulated day (the simulator's own default is 30000)",
    )
    parser.add_argument(
        "--train-window-days",
        type=int,
        default=TRAIN_WINDOW_DAYS,
        help="nightly training on the last N days of rows, further back while they hold fewer "
        "than --train-rows rows (0: everything)",
    )
    parser.add_argument(
        "--train-rows",
        type=int,
        default=TRAIN_ROWS,
        help="subsample the nightly training rows to at most this many (0: all)",
    )
    parser.add_argument("--ablate", default="", help="feature groups to drop, e.g. prior,specs")
    parser.add_argument(
        "--policy",
        choices=("ranked", "default"),
        default="ranked",
        help="ranked (closed loop, the default): every job runs on the ranking's first choice, "
        "so the history and the training rows grow from those runs; default (open loop): jobs "
        "run where their users asked, whatever the ranking said",
    )
    parser.add_argument(
        "--explore-budget",
        type=float,
        metavar="SHARE",
        help="with --policy ranked: the largest extra cost share an exploration may expect "
        "(default LEAP_EXPLORE_BUDGET); jobs run the candidate the ranking marks `explore`",
    )
    parser.add_argument(
        "--no-explore", action="store_true", help="no exploration (--explore-budget 0)"
    )
    parser.add_argument(
        "--probe-budget",
        type=float,
        metavar="SHARE",
        help="with --policy ranked: the largest share of a job's expected cost its probes may "
        "take (default LEAP_PROBE_BUDGET); a probed job runs where the probes' measurements "
        "rank it first",
    )
    parser.add_argument(
        "--probe-minutes",
        type=float,
        metavar="MIN",
        help="a probe's length (default LEAP_PROBE_MINUTES)",
    )
    parser.add_argument(
        "--probe-size",
        choices=PROBE_SIZES,
        help="what a probe runs: the smallest slice of the job that fits, or the whole job "
        "(default LEAP_PROBE_SIZE)",
    )
    parser.add_argument("--no-probes", action="store_true", help="no probes (--probe-budget 0)")
    parser.add_argument(
        "--new-hardware",
        metavar="TYPE",
        help="a catalog type the fleet only gets from --from-day on (no history before it)",
    )
    parser.add_argument("--from-day", type=int, default=20, help="with --new-hardware (0-based)")
    parser.add_argument(
        "--drift",
        action="append",
        metavar="FAMILY:VENDOR:DAY:FACTOR",
        help="a software release from DAY (0-based, warm-up included) multiplying VENDOR's speed "
        "on FAMILY by FACTOR, instead of the simulator's random ones; repeatable",
    )
    parser.add_argument("--plots", type=Path, help="folder for PNG plots")
    parser.add_argument("--json", action="store_true", help="print the full per-night JSON")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace, settings: Settings) -> int:
    ablate = [g.strip() for g in args.ablate.split(",") if g.strip()]
    unknown = [g for g in ablate if g not in F.GROUPS]
    if unknown:
        print(
            f"backtest: unknown feature groups {unknown}; known: {list(F.GROUPS)}", file=sys.stderr
        )
        return 2
    try:
        drift = None if args.drift is None else [parse_drift(d) for d in args.drift]
    except ValueError as exc:
        print(f"backtest: {exc}", file=sys.stderr)
        return 2
    from leap_stream.tools.pyplot import INSTALL_HINT, plots_available

    if args.plots and not plots_available():  # before the run, not after it
        print(f"backtest: --plots: {INSTALL_HINT}", file=sys.stderr)
        return 2
    new_hw = None
    if args.new_hardware:
        from leap_stream.catalog import load_catalog

        if args.new_hardware not in load_catalog():
            print(
                f"backtest: --new-hardware {args.new_hardware!r} is not in the catalog",
                file=sys.stderr,
            )
            return 2
        new_hw = (args.new_hardware, args.from_day)
    budget = settings.explore_budget if args.explore_budget is None else args.explore_budget
    if budget < 0:
        print("backtest: --explore-budget must be >= 0", file=sys.stderr)
        return 2
    probe = dataclasses.replace(
        settings.probe_settings(),
        **{
            k: v
            for k, v in (
                ("budget", args.probe_budget),
                ("minutes", args.probe_minutes),
                ("size", args.probe_size),
            )
            if v is not None
        },
    )
    if probe.budget < 0 or probe.minutes < 0:
        print("backtest: --probe-budget and --probe-minutes must be >= 0", file=sys.stderr)
        return 2
    summary, scored = run_backtest(
        explore_budget=0.0 if args.no_explore else budget,
        probe=dataclasses.replace(probe, budget=0.0) if args.no_probes else probe,
        new_hardware=new_hw,
        drift=drift,
        seed=args.seed,
        nights=args.nights,
        warmup_days=args.warmup_days,
        rate=args.rate,
        ablate=ablate,
        policy=args.policy,
        progress=not args.no_progress,
        train_window_days=args.train_window_days,
        train_rows=args.train_rows,
    )
    if args.plots:
        summary["plots"] = [str(p) for p in plots(summary, scored, args.plots)]
    if not args.json:
        summary = {k: v for k, v in summary.items() if k != "per_night"}
    for name in (*PREDICTORS, *CEILINGS):
        m = summary[name]
        print(
            f"{name:10s} accuracy {m['accuracy']:.3f} (ran-on {m['accuracy_ran']:.3f}) "
            f"MAPE {m['mape']:.3f} top1 {m['top1']:.3f} regret {m['regret']:.3f} "
            f"savings {m['savings']:.3f} coverage {m['coverage']:.3f}",
            file=sys.stderr,
        )
    m = summary["model"]
    print(
        f"model   first + within the noise of it: {m['noise_set_size']:.2f} candidates, "
        f"holding the measured best {m['best_in_noise_set']:.3f}",
        file=sys.stderr,
    )
    if "explore" in summary:
        e, p = summary["explore"], summary["probes"]
        print(
            f"model   {e['count']} explorations ({e['cost_share_fleet']} of the fleet's cost), "
            f"{p['count']} probes ({p['cost_share_fleet']} of the fleet's, "
            f"{p['cost_share_probed']} of the probed jobs'); savings net of them "
            f"{m['savings_net']:.3f} ({m['savings_share_of_oracle_net']} of the oracle's), "
            f"worst 1 % regret ${m['regret_top1pct']:,.0f}",
            file=sys.stderr,
        )
    if m["savings_share_of_oracle"] is not None:
        lo_hi = m["savings_share_of_oracle_95"]
        band = f" (95 % over resampled lineages {lo_hi[0]:.3f}–{lo_hi[1]:.3f})" if lo_hi else ""
        print(
            f"model   savings {m['savings_share_of_oracle']:.3f} of the oracle's{band}",
            file=sys.stderr,
        )
    print(
        "model / attainable / informed oracle: "
        + ", ".join(
            f"{k} {v['model']:.3f} / {v[ATTAINABLE]:.3f} / {v[INFORMED]:.3f}"
            for k, v in summary["ceiling"].items()
        ),
        file=sys.stderr,
    )
    print(orjson.dumps(summary, option=orjson.OPT_SERIALIZE_NUMPY).decode())
    return 0
