"""`leap-stream evaluate --table FILE.csv [--specs CATALOG.json] [--leave-out type] [--json]`.

Prints a table of figures per method; with `--json` the last stdout line is one JSON object:
``{"table", "rows", "repeats_folded", "leave_out", "predictions", "skipped", "methods": {name:
{mape, median_ape, within_10, order_accuracy}}}``, with `by_type` when leaving types out
(docs/evaluate.md). Exit 2 on a table or catalog it cannot read.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from leap_stream.catalog import CatalogError, HardwareCatalog, load_catalog, load_reference_catalog
from leap_stream.settings import Settings
from leap_stream.tools.evaluate.protocol import LEAVE_OUT, METHODS, evaluate
from leap_stream.tools.evaluate.table import FORMATS, Table, TableError, read_table


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table", type=Path, required=True, help="benchmark table (CSV)")
    parser.add_argument(
        "--specs",
        type=Path,
        help="a catalog file (the catalog's own format) adding or overriding accelerator types",
    )
    parser.add_argument(
        "--format",
        default="auto",
        choices=("auto", *FORMATS),
        help="the table's shape (auto: detected from its columns)",
    )
    parser.add_argument(
        "--by-group", action="store_true", help="also the figures of each group (e.g. round)"
    )
    parser.add_argument(
        "--leave-out",
        default="workload",
        choices=LEAVE_OUT,
        help="what each prediction never learned from: its workload (default), or its "
        "accelerator type (every pair into a type predicted with that type unseen)",
    )
    parser.add_argument("--json", action="store_true", help="last stdout line: one JSON object")


def catalog_for(specs: Path | None) -> HardwareCatalog:
    """The built-in catalog (fleet + reference parts), with `specs` layered on top."""
    catalog = load_reference_catalog()
    return catalog if specs is None else catalog.merged(load_catalog(specs))


def report(
    table: Table, catalog: HardwareCatalog, by_group: bool = False, leave_out: str = "workload"
) -> dict[str, Any]:
    result = evaluate(table.rows, catalog, leave_out=leave_out)
    out: dict[str, Any] = {
        "table": table.name,
        "rows": len(table.rows),
        "leave_out": leave_out,
        "predictions": result["predictions"],
        "repeats_folded": table.repeats_folded,
        "skipped": {**table.skipped, "types_without_specs": table.unknown_types},
        "methods": result["methods"],
        "table_estimator_choices": result["table_estimator_choices"],
    }
    if "by_type" in result:
        out["by_type"] = result["by_type"]
    if by_group:
        out["groups"] = {
            str(g): evaluate(rows, catalog, leave_out=leave_out)
            for g, rows in table.rows.groupby("group", sort=True)
            if rows["workload"].nunique() > 1
        }
    return out


def _print_choices(choices: dict[str, dict[str, Any]]) -> None:
    """One line: what `table_estimator` chose across the held-out workloads."""
    if not choices:
        return
    exps = [c["device_exponent"] for c in choices.values()]
    shifts = [c["shift"] for c in choices.values()]
    priors = Counter(c["prior"] for c in choices.values())
    print(
        f"  table_estimator, over {len(choices)} held-out workloads: device exponent "
        f"{min(exps):+.1f}…{max(exps):+.1f}, shift {min(shifts):+.2f}…{max(shifts):+.2f}, "
        f"priors {dict(priors.most_common())}"
    )


def _print_types(by_type: dict[str, Any]) -> None:
    """Per type left out: median APE of the model against the geometric-mean ratio."""
    if not by_type:
        return
    print(f"  {'type left out':22s} {'preds':>6s} {'model':>7s} {'geomean':>8s}  median APE")
    for t, r in by_type.items():
        model = r["methods"]["model"]["median_ape"]
        base = r["methods"].get("geomean_ratio", {}).get("median_ape", float("nan"))
        flag = "  worse than geomean" if model > base else ""
        print(f"  {t:22s} {r['predictions']:6d} {model:7.3f} {base:8.3f}{flag}")


def _print_table(out: dict[str, Any]) -> None:
    print(
        f"{out['table']}: {out['rows']} rows after folding {out['repeats_folded']} repeated "
        f"measurements (median), {out['predictions']} predictions (leave one "
        f"{out['leave_out']} out); "
        f"skipped {out['skipped']}"
    )
    print(f"  {'method':22s} {'MAPE':>7s} {'median APE':>10s} {'±10 %':>7s} {'order':>7s}")
    for name in METHODS:
        m = out["methods"].get(name) or {}
        if not m:
            continue
        print(
            f"  {name:22s} {m['mape']:7.3f} {m['median_ape']:10.3f} "
            f"{m['within_10']:7.3f} {m['order_accuracy']:7.3f}"
        )
    _print_choices(out["table_estimator_choices"])
    _print_types(out.get("by_type") or {})
    for g, r in (out.get("groups") or {}).items():
        best = {k: v for k, v in r["methods"].items() if v}
        if best:
            model = best["model"]
            print(
                f"  group {g}: {r['predictions']} predictions, model MAPE {model['mape']:.3f} "
                f"order {model['order_accuracy']:.3f}"
            )


def run(args: argparse.Namespace, _settings: Settings) -> int:
    try:
        catalog = catalog_for(args.specs)
        table = read_table(args.table, catalog, args.format)
    except (OSError, CatalogError, TableError) as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 2
    if table.rows.empty:
        print(
            f"evaluate: {args.table}: no usable row (skipped: {table.skipped}; "
            f"types without specs: {table.unknown_types})",
            file=sys.stderr,
        )
        return 2
    out = report(table, catalog, args.by_group, args.leave_out)
    if not out["predictions"]:
        print(
            f"evaluate: {args.table}: no job was measured on two accelerator types "
            f"(rows are compared within one group, workload and configuration): nothing to predict",
            file=sys.stderr,
        )
        return 2
    _print_table(out)
    if args.json:
        print(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY).decode())
    return 0
