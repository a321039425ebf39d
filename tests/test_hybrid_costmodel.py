"""Hybrid Mamba-Transformer models (``hybrid_layer_pattern``) in the training cost model.

Each new term is pinned to a hand computation (FLOPs over peak, bytes over bandwidth) written out
here from the kernels' shapes, not by calling the helper under test; a pattern of attention and
MLP (or MoE) layers only is checked against the standard model it spells; Nemotron 3 Nano's
parameters on the GPUs add up to ``ModelSpec.num_parameters``.
"""

import dataclasses

import numpy as np
import pytest

from autoparallel.costmodel import flops, gemm, mamba
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import estimate_plan, plan_columns
from autoparallel.costmodel.inference import layout
from autoparallel.errors import UnpricedModelError, UserError
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

REL = 1e-12
NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"


def nano(**changes) -> ModelSpec:
    """Nemotron 3 Nano's shapes (NVIDIA-NeMo/Megatron-Bridge HEAD
    src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_nano.py, HybridModelProvider)."""
    base = dict(name="nano", num_layers=52, hidden_size=2688, ffn_hidden_size=1856, num_attention_heads=32,
                num_query_groups=2, kv_channels=128, vocab_size=131072, seq_length=8192, activation="squared_relu",
                normalization="rmsnorm", hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=False,
                hybrid_layer_pattern=NANO_PATTERN, mamba_num_heads=64, mamba_head_dim=64, mamba_state_dim=128,
                mamba_num_groups=8, num_experts=128, moe_router_topk=6, moe_ffn_hidden_size=1856,
                moe_shared_expert_intermediate_size=3712)
    return ModelSpec(**{**base, **changes})


def _cands(model, hw, **knobs):
    base = dict(tp=2, pp=1, dp=4, ep=4, mbs=1, gbs=16, sp=True, precision="bf16")
    return candidates(model, hw, plan_columns([Plan(**{**base, **knobs})]))


def test_ssd_flops_written_out_from_the_kernels():
    """Nano: Q 128, N 128, G 8, d 4096. Forward: C·Bᵀ 2QNG, chunk state 2Nd, output from the
    states 2Nd, causal intra-chunk Qd; backward: recomputed C·Bᵀ and states, dstates, dx (2Nd +
    Qd), dC, dB, dCB (Qd), and dC, dB from dCB (4QNG)."""
    forward, backward = mamba.ssd_flops_per_token(nano())
    q, n, g, d = 128, 128, 8, 4096
    assert forward == 2 * q * n * g + 4 * n * d + q * d == 2_883_584
    assert backward == 6 * q * n * g + 10 * n * d + 2 * q * d


def test_ssd_time_is_the_slower_of_flops_and_bytes(hw):
    """tp 2 halves the heads: the GPU's tokens (mbs 1 x 8192) run half the per-token work."""
    x = _cands(nano(), hw)
    tokens = 8192 / 2
    q, n, g, d, heads = 128, 128, 8, 4096, 64
    hbm = hw.hbm_tbps * 1e12 * hw.efficiency.hbm
    peak = hw.bf16_tflops * 1e12 * gemm.tensor_speed(hw)
    fwd_flops = tokens * (2 * q * n * g + 4 * n * d + q * d)
    eff = hw.efficiency.gemm_max / (1 + hw.efficiency.gemm_half_gflop / (fwd_flops / 3 / 1e9))
    fwd_bytes = tokens * (16 * d * n / q + 2 * (d + 2 * g * n + heads + d) + 2 * 2 * d)
    assert mamba.ssd_time(x)[0][0] == pytest.approx(max(fwd_flops / (peak * eff), fwd_bytes / hbm), rel=REL)


def test_ssd_backward_bytes_counted_kernel_by_kernel():
    """Nano (d 4096, G·N 1024, G·Q 1024, d·N/Q 4096 state elements per token), from
    state-spaces/mamba e9594ce _mamba_chunk_scan_combined_bwd: the chunk states 34 B each
    (FP32 recompute 4 + 8, FP32 dstates 4, _state_passing_bwd 8 in and 4 out, three BF16 reads
    of 2); x / z / out_x / dout / their gradients 17 BF16 passes; B, C and their gradients 11 BF16
    and 8 FP32 passes; C·Bᵀ and its gradient 8 FP32 passes. The forward is unchanged."""
    d, gn, gq, states = 4096, 8 * 128, 8 * 128, 4096 * 128 / 128
    backward = 34 * states + 17 * 2 * d + (11 * 2 + 8 * 4) * gn + 8 * 4 * gq
    assert backward == 366_592
    forward = 16 * states + 2 * (d + 2 * gn + 64 + d) + 2 * 2 * d
    assert mamba.ssd_bytes_per_token(nano()) == pytest.approx((forward, backward), rel=REL)


@pytest.mark.parametrize("mbs", [1, 2, 4])
def test_layout_copies_only_when_a_micro_batch_holds_several_sequences(hw, mbs):
    """MambaMixer._ssm_training's rearrange(...).contiguous() of zxBCdt (2·4096 + 2·8·128 + 64 =
    10304 wide) and of y (4096), each read and written in BF16, and in the backward the zxBCdt
    gradient once more; tp 2 halves the widths. One sequence per micro-batch: contiguous, no copy."""
    x = _cands(nano(), hw, mbs=mbs, gbs=16)
    hbm = hw.hbm_tbps * 1e12 * hw.efficiency.hbm
    tokens = mbs * 8192
    width, d = 2 * 4096 + 2 * 8 * 128 + 64, 4096
    expected = (tokens * 4 * (width + d) / 2 / hbm, tokens * 4 * width / 2 / hbm) if mbs > 1 else (0.0, 0.0)
    assert [v[0] for v in mamba.layout_copy_time(x)] == pytest.approx(expected, rel=REL)


def test_conv_and_norm_are_bytes_over_bandwidth(hw):
    x = _cands(nano(), hw)
    hbm = hw.hbm_tbps * 1e12 * hw.efficiency.hbm
    tokens = 8192 / 2
    conv = tokens * 2 * (4096 + 2 * 8 * 128) / hbm  # x, B, C in BF16, one pass
    norm = tokens * 2 * 4096 / hbm
    assert [v[0] for v in mamba.conv_time(x)] == pytest.approx([2 * conv, 5 * conv], rel=REL)
    assert [v[0] for v in mamba.norm_time(x)] == pytest.approx([2 * norm, 3 * norm], rel=REL)


@pytest.mark.parametrize("mbs", [1, 2])
def test_mamba_layer_sums_its_terms(hw, mbs):
    """The M layer's forward is its GEMMs, its generic elementwise share (the norm input), the
    launches and the four mixer kernels (the layout copies zero at mbs 1); its compute the 1F2B of
    the GEMMs plus each kernel's own backward. Doubling or deleting a Mamba term fails here."""
    x = _cands(nano(), hw, mbs=mbs, gbs=4 * mbs)
    layer = lt.mamba_layer(x)
    h, width, d = 2688, 2 * 4096 + 2 * 8 * 128 + 64, 4096
    lin_flops = 2.0 * mbs * 8192 * (h * width + d * h) / 2
    t_linear = lin_flops / (x.gemm_peak * gemm.efficiency(hw, lin_flops / 2))
    hbm = hw.hbm_tbps * 1e12 * hw.efficiency.hbm
    elementwise = hw.efficiency.elementwise_bytes_per_token_hidden / 34.0 * 2.0 * mbs * 8192 * h / 2 / hbm
    kernels = [mamba.ssd_time(x), mamba.conv_time(x), mamba.norm_time(x), mamba.layout_copy_time(x)]
    forward = t_linear + elementwise + hw.efficiency.layer_overhead_s + sum(f for f, _ in kernels)
    assert layer["forward"][0] == pytest.approx(forward[0], rel=1e-9)
    compute = 3 * forward + sum(b - 2 * f for f, b in kernels)
    assert layer["compute"][0] == pytest.approx(compute[0], rel=1e-9)
    assert layer["cp_comm"][0] == 0.0 and layer["ep_comm"][0] == 0.0


def test_layernorm_recompute_reruns_only_the_e_layers_norm(hw):
    """--recompute-modules layernorm on a hybrid model: Megatron-LM's hybrid_stack_spec fuses the M, *
    and - layers' pre-norm into their first Linear (nothing to recompute); the E layer's TENorm
    pre_mlp_layernorm reads its BF16 input and writes its BF16 output again in the backward (tp 2 with
    SP: 8192 / 2 tokens x 2688 hidden)."""
    x = _cands(nano(), hw, recompute="selective", recompute_modules="layernorm")
    hbm = hw.hbm_tbps * 1e12 * hw.efficiency.hbm
    one_norm = (2 + 2) * 8192 / 2 * 2688 / hbm
    zero = np.zeros(1)
    for symbol in "M*-":
        assert lt.selective_recompute_time(x, zero, zero, lt.HYBRID[symbol])[0] == 0.0, symbol
    assert lt.selective_recompute_time(x, zero, zero, lt.HYBRID["E"])[0] == pytest.approx(one_norm, rel=REL)


def test_mamba_activations_from_what_the_mixer_saves(hw):
    """BF16, tp 2 with SP: the norm input and in_proj input (h each, SP-sharded), zxBCdt, out_x, the
    norm input and out_proj input (TP-sharded), the norm's FP32 rstd per group."""
    x = _cands(nano(), hw)
    h, width, d, g = 2688, 2 * 4096 + 2 * 8 * 128 + 64, 4096, 8
    per_token = (2 * h + 2 * h) / 2 + (2 * width + 2 * d + 2 * d + 4 * g + 2 * d) / 2
    assert lt.activation_bytes(x, lt.HYBRID["M"], x.keep_scores)[0] == pytest.approx(8192 * per_token, rel=REL)


def test_nano_parameters_on_the_gpus_add_up(hw):
    """pp 1, tp 1, ep 1: every layer's parameters on the one stage, plus the embedding and the
    output layer, are the model's."""
    model = nano()
    x = candidates(model, hw, plan_columns([Plan(tp=1, pp=1, dp=8, mbs=1, gbs=8, ep=1)]))
    layers = lt.layer_params(x)
    n_moe = model.layer_kind_counts["E"]
    on_gpu = (layers.on("params", 52, n_moe) + n_moe * layers.moe["expert_params"]
              + 2 * model.embedding_params)
    assert on_gpu[0] == pytest.approx(model.num_parameters, rel=1e-12)
    assert model.num_parameters == pytest.approx(31.58e9, rel=1e-3)


def test_model_flops_as_megatron_counts_them():
    """Megatron-LM hybrid_flops for Nano, written out: its Mamba in_proj on d_in = 2h."""
    model = nano()
    h, s, v = 2688, 8192, 131072
    d_in = 2 * h
    mamba_fwd = 2 * h * (2 * d_in + 2 * 8 * 128 + 64) + 7 * d_in * 128 + 2 * d_in * h
    attn_fwd = 4 * h * 128 * (32 + 2) + 2 * s * 32 * 128
    moe_fwd = 4 * h * 1856 * 6 + 4 * h * 3712
    expected = 3 * (23 * mamba_fwd + 6 * attn_fwd + 23 * moe_fwd + 2 * h * v)
    assert flops.model_flops_per_token(model) == pytest.approx(expected, rel=REL)


def test_latent_moe_prices_experts_on_the_latent_width():
    model = nano(moe_latent_size=1024)
    assert flops.megatron_moe_flops_per_token(model) == pytest.approx(
        4 * 1024 * 1856 * 6 + 4 * 2688 * 1024 + 4 * 2688 * 3712, rel=REL)


def _dense_pair():
    """A standard dense model of 12 layers and the hybrid pattern of 24 one-block layers that
    spells it (attention, then MLP)."""
    dense = ModelSpec(name="d", num_layers=12, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                      num_query_groups=4, vocab_size=32000, seq_length=4096, activation="swiglu",
                      normalization="rmsnorm", hidden_dropout=0.0, attention_dropout=0.0)
    return dense, dataclasses.replace(dense, num_layers=24, hybrid_layer_pattern="*-" * 12)


def _moe_pair():
    moe = ModelSpec(name="m", num_layers=12, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=16,
                    num_query_groups=4, vocab_size=32000, seq_length=4096, activation="swiglu",
                    normalization="rmsnorm", hidden_dropout=0.0, attention_dropout=0.0, num_experts=16,
                    moe_router_topk=2, moe_ffn_hidden_size=1024, moe_shared_expert_intermediate_size=1024)
    return moe, dataclasses.replace(moe, num_layers=24, hybrid_layer_pattern="*E" * 12)


@pytest.mark.parametrize("pair", [_dense_pair, _moe_pair])
def test_attention_and_ffn_layers_price_as_the_standard_model(pair, hw):
    """The same weights, FLOPs and stored activations exactly; under CUDA graphs the same step
    exactly (each one-block layer's GEMMs are read on the GEMM curve at their own size, two GEMMs
    of the block's, which on this case gives the same efficiency); without graphs each one-block
    layer pays the per-layer launch overhead of its own: compute_s grows by exactly those
    launches (three per layer and micro-batch: forward, backward's two)."""
    standard, hybrid = pair()
    assert hybrid.num_parameters == standard.num_parameters
    assert flops.model_flops_per_token(hybrid) == pytest.approx(flops.model_flops_per_token(standard), rel=REL)
    plan = Plan(tp=2, pp=2, dp=2, ep=2 if standard.is_moe else 1, mbs=1, gbs=16, sp=True, precision="fp8-current")
    a, b = estimate_plan(standard, hw, plan), estimate_plan(hybrid, hw, plan)
    for key in ("weights_gib", "grads_gib", "optimizer_gib"):
        assert b["breakdown"]["memory_gib"][key] == pytest.approx(a["breakdown"]["memory_gib"][key], rel=1e-9), key
    # What the layers keep for backward is the same; the bytes working while one layer computes are
    # the larger block's, not the whole standard layer's.
    x, y = (_cands(m, hw, **dataclasses.asdict(plan)) for m in (standard, hybrid))
    n_moe = standard.num_moe_layers
    stored = lt.layers(x).on("stored", standard.num_layers, n_moe)
    assert lt.layers(y).on("stored", hybrid.num_layers, n_moe)[0] == pytest.approx(stored[0], rel=1e-9)
    assert b["breakdown"]["memory_gib"]["activations_gib"] == pytest.approx(
        a["breakdown"]["memory_gib"]["activations_gib"], rel=0.05)
    for key in ("fp8_cast_s", "ep_comm_s"):
        assert b["breakdown"]["time_s"][key] == pytest.approx(a["breakdown"]["time_s"][key], rel=1e-9), key
    micro_batches, extra_layers_per_stage = 16 / (1 * 2), (hybrid.num_layers - standard.num_layers) / 2
    launches = micro_batches * extra_layers_per_stage * 3 * hw.efficiency.layer_overhead_s
    assert b["breakdown"]["time_s"]["compute_s"] - a["breakdown"]["time_s"]["compute_s"] == pytest.approx(launches)
    graphed = dataclasses.replace(plan, cuda_graph="layer")
    assert estimate_plan(hybrid, hw, graphed)["step_time_s"] == pytest.approx(
        estimate_plan(standard, hw, graphed)["step_time_s"], rel=1e-9)


def test_mtp_on_a_hybrid_model_is_an_attention_and_moe_layer(hw):
    model = nano(mtp_num_layers=2, position_embedding_type="rope")
    x = _cands(model, hw)
    layers = lt.layers(x)
    mtp = layers.mtp(model)
    assert mtp["time"][0] == pytest.approx(layers.kinds["*"]["time"][0] + layers.kinds["E"]["time"][0], rel=REL)


def test_serving_refuses_a_hybrid_model_on_an_engine_without_mamba(hw):
    """Serving prices hybrids (tests/test_hybrid_serving.py) on the engines whose sources serve them."""
    from autoparallel.serve.assumptions import load_engine
    with pytest.raises(UnpricedModelError, match="hybrid") as exc:
        layout(nano(), hw, None, np.array([1.0]), np.array([1.0]), ["bf16"], ["bf16"],
               engine=load_engine("fastertransformer"))
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, UserError)


def test_latent_moe_dispatches_and_permutes_the_latent_width(hw):
    """LatentMoE's dispatcher sees latent-dim tensors only: the permutations' bytes and the
    routed experts' FC1 input scale by latent / hidden."""
    plain, latent = _cands(nano(), hw), _cands(nano(moe_latent_size=1024), hw)
    assert lt.permutation_time(latent)[0][0] == pytest.approx(lt.permutation_time(plain)[0][0] * 1024 / 2688, rel=REL)
    assert lt.gemm_input_elements(latent, lt.HYBRID["E"]) - lt.gemm_input_elements(plain, lt.HYBRID["E"]) == (
        6 * (1024 - 2688) + 2688 + 1024)


def test_pipeline_stages_count_their_own_moe_layers(hw):
    """Megatron-LM splits a pattern without '|' into pp contiguous equal parts: Nano at pp 2 has
    11 E layers on the first stage (of 26) and 12 on the last."""
    x = _cands(nano(), hw, pp=2, dp=2, ep=4, gbs=16)
    assert (x.first_layers[0], x.first_moe[0], x.last_layers[0], x.last_moe[0]) == (26, 11, 26, 12)
