"""Megatron-LM's own checks on every export of the searches below (issues 13 and 14).

For each search (dense presets, every FP8 recipe, recompute, context parallelism, BF16 edge
layers, fp16, GB200 trays) the top ``--top`` plans are exported as ``train.sh``; bash evaluates
the script's argument arrays and environment exactly as a user's shell would, and Megatron-LM's
``parse_args``, ``validate_args``, ``core_transformer_config_from_args`` (TransformerConfig and
its ``__post_init__`` checks) and its micro-batch calculator run on them. The result must also
be the model the preset describes and the layout that was priced (checked field by field).
A plan Megatron-LM has no flag for (FP8 dot-product attention, issue 27) is refused by the export
and listed as such; a control shows Megatron-LM's parser refusing the flag autoparallel once wrote.

    python benchmarks/bench_megatron_args.py --megatron PATH_TO_MEGATRON_LM [--top 3]

PATH needs megatron/training/arguments.py and megatron/core (a checkout, or the snapshot
benchmarks/RESULTS.md describes). GPU-only pieces are stubbed; ``STUBS`` lists them and the
output repeats the list.
"""

from __future__ import annotations

import argparse
import contextlib
import io as stdio
import os
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path

from autoparallel import io
from autoparallel.report import moe_export
from autoparallel.report.launch import train_script
from autoparallel.report.shared import cp_comm_type, hierarchical_cp_sizes, megatron_unsupported
from autoparallel.search import run as runs
from autoparallel.space import load_space
from autoparallel.specs.plan import Plan

# (model, GPUs, GPU, pinned knobs); gbs is the preset's unless pinned.
SEARCHES = [
    ("gpt3-175b", 1024, "h100-sxm", {}),
    ("gpt3-175b", 512, "h100-sxm", {"precision": "fp8-delayed"}),
    ("gpt3-5b", 64, "h100-sxm", {}),
    ("gpt3-20b", 64, "h100-sxm", {"precision": "fp8-current"}),
    ("llama2-7b", 8, "h100-sxm", {"grad_reduce_in_fp32": False}),
    ("llama2-13b", 16, "h100-sxm", {"precision": "fp8-delayed"}),
    ("llama2-70b", 64, "h100-sxm", {"recompute": "full"}),
    ("llama3-8b", 8, "h100-sxm", {"cp": 2}),
    ("llama3-70b", 64, "h100-sxm", {"cp": 2, "precision": "fp8-delayed"}),
    ("llama3-70b", 128, "h100-sxm", {"precision": "fp8-current", "fp8_bf16_edge_layers": 1}),
    ("llama3.1-405b", 576, "h100-sxm", {"precision": "fp8-delayed", "pp": 9}),  # NeMo: PP9 over 126 layers
    ("nemotron-15b", 64, "h100-sxm", {"precision": "fp8-delayed"}),
    ("nemotron-340b", 128, "h100-sxm", {"precision": "fp8-current"}),
    ("llama3-70b", 64, "b200", {"precision": "mxfp8", "tp_comm_overlap": True}),
    ("gpt3-175b", 256, "b200", {"precision": "fp8-blockwise"}),
    ("llama2-70b", 64, "a100-sxm-80g", {"recompute": "selective"}),
    ("gpt3-175b", 128, "a100-sxm-80g", {"precision": "fp16", "recompute": "full"}),
    ("llama3-8b", 16, "gb200", {"precision": "fp8-current", "fp8_bf16_edge_layers": 2}),
    ("llama3-70b", 64, "gb200", {"cp": 4}),
    ("llama3-8b", 12, "h100-sxm", {"gbs": 120}),
    ("llama3.1-405b", 1024, "h100-sxm", {}),  # 126 layers: embedding and loss counted as layers
    ("llama3-70b", 64, "gb200", {"fsdp": True, "cpu_offloading_num_layers": 20}),
    # MoE (issue 14): expert parallel, expert TP, grouped GEMMs, shared experts, MLA, layouts
    ("mixtral-8x7b", 64, "h100-sxm", {"ep": 8}),
    ("mixtral-8x22b", 256, "b200", {"precision": "fp8-delayed", "etp": 2}),
    ("qwen3-30b-a3b", 16, "h100-sxm", {"precision": "fp8-current"}),
    ("qwen3-235b-a22b", 256, "gb200", {"ep": 32}),
    ("deepseek-v3", 256, "b200", {"precision": "mxfp8"}),
    ("deepseek-v3", 1024, "h100-sxm", {"pp": 8, "vp": 4}),  # 61 layers on 32 chunks: a flexible layout
    ("gpt-oss-120b", 64, "h100-sxm", {}),
    ("gpt-oss-20b", 8, "b200", {"ep": 8}),  # session 49: gpt-oss-120b's layer, 32 experts
    ("glm-5", 256, "gb200", {"pp": 4}),  # session 49: MLA + DSA on every layer (--experimental-attention-variant dsa)
    ("kimi-k2", 512, "b200", {"precision": "mxfp8"}),
    ("mixtral-8x7b", 64, "h100-sxm", {"precision": "fp8-delayed"}),  # no moe_act recompute (item 6)
    # Issue 23: the memory knobs of NVIDIA's recipes (MLPerf GPT-3's layer CUDA graphs).
    ("gpt3-175b", 512, "h100-sxm", {"precision": "fp8-delayed", "fp8_param_gather": True,
                                    "precision_aware_optimizer": True, "cuda_graph": "layer"}),
    ("llama3-70b", 64, "b200", {"precision": "mxfp8", "fp8_param_gather": True, "cuda_graph": "full_iteration"}),
    ("llama3.1-8b", 512, "gb200", {"precision": "nvfp4"}),
    ("llama3.1-405b", 512, "gb200", {"precision": "nvfp4", "fp8_bf16_edge_layers": 2}),
    # Issue 27: FP8 dot-product attention (--fp8-attention), under both FP8 recipes that allow it.
    ("llama3-70b", 64, "h100-sxm", {"precision": "fp8-delayed", "fp8_attention": True}),
    ("llama3-8b", 8, "h100-sxm", {"precision": "fp8-current", "fp8_attention": True}),
    # Session 51: context parallelism's kinds (--cp-comm-type; a2a+p2p with --hierarchical-context-parallel-sizes).
    ("llama3-70b", 64, "h100-sxm", {"cp": 2, "tp": 4, "cp_comm_type": "a2a"}),
    ("llama3-8b", 8, "h100-sxm", {"cp": 2, "cp_comm_type": "allgather"}),
    ("llama3-70b", 64, "h100-sxm", {"cp": 4, "tp": 1, "cp_comm_type": "a2a+p2p"}),
]
ARCH = {"a100-sxm-80g": 8, "h100-sxm": 9, "h200": 9, "b200": 10, "gb200": 10, "gb300": 10}  # CUDA compute capability
TE_VERSION = "2.9.0"  # the TransformerEngine megatron-core 0.15 is built against (its [dev] extra)
STUBS = (
    "megatron/training/__init__.py: not run (it imports the whole training loop); the package is "
    "registered without it",
    "megatron/training/utils.py: replaced by update_use_dist_ckpt, print_rank_0, warn_rank_0 (copied), is_rank0 "
    "and get_device_arch_version (a CUDA query) returning the hardware preset's compute capability",
    f"megatron.core.utils TransformerEngine version: {TE_VERSION} (TE is GPU-only and not installed)",
    "megatron.core.models.common.embeddings.rope_utils.fused_apply_rotary_pos_emb: a placeholder "
    "(the fused RoPE kernel comes from TE)",
    "torch.cuda.get_device_capability (validate_args asks it for --moe-grouped-gemm): the hardware "
    "preset's compute capability",
    "triton, when not installed (a CPU machine; Megatron-Core's Triton kernels import it at module level): "
    "every triton module a stand-in package whose attributes are no-op decorators, installed after torch's "
    "compiler has found triton absent; no argument check calls a kernel",
    "typing.override on Python < 3.12 (newer Megatron-LM imports it): typing_extensions.override",
    "megatron.core.transformer.moe.moe_utils fused permutation kernels (fused_permute, "
    "fused_permute_with_probs, fused_sort_chunks_by_index(_with_probs), fused_unpermute): placeholders "
    "(TE >= 2.1.0 provides them; TransformerConfig checks they exist for --moe-permute-fusion)",
)
FUSED_PERMUTATION = ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                     "fused_sort_chunks_by_index_with_probs", "fused_unpermute")
PLACEHOLDERS = {"MEGATRON_LM": "/megatron", "DATA_PATH": "/data/corpus_text_document",
                "CHECKPOINT_DIR": "/checkpoints", "VOCAB_FILE": "/tokenizer/gpt2-vocab.json",
                "MERGE_FILE": "/tokenizer/gpt2-merges.txt", "TOKENIZER_MODEL": "/tokenizer/tokenizer.model"}
_ARCH = {"value": 9}


class _Stand_in(types.ModuleType):
    """A module whose every attribute is a no-op decorator (``_no_op``)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _no_op


def _no_op(*args, **kwargs):
    return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _no_op


def stand_in_triton() -> None:
    """Megatron-Core d98e8a64dd imports triton at module level (paged stash, the SSM and GDN kernels); on a
    machine without it every ``triton`` module becomes a stand-in package. torch's compiler modules are
    imported first, so torch still finds triton absent."""
    import importlib
    import importlib.abc
    import importlib.machinery
    import importlib.util
    if importlib.util.find_spec("triton") is not None:
        return
    for name in ("functorch.compile", "torch._dynamo", "torch._inductor.compile_fx"):
        importlib.import_module(name)  # torch decides, before the stand-in, that triton is absent

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = _Stand_in(spec.name)
            module.__path__, module.__version__ = [], "3.4.0"
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


def load_megatron(root: Path):
    """Megatron-LM's argument module and micro-batch calculator, with the GPU-only pieces stubbed."""
    sys.path.insert(0, str(root))
    stand_in_triton()
    import typing
    if not hasattr(typing, "override"):
        import typing_extensions
        typing.override = typing_extensions.override
    import megatron
    training = types.ModuleType("megatron.training")
    training.__path__ = [str(root / "megatron" / "training")]
    utils = types.ModuleType("megatron.training.utils")

    def update_use_dist_ckpt(args):
        args.use_dist_ckpt = args.ckpt_format != "torch"

    def print_rank_0(message, rank=None):
        if rank is None or rank == 0:
            print(message, flush=True)

    def warn_rank_0(message, rank=None):
        if rank is None or rank == 0:
            warnings.warn(message)

    utils.update_use_dist_ckpt, utils.print_rank_0, utils.warn_rank_0 = update_use_dist_ckpt, print_rank_0, warn_rank_0
    utils.get_device_arch_version = lambda: _ARCH["value"]
    utils.is_rank0 = lambda: True  # newer validate_args asks it (one process here)
    sys.modules["megatron.training"], sys.modules["megatron.training.utils"] = training, utils
    megatron.training = training
    from packaging.version import Version

    import megatron.core.utils as core_utils
    core_utils._te_version = Version(TE_VERSION)
    from megatron.core.models.common.embeddings import rope_utils
    rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
    from megatron.core.transformer.moe import moe_utils
    for name in FUSED_PERMUTATION:
        setattr(moe_utils, name, lambda *a, **k: None)
    import torch
    torch.cuda.get_device_capability = lambda *a, **k: (_ARCH["value"], 0)
    from megatron.core import num_microbatches_calculator as microbatches
    from megatron.training import arguments
    return arguments, microbatches


def script_argv_env(script: str) -> tuple[list[str], dict[str, str]]:
    """The pretrain_gpt.py arguments and exported variables of train.sh, as bash expands them."""
    body = script.split("\ntorchrun ")[0].split("\nMASTER_ADDR=")[0]
    printer = ('for a in "${MODEL_ARGS[@]}" "${TOKENIZER_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${PRECISION_ARGS[@]}" '
               '"${DATA_ARGS[@]}" "${CHECKPOINT_ARGS[@]}" "${TRAINING_ARGS[@]}"; do printf "%s\\0" "$a"; done; '
               'printf "ENV\\0"; env -0')
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(body + "\n" + printer + "\n")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    out = subprocess.run(["bash", f.name], capture_output=True, text=True, check=True,
                         env={**env, **PLACEHOLDERS}).stdout
    Path(f.name).unlink()
    argv, _, environment = out.partition("ENV\0")
    exported = dict(item.split("=", 1) for item in environment.split("\0") if "=" in item)
    return argv.split("\0")[:-1], {k: exported[k] for k in ("CUDA_DEVICE_MAX_CONNECTIONS",) if k in exported}


# Megatron-LM after the CUDA-graph refactor (4c2022d6c0, "decompose cuda_graph_scope into
# full_iteration impl ... and per-layer capture modules") migrates the exports' 0.15 spelling:
# --cuda-graph-scope full -> whole-layer capture (empty cuda_graph_modules), and
# --cuda-graph-impl local --cuda-graph-scope full_iteration -> --cuda-graph-impl full_iteration.
CUDA_GRAPHS_MIGRATED = {"none": {"cuda_graph_impl": "none"},
                        "layer": {"cuda_graph_impl": "transformer_engine", "cuda_graph_modules": []},
                        "full_iteration": {"cuda_graph_impl": "full_iteration", "cuda_graph_modules": []}}


def expected(model, plan, graph_modules: bool = False) -> dict:
    """What Megatron must end up with: the preset's model and the priced layout
    (``graph_modules``: a Megatron-LM that has ``cuda_graph_modules``, so the migrated spelling)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.activations import squared_relu

    from autoparallel.report.shared import CUDA_GRAPHS
    activation = {"swiglu": F.silu, "gelu": F.gelu, "squared_relu": squared_relu}[model.activation]
    fp8 = None
    if plan.is_fp8:
        from autoparallel.report.export import FP8_RECIPES
        fp8 = FP8_RECIPES[plan.precision]
    chunk = model.num_layers // (plan.pp * plan.vp)
    return {
        "config.num_layers": model.num_layers, "config.hidden_size": model.hidden_size,
        "config.ffn_hidden_size": model.ffn_hidden_size, "config.num_attention_heads": model.num_attention_heads,
        "config.num_query_groups": model.query_groups, "config.kv_channels": model.head_dim,
        "config.add_bias_linear": model.add_bias_linear, "config.hidden_dropout": model.hidden_dropout,
        "config.attention_dropout": model.attention_dropout, "config.gated_linear_unit": model.gated_mlp,
        "config.activation_func": activation, "config.layernorm_epsilon": model.norm_epsilon,
        "config.normalization": {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[model.normalization],
        "config.layernorm_zero_centered_gamma": model.layernorm_zero_centered_gamma,
        "args.position_embedding_type": model.position_embedding_type, "args.rotary_base": model.rotary_base,
        "args.rotary_percent": model.rotary_percent, "args.use_rope_scaling": bool(model.rope_scaling_factor),
        "args.untie_embeddings_and_output_weights": not model.tie_embeddings,
        "args.tokenizer_type": model.tokenizer_type,
        "config.tensor_model_parallel_size": plan.tp, "config.pipeline_model_parallel_size": plan.pp,
        "config.context_parallel_size": plan.cp, "args.data_parallel_size": plan.dp,
        "config.virtual_pipeline_model_parallel_size": plan.vp if plan.vp > 1 else None,
        "config.sequence_parallel": plan.sp and plan.tp > 1, "args.micro_batch_size": plan.mbs,
        "config.recompute_granularity": None if plan.recompute == "none" else plan.recompute,
        "config.recompute_num_layers": (plan.recompute_num_layers or chunk) if plan.recompute == "full" else None,
        "config.bf16": plan.precision != "fp16", "config.fp16": plan.precision == "fp16",
        "args.accumulate_allreduce_grads_in_fp32": plan.grad_reduce_in_fp32,
        "args.use_distributed_optimizer": plan.distributed_optimizer,
        "args.overlap_grad_reduce": plan.overlap_grad_reduce, "args.overlap_param_gather": plan.overlap_param_gather,
        "config.tp_comm_overlap": plan.tp_comm_overlap, "config.fp8": fp8.fp8_format if fp8 else None,
        "config.fp8_dot_product_attention": False,  # no flag sets it; a plan with it is refused
        "config.fp4": "e2m1" if plan.is_fp4 else None, **({"config.fp4_recipe": "nvfp4"} if plan.is_fp4 else {}),
        "config.fp8_param": plan.fp8_param_gather, "args.fp8_param_gather": plan.fp8_param_gather,
        "args.use_precision_aware_optimizer": plan.precision_aware_optimizer,
        **({"args.exp_avg_dtype": torch.bfloat16, "args.exp_avg_sq_dtype": torch.bfloat16}
           if plan.precision_aware_optimizer else {}),
        **{f"config.{key}": value
           for key, value in (CUDA_GRAPHS_MIGRATED if graph_modules else CUDA_GRAPHS)[plan.cuda_graph].items()},
        **({"config.fp8_recipe": fp8.megatron_recipe} if fp8 else {}),
        "config.first_last_layers_bf16": bool(plan.fp8_bf16_edge_layers) and plan.is_quantized,
        **({"config.num_layers_at_start_in_bf16": plan.fp8_bf16_edge_layers} if plan.fp8_bf16_edge_layers else {}),
        **({"config.cp_comm_type": cp_comm_type(model, plan)} if plan.cp > 1 else {}),
        "config.hierarchical_context_parallel_sizes": hierarchical_cp_sizes(model, plan),
        "config.num_layers_in_first_pipeline_stage": plan.num_layers_in_first_pipeline_stage or None,
        "config.num_layers_in_last_pipeline_stage": plan.num_layers_in_last_pipeline_stage or None,
        "config.account_for_embedding_in_pipeline_split": plan.account_for_embedding_in_pipeline_split,
        "config.account_for_loss_in_pipeline_split": plan.account_for_loss_in_pipeline_split,
        "args.use_megatron_fsdp": plan.fsdp,
        "config.cpu_offloading": plan.cpu_offloading_num_layers > 0,
        "config.cpu_offloading_num_layers": plan.cpu_offloading_num_layers,
        "num_microbatches": plan.num_microbatches,
        **{f"config.{key}": value for key, value in moe_export.config_keys(model, plan).items()},
    }


def expected_hybrid(model, plan) -> dict:
    """A hybrid model's fields (``report.hybrid_export``): the pattern with its | marks, the Mamba-2
    mixer, and the stages the marks state instead of the split flags (vp from the marks)."""
    from autoparallel.report.hybrid_export import layer_pattern
    if not model.is_hybrid:
        return {}
    return {"args.hybrid_layer_pattern": layer_pattern(model, plan), "config.is_hybrid_model": True,
            "config.mamba_num_heads": model.mamba_heads, "config.mamba_head_dim": model.mamba_head_dim,
            "config.mamba_state_dim": model.mamba_state_dim, "config.mamba_num_groups": model.mamba_num_groups,
            "config.moe_latent_size": model.moe_latent_size,
            "config.num_layers_in_first_pipeline_stage": None, "config.num_layers_in_last_pipeline_stage": None,
            "config.account_for_embedding_in_pipeline_split": False,
            "config.account_for_loss_in_pipeline_split": False}


def hybrid_model_config(arguments, args, model) -> str:
    """'' if pretrain_hybrid.py's model config (argument_utils.hybrid_config_from_args) builds
    from the parsed arguments with the model's pattern, else the problem."""
    from megatron.training.argument_utils import hybrid_config_from_args
    args.vocab_size = args.vocab_size or model.vocab_size
    cfg = hybrid_config_from_args(args)
    return "" if cfg.hybrid_layer_pattern == args.hybrid_layer_pattern else (
        f"HybridModelConfig.hybrid_layer_pattern={cfg.hybrid_layer_pattern!r}")


def hybrid_stages(model, plan, pattern: str) -> str:
    """'' if Megatron-Core's select_pipeline_segment gives each (pp rank, vp stage) of ``plan`` the
    layers the cost model priced there (``pipeline.virtual_stage_sizes``, in model order), else
    the first difference. torch.distributed's rank queries answer for the rank asked about."""
    import torch.distributed as dist
    from megatron.core.models.hybrid import hybrid_layer_allocation as allocation

    from autoparallel.costmodel import pipeline
    sizes = pipeline.virtual_stage_sizes(model.num_layers, plan.pp, plan.vp, plan.num_layers_in_first_pipeline_stage,
                                         plan.num_layers_in_last_pipeline_stage,
                                         plan.account_for_embedding_in_pipeline_split,
                                         plan.account_for_loss_in_pipeline_split)
    saved = dist.get_rank, dist.get_world_size, dist.is_initialized
    try:
        for stage, size in enumerate(sizes):
            rank, chunk = stage % plan.pp, stage // plan.pp
            dist.get_rank, dist.get_world_size = (lambda group=None: rank), (lambda group=None: plan.pp)
            dist.is_initialized = lambda: True
            layers, offset = allocation.select_pipeline_segment(pattern.split("/")[0], object() if plan.pp > 1 else None,
                                                                chunk if plan.vp > 1 else None)
            start = sum(sizes[:stage])
            if offset != start or "".join(layers) != model.hybrid_layer_pattern[start:start + size]:
                return (f"rank {rank} vp stage {chunk}: Megatron builds {''.join(layers)!r} at {offset}, priced "
                        f"{model.hybrid_layer_pattern[start:start + size]!r} at {start}")
    finally:
        dist.get_rank, dist.get_world_size, dist.is_initialized = saved
    return ""


def check(arguments, microbatches, model, plan, argv: list[str], env: dict) -> tuple[str, str]:
    """(stage reached, problem) for one export: '' when Megatron accepts it as the same model and layout."""
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(env, WORLD_SIZE=str(plan.num_gpus), RANK="0")
    sys.argv = ["pretrain_gpt.py", *argv]
    sink = stdio.StringIO()
    stage = "parse_args"
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = arguments.parse_args()
            stage = "validate_args"
            args = arguments.validate_args(args)
            stage = "TransformerConfig"
            config = arguments.core_transformer_config_from_args(args)
            if model.is_hybrid and args.hybrid_layer_pattern:  # (without it, the fields below differ)
                stage = "HybridModelConfig"
                if problem := hybrid_model_config(arguments, args, model):
                    return stage, problem
                stage = "select_pipeline_segment"
                if problem := hybrid_stages(model, plan, args.hybrid_layer_pattern):
                    return stage, problem
            stage = "microbatches"
            microbatches.destroy_num_microbatches_calculator()
            microbatches.init_num_microbatches_calculator(0, None, args.global_batch_size, args.micro_batch_size,
                                                          args.data_parallel_size)
    except (SystemExit, Exception) as e:  # noqa: BLE001 - any refusal is the result
        text = str(e) if not isinstance(e, SystemExit) else sink.getvalue().strip().splitlines()[-1]
        return stage, f"{type(e).__name__}: {text}"[:200]
    got = {"num_microbatches": microbatches.get_num_microbatches()}
    wrong = []
    want_all = {**expected(model, plan, hasattr(config, "cuda_graph_modules")), **expected_hybrid(model, plan)}
    for key, want in want_all.items():
        if key != "num_microbatches":
            scope, name = key.split(".")
            value = getattr(config if scope == "config" else args, name)
            got[key] = list(value) if isinstance(value, tuple) else value  # the exports' YAML lists
        if got[key] != want:
            wrong.append(f"{key}={got[key]!r} (want {want!r})")
    return "model+layout", "; ".join(wrong)


def exports(top: int, short_run: int | None = None):
    """(label, model, plan, hw, train.sh) of the top plans of every search, then two plans with
    knobs set by hand (explicit first/last stage sizes, Megatron-FSDP, activation offloading).
    ``short_run``: the profiling run of that many iterations that ``--trainer megatron`` submits
    (issue 26) instead of the export's train.sh."""
    space = load_space()
    for name, gpus, gpu, pins in SEARCHES:
        model, hw = io.load_model(name), io.load_hardware(gpu)
        pins = dict(pins)
        gbs = pins.pop("gbs", None) or model.global_batch_size
        result = runs.search(model, hw, gpus, gbs, space.pinned(**pins))
        label = f"{name} {gpus}x{gpu} " + " ".join(f"{k}={v}" for k, v in pins.items())
        for rank in range(1, min(top, len(result.feasible)) + 1):
            row = result.entry(rank)
            if megatron_unsupported(result.plan(rank)):  # refused by the export; the controls show why
                yield f"{label} #{rank}", model, result.plan(rank), hw, None
                continue
            script = (train_script(model, result.plan(rank), hw, label, short_run=short_run) if short_run
                      else runs.launch_script(model, hw, row, label))
            yield f"{label} #{rank}", model, result.plan(rank), hw, script
    model, hw = io.load_model("llama3.1-405b"), io.load_hardware("h100-sxm")
    uneven = Plan(tp=8, pp=8, dp=9, gbs=252, sp=True, recompute="selective", precision="fp8-delayed",
                  num_layers_in_first_pipeline_stage=15, num_layers_in_last_pipeline_stage=15)
    yield "llama3.1-405b 576xh100 first/last stage 15 layers", model, uneven, hw, \
        train_script(model, uneven, hw, "", short_run=short_run)
    model = io.load_model("llama3-8b")
    fsdp = Plan(tp=2, pp=1, dp=4, gbs=128, sp=True, fsdp=True)
    yield "llama3-8b 8xh100 Megatron-FSDP", model, fsdp, hw, train_script(model, fsdp, hw, "", short_run=short_run)
    model, gb200 = io.load_model("llama3-70b"), io.load_hardware("gb200")
    offload = Plan(tp=1, pp=1, dp=64, gbs=256, mbs=2, precision="fp8-current", fsdp=True,
                   grad_reduce_in_fp32=False, cpu_offloading_num_layers=40)
    yield "llama3-70b 64xgb200 Megatron-FSDP + 40 layers offloaded", model, offload, gb200, \
        train_script(model, offload, gb200, "", short_run=short_run)


# Nemotron 3 Nano (30B-A3B) as Megatron-Bridge 067f987df builds it (src/megatron/bridge/recipes/
# nemotronh/h100/nemotron_3_nano.py); built here, not a preset (benchmarks check the exports).
NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"


def nemotron_3_nano():
    from autoparallel.specs.model import ModelSpec
    return ModelSpec(name="nemotron-3-nano (bench)", num_layers=52, hidden_size=2688, ffn_hidden_size=1856,
                     num_attention_heads=32, num_query_groups=2, kv_channels=128, vocab_size=131072, seq_length=8192,
                     activation="squared_relu", normalization="rmsnorm", position_embedding_type="rope",
                     add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, hybrid_layer_pattern=NANO_PATTERN,
                     mamba_num_heads=64, mamba_head_dim=64, mamba_state_dim=128, mamba_num_groups=8,
                     num_experts=128, moe_router_topk=6, moe_ffn_hidden_size=1856,
                     moe_shared_expert_intermediate_size=3712, moe_router_score_function="sigmoid",
                     moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=2.5)


def hybrid_exports(short_run: int | None = None):
    """Nemotron 3 Nano's exports under the layouts a hybrid model's flags change: pipeline stages
    as | marks (even, explicit first/last, embedding and loss counted, interleaved), TP and CP
    over the Mamba heads and groups, FP8, MTP (Nemotron 3 Super's two '*E' depths), LatentMoE."""
    import dataclasses
    nano, hw = nemotron_3_nano(), io.load_hardware("h100-sxm")
    plans = {
        "TP1 EP8": Plan(tp=1, pp=1, dp=8, ep=8, gbs=1024),
        "TP2 SP PP4 EP8 first/last 12": Plan(tp=2, pp=4, dp=8, ep=8, gbs=1024, sp=True,
                                             num_layers_in_first_pipeline_stage=12,
                                             num_layers_in_last_pipeline_stage=12),
        "PP2 VP2 EP8": Plan(tp=1, pp=2, vp=2, dp=32, ep=8, gbs=1024),
        "PP3 embedding+loss counted": Plan(tp=1, pp=3, dp=8, ep=8, gbs=1024,
                                           account_for_embedding_in_pipeline_split=True,
                                           account_for_loss_in_pipeline_split=True),
        "TP2 CP2 SP fp8-current": Plan(tp=2, pp=1, cp=2, dp=4, ep=8, gbs=1024, sp=True, precision="fp8-current"),
    }
    for label, plan in plans.items():
        yield f"{nano.name} {label}", nano, plan, hw, train_script(nano, plan, hw, "", short_run=short_run)
    mtp = dataclasses.replace(nano, name="nano + MTP 2 x '*E' (bench)", mtp_num_layers=2, mtp_layer_pattern="*E")
    plan = plans["TP2 SP PP4 EP8 first/last 12"]
    yield f"{mtp.name} TP2 PP4 first/last 12", mtp, plan, hw, train_script(mtp, plan, hw, "", short_run=short_run)
    latent = dataclasses.replace(nano, name="nano + LatentMoE 1024 (bench)", moe_latent_size=1024)
    plan = plans["TP1 EP8"]
    yield f"{latent.name} TP1 EP8", latent, plan, hw, train_script(latent, plan, hw, "", short_run=short_run)


def controls():
    """Broken exports the check must refuse (so that 'ok' above means something): the issue's
    findings, each as (label, model, plan, hw, change to argv and environment)."""
    hw = io.load_hardware("h100-sxm")
    llama70, llama8 = io.load_model("llama3-70b"), io.load_model("llama3-8b")
    cp2 = Plan(tp=4, pp=4, vp=5, cp=2, dp=2, gbs=128, sp=True, precision="fp8-delayed")
    yield ("without CUDA_DEVICE_MAX_CONNECTIONS", llama70, cp2, hw, lambda argv, env: (argv, {}))
    with_value = ("--position-embedding-type", "--rotary-base", "--hidden-dropout", "--attention-dropout",
                  "--norm-epsilon")
    yield ("without the architecture flags of the old export", llama70, cp2, hw,
           lambda argv, env: (_without(argv, (*with_value, "--disable-bias-linear")), env))
    edge = Plan(tp=8, pp=8, dp=1, gbs=128, sp=True, precision="fp8-current", fp8_bf16_edge_layers=5)
    yield ("BF16 edge layers 5 with 4 layers per stage (the space now rejects it)", llama8, edge, hw,
           lambda argv, env: (argv, env))
    fp16 = Plan(tp=8, pp=1, dp=1, gbs=128, sp=True, precision="fp16")
    yield ("fp16 without --accumulate-allreduce-grads-in-fp32", llama8, fp16, hw,
           lambda argv, env: ([a for a in argv if a != "--accumulate-allreduce-grads-in-fp32"], env))
    # issue 22 item 6: layouts the space now rejects, exported anyway
    delayed = Plan(tp=1, pp=1, dp=64, gbs=256, ep=8, precision="fp8-delayed", recompute="selective",
                   recompute_modules="moe_act")
    yield ("Mixtral fp8-delayed with moe_act recompute (the space now rejects it)", io.load_model("mixtral-8x7b"),
           delayed, hw, lambda argv, env: (argv, env))
    biased = Plan(tp=2, pp=1, dp=32, gbs=256, ep=8, etp=2, sp=True)
    yield ("GPT-OSS (expert biases) at ETP 2 (the space now rejects it)", io.load_model("gpt-oss-120b"), biased, hw,
           lambda argv, env: (argv, env))
    flexible = Plan(tp=2, pp=8, vp=4, dp=64, gbs=4096, ep=8, sp=True,
                    pipeline_model_parallel_layout="Et|(t*2|)*30mL")
    yield ("DeepSeek-V3 (MTP 1) with a flexible layout that places no MTP layer", io.load_model("deepseek-v3"),
           flexible, hw, lambda argv, env: ([a.replace("mL", "L") for a in argv], env))
    new_flags = ("--moe-router-score-function", "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor",
                 "--moe-router-num-groups", "--moe-router-group-topk", "--mtp-num-layers", "--qk-layernorm",
                 "--rotary-scaling-factor", "--mscale", "--mscale-all-dim")
    yield ("DeepSeek-V3 without the config.json fields of issue 22 item 6", io.load_model("deepseek-v3"),
           Plan(tp=2, pp=1, dp=512, gbs=4096, ep=8, sp=True), hw,
           lambda argv, env: (_without(argv, new_flags), env))
    # issue 27: why the export refuses FP8 attention (the flag autoparallel used to write)
    fp8 = Plan(tp=1, pp=1, dp=8, gbs=128, precision="fp8-current")
    yield ("FP8 attention as --fp8-dot-product-attention (the export now refuses the plan)", llama8, fp8, hw,
           lambda argv, env: ([*argv, "--fp8-dot-product-attention"], env))
    # session 51: the hierarchical CP kind needs its group sizes (validate_args), which the export writes
    hierarchical = Plan(tp=1, pp=4, cp=4, dp=16, gbs=128, cp_comm_type="a2a+p2p")
    yield ("--cp-comm-type a2a+p2p without --hierarchical-context-parallel-sizes", llama70, hierarchical, hw,
           lambda argv, env: (_without_all_values(argv, "--hierarchical-context-parallel-sizes"), env))


def hybrid_controls():
    """A hybrid model's exports as they would be without this session's changes (s48h3)."""
    import dataclasses
    nano, hw = nemotron_3_nano(), io.load_hardware("h100-sxm")
    interleaved = Plan(tp=1, pp=2, vp=2, dp=32, ep=8, gbs=1024)
    yield ("Nano PP2 VP2 with --num-virtual-stages-per-pipeline-rank beside the pipe marks", nano, interleaved, hw,
           lambda argv, env: ([*argv, "--num-virtual-stages-per-pipeline-rank", "2"], env))
    yield ("Nano without --hybrid-layer-pattern (the GPT export)", nano, Plan(tp=1, pp=1, dp=8, ep=8, gbs=1024), hw,
           lambda argv, env: (_without(argv, ("--hybrid-layer-pattern",)), env))
    biased = dataclasses.replace(nano, add_bias_linear=True)
    yield ("Nano with biases (squared ReLU) without --no-bias-gelu-fusion", biased,
           Plan(tp=1, pp=1, dp=8, ep=8, gbs=1024), hw,
           lambda argv, env: ([a for a in argv if a != "--no-bias-gelu-fusion"], env))
    uneven = Plan(tp=1, pp=4, dp=2, ep=8, gbs=1024, num_layers_in_first_pipeline_stage=12,
                  num_layers_in_last_pipeline_stage=12)
    yield ("Nano PP4 first/last 12 as the GPT flags beside the pipe marks", nano, uneven, hw,
           lambda argv, env: ([*argv, "--decoder-first-pipeline-num-layers", "12"], env))


def _without_all_values(argv: list[str], flag: str) -> list[str]:
    """argv less ``flag`` and every value that follows it (an nargs='+' flag)."""
    out, skipping = [], False
    for a in argv:
        skipping = a == flag or (skipping and not a.startswith("--"))
        if not skipping:
            out.append(a)
    return out


def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """argv less each of ``flags`` and the value that follows it."""
    drop = {i for i, a in enumerate(argv) if a in flags}
    drop |= {i + 1 for i in drop if i + 1 < len(argv) and not argv[i + 1].startswith("--")}
    return [a for i, a in enumerate(argv) if i not in drop]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megatron", required=True, help="Megatron-LM checkout (or snapshot) root")
    parser.add_argument("--top", type=int, default=3, help="plans exported per search")
    parser.add_argument("--only-hybrid", action="store_true", help="check only the hybrid Mamba-Transformer exports")
    parser.add_argument("--short-run", type=int, help="check the short profiling runs of --trainer megatron "
                                                      "(this many iterations) instead of the exports")
    cli = parser.parse_args()
    with warnings.catch_warnings():  # Apex / TE absent: megatron.core falls back, and says so at import
        warnings.simplefilter("ignore")
        arguments, microbatches = load_megatron(Path(cli.megatron).resolve())
    print("Stubbed:\n" + "".join(f"- {s}\n" for s in STUBS))
    print("| export | layout | env | reached | problem |\n|---|---|---|---|---|")
    passed = total = refused = 0
    import itertools
    every = hybrid_exports(cli.short_run) if cli.only_hybrid else itertools.chain(
        exports(cli.top, cli.short_run), hybrid_exports(cli.short_run))
    for label, model, plan, hw, script in every:
        _ARCH["value"] = ARCH[hw.name]
        if script is None:
            refused += 1
            print(f"| {label} | {plan.precision} fp8-attention | - | refused by the export | "
                  f"{megatron_unsupported(plan)} |", flush=True)
            continue
        argv, env = script_argv_env(script)
        stage, problem = check(arguments, microbatches, model, plan, argv, env)
        total += 1
        passed += not problem
        layout = (f"TP{plan.tp} PP{plan.pp} VP{plan.vp} CP{plan.cp} DP{plan.dp} MBS{plan.mbs} {plan.precision}"
                  f"{' ' + plan.recompute if plan.recompute != 'none' else ''}"
                  f"{' edge' + str(plan.fp8_bf16_edge_layers) if plan.fp8_bf16_edge_layers else ''}"
                  f"{' tp-ovl' if plan.tp_comm_overlap else ''}"
                  f"{' cp-' + plan.cp_comm_type if plan.cp > 1 and plan.cp_comm_type != 'p2p' else ''}")
        env_text = ",".join(f"{k}={v}" for k, v in env.items()) or "-"
        print(f"| {label} | {layout} | {env_text} | {stage} | {problem or 'ok'} |", flush=True)
    print(f"\n{passed} of {total} exports pass parse_args + validate_args + TransformerConfig + micro-batches "
          f"with the preset's model and the priced layout; {refused} plans refused by the export (no Megatron-LM "
          "flag for them)")
    print("\nControls (must be refused):\n\n| broken export | reached | problem found |\n|---|---|---|")
    for label, model, plan, hw, change in (hybrid_controls() if cli.only_hybrid
                                           else itertools.chain(controls(), hybrid_controls())):
        _ARCH["value"] = ARCH[hw.name]
        argv, env = change(*script_argv_env(train_script(model, plan, hw, "")))
        stage, problem = check(arguments, microbatches, model, plan, argv, env)
        print(f"| {label} | {stage} | {problem or 'NOT CAUGHT'} |", flush=True)


if __name__ == "__main__":
    main()
