"""Mixture-of-experts layouts (issue 14): Megatron's MoE parallel folding as space rules, the
MoE layer priced (all-to-all on the tier the EP group spans, grouped GEMMs, load imbalance,
expert-data-parallel sharding), DeepSeek-V3's dense first layers per stage, MLA FLOPs."""

import dataclasses

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import dispatch, flops, moe, pipeline
from autoparallel.costmodel.estimate import estimate_columns, estimate_plan, plan_columns
from autoparallel.space import SearchSpace, generate, load_space
from autoparallel.specs.plan import Plan


@pytest.fixture(scope="module")
def mixtral():
    return io.load_model("mixtral-8x7b")


@pytest.fixture(scope="module")
def dsv3():
    return io.load_model("deepseek-v3")


def _states_gb(record):
    mem = record["breakdown"]["memory_gib"]
    return (mem["weights_gib"] + mem["grads_gib"] + mem["optimizer_gib"]) * 2**30 / 1e9


def test_expert_states_follow_megatrons_accounting(mixtral, h100):
    """The issue's case: Mixtral-8x7B TP2 PP4 on 64 GPUs, EP8 with Megatron's default ETP = TP:
    experts on ep*etp = 16 GPUs, their Adam states over edp = 64/(4*16) = 1: 14.4 GB."""
    plan = Plan(tp=2, pp=4, dp=8, gbs=256, ep=8, etp=2, sp=True)
    assert plan.expert_data_parallel == 1
    assert _states_gb(estimate_plan(mixtral, h100, plan)) == pytest.approx(14.4, abs=0.1)


def test_larger_ep_is_no_longer_free(mixtral, h100):
    """EP8 x ETP2 spans two nodes: its all-to-alls cross InfiniBand and cost more than twice EP4's
    inside one node: the step grows from EP4 to EP8. Inside the node EP1 beats dropless EP4: each
    GPU's 8 small expert GEMMs run four at a time over TransformerEngine's compute streams
    (``layer_time.concurrent_experts``), so they fill the GPU nearly as well as EP4's 2 GEMMs of 4x
    the tokens, while EP4's busiest rank takes ``imbalance`` times the even share. With the router
    forced to balance, EP4's fewer, larger GEMMs and a quarter of the calls per local expert win."""
    def run(model):
        step = {ep: estimate_plan(model, h100, Plan(tp=2, pp=4, dp=8, gbs=256, ep=ep, etp=2, sp=True))
                for ep in (1, 4, 8)}
        return step, {ep: r["breakdown"]["time_s"]["compute_s"] for ep, r in step.items()}
    step, compute = run(mixtral)
    ep_comm = {ep: r["breakdown"]["time_s"]["ep_comm_s"] for ep, r in step.items()}
    assert ep_comm[8] > 2 * ep_comm[4] > 0
    assert step[8]["step_time_s"] > step[4]["step_time_s"]
    assert compute[8] > compute[4] > compute[1] and step[1]["step_time_s"] < step[4]["step_time_s"]
    balanced_step, balanced = run(dataclasses.replace(mixtral, moe_router_force_load_balancing=True))
    assert balanced[1] > balanced[4] > balanced[8]
    assert balanced_step[4]["step_time_s"] < balanced_step[1]["step_time_s"]


def test_alltoall_inside_the_nvlink_domain_is_cheaper(h100):
    inside = dispatch.alltoall_time(h100, 1e9, 8, 1)
    across = dispatch.alltoall_time(h100, 1e9, 16, 1)
    assert across > 3 * inside > 0
    assert dispatch.alltoall_time(h100, 1e9, 1, 1) == 0.0
    gb200 = io.load_hardware("gb200")
    assert dispatch.alltoall_time(gb200, 1e9, 64, 1) < dispatch.alltoall_time(h100, 1e9, 64, 1) / 3  # NVL72


def test_load_imbalance_costs_dropless_routing_only(mixtral, h100):
    plan = Plan(tp=1, pp=4, dp=16, gbs=256, ep=8, sp=False)
    balanced = dataclasses.replace(mixtral, moe_router_force_load_balancing=True)
    capped = dataclasses.replace(mixtral, moe_expert_capacity_factor=1.0)
    dropless, forced, dropped = (estimate_plan(m, h100, plan)["step_time_s"] for m in (mixtral, balanced, capped))
    assert dropless > forced == pytest.approx(dropped)
    assert moe.load_imbalance(h100, mixtral, np.array([1.0]))[0] == 1.0


def test_deepseek_first_stage_holds_the_dense_layers(dsv3):
    layout = pipeline.balanced_layout(61, 16)
    first, middle, last = pipeline.stage_pattern_counts(dsv3.moe_layer_pattern, np.array([4]), np.array([4]),
                                                        np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1),
                                                        np.array([layout], dtype=object))
    layers = pipeline.stage_layers(61, np.array([4]), np.array([4]), np.zeros(1), np.zeros(1), np.zeros(1),
                                   np.zeros(1), np.array([layout], dtype=object))
    assert [x[0] for x in layers] == [15, 16, 14]
    assert (layers[0][0] - first[0], layers[1][0] - middle[0], layers[2][0] - last[0]) == (3, 0, 0)


def test_flexible_layout_is_megatrons_syntax():
    assert pipeline.balanced_layout(61, 32) == "Et|(t*2|)*30L"  # Megatron-Bridge's "Et|(tt|)*30mL" less MTP
    assert sum(pipeline.layout_stage_sizes("Et|(tt|)*30mL")) == 61
    assert pipeline.layout_stage_sizes(pipeline.balanced_layout(61, 16)) == [3] + [4] * 14 + [2]


def test_megatron_flops_reproduce_nemos_model_tflops(dsv3):
    """NeMo's published model TFLOP/s over tokens/s (25.11 summary): Megatron's
    num_floating_point_operations with MLA and MoE layers, no router, no MTP."""
    qwen = io.load_model("qwen3-235b-a22b")
    assert flops.model_flops_per_token(dsv3) / 1e12 == pytest.approx(961 / 3848, rel=0.002)
    assert flops.model_flops_per_token(qwen) / 1e12 == pytest.approx(907 / 6131, rel=0.002)


def test_megatron_flops_at_the_gb200_guides_commit(dsv3):
    """The model_tflops metric (Megatron-LM's DeepSeek-V3 GB200 guide, 970 TFLOP/s/GPU): Megatron-LM
    eb0783b6d3 num_floating_point_operations, run on DeepSeek-V3 at 4096 tokens, gives 0.249812054016
    TFLOP per token without MTP and 0.259992950784 with --mtp-num-layers 1, which is the ratio of
    Megatron-Bridge's 26.02-26.08 DeepSeek-V3 rows (1648 / 6338 = 0.26002): our count is the former,
    and the metric refuses rows with MTP."""
    no_mtp = dataclasses.replace(dsv3, mtp_num_layers=0, seq_length=4096)
    assert flops.model_flops_per_token(no_mtp) == pytest.approx(0.249812054016e12, rel=1e-5)
    assert 1648 / 6338 == pytest.approx(0.259992950784, rel=2e-4)


def test_mla_attention_core_counts_query_key_and_value_dims(dsv3):
    assert flops.attention_core_flops(dsv3, 1, 4096) == 2.0 * 4096**2 * 128 * (192 + 128)


@pytest.mark.parametrize("pins, reason", [
    ({"ep": 3}, "ep=3 does not divide num_experts=8"),
    ({"ep": 8, "etp": 4, "tp": 1, "pp": 8}, "ep*etp=32 does not divide the 8 GPUs of a pipeline stage"),
    ({"etp": 16}, "etp=16 crosses the 8-GPU NVLink domain"),
])
def test_moe_structure_rules(mixtral, h100, pins, reason):
    out = generate(mixtral, h100, 64, 256, load_space().pinned(**pins))
    assert any(reason in r for r in out.reason), set(out.reason)


def test_softmax_sink_rules_follow_transformer_engines_backends(h100):
    """GPT-OSS's sinks: context parallelism only as TE's all-to-all CP, whose heads and query groups
    per TP rank must divide by cp (8 query groups: tp*cp <= 8); FP8 attention with sinks has no TE
    backend before Blackwell (cuDNN's fused FP8 attention takes sinks on sm100 only), so it is
    refused on H100 and offered on B200."""
    from autoparallel.io import load_hardware
    oss = io.load_model("gpt-oss-120b")
    out = generate(oss, h100, 64, 512, load_space().pinned(tp=1, pp=4, cp=16, ep=1, mbs=1))
    assert any("softmax sinks run the all-to-all CP" in r for r in out.reason), set(out.reason)
    ok = generate(oss, h100, 64, 512, load_space().pinned(tp=2, pp=4, cp=4, ep=4, mbs=1))
    assert (ok.reason == "").any() and not any("all-to-all CP" in r for r in ok.reason)
    fp8 = load_space().pinned(tp=1, pp=4, ep=8, mbs=1, precision="fp8-current", fp8_attention=True)
    assert any("FP8 attention with softmax sinks has no TransformerEngine backend on h100-sxm" in r
               for r in generate(oss, h100, 64, 512, fp8).reason)
    blackwell = generate(oss, load_hardware("b200"), 64, 512, fp8)
    assert (blackwell.reason == "").any() and not any("softmax sinks" in r for r in blackwell.reason)
    llama = generate(io.load_model("mixtral-8x7b"), h100, 64, 512, load_space().pinned(tp=1, pp=4, cp=16, ep=1))
    assert not any("softmax sinks" in r for r in llama.reason)


def test_moe_layout_rules(mixtral, h100):
    """The 1F1B all-to-all overlap is used wherever Megatron allows it: not without EP, not
    for a pipeline without virtual stages, not with full recompute nor where selective recompute
    covers the whole MoE layer ('moe')."""
    out = generate(mixtral, h100, 64, 256, load_space().pinned(tp=2, pp=4, ep=4, mbs=1))
    valid = out[out.reason == ""]
    assert not valid.empty and valid.sp.all()
    overlap = valid.overlap_moe_expert_parallel_comm
    assert overlap.any() and not overlap[valid.vp == 1].any() and not overlap[valid.recompute == "full"].any()
    whole_moe = (valid.recompute == "selective") & (valid.recompute_modules == "moe")
    assert not overlap[whole_moe].any()
    assert overlap[(valid.vp > 1) & (valid.recompute != "full") & ~whole_moe].all()
    # no MLA sets for Mixtral; core_attn alone is dominated by moe_act for a MoE model
    assert set(valid.recompute_modules) == {"core_attn", "moe_act", "moe"}
    assert set(valid[valid.recompute == "selective"].recompute_modules) == {"moe_act", "moe"}
    no_sp = generate(mixtral, h100, 64, 256, SearchSpace(tp=(2,), pp=(4,), ep=(4,), mbs=(1,), sp=(False,)))
    assert "MoE with tensor parallel needs sequence parallel (Megatron-LM MoELayer)" in set(no_sp.reason)


def test_default_space_offers_ep_up_to_64(dsv3):
    assert {1, 2, 4, 8, 16, 32, 64} <= set(load_space().ep)


def test_expert_adam_states_shard_over_the_expert_data_parallel_group(mixtral, h100):
    """Same GPUs, ETP 1: EP2 leaves 32 expert replicas to shard Adam over, EP8 eight."""
    small, large = (estimate_plan(mixtral, h100, Plan(tp=1, pp=1, dp=64, gbs=256, ep=ep))["breakdown"]["memory_gib"]
                    for ep in (2, 8))
    assert large["weights_gib"] < small["weights_gib"] / 3
    assert Plan(tp=1, pp=1, dp=64, gbs=256, ep=8).expert_data_parallel == 8


def test_selective_recompute_modules_spare_memory(dsv3):
    gb200 = io.load_hardware("gb200")
    base = dict(tp=1, pp=4, dp=64, gbs=4096, vp=4, ep=64, recompute="selective",
                pipeline_model_parallel_layout=pipeline.balanced_layout(61, 16))
    plans = [Plan(**base, recompute_modules=m) for m in ("core_attn", "mla_up_proj", "mla_up_proj moe")]
    out = estimate_columns(dsv3, gb200, plan_columns(plans))
    assert out["activations_gib"][0] > out["activations_gib"][1] > out["activations_gib"][2]
    assert out["recompute_s"][2] > out["recompute_s"][1]
