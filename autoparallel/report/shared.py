"""What every export of a plan shares: the FP8 recipes, the constants the cost model priced, the
tokenizer files train.sh asks for and how the GPUs split into nodes.

``report.export`` (Megatron-LM flags), ``report.nemo`` (NeMo 1.x / 2.x), ``report.nemo_python``
and ``report.launch`` (train.sh) all import from here and none of them from each other's
constants, so that no import circle joins them and a value is written in one place only.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan


@dataclass(frozen=True)
class Fp8Export:
    te_class: str  # transformer_engine.common.recipe.<te_class>
    megatron_recipe: str  # --fp8-recipe
    fp8_format: str  # --fp8-format: hybrid = E4M3 forward, E5M2 gradients
    citation: str


# One FP8 format per recipe, used by every block (Megatron, NeMo, TE) so they cannot disagree.
FP8_RECIPES = {
    "fp8-delayed": Fp8Export("DelayedScaling", "delayed", "hybrid", "NeMo bf16_with_fp8_mixed"),
    "fp8-current": Fp8Export("Float8CurrentScaling", "tensorwise", "hybrid",
                             "NeMo bf16_with_fp8_current_scaling_mixed"),
    "fp8-blockwise": Fp8Export("Float8BlockScaling", "blockwise", "e4m3",
                               "DeepSeek-V3 (E4M3 everywhere); TE Float8BlockScaling default"),
    "mxfp8": Fp8Export("MXFP8BlockScaling", "mxfp8", "hybrid", "NeMo bf16_with_mxfp8_mixed"),
}
# NVFP4 as Megatron-LM takes it (--fp4-format e2m1 --fp4-recipe nvfp4) and the TransformerEngine
# recipe Megatron builds from it: NVFP4BlockScaling with its defaults, the recipe the cost model
# prices (1x16 E4M3 block scales and a per-tensor FP32 scale, 16x16 2D scaling of the weights, the
# random Hadamard transform on the weight-gradient inputs, stochastic rounding of the gradients).
FP4_FORMAT, FP4_RECIPE, FP4_TE_CLASS = "e2m1", "nvfp4", "NVFP4BlockScaling"
# Megatron-Bridge's mixed-precision recipe of each precision (megatron/bridge/training/
# mixed_precision.py); NeMo 2's MegatronMixedPrecision and NeMo 1.x have no FP4.
BRIDGE_PRECISION_RECIPES = {"bf16": "bf16_mixed", "fp16": "fp16_mixed",
                            "fp8-delayed": "bf16_with_fp8_delayed_scaling_mixed",
                            "fp8-current": "bf16_with_fp8_current_scaling_mixed",
                            "fp8-blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
                            "mxfp8": "bf16_with_mxfp8_mixed", "nvfp4": "bf16_with_nvfp4_mixed"}


def nemo_unsupported(plan: Plan, model: ModelSpec | None = None) -> str:
    """Why NeMo (1.x YAML, 2.x recipe) cannot run the plan as priced, or ''."""
    if model is not None and model.is_hybrid:
        # NeMo 2's hybrid models are nemo/collections/llm/gpt/model/ssm.py SSMConfig (MambaModel,
        # hybrid_override_pattern, the nemotronh recipes), not the GPTConfig fields this export writes;
        # NeMo 1.x's megatron_gpt_config has no Mamba layers.
        return ("a hybrid Mamba-Transformer model has no NeMo 1.x GPT config and NeMo 2's are SSMConfig recipes "
                "(nemotronh), not the GPT recipe written here: use the Megatron-LM flags (pretrain_hybrid.py) or "
                "best.yaml's megatron_bridge_model (Megatron-Bridge's HybridModelProvider)")
    if model is not None and model.is_dsv4:
        return dsv4_unsupported(model)
    if plan.is_fp4:
        return ("NVFP4 has no NeMo 1.x / NeMo 2 form (MegatronMixedPrecision has no FP4): use the Megatron-LM "
                "flags or Megatron-Bridge's bf16_with_nvfp4_mixed")
    if plan.lora_input_regather:
        return ("LoRA's sequence-parallel input re-gather is Megatron-Bridge's (v0.6.0+, LoRA."
                "sequence_parallel_input_regather); NeMo's LoRA has no such field: use best.yaml's megatron_bridge_peft")
    return ""


# Megatron-Core MambaMixer(d_conv=4): the causal convolution's width is a constructor argument
# the hybrid layer specs leave at its default, with no TransformerConfig field and no flag.
MAMBA_CONV_KERNEL = 4


# DeepSeek-V4 (``ModelSpec.csa_compress_ratios``): Megatron-LM d98e8a64dd's TransformerConfig has no
# ``dsv4_hybrid`` attention variant (experimental_attention_variant: gdn, gdn2, dsa, gated_delta_net), no
# o_groups / o_lora_rank, no CSA compressor or hash routing; its README: "Megatron Core's dev branch includes
# the initial DeepSeek-V4 implementation" (Megatron-Bridge's recipes need a dev-branch Megatron-Core).
DSV4_UNSUPPORTED = ("DeepSeek-V4's hybrid attention (dsv4_hybrid: CSA with a DSA indexer, o_groups output), Hyper-"
                    "Connections and hash routing are not in Megatron-LM d98e8a64dd (main): only its dev branch has "
                    "them, with no flags this export could write; run Megatron-Bridge's DeepSeek-V4 recipes "
                    "(recipes/deepseek/*/deepseek_v4.py) on a dev-branch Megatron-Core")


def dsv4_unsupported(model: ModelSpec) -> str:
    """Why no export can state a DeepSeek-V4 ``model`` (``DSV4_UNSUPPORTED``), or ''."""
    return f"{model.name}: {DSV4_UNSUPPORTED}" if model.is_dsv4 else ""


def hybrid_unsupported(model: ModelSpec) -> str:
    """Why Megatron-LM's flags (and Megatron-Bridge's provider) cannot state the hybrid
    ``model`` (or DeepSeek-V4's, ``dsv4_unsupported``), or '' (``report.hybrid_export``)."""
    if model.is_dsv4:
        return dsv4_unsupported(model)
    if not model.is_hybrid:
        return ""
    if model.mtp_num_layers and not model.mtp_layer_pattern:
        return (f"{model.name} has {model.mtp_num_layers} MTP layers but no mtp_layer_pattern: a hybrid model's MTP "
                "layers take their own pattern after '/' in --hybrid-layer-pattern (Nemotron 3 Super's '.../*E/*E')")
    if model.mamba_conv_kernel != MAMBA_CONV_KERNEL:
        return (f"mamba_conv_kernel={model.mamba_conv_kernel}: Megatron-Core's MambaMixer convolution is "
                f"{MAMBA_CONV_KERNEL} wide (d_conv), with no TransformerConfig field or flag to change it")
    return ""


def megatron_unsupported(plan: Plan) -> str:
    """Why Megatron-LM's pretrain_gpt.py cannot run the plan as priced, or ''."""
    if plan.fp8_attention:
        # TransformerConfig.fp8_dot_product_attention is among the fields Megatron-LM's generated
        # arguments leave out ("no CLI argument exists for these", megatron/training/arguments.py,
        # d98e8a6); 000c4ac's hand-written parser had no such flag either: parse_args refuses
        # --fp8-dot-product-attention (benchmarks/bench_megatron_args.py).
        return ("FP8 dot-product attention has no Megatron-LM flag (TransformerConfig.fp8_dot_product_attention "
                "is set only from Python: NeMo / Megatron-Bridge); use --format nemo, nemo2 or nemo2-yaml, or "
                "search without --fp8-attention")
    return ""


# Delayed scaling as priced and as NeMo's FP8 recipes set it (DESIGN.md §6).
AMAX_HISTORY_LEN = 1024
AMAX_COMPUTE_ALGO = "max"
# TransformerEngine's spelling of the all-gather CP (attn_forward_func_with_cp takes "all_gather" and
# raises "Unsupported communication type" for anything else; Megatron-LM passes --cp-comm-type through
# as given, though its help says "allgather"); DSAttention normalizes either (dsa_layout.py
# normalize_cp_comm_type) and GLM5Bridge writes "allgather", which DSA plans keep.
TE_CP_COMM_TYPE = {"allgather": "all_gather"}


def cp_comm_type(model, plan) -> str:
    """``--cp-comm-type`` / ``cp_comm_type`` of a plan with cp > 1 of ``model``, as the cost model
    prices it (``layer_time.cp_comm_time``): the model's only kind where it has one (softmax sinks:
    a2a; DSA: allgather), else the plan's, in TransformerEngine's spelling."""
    from autoparallel.costmodel import cp_kinds
    forced = cp_kinds.default_kind(model)
    if forced != "p2p":
        return forced
    return TE_CP_COMM_TYPE.get(plan.cp_comm_type, plan.cp_comm_type)


def hierarchical_cp_sizes(model, plan) -> list[int] | None:
    """Megatron's --hierarchical-context-parallel-sizes of an a2a+p2p plan (the a2a group, then the p2p
    ring: ``cp_kinds.a2a_group``, as priced); None for the other kinds."""
    from autoparallel.costmodel import cp_kinds
    if plan.cp <= 1 or cp_comm_type(model, plan) != "a2a+p2p":
        return None
    inner = int(cp_kinds.a2a_group(model, plan.tp, plan.cp, "a2a+p2p"))
    return [inner, plan.cp // inner] if inner else None


# Plan.cuda_graph as Megatron-Core's TransformerConfig (cuda_graph_impl, cuda_graph_scope): whole-layer
# graphs by TransformerEngine; the full-iteration graph by MCore's local implementation, spelled as
# Megatron-LM 0.15 takes it (later releases name it --cuda-graph-impl full_iteration and still
# accept this spelling, migrating it).
CUDA_GRAPHS = {"none": {"cuda_graph_impl": "none"},
               "layer": {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "full"},
               "full_iteration": {"cuda_graph_impl": "local", "cuda_graph_scope": "full_iteration"}}
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128  # Megatron-LM's default padding (times TP)
# File-based tokenizers need paths the user supplies: shell variables, defined by train.sh.
TOKENIZER_FILES = {"GPT2BPETokenizer": {"--vocab-file": "VOCAB_FILE", "--merge-file": "MERGE_FILE"},
                   "GPTSentencePieceTokenizer": {"--tokenizer-model": "TOKENIZER_MODEL"}}
NORMALIZATION = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


def recompute_layers(model: ModelSpec, plan: Plan) -> int:
    """Layers per pipeline chunk that full recompute covers (Megatron's block method)."""
    return plan.recompute_num_layers or model.num_layers // (plan.pp * plan.vp)


def node_layout(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for ``gpus``: full nodes when they divide, else the largest equal
    share that does (12 GPUs on 8-GPU nodes run as 2 x 6, never as 1 x 8 with a silent DP change)."""
    per_node = max(d for d in range(1, min(gpus, gpus_per_node) + 1) if gpus % d == 0)
    return gpus // per_node, per_node


def node_layout_text(gpus: int, gpus_per_node: int) -> str:
    """``node_layout`` in words, singular where it is one: "1 node x 8 GPUs", "2 nodes x 4 GPUs",
    "1 node x 1 GPU"; the launch script's comment and ``search``'s launch line both say it."""
    from autoparallel.words import plural
    nodes, per_node = node_layout(gpus, gpus_per_node)
    return f"{plural(nodes, 'node')} x {plural(per_node, 'GPU')}"
