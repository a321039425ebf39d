"""The MoE token dispatchers (alltoall, allgather, flex) against hand computations, and the knob's
place in the space, the search and the exports."""

import dataclasses
import math

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import dispatch
from autoparallel.costmodel.estimate import estimate_plan
from autoparallel.report import moe_export
from autoparallel.space import flex_backend, generate, load_space
from autoparallel.specs.plan import Plan


@pytest.fixture(scope="module")
def h100():
    return io.load_hardware("h100-sxm")


@pytest.fixture(scope="module")
def dsv3():
    """DeepSeek-V3 with its group-limited routing: 8 groups, each token's experts in the best 4."""
    return dataclasses.replace(io.load_model("deepseek-v3"), moe_router_num_groups=8, moe_router_group_topk=4)


def test_distinct_places_of_random_picks():
    assert dispatch.distinct_share(8, 8)[()] == pytest.approx(8 * (1 - (7 / 8) ** 8))
    assert dispatch.distinct_share(8, 1)[()] == 1.0


def test_group_limited_routing_caps_the_nodes_a_token_reaches(dsv3):
    # EP64 over 8 nodes: one group per node, 4 groups chosen: exactly 4 nodes.
    assert dispatch.nodes_per_token(dsv3, 8)[()] == pytest.approx(4.0)
    # EP32 over 4 nodes: two groups per node; a node is missed when none of its 2 groups is chosen.
    missed = math.comb(6, 4) / math.comb(8, 4)
    assert dispatch.nodes_per_token(dsv3, 4)[()] == pytest.approx(4 * (1 - missed))
    unlimited = dataclasses.replace(dsv3, moe_router_num_groups=None, moe_router_group_topk=None)
    assert dispatch.nodes_per_token(unlimited, 4)[()] == pytest.approx(4 * (1 - (3 / 4) ** 8))
    assert dispatch.nodes_per_token(unlimited, 8)[()] > dispatch.nodes_per_token(dsv3, 8)[()]
    assert dispatch.nodes_per_token(dsv3, 1)[()] == 1.0


def test_flex_sends_a_token_once_per_remote_node_and_forwards_it_over_nvlink(dsv3, h100):
    tokens, eff = 4096, h100.efficiency
    # EP64 over 8 nodes of 8: 4 nodes per token, 3.5 of them remote on average.
    rdma = tokens * 4 * 7 / 8 * 7168 * 2 / (50e9 * eff.internode)
    gpus = 64 * (1 - (63 / 64) ** 8)
    nvlink_pairs = gpus * (7 / 64 + 56 / 64 * 7 / 8)
    nvlink = tokens * nvlink_pairs * 7168 * 2 / (450e9 * eff.nvlink)
    expected = max(rdma, nvlink) + h100.internode_latency_us * 1e-6
    assert dispatch.flex_time(h100, dsv3, tokens, 64, 1, 1.0)[()] == pytest.approx(expected, rel=1e-12)
    assert dispatch.flex_time(h100, dsv3, tokens, 1, 1, 1.0)[()] == 0.0


def test_fp8_dispatch_sends_e4m3_values_and_a_scale_per_128_one_way_bf16_the_other(dsv3, h100):
    """DeepSeek-V3's kernels (report §3.3.2): dispatch (and the combine's backward) in FP8 with one
    FP32 scale per 128 values, combine (and the dispatch's backward) in BF16: on a layer's passes
    (1 + 4/128 + 2) / 2 bytes per value."""
    assert dispatch.FP8_DISPATCH_MEAN_BYTES == pytest.approx((1 + 4 / 128 + 2) / 2)
    tokens = 4096
    latency = h100.internode_latency_us * 1e-6
    bf16 = dispatch.dispatch_time(h100, dsv3, tokens, np.array([64.0]), 1, 1.0, np.array(["flex"]))[0] - latency
    fp8 = dispatch.dispatch_time(h100, dsv3, tokens, np.array([64.0]), 1, 1.0, np.array(["flex"]),
                                 dispatch.FP8_DISPATCH_MEAN_BYTES)[0] - latency
    assert fp8 == pytest.approx(bf16 * (1 + 4 / 128 + 2) / 4, rel=1e-12)


def test_only_a_row_that_states_fp8_dispatch_gets_it():
    from autoparallel import measured_runs as mr
    rows = mr.load_runs(mr.validation_runs(), moe=True)
    fp8 = {r.id for r in rows if "moe_dispatch_precision" in r.cols}
    assert fp8 == {r.id for r in rows if r.id.startswith("deepseek-v3-report-h800")}


def test_flex_inside_one_node_is_nvlink_with_each_gpu_reached_once(dsv3, h100):
    tokens = 4096
    gpus = 8 * (1 - (7 / 8) ** 8)
    expected = tokens * gpus * 7 / 8 * 7168 * 2 / (450e9 * h100.efficiency.nvlink) + h100.nvlink_latency_us * 1e-6
    assert dispatch.flex_time(h100, dsv3, tokens, 8, 1, 1.0)[()] == pytest.approx(expected, rel=1e-12)


def test_alltoall_sends_every_token_copy(dsv3, h100):
    tokens = 4096
    nbytes = tokens * 8 * 7168 * 2.0
    # One send/receive per peer: the 7 NVLink peers of its node each pay the NVLink latency, the
    # network peers progress together (one network latency).
    across = (nbytes * 56 / 64 / (50e9 * h100.efficiency.alltoall)
              + (7 * h100.nvlink_latency_us + h100.internode_latency_us) * 1e-6)
    got = dispatch.dispatch_time(h100, dsv3, tokens, np.array([64.0]), 1, 1.0, np.array(["alltoall"]))[0]
    assert got == pytest.approx(across, rel=1e-12)
    # At the same link efficiency, one copy per remote node instead of one per expert: 3.5 vs 7.
    same = dataclasses.replace(h100, efficiency=dataclasses.replace(h100.efficiency, alltoall=h100.efficiency.internode))
    alltoall = dispatch.dispatch_time(same, dsv3, tokens, np.array([64.0]), 1, 1.0, np.array(["alltoall"]))[0]
    flex = dispatch.dispatch_time(same, dsv3, tokens, np.array([64.0]), 1, 1.0, np.array(["flex"]))[0]
    assert flex < alltoall / 1.9


def test_alltoall_pays_the_nvlink_latency_once_per_peer():
    """EP64 inside one NVL72 domain: 63 NVLink peers, 63 latencies beside the bytes."""
    gb200 = io.load_hardware("gb200")
    nbytes = 1e9
    nvlink = gb200.nvlink_gbps / 2 * 1e9 * gb200.efficiency.alltoall
    expected = nbytes * 63 / 64 / nvlink + 63 * gb200.nvlink_latency_us * 1e-6
    assert dispatch.alltoall_time(gb200, nbytes, 64, 1)[()] == pytest.approx(expected, rel=1e-12)


def test_only_the_alltoall_dispatcher_sends_the_probabilities_apart(dsv3, h100):
    """Megatron-Core's alltoall dispatch sends the FP32 routing probabilities in a second
    all-to-all; flex carries them with the tokens."""
    tokens, ep = 4096, np.array([8.0])
    nbytes = tokens * 8 * 4.0  # top-8 copies, FP32
    expected = nbytes * 7 / 8 / (450e9 * h100.efficiency.alltoall) + 7 * h100.nvlink_latency_us * 1e-6
    assert dispatch.probs_time(h100, dsv3, tokens, ep, 1, 1.0, np.array(["alltoall"]))[0] == pytest.approx(expected)
    assert dispatch.probs_time(h100, dsv3, tokens, ep, 1, 1.0, np.array(["flex"]))[0] == 0.0


def test_allgather_gathers_the_whole_group(dsv3, h100):
    tokens = 4096
    gathered = tokens * 7168 * 2.0 * 8
    expected = 7 / 8 * gathered / (450e9 * h100.efficiency.nvlink) + h100.nvlink_latency_us * 1e-6
    got = dispatch.dispatch_time(h100, dsv3, tokens, np.array([8.0]), 1, 1.0, np.array(["allgather"]))[0]
    assert got == pytest.approx(expected, rel=1e-12)


def test_flex_kernels_take_their_sms_from_the_compute_they_hide_behind(h100):
    total = np.array([1.0])
    alltoall = dispatch.exposed_dispatch(h100, total, np.array([True]), np.array([10.0]), np.array(["alltoall"]))[0]
    flex = dispatch.exposed_dispatch(h100, total, np.array([True]), np.array([10.0]), np.array(["flex"]))[0]
    hidden = h100.efficiency.ep_overlap
    assert alltoall == pytest.approx(1 - hidden)
    assert flex == pytest.approx(1 - hidden + hidden * dispatch.FLEX_DISPATCHER_SMS / h100.sm_count)
    unhidden = dispatch.exposed_dispatch(h100, total, np.array([False]), np.array([10.0]), np.array(["flex"]))[0]
    assert unhidden == 1.0
    # Megatron-Bridge's performance recipes give HybridEP 32 SMs (moe_hybridep_num_sms), DeepEP 20.
    backends = np.array(["hybridep", "deepep"])
    both = dispatch.exposed_dispatch(h100, np.array([1.0, 1.0]), np.array([True, True]), np.array([10.0, 10.0]),
                                     np.array(["flex", "flex"]), backend=backends)
    assert both[0] == pytest.approx(1 - hidden + hidden * 32 / h100.sm_count)
    assert both[1] == pytest.approx(flex)


def test_cross_node_ep_prices_flex_far_below_alltoall(h100):
    model = io.load_model("deepseek-v3")
    base = dict(tp=1, pp=8, vp=4, dp=32, ep=32, mbs=1, gbs=4096, precision="fp8-blockwise",
                recompute="selective", recompute_modules="mla_up_proj moe_act", overlap_moe_expert_parallel_comm=True)
    alltoall = estimate_plan(model, h100, Plan(**base))["breakdown"]["time_s"]["ep_comm_s"]
    flex = estimate_plan(model, h100, Plan(**base, moe_token_dispatcher_type="flex"))["breakdown"]["time_s"]["ep_comm_s"]
    assert flex < alltoall


def test_flex_backend_is_hybridep_only_across_nodes_of_one_nvlink_domain(h100):
    gb200 = io.load_hardware("gb200")
    assert gb200.gpus_per_node == 4 and gb200.nvlink_domain == 72
    assert list(flex_backend(np.array([4, 8, 64]), gb200)) == ["deepep", "hybridep", "hybridep"]
    assert list(flex_backend(np.array([8, 16, 64]), h100)) == ["deepep", "deepep", "deepep"]


def test_the_space_offers_dispatchers_to_moe_models_only(h100):
    space = dataclasses.replace(load_space().pinned(tp=1, pp=4, vp=1, mbs=1, recompute="full", precision="bf16"),
                                ep=(1, 8, 16))
    qwen = io.load_model("qwen3-30b-a3b")

    def dispatchers(s):
        out = generate(qwen, h100, 64, 512, s)
        valid = out[out.reason == ""]
        return {ep: set(valid[valid.ep == ep].moe_token_dispatcher_type) for ep in (1, 8, 16)}
    # By the EP group's span (Megatron's guide): alltoall inside a node, flex across; nothing to
    # dispatch on one GPU.
    assert dispatchers(space) == {1: {"alltoall"}, 8: {"alltoall"}, 16: {"flex"}}
    assert dispatchers(space.pinned(dispatcher_by_ep_span=False)) == {1: {"alltoall"}, 8: {"alltoall", "flex"},
                                                                      16: {"alltoall", "flex"}}
    dense = generate(io.load_model("llama3-8b"), h100, 8, 128, load_space())
    assert set(dense.moe_token_dispatcher_type) == {"alltoall"}


def test_megatron_refuses_the_a2a_overlap_with_the_allgather_dispatcher(h100):
    space = load_space().pinned(moe_token_dispatcher_type="allgather", overlap_moe_expert_parallel_comm=True,
                                ep=8, tp=1, pp=1, recompute="none", precision="bf16")
    out = generate(io.load_model("mixtral-8x7b"), h100, 64, 256, space)
    assert (out.reason != "").all()
    assert out.reason.str.contains("overlap_moe_expert_parallel_comm is supported with alltoall/flex").any()
    kept = generate(io.load_model("mixtral-8x7b"), h100, 64, 256, space.pinned(overlap_moe_expert_parallel_comm=False))
    assert (kept.reason == "").any()


def test_flex_is_exported_with_its_backend():
    model = io.load_model("deepseek-v3")
    plan = Plan(tp=1, pp=8, dp=32, ep=32, gbs=4096, moe_token_dispatcher_type="flex",
                moe_flex_dispatcher_backend="hybridep")
    flags = moe_export.parallel_flags(model, plan)
    assert "--moe-token-dispatcher-type flex" in flags and "--moe-flex-dispatcher-backend hybridep" in flags
    keys = moe_export.config_keys(model, plan)
    assert keys["moe_token_dispatcher_type"] == "flex" and keys["moe_flex_dispatcher_backend"] == "hybridep"
    alltoall = " ".join(moe_export.parallel_flags(model, Plan(tp=1, pp=8, dp=32, ep=32, gbs=4096)))
    assert "--moe-flex-dispatcher-backend" not in alltoall and "deepep" not in alltoall
    deepep = moe_export.parallel_flags(model, Plan(tp=1, pp=8, dp=32, ep=32, gbs=4096, moe_token_dispatcher_type="flex"))
    assert "--moe-enable-deepep" in deepep  # the flag Megatron-LM has had since 0.12
    assert moe_export.config_keys(model, Plan(tp=1, pp=8, dp=32, ep=32, gbs=4096,
                                              moe_token_dispatcher_type="flex"))["moe_enable_deepep"] is True


def test_shared_expert_overlap_is_exported_as_megatron_spells_it():
    model = io.load_model("deepseek-v3")
    plan = Plan(tp=1, pp=8, vp=1, dp=32, ep=32, mbs=1, gbs=4096, moe_token_dispatcher_type="flex",
                moe_shared_expert_overlap=True)
    assert "--moe-shared-expert-overlap" in moe_export.parallel_flags(model, plan)
    assert moe_export.config_keys(model, plan)["moe_shared_expert_overlap"] is True
    assert "--moe-shared-expert-overlap" not in moe_export.parallel_flags(model, dataclasses.replace(
        plan, moe_shared_expert_overlap=False))


def test_a_dispatcher_mask_function_prices_as_the_names(dsv3, h100):
    """``dispatch.is_named``: the cost model hands its dispatcher and backend as mask functions
    (``Candidates.knob_is``, codes compared); the times are those of the names, bit for bit."""
    names = np.array(["alltoall", "flex", "allgather", "flex"], dtype=object)
    backends = np.array(["deepep", "hybridep", "deepep", "deepep"], dtype=object)
    ep = np.array([8.0, 64.0, 8.0, 16.0])
    by_names = lambda column: (lambda name: column == name)  # noqa: E731
    for fn in (dispatch.dispatch_time, dispatch.probs_time):
        np.testing.assert_array_equal(fn(h100, dsv3, 4096, ep, 1, 1.0, by_names(names)),
                                      fn(h100, dsv3, 4096, ep, 1, 1.0, names))
    total, overlap, window = np.ones(4), np.array([True, True, False, True]), np.full(4, 10.0)
    np.testing.assert_array_equal(
        dispatch.exposed_dispatch(h100, total, overlap, window, by_names(names), backend=by_names(backends)),
        dispatch.exposed_dispatch(h100, total, overlap, window, names, backend=backends))
