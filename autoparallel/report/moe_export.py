"""What a mixture-of-experts or multi-latent-attention model and a plan's expert layout add to
the exports: Megatron-LM flags and the NeMo / Megatron-Core ``TransformerConfig`` keys.

Kept apart from ``report.export`` (which hooks them in with one line each) so that the MoE
settings live in one place. Flag names are those of ``megatron/training/arguments.py``
(``_add_moe_args``, ``_add_mla_args``, ``--recompute-modules``) of NVIDIA/Megatron-LM at commit
000c4ac24f61159c138b0975def722c65245983c; keys are the fields of its ``TransformerConfig`` /
``ModelParallelConfig`` (``num_moe_experts`` where the flag says ``--num-experts``). The run is
written as it was priced: the plan's token dispatcher (flex with its backend) with grouped GEMMs,
expert tensor parallel always stated (Megatron's default would be the attention TP size), the
1F1B all-to-all overlap with its delayed weight gradients when the plan uses it.
"""

from __future__ import annotations

from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

# Megatron warns below FP32 routing from 32 experts on ("Consider enabling moe_router_dtype").
FP32_ROUTER_FROM_EXPERTS = 32


def _layer_freq(model: ModelSpec) -> str:
    """--moe-layer-freq as the shell passes it: an int, or the pattern in single quotes."""
    freq = model.moe_layer_freq
    return str(freq) if isinstance(freq, int) or str(freq).isdigit() else f"'{freq}'"


def model_flags(model: ModelSpec) -> list[str]:
    """The MoE and MLA architecture."""
    a: list[str] = []
    if model.multi_latent_attention:
        a.append("--multi-latent-attention")
        if model.q_lora_rank:
            a.append(f"--q-lora-rank {model.q_lora_rank}")
        a += [f"--kv-lora-rank {model.kv_lora_rank}", f"--qk-head-dim {model.qk_head_dim}",
              f"--qk-pos-emb-head-dim {model.qk_pos_emb_head_dim}", f"--v-head-dim {model.v_head_dim}"]
    if not model.is_moe:
        return a
    a += [f"--num-experts {model.num_experts}", f"--moe-router-topk {model.moe_router_topk}",
          f"--moe-ffn-hidden-size {model.expert_ffn_hidden_size}"]
    if model.shared_expert_ffn_hidden_size:
        a.append(f"--moe-shared-expert-intermediate-size {model.shared_expert_ffn_hidden_size}")
    if model.moe_layer_freq != 1:
        a.append(f"--moe-layer-freq {_layer_freq(model)}")
    if model.moe_expert_capacity_factor is not None:
        a.append(f"--moe-expert-capacity-factor {model.moe_expert_capacity_factor}")
    if model.moe_router_force_load_balancing:
        a.append("--moe-router-force-load-balancing")
    if model.num_experts >= FP32_ROUTER_FROM_EXPERTS:
        a.append("--moe-router-dtype fp32")
    return a


def parallel_flags(model: ModelSpec, plan: Plan) -> list[str]:
    """The expert layout, the dispatcher as priced, the all-to-all overlap and the selective
    recompute modules of MoE / MLA models."""
    a: list[str] = []
    if plan.recompute == "selective" and plan.recompute_modules != "core_attn":
        a.append(f"--recompute-modules {plan.recompute_modules}")
    if not model.is_moe:
        return a
    a += [f"--expert-model-parallel-size {plan.ep}", f"--expert-tensor-parallel-size {plan.etp}",
          f"--moe-token-dispatcher-type {plan.moe_token_dispatcher_type}", "--moe-grouped-gemm"]
    if plan.moe_token_dispatcher_type == "flex":
        a.append(f"--moe-flex-dispatcher-backend {plan.moe_flex_dispatcher_backend}")
    if plan.overlap_moe_expert_parallel_comm:
        a += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    return a


def config_keys(model: ModelSpec, plan: Plan) -> dict:
    """The same settings as Megatron-Core TransformerConfig fields (NeMo's model config keys)."""
    keys: dict = {}
    if model.multi_latent_attention:
        keys.update(multi_latent_attention=True, q_lora_rank=model.q_lora_rank, kv_lora_rank=model.kv_lora_rank,
                    qk_head_dim=model.qk_head_dim, qk_pos_emb_head_dim=model.qk_pos_emb_head_dim,
                    v_head_dim=model.v_head_dim)
    if plan.recompute == "selective" and plan.recompute_modules != "core_attn":
        keys["recompute_modules"] = plan.recompute_modules.split()
    if not model.is_moe:
        return keys
    freq = model.moe_layer_freq
    keys.update(
        num_moe_experts=model.num_experts, moe_router_topk=model.moe_router_topk,
        moe_ffn_hidden_size=model.expert_ffn_hidden_size,
        moe_shared_expert_intermediate_size=model.moe_shared_expert_intermediate_size,
        moe_layer_freq=list(model.moe_layer_pattern) if isinstance(freq, str) and not freq.isdigit() else int(freq),
        moe_expert_capacity_factor=model.moe_expert_capacity_factor,
        moe_router_dtype="fp32" if model.num_experts >= FP32_ROUTER_FROM_EXPERTS else None,
        expert_model_parallel_size=plan.ep, expert_tensor_parallel_size=plan.etp,
        moe_token_dispatcher_type=plan.moe_token_dispatcher_type, moe_grouped_gemm=True,
        overlap_moe_expert_parallel_comm=plan.overlap_moe_expert_parallel_comm,
        delay_wgrad_compute=plan.overlap_moe_expert_parallel_comm)
    if plan.moe_token_dispatcher_type == "flex":
        keys["moe_flex_dispatcher_backend"] = plan.moe_flex_dispatcher_backend
    if model.moe_router_force_load_balancing:
        keys["moe_router_force_load_balancing"] = True
    return keys
