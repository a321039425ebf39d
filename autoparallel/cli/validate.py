"""``autoparallel validate``: predict published measurements and report the error."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoparallel.cli.common import console, progress_bar
from autoparallel.errors import UserError


def add_parser(sub) -> None:
    v = sub.add_parser("validate", help="predict published measurements and report the error")
    v.add_argument("--runs", action="append",
                   help="CSV of measured runs (repeatable, but one with --inference; default: the published runs "
                        "shipped in autoparallel/data/)")
    v.add_argument("--inference", action="store_true",
                   help="validate the serving cost model instead: per engine, GPU and model, the in-sample and "
                        "leave-one-model-out errors on FasterTransformer's (--runs: its CSV) and TensorRT-LLM's "
                        "published runs, then the MLPerf Inference Offline / Server runs through the traffic "
                        "simulation (in sample and LOMO; p99 TTFT / TPOT)")
    v.add_argument("--no-cross-validation", action="store_true",
                   help="skip the leave-one-model-out refits (in-sample error only; seconds instead of a minute)")
    v.add_argument("--tie-bands", metavar="FILE",
                   help="also write the held-out error per GPU family and dense/MoE (prediction_error.yaml, the "
                        "tie band of the ranked tables) to FILE")
    v.add_argument("--no-mlperf", action="store_true",
                   help="with --inference: skip the MLPerf Inference runs (simulated traffic, about half a minute)")
    v.add_argument("--json", action="store_true", help="print every row and the summary as JSON")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    runs = [Path(r) for r in args.runs] if args.runs else None
    if args.no_mlperf and not args.inference:
        raise UserError("--no-mlperf has no effect without --inference (the MLPerf rows are serving runs); "
                        "drop it or add --inference")
    if args.inference and args.tie_bands:
        raise UserError("--tie-bands has no effect with --inference (the bands are the training model's); "
                        "drop one of them")
    if args.inference:
        if runs is not None and len(runs) > 1:  # the training check reads several; the serving one reads one
            raise UserError(f"--inference reads one FasterTransformer runs CSV, got {len(runs)} --runs "
                            f"({', '.join(map(str, runs))}): give one")
        from autoparallel.measured_runs import read_runs_table
        from autoparallel.serve import validate as serve_validate
        from autoparallel.serve.measured import FT_CSV
        for path in runs or []:
            read_runs_table(path, expected=FT_CSV)  # serve/ checks its own columns; here a file that is no table at all
        try:
            serve_validate.run(runs[0] if runs else None, args.json, console, cross=not args.no_cross_validation,
                               with_mlperf=not args.no_mlperf)
        except (ValueError, TypeError, KeyError) as exc:  # a value of the user's CSV serve/ cannot read
            if runs is None:
                raise
            raise UserError(f"runs CSV {runs[0]}: a value the inference validation cannot read "
                            f"({type(exc).__name__}: {' '.join(str(exc).split())[:150]})") from None
        return
    from autoparallel import validate
    if args.tie_bands and args.no_cross_validation:
        raise UserError("--tie-bands needs the held-out errors: drop --no-cross-validation")
    if args.tie_bands:
        from autoparallel import safefile
        safefile.check_output_file(args.tie_bands, "--tie-bands")
    report = _training_report(validate, runs, cross=not args.no_cross_validation, quiet=args.json)
    if args.tie_bands:
        import datetime as dt
        safefile.write_atomic(Path(args.tie_bands), validate.tie_bands_yaml(report, dt.date.today().isoformat()),
                              "--tie-bands")
    if args.json:
        print(json.dumps({"rows": json.loads(report.to_json(orient="records")),
                          "summary": json.loads(validate.summary(report).to_json(orient="records"))}, indent=1))
        return
    validate.print_report(report, console)


def _training_report(validate, runs, cross: bool, quiet: bool):
    """The report: the runs read and priced once (a minute on a busy machine) under a spinner, then
    a progress bar over the leave-one-model-out refits (nothing on the terminal with --json)."""
    if quiet:
        return validate.validate_training(runs, cross=cross)
    with progress_bar("reading the measured runs", None):
        rows = validate.all_runs(runs)
    if not cross:
        with progress_bar(f"predicting {len(rows)} runs", None):
            return validate.validate_training(runs, cross=False, rows=rows)
    with progress_bar("leave-one-model-out refits", validate.cross_validation_folds(rows)) as (bar, task):
        return validate.validate_training(runs, cross=True, progress=lambda: bar.advance(task), rows=rows)
