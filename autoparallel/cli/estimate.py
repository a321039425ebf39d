"""``autoparallel estimate``: the prediction for one fully pinned layout."""

from __future__ import annotations

import argparse
import json

from autoparallel.cli import finetune as finetune_flags
from autoparallel.cli.common import add_knobs, add_target, console, inputs, pack_phrases, pins
from autoparallel.errors import UserError
from autoparallel.report import time_to_train

# What estimate assumes for a knob that is not given (search would search it instead).
DEFAULTS = {"vp": 1, "cp": 1, "ep": 1, "etp": 1, "mbs": 1, "recompute": "none", "precision": "bf16",
            "fp8_bf16_edge_layers": 0, "tp_comm_overlap": False, "distributed_optimizer": True,
            "overlap_dp_comm": True, "grad_reduce_in_fp32": True, "flash_attention": True, "fsdp": False,
            "cpu_offloading_num_layers": 0, "overlap_moe_expert_parallel_comm": False,
            "moe_token_dispatcher_type": "alltoall", "fp8_param_gather": False, "precision_aware_optimizer": False,
            "fp8_attention": False, "cuda_graph": "none", "moe_shared_expert_overlap": False,
            "tp_only_amax_red": False, "activation_func_fp8_input_store": False, "param_remainders": False,
            "cross_entropy_loss_fusion": False, "cutedsl_fused_grouped_mlp": False,
            "tp_overlap_rs_pipeline": False, "lora_input_regather": False}


def add_parser(sub) -> None:
    e = sub.add_parser("estimate", help="predict one fully pinned layout")
    add_target(e, required=False)
    add_knobs(e, "layout knobs (--tp and --pp needed; the rest takes estimate's default)",
              "Not given: vp, cp, ep, etp and mbs 1; sp when tp > 1; no recompute; bf16; the distributed "
              "optimizer with overlapped DP communication; gradients reduced in FP32; flash attention; every "
              "other feature off.")
    finetune_flags.add_flags(e)
    e.add_argument("--from-log", metavar="LOG", help="predict the run a Megatron-LM / Megatron-Bridge training "
                   "log describes and show it beside what the log measured (with --gpu)")
    e.add_argument("--json", action="store_true", help="print the estimate as JSON")
    time_to_train.add_flags(e)
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.from_log:
        from pathlib import Path

        from autoparallel.cli.combos import flag, no_effect
        given = [d for d in ("model", "gpus", "gbs", "seq_length", "recompute_num_layers", *pins(args),
                             *finetune_flags.FINETUNE_DESTS) if getattr(args, d) is not None]
        if given:
            raise no_effect(flag(given[0]), "--from-log", "the log states the model and the layout; drop it")

        from autoparallel.runlogs import compare
        from autoparallel.runlogs.runrow import UnreadableLog
        try:
            compare.main(Path(args.from_log), args.gpu, args.json, console)
        except UnreadableLog as exc:  # say which file: "no printed configuration" alone names none
            if args.from_log in str(exc):
                raise
            raise UserError(f"--from-log {args.from_log}: {exc}") from None
        return
    if args.model is None or args.gpus is None:
        raise UserError("estimate needs --model and --gpus (or --from-log LOG)")
    train = time_to_train.from_args(args, args.gpus)
    from autoparallel.costmodel.estimate import estimate_plan
    from autoparallel.space import generate, row_to_plan
    model, hw, gbs, searched = inputs(args)  # the knobs given pinned, the others searched
    if args.tp is None or args.pp is None:
        raise UserError("estimate needs at least --tp and --pp (other knobs default to vp=cp=ep=etp=mbs=1, "
                        "sp when tp>1, no recompute, bf16)")
    if args.recompute_modules and args.recompute is None:  # estimate's default: no recompute
        from autoparallel.cli.combos import no_effect
        raise no_effect("--recompute-modules", "estimate's default --recompute none",
                        "it picks what selective recompute reruns; add --recompute selective")
    from autoparallel.costmodel.cp_kinds import default_kind
    defaults = {**DEFAULTS, "sp": args.tp > 1, "cp_comm_type": default_kind(model)}
    if args.pipeline_layout:  # its virtual stages set vp
        del defaults["vp"]
    pinned = {k: (v if v is not None else defaults.get(k)) for k, v in pins(args).items()}
    if args.fp8_param_gather and args.precision is None:
        raise UserError("--fp8-param-gather keeps FP8 weights: give an FP8 --precision (estimate's default is bf16)")
    space = searched.pinned(**pinned)
    if args.recompute_num_layers is None:
        space = space.pinned(full_recompute_fractions=1.0)
    candidates = generate(model, hw, args.gpus, gbs, space, args.recompute_num_layers)
    if (candidates.reason != "").all():
        from autoparallel.search.diagnose import explain
        raise UserError(explain(candidates, model, hw, args.gpus, gbs, space, pins(args)))
    plan = row_to_plan(candidates[candidates.reason == ""].iloc[0])
    result = estimate_plan(model, hw, plan, space.memory_fraction, space.cost_settings())
    if train is not None:
        result["time_to_train"] = train.record(result["tokens_per_s_per_gpu"])
    where = None if result["fits"] else _where_it_fits(args, model, hw, gbs, searched, space,
                                                       result["peak_memory_gib"])
    if args.json:
        if where is not None:  # the table's line under it, as fields
            more, command = where
            result.update(fits_on_gpus=None if more is None else more.gpus, fits_on_command=command,
                          fits_on_half_need_gib=None if more is None else more.half_need_gib)
        print(json.dumps(result, indent=1))
        return
    _print_estimate(model, hw, result, space.memory_fraction, train)
    if where is not None:
        from autoparallel.report.fit import phrase_lines
        for line in phrase_lines(_fits_line(args.gpus, hw, space, result["peak_memory_gib"], *where),
                                 console.width):  # rich broke it anywhere: "layouts" / "with these flags fit"
            console.print(line, highlight=False, markup=False)


# What each command named under an estimate that does not fit finds at its GPU count.
FITS_SUBJECT = {"search": "layouts with these flags fit", "estimate": "this layout fits"}


def _where_it_fits(args: argparse.Namespace, model, hw, gbs: int, searched, space, need_gib: float):
    """Where an estimate that does not fit would, and the command that goes there: ("search") a
    search with the same flags finds layouts that fit on these GPUs (other knobs than estimate's
    defaults), else ("estimate") the GPU count at which this layout fits (more data-parallel replicas
    shard its state), else ("search") the one at which that search does (``fewest_gpus_that_fit``);
    (None, None) where no count tried fits. One answer for the table's line and the JSON's fields.
    ``searched``: the space with only the knobs given pinned; ``space``: estimate's, every knob pinned."""
    from autoparallel.search.run import fewest_gpus_that_fit
    search = fewest_gpus_that_fit(model, hw, args.gpus, gbs, searched, args.recompute_num_layers, None)
    if search is not None and search.gpus == args.gpus:
        return search, "search"
    more = fewest_gpus_that_fit(model, hw, args.gpus, gbs, space, args.recompute_num_layers, need_gib)
    if more is not None:
        return more, "estimate"
    return search, None if search is None else "search"


def _fits_line(gpus: int, hw, space, need_gib: float, more, command: str | None) -> str:
    """The line under an estimate that does not fit (``_where_it_fits``'s answer), named as
    search's own message names a GPU count (``diagnose.fits_on``)."""
    from autoparallel.search.diagnose import fits_on
    head = (f"does not fit on {gpus} x {hw.name}: {need_gib:.1f} GiB against a limit of "
            f"{space.memory_fraction * hw.memory_gib:.1f} GiB; ")
    if more is None:
        return head + "no larger GPU count tried fits this layout, nor a search with these flags"
    return head + fits_on(more, FITS_SUBJECT[command], command)


def _print_estimate(model, hw, result: dict, memory_fraction: float, train=None) -> None:
    from autoparallel.specs.plan import FP4_PRECISIONS, FP8_PRECISIONS
    from rich.table import Table
    c = result["config"]
    layout = (f"TP{c['tp']} PP{c['pp']} VP{c['vp']} CP{c['cp']} DP{c['dp']}"
              + (f" EP{c['ep']} ETP{c['etp']}" if model.is_moe else ""))
    recompute = f"recompute={c['recompute']}" + (f" ({c['recompute_modules']})" if c["recompute"] == "selective" else "")
    title = [f"{model.name} on {c['tp'] * c['pp'] * c['cp'] * c['dp']} x {hw.name}:", layout,
             f"MBS{c['mbs']} GBS{c['gbs']}", f"seq {model.seq_length}", c["precision"], recompute]
    # Lines of their own (as a table title rich centred it over two), broken between phrases only.
    for line in pack_phrases(title, console.width):
        console.print(line, highlight=False, markup=False)
    t = Table(show_header=False)
    t.add_row("fits", "yes" if result["fits"] else "[red]NO[/red]")
    limit = memory_fraction * hw.memory_gib
    share = f", {memory_fraction:.0%} of {hw.memory_gib:g} GiB" if memory_fraction < 1 else ""
    t.add_row("peak memory", f"{result['peak_memory_gib']:.1f} GiB of {limit:.1f} usable{share}, "
                             f"{hw.reserve_gib:g} GiB reserve included")
    t.add_row("step time", f"{result['step_time_s']:.3f} s")
    t.add_row("tokens/s/GPU", f"{result['tokens_per_s_per_gpu']:,.0f}")
    t.add_row("model TFLOP/s/GPU", f"{result['model_tflops_per_gpu']:.0f}")
    t.add_row("MFU (BF16 peak)", f"{result['mfu']:.1%}")
    if c["precision"] in FP8_PRECISIONS + FP4_PRECISIONS:
        label = "FP4" if c["precision"] in FP4_PRECISIONS else "FP8"
        t.add_row(f"{label} utilisation", f"{result['precision_utilization']:.1%}")
    if train is not None:
        t.add_row("time to train", train.summary(result["tokens_per_s_per_gpu"], None))
    for k, v in result["breakdown"]["time_s"].items():
        t.add_row(f"  time: {k[:-2]}", f"{v:.3f} s")
    for k, v in result["breakdown"]["memory_gib"].items():
        t.add_row(f"  memory: {k[:-4]}", f"{v:.1f} GiB")
    console.print(t)
