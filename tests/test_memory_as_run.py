"""What the published runs' software keeps that the plain Megatron count does not (issues 23/28):
Apex's 16-bit master remainders, one FP8 weight layout on Blackwell, TE's offload window,
TE's fused cross-entropy, the head beside a layer's working set, and the recipes' dropout."""

import dataclasses

import pandas as pd
import pytest

from autoparallel import io, measured_runs
from autoparallel.costmodel import memory
from autoparallel.costmodel.estimate import estimate_plan
from autoparallel.specs.plan import Plan

GIB = 2**30


def _mem(model, hw, plan):
    return estimate_plan(model, hw, plan)["breakdown"]["memory_gib"]


def _8b(**kw):
    return Plan(**{**dict(tp=1, pp=1, dp=8, gbs=128, mbs=1, precision="fp8-current", grad_reduce_in_fp32=False), **kw})


def test_master_remainders_keep_ten_bytes_of_adam_state_and_six_with_bf16_state():
    """Apex DistributedFusedAdam (NeMo 1): FP32 state with remainders 2+4+4 B; BF16 state with
    BF16 masters of FP8 parameters 2+2+2 B, where Megatron's precision-aware optimizer keeps FP32
    masters of FP8 parameters (4+2+2)."""
    model, h100 = io.load_model("llama3-8b"), io.load_hardware("h100-sxm")
    fp32 = _mem(model, h100, _8b())["optimizer_gib"]
    assert _mem(model, h100, _8b(param_remainders=True))["optimizer_gib"] == pytest.approx(fp32 * 10 / 12)
    bf16 = _8b(precision_aware_optimizer=True, fp8_param_gather=True)
    assert _mem(model, h100, bf16)["optimizer_gib"] == pytest.approx(fp32 * 8 / 12)
    assert _mem(model, h100, dataclasses.replace(bf16, param_remainders=True))["optimizer_gib"] == pytest.approx(fp32 / 2)


def test_blackwell_keeps_one_layout_of_a_per_tensor_fp8_weight():
    """TE makes no FP8 transpose where the GEMM takes any layout (sm_100); block-scaled copies
    (MXFP8) keep both layouts everywhere."""
    model, h100, gb200 = io.load_model("llama3-8b"), io.load_hardware("h100-sxm"), io.load_hardware("gb200")
    hopper = _mem(model, h100, _8b())["fp8_weights_gib"]
    assert _mem(model, gb200, _8b())["fp8_weights_gib"] == pytest.approx(hopper / 2)
    assert _mem(model, gb200, _8b(precision="mxfp8"))["fp8_weights_gib"] == pytest.approx(hopper)


def test_offloading_keeps_the_layers_not_offloaded_and_never_fewer_than_two():
    model, gb200 = io.load_model("llama3-70b"), io.load_hardware("gb200")
    def acts(n):
        plan = Plan(tp=1, pp=1, dp=64, gbs=256, mbs=2, precision="fp8-current", fsdp=True,
                    grad_reduce_in_fp32=False, cpu_offloading_num_layers=n)
        return _mem(model, gb200, plan)["activations_gib"]
    layer = acts(40) - acts(41)
    assert acts(0) - acts(40) == pytest.approx(40 * layer)  # L - N layers kept at the forward's end
    assert acts(78) == pytest.approx(acts(80))  # the layer computing and the one in transit


def test_fused_cross_entropy_keeps_only_the_bf16_logits():
    model = io.load_model("llama3-8b")
    assert memory.logits_bytes(model, 1, 8192, 1, fused=True) == 2 * 8192 * model.vocab_size
    assert memory.logits_bytes(model, 1, 8192, 1) == 6 * 8192 * model.vocab_size
    h100 = io.load_hardware("h100-sxm")
    unfused = estimate_plan(model, h100, _8b())["peak_memory_gib"]
    fused = estimate_plan(model, h100, _8b(cross_entropy_loss_fusion=True))["peak_memory_gib"]
    assert unfused - fused == pytest.approx(4 * 8192 * model.vocab_size / GIB)


def test_the_head_adds_only_what_its_logits_exceed_a_layers_working_set():
    """The loss's logits are freed by the head's backward, before the last layer's backward needs
    its working set: a small vocabulary adds nothing to the peak."""
    model, h100 = io.load_model("llama3-8b"), io.load_hardware("h100-sxm")
    small = dataclasses.replace(model, vocab_size=1024)
    assert _mem(small, h100, _8b())["logits_gib"] == 0.0
    assert _mem(model, h100, _8b())["logits_gib"] > 0.0


def _row(run_id):
    frame = measured_runs.read_runs(measured_runs.validation_runs())
    return frame.set_index("id", drop=False).loc[run_id]


def test_dense_rows_take_their_presets_dropout():
    """NVIDIA's Llama recipes train without dropout (no masks kept); GPT-3's keep 0.1."""
    llama = measured_runs.model_from_row(_row("nemo-llama3-8b-h100-sxm-8gpu-fp8-delayed-tp1pp1cp2vp1-mbs1-gbs128"))
    gpt3 = measured_runs.model_from_row(_row("nemo-gpt3-20b-h100-sxm-64gpu-fp8-delayed-tp2pp1cp1vp1-mbs2-gbs256"))
    assert (llama.hidden_dropout, llama.attention_dropout) == (0.0, 0.0)
    assert (gpt3.hidden_dropout, gpt3.attention_dropout) == (0.1, 0.1)



def test_moe_rows_take_their_presets_expert_biases():
    """The CSV states no biases: GPT-OSS's experts have them (its preset), Qwen3's not; Megatron's
    default (biases on) would price an eager bias pass over every MoE row's routed tokens."""
    gpt_oss = measured_runs.model_from_row(_row("nemo-gpt-oss-120b-h100-sxm-64gpu-bf16-tp1pp4cp1vp1ep8-mbs4-gbs512"))
    qwen = measured_runs.model_from_row(_row("nemo-qwen3-30b-a3b-gb200-8gpu-mxfp8-tp1pp1cp1vp1ep8-mbs4-gbs512"))
    assert gpt_oss.add_bias_linear and not qwen.add_bias_linear


def test_a_release_sets_knobs_for_every_precision_and_per_precision():
    recipes = {"releases": {"nemo 25.11": {"precisions": ["fp8-current"], "fp8_param_gather": True,
                                           "every_precision": {"cross_entropy_loss_fusion": True},
                                           "by_precision": {"bf16": {"param_remainders": True}}, "source": "s"}},
               "rows": {}}
    row = _row("nemo-gpt-oss-120b-h100-sxm-64gpu-bf16-tp1pp4cp1vp1ep8-mbs4-gbs512")
    assert measured_runs.recipe_for(row, recipes) == {"cross_entropy_loss_fusion": True, "param_remainders": True}
    fp8 = pd.Series({**row.to_dict(), "precision": "fp8-current"})
    assert measured_runs.recipe_for(fp8, recipes) == {"cross_entropy_loss_fusion": True, "fp8_param_gather": True}


def test_the_attention_output_is_kept_in_bf16_beside_the_projections_fp8_copy():
    """A fused attention saves its BF16 output; under delayed scaling the projection keeps its own
    FP8 copy too (3 B), under the other recipes Megatron has it save the BF16 original (2 B), and
    with core attention recomputed only the projection's input is kept."""
    out = memory.attention_output_bytes
    assert out(1.0, 1.0, True, True) == 3.0
    assert out(1.0, 1.0, True, False) == 2.0
    assert out(1.0, 1.0, False, True) == 1.0
    assert out(0.0, 1.0, True, True) == 2.0  # BF16: one tensor, shared
    model, h100 = io.load_model("llama3-8b"), io.load_hardware("h100-sxm")
    delayed = _mem(model, h100, _8b(precision="fp8-delayed"))["activations_gib"]
    current = _mem(model, h100, _8b())["activations_gib"]
    # one layer held plus the one computing, per layer one byte per token and attention channel
    per_layer = 8192 * model.num_attention_heads * model.head_dim / GIB
    assert delayed - current == pytest.approx((model.num_layers + 1) * per_layer)
