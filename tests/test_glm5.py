"""GLM-5: MLA with DeepSeek Sparse Attention uncompressed on every layer (``ModelSpec.is_dsa``): the preset
against Megatron-Bridge's GLM5Bridge and GLM-5's config, its parameters against the published 744B / 40B, its
model FLOPs as Megatron-Bridge's ``dsa`` count (checked on Bridge's own closed-form toy), the pricing of the
sparse core, its Megatron-LM export and the perf recipes' layouts."""

from __future__ import annotations

import dataclasses

import pytest

from autoparallel import io
from autoparallel.costmodel import flops
from autoparallel.specs.finetune import Finetune
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


def _glm_candidates(glm, gpu="h100-sxm", seq=4096, **plan):
    """One GLM-5 plan as the cost model's candidates (TP1, no recompute unless stated)."""
    from autoparallel.costmodel.estimate import candidates, plan_columns
    from autoparallel.specs.plan import Plan
    model = dataclasses.replace(glm, seq_length=seq)
    kw = dict(tp=1, pp=1, cp=1, ep=64, dp=64, mbs=1, gbs=1024, precision="bf16", recompute="none") | plan
    return candidates(model, io.load_hardware(gpu), plan_columns([Plan(**kw)]))


def test_indexer_loss_flops_by_hand(glm):
    """GLM-5's sparse KL loss on every layer (GLM5Bridge: dsa_indexer_loss_coeff 0.001, sparse), as Megatron-LM
    d98e8a64dd's cuDNN path runs it: at 4k each query's top-2048 holds 2048 - 2048 x 2047 / 8192 = 1536.25 causal
    keys; the target recomputes 64 heads' QK^T over the absorbed 512 + 64 channels (2 x 64 x 576 = 73,728 a key)
    with 64 exponentials; the indexer backward's three GEMMs run 32 heads padded to cuDNN's 64 (3 x 2 x 64 x 128
    = 49,152 a key)."""
    keys = 4096 * 1536.25
    assert flops.dsa_indexer_loss_flops(glm, 1, 4096) == (keys * 73_728, keys * 49_152, keys * 64)


def test_indexer_loss_and_topk_times_by_hand(glm):
    """H100, TP1, 4k: the loss's GEMMs (7.73e11 FLOPs, above its 4.0e8 exponentials at the SFUs' rate) at the BF16
    peak and the attention efficiency, none in the backward; the cuDNN scorer writes and the top-k reads each
    query's whole FP32 row of 4,096 scores (8 bytes a score) at the achievable HBM rate. At 128k under CP 32 packed
    sequences keep the cuDNN scorer on each zigzag half's causal key prefix (65 x 131,072 / 128 = 66,560 keys a
    query, 4,096 queries a rank); unpacked ones, and packed ones without CP, score eagerly: 32 bytes a head and 30
    more a score over every key."""
    import numpy as np
    from autoparallel.costmodel import dsa, gemm
    x = _glm_candidates(glm)
    hw = x.hw
    keys = 4096 * 1536.25
    forward, backward = dsa.dsa_indexer_loss_time(x)
    expected = keys * (73_728 + 49_152) / gemm.bf16_peak(hw) / hw.attention_peak_share(x.s_local[0])
    assert keys * 64 / (hw.exp_tera_per_s * 1e12) < keys * (73_728 + 49_152) / gemm.bf16_peak(hw)
    assert np.allclose(forward, expected, rtol=1e-12) and np.all(backward == 0)
    hbm = 3.35e12 * hw.efficiency.hbm
    assert np.allclose(dsa.dsa_indexer_topk_time(x)[0], 4096 * 4096 * 8 / hbm, rtol=1e-12)
    long = _glm_candidates(glm, seq=131072, cp=32, dp=2, ep=64)
    assert np.allclose(dsa.dsa_indexer_topk_time(long)[0], 4096 * 131_072 * (30 + 32 * 32) / hbm, rtol=1e-12)
    packed = dataclasses.replace(glm, finetune=Finetune(packed_sequence=True))
    assert np.allclose(dsa.dsa_indexer_topk_time(_glm_candidates(packed, seq=131072, cp=32, dp=2, ep=64))[0],
                       4096 * 66_560 * 8 / hbm, rtol=1e-12)
    assert np.allclose(dsa.dsa_indexer_topk_time(_glm_candidates(packed))[0], 4096 * 4096 * (30 + 32 * 32) / hbm,
                       rtol=1e-12)
    assert np.allclose(dsa.dsa_indexer_loss_time(long)[0] * 32,
                       4096 * 32 * 2048 * (1 - 2047 / 262_144) * 122_880 / gemm.bf16_peak(hw)
                       / hw.attention_peak_share(long.s_local[0]), rtol=1e-12)


@pytest.mark.parametrize("layer", ["dense_layer", "moe_layer"])
def test_dsa_kernels_are_in_every_layers_sum_once(glm, layer, monkeypatch):
    """The dense and the MoE layer each hold the top-k's and the loss's forward exactly once (their backward is
    nothing), twice where full recompute reruns the layer's forward."""
    import numpy as np
    from autoparallel.costmodel import dsa, layer_time
    for recompute, share in (("none", 1.0), ("full", 2.0)):
        x = _glm_candidates(glm, recompute=recompute)
        added = dsa.dsa_indexer_topk_time(x)[0] + dsa.dsa_indexer_loss_time(x)[0]
        with_kernels = getattr(layer_time, layer)(x)["time"]
        with monkeypatch.context() as m:
            m.setattr(layer_time, "dsa_attention_kernels", lambda x: ())
            without = getattr(layer_time, layer)(x)["time"]
        assert np.all(added > 0) and np.allclose(with_kernels - without, share * added, rtol=1e-9)


def test_cp_is_priced_as_megatrons_allgather_and_exported_so(glm):
    """Megatron-LM d98e8a64dd's TransformerConfig lets DSAttention run CP only as cp_comm_type allgather: each
    layer all-gathers the absorbed latent key (512 + 64) and the indexer key (128) of the whole 128k sequence, BF16
    (2 x 131,072 x 704 = 184.5 MB), and reduce-scatters their gradients; full recompute gathers again. On H100 at
    CP 32 (8 ranks a node, 4 nodes) as NCCL's ring: 31/32 of it at the slower of NVLink and a node's 8 NICs, plus the
    tuner's ring latency at its cheapest protocol (tuning.cc): Simple 8.4 + 28 x 3.4 + 3 x 14.0 = 145.6 us, LL128 (0.92
    of the bandwidth) 14.0 + 28 x 1.9 + 3 x 4.0 = 79.2 us, LL (0.5) 6.6 + 28 x 1.0 + 3 x 2.7 = 42.7 us. The
    exports write --cp-comm-type allgather (p2p, which Megatron refuses for DSA, stays DeepSeek-V3's)."""
    import numpy as np
    from autoparallel.costmodel import layer_time
    from autoparallel.report.export import megatron_args
    from autoparallel.report.nemo import nemo2_recipe
    from autoparallel.specs.plan import Plan
    x = _glm_candidates(glm, seq=131072, cp=32, dp=2, recompute="full")
    hw, nbytes = x.hw, 2 * 131_072 * 704
    eff = hw.efficiency
    bus = min(hw.nvlink_unidirectional_gbps * 1e9 * eff.nvlink, 8 * hw.internode_gbps * 1e9 * eff.internode)
    transfer = 31 / 32 * nbytes / bus
    one = min(transfer + 145.6e-6, transfer / 0.92 + 79.2e-6, transfer / 0.5 + 42.7e-6)
    assert np.allclose(layer_time.cp_comm_time(x, layer_time.attention_time(x)), 3 * one, rtol=1e-12)
    assert np.allclose(layer_time.moe_layer(x)["cp_comm"], 3 * one, rtol=1e-12)
    assert np.allclose(layer_time.cp_comm_time(_glm_candidates(glm, seq=131072, cp=32, dp=2), 0.0), 2 * one)
    plan = Plan(tp=1, pp=13, vp=2, cp=32, dp=1, ep=32, gbs=520)
    assert "--cp-comm-type allgather" in megatron_args(dataclasses.replace(glm, seq_length=131072), plan)
    assert nemo2_recipe(dataclasses.replace(glm, seq_length=131072), plan)["model"]["config"]["cp_comm_type"] == "allgather"
    assert "--cp-comm-type p2p" in megatron_args(dataclasses.replace(io.load_model("deepseek-v3"), seq_length=131072),
                                                 Plan(tp=1, pp=1, cp=32, dp=13, ep=32, gbs=520))
