"""What a hybrid Mamba-Transformer model (``ModelSpec.hybrid_layer_pattern``: Nemotron-H,
Nemotron 3) adds to the exports: Megatron-LM's entry script, flags and pipeline stages, and the
Megatron-Bridge ``HybridModelProvider`` fields.

Megatron-LM (NVIDIA/Megatron-LM d98e8a64dd) runs hybrid models with ``pretrain_hybrid.py``
(``pretrain_mamba.py`` is its deprecated wrapper). ``--hybrid-layer-pattern`` is "the sole
indicator that a hybrid model is being run" (``--hybrid-override-pattern`` is its deprecated
alias; ``TransformerConfig.is_hybrid_model`` is set from it by ``argument_utils``); the Mamba-2
mixer's shapes are ``TransformerConfig`` fields, flags of the generated ``transformer
configuration`` group (``--mamba-num-heads``, ``--mamba-head-dim``, ``--mamba-state-dim``,
``--mamba-num-groups``), as is LatentMoE's ``--moe-latent-size``.

**Pipeline stages.** ``validate_args`` refuses ``--num-virtual-stages-per-pipeline-rank``,
``--pipeline-model-parallel-layout`` and the ``--account-for-*-in-pipeline-split`` flags with a
hybrid pattern ("Pipeline stage layout is defined by | separators in the pattern"), and
``select_pipeline_segment`` runs interleaving only from ``|`` marks; a pattern without them on
pp > 1 is deprecated. So every pp > 1 plan is written with a ``|`` at each virtual stage's end,
the stages holding the layers the cost model priced (``pipeline.virtual_stage_sizes``: virtual
stage v = chunk * pp + rank, Megatron's ``segment_index = vp_stage * pp + pp_rank``), and none
of those flags (nor ``--decoder-first/last-pipeline-num-layers``, refused with ``|``).

**Multi-token prediction** takes its own layer pattern after ``/`` (``M*M*/MM/MM``: one copy per
depth, ``ModelSpec.mtp_layer_pattern``; Megatron-LM's Nemotron 3 Super release run writes
``.../*E/*E`` with ``--mtp-num-layers 2``); an MTP hybrid model without that pattern is refused
by the exports rather than written without its MTP layers (Megatron-LM only warns: "Hybrid model
with --mtp-num-layers but no MTP pattern").
"""

from __future__ import annotations

from autoparallel.costmodel import pipeline
from autoparallel.report import moe_export
from autoparallel.report.shared import hybrid_unsupported
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

ENTRY_SCRIPT = "pretrain_hybrid.py"
GPT_ENTRY_SCRIPT = "pretrain_gpt.py"
PIPE, MTP_SEPARATOR = "|", "/"  # hybrid_layer_allocation.Symbols.PIPE, .MTP_SEPARATOR
# Megatron-Bridge (067f987df) src/megatron/bridge/models/hybrid/hybrid_provider.py.
BRIDGE_PROVIDER = "megatron.bridge.models.hybrid.hybrid_provider.HybridModelProvider"
# The pipeline flags validate_args refuses beside --hybrid-layer-pattern; the | marks say them.
PIPE_STATED = ("--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout",
               "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
               "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")


def entry_script(model: ModelSpec) -> str:
    """The Megatron-LM script that trains ``model``."""
    return ENTRY_SCRIPT if model.is_hybrid else GPT_ENTRY_SCRIPT


def layer_pattern(model: ModelSpec, plan: Plan | None = None) -> str:
    """--hybrid-layer-pattern: the model's pattern, with a | after each virtual pipeline stage
    when ``plan`` has pp > 1 (the stages' layer counts as priced), then each MTP depth's after a /."""
    pattern = model.hybrid_layer_pattern
    mtp = "".join(MTP_SEPARATOR + model.mtp_layer_pattern for _ in range(model.mtp_num_layers)
                  ) if model.mtp_layer_pattern else ""
    if plan is None or plan.pp == 1:
        return pattern + mtp
    if plan.pipeline_model_parallel_layout:
        raise ValueError("a hybrid model's pipeline stages are | marks in its pattern, not a "
                         "--pipeline-model-parallel-layout (Megatron-LM validate_args)")
    sizes = pipeline.virtual_stage_sizes(model.num_layers, plan.pp, plan.vp,
                                         plan.num_layers_in_first_pipeline_stage,
                                         plan.num_layers_in_last_pipeline_stage,
                                         plan.account_for_embedding_in_pipeline_split,
                                         plan.account_for_loss_in_pipeline_split)
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    return PIPE.join(pattern[end - size:end] for end, size in zip(ends, sizes)) + mtp


def model_flags(model: ModelSpec, plan: Plan | None = None) -> list[str]:
    """The pattern (single-quoted: * would glob in the shell) and the Mamba-2 mixer's shapes,
    always written; LatentMoE's width where the model has it."""
    if not model.is_hybrid:
        return []
    a = [f"--hybrid-layer-pattern '{layer_pattern(model, plan)}'"]
    if "M" in model.hybrid_layer_pattern:
        a += [f"--mamba-num-heads {model.mamba_heads}", f"--mamba-head-dim {model.mamba_head_dim}",
              f"--mamba-state-dim {model.mamba_state_dim}", f"--mamba-num-groups {model.mamba_num_groups}"]
    if model.moe_latent_size:
        a.append(f"--moe-latent-size {model.moe_latent_size}")
    return a


def without_pipe_stated(flags: list[str]) -> list[str]:
    """``flags`` less those the | marks of a hybrid pattern state instead."""
    return [f for f in flags if f.split(" ", 1)[0] not in PIPE_STATED]


def config_keys(model: ModelSpec, plan: Plan | None = None) -> dict:
    """The same as Megatron-Core ``TransformerConfig`` fields (``is_hybrid_model``, ``mamba_*``,
    ``moe_latent_size``) and the provider's ``hybrid_layer_pattern``."""
    if not model.is_hybrid:
        return {}
    keys = {"hybrid_layer_pattern": layer_pattern(model, plan), "is_hybrid_model": True,
            "mamba_num_heads": model.mamba_heads, "mamba_head_dim": model.mamba_head_dim,
            "mamba_state_dim": model.mamba_state_dim, "mamba_num_groups": model.mamba_num_groups}
    if model.moe_latent_size:
        keys["moe_latent_size"] = model.moe_latent_size
    return keys


def bridge_unsupported(model: ModelSpec, plan: Plan) -> str:
    """Why Megatron-Bridge's HybridModelProvider cannot run the plan, or ''."""
    if why := hybrid_unsupported(model):
        return why
    if plan.vp > 1:  # HybridModelProvider.provide
        return ("Megatron-Bridge's HybridModelProvider refuses interleaving: \"Virtual pipeline model parallelism "
                "is temporarily unsupported in Hybrid models due to upstream MCore HybridModel API dependency\"")
    return ""


def bridge_provider(model: ModelSpec, plan: Plan) -> dict:
    """Megatron-Bridge's model provider for a hybrid model: its class and the fields to set
    (the architecture and the layout; ``tests/fixtures/bridge_hybrid_fields.yaml`` lists the
    fields HybridModelProvider takes, read from its source)."""
    if why := bridge_unsupported(model, plan):
        return {"unsupported": why}
    from autoparallel.report.nemo import NEMO2_ACTIVATION
    from autoparallel.report.shared import NORMALIZATION, cp_comm_type, hierarchical_cp_sizes
    fields = {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
              "ffn_hidden_size": model.ffn_hidden_size, "num_attention_heads": model.num_attention_heads,
              "num_query_groups": model.query_groups, "kv_channels": model.kv_channels,
              "seq_length": model.seq_length, "normalization": NORMALIZATION[model.normalization],
              "layernorm_epsilon": model.norm_epsilon, "activation_func": NEMO2_ACTIVATION[model.activation],
              "gated_linear_unit": model.gated_mlp, "add_bias_linear": model.add_bias_linear,
              "position_embedding_type": model.position_embedding_type,
              "share_embeddings_and_output_weights": model.tie_embeddings,
              **config_keys(model, plan),
              "tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
              "context_parallel_size": plan.cp, "sequence_parallel": plan.sp and plan.tp > 1,
              "expert_model_parallel_size": plan.ep, "expert_tensor_parallel_size": plan.etp}
    if plan.cp > 1:  # the attention layers' CP kind, as priced (Bridge's default None runs p2p)
        fields["cp_comm_type"] = cp_comm_type(model, plan)
        if sizes := hierarchical_cp_sizes(model, plan):
            fields["hierarchical_context_parallel_sizes"] = sizes
    # The MoE blocks (E), router and expert layout as the other exports write them; a hybrid
    # pattern places the MoE layers itself (HybridModel reads no moe_layer_freq).
    fields.update({k: v for k, v in moe_export.config_keys(model, plan).items() if k != "moe_layer_freq"})
    return {"class": BRIDGE_PROVIDER, "fields": fields}
