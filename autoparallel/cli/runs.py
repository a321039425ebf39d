"""``autoparallel runs import``: turn the user's own training logs into rows of a runs CSV."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoparallel.argtypes import non_negative
from autoparallel.cli.common import console
from autoparallel.errors import UserError
from autoparallel.safefile import check_folder, check_output_file
from autoparallel.words import plural


def add_parser(sub) -> None:
    r = sub.add_parser("runs", help="the runs measured on your cluster (training logs -> runs CSV)")
    actions = r.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    i = actions.add_parser("import", help="read Megatron-LM / Megatron-Bridge training logs into a runs CSV")
    i.add_argument("logs", nargs="+", metavar="LOG", help="training log files (stdout of the job)")
    i.add_argument("--gpu", required=True,
                   help="hardware preset the runs used (logs rarely name the GPU); see `autoparallel hardware`")
    i.add_argument("--runs", default=None, help="runs CSV to append to (default results/runs.csv)")
    i.add_argument("--warmup", type=non_negative, default=None, metavar="ITERATIONS",
                   help="leave out the intervals up to this iteration (default: the first logged interval)")
    i.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> None:
    from autoparallel.report.fit import phrase_lines
    from autoparallel.runlogs.runsfile import DEFAULT_RUNS, import_logs
    runs_file = args.runs or str(DEFAULT_RUNS)
    # A --runs you name is written where you say (a missing folder is refused, as export -o refuses it);
    # the default's folder, results/, is made when written, as a search makes it (checked first, as
    # search checks it: in a folder it cannot write in, that was a traceback after reading the logs).
    if args.runs is not None or Path(runs_file).parent.is_dir():
        check_output_file(runs_file, "--runs")
    else:
        check_folder(Path(runs_file).parent, f"--runs {runs_file}")
    results = import_logs([Path(p) for p in args.logs], args.gpu, Path(runs_file), args.warmup)
    for r in results:
        if r.row is None:
            if len(results) > 1:  # one log alone: its reason is the error below, said once
                console.print(f"[yellow]skipped[/yellow] {r.path}: {r.reason}", highlight=False)
            continue
        row = r.row
        layout = (f"{row['num_gpus']} x {row['gpu']}, TP{row['tp']} PP{row['pp']} VP{row['vp']} CP{row['cp']} "
                  f"MBS{row['mbs']} GBS{row['gbs']} {row['precision']} recompute={row['recompute']}")
        memory = ("" if row["measured_max_allocated_gib"] is None
                  else f", {row['measured_max_allocated_gib']:.1f} GiB max allocated")
        state = "read" if r.added else "already in the file"
        # broken between phrases at the console's width (a terminal broke "35.9" / "GiB"); one line in a pipe
        line = (f"{state} {r.path} -> {row['id']}: {layout}; {row['measured_iteration_time_s']:.3f} s per "
                f"iteration{memory}")
        console.print("\n".join(phrase_lines(line, console.width)), highlight=False, markup=False)
    read = [r for r in results if r.row is not None]
    if not read:
        if len(results) == 1:
            path, reason = results[0].path, results[0].reason  # a reason from reading the file names it already
            unread = f"the log could not be read ({reason if str(path) in reason else f'{path}: {reason}'})"
        else:
            unread = f"none of the {len(results)} logs could be read (the reasons above)"
        raise UserError(f"{unread}; nothing written")
    added = sum(r.added for r in read)
    console.print(f"{plural(added, 'new row')} in {runs_file} ({len(read) - added} already there, "
                  f"{plural(len(results) - len(read), 'log')} skipped)", highlight=False)
