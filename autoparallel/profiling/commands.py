"""The profiling side of the command line: ``profile``, ``search --profile job|layer`` and
``calibrate --from RUN_DIR``. ``autoparallel.cli`` only wires these in, so the CLI module stays
argument wiring; torch and Ray are imported when a command runs, never at import.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoparallel import io
from autoparallel.argtypes import non_negative, positive, positive_number, positive_seconds
from autoparallel.errors import UserError
from autoparallel.profiling import slurm_args
from autoparallel.specs.model import ModelSpec


EXECUTORS = ("local", "ray", "slurm")


def _device_arg(p, default: str | None = "auto") -> None:
    from autoparallel.profiling.device import DEVICE_CHOICES
    p.add_argument("--device", choices=DEVICE_CHOICES, default=default,
                   help="where profiles run: the GPU when torch sees one (auto, default), or "
                        "cpu / cuda; profiled.csv records which device measured")


def _checked_device(choice: str) -> str:
    from autoparallel.profiling.device import resolve_device
    try:
        return resolve_device(choice)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _job_args(p: argparse.ArgumentParser, prefix: str = "") -> None:
    p.add_argument(f"--{prefix}steps", type=positive, default=20, help="timed steps (default 20)")
    p.add_argument(f"--{prefix}warmup", type=non_negative, default=5, help="untimed warm-up steps (default 5)")
    p.add_argument(f"--{prefix}timeout", type=positive_seconds, default=600.0,
                   help="seconds before a job counts as hung (default 600)")
    p.add_argument("--memory-cap-gib", metavar="GIB", type=positive_number,
                   help="CPU only: fail like an out-of-memory above this many GiB per rank")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="where jobs run: processes here (default), a Ray cluster, or Slurm (sbatch)")
    p.add_argument("--ray-address", metavar="ADDRESS", help="Ray cluster address (default: start or join a local one)")
    slurm_args.add_args(p)


def add_profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="run one layout of the built-in transformer for real and "
                                       "measure step time, tokens/s and memory")
    p.add_argument("--model", help="preset name or a model YAML path (with --rank: the run's model, the default)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--plan", help="plan YAML: Plan fields, or a best.yaml (its 'plan' key)")
    where.add_argument("--rank", nargs=2, metavar=("N", "RUN_DIR"),
                       help="the N-th ranked plan of a saved search")
    _job_args(p)
    _device_arg(p)
    p.add_argument("--fault", default="", help=argparse.SUPPRESS)  # kill:RANK | hang:RANK (tests)
    p.add_argument("--json", action="store_true", help="print the measurement as JSON")
    p.set_defaults(func=cmd_profile)


def add_search_args(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group(
        "profiling (either strategy)",
        "After the search (a grid, or an optuna study's trials), profile the --top-k best "
        "feasible layouts by predicted throughput (of a throughput,memory study: the --top-k "
        "of its Pareto front), write the measurements beside the predictions (and the profiled "
        "rows to profiled.csv) and re-rank. "
        "--resume RUN_DIR profiles again only if --profile is given again (the new top-k, "
        "replacing the earlier measurements); without it the earlier measurements are kept, and a "
        "profiling that was interrupted goes on with the options it was started with "
        "(profiling.yaml in the run folder).")
    g.add_argument("--profile", choices=("none", "job", "layer"), default="none",
                   help="job: run the --top-k best predicted layouts and re-rank by measurement; "
                        "layer: replace the compute estimate with measured layer profiles")
    g.add_argument("--top-k", metavar="K", type=positive, help="layouts to profile (default 5)")
    g.add_argument("--profile-steps", metavar="STEPS", type=positive, help="timed steps per job (default 20)")
    g.add_argument("--profile-warmup", metavar="STEPS", type=non_negative, help="warm-up steps per job (default 5)")
    g.add_argument("--profile-timeout", metavar="SECONDS", type=positive_seconds, help="seconds per job (default 600)")
    g.add_argument("--memory-cap-gib", metavar="GIB", type=positive_number, help="CPU only: forced per-rank memory cap")
    g.add_argument("--executor", choices=EXECUTORS,
                   help="where jobs run: processes here (default), a Ray cluster, or Slurm (sbatch)")
    g.add_argument("--ray-address", metavar="ADDRESS", help="Ray cluster address")
    _device_arg(g, default=None)  # search: None tells "given" from the default (cli.combos)
    slurm_args.add_args(s)


def add_calibrate_args(c: argparse.ArgumentParser) -> None:
    c.add_argument("--from", dest="from_run", metavar="RUN_DIR",
                   help="fit to the measured step times of a profiled search run (the "
                        "hardware named in its manifest)")


def load_plan(path: str):
    """A plan YAML (Plan fields, or a best.yaml's ``plan``) strictly, and the model a best.yaml
    names (None for a bare plan)."""
    from autoparallel.specs.plan import Plan
    data = io.read_flag_yaml("--plan", path)
    if "plan" not in data and {"engine", "layout"} <= set(data):  # a plan's 43 keys named was no help here
        raise UserError(f"{path} is an `infer` run's best.yaml (a serving layout): profile measures a training "
                        "plan, a `search` run's best.yaml or Plan fields (--rank N RUN_DIR for a search run)")
    model = data.get("model") if "plan" in data else None
    plan = data.get("plan", data)
    if not isinstance(plan, dict):
        raise UserError(f"{path}: 'plan' must be a mapping of Plan fields, got {plan!r}")
    return io.from_dict(Plan, plan, f"{path}: plan"), model


def _need_torch(what: str) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError(f"{what} runs the built-in transformer and needs torch: "
                        "pip install 'autoparallel[model]'") from None


def check_runnable(model, plan, label: str, builtin: bool = True) -> None:
    """Refuse, before any process starts, a plan the built-in transformer cannot run: one that
    breaks Megatron-LM's layout rules (the search's own, ``space.generate``, on a device that
    has every precision) or this implementation's (``check_plan``, the recipes it implements;
    not checked when ``builtin`` is False: the job is the user's Megatron-LM)."""
    from autoparallel.parallel.parallelize import check_plan, policy_for
    from autoparallel.space import SearchSpace, generate
    from autoparallel.specs.hardware import HardwareSpec
    knobs = {k: getattr(plan, k) for k in ("tp", "pp", "vp", "cp", "ep", "mbs", "sp", "recompute", "precision",
                                           "fp8_bf16_edge_layers", "tp_comm_overlap", "distributed_optimizer",
                                           "grad_reduce_in_fp32", "flash_attention", "fsdp",
                                           "cpu_offloading_num_layers")}
    space = SearchSpace().pinned(**knobs, overlap_dp_comm=plan.overlap_grad_reduce, full_recompute_fractions=1.0,
                                 tp_within_nvlink_domain=False)
    anything = HardwareSpec("any device", bf16_tflops=1, memory_gib=1, hbm_tbps=1, nvlink_domain=plan.tp,
                            nvlink_gbps=1, internode_gbps=1, fp8_tflops=2, mxfp8=True, reserve_gib=0)
    frame = generate(model, anything, plan.num_gpus, plan.gbs, space, plan.recompute_num_layers or None)
    broken = sorted(set(frame["reason"]) - {""})
    if broken and not (frame["reason"] == "").any():
        raise UserError(f"cannot profile {label} on {model.name}: {'; '.join(broken)}")
    if not builtin:
        return
    try:
        policy_for(plan)
        check_plan(model, plan, plan.num_gpus)
    except (ValueError, NotImplementedError) as exc:
        raise UserError(f"cannot profile {label} on {model.name}: {exc}") from None


def _plan_and_model(args: argparse.Namespace):
    """The plan to profile, its label, and the model: --model, or the run's own with --rank (a
    --model that differs from the model the plan was searched for is refused)."""
    if args.plan:
        plan, named = load_plan(args.plan)
        if args.model is None:
            raise UserError("profile --plan needs --model (the model the plan lays out)")
        model = io.load_model(args.model)
        if named is not None and named != model.name:
            # "--model cpu-small is cpu-small" said nothing; an alias is resolved ("175b is gpt3-175b")
            given = args.model if args.model == model.name else f"{args.model} is {model.name}"
            raise UserError(f"--model {given}, but {args.plan} is a plan for {named!r} (its 'model' key)")
        return plan, args.plan, model
    from autoparallel.search import run
    try:
        n = int(args.rank[0])
    except ValueError:
        raise UserError(f"--rank expects N RUN_DIR, got {args.rank[0]!r} for N") from None
    result = run.load(Path(args.rank[1]))
    plan = result.plan(n)
    if args.model is not None and io.load_model(args.model).name != result.model.name:
        raise UserError(f"--model {args.model} is not the model of {args.rank[1]} ({result.model.name}); "
                        "leave --model out to profile the run's own model")
    return plan, f"rank {n} of {args.rank[1]}", result.model


def _guard_world(launcher, world: int, what: str) -> None:
    from autoparallel.profiling.launcher import too_large
    if why := too_large(world, launcher.capacity()):
        raise UserError(f"{what}: {why}; profile a layout of at most {launcher.capacity()[0]} GPUs here "
                        "(or use --executor ray with a cluster that has them)")


def _guard_memory(launcher, device: str, model: ModelSpec, plan, label: str) -> None:
    """Refuse a job on this machine's CPU whose weights and gradients alone outgrow its memory."""
    from autoparallel.profiling.device import resolve_device
    from autoparallel.profiling.launcher import LocalLauncher, too_large_for_memory
    if type(launcher) is LocalLauncher and resolve_device(device) == "cpu" and (
            why := too_large_for_memory(model, plan)):
        raise UserError(f"cannot profile {label}: {why}; profile a smaller layout or model here "
                        "(e.g. --model cpu-small --plan PLAN) or use --executor ray with a cluster that has "
                        "the memory")


def check_profiling(args: argparse.Namespace, gpus: int, model: ModelSpec) -> None:
    """Refuse, before a search starts, ``--profile`` that cannot run: no torch, a corrupt layer
    profile store, layer profiles of a MoE ``model``, an unreachable Ray cluster, or jobs of
    ``gpus`` ranks on a machine (or cluster) with fewer; Slurm options that have no effect."""
    slurm_args.check(args)
    if getattr(args, "profile", "none") == "none":
        return
    _need_torch(f"--profile {args.profile}")
    if args.profile == "layer":
        if model.is_moe:  # the layer profiler times dense layers
            raise UserError(f"--profile layer times dense layers only; {model.name} is a mixture of experts: "
                            "use --profile job")
        from autoparallel.profiling.store import FILE_NAME, ProfileStore
        ProfileStore(Path(args.results) / FILE_NAME)
        return
    _guard_world(_launcher(args, None), gpus, f"--profile job on {gpus} GPUs")


def _launcher(args: argparse.Namespace, console, hw=None, again: str | None = None):
    """The launcher ``--executor`` names (Slurm with its settings, the trainer and a progress
    display; ``hw``: the hardware the candidates were priced on; ``again``: how to resume an
    interrupted Slurm batch)."""
    from autoparallel.profiling.launcher import make_launcher
    if args.executor == "slurm":
        return slurm_args.launcher(args, console, hw, again)
    if trainer := slurm_args.megatron(args, hw):  # --executor local: torchrun here
        from autoparallel.profiling.megatron_local import MegatronLocalLauncher
        return MegatronLocalLauncher(trainer, Path(getattr(args, "results", None) or "results") / "megatron")
    return make_launcher(args.executor, args.ray_address)


def _layout(plan) -> str:
    """A plan's degrees in one line (CP and EP only where they are used)."""
    text = f"TP{plan.tp} PP{plan.pp} VP{plan.vp}" + (f" CP{plan.cp}" if plan.cp > 1 else "")
    return text + f" DP{plan.dp}" + (f" EP{plan.ep}" if plan.ep > 1 else "") + f" MBS{plan.mbs}"


def cmd_profile(args: argparse.Namespace) -> None:
    from autoparallel.profiling.job import JobSpec
    _need_torch("profile")
    slurm_args.check(args)
    plan, label, model = _plan_and_model(args)
    check_runnable(model, plan, label, builtin=args.trainer != "megatron")
    if args.executor != "slurm":  # under Slurm the compute nodes have the devices
        _checked_device(args.device)
    try:
        job = JobSpec(model, plan, steps=args.steps, warmup=args.warmup, timeout_s=args.timeout,
                      memory_cap_gib=args.memory_cap_gib, fault=args.fault, device=args.device)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    launcher = _launcher(args, None if args.json else _console(), _rank_hardware(args))
    _guard_world(launcher, plan.num_gpus, f"cannot profile {label}")
    _guard_memory(launcher, args.device, model, plan, label)
    if args.executor == "slurm":
        slurm_args.confirm(args, [plan.num_gpus], None, args.warmup + args.steps, args.timeout,
                           None if args.json else _console())
    with _waiting(args, f"profiling {model.name} {_layout(plan)}: {args.warmup} warm-up + {args.steps} timed steps"):
        m = launcher.run(job)  # 20 s on a CPU and more with torch's start on a GPU: a spinner, not a still screen
    record = {"plan": plan.as_dict(), **{k: v for k, v in m.as_dict().items()}}
    if args.json:
        print(json.dumps(record, indent=1, default=str))
    else:  # the commands' console (one line in a pipe: a console of its own broke it at 80 columns there),
        from autoparallel.report.fit import phrase_lines  # broken between phrases on a terminal
        console = _console()
        if m.ok:
            line = (f"{model.name} {_layout(plan)} GBS{plan.gbs} on {m.world_size} x {m.device}: step "
                    f"{m.step_time_s * 1e3:.1f} ms (median of {args.steps}), {m.tokens_per_s_per_gpu:,.0f} "
                    f"tokens/s/rank, peak {m.peak_memory_gib:.3f} GiB, saved activations "
                    f"{m.activation_bytes / 2**20:.1f} MiB, loss {m.loss:.3f}")
            console.print("\n".join(phrase_lines(line, console.width)), markup=False, highlight=False)
        else:
            console.print(f"[red]failed:[/red] {m.reason}")
    if not m.ok:
        raise SystemExit(1)


def confirm_cost(result, args: argparse.Namespace, console=None) -> None:
    """``search --profile job --executor slurm``: the jobs and GPU-hours the top-k will take,
    printed and confirmed (``--yes``) before anything is written or submitted."""
    if getattr(args, "profile", "none") != "job" or args.executor != "slurm":
        return
    from autoparallel.profiling.job import JobSpec
    from autoparallel.search.measured import choose
    from autoparallel.space import row_to_plan
    rows = result.ranked.loc[choose(result.ranked, args.top_k, pareto=len(result.objectives) > 1)]
    evaluator = _evaluator(result, args, None)  # the very jobs profile_search submits
    tasks = [evaluator.launcher.task(JobSpec(result.model, row_to_plan(row), **evaluator.job_options))
             for _, row in rows.iterrows()]
    kept = evaluator.launcher.batch.finished_earlier(tasks)  # a resumed profiling reads these back
    if all(kept):
        if console is not None:
            console.print(f"nothing to submit: {'the job' if len(rows) == 1 else f'the {len(rows)} jobs'} "
                          "finished earlier")
        return
    rows = rows[[not k for k in kept]]
    slurm_args.confirm(args, [result.gpus] * len(rows), list(rows["step_time_s"]),
                       args.profile_warmup + args.profile_steps, args.profile_timeout, console,
                       f"; {sum(kept)} finished earlier, read back" if any(kept) else "")


def profile_search(result, args: argparse.Namespace, console=None, run_dir: Path | None = None,
                   summarise: bool = False):
    """``search --profile job|layer`` for either strategy: measure the top-k, return the result
    re-ranked with ``result.profiled`` set (the cost is confirmed first: ``confirm_cost``).
    ``run_dir``: the run's folder, written before profiling starts with the predictions; the
    profiling options go into it (``record``), then the tables with the measurements
    (``summarise``: a fresh grid run's, the best feasible rows and rejections.csv); an
    interrupted profiling says how to resume it."""
    if getattr(args, "profile", "none") == "none":
        return result
    from autoparallel.profiling import record
    from autoparallel.search import run
    from autoparallel.search.measured import profile_top
    slurm = args.executor == "slurm" and args.profile == "job"
    again = None
    if run_dir is not None:
        record.write(run_dir, args, slurm_args.root(args) if slurm else None)
        again = f"continue with `autoparallel search --resume {run_dir}`"
    try:
        result.ranked, result.profiled = profile_top(result.ranked, _evaluator(result, args, console, again),
                                                     args.top_k, pareto=len(result.objectives) > 1)
    except KeyboardInterrupt as exc:
        if run_dir is None or str(exc):  # a Slurm batch says what it kept and how to resume
            raise
        raise KeyboardInterrupt(f"profiling stopped; the run folder {run_dir} keeps the predictions: "
                                f"{again} to profile again") from None
    if run_dir is not None:
        run.write_tables(result, run_dir, summarise=summarise)
        record.finish(run_dir)
    return result


def _waiting(args: argparse.Namespace, text: str):
    """A spinner while one local or Ray job runs (nothing with --json or in pipes; Slurm prints its own)."""
    from contextlib import nullcontext
    console = _console()
    if args.json or args.executor == "slurm" or not console.is_terminal:
        return nullcontext()
    return console.status(text, spinner="dots")


def _console():
    from autoparallel.cli.common import console
    return console


def _rank_hardware(args: argparse.Namespace):
    """profile --rank: the hardware of the run (a bare --plan: None, the default's)."""
    if not args.rank:
        return None
    from autoparallel.search import run
    return run.load_inputs(Path(args.rank[1]))[2]


def hybrid_refusal(model, what: str) -> str:
    """Why ``what`` cannot measure a hybrid Mamba-Transformer model."""
    return (f"{what} cannot measure {model.name}: it is a hybrid Mamba-Transformer (hybrid_layer_pattern), "
            "and the built-in transformer and its layer profiles have no Mamba-2 layers; profile jobs with "
            "--trainer megatron (Megatron-LM's pretrain_hybrid.py)")


def _evaluator(result, args: argparse.Namespace, console, again: str | None = None):
    """The evaluator ``--profile`` names, for the layouts ``profile_top`` hands it."""
    slurm = getattr(args, "executor", "local") == "slurm"
    if result.model.is_hybrid and (args.profile == "layer" or getattr(args, "trainer", None) != "megatron"):
        raise UserError(hybrid_refusal(result.model, f"--profile {args.profile}"))
    if result.model.is_dsv4:  # neither the built-in transformer nor Megatron-LM's flags build it
        from autoparallel.report.shared import dsv4_unsupported
        raise UserError(f"--profile {args.profile} cannot measure {dsv4_unsupported(result.model)}")
    device = getattr(args, "device", "auto") if slurm else _checked_device(getattr(args, "device", "auto"))
    if args.profile == "layer":
        from autoparallel.profiling.layer import LayerProfileEvaluator
        from autoparallel.profiling.store import FILE_NAME, ProfileStore
        return LayerProfileEvaluator(result.model, result.hardware, result.space.memory_fraction,
                                     top_k=args.top_k, device=device,
                                     store=ProfileStore(Path(args.results) / FILE_NAME))
    from autoparallel.profiling.evaluator import ProfilingEvaluator

    def show(plan, m):
        if console is not None:
            what = (f"{m.step_time_s * 1e3:.1f} ms/step" if m.ok else f"failed: {m.reason}")
            console.print(f"profiled {_layout(plan)} {plan.recompute}: {what}")
    return ProfilingEvaluator(result.model, _launcher(args, console, result.hardware, again),
                              steps=args.profile_steps, warmup=args.profile_warmup,
                              timeout_s=args.profile_timeout, memory_cap_gib=args.memory_cap_gib,
                              on_result=show, device=device)


def calibrate_from(run_dir: Path, write: bool, console, output: Path | None = None,
                   as_name: str | None = None) -> dict:
    """Fit the run's hardware constants to its measured step times (needs >= 2 measured rows) and
    write them as the run's hardware preset, or as a new one named ``as_name`` (``--as``: it was
    ignored, so the fit took the place of the run's GPU in your preset folder); returns
    ``calibrate.summary`` of the fit."""
    import pandas as pd

    from autoparallel.costmodel import calibrate
    from autoparallel.costmodel.bounds import at_bounds, warn_at_bounds
    from autoparallel.search import run
    result = run.load(run_dir)
    if "measured_step_time_s" not in result.ranked:
        raise UserError(f"{run_dir} has no measurements: run `autoparallel search ... --profile job`")
    rows = result.ranked[result.ranked["measured_step_time_s"].notna()]
    if len(rows) < 2:
        from autoparallel.words import plural
        raise UserError(f"{run_dir} has {plural(len(rows), 'measured layout')}; calibration needs >= 2")
    fitted, before, after = calibrate.fit_measured(result.model, result.hardware,
                                                   rows, rows["measured_step_time_s"])
    console.print(calibrate.fit_heading(f"{result.hardware.name}'s efficiency constants",
                                        f"the {len(rows)} layouts profiled in {Path(run_dir).name}"), highlight=False)
    for name, value in fitted.items():
        console.print(f"  {name}: {getattr(result.hardware.efficiency, name):.4g} -> {value:.4g}")
    hits = at_bounds(fitted, calibrate.MEASURED_FITTED, log=True)
    warn_at_bounds(console, hits)
    console.print(f"mean |error| on {len(rows)} measured layouts: {before:.1f} % -> {after:.1f} %")
    if write:
        path = output or calibrate.user_preset(as_name or result.hardware.name)
        note = (f"{pd.Timestamp.now('UTC').date()}: {len(rows)} profiled layouts of "
                f"{Path(run_dir).name}; mean |error| {before:.1f} % before, {after:.1f} % after"
                + (f"\ncalibrated copy of {result.hardware.name}" if as_name else ""))
        existed = Path(path).exists()
        calibrate.write_block(path, fitted, result.hardware.efficiency, note,
                              f"profiling jobs: {Path(run_dir).name}",
                              source=io.resolve_preset("hardware", result.hardware.name), rename=as_name)
        calibrate.said(console, f"{'replaced' if existed else 'wrote'} {path}"
                       + (f" (use it with --gpu {as_name})" if as_name else ""))
    return calibrate.summary(calibrate.Fit(fitted, before, after, tuple(fitted), (), (), tuple(hits)), len(rows))
