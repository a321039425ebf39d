"""``autoparallel calibrate``: fit a GPU's efficiency constants to measured runs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

from autoparallel.cli.common import console
from autoparallel.errors import UserError


def add_parser(sub) -> None:
    from autoparallel.profiling import commands as profiling_commands  # no torch import here
    c = sub.add_parser("calibrate",
                       help="fit a GPU's efficiency constants to measured runs (published, yours, profiled)")
    c.add_argument("--gpu", help="hardware preset to fit (its rows in the runs CSV)")
    c.add_argument("--runs", help="CSV of measured runs, e.g. your own from `runs import` (default: the published "
                                  "runs shipped in autoparallel/data/)")
    c.add_argument("--with-published", action="store_true",
                   help="fit to the --runs rows together with the published runs of the same GPU")
    c.add_argument("--as", dest="as_name", metavar="NEW_NAME",
                   help="write the fitted preset under this new name (your cluster), leaving the GPU's preset as is")
    c.add_argument("--moe", action="store_true",
                   help="fit the mixture-of-experts constants instead (on the MoE rows of every GPU and the "
                        "forced-balance vs dropless pairs) and write them into --gpu's preset")
    c.add_argument("--gpu-speed", action="store_true",
                   help="also fit each GPU that takes --gpu's constants (efficiency_from) a sustained tensor speed "
                        "relative to --gpu, where 3 rows of it and 5 of --gpu pin it (a preset that holds such "
                        "factors refits them without the flag)")
    c.add_argument("--dry-run", action="store_true", help="print the fit, do not write the YAML")
    c.add_argument("--json", action="store_true",
                   help="print the fit as JSON (fitted values, errors, constants at a bound); the rest goes to stderr")
    c.add_argument("--output", "-o", help="hardware YAML to write (default: <your preset folder>/hardware/"
                                          "<gpu>.yaml, which then takes the shipped preset's place)")
    profiling_commands.add_calibrate_args(c)
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    output = Path(args.output) if args.output else None
    _check_combinations(args)
    result = _fit(args, output, Console(stderr=True) if args.json else console)
    if args.dry_run:  # the fit's lines read like a calibration done; say that nothing changed
        (Console(stderr=True) if args.json else console).print("dry run: nothing written (drop --dry-run to write "
                                                               "the preset)", highlight=False)
    if args.json:
        import json
        print(json.dumps(result, indent=1))


def _fit(args: argparse.Namespace, output: Path | None, console: Console) -> dict:
    """Run the fit the flags ask for; its ``calibrate.summary``."""
    from autoparallel.costmodel import calibrate
    if args.as_name is not None:
        from autoparallel.specs.names import name_problem
        if name_problem(args.as_name):
            raise UserError(f"--as {args.as_name!r} {name_problem(args.as_name)}: it names a preset file; use "
                            "letters, digits, '-', '_', '.' and '+'")
        _check_new_name(args.as_name, args.gpu)
    if not args.dry_run:  # checked before the fit, which takes minutes
        from autoparallel import resources, safefile
        if output is not None:
            safefile.check_output_file(args.output, "--output")
            _check_replaces_a_preset(output)
        else:
            folder = resources.user_dir() / "hardware"
            home = f" ({resources.HOME_ENV}={resources.user_dir()})" if os.environ.get(resources.HOME_ENV) else ""
            safefile.check_folder(folder, f"your preset folder {folder}{home}")
    if args.from_run:  # fit to profiled step times of a run
        from autoparallel.profiling.commands import calibrate_from
        return calibrate_from(Path(args.from_run), write=not args.dry_run, console=console, output=output,
                              as_name=args.as_name)
    if not args.gpu:
        raise UserError("calibrate needs --gpu (published runs) or --from RUN_DIR (profiled runs)")
    if args.moe:
        return calibrate.main_moe(args.gpu, Path(args.runs) if args.runs else None, write=not args.dry_run,
                                  console=console, output=output)
    return calibrate.main(args.gpu, Path(args.runs) if args.runs else None, write=not args.dry_run, console=console,
                          output=output, as_name=args.as_name, with_published=args.with_published,
                          gpu_speed=args.gpu_speed)


def _check_replaces_a_preset(output: Path) -> None:
    """-o may replace a hardware preset (an earlier fit), nothing else: `-o RUN/candidates.csv`
    replaced a run's table with a preset, without a word."""
    from autoparallel import io
    if not output.exists():
        return
    try:
        io.load_hardware(str(output))
    except UserError as exc:
        why = " ".join(str(exc).split(";")[0].split()).removeprefix(f"{output}: ")
        raise UserError(f"--output {output} exists and is not a hardware preset ({why}); "
                        "calibrate writes a whole preset there: give a new file name, or a hardware YAML to "
                        "replace") from None


def _check_new_name(name: str, gpu: str | None) -> None:
    """--as names a new preset: a shipped preset's name or alias would be replaced by this fit
    (``calibrate --gpu h100-sxm --as h200`` made every later --gpu h200 an H100 of 80 GiB)."""
    from autoparallel import io
    shipped = io.preset_aliases("hardware", shipped_only=True)
    if name.lower() in shipped:
        raise UserError(f"--as {name} names the shipped preset {shipped[name.lower()]}: the fit of {gpu or 'the run'} "
                        f"would take its place for every --gpu {name}; give a new name for your cluster "
                        f"(e.g. my-cluster), or drop --as to refit {gpu or 'the GPU'} itself")


def _check_combinations(args: argparse.Namespace) -> None:
    """calibrate's flags that have no effect together (``cli.combos``)."""
    from autoparallel.cli.combos import no_effect
    if args.dry_run and args.output:
        raise no_effect("--output", "--dry-run", "a dry run writes nothing; drop one of them")
    if args.as_name is not None and args.moe:
        raise no_effect("--as", "--moe", "the MoE constants go into --gpu's own preset")
    if args.gpu_speed and (args.moe or args.from_run):
        raise no_effect("--gpu-speed", "--moe" if args.moe else "--from", "the GPU speeds are fitted with the dense constants")
    if args.with_published and not args.runs:
        raise no_effect("--with-published", "no --runs", "the published runs are the default already")
    if args.gpu and not args.runs and not args.moe and not args.from_run:
        _check_published_rows(args.gpu)


def _check_published_rows(gpu: str) -> None:
    """A UserError if no published run was measured on ``gpu`` (or on a GPU that takes its
    constants): there is nothing to fit, and your own rows are needed (--runs)."""
    from autoparallel import io
    from autoparallel.measured_runs import read_runs
    hw = io.load_hardware(gpu)
    for name in read_runs()["gpu"].dropna().astype(str).unique():
        try:
            measured_on = io.load_hardware(name)
        except UserError:
            continue
        if hw.name in (measured_on.name, measured_on.efficiency_from):
            return
    raise UserError(f"no published run was measured on {hw.name}; nothing to fit: give your own rows "
                    "with --runs (see `autoparallel runs import`)")
