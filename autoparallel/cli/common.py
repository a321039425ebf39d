"""What several commands share: the console, the target and layout-knob arguments, progress."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager, nullcontext

from rich.console import Console

from autoparallel import io
from autoparallel.argtypes import non_negative, positive, release
from autoparallel.costmodel.gemm_precision import QUANT_RECIPES

KNOB_FLAGS = ("tp", "pp", "vp", "cp", "ep", "etp", "mbs")
FEATURE_FLAGS = ("sp", "recompute", "precision", "fp8_bf16_edge_layers", "tp_comm_overlap",
                 "distributed_optimizer", "overlap_dp_comm", "grad_reduce_in_fp32", "flash_attention", "fsdp",
                 "cpu_offloading_num_layers", "overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type",
                 "fp8_param_gather", "precision_aware_optimizer", "cuda_graph", "moe_shared_expert_overlap",
                 "fp8_attention", "tp_only_amax_red", "activation_func_fp8_input_store", "param_remainders",
                 "cross_entropy_loss_fusion", "cutedsl_fused_grouped_mlp", "tp_overlap_rs_pipeline", "cp_comm_type",
                 "lora_input_regather")
SETTING_FLAGS = ("pipeline_layout", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                 "transformer_engine_version", "quant_recipe", "num_layers_at_start_in_bf16",
                 "num_layers_at_end_in_bf16", "recompute_modules")
# Never truncate in logs and pipes: a value cut to "fp8-de…" is worse than a wide line. A pipe
# still gets the width ``COLUMNS`` asks for (Rich reads it when ``width`` is None).
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 400)


def add_target(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required,
                   help="preset name or alias (see `autoparallel models`) or a model YAML path")
    p.add_argument("--gpus", type=positive, required=required, help="number of GPUs")
    p.add_argument("--gpu", default="h100-sxm", help="hardware preset or YAML path (default h100-sxm)")


def add_knobs(p: argparse.ArgumentParser, title: str = "layout knobs (any given knob is pinned; the rest is searched)",
              description: str | None = None) -> None:
    """The layout and feature flags; ``title`` / ``description``: what a knob not given becomes.

    One helper per run of related flags, called in the order ``--help`` lists them (argparse
    prints a group's flags in the order they are added, so a theme that ``--help`` lists in two
    places, such as memory, has two helpers)."""
    g = p.add_argument_group(title, description)
    _add_size_knobs(g)
    _add_recompute_knobs(g)
    _add_precision_and_overlap_knobs(g)
    _add_transformer_engine_knobs(g)
    _add_sharding_and_moe_overlap_knobs(g)
    _add_pipeline_split_knobs(g)
    _add_memory_and_kernel_knobs(g)
    p.add_argument("--space", default="training", help="search space preset or YAML path (default training)")


def _add_size_knobs(g) -> None:
    """The parallel sizes, the global batch, the sequence length and SP: the layout's shape, what
    every search varies."""
    for name in KNOB_FLAGS:
        g.add_argument(f"--{name}", type=positive, help=f"pin {name}" + (" (expert tensor parallel, MoE)" if name == "etp" else ""))
    g.add_argument("--gbs", "--global-batch-size", type=positive, dest="gbs",
                   help="global batch size (default: the model preset's; with --finetune, NeMo's fine-tuning "
                        "recipe's: 8 packed sequences, 128 unpacked)")
    g.add_argument("--seq-length", type=positive, metavar="TOKENS",
                   help="training sequence length (default: the model preset's); memory, FLOPs and the CP "
                        "choices follow it, the global batch stays in sequences")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, help="sequence parallel")


def _add_recompute_knobs(g) -> None:
    """Activation recompute: which kind, which modules, how many layers."""
    from autoparallel.specs.plan import RECOMPUTE_CHOICES
    g.add_argument("--recompute", choices=RECOMPUTE_CHOICES,
                   help="activation recompute: selective (modules of a layer: the attention core, and for "
                        "MoE / MLA models the space's recompute_modules sets) or full (whole layers, "
                        "--recompute-num-layers of each chunk)")
    g.add_argument("--recompute-modules", metavar="MODULES",
                   help="pin what selective recompute reruns: one set of Megatron-LM's --recompute-modules, "
                        "quoted, e.g. 'mla_up_proj mhc' (core_attn, mla_up_proj, moe_act, moe, layernorm, mhc); "
                        "needs --recompute selective with estimate")
    g.add_argument("--recompute-num-layers", metavar="N", type=positive,
                   help="layers per pipeline chunk that full recompute covers")


def _add_precision_and_overlap_knobs(g) -> None:
    """The precision recipe and its BF16 edge layers, the TP / DP communication overlaps, the
    optimizer's sharding and gradient reduce type, the attention kernels (flash, FP8)."""
    from autoparallel.specs.plan import PRECISION_CHOICES
    g.add_argument("--precision", choices=PRECISION_CHOICES,
                   help="bf16, fp16, or an FP8 / FP4 recipe (mxfp8 and nvfp4 need Blackwell)")
    g.add_argument("--fp8-bf16-edge-layers", metavar="N", type=non_negative,
                   help="first/last layers kept in BF16 under FP8 or NVFP4")
    g.add_argument("--tp-comm-overlap", action=argparse.BooleanOptionalAction,
                   help="hide the TP all-gathers and reduce-scatters behind the GEMMs (TransformerEngine "
                        "userbuffers; Megatron's --tp-comm-overlap)")
    g.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction,
                   help="shard the optimizer state over the data-parallel ranks (--use-distributed-optimizer)")
    g.add_argument("--overlap-dp-comm", action=argparse.BooleanOptionalAction,
                   help="--overlap-grad-reduce and --overlap-param-gather")
    g.add_argument("--grad-reduce-in-fp32", action=argparse.BooleanOptionalAction,
                   help="reduce the gradients in FP32 (--accumulate-allreduce-grads-in-fp32); off: in BF16 "
                        "(--grad-reduce-in-bf16)")
    g.add_argument("--flash-attention", action=argparse.BooleanOptionalAction,
                   help="fused (flash) attention (--attention-backend auto); off: unfused, the attention scores "
                        "kept in memory")
    g.add_argument("--fp8-attention", action=argparse.BooleanOptionalAction,
                   help="FP8 dot-product attention (--fp8-dot-product-attention; fp8-delayed / fp8-current)")


def _add_transformer_engine_knobs(g) -> None:
    """What the TransformerEngine release and its settings allow: the release, a hybrid model's
    per-module quantization and BF16 layers, the userbuffers pipeline, amax reduction, FP8
    activation store, the fused MoE MLP."""
    g.add_argument("--transformer-engine-version", metavar="X.Y", type=release,
                   help="the TransformerEngine release the run uses (default: a current one); before 1.10 "
                        "(MLPerf v4.0's 1.6) FP8 attention under context parallelism is refused (it runs in "
                        "BF16) and activation offloading is priced one layer at a time; a recipe the "
                        "release lacks is not offered (TE 1.x: delayed scaling only; mxfp8 from 2.0, "
                        "fp8-current 2.2, fp8-blockwise 2.3, nvfp4 2.8); up to 1.10, taken as NeMo 24.09's "
                        "stack, LoRA with vp > 1 is refused (NeMo adds adapters to every virtual chunk from "
                        "2.1.0) and an offloaded layer keeps what that stack does not offload (the SwiGLU "
                        "input, FP8 or CP attention tensors, LoRA adapters' inputs)")
    g.add_argument("--quant-recipe", choices=sorted(QUANT_RECIPES),
                   help="a hybrid model's per-module quantization (Megatron's --kitchen-config-file / "
                        "Megatron-Bridge's quant_recipe): nemotronh-te-quant is the Nemotron-H te_quant.cfg "
                        "(attention and LatentMoE projections BF16, Mamba out_proj MXFP8, the rest the precision)")
    g.add_argument("--num-layers-at-start-in-bf16", type=non_negative,
                   help="a hybrid model's first layers of the pattern kept in BF16 under an FP8 / FP4 recipe")
    g.add_argument("--num-layers-at-end-in-bf16", type=non_negative,
                   help="a hybrid model's last layers of the pattern kept in BF16 (Nemotron 3 Super NVFP4: 14)")
    g.add_argument("--tp-overlap-rs-pipeline", action=argparse.BooleanOptionalAction,
                   help="with --tp-comm-overlap, overlap the forward TP reduce-scatters (proj_fprop, fc2_fprop) "
                        "by TransformerEngine userbuffers' pipeline method: one atomic GEMM whose output is "
                        "reduce-scattered in 4 pieces on 32 / 16 SMs, as NVIDIA's MLPerf LoRA TP4 configs do. "
                        "Default: the ring exchange (the GEMM in TP chunks, each sent as the next is computed)")
    g.add_argument("--lora-input-regather", action=argparse.BooleanOptionalAction,
                   help="LoRA under TP with sequence parallelism: the adapters beside QKV and FC1 keep their "
                        "input's sequence shard and gather it again in the backward (Megatron-Bridge v0.6.0+ "
                        "LoRA.sequence_parallel_input_regather); default: searched both ways where Bridge runs it")
    g.add_argument("--tp-only-amax-red", action=argparse.BooleanOptionalAction,
                   help="reduce the fp8-delayed recipe's amaxes over TP only, not TP x DP (--tp-only-amax-red)")
    g.add_argument("--activation-func-fp8-input-store", action=argparse.BooleanOptionalAction,
                   help="keep the SwiGLU's input for backward in FP8 (TransformerConfig."
                        "activation_func_fp8_input_store; no Megatron-LM flag)")
    g.add_argument("--cutedsl-fused-grouped-mlp", action=argparse.BooleanOptionalAction,
                   help="run MXFP8 MoE experts as TransformerEngine's fused CuTe-DSL grouped MLP (Megatron-Bridge "
                        "cutedsl_fused_grouped_mlp: use_transformer_engine_op_fuser, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1)")


def _add_sharding_and_moe_overlap_knobs(g) -> None:
    """FSDP and activation offloading (memory moved off the GPU), the MoE all-to-all overlaps."""
    g.add_argument("--fsdp", action=argparse.BooleanOptionalAction,
                   help="fully sharded data parallel (Megatron-FSDP optim_grads_params) over dp*cp")
    g.add_argument("--cpu-offloading-num-layers", metavar="N", type=non_negative,
                   help="layers whose activations are offloaded to host memory (pp=1, no recompute)")
    g.add_argument("--overlap-moe-expert-parallel-comm", action=argparse.BooleanOptionalAction,
                   help="1F1B overlap of the MoE all-to-alls (with --delay-wgrad-compute)")
    g.add_argument("--moe-shared-expert-overlap", action=argparse.BooleanOptionalAction,
                   help="run the shared experts beside the dispatch/combine all-to-alls (models with shared "
                        "experts; not with --overlap-moe-expert-parallel-comm)")


def _add_pipeline_split_knobs(g) -> None:
    """Megatron's uneven pipeline split: a layout string or the first / last stage's layers, and
    whether the embedding and the loss count as layers."""
    g.add_argument("--pipeline-layout", metavar="LAYOUT",
                   help="pin Megatron's --pipeline-model-parallel-layout, e.g. 'Et|(tt|)*30mL' (E embedding, t decoder "
                        "layer, m MTP layer, L loss, | between virtual stages); pp*vp = its stages")
    g.add_argument("--decoder-first-pipeline-num-layers", dest="num_layers_in_first_pipeline_stage", type=positive,
                   metavar="N", help="pin the first pipeline stage's layers (Megatron's uneven split)")
    g.add_argument("--decoder-last-pipeline-num-layers", dest="num_layers_in_last_pipeline_stage", type=positive,
                   metavar="N", help="pin the last pipeline stage's layers")
    g.add_argument("--account-for-embedding-in-pipeline-split", action=argparse.BooleanOptionalAction,
                   help="pin the split that counts the embedding as a layer of the first stage")
    g.add_argument("--account-for-loss-in-pipeline-split", action=argparse.BooleanOptionalAction,
                   help="pin the split that counts the loss as a layer of the last stage")


def _add_memory_and_kernel_knobs(g) -> None:
    """What keeps fewer bytes (FP8 weight gather, fused cross-entropy, parameter remainders, BF16
    Adam moments), then CUDA graphs, the MoE dispatcher and the CP exchange."""
    from autoparallel.specs.plan import CP_COMM_TYPE_CHOICES, CUDA_GRAPH_CHOICES, DISPATCHER_CHOICES
    g.add_argument("--fp8-param-gather", action=argparse.BooleanOptionalAction,
                   help="FP8 recipes: keep the weights in FP8 only and all-gather them in FP8 (Megatron's "
                        "--fp8-param-gather; distributed optimizer)")
    g.add_argument("--cross-entropy-loss-fusion", action=argparse.BooleanOptionalAction,
                   help="TransformerEngine's fused cross-entropy: only the BF16 logits are kept "
                        "(--cross-entropy-loss-fusion --cross-entropy-fusion-impl te)")
    g.add_argument("--param-remainders", action=argparse.BooleanOptionalAction,
                   help="the distributed optimizer keeps 16 bits per master weight beside the BF16 weight "
                        "(Apex DistributedFusedAdam store_param_remainders: NeMo 1's distributed_fused_adam)")
    g.add_argument("--precision-aware-optimizer", action=argparse.BooleanOptionalAction,
                   help="Adam's moments in BF16 (--use-precision-aware-optimizer --exp-avg-dtype bf16 "
                        "--exp-avg-sq-dtype bf16; distributed optimizer)")
    g.add_argument("--cuda-graph", choices=CUDA_GRAPH_CHOICES,
                   help="CUDA graphs: per-layer (TransformerEngine, MLPerf's LAYER_CUDA_GRAPH) or the whole "
                        "forward-backward (full_iteration); priced for their static buffers")
    g.add_argument("--moe-token-dispatcher-type", choices=DISPATCHER_CHOICES,
                   help="MoE token dispatcher: NCCL all-to-all, all-gather, or flex (DeepEP / HybridEP)")
    g.add_argument("--cp-comm-type", choices=CP_COMM_TYPE_CHOICES,
                   help="context parallelism's exchange (cp > 1): TE's p2p ring of K/V chunks behind the attention, "
                        "a2a (Ulysses all-to-alls; a TP rank's heads divisible by cp), allgather (K/V gathered, "
                        "exposed) or a2a+p2p (a2a inside groups of --hierarchical-context-parallel-sizes, p2p "
                        "across); default: searched where cp > 1 (estimate: the model's own, p2p for most)")


def add_table_flags(p: argparse.ArgumentParser, explain: bool = True) -> None:
    """--wide (and --explain): the ranked tables fit the terminal by dropping low-priority columns."""
    p.add_argument("--wide", action="store_true",
                   help="every table column, however wide (default: the columns that fit the terminal)")
    if explain:
        p.add_argument("--explain", action="store_true", help="the full legend: every column and code")


def pins(args: argparse.Namespace) -> dict:
    """The knobs given on the command line (None: searched)."""
    return {n: getattr(args, n) for n in KNOB_FLAGS + FEATURE_FLAGS + SETTING_FLAGS}


def inputs(args: argparse.Namespace):
    """Model, hardware, global batch size and the search space with the pinned knobs."""
    from autoparallel.search.run import default_gbs
    from autoparallel.space import load_space
    from autoparallel.cli.combos import check_knobs
    from autoparallel.cli.finetune import with_finetune
    model = with_finetune(with_seq_length(io.load_model(args.model), args.seq_length), args)
    check_knobs(args, model)
    hw = io.load_hardware(args.gpu)
    space = load_space(args.space).pinned(**pins(args))
    return model, hw, default_gbs(model, args.gbs), space


def with_seq_length(model, seq_length: int | None):
    """The model trained at ``seq_length`` tokens per sequence (None: the preset's own). Megatron
    asserts max_position_embeddings >= seq_length, so a model whose position range is stated
    cannot be trained past it; one without (its range is its training length) follows it."""
    import dataclasses

    from autoparallel.errors import UserError
    if seq_length is None or seq_length == model.seq_length:
        return model
    if model.max_position_embeddings is not None and seq_length > model.max_position_embeddings:
        raise UserError(f"--seq-length {seq_length} is above {model.name}'s max_position_embeddings "
                        f"{model.max_position_embeddings}; give at most {model.max_position_embeddings} "
                        "(or a model YAML with a larger max_position_embeddings)")
    return dataclasses.replace(model, seq_length=seq_length)


def status(text: str, quiet: bool):
    """A spinner while something slow runs (nothing with --json)."""
    return nullcontext() if quiet else console.status(text, spinner="dots")


@contextmanager
def progress_bar(description: str, total: int | None):
    """A transient rich progress bar on the console: (progress, task); ``total`` None: a pulse and
    the elapsed time, no count (``progress.transient_progress``)."""
    from autoparallel.progress import transient_progress
    with transient_progress(console) as p:
        yield p, p.add_task(description, total=total)


def trial_progress(total: int | None, quiet: bool, first: str = "starting the study"):
    """A progress bar for sampler trials showing the best feasible throughput so far; until the
    study reports its first count, a pulse described ``first`` (what runs before the trials: the grid
    priced for the seed layouts took a minute under 'trials 0/200')."""
    if quiet:
        return nullcontext()

    @contextmanager
    def bar():
        with progress_bar(first, None) as (p, task):
            def update(done: int, best: float | None) -> None:
                text = "trials" if total else f"trials: {done:,}"  # no total: the bar shows no count
                p.update(task, completed=done, total=total,
                         description=f"{text} (best {best:,.0f} tok/s/GPU)" if best else text)
            yield update
    return bar()


def _two_phase_progress(quiet: bool, waiting: str, counting: str):
    """A transient bar: a pulse described ``waiting`` until the first ``update(done, total)``, then a
    count described ``counting``; nothing with --json or in pipes (``quiet``, not a terminal)."""
    if quiet or not console.is_terminal:
        return nullcontext(None)

    @contextmanager
    def bar():
        with progress_bar(waiting, None) as (p, task):
            def update(done: int, total: int) -> None:
                p.update(task, completed=done, total=total, description=counting)
            yield update
    return bar()


def pricing_progress(quiet: bool):
    """A progress bar while the grid prices its candidates (a pulse while they are generated);
    nothing with --json or in pipes, and transient: it never stays above the table."""
    return _two_phase_progress(quiet, "generating candidate layouts", "pricing candidate layouts")


def simulation_progress(quiet: bool):
    """infer's traffic simulation: a pulse while the steady-state search runs, then a bar over the
    layouts simulated (seconds each under a server scenario); nothing with --json or in pipes."""
    return _two_phase_progress(quiet, "searching serving layouts", "simulating traffic per layout")


def shell_command(words: list[str], width: int = 80, indent: str = "  ") -> str:
    """A command to copy into a shell, indented and broken with `` \\`` continuations so that no
    line passes ``width`` columns (a word longer than the line stays whole)."""
    lines, line = [], indent
    for word in words:
        if line.strip() and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = indent * 2
        line += ("" if line.isspace() else " ") + word
    return "\n".join([*lines, line])


def pack_phrases(phrases: list[str], width: int) -> list[str]:
    """``phrases`` joined by spaces in lines of at most ``width`` columns, broken only between
    phrases ("seq 4096" stays on one line: a terminal's word wrap left "seq" / "4096"); a phrase
    wider than a line gets one of its own."""
    lines: list[str] = []
    for phrase in phrases:
        if lines and len(lines[-1]) + 1 + len(phrase) <= width:
            lines[-1] += " " + phrase
        else:
            lines.append(phrase)
    return lines
