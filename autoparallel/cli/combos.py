"""Flags that have no effect in the combination given are errors naming both (issue 25).

A flag that is silently dropped or clamped lets a user believe a run did what they asked:
``--recompute-num-layers 4 --recompute selective`` prices selective recompute, ``--trials 50``
on a grid search prices every layout, ``--results x --no-save`` writes nothing. Each such
combination is refused here, before any work, in one line that names both flags and what to do.
Optional flags whose default matters only in one mode default to None in the parser, so that
"given" can be told from "left at its default"; ``fill_defaults`` then sets the documented
defaults.
"""

from __future__ import annotations

import argparse

from autoparallel.errors import UserError

# search: the flags only a sampler (optuna) search reads, with their defaults.
OPTUNA_DEFAULTS = {"sampler": "tpe", "trials": 200, "workers": 1, "objectives": "throughput", "seed": 0,
                   "grid_seeds": 5, "storage": None}
RESULTS_DEFAULT = "results"
# search: the flags only --profile job|layer reads, with their defaults.
# search: run inputs a resumed search takes from its run folder (given with --resume: refused),
# defaulting to None in search's parser so that "given" can be told from "left at its default".
RUN_DEFAULTS = {"gpu": "h100-sxm", "space": "training", "strategy": "grid"}
RESUME_KEEPS = ("gpu", "space", "strategy", "tokens", "train_days", "gpu_hour_cost", "fp8_check_steps",
                "fp8_check_settings")
PROFILE_DEFAULTS = {"top_k": 5, "profile_steps": 20, "profile_warmup": 5, "profile_timeout": 600.0,
                    "executor": "local", "ray_address": None, "memory_cap_gib": None, "device": "auto"}


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def given(args: argparse.Namespace, dests) -> list[str]:
    return [d for d in dests if getattr(args, d, None) is not None]


def no_effect(first: str, second: str, why: str) -> UserError:
    return UserError(f"{first} has no effect with {second}: {why}")


def fill_defaults(args: argparse.Namespace, defaults: dict) -> None:
    for dest, value in defaults.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)


def check_results(args: argparse.Namespace) -> None:
    """--results with --no-save is refused (nothing is written); else its default is filled in."""
    if args.no_save and args.results is not None:
        raise no_effect("--results", "--no-save", "nothing is written; drop one of them")
    fill_defaults(args, {"results": RESULTS_DEFAULT})


def check_knobs(args: argparse.Namespace, model) -> None:
    """Layout flags that contradict each other or the model (search and estimate), checked in
    ``KNOB_CHECKS``' order: where several are off, the first of them is the one said."""
    for check in KNOB_CHECKS:
        check(args, model)


def _check_recompute_num_layers(args: argparse.Namespace, model) -> None:
    """--recompute-num-layers counts the layers full recompute covers in each pipeline chunk: it
    needs --recompute full (or a searched recompute) and at most a chunk's layers."""
    layers = getattr(args, "recompute_num_layers", None)
    if layers is None:
        return
    if args.recompute in ("none", "selective"):
        raise no_effect("--recompute-num-layers", f"--recompute {args.recompute}",
                        "it counts the layers full recompute covers; use --recompute full or drop it")
    chunks = (args.pp or 1) * (args.vp or 1)
    chunk = model.num_layers // chunks if args.pp else model.num_layers
    if layers > chunk:
        where = (f"a pipeline chunk of {model.name} with --pp {args.pp}" + (f" --vp {args.vp}" if args.vp else "")
                 if args.pp else f"{model.name}")
        raise UserError(f"--recompute-num-layers {layers} is above the {chunk} layers of {where}; "
                        f"give at most {chunk}")


def _check_recompute_modules(args: argparse.Namespace, model) -> None:
    """--recompute-modules: one set that applies to the model, beside a recompute that reads it;
    normalised to the space's spelling (names joined by one space)."""
    from autoparallel.space import modules_apply
    if (modules := getattr(args, "recompute_modules", None)) is None:
        return
    if args.recompute in ("none", "full"):
        raise no_effect("--recompute-modules", f"--recompute {args.recompute}",
                        "it picks what selective recompute reruns; use --recompute selective or drop it")
    args.recompute_modules = " ".join(modules.replace(",", " ").split())
    if why := modules_apply(args.recompute_modules, model):
        raise UserError(f"--recompute-modules {modules!r}: {why}")


def _check_cp_comm_type(args: argparse.Namespace, model) -> None:
    """A pinned --cp-comm-type the model, its heads, its TE release or --cp 1 cannot run (``cp_kinds``)."""
    from autoparallel.costmodel import cp_kinds
    if (kind := getattr(args, "cp_comm_type", None)) is None:
        return
    release = getattr(args, "transformer_engine_version", None) or ""
    packed = model.finetune is not None and model.finetune.packed_sequence
    if why := cp_kinds.model_refusal(model, kind, release, packed):
        raise UserError(why)
    if args.cp == 1:
        raise no_effect("--cp-comm-type", "--cp 1", "it picks how CP ranks exchange the attention's inputs; "
                        "give --cp 2 or more, or drop it")
    if args.cp and args.tp and (why := cp_kinds.heads_refusal(model, args.tp, args.cp, kind)):
        raise UserError(why)
    if getattr(args, "fp8_attention", None) and (why := cp_kinds.fp8_attention_refusal(kind, release)):
        raise UserError(why)


def _check_pipeline_split(args: argparse.Namespace, model) -> None:
    """An uneven split's first + last stage layers fit the model, and (as Megatron-LM's
    validate_args) none of the split flags goes beside --pipeline-layout."""
    first = getattr(args, "num_layers_in_first_pipeline_stage", None)
    last = getattr(args, "num_layers_in_last_pipeline_stage", None)
    if (first or 0) + (last or 0) > model.num_layers:
        given = " + ".join(f"{name} {n}" for name, n in (("--decoder-first-pipeline-num-layers", first),
                                                           ("--decoder-last-pipeline-num-layers", last)) if n)
        raise UserError(f"{given} is more than the {model.num_layers} layers of {model.name}; "
                        f"give at most {model.num_layers} in all")
    split = [d for d in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                         "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
             if getattr(args, d, None) is not None]
    if split and getattr(args, "pipeline_layout", None):
        names = {"num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
                 "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers"}
        raise no_effect(names.get(split[0], flag(split[0])), "--pipeline-layout",
                        "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments "
                        "(Megatron-LM); drop one")


def _check_fp8_param_gather(args: argparse.Namespace, model) -> None:
    """--fp8-param-gather keeps the weights in FP8, which a BF16 or FP16 --precision has not."""
    precision = getattr(args, "precision", None)
    if getattr(args, "fp8_param_gather", None) and precision is not None and not precision.startswith(("fp8", "mxfp8")):
        raise UserError(f"--fp8-param-gather keeps FP8 weights: it needs an FP8 --precision "
                        f"(fp8-delayed, fp8-current, fp8-blockwise, mxfp8), got --precision {precision}")


def _check_moe_flags_on_dense(args: argparse.Namespace, model) -> None:
    """MoE-only flags on a dense model: the overlap was silently priced as off; the alltoall
    dispatcher (the default) was accepted and did nothing, the others refused only after
    pricing, as "no valid layout"."""
    if getattr(args, "overlap_moe_expert_parallel_comm", None) and not model.is_moe:
        raise UserError(f"--overlap-moe-expert-parallel-comm overlaps the MoE all-to-alls; {model.name} is dense "
                        f"(no experts): drop it")
    if (dispatcher := getattr(args, "moe_token_dispatcher_type", None)) and not model.is_moe:
        raise UserError(f"--moe-token-dispatcher-type {dispatcher} picks how MoE tokens reach their experts; "
                        f"{model.name} is dense (no experts): drop it")


def _check_hybrid_pipeline_layout(args: argparse.Namespace, model) -> None:
    """Megatron-LM's validate_args refuses the flexible layout beside --hybrid-layer-pattern; the
    search refused it per candidate, as counts of reasons under "no valid layout"."""
    if getattr(args, "pipeline_layout", None) and model.is_hybrid:
        raise UserError(f"--pipeline-layout {args.pipeline_layout}: {model.name} is a hybrid Mamba-Transformer, "
                        "whose pipeline stages are '|' marks in its --hybrid-layer-pattern (Megatron-LM: "
                        "\"--pipeline-model-parallel-layout should not be used with --hybrid-layer-pattern\"); drop it "
                        "and pin --pp, --vp or --decoder-first/last-pipeline-num-layers instead")


def _check_shared_expert_overlap(args: argparse.Namespace, model) -> None:
    """--moe-shared-expert-overlap needs shared experts and a dispatcher Megatron-LM runs it
    with, and pins the 1F1B all-to-all overlap off: Megatron runs one or the other."""
    if not getattr(args, "moe_shared_expert_overlap", None):
        return
    if model.shared_expert_ffn_hidden_size == 0:
        raise UserError(f"--moe-shared-expert-overlap runs the shared experts beside the all-to-alls; "
                        f"{model.name} has no shared experts")
    if getattr(args, "moe_token_dispatcher_type", None) == "allgather":
        raise UserError("--moe-shared-expert-overlap only works with the alltoall or flex token dispatcher "
                        "(Megatron-LM), got --moe-token-dispatcher-type allgather")
    if args.overlap_moe_expert_parallel_comm:
        raise UserError("--moe-shared-expert-overlap cannot go with --overlap-moe-expert-parallel-comm "
                        "(Megatron-LM refuses both together); drop one")
    args.overlap_moe_expert_parallel_comm = False


def _check_tp_overlap_rs_pipeline(args: argparse.Namespace, model) -> None:
    """Megatron-LM reads the userbuffers config that picks the pipelined reduce-scatter only under
    --tp-comm-overlap (megatron/training/initialize.py: _initialize_tp_communicators): without it
    the pin does nothing. Refused here, so that search (which would otherwise search
    --tp-comm-overlap) and estimate (which takes it as off) give the same answer."""
    if getattr(args, "tp_overlap_rs_pipeline", None) and not getattr(args, "tp_comm_overlap", None):
        raise no_effect("--tp-overlap-rs-pipeline",
                        "--no-tp-comm-overlap" if args.tp_comm_overlap is False else "no --tp-comm-overlap",
                        "it picks how userbuffers overlap the forward reduce-scatters, which only "
                        "--tp-comm-overlap turns on; add --tp-comm-overlap or drop it")


def _check_fsdp(args: argparse.Namespace, model) -> None:
    """Megatron-FSDP shards the optimizer state itself: --fsdp needs the distributed optimizer."""
    if args.fsdp and args.distributed_optimizer is False:
        raise UserError("--fsdp needs the distributed optimizer (Megatron-FSDP shards the optimizer state "
                        "itself); drop --no-distributed-optimizer")


# check_knobs' checks, in the order their messages take precedence.
KNOB_CHECKS = (_check_recompute_num_layers, _check_recompute_modules, _check_cp_comm_type,
               _check_pipeline_split, _check_fp8_param_gather, _check_moe_flags_on_dense,
               _check_hybrid_pipeline_layout, _check_shared_expert_overlap, _check_tp_overlap_rs_pipeline,
               _check_fsdp)


def check_search(args: argparse.Namespace, knobs: dict) -> None:
    """search: optuna-only flags on a grid search, run inputs with --resume, --results with
    --no-save. ``knobs``: the layout flags given (``common.pins``)."""
    optuna_given = given(args, OPTUNA_DEFAULTS)
    if args.resume:
        from autoparallel.cli.finetune import FINETUNE_DESTS
        pinned = [d for d, v in knobs.items() if v is not None] + given(
            args, ("gbs", "seq_length", "recompute_num_layers", *FINETUNE_DESTS, *RESUME_KEEPS))
        pinned += [d for d in ("all_candidates", "fp8_check") if getattr(args, d, False)]
        for dest in [*optuna_given, *pinned]:
            raise no_effect(flag(dest), "--resume", "a resumed search keeps its own inputs and settings")
        if args.no_save:
            raise no_effect("--no-save", "--resume", "the resumed run folder is always written")
    elif args.strategy in (None, "grid") and optuna_given:
        raise no_effect(flag(optuna_given[0]), "--strategy grid",
                        "only a sampler search reads it; add --strategy optuna or drop it")
    profile_given = given(args, PROFILE_DEFAULTS)
    if args.profile == "none" and profile_given:
        raise no_effect(flag(profile_given[0]), "no --profile", "only a profiled search reads it; add --profile job "
                        "(or layer) or drop it")
    if args.no_save and args.results is not None and getattr(args, "profile", "none") != "layer":
        raise no_effect("--results", "--no-save", "nothing is written; drop one of them")
    if args.resume and args.results is not None and args.profile == "none":
        raise no_effect("--results", "--resume", f"the search goes on in {args.resume}; drop --results")
    if not args.fp8_check:
        for dest in given(args, ("fp8_check_steps", "fp8_check_settings")):
            raise no_effect(flag(dest), "no --fp8-check", "only the FP8 check reads it; add --fp8-check or drop it")


def check_resumed_target(args: argparse.Namespace, inputs: dict, model) -> None:
    """search --resume: a --model or --gpus that is not the run's own is refused."""
    from autoparallel import io
    if args.model is not None and io.load_model(args.model).name != model.name:
        raise no_effect(f"--model {args.model}", f"--resume {args.resume}",
                        f"the run searches {model.name}; drop --model")
    if args.gpus is not None and args.gpus != int(inputs["gpus"]):
        raise no_effect(f"--gpus {args.gpus}", f"--resume {args.resume}",
                        f"the run searches {inputs['gpus']} GPUs; drop --gpus")


def check_json(args: argparse.Namespace) -> None:
    """--wide and --explain shape the terminal tables, which --json replaces (any command)."""
    if getattr(args, "json", False):
        for dest in ("wide", "explain"):
            if getattr(args, dest, False):
                raise no_effect(flag(dest), "--json", "JSON holds every column and no legend; drop one of them")


def check_empty(argv: list[str], args: argparse.Namespace | None = None) -> None:
    """An empty (or blank) value is refused, not taken as the default: ``--model ""`` from an
    unset shell variable must not search the default model. A positional is named by what the
    parse put it in (``export ""``: RUN_DIR; it said "an argument")."""
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=") if token.startswith("--") else ("", "", token)
        if eq and not value.strip():
            raise UserError(f"{name}: expected a value, got an empty string")
        if not eq and not token.strip():
            before = argv[i - 1] if i and argv[i - 1].startswith("-") else _holding(args, token)
            raise UserError(f"{before}: expected a value, got an empty string")


def _holding(args: argparse.Namespace | None, token: str) -> str:
    """The argument the parse put ``token`` in, as its usage shows it (RUN_DIR, LOG), or "an argument"."""
    for dest, value in vars(args or argparse.Namespace()).items():
        if value == token or (isinstance(value, list) and token in value):
            return {"logs": "LOG", "rank": "RUN_DIR of --rank"}.get(dest, dest.upper())
    return "an argument"
