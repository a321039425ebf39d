"""What a mixture-of-experts or multi-latent-attention model and a plan's expert layout add to
the exports: Megatron-LM flags and the NeMo / Megatron-Core ``TransformerConfig`` keys, with the
architecture details the MoE presets carry from their Hugging Face config.json (router score
function, expert bias, routed scaling, group-limited routing, MLA's YaRN, multi-token prediction,
QK norm, sliding windows, attention sinks) and the TransformerEngine release the settings need.

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


def _layer_freq(model: ModelSpec) -> str:
    """--moe-layer-freq as the shell passes it: an int, or the pattern in single quotes."""
    freq = model.moe_layer_freq
    return str(freq) if isinstance(freq, int) or str(freq).isdigit() else f"'{freq}'"


def attention_flags(model: ModelSpec) -> list[str]:
    """QK norm, sliding-window attention, the softmax variant and multi-token prediction, each
    only where the model departs from Megatron-LM's default."""
    a: list[str] = ["--qk-layernorm"] if model.qk_layernorm else []
    if model.window_size is not None:
        a.append(f"--window-size {','.join(map(str, model.window_size))}")
        if model.window_attn_skip_freq:
            a.append(f"--window-attn-skip-freq {model.window_attn_skip_freq}")
    if model.softmax_type != "vanilla":
        a.append(f"--softmax-type {model.softmax_type}")
    if model.mtp_num_layers:
        a.append(f"--mtp-num-layers {model.mtp_num_layers}")
    return a


def router_flags(model: ModelSpec) -> list[str]:
    """How the router scores and picks experts, where it departs from Megatron-LM's default."""
    a: list[str] = []
    if model.moe_router_score_function != "softmax":
        a.append(f"--moe-router-score-function {model.moe_router_score_function}")
    if model.moe_router_enable_expert_bias:
        a.append("--moe-router-enable-expert-bias")
    if model.moe_router_topk_scaling_factor is not None:
        a.append(f"--moe-router-topk-scaling-factor {model.moe_router_topk_scaling_factor}")
    if model.moe_router_num_groups is not None:
        a += [f"--moe-router-num-groups {model.moe_router_num_groups}",
              f"--moe-router-group-topk {model.moe_router_group_topk}"]
    return a


def model_flags(model: ModelSpec) -> list[str]:
    """The MoE and MLA architecture (MLA's YaRN always written: Megatron-LM's argument default,
    factor 1, would silently override the model's)."""
    a = attention_flags(model)
    if model.multi_latent_attention:
        a.append("--multi-latent-attention")
        if model.q_lora_rank:
            a.append(f"--q-lora-rank {model.q_lora_rank}")
        a += [f"--kv-lora-rank {model.kv_lora_rank}", f"--qk-head-dim {model.qk_head_dim}",
              f"--qk-pos-emb-head-dim {model.qk_pos_emb_head_dim}", f"--v-head-dim {model.v_head_dim}",
              f"--rotary-scaling-factor {model.rotary_scaling_factor}", f"--mscale {model.mscale}",
              f"--mscale-all-dim {model.mscale_all_dim}"]
        a += dsa_flags(model)
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
    if model.moe_router_fp32:
        a.append("--moe-router-dtype fp32")
    return a + router_flags(model)


# The indexer's KL loss as Megatron-Bridge 067f987df0 GLM5Bridge sets it (and its FLOP count assumes):
# Megatron-LM's default (None) would leave the indexer untrained.
DSA_INDEXER_LOSS = {"dsa_indexer_loss_coeff": 0.001, "dsa_indexer_use_sparse_loss": True}


def dsa_flags(model: ModelSpec) -> list[str]:
    """DeepSeek Sparse Attention on every layer (GLM-5): Megatron-LM d98e8a64dd's ``dsa`` attention variant,
    its flags generated from TransformerConfig (experimental_attention_variant, dsa_indexer_*), and no RoPE
    fusion (TransformerConfig asserts "RoPE fusion is not supported for DSAttention"; Megatron-Bridge's GLM-5
    performance recipes set apply_rope_fusion False)."""
    if not model.is_dsa:
        return []
    return ["--experimental-attention-variant dsa", f"--dsa-indexer-n-heads {model.dsa_indexer_n_heads}",
            f"--dsa-indexer-head-dim {model.dsa_indexer_head_dim}", f"--dsa-indexer-topk {model.dsa_indexer_topk}",
            f"--dsa-indexer-loss-coeff {DSA_INDEXER_LOSS['dsa_indexer_loss_coeff']}", "--dsa-indexer-use-sparse-loss",
            "--no-rope-fusion"]


def parallel_flags(model: ModelSpec, plan: Plan) -> list[str]:
    """The expert layout, the dispatcher as priced, the all-to-all overlap and the selective
    recompute modules of MoE / MLA models."""
    a: list[str] = []
    if plan.recompute == "selective" and plan.recompute_modules != "core_attn":
        a.append(f"--recompute-modules {plan.recompute_modules}")
    if not model.is_moe:
        return a
    a += [f"--expert-model-parallel-size {plan.ep}", f"--expert-tensor-parallel-size {plan.etp}",
          f"--moe-token-dispatcher-type {plan.moe_token_dispatcher_type}", "--moe-grouped-gemm",
          "--moe-permute-fusion"]
    a += _flex_backend_flags(plan)
    if plan.overlap_moe_expert_parallel_comm:
        a += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if plan.moe_shared_expert_overlap:
        a.append("--moe-shared-expert-overlap")
    if plan.cutedsl_fused_grouped_mlp:  # and NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 (export.megatron_env)
        a += ["--use-transformer-engine-op-fuser", f"--moe-mlp-glu-interleave-size {FUSED_MLP_GLU_INTERLEAVE}"]
    return a


def attention_keys(model: ModelSpec) -> dict:
    """``attention_flags`` as TransformerConfig fields (the window as a list: YAML has no tuples)."""
    keys: dict = {"qk_layernorm": True} if model.qk_layernorm else {}
    if model.window_size is not None:
        keys.update(window_size=list(model.window_size), window_attn_skip_freq=model.window_attn_skip_freq)
    if model.softmax_type != "vanilla":
        keys["softmax_type"] = model.softmax_type
    if model.mtp_num_layers:
        keys["mtp_num_layers"] = model.mtp_num_layers
    return keys


# Megatron-Bridge's cutedsl_fused_grouped_mlp (v0.5.0 scripts/performance/utils/overrides.py): the
# TE op fuser with the GLU's gate and up rows interleaved in blocks of 32, as the fused kernel reads
# them; perf_plugins.py sets NVTE_CUTEDSL_FUSED_GROUPED_MLP=1, without which TE runs the unfused ops.
FUSED_MLP_GLU_INTERLEAVE = 32


def _flex_backend_flags(plan: Plan) -> list[str]:
    """The flex dispatcher's backend: DeepEP by --moe-enable-deepep (every Megatron-LM since 0.12;
    deprecated, still accepted, where --moe-flex-dispatcher-backend exists), HybridEP by
    --moe-flex-dispatcher-backend hybridep (Megatron-Core 0.15 on)."""
    if plan.moe_token_dispatcher_type != "flex":
        return []
    if plan.moe_flex_dispatcher_backend == "deepep":
        return ["--moe-enable-deepep"]
    return [f"--moe-flex-dispatcher-backend {plan.moe_flex_dispatcher_backend}"]


def config_keys(model: ModelSpec, plan: Plan) -> dict:
    """The same settings as Megatron-Core TransformerConfig fields (NeMo's model config keys);
    MLA's YaRN in full, also the fields Megatron-LM has no flag for."""
    keys = attention_keys(model)
    if model.multi_latent_attention:
        keys.update(multi_latent_attention=True, q_lora_rank=model.q_lora_rank, kv_lora_rank=model.kv_lora_rank,
                    qk_head_dim=model.qk_head_dim, qk_pos_emb_head_dim=model.qk_pos_emb_head_dim,
                    v_head_dim=model.v_head_dim, rotary_scaling_factor=model.rotary_scaling_factor,
                    mscale=model.mscale, mscale_all_dim=model.mscale_all_dim,
                    original_max_position_embeddings=model.original_max_position_embeddings,
                    beta_fast=model.beta_fast, beta_slow=model.beta_slow)
        if model.is_dsa:
            keys.update(experimental_attention_variant="dsa", dsa_indexer_n_heads=model.dsa_indexer_n_heads,
                        dsa_indexer_head_dim=model.dsa_indexer_head_dim, dsa_indexer_topk=model.dsa_indexer_topk,
                        apply_rope_fusion=False, **DSA_INDEXER_LOSS)
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
        moe_router_dtype="fp32" if model.moe_router_fp32 else None,
        expert_model_parallel_size=plan.ep, expert_tensor_parallel_size=plan.etp,
        moe_token_dispatcher_type=plan.moe_token_dispatcher_type, moe_grouped_gemm=True, moe_permute_fusion=True,
        overlap_moe_expert_parallel_comm=plan.overlap_moe_expert_parallel_comm,
        delay_wgrad_compute=plan.overlap_moe_expert_parallel_comm,
        moe_shared_expert_overlap=plan.moe_shared_expert_overlap,
        moe_router_score_function=model.moe_router_score_function,
        moe_router_enable_expert_bias=model.moe_router_enable_expert_bias,
        moe_router_topk_scaling_factor=model.moe_router_topk_scaling_factor,
        moe_router_num_groups=model.moe_router_num_groups, moe_router_group_topk=model.moe_router_group_topk)
    if plan.moe_token_dispatcher_type == "flex" and plan.moe_flex_dispatcher_backend == "deepep":
        keys["moe_enable_deepep"] = True
    elif plan.moe_token_dispatcher_type == "flex":
        keys["moe_flex_dispatcher_backend"] = plan.moe_flex_dispatcher_backend
    if model.moe_router_force_load_balancing:
        keys["moe_router_force_load_balancing"] = True
    if plan.cutedsl_fused_grouped_mlp:
        keys.update(use_transformer_engine_op_fuser=True, moe_mlp_glu_interleave_size=FUSED_MLP_GLU_INTERLEAVE)
    return keys


def te_requirements(model: ModelSpec, plan: Plan) -> list[tuple[str, str]]:
    """(TransformerEngine version, why) for each exported setting that Megatron-LM refuses with an
    older TE (its messages, at the commit above)."""
    need = []
    if plan.overlap_moe_expert_parallel_comm and plan.overlap_grad_reduce:
        need.append(("2.8.0", "--delay-wgrad-compute with --overlap-grad-reduce (validate_args)"))
    if model.softmax_type != "vanilla":
        need.append(("2.8.0", f"--softmax-type {model.softmax_type} (TEDotProductAttention)"))
    if plan.is_fp8 and plan.recompute == "selective" and {"moe_act", "layernorm"} & set(plan.recompute_modules.split()):
        need.append(("2.6.0", "moe_act / layernorm recompute with FP8 (TransformerConfig: >= 2.6.0dev0)"))
    if model.is_moe and plan.is_fp8:
        need.append(("1.11.0", "FP8 grouped GEMM of the experts (TransformerConfig)"))
    if model.is_moe:
        need.append(("2.1.0", "--moe-permute-fusion, the fused permutations priced (TransformerConfig)"))
    if plan.is_fp4:
        need.append(("2.7.0", "--fp4-format: NVFP4BlockScaling (validate_args: TE >= 2.7.0.dev0)"))
    return need


def te_min_version(model: ModelSpec, plan: Plan) -> dict | None:
    """best.yaml's statement of the oldest TransformerEngine the export runs on, or None where
    no exported setting asks for a particular release."""
    need = te_requirements(model, plan)
    if not need:
        return None
    version = max((v for v, _ in need), key=lambda v: tuple(int(x) for x in v.split(".")))
    return {"version": version, "because": [f"TE >= {v}: {why}" for v, why in need]}
