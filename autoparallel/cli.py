"""Command-line wiring only: parse arguments, call the library, print.

Every user mistake surfaces as a ``UserError``: one line on stderr, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console

from autoparallel import io
from autoparallel.errors import UserError

KNOB_FLAGS = ("tp", "pp", "vp", "cp", "ep", "mbs")
console = Console(width=None if sys.stdout.isatty() else 160)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset name or alias (see `autoparallel models`) or a model YAML path")
    p.add_argument("--gpus", type=_positive, required=True, help="number of GPUs")
    p.add_argument("--gpu", default="h100-sxm", help="hardware preset or YAML path (default h100-sxm)")


def _add_knobs(p: argparse.ArgumentParser) -> None:
    from autoparallel.specs.plan import PRECISION_CHOICES, RECOMPUTE_CHOICES
    g = p.add_argument_group("layout knobs (any given knob is pinned; the rest is searched)")
    for name in KNOB_FLAGS:
        g.add_argument(f"--{name}", type=_positive, help=f"pin {name}")
    g.add_argument("--gbs", type=_positive, help="global batch size (default: the model preset's)")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, help="sequence parallel")
    g.add_argument("--recompute", choices=RECOMPUTE_CHOICES)
    g.add_argument("--recompute-num-layers", type=_positive, help="layers per pipeline chunk that full recompute covers")
    g.add_argument("--precision", choices=PRECISION_CHOICES)
    g.add_argument("--fp8-bf16-edge-layers", type=_non_negative, help="first/last layers kept in BF16 under FP8")
    g.add_argument("--tp-comm-overlap", action=argparse.BooleanOptionalAction)
    g.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction)
    g.add_argument("--overlap-dp-comm", action=argparse.BooleanOptionalAction,
                   help="--overlap-grad-reduce and --overlap-param-gather")
    g.add_argument("--grad-reduce-in-fp32", action=argparse.BooleanOptionalAction)
    g.add_argument("--flash-attention", action=argparse.BooleanOptionalAction)
    p.add_argument("--space", default="training", help="search space preset or YAML path (default training)")


def _pins(args: argparse.Namespace) -> dict:
    names = KNOB_FLAGS + ("sp", "recompute", "precision", "fp8_bf16_edge_layers", "tp_comm_overlap",
                          "distributed_optimizer", "overlap_dp_comm", "grad_reduce_in_fp32", "flash_attention")
    return {n: getattr(args, n) for n in names}


def _inputs(args: argparse.Namespace):
    from autoparallel.search.run import default_gbs
    from autoparallel.space import load_space
    model = io.load_model(args.model)
    hw = io.load_hardware(args.gpu)
    space = load_space(args.space).pinned(**_pins(args))
    return model, hw, default_gbs(model, args.gbs), space


def cmd_search(args: argparse.Namespace) -> None:
    from autoparallel.report.tables import print_ranked
    from autoparallel.search import run
    model, hw, gbs, space = _inputs(args)
    start = time.perf_counter()
    with console.status("pricing every candidate layout...", spinner="dots") if not args.json else _null():
        result = run.search(model, hw, args.gpus, gbs, space, args.recompute_num_layers)
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps(result.records(args.top), indent=1))
    else:
        title = f"{model.name} on {args.gpus} x {hw.name}, gbs {gbs}: top {min(args.top, len(result.feasible))} " \
                f"of {len(result.feasible):,} feasible ({len(result.ranked):,} candidates in {elapsed:.2f} s)"
        print_ranked(result.ranked, title, args.top, console)
    if not args.no_save:
        run_dir = run.save(result, Path(args.results), sys.argv)
        if not args.json:
            console.print(f"run folder: {run_dir}")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def cmd_estimate(args: argparse.Namespace) -> None:
    from autoparallel.costmodel.estimate import estimate_plan
    from autoparallel.space import generate, row_to_plan
    model, hw, gbs, space = _inputs(args)
    if args.tp is None or args.pp is None:
        raise UserError("estimate needs at least --tp and --pp (other knobs default to vp=cp=ep=mbs=1, "
                        "sp when tp>1, no recompute, bf16)")
    defaults = {"vp": 1, "cp": 1, "ep": 1, "mbs": 1, "sp": args.tp > 1, "recompute": "none",
                "precision": "bf16", "fp8_bf16_edge_layers": 0, "tp_comm_overlap": False,
                "distributed_optimizer": True, "overlap_dp_comm": True, "grad_reduce_in_fp32": True,
                "flash_attention": True}
    pins = {k: (v if v is not None else defaults.get(k)) for k, v in _pins(args).items()}
    space = space.pinned(**pins)
    if args.recompute_num_layers is None:
        space = space.pinned(full_recompute_fractions=1.0)
    candidates = generate(model, hw, args.gpus, gbs, space, args.recompute_num_layers)
    if (candidates.reason != "").all():
        raise UserError(f"invalid layout: {candidates.reason.iloc[0]}")
    plan = row_to_plan(candidates[candidates.reason == ""].iloc[0])
    result = estimate_plan(model, hw, plan, space.memory_fraction)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    _print_estimate(model, hw, result)


def _print_estimate(model, hw, result: dict) -> None:
    from rich.table import Table
    c = result["config"]
    title = (f"{model.name} on {c['tp'] * c['pp'] * c['cp'] * c['dp']} x {hw.name}: TP{c['tp']} PP{c['pp']} "
             f"VP{c['vp']} CP{c['cp']} DP{c['dp']} MBS{c['mbs']} GBS{c['gbs']} {c['precision']} "
             f"recompute={c['recompute']}")
    t = Table(title=title, show_header=False)
    t.add_row("fits", "yes" if result["fits"] else "[red]NO[/red]")
    t.add_row("peak memory", f"{result['peak_memory_gib']:.1f} GiB of {hw.memory_gib} GiB")
    t.add_row("step time", f"{result['step_time_s']:.3f} s")
    t.add_row("tokens/s/GPU", f"{result['tokens_per_s_per_gpu']:,.0f}")
    t.add_row("model TFLOP/s/GPU", f"{result['model_tflops_per_gpu']:.0f}")
    t.add_row("MFU", f"{result['mfu']:.1%}")
    for k, v in result["breakdown"]["time_s"].items():
        t.add_row(f"  time: {k[:-2]}", f"{v:.3f} s")
    for k, v in result["breakdown"]["memory_gib"].items():
        t.add_row(f"  memory: {k[:-4]}", f"{v:.1f} GiB")
    console.print(t)


def cmd_export(args: argparse.Namespace) -> None:
    import yaml

    from autoparallel.report.export import megatron_args, nemo_config
    from autoparallel.search import run
    result = run.load(Path(args.run_dir))
    plan = result.plan(args.rank)
    if args.format == "megatron":
        text = " \\\n  ".join(megatron_args(result.model, plan)) + "\n"
    elif args.format == "nemo":
        text = yaml.safe_dump(nemo_config(result.model, plan), sort_keys=False)
    else:
        text = yaml.safe_dump(run.plan_document(result.model, result.entry(args.rank)), sort_keys=False, width=100)
    if args.output:
        from autoparallel.report.run_folder import write_atomic
        write_atomic(Path(args.output), text)
    else:
        sys.stdout.write(text)


def cmd_list(kind: str) -> None:
    from rich.table import Table
    t = Table(title=f"{kind} presets ({io.SEARCH_SPACES / kind})")
    if kind == "models":
        for c in ("name", "aliases", "layers", "hidden", "heads/kv", "params", "seq", "gbs"):
            t.add_column(c)
        for name in io.preset_files(kind):
            m = io.load_model(name)
            t.add_row(name, ", ".join(m.aliases), str(m.num_layers), str(m.hidden_size),
                      f"{m.num_attention_heads}/{m.query_groups}", f"{m.num_parameters / 1e9:.1f}B",
                      str(m.seq_length), str(m.global_batch_size or "-"))
    else:
        for c in ("name", "aliases", "bf16 TF", "fp8 TF", "mem GiB", "HBM TB/s", "NVLink domain", "calibrated on"):
            t.add_column(c)
        for name in io.preset_files(kind):
            h = io.load_hardware(name)
            t.add_row(name, ", ".join(h.aliases), f"{h.bf16_tflops:.0f}", f"{h.fp8_tflops or 0:.0f}",
                      f"{h.memory_gib:.0f}", f"{h.hbm_tbps}", str(h.nvlink_domain), h.calibrated_on or "-")
    console.print(t)


def cmd_validate(args: argparse.Namespace) -> None:
    from autoparallel import validate
    report = validate.validate_training(Path(args.runs) if args.runs else None)
    if args.json:
        print(report.to_json(orient="records", indent=1))
        return
    validate.print_report(report, console)


def cmd_calibrate(args: argparse.Namespace) -> None:
    from autoparallel.costmodel import calibrate
    calibrate.main(args.gpu, Path(args.runs) if args.runs else None, write=not args.dry_run, console=console)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoparallel", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("search", help="rank every valid training layout")
    _add_target(s)
    _add_knobs(s)
    s.add_argument("--top", type=_positive, default=10, help="entries to print (default 10)")
    s.add_argument("--json", action="store_true", help="print the ranked list as JSON")
    s.add_argument("--results", default="results", help="folder for run folders (default results/)")
    s.add_argument("--no-save", action="store_true", help="do not write a run folder")
    s.set_defaults(func=cmd_search)

    e = sub.add_parser("estimate", help="predict one fully pinned layout")
    _add_target(e)
    _add_knobs(e)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_estimate)

    x = sub.add_parser("export", help="write a ranked entry of a run as Megatron-LM args, NeMo YAML or YAML")
    x.add_argument("run_dir")
    x.add_argument("--rank", type=_positive, default=1)
    x.add_argument("--format", choices=("megatron", "nemo", "yaml"), default="yaml")
    x.add_argument("--output", "-o", help="file to write (default stdout)")
    x.set_defaults(func=cmd_export)

    v = sub.add_parser("validate", help="predict published measurements and report the error")
    v.add_argument("--runs", help="CSV of measured runs (default ../shared/data/training_runs.csv)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_validate)

    c = sub.add_parser("calibrate", help="fit the hardware efficiency constants to published runs")
    c.add_argument("--gpu", required=True, help="hardware preset to fit (its rows in the runs CSV)")
    c.add_argument("--runs", help="CSV of measured runs (default ../shared/data/training_runs.csv)")
    c.add_argument("--dry-run", action="store_true", help="print the fit, do not write the YAML")
    c.set_defaults(func=cmd_calibrate)

    sub.add_parser("models", help="list model presets").set_defaults(func=lambda a: cmd_list("models"))
    sub.add_parser("hardware", help="list hardware presets").set_defaults(func=lambda a: cmd_list("hardware"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as exc:
        print(f"autoparallel: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autoparallel: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
