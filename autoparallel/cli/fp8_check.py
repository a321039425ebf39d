"""``autoparallel fp8-check``: judge FP8 and FP4 recipes on a proxy model's numerics."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoparallel import io
from autoparallel.argtypes import positive, seed
from autoparallel.cli.common import console


def add_parser(sub) -> None:
    f = sub.add_parser("fp8-check", help="judge FP8 / FP4 recipes on a proxy model's numerics (loss gap, under/overflow)")
    f.add_argument("--model", required=True, help="preset name or alias, or a model YAML path")
    f.add_argument("--steps", type=positive, help="training steps per run (default: the settings YAML's, 200)")
    f.add_argument("--recipes", help="comma-separated, of fp8-delayed,fp8-current,fp8-blockwise,"
                   "mxfp8,nvfp4 (or delayed,current,blockwise); default: the three FP8 ones")
    f.add_argument("--seed", type=seed, help="seed of data order and initialisation (default: the YAML's)")
    f.add_argument("--settings", help="thresholds / proxy YAML (default: the shipped fp8_check.yaml)")
    f.add_argument("--results", help="folder for run folders (default results/)")
    f.add_argument("--no-save", action="store_true", help="do not write a run folder")
    f.add_argument("--no-plots", action="store_true", help="write the tables but not the PNG plots")
    f.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    f.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from autoparallel.fp8check.command import check_and_save, settings_from_flags
    from autoparallel.fp8check.report import verdict_rows
    from autoparallel.report.run_folder import check_root
    from autoparallel.cli import combos
    combos.check_results(args)
    model = io.load_model(args.model)
    settings = settings_from_flags(args.settings, args.steps, args.recipes, args.seed)
    if not args.no_save:
        check_root(Path(args.results))
    result, run_dir = check_and_save(model, settings, None if args.no_save else Path(args.results),
                                     sys.argv, None if args.json else console, plots=not args.no_plots)
    if args.json:
        print(json.dumps({"model": model.name, "proxy": result.proxy.name, "seconds": round(result.seconds, 1),
                          "run_dir": str(run_dir) if run_dir else None, "verdicts": verdict_rows(result)},
                         indent=1))
        return
    print_check_result(result, run_dir, "run folder")


def print_check_result(result, run_dir: Path | None, label: str) -> None:
    from autoparallel.fp8check.report import print_check
    print_check(result, console)
    if run_dir:
        console.print(f"{label}: {run_dir}")
