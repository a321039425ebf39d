"""``autoparallel search``: rank every valid training layout (grid) or sample them (Optuna)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from autoparallel.argtypes import non_negative, positive, seed
from autoparallel.cli import combos
from autoparallel.cli import finetune as finetune_flags
from autoparallel.costmodel.finetune import is_lora
from autoparallel.cli.common import (add_knobs, add_table_flags, add_target, console, inputs, pins,
                                     pricing_progress, shell_command, status, trial_progress)
from autoparallel.errors import UserError
from autoparallel.report import time_to_train


def add_parser(sub) -> None:
    from autoparallel.profiling import commands as profiling_commands  # no torch import here
    s = sub.add_parser("search", help="rank every valid training layout")
    add_target(s, required=False)
    add_knobs(s)
    finetune_flags.add_flags(s)
    s.add_argument("--strategy", choices=("grid", "optuna"), default="grid",
                   help="grid prices every candidate (default); optuna samples --trials of them")
    s.add_argument("--sampler", choices=("tpe", "nsga2", "random", "gp"), help="optuna sampler (default tpe)")
    s.add_argument("--trials", type=positive, help="completed trials an optuna search runs (default 200)")
    s.add_argument("--objectives", help="throughput (default), or throughput,memory for a Pareto front")
    s.add_argument("--seed", type=seed, help="sampler seed (default 0)")
    s.add_argument("--storage", help="Optuna storage URL (default: SQLite in the run folder; 'journal' for a "
                                     "journal file, used automatically with --workers > 1)")
    s.add_argument("--workers", type=positive, help="parallel local trial workers (default 1)")
    s.add_argument("--grid-seeds", metavar="N", type=non_negative,
                   help="best grid layouts enqueued as the first trials (default 5; 0: none)")
    s.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the interrupted optuna search of RUN_DIR, or its interrupted --profile (with "
                        "the options it was given: finished jobs picked up, the rest submitted again); "
                        "--profile job profiles a saved run's best layouts anew (see below)")
    s.add_argument("--top", type=positive, default=50,
                   help="best candidates to print, one row per layout (default 50; --json lists them one by one)")
    s.add_argument("--json", action="store_true", help="print the ranked list as JSON")
    add_table_flags(s)
    time_to_train.add_flags(s)
    s.add_argument("--results", help="folder for run folders (default results/)")
    s.add_argument("--no-save", action="store_true", help="do not write a run folder")
    s.add_argument("--all-candidates", action="store_true",
                   help="candidates.csv holds every candidate (default: the best 50,000 feasible ones, "
                        "rejections counted per rule with one example each in rejections.csv)")
    s.add_argument("--fp8-check", action="store_true",
                   help="run `fp8-check` first: drop rejected FP8 recipes, apply their BF16 layers")
    s.add_argument("--fp8-check-steps", metavar="STEPS", type=positive,
                   help="training steps of the FP8 check (default: its YAML)")
    s.add_argument("--fp8-check-settings", metavar="YAML",
                   help="FP8 check settings YAML (default: the shipped fp8_check.yaml)")
    profiling_commands.add_search_args(s)
    s.set_defaults(func=run, **dict.fromkeys(combos.RUN_DEFAULTS))  # given or not: combos.check_search


def run(args: argparse.Namespace) -> None:
    from autoparallel.profiling.commands import check_profiling, confirm_cost, profile_search  # measure, re-rank
    from autoparallel.report import run_folder
    from autoparallel.search import run as runs
    combos.check_search(args, pins(args))  # flags with no effect together: before any work
    combos.fill_defaults(args, {**combos.OPTUNA_DEFAULTS, **combos.PROFILE_DEFAULTS, **combos.RUN_DEFAULTS,
                                "results": combos.RESULTS_DEFAULT})
    shown = None if args.json else console
    if args.profile == "layer" or not (args.no_save or args.resume):
        run_folder.check_root(Path(args.results))  # run folders and layer_profiles.json go there
    if args.resume:
        from autoparallel.profiling import record
        inputs_of_run, model_of_run = runs.load_inputs(Path(args.resume))[:2]
        combos.check_resumed_target(args, inputs_of_run, model_of_run)
        record.restore(args, Path(args.resume))  # an interrupted --profile goes on as it was asked
        check_profiling(args, int(inputs_of_run["gpus"]), model_of_run)
        with trial_progress(None, args.json, "reopening the study") as progress:
            result, run_dir = runs.resume(Path(args.resume), progress, keep_profiled=args.profile == "none")
        confirm_cost(result, args, shown)
        result = profile_search(result, args, shown, run_dir)
        _show(result, args, f"resumed {args.resume}", run_dir)
        return
    if args.model is None or args.gpus is None:
        raise UserError("search needs --model and --gpus (or --resume RUN_DIR)")
    time_to_train.from_args(args, args.gpus)  # a bad combination fails before the search
    model, hw, gbs, space = inputs(args)
    check_profiling(args, args.gpus, model)
    fp8 = _fp8_check_first(args, model, hw, space) if args.fp8_check else None
    if fp8:
        from autoparallel.fp8check.search_filter import restrict_space
        space = restrict_space(space, fp8)
    start = time.perf_counter()
    if args.strategy == "optuna":
        from autoparallel.search.sampler import StudySettings
        settings = StudySettings(sampler=args.sampler, trials=args.trials, objectives=tuple(args.objectives.split(",")),
                                 seed=args.seed, storage=args.storage or "", workers=args.workers,
                                 seeds_from_grid=args.grid_seeds)
        first = (f"pricing the grid for the {args.grid_seeds} best layouts (the first trials)" if args.grid_seeds
                 else "starting the study")
        with trial_progress(args.trials, args.json, first) as progress:
            result, run_dir = runs.optuna_search(model, hw, args.gpus, gbs, space, settings,
                                                 None if args.no_save else Path(args.results), sys.argv, progress)
        elapsed = time.perf_counter() - start
        confirm_cost(result, args, shown)
        result = profile_search(result, args, shown, run_dir)
        _show(result, args, f"{args.trials} {args.sampler} trials in {elapsed:.1f} s", run_dir)
        return
    with pricing_progress(args.json) as progress:
        result = runs.search(model, hw, args.gpus, gbs, space, args.recompute_num_layers, fp8_decisions=fp8,
                             pinned=pins(args), progress=progress)
    elapsed = time.perf_counter() - start
    result.train = time_to_train.from_args(args, result.gpus)
    confirm_cost(result, args, shown)
    run_dir = None
    if not args.no_save:  # before profiling: an interrupted profiling is resumed from it
        with status(f"writing the run folder ({len(result.ranked):,} candidates)...", args.json):
            run_dir = runs.save(result, Path(args.results), sys.argv, all_candidates=args.all_candidates)
    result = profile_search(result, args, shown, run_dir, summarise=not args.all_candidates)
    _show(result, args, f"{len(result.ranked):,} candidates in {elapsed:.2f} s", run_dir)


def _show(result, args: argparse.Namespace, how: str, run_dir: Path | None) -> None:
    train = result.train = time_to_train.from_args(args, result.gpus)
    if args.json:
        records = result.records(args.top)
        for r in records if train else ():
            r["time_to_train"] = train.record(r["tokens_per_s_per_gpu"])
        print(json.dumps(records, indent=1))
        return
    where = "" if args.no_save else "; all in the run folder's ranked.md"
    print_table(result, args.top, where, f" ({how})", args.wide, args.explain)
    if run_dir:
        _next_steps(result, run_dir)


def print_table(result, top: int, where: str, how: str = "", wide: bool = False, explain: bool = False) -> None:
    """A search's ranked table on the terminal, its title counting the feasible candidates and the
    layouts the top ones are, one row each ("top 5 of N feasible" over 3 rows read as a miscount;
    ``how``: how they were found, appended to it), as ``search`` and ``report`` print it."""
    from autoparallel.report.tables import print_ranked
    feasible = len(result.feasible)

    def title(layouts: int) -> str:
        return (f"{result.model.name} on {result.gpus} x {result.hardware.name}, gbs {result.gbs}, "
                f"seq {result.model.seq_length}: top {min(top, feasible)} of {feasible:,} feasible candidates "
                f"in {layouts} layout{'' if layouts == 1 else 's'}{how}")
    print_ranked(result.ranked, title, top, console, result.hardware, result.space.memory_fraction, wide, explain,
                 where, result.train, model=result.model)


def _next_steps(result, run_dir: Path) -> None:
    """Where the run was written and how to export and launch its rank-1 plan, as commands that
    copy into a shell and read in 80 columns."""
    from autoparallel.report.shared import (TOKENIZER_FILES, hybrid_unsupported, megatron_unsupported, node_layout,
                                            node_layout_text)
    from autoparallel.report.run_folder import TRAIN_SCRIPT
    export = ["autoparallel", "export", str(run_dir), "--rank", "1", "--format"]
    if is_lora(result.model):
        console.print(f"run folder: {run_dir}\n"
                      "rank 1 as a NeMo 2 LoRA fine-tuning recipe (or --format nemo2-yaml, yaml):\n"
                      + shell_command([*export, "nemo2"]), soft_wrap=True)
        return
    if why := hybrid_unsupported(result.model):
        console.print(f"run folder: {run_dir}\n" + _prose(f"rank 1's plan and predictions (no Megatron-LM flags or "
                                                           f"train.sh: {why}):") + "\n"
                      + shell_command([*export, "yaml"]), soft_wrap=True)
        return
    if megatron_unsupported(result.plan(1)):
        console.print(f"run folder: {run_dir}\n"
                      + _prose("rank 1 as a NeMo 2 recipe (or --format nemo, nemo2-yaml, yaml; Megatron-LM has no "
                               "flag for its FP8 attention):") + "\n" + shell_command([*export, "nemo2"]), soft_wrap=True)
        return
    nodes = node_layout(result.gpus, result.hardware.gpus_per_node)[0]
    names = ["MEGATRON_LM", "DATA_PATH", "CHECKPOINT_DIR", *TOKENIZER_FILES.get(result.model.tokenizer_type, {}).values()]
    launch = ["sbatch" if nodes > 1 else "bash", str(run_dir / TRAIN_SCRIPT)]
    console.print(f"run folder: {run_dir}\n"
                  + _prose("rank 1 as Megatron-LM flags (or --format launch, " + _other_formats(result) + "):") + "\n"
                  + shell_command([*export, "megatron"]) + "\n"
                  f"launch rank 1 on {node_layout_text(result.gpus, result.hardware.gpus_per_node)}:\n"
                  + shell_command([*(f"{n}=..." for n in names), *launch]), soft_wrap=True)


def _other_formats(result) -> str:
    """The export formats besides megatron that rank 1 takes: NeMo's only where they can state it."""
    from autoparallel.report.shared import nemo_unsupported
    if result.model.is_hybrid:
        return "yaml; best.yaml holds its Megatron-Bridge provider"
    plan = result.plan(1)
    if nemo_unsupported(plan, result.model):  # NVFP4, LoRA's input re-gather: export would refuse --format nemo*
        return ("yaml; best.yaml holds its Megatron-Bridge LoRA" if plan.lora_input_regather
                else "yaml; NeMo cannot state NVFP4")
    return "nemo, nemo2, nemo2-yaml, yaml"


def _prose(text: str, width: int = 80) -> str:
    """``text`` broken at spaces into lines of at most ``width`` columns, as ``shell_command``
    breaks the commands under it (a reason can run to 400 columns)."""
    import textwrap
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


def _fp8_check_first(args: argparse.Namespace, model, hw, space) -> dict:
    """Run ``fp8-check`` on the model for the space's FP8 / FP4 recipes this GPU runs (mxfp8 and
    nvfp4 on Blackwell only); its decisions restrict the search (issue 7)."""
    from autoparallel.cli.fp8_check import print_check_result
    from autoparallel.fp8check.command import CHECKABLE, check_and_save, settings_from_flags
    from autoparallel.fp8check.search_filter import decisions_from_check
    from autoparallel.space import unsupported_precisions
    lacking = unsupported_precisions(hw)
    recipes = ",".join(dict.fromkeys(p for p in space.precision if p in CHECKABLE and p not in lacking))
    if not recipes:
        return {}
    settings = settings_from_flags(args.fp8_check_settings, args.fp8_check_steps, recipes,
                                   flag="--fp8-check-settings")
    result, check_dir = check_and_save(model, settings, None if args.no_save else Path(args.results),
                                       sys.argv, None if args.json else console)
    if not args.json:
        print_check_result(result, check_dir, "fp8-check folder")
    return decisions_from_check(result)
