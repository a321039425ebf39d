"""GLM-5: MLA with DeepSeek Sparse Attention uncompressed on every layer (``ModelSpec.is_dsa``): the preset
against Megatron-Bridge's GLM5Bridge and GLM-5's config, its parameters against the published 744B / 40B, its
model FLOPs as Megatron-Bridge's ``dsa`` count (checked on Bridge's own closed-form toy), the pricing of the
sparse core, its Megatron-LM export and the perf recipes' layouts."""

from __future__ import annotations

import dataclasses

import pytest

from autoparallel import io
from autoparallel.costmodel import flops
from autoparallel.specs.model import ModelSpec


@pytest.fixture(scope="module")
def glm():
    return io.load_model("glm-5")


def test_preset_as_bridge_builds_it(glm):
    """GLM5Bridge: MLA, the dsa variant, 3 dense then 75 MoE layers, one shared expert; its unit test's GLM-5
    config: qk 256 = 192 + 64, index 32 x 128, top-2048. Not DeepSeek-V4 (no compression, no mHC)."""
    assert glm.is_dsa and not glm.is_dsv4 and glm.multi_latent_attention
    assert (glm.num_dense_layers, glm.num_moe_layers) == (3, 75)
    assert glm.qk_head_dim + glm.qk_pos_emb_head_dim == 256
    assert (glm.dsa_indexer_n_heads, glm.dsa_indexer_head_dim, glm.dsa_indexer_topk) == (32, 128, 2048)
    assert glm.hyper_connection_params == 0


def test_parameters_as_published(glm):
    """zai-org's GLM-5 README: 744B parameters, 40B active: 743.9B (MTP left out), 40.83B activated without
    the input embedding (+2.1 %); the indexer adds 9.37M a layer."""
    assert glm.num_parameters == pytest.approx(744e9, rel=0.005)
    assert glm.num_active_parameters - glm.embedding_params == pytest.approx(40e9, rel=0.03)
    assert glm.dsa_indexer_params == 2048 * 32 * 128 + 6144 * (128 + 32)


def _bridge_toy(**changes) -> ModelSpec:
    """Megatron-Bridge 067f987df0 tests/unit_tests/training/utils/test_flop_utils.py TestDynamicSparseAttentionFlops
    toy: one layer, hidden 8, seq 4, 2 heads, q_lora 4, kv_lora 3, qk 2 + 1 rotary, v 2, indexer 2 x 2 top-2,
    vocab 128, a non-gated MLP (Bridge's has ffn 0, which ModelSpec refuses: ours has 4, 6 x 2 x 8 x 4 = 384 a
    token, taken off)."""
    kw = dict(name="dsa-toy", num_layers=1, hidden_size=8, ffn_hidden_size=4, num_attention_heads=2,
              num_query_groups=2, vocab_size=128, seq_length=4, activation="gelu", position_embedding_type="rope",
              multi_latent_attention=True, q_lora_rank=4, kv_lora_rank=3, qk_head_dim=2, qk_pos_emb_head_dim=1,
              v_head_dim=2, dsa_indexer_n_heads=2, dsa_indexer_head_dim=2, dsa_indexer_topk=2)
    return ModelSpec(**(kw | changes))


def test_model_flops_reproduce_bridges_closed_form_toy():
    """Bridge's expected figures: 4 x (906 + 147 + 192 + 72 + 28 + 6144) at S 4; 60,228 at S 8; +372 for top-4;
    + 4 x (1345 + 912 + 6144) with an MTP layer (its MLP, dense here, another 384)."""
    mlp = 384
    toy = _bridge_toy()
    assert 4 * (flops.model_flops_per_token(toy) - mlp) == 4 * (906 + 147 + 192 + 72 + 28 + 6144)
    assert 8 * (flops.model_flops_per_token(_bridge_toy(seq_length=8)) - mlp) == 60_228
    wider = flops.model_flops_per_token(_bridge_toy(dsa_indexer_topk=4))
    assert 4 * (wider - flops.model_flops_per_token(toy)) == 372
    mtp = flops.model_flops_per_token(_bridge_toy(mtp_num_layers=1)) - flops.model_flops_per_token(toy)
    assert mtp == 1345 + 912 + 6144 + mlp


def test_glm5_model_flops(glm):
    """315.0 GFLOP a token at 4k (the MTP layer included, as Bridge counts it); at the SFT recipes' 128k the
    sparse core stays at 2048 keys a query and only the indexer's scores grow with the context: under a third of
    dense MLA's count at 128k."""
    count = flops.model_flops_per_token(glm)
    assert count == flops.dsa_flops_per_token(glm) == pytest.approx(315.04e9, rel=0.001)
    long = flops.model_flops_per_token(dataclasses.replace(glm, seq_length=131072))
    dense_mla = dataclasses.replace(glm, seq_length=131072, dsa_indexer_n_heads=None, dsa_indexer_head_dim=None,
                                    dsa_indexer_topk=None)
    assert count < long < flops.model_flops_per_token(dense_mla) / 3


def test_the_sparse_core_as_priced_against_dense_mla(glm):
    """The layer time's attention core (flops.attention_core_flops) is the absorbed kernel (QK over 512 + 64
    channels, P·V over 512, as Megatron-Core's dsa variant runs it) on the top-k keys plus the indexer's scores:
    at the SFT recipes' 128k a fifth of dense causal MLA's (256 + 256 channels; the indexer's dense scores are two
    thirds of it); at 4k, where the top-2048 is half the context, the wider absorbed channels cost more than dense
    MLA would."""
    dense = dataclasses.replace(glm, dsa_indexer_n_heads=None, dsa_indexer_head_dim=None, dsa_indexer_topk=None)
    for s, below in ((131072, True), (4096, False)):
        sparse, full = flops.attention_core_flops(glm, 1, s), flops.attention_core_flops(dense, 1, s, causal=True)
        assert (sparse < 0.25 * full) if below else (sparse > full)
    short = flops.attention_core_flops(glm, 1, 1024)
    assert short == pytest.approx(1024 * (2 * 64 * 512.5 * (2 * 512 + 64) + 2 * 32 * 129 * 512.5))


def test_a_dsa_indexer_needs_mla_and_all_three_fields():
    base = io.load_model("deepseek-v3")
    with pytest.raises(ValueError, match="all three"):
        dataclasses.replace(base, dsa_indexer_topk=2048)
    with pytest.raises(ValueError, match="needs multi_latent_attention"):
        dataclasses.replace(io.load_model("llama3-8b"), dsa_indexer_n_heads=8, dsa_indexer_head_dim=64,
                            dsa_indexer_topk=512)
    assert not base.is_dsa and not io.load_model("deepseek-v4-flash").is_dsa


def test_export_writes_megatrons_dsa_variant(glm):
    """Megatron-LM d98e8a64dd builds DSA from TransformerConfig's generated flags; RoPE fusion off (its
    TransformerConfig asserts it); the indexer loss as GLM5Bridge sets it."""
    from autoparallel.report.export import megatron_args, nemo2_recipe
    from autoparallel.specs.plan import Plan
    plan = Plan(tp=1, pp=4, vp=7, dp=64, ep=64, gbs=1024)
    args = megatron_args(glm, plan)
    for flag in ("--experimental-attention-variant dsa", "--dsa-indexer-n-heads 32", "--dsa-indexer-head-dim 128",
                 "--dsa-indexer-topk 2048", "--dsa-indexer-loss-coeff 0.001", "--dsa-indexer-use-sparse-loss",
                 "--no-rope-fusion", "--multi-latent-attention", "--mtp-num-layers 1"):
        assert flag in args, flag
    config = nemo2_recipe(glm, plan)["model"]["config"]
    assert config["experimental_attention_variant"] == "dsa" and config["apply_rope_fusion"] is False
    assert "--experimental-attention-variant dsa" not in megatron_args(io.load_model("deepseek-v3"), plan)


def test_serving_refuses_glm5(glm):
    """The serving model prices dense MLA over the whole KV cache: GLM-5's sparse reads are not priced."""
    from autoparallel.costmodel import inference
    from autoparallel.errors import UnpricedModelError
    with pytest.raises(UnpricedModelError, match="DeepSeek Sparse Attention"):
        inference.refuse_unpriced(glm)
    inference.refuse_unpriced(io.load_model("deepseek-v3"))
