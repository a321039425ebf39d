"""MoE and multi-latent-attention specs (issue 14): Megatron-LM's argument names, its layer
pattern, and parameter counts as Megatron-LM's ``theoretical_memory_usage.py`` counts them."""

import pytest

from autoparallel import io
from autoparallel.errors import SpecError
from autoparallel.specs.model import ModelSpec, moe_layer_pattern

MOE_PRESETS = ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
               "gpt-oss-120b", "gpt-oss-20b", "kimi-k2"]


def megatron_weight_count(m: ModelSpec) -> float:
    """``compute_weight_and_optimizer_memory`` of megatron/training/theoretical_memory_usage.py
    (NVIDIA/Megatron-LM 00caa53a), transcribed: total parameters, RMSNorm, no MTP, vocabulary
    unpadded (every preset's vocabulary is already a multiple of 128)."""
    norm_size = 1 if m.normalization == "rmsnorm" else 2
    gated = 3 / 2 if m.gated_mlp else 1
    pattern = m.moe_layer_pattern if m.is_moe else (0,) * m.num_layers
    num_moe, num_dense = sum(pattern), m.num_layers - sum(pattern)
    h, heads = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        q_term = (h * heads * (m.qk_head_dim + m.qk_pos_emb_head_dim) if m.q_lora_rank is None else
                  m.q_lora_rank * (h + heads * (m.qk_head_dim + m.qk_pos_emb_head_dim) + norm_size))
        attention = (q_term + m.kv_lora_rank * (h + heads * (m.qk_head_dim + m.v_head_dim) + norm_size)
                     + h * m.qk_pos_emb_head_dim + heads * m.v_head_dim * h)
    else:
        ratio = m.head_dim * heads / h
        attention = 2 * h * h * ((1 + m.query_groups / heads) * ratio)
    dense = 2 * h * (m.ffn_hidden_size * gated + norm_size) + attention
    moe = 2 * h * ((m.expert_ffn_hidden_size * (m.num_experts or 1) * gated)
                   + m.shared_expert_ffn_hidden_size * gated + norm_size) + attention
    embedding = h * m.vocab_size * (1 if m.tie_embeddings else 2)
    return dense * num_dense + moe * num_moe + norm_size * h + embedding


def norm_params(m: ModelSpec) -> float:
    """What Megatron counts and we leave out: the layer norms (and MLA's latent norms)."""
    norm_size = 1 if m.normalization == "rmsnorm" else 2
    latents = (m.kv_lora_rank + (m.q_lora_rank or 0)) if m.multi_latent_attention else 0
    return norm_size * ((2 * m.hidden_size + latents) * m.num_layers + m.hidden_size)


@pytest.mark.parametrize("name", MOE_PRESETS + ["llama3-70b", "gpt3-175b"])
def test_parameter_count_is_megatrons_less_norms_plus_router(name):
    m = io.load_model(name)
    router = m.hidden_size * (m.num_experts or 0) * m.num_moe_layers
    assert m.num_parameters == pytest.approx(megatron_weight_count(m) - norm_params(m) + router, abs=0.5)


@pytest.mark.parametrize("name, total, active", [
    ("mixtral-8x7b", 46.7, 12.9), ("mixtral-8x22b", 141, 39), ("qwen3-30b-a3b", 30.5, 3.3),
    ("qwen3-235b-a22b", 235, 22), ("deepseek-v3", 671, 37), ("kimi-k2", 1040, 32.6)])
def test_moe_parameter_counts_match_model_cards(name, total, active):
    m = io.load_model(name)
    assert m.num_parameters / 1e9 == pytest.approx(total, rel=0.02)
    assert m.num_active_parameters / 1e9 == pytest.approx(active, rel=0.03)


def test_gpt_oss_counts_match_its_card_which_leaves_out_the_input_embedding():
    m = io.load_model("gpt-oss-120b")
    assert m.num_parameters / 1e9 == pytest.approx(116.83, rel=0.01)
    assert (m.num_active_parameters - m.embedding_params) / 1e9 == pytest.approx(5.13, rel=0.01)


def test_gpt_oss_20b_counts_match_its_card_21b_total_3_6b_active():
    """OpenAI's gpt-oss-20b card: 21B parameters, 3.6B active (the active count, as for 120B, leaves out the
    input embedding). 24 of 120B's layers with 32 experts instead of 128."""
    m, big = io.load_model("gpt-oss-20b"), io.load_model("gpt-oss-120b")
    assert m.num_parameters / 1e9 == pytest.approx(21, rel=0.01)
    assert (m.num_active_parameters - m.embedding_params) / 1e9 == pytest.approx(3.6, rel=0.01)
    assert m.attention_params == big.attention_params and m.num_moe_layers == 24


def test_deepseek_v3_has_three_dense_layers_and_latent_attention():
    m = io.load_model("deepseek-v3")
    assert m.moe_layer_pattern[:4] == (0, 0, 0, 1) and (m.num_dense_layers, m.num_moe_layers) == (3, 58)
    assert (m.qk_dim, m.v_dim) == (192, 128)
    assert m.dense_layer_params == m.attention_params + 3 * 7168 * 18432


@pytest.mark.parametrize("freq, expected", [
    (1, (1, 1, 1, 1)), (2, (1, 0, 1, 0)), ("2", (1, 0, 1, 0)), ("([0]*1+[1]*3)", (0, 1, 1, 1)),
    ("[1,0]*2", (1, 0, 1, 0)), ("([1]*1+[0]*1)*2", (1, 0, 1, 0))])
def test_moe_layer_freq_reads_megatrons_int_and_pattern_forms(freq, expected):
    assert moe_layer_pattern(freq, 4) == expected


@pytest.mark.parametrize("freq, message", [
    ("([0]*3+[1]*2)", "has 5 entries for 4 layers"), ("[2]*4", "list of 0s and 1s"),
    ("__import__('os')", "not a pattern"), (0, "positive integer")])
def test_bad_moe_layer_freq_is_refused_with_the_reason(freq, message):
    with pytest.raises(ValueError, match=message):
        moe_layer_pattern(freq, 4)


def test_bad_pattern_in_a_model_yaml_names_the_file(tmp_path):
    text = io.preset_files("models")["mixtral-8x7b"].read_text().replace(
        "num_experts: 8", "num_experts: 8\nmoe_layer_freq: \"([0]*3+[1]*30)\"")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=r"bad\.yaml: .*33 entries for 32 layers"):
        io.load_model(str(path))


def test_multi_latent_attention_refuses_query_groups():
    with pytest.raises(ValueError, match="multi-latent attention has no query groups"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                  num_query_groups=2, vocab_size=128, seq_length=32, multi_latent_attention=True)


def test_dense_model_has_no_moe_layers():
    m = io.load_model("llama3-8b")
    assert (m.num_moe_layers, m.router_params, m.layer_params) == (0, 0, m.dense_layer_params)
