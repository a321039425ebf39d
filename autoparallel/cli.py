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
from autoparallel.argtypes import non_negative, positive
from autoparallel.errors import UserError

KNOB_FLAGS = ("tp", "pp", "vp", "cp", "ep", "mbs")
console = Console(width=None if sys.stdout.isatty() else 160)


def _add_target(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="preset name or alias (see `autoparallel models`) or a model YAML path")
    p.add_argument("--gpus", type=positive, required=required, help="number of GPUs")
    p.add_argument("--gpu", default="h100-sxm", help="hardware preset or YAML path (default h100-sxm)")


def _add_knobs(p: argparse.ArgumentParser) -> None:
    from autoparallel.specs.plan import PRECISION_CHOICES, RECOMPUTE_CHOICES
    g = p.add_argument_group("layout knobs (any given knob is pinned; the rest is searched)")
    for name in KNOB_FLAGS:
        g.add_argument(f"--{name}", type=positive, help=f"pin {name}")
    g.add_argument("--gbs", type=positive, help="global batch size (default: the model preset's)")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, help="sequence parallel")
    g.add_argument("--recompute", choices=RECOMPUTE_CHOICES)
    g.add_argument("--recompute-num-layers", type=positive, help="layers per pipeline chunk that full recompute covers")
    g.add_argument("--precision", choices=PRECISION_CHOICES)
    g.add_argument("--fp8-bf16-edge-layers", type=non_negative, help="first/last layers kept in BF16 under FP8")
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
    from autoparallel.profiling.commands import profile_search  # issue 4: measure the top-k, re-rank
    from autoparallel.search import run
    shown = None if args.json else console
    if args.resume:
        run_dir = Path(args.resume)
        with _trial_progress(None, args.json) as progress:
            result = run.resume(run_dir, progress, keep_profiled=args.profile == "none")
        result = profile_search(result, args, shown, run_dir)
        _show(result, args, f"resumed {args.resume}", run_dir)
        return
    if args.model is None or args.gpus is None:
        raise UserError("search needs --model and --gpus (or --resume RUN_DIR)")
    model, hw, gbs, space = _inputs(args)
    fp8 = _fp8_check_first(args, model, space) if args.fp8_check else None
    if fp8:
        from autoparallel.fp8check.search_filter import restrict_space
        space = restrict_space(space, fp8)
    start = time.perf_counter()
    if args.strategy == "optuna":
        from autoparallel.search.sampler import StudySettings
        settings = StudySettings(sampler=args.sampler, trials=args.trials, objectives=tuple(args.objectives.split(",")),
                                 seed=args.seed, storage=args.storage or "", workers=args.workers,
                                 seeds_from_grid=args.grid_seeds)
        with _trial_progress(args.trials, args.json) as progress:
            result, run_dir = run.optuna_search(model, hw, args.gpus, gbs, space, settings, Path(args.results),
                                                sys.argv, progress)
        elapsed = time.perf_counter() - start
        result = profile_search(result, args, shown, run_dir)
        _show(result, args, f"{args.trials} {args.sampler} trials in {elapsed:.1f} s", run_dir)
        return
    with console.status("pricing every candidate layout...", spinner="dots") if not args.json else _null():
        result = run.search(model, hw, args.gpus, gbs, space, args.recompute_num_layers, fp8_decisions=fp8)
    elapsed = time.perf_counter() - start
    result = profile_search(result, args, shown)
    _show(result, args, f"{len(result.ranked):,} candidates in {elapsed:.2f} s", None)
    if not args.no_save:
        with console.status(f"writing the run folder ({len(result.ranked):,} candidates)...", spinner="dots") \
                if not args.json else _null():
            run_dir = run.save(result, Path(args.results), sys.argv)
        if not args.json:
            console.print(f"run folder: {run_dir}")


def _show(result, args: argparse.Namespace, how: str, run_dir: Path | None) -> None:
    from autoparallel.report.tables import print_ranked
    if args.json:
        print(json.dumps(result.records(args.top), indent=1))
        return
    title = (f"{result.model.name} on {result.gpus} x {result.hardware.name}, gbs {result.gbs}: top "
             f"{min(args.top, len(result.feasible))} of {len(result.feasible):,} feasible ({how})")
    print_ranked(result.ranked, title, args.top, console)
    if run_dir:
        console.print(f"run folder: {run_dir}")


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _trial_progress(total: int | None, quiet: bool):
    """A progress bar for sampler trials showing the best feasible throughput so far."""
    if quiet:
        return _null()
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as p:
            task = p.add_task("trials", total=total)

            def update(done: int, best: float | None) -> None:
                text = f"trials (best {best:,.0f} tok/s/GPU)" if best else "trials"
                p.update(task, completed=done, description=text)
            yield update
    return bar()


def _fp8_check_first(args: argparse.Namespace, model, space) -> dict:
    """Run ``fp8-check`` on the model; its decisions restrict the search (issue 7)."""
    from autoparallel.fp8check.command import CHECKABLE, check_and_save, settings_from_flags
    from autoparallel.fp8check.search_filter import decisions_from_check
    recipes = ",".join(p for p in space.precision if p in CHECKABLE)  # mxfp8 is not emulated
    if not recipes:
        return {}
    settings = settings_from_flags(args.fp8_check_settings, args.fp8_check_steps, recipes)
    result, check_dir = check_and_save(model, settings, None if args.no_save else Path(args.results),
                                       sys.argv, None if args.json else console)
    if not args.json:
        from autoparallel.fp8check.report import print_check
        print_check(result, console)
        if check_dir:
            console.print(f"fp8-check folder: {check_dir}")
    return decisions_from_check(result)


def cmd_fp8_check(args: argparse.Namespace) -> None:
    from autoparallel.fp8check.command import check_and_save, settings_from_flags
    from autoparallel.fp8check.report import print_check, verdict_rows
    model = io.load_model(args.model)
    settings = settings_from_flags(args.settings, args.steps, args.recipes, args.seed)
    result, run_dir = check_and_save(model, settings, None if args.no_save else Path(args.results),
                                     sys.argv, None if args.json else console, plots=not args.no_plots)
    if args.json:
        print(json.dumps({"model": model.name, "proxy": result.proxy.name, "seconds": round(result.seconds, 1),
                          "run_dir": str(run_dir) if run_dir else None, "verdicts": verdict_rows(result)},
                         indent=1))
        return
    print_check(result, console)
    if run_dir:
        console.print(f"run folder: {run_dir}")


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


def cmd_report(args: argparse.Namespace) -> None:
    from autoparallel.search import run
    with console.status("rendering report...", spinner="dots"):
        path = run.report(Path(args.run_dir))
    console.print(f"wrote {path}")


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


def cmd_infer(args: argparse.Namespace) -> None:
    from autoparallel.serve import search as serve
    from autoparallel.serve.report import print_ranked
    from autoparallel.serve.space import load_space, parse_precision
    model = io.load_model(args.model)
    hw = io.load_hardware(args.gpu)
    request = serve.Request(args.input_len, args.output_len, args.max_latency_ms, args.latency_metric)
    point = args.tp is not None and args.pp is not None and args.batch is not None
    wp = parse_precision(args.weight_precision, "--weight-precision")
    kp = parse_precision(args.kv_precision, "--kv-precision")
    if point:  # one layout: 16-bit weights and KV cache unless pinned
        wp, kp = wp or "bf16", kp or "bf16"
    space = load_space(args.space).pinned(tp=args.tp, pp=args.pp, batch=args.batch,
                                          weight_precision=wp, kv_precision=kp)
    if point:
        space = space.pinned(tp_within_nvlink_domain=False)
        row = serve.estimate_point(model, hw, args.gpus, request, space)
        if args.json:
            print(json.dumps(serve.record(row), indent=1))
        else:
            title = serve.point_title(model, hw, args.gpus, request, row)
            print_ranked(row.to_frame().T.assign(feasible=True, rank=1), title, 1, console)
            if row["reason"]:
                console.print(f"[red]{row['reason']}[/red]")
        return
    start = time.perf_counter()
    result = serve.search(model, hw, args.gpus, request, space)
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps(result.records(args.top), indent=1))
    else:
        title = (f"{serve.title_of(result)}: top {min(args.top, len(result.feasible))} of "
                 f"{len(result.feasible):,} feasible ({len(result.ranked):,} candidates in {elapsed:.2f} s)")
        print_ranked(result.ranked, title, args.top, console)
    if not args.no_save:
        run_dir = serve.save(result, Path(args.results), sys.argv)
        if not args.json:
            console.print(f"run folder: {run_dir}")


def cmd_validate(args: argparse.Namespace) -> None:
    if args.inference:
        from autoparallel.serve import validate as serve_validate
        report = serve_validate.validate_inference(Path(args.runs) if args.runs else None)
        if args.json:
            print(json.dumps({"rows": json.loads(report.drop(columns=["notes", "source"]).to_json(orient="records")),
                              "summary": serve_validate.summary(report)}, indent=1))
        else:
            serve_validate.print_report(report, console)
        return
    from autoparallel import validate
    report = validate.validate_training(Path(args.runs) if args.runs else None)
    if args.json:
        print(report.to_json(orient="records", indent=1))
        return
    validate.print_report(report, console)


def cmd_calibrate(args: argparse.Namespace) -> None:
    from autoparallel.costmodel import calibrate
    if getattr(args, "from_run", None):  # issue 4: fit to profiled step times of a run
        from autoparallel.profiling.commands import calibrate_from
        calibrate_from(Path(args.from_run), write=not args.dry_run, console=console)
        return
    if not args.gpu:
        raise UserError("calibrate needs --gpu (published runs) or --from RUN_DIR (profiled runs)")
    calibrate.main(args.gpu, Path(args.runs) if args.runs else None, write=not args.dry_run, console=console)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoparallel", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("search", help="rank every valid training layout")
    _add_target(s, required=False)
    _add_knobs(s)
    s.add_argument("--strategy", choices=("grid", "optuna"), default="grid",
                   help="grid prices every candidate (default); optuna samples --trials of them")
    s.add_argument("--sampler", choices=("tpe", "nsga2", "random", "gp"), default="tpe")
    s.add_argument("--trials", type=positive, default=200, help="completed trials an optuna search runs")
    s.add_argument("--objectives", default="throughput", help="throughput, or throughput,memory for a Pareto front")
    s.add_argument("--seed", type=int, default=0, help="sampler seed")
    s.add_argument("--storage", help="Optuna storage URL (default: SQLite in the run folder; 'journal' for a "
                                     "journal file, used automatically with --workers > 1)")
    s.add_argument("--workers", type=positive, default=1, help="parallel local trial workers")
    s.add_argument("--grid-seeds", type=non_negative, default=5,
                   help="best grid layouts enqueued as the first trials (0: none)")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue the interrupted optuna search of RUN_DIR "
                                                       "(profiles again only with --profile; see below)")
    s.add_argument("--top", type=positive, default=10, help="entries to print (default 10)")
    s.add_argument("--json", action="store_true", help="print the ranked list as JSON")
    s.add_argument("--results", default="results", help="folder for run folders (default results/)")
    s.add_argument("--no-save", action="store_true", help="do not write a run folder")
    s.add_argument("--fp8-check", action="store_true",
                   help="run `fp8-check` first: drop rejected FP8 recipes, apply their BF16 layers")
    s.add_argument("--fp8-check-steps", type=positive, help="training steps of the FP8 check (default: its YAML)")
    s.add_argument("--fp8-check-settings", help="FP8 check settings YAML (default search_spaces/fp8_check.yaml)")
    s.set_defaults(func=cmd_search)

    f = sub.add_parser("fp8-check", help="judge FP8 recipes on a proxy model's numerics (loss gap, under/overflow)")
    f.add_argument("--model", required=True, help="preset name or alias, or a model YAML path")
    f.add_argument("--steps", type=positive, help="training steps per run (default: the settings YAML's, 200)")
    f.add_argument("--recipes", help="comma-separated: fp8-delayed,fp8-current,fp8-blockwise (default all)")
    f.add_argument("--seed", type=int, help="seed of data order and initialisation (default: the YAML's)")
    f.add_argument("--settings", help="thresholds / proxy YAML (default search_spaces/fp8_check.yaml)")
    f.add_argument("--results", default="results", help="folder for run folders (default results/)")
    f.add_argument("--no-save", action="store_true", help="do not write a run folder")
    f.add_argument("--no-plots", action="store_true", help="write the tables but not the PNG plots")
    f.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    f.set_defaults(func=cmd_fp8_check)

    e = sub.add_parser("estimate", help="predict one fully pinned layout")
    _add_target(e)
    _add_knobs(e)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_estimate)

    x = sub.add_parser("export", help="write a ranked entry of a run as Megatron-LM args, NeMo YAML or YAML")
    x.add_argument("run_dir")
    x.add_argument("--rank", type=positive, default=1)
    x.add_argument("--format", choices=("megatron", "nemo", "yaml"), default="yaml")
    x.add_argument("--output", "-o", help="file to write (default stdout)")
    x.set_defaults(func=cmd_export)

    i = sub.add_parser("infer", help="rank serving layouts (TP, PP, replicas, batch, precision) under a latency bound")
    _add_target(i)
    i.add_argument("--input-len", type=positive, default=2048, help="prompt tokens per request (default 2048)")
    i.add_argument("--output-len", type=positive, default=256, help="generated tokens per request (default 256)")
    i.add_argument("--max-latency-ms", type=float, help="latency bound in ms (default: none)")
    i.add_argument("--latency-metric", default="tpot",
                   help="ttft | tpot | e2e: what the bound applies to (default tpot)")
    g = i.add_argument_group("layout knobs (any given knob is pinned; tp, pp and batch all pinned = one estimate)")
    g.add_argument("--tp", type=positive, help="pin tensor parallel size")
    g.add_argument("--pp", type=positive, help="pin pipeline parallel size")
    g.add_argument("--batch", type=positive, help="pin requests in flight per replica")
    g.add_argument("--weight-precision", help="pin weights: bf16 | fp16 | fp8")
    g.add_argument("--kv-precision", help="pin KV cache: bf16 | fp16 | fp8")
    i.add_argument("--space", default="inference", help="search space preset or YAML path (default inference)")
    i.add_argument("--top", type=positive, default=10, help="entries to print (default 10)")
    i.add_argument("--json", action="store_true", help="print JSON (one object when tp, pp and batch are pinned)")
    i.add_argument("--results", default="results", help="folder for run folders (default results/)")
    i.add_argument("--no-save", action="store_true", help="do not write a run folder")
    i.set_defaults(func=cmd_infer)

    r = sub.add_parser("report", help="re-render a run's tables and write report.html with plots")
    r.add_argument("run_dir")
    r.set_defaults(func=cmd_report)

    v = sub.add_parser("validate", help="predict published measurements and report the error")
    v.add_argument("--runs", help="CSV of measured runs (default ../shared/data/training_runs.csv, "
                                  "or inference_runs.csv with --inference)")
    v.add_argument("--inference", action="store_true",
                   help="validate the inference cost model on FasterTransformer's latencies instead")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_validate)

    c = sub.add_parser("calibrate", help="fit the hardware efficiency constants to published runs")
    c.add_argument("--gpu", help="hardware preset to fit (its rows in the runs CSV)")
    c.add_argument("--runs", help="CSV of measured runs (default ../shared/data/training_runs.csv)")
    c.add_argument("--dry-run", action="store_true", help="print the fit, do not write the YAML")
    c.set_defaults(func=cmd_calibrate)
    from autoparallel.profiling import commands as profiling_commands  # issue 4 (no torch import)
    profiling_commands.add_calibrate_args(c)
    profiling_commands.add_search_args(s)
    profiling_commands.add_profile_parser(sub)

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
