"""Each MoE preset is the published model: every field of its Hugging Face config.json that
changes what Megatron-LM builds, read from the preset, written in the Megatron-LM arguments with
Megatron's flag and in the NeMo 2 model config with Megatron-Core's TransformerConfig key.

The config.json values are written out below, each list headed by where they were read (the
sources the preset's ``source:`` names). A flag of None: Megatron-LM (the pinned commit of
``report.moe_export``) has no argument for the field; the NeMo key carries it alone.
"""

import dataclasses
import re

import pytest

from autoparallel import io
from autoparallel.report import moe_export
from autoparallel.report.export import megatron_args
from autoparallel.report.nemo import nemo1_config, nemo2_recipe
from autoparallel.search import run
from autoparallel.space import SearchSpace
from autoparallel.specs.plan import Plan

# (ModelSpec field, value from config.json, Megatron-LM argument, TransformerConfig key)
# huggingface.co/deepseek-ai/DeepSeek-V3 config.json, as NVIDIA-NeMo/Megatron-Bridge
# DeepSeekV3ModelProvider (066adea) and Megatron-LM's DeepSeek-R1.sh (d98e8a6) transcribe it.
DEEPSEEK_V3 = [
    ("num_experts", 256, "--num-experts 256", "num_moe_experts"),  # n_routed_experts
    ("moe_router_topk", 8, "--moe-router-topk 8", "moe_router_topk"),  # num_experts_per_tok
    ("moe_ffn_hidden_size", 2048, "--moe-ffn-hidden-size 2048", "moe_ffn_hidden_size"),  # moe_intermediate_size
    ("moe_shared_expert_intermediate_size", 2048, "--moe-shared-expert-intermediate-size 2048",
     "moe_shared_expert_intermediate_size"),  # n_shared_experts 1 x 2048
    ("moe_router_score_function", "sigmoid", "--moe-router-score-function sigmoid",
     "moe_router_score_function"),  # scoring_func
    ("moe_router_enable_expert_bias", True, "--moe-router-enable-expert-bias",
     "moe_router_enable_expert_bias"),  # topk_method noaux_tc
    ("moe_router_topk_scaling_factor", 2.5, "--moe-router-topk-scaling-factor 2.5",
     "moe_router_topk_scaling_factor"),  # routed_scaling_factor
    ("moe_router_num_groups", 8, "--moe-router-num-groups 8", "moe_router_num_groups"),  # n_group
    ("moe_router_group_topk", 4, "--moe-router-group-topk 4", "moe_router_group_topk"),  # topk_group
    ("mtp_num_layers", 1, "--mtp-num-layers 1", "mtp_num_layers"),  # num_nextn_predict_layers
    ("qk_layernorm", True, "--qk-layernorm", "qk_layernorm"),  # q_a_layernorm, kv_a_layernorm
    ("q_lora_rank", 1536, "--q-lora-rank 1536", "q_lora_rank"),
    ("kv_lora_rank", 512, "--kv-lora-rank 512", "kv_lora_rank"),
    ("qk_head_dim", 128, "--qk-head-dim 128", "qk_head_dim"),  # qk_nope_head_dim
    ("qk_pos_emb_head_dim", 64, "--qk-pos-emb-head-dim 64", "qk_pos_emb_head_dim"),  # qk_rope_head_dim
    ("v_head_dim", 128, "--v-head-dim 128", "v_head_dim"),
    ("rotary_base", 10000, "--rotary-base 10000", "rotary_base"),  # rope_theta
    ("rotary_scaling_factor", 40.0, "--rotary-scaling-factor 40.0", "rotary_scaling_factor"),  # rope_scaling.factor
    ("mscale", 1.0, "--mscale 1.0", "mscale"),  # rope_scaling.mscale
    ("mscale_all_dim", 1.0, "--mscale-all-dim 1.0", "mscale_all_dim"),  # rope_scaling.mscale_all_dim
    ("original_max_position_embeddings", 4096, None, "original_max_position_embeddings"),
    ("beta_fast", 32.0, None, "beta_fast"),  # rope_scaling.beta_fast (Megatron's default too)
    ("beta_slow", 1.0, None, "beta_slow"),
]
# huggingface.co/moonshotai/Kimi-K2-Instruct config.json, as Megatron-Bridge KimiK2Provider
# (1e59114) and Megatron-LM's Kimi-K2-Instruct.sh (d98e8a6) transcribe it: n_group 1 and
# topk_group 1 (no group-limited routing), num_nextn_predict_layers 0 (no MTP).
KIMI_K2 = [
    ("num_experts", 384, "--num-experts 384", "num_moe_experts"),
    ("moe_router_topk", 8, "--moe-router-topk 8", "moe_router_topk"),
    ("moe_router_score_function", "sigmoid", "--moe-router-score-function sigmoid", "moe_router_score_function"),
    ("moe_router_enable_expert_bias", True, "--moe-router-enable-expert-bias", "moe_router_enable_expert_bias"),
    ("moe_router_topk_scaling_factor", 2.827, "--moe-router-topk-scaling-factor 2.827",
     "moe_router_topk_scaling_factor"),
    ("moe_router_num_groups", None, None, "moe_router_num_groups"),
    ("mtp_num_layers", 0, None, None),
    ("qk_layernorm", True, "--qk-layernorm", "qk_layernorm"),
    ("rotary_base", 50000, "--rotary-base 50000", "rotary_base"),
    ("rotary_scaling_factor", 32.0, "--rotary-scaling-factor 32.0", "rotary_scaling_factor"),
    ("mscale", 1.0, "--mscale 1.0", "mscale"),
    ("mscale_all_dim", 1.0, "--mscale-all-dim 1.0", "mscale_all_dim"),
    ("original_max_position_embeddings", 4096, None, "original_max_position_embeddings"),
    ("beta_fast", 1.0, None, "beta_fast"),  # not Megatron's default 32: only the NeMo key has it
    ("beta_slow", 1.0, None, "beta_slow"),
]
# Qwen/Qwen3-30B-A3B and Qwen3-235B-A22B config.json (Qwen3MoeAttention q_norm / k_norm), as
# Megatron-Bridge Qwen3MoEBridge (3ec0b0a, qk_layernorm = True) and Megatron-LM's Qwen3-*.sh
# (d98e8a6, --qk-layernorm) transcribe it; softmax router with norm_topk_prob = Megatron's default.
QWEN3 = [
    ("qk_layernorm", True, "--qk-layernorm", "qk_layernorm"),
    ("num_experts", 128, "--num-experts 128", "num_moe_experts"),
    ("moe_router_topk", 8, "--moe-router-topk 8", "moe_router_topk"),
    ("moe_router_score_function", "softmax", None, "moe_router_score_function"),
    ("rotary_base", 1000000, "--rotary-base 1000000", "rotary_base"),  # rope_theta
    ("kv_channels", 128, "--kv-channels 128", "kv_channels"),  # head_dim
]
# huggingface.co/openai/gpt-oss-120b config.json (layer_types sliding/full alternating,
# sliding_window 128, per-head sinks, attention and expert biases), as Megatron-LM's
# gpt-oss-120b.sh (d98e8a6) transcribes it.
GPT_OSS = [
    ("window_size", (127, 0), "--window-size 127,0", "window_size"),
    ("window_attn_skip_freq", 2, "--window-attn-skip-freq 2", "window_attn_skip_freq"),
    ("softmax_type", "learnable", "--softmax-type learnable", "softmax_type"),
    ("add_bias_linear", True, None, "add_bias_linear"),  # attention_bias; Megatron's default: no flag
    ("num_experts", 128, "--num-experts 128", "num_moe_experts"),  # num_local_experts
    ("moe_router_topk", 4, "--moe-router-topk 4", "moe_router_topk"),  # num_experts_per_tok
    ("rotary_base", 150000, "--rotary-base 150000", "rotary_base"),
]
# mistralai/Mixtral-8x7B-v0.1 / 8x22B-v0.1 config.json: softmax over the top-2 logits (Megatron's
# default router), sliding_window null, no rope_scaling, no QK norm.
MIXTRAL = [
    ("moe_router_score_function", "softmax", None, "moe_router_score_function"),
    ("moe_router_enable_expert_bias", False, None, "moe_router_enable_expert_bias"),
    ("moe_router_topk_scaling_factor", None, None, "moe_router_topk_scaling_factor"),
    ("moe_router_topk", 2, "--moe-router-topk 2", "moe_router_topk"),
    ("num_experts", 8, "--num-experts 8", "num_moe_experts"),
    ("rotary_base", 1000000, "--rotary-base 1000000", "rotary_base"),
    ("qk_layernorm", False, None, None),
    ("window_size", None, None, None),
]
# gpt-oss-20b: the same layer (Megatron-LM d98e8a64dd gpt-oss-20b.sh) with 32 experts.
GPT_OSS_20B = [f for f in GPT_OSS if f[0] != "num_experts"] + [("num_experts", 32, "--num-experts 32", "num_moe_experts")]
PRESETS = {"deepseek-v3": DEEPSEEK_V3, "kimi-k2": KIMI_K2, "qwen3-30b-a3b": QWEN3, "qwen3-235b-a22b": QWEN3,
           "gpt-oss-120b": GPT_OSS, "gpt-oss-20b": GPT_OSS_20B, "mixtral-8x7b": MIXTRAL, "mixtral-8x22b": MIXTRAL}
CASES = [(name, *field) for name, fields in PRESETS.items() for field in fields]
PLAN = Plan(tp=1, pp=1, dp=8, gbs=64, ep=8)


def _yaml(value):
    """A value as the NeMo configs hold it (YAML has lists, not tuples)."""
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("name, field, value, flag, key", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_preset_states_the_config_json_field_and_exports_it(name, field, value, flag, key):
    model = io.load_model(name)
    assert getattr(model, field) == value
    args = megatron_args(model, PLAN)
    if flag is not None:
        assert flag in args
    if key is not None:
        assert nemo2_recipe(model, PLAN)["model"]["config"][key] == _yaml(value)
        assert nemo1_config(model, PLAN)["model"].get(key, value) == _yaml(value)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "gpt-oss-120b", "gpt-oss-20b"])
def test_softmax_routers_write_no_router_flag_megatron_would_not_default_to(name):
    args = " ".join(megatron_args(io.load_model(name), PLAN))
    for flag in ("--moe-router-score-function", "--moe-router-enable-expert-bias",
                 "--moe-router-topk-scaling-factor", "--moe-router-num-groups", "--mtp-num-layers"):
        assert flag not in args


def test_a_dense_model_exports_none_of_the_attention_variants():
    args = megatron_args(io.load_model("llama3-8b"), Plan(tp=1, pp=1, dp=8, gbs=64))
    assert not any(a.split()[0] in ("--qk-layernorm", "--window-size", "--softmax-type", "--rotary-scaling-factor")
                   for a in args)


# (change to Mixtral-8x7B that Megatron-LM refuses, its reason, the smallest change that passes)
REFUSED = [
    (dict(moe_router_enable_expert_bias=True), "Expert bias for aux-loss-free routing only supports sigmoid",
     dict(moe_router_score_function="sigmoid")),
    (dict(moe_router_topk_scaling_factor=0.0), "moe_router_topk_scaling_factor must be positive",
     dict(moe_router_topk_scaling_factor=2.5)),
    (dict(rotary_scaling_factor=40.0), "Megatron-LM applies YaRN only to multi-latent attention",
     dict(rotary_scaling_factor=1.0)),
    (dict(beta_fast=1.0), "beta_fast: Megatron-LM applies YaRN only to multi-latent attention",
     dict(beta_fast=32.0)),
    (dict(window_size=(127, 0, 1)), "window_size is (left, right)", dict(window_size=(127, 0))),
    (dict(window_attn_skip_freq=2), "window_attn_skip_freq needs window_size", dict(window_size=(127, 0))),
    # TransformerConfig: "moe_shared_expert_intermediate_size must be num_shared_experts * ffn_size_of_each..."
    (dict(moe_shared_expert_intermediate_size=0), "moe_shared_expert_intermediate_size must be a positive integer",
     dict(moe_shared_expert_intermediate_size=14336)),
    (dict(mtp_num_layers=1, position_embedding_type="learned_absolute"),
     "Multi-Token Prediction (MTP) is not supported with learned_absolute", dict(position_embedding_type="rope")),
]


@pytest.mark.parametrize("change, message, fix", REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_a_field_megatron_would_refuse_is_refused_with_its_reason(change, message, fix):
    model = io.load_model("mixtral-8x7b")
    with pytest.raises(ValueError, match=re.escape(message)):
        dataclasses.replace(model, **change)
    assert dataclasses.replace(model, **{**change, **fix})


# (model, plan, TransformerEngine release best.yaml states; None: no setting asks for one)
TE_CASES = [
    # TransformerConfig: "fused permutation is not available. Please install TE >= 2.1.0."
    ("mixtral-8x7b", Plan(tp=1, pp=1, dp=8, gbs=64, ep=8), "2.1.0"),
    # validate_args: "overlap_grad_reduce is only supported with TE >= 2.8.0 when enabling delay_wgrad_compute"
    ("mixtral-8x7b", Plan(tp=1, pp=1, dp=8, gbs=64, ep=8, overlap_moe_expert_parallel_comm=True), "2.8.0"),
    ("mixtral-8x7b", Plan(tp=1, pp=1, dp=8, gbs=64, ep=8, overlap_moe_expert_parallel_comm=True,
                          overlap_grad_reduce=False, overlap_param_gather=False), "2.1.0"),
    # TransformerConfig: FP8 grouped GEMM (>= 1.11.0); moe_act recompute under FP8 (>= 2.6.0dev0)
    ("mixtral-8x7b", Plan(tp=1, pp=1, dp=8, gbs=64, ep=8, precision="fp8-current"), "2.1.0"),
    ("mixtral-8x7b", Plan(tp=1, pp=1, dp=8, gbs=64, ep=8, precision="fp8-current", recompute="selective",
                          recompute_modules="moe_act"), "2.6.0"),
    # TEDotProductAttention: "Transformer-Engine ... must be >= 2.8.0 to support `softmax_type`"
    ("gpt-oss-120b", Plan(tp=1, pp=1, dp=8, gbs=64, ep=8), "2.8.0"),
    ("llama3-8b", Plan(tp=1, pp=1, dp=8, gbs=64, precision="fp8-current"), None),
]


@pytest.mark.parametrize("name, plan, version", TE_CASES)
def test_best_yaml_states_the_transformer_engine_the_export_needs(name, plan, version):
    stated = moe_export.te_min_version(io.load_model(name), plan)
    assert (stated and stated["version"]) == version
    if stated:
        assert all(line.startswith("TE >= ") for line in stated["because"])


def test_an_fp8_moe_export_states_the_fp8_grouped_gemm_requirement_too():
    plan = Plan(tp=1, pp=1, dp=8, gbs=64, ep=8, precision="fp8-current")
    versions = [v for v, _ in moe_export.te_requirements(io.load_model("mixtral-8x7b"), plan)]
    assert "1.11.0" in versions and "2.1.0" in versions


def test_best_yaml_of_a_search_carries_the_statement():
    model, hw = io.load_model("gpt-oss-120b"), io.load_hardware("h100-sxm")
    space = SearchSpace().pinned(tp=1, pp=4, vp=1, ep=8, mbs=1, recompute="full", precision="bf16")
    result = run.search(model, hw, 64, 512, space)
    doc = run.plan_document(model, hw, result.feasible.iloc[0])
    assert doc["transformer_engine_min_version"]["version"] == "2.8.0"
    assert "--softmax-type learnable" in doc["megatron_args"]
