"""Context parallelism's kind (Plan.cp_comm_type, --cp-comm-type) as a searched knob: each kind's term
pinned to a hand computation on a small case, the refusals Megatron-LM / TransformerEngine make, the
candidates the search offers, and the exports (costmodel/cp_kinds.py, layer_time.cp_comm_time)."""

import dataclasses
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from autoparallel import io
from autoparallel.costmodel import cp_kinds
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import plan_columns
from autoparallel.report.export import megatron_args
from autoparallel.report.nemo import nemo1_config, nemo2_recipe
from autoparallel.space import SearchSpace, generate
from autoparallel.specs.plan import Plan

REL = 1e-12


@pytest.fixture(scope="module")
def gqa(gpt175b):
    """GPT-3 175B with 16 query groups (96 heads of 128, hidden 12288): a GQA model of known shape."""
    return dataclasses.replace(gpt175b, num_query_groups=16)


def _cands(model, hw, **knobs):
    """One plan: tp 4, pp 8, vp 2, cp 4, dp 2 (256 GPUs), mbs 1, gbs 64, SP, BF16."""
    base = dict(tp=4, pp=8, vp=2, cp=4, dp=2, mbs=1, gbs=64, sp=True, precision="bf16", recompute="none",
                grad_reduce_in_fp32=False)
    return candidates(model, hw, plan_columns([Plan(**{**base, **knobs})]))


def _nvlink(hw):
    return hw.nvlink_gbps / 2 * 1e9 * hw.efficiency.nvlink


def _network(hw):
    return hw.internode_gbps * 1e9 * hw.efficiency.internode


# The small case: seq 2048 over cp 4 = 512 local tokens; 16 query groups / tp 4 = 4 local KV heads of 128.
KV = 2 * 1 * 512 * (128 + 128) * 4  # BF16 bytes of one rank's K and V chunk: 1,048,576


def test_p2p_is_the_ring_as_before(gqa, hw):
    """tp 4 x cp 4 = 16 GPUs: two H100 domains, so the ring's hops go over the network."""
    x = _cands(gqa, hw, cp_comm_type="p2p")
    ring = 3 * (4 - 1) * (KV / _network(hw) + hw.internode_latency_us * 1e-6)
    assert lt.cp_comm_time(x, 0.0)[0] == pytest.approx(ring, rel=REL)
    assert lt.cp_comm_time(x, 1.0)[0] == pytest.approx((1 - hw.efficiency.cp_overlap) * ring, rel=REL)


def test_a2a_is_eight_all_to_alls_of_the_local_q_k_v_o(gqa, hw):
    x = _cands(gqa, hw, cp_comm_type="a2a")
    q = 2 * 1 * 512 * (96 / 4) * 128
    kv = 2 * 1 * 512 * (16 / 4) * 128
    inside = 8 // 4  # CP ranks 4 apart: 2 in a domain
    nvlink = hw.nvlink_gbps / 2 * 1e9 * hw.efficiency.alltoall
    network = hw.internode_gbps * 1e9 * hw.efficiency.alltoall
    latency = (hw.nvlink_latency_us + hw.internode_latency_us) * 1e-6

    def a2a(nbytes):
        return max(nbytes * (inside - 1) / 4 / nvlink, nbytes * (4 - inside) / 4 / network) + latency

    hand = 2 * (2 * a2a(q) + 2 * a2a(kv))
    assert lt.cp_comm_time(x, 0.0)[0] == pytest.approx(hand, rel=REL)
    assert lt.cp_comm_time(x, 1e3)[0] == pytest.approx(hand, rel=REL)  # exposed


def test_allgather_gathers_kv_twice_and_reduce_scatters_dkv_once_exposed(gqa, hw):
    """The all-gather of cp x KV over 4 ranks, 2 per domain, as NCCL's ring: 3/4 of the buffer at the
    slower of NVLink and the domain's 2 NICs, plus the ring latency of NCCL's tuner (tuning.cc) for 4
    ranks over 2 nodes at the cheapest protocol: Simple 8.4 + 2 x 3.4 + 14.0 = 29.2 us, LL128 (0.92 of
    the bandwidth) 14.0 + 2 x 1.9 + 4.0 = 21.8 us, LL (0.5) 6.6 + 2 x 1.0 + 2.7 = 11.3 us; three such
    collectives, none hidden."""
    x = _cands(gqa, hw, cp_comm_type="allgather")
    gathered = 4 * KV
    transfer = 0.75 * gathered / min(_nvlink(hw), 2 * _network(hw))
    one = min(transfer + 29.2e-6, transfer / 0.92 + 21.8e-6, transfer / 0.5 + 11.3e-6)
    assert lt.cp_comm_time(x, 0.0)[0] == pytest.approx(3 * one, rel=REL)
    assert lt.cp_comm_time(x, 1e3)[0] == pytest.approx(3 * one, rel=REL)


def test_a2a_p2p_is_an_a2a_inside_pairs_and_a_ring_across_them(gqa, hw):
    """cp 4 at tp 4 (24 heads, 4 KV heads a rank): a2a groups of 2 (the largest divisor of 4 below it
    dividing the heads), a p2p ring over 2 of them carrying one rank's K/V chunk's bytes."""
    x = _cands(gqa, hw, cp_comm_type="a2a+p2p")
    assert int(cp_kinds.a2a_group(gqa, 4, 4, "a2a+p2p")) == 2
    q = 2 * 1 * 512 * (96 / 4) * 128
    kv = 2 * 1 * 512 * (16 / 4) * 128
    inside = 2  # both members of an a2a pair share a domain (4 apart, 8 per domain)
    nvlink = hw.nvlink_gbps / 2 * 1e9 * hw.efficiency.alltoall

    def a2a(nbytes):
        return nbytes * (inside - 1) / 2 / nvlink + hw.nvlink_latency_us * 1e-6

    ring = 3 * (2 - 1) * (KV / _network(hw) + hw.internode_latency_us * 1e-6)  # the whole group spans 2 domains
    hand = 2 * (2 * a2a(q) + 2 * a2a(kv)) + ring
    assert lt.cp_comm_time(x, 0.0)[0] == pytest.approx(hand, rel=REL)
    hidden = 2 * (2 * a2a(q) + 2 * a2a(kv)) + (1 - hw.efficiency.cp_overlap) * ring
    assert lt.cp_comm_time(x, 1e3)[0] == pytest.approx(hidden, rel=REL)


def test_the_p2p_ring_merges_each_steps_partial_results_through_hbm(gqa, hw):
    """TE's p2p ring (v1.10 ``AttnFuncWithCPAndKVP2P``) merges each of its cp steps' partial outputs
    and accumulates their dQ, dK and dV in HBM passes (``layer_time.CP_MERGE_BYTES``), per element of a
    rank's local output O (512 tokens x 24 heads x 128) and K/V (512 x 4 KV heads x 256): BF16, 12 B per
    step per O element, 10 per step + 8 once per K/V element; FP8 (dequantized to FP32, merged, cast
    back; cp slots of FP8 gradients dequantized and summed): 28 per step + 17 once, 13 + 9. The a2a+p2p
    kind's outer ring of 2 steps merges as much per step; the all-to-all and all-gather kinds none, nor
    cp 1, nor a model that runs CP only as a2a."""
    out, kv = 512 * 24 * 128, 512 * 4 * 256
    x = _cands(gqa, hw, cp_comm_type="p2p")
    assert lt.cp_merge_time(x)[0] == pytest.approx((out * 12 * 4 + kv * (10 * 4 + 8)) / x.hbm, rel=REL)
    fp8 = _cands(gqa, hw, cp_comm_type="p2p", precision="fp8-delayed", fp8_attention=True)
    assert lt.cp_merge_time(fp8)[0] == pytest.approx((out * (28 * 4 + 17) + kv * (13 * 4 + 9)) / x.hbm, rel=REL)
    hierarchical = _cands(gqa, hw, cp_comm_type="a2a+p2p")  # a2a pairs, a ring of 2
    assert lt.cp_merge_time(hierarchical)[0] == pytest.approx((out * 12 * 2 + kv * (10 * 2 + 8)) / x.hbm, rel=REL)
    for kind in ("a2a", "allgather"):
        assert lt.cp_merge_time(_cands(gqa, hw, cp_comm_type=kind))[0] == 0.0
    assert lt.cp_merge_time(_cands(gqa, hw, cp=1, dp=8))[0] == 0.0
    sinks = dataclasses.replace(gqa, softmax_type="learnable")
    assert lt.cp_merge_time(_cands(sinks, hw, cp_comm_type="a2a"))[0] == 0.0
    layer = lt.layers(x).dense
    assert layer["cp_merge"][0] == pytest.approx(lt.cp_merge_time(x)[0], rel=REL)


def test_every_kind_is_free_at_cp_1(gqa, hw):
    for kind in ("p2p", "a2a", "allgather", "a2a+p2p"):
        assert lt.cp_comm_time(_cands(gqa, hw, cp=1, dp=8, cp_comm_type=kind), 0.0)[0] == 0.0


def test_a_model_that_runs_one_kind_is_priced_as_it_whatever_the_plan_says(gqa, hw):
    sinks = dataclasses.replace(gqa, softmax_type="learnable")
    forced = lt.cp_comm_time(_cands(sinks, hw, cp_comm_type="p2p"), 0.0)[0]
    assert forced == pytest.approx(lt.cp_comm_time(_cands(gqa, hw, cp_comm_type="a2a"), 0.0)[0], rel=REL)


# Refusals


def test_a2a_needs_a_tp_ranks_heads_divisible_by_cp(gqa):
    assert cp_kinds.heads_refusal(gqa, 4, 4, "a2a") == ""  # 24 heads, 4 query groups a rank
    assert cp_kinds.heads_refusal(gqa, 8, 4, "a2a")        # 2 query groups a rank
    llama = io.load_model("llama3.1-70b")  # 64 heads, 8 query groups
    why = cp_kinds.heads_refusal(llama, 8, 2, "a2a")
    assert "a2a" in why and "1 query groups" in why and "p2p and allgather" in why
    assert cp_kinds.heads_refusal(llama, 4, 2, "a2a") == ""
    assert cp_kinds.heads_refusal(llama, 1, 16, "a2a")  # 8 groups over 16
    assert cp_kinds.heads_refusal(llama, 1, 16, "a2a+p2p") == ""  # a2a in 8s, p2p over 2
    assert list(map(int, [cp_kinds.a2a_group(llama, 1, 16, "a2a+p2p")])) == [8]
    assert cp_kinds.heads_refusal(llama, 8, 2, "p2p") == cp_kinds.heads_refusal(llama, 8, 2, "allgather") == ""


def test_model_refusals_name_the_value_and_what_is_valid():
    oss = io.load_model("gpt-oss-20b")  # softmax sinks and a sliding window
    why = cp_kinds.model_refusal(oss, "p2p")
    assert why.startswith("--cp-comm-type p2p") and "valid for gpt-oss-20b: a2a" in why
    glm = io.load_model("glm-5")
    assert "valid for glm-5: allgather" in cp_kinds.model_refusal(glm, "a2a")
    llama = io.load_model("llama3.1-70b")
    assert cp_kinds.model_kinds(llama) == ("p2p", "a2a", "allgather", "a2a+p2p")
    assert cp_kinds.model_kinds(llama, "1.6") == ("p2p",)
    assert cp_kinds.model_kinds(llama, "1.11") == ("p2p", "a2a", "allgather")
    # TE 1.10 runs p2p and all_gather only (a2a from 1.11: v1.10 raises "Unsupported communication type")
    assert cp_kinds.model_kinds(llama, "1.10") == ("p2p", "allgather")
    assert "TransformerEngine >= 1.11" in cp_kinds.model_refusal(llama, "a2a", "1.10")
    windowed = dataclasses.replace(llama, window_size=(127, 0))
    assert cp_kinds.model_kinds(windowed) == ("a2a", "allgather")
    dsv3 = io.load_model("deepseek-v3")  # MLA: K and V head sizes differ
    assert cp_kinds.model_kinds(dsv3, "2.14") == ("p2p", "a2a+p2p")
    assert cp_kinds.model_kinds(dsv3, "2.15") == ("p2p", "a2a", "allgather", "a2a+p2p")
    assert cp_kinds.fp8_attention_refusal("allgather", "2.14") and not cp_kinds.fp8_attention_refusal("allgather", "")
    assert not cp_kinds.fp8_attention_refusal("a2a", "2.14")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autoparallel", *args], capture_output=True, text=True)


@pytest.mark.parametrize("args, words", [
    (("--tp", "8", "--cp", "2", "--cp-comm-type", "a2a"), "1 query groups of a TP rank (tp=8) are not divisible by cp"),
    (("--tp", "4", "--cp", "1", "--cp-comm-type", "a2a"), "--cp 1"),
])
def test_estimate_refuses_with_exit_2(args, words):
    out = _cli("estimate", "--model", "llama3.1-70b", "--gpus", "64", "--pp", "4", *args)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr


def test_estimate_refuses_a_kind_the_model_cannot_run():
    out = _cli("estimate", "--model", "gpt-oss-20b", "--gpus", "8", "--tp", "1", "--pp", "1", "--cp", "2",
               "--cp-comm-type", "allgather")
    assert out.returncode == 2 and "valid for gpt-oss-20b: a2a" in out.stderr


# The search's candidates


def _kinds(model, hw, gpus, space):
    frame = generate(model, hw, gpus, 64, space)
    valid = frame[frame.reason == ""]
    return {(t, c): set(valid[(valid.tp == t) & (valid.cp == c)].cp_comm_type) for t, c in
            valid[["tp", "cp"]].drop_duplicates().itertuples(index=False)}


ALL = ("p2p", "a2a", "allgather", "a2a+p2p")


def test_the_search_offers_only_kinds_the_heads_allow_and_p2p_alone_at_cp_1(hw):
    llama = dataclasses.replace(io.load_model("llama3.1-70b"), seq_length=4096)  # 64 heads, 8 query groups
    space = SearchSpace(tp=(1, 4, 8), pp=(4,), cp=(1, 2, 16), mbs=(1,), recompute=("full",), cp_comm_type=ALL)
    kinds = _kinds(llama, hw, 128, space)
    assert kinds[(4, 1)] == {"p2p"}
    assert kinds[(8, 2)] <= {"p2p", "allgather"}              # 1 KV head a rank: no all-to-all kind
    assert "a2a" not in kinds[(1, 16)]                        # 8 KV heads over 16 ranks
    assert "a2a+p2p" not in kinds[(4, 2)]                     # a2a runs there: a2a+p2p not beside it
    assert set().union(*kinds.values()) - {"p2p"}             # the short sequence leaves the others a chance


@pytest.mark.parametrize("flash", [(True,), (False, True)])
def test_the_kinds_left_out_are_never_the_faster(hw, flash):
    """The search drops a kind where its least exposed exchange is above another's most
    (``layer_time.cp_kind_bounds`` between the least and the most attention time the features allow):
    each layout's best step time over the space equals its best over the four spaces that pin one kind
    each (which drop nothing), with and without flash attention among the features."""
    from autoparallel.search import run
    llama = dataclasses.replace(io.load_model("llama3.1-70b"), seq_length=16384)
    space = SearchSpace(tp=(1, 2, 4, 8), pp=(4,), cp=(2, 4, 8), mbs=(1,), recompute=("full",), sp=(True,),
                        precision=("bf16", "fp8-delayed"), fp8_attention=(False, True), cp_comm_type=ALL,
                        flash_attention=flash)
    layout = ["tp", "pp", "vp", "cp", "dp", "precision", "fp8_attention", "flash_attention"]

    def best(frame):
        return frame[frame.reason == ""].groupby(layout).step_time_s.min()

    searched = run.search(llama, hw, 64, 64, space).ranked
    pinned = pd.concat([best(run.search(llama, hw, 64, 64, space.pinned(cp_comm_type=k)).ranked)
                        for k in ALL if not _all_refused(llama, hw, space.pinned(cp_comm_type=k))])
    pinned = pinned.groupby(level=list(range(len(layout)))).min()
    mine = best(searched)
    assert len(mine) == len(pinned)
    assert np.allclose(mine.sort_index().to_numpy(), pinned.sort_index().to_numpy(), rtol=1e-12)
    assert len(searched) < sum(len(generate(llama, hw, 64, 64, space.pinned(cp_comm_type=k))) for k in ALL)


@pytest.mark.parametrize("model", ["llama3.1-70b", "deepseek-v3"])
def test_the_attention_bounds_hold_the_attention_of_every_feature(hw, model):
    """``attention_time_least`` <= ``attention_time`` <= ``attention_time_most`` for flash and not,
    BF16, FP8 and FP8 attention (the bounds the search's CP-kind pruning reads); the upper one is
    reached by the BF16 flash kernel."""
    spec = io.load_model(model)
    plans = [dict(precision=p, fp8_attention=a, flash_attention=f) for p in ("bf16", "fp8-delayed")
             for a in (False, True) for f in (False, True) if p != "bf16" or not a]
    for knobs in plans:
        x = _cands(spec, hw, **knobs)
        attention = lt.attention_time(x)
        least = lt.attention_time_least(x, fp8_attention=True)
        most = lt.attention_time_most(x, non_flash=not knobs["flash_attention"])
        assert np.all(least <= attention * (1 + 1e-12)) and np.all(attention <= most * (1 + 1e-12)), knobs
    x = _cands(spec, hw)
    assert lt.attention_time(x) == pytest.approx(lt.attention_time_most(x, non_flash=False), rel=1e-12)


def _all_refused(model, hw, space) -> bool:
    frame = generate(model, hw, 64, 64, space)
    return (frame.reason != "").all()


def test_a_pinned_kind_the_heads_forbid_is_rejected_with_its_reason(hw):
    llama = io.load_model("llama3.1-70b")
    frame = generate(llama, hw, 64, 64, SearchSpace(tp=(8,), pp=(4,), cp=(2,), mbs=(1,), cp_comm_type=("a2a",)))
    assert (frame.reason != "").all()
    assert frame.reason.str.contains("--cp-comm-type a2a at cp=2").any()


def test_a_space_without_kinds_runs_the_models_own_as_before(hw):
    oss = io.load_model("gpt-oss-20b")
    frame = generate(oss, hw, 8, 64, SearchSpace(tp=(1,), pp=(1,), cp=(1, 2), mbs=(1,)))
    valid = frame[frame.reason == ""]
    assert set(valid[valid.cp == 2].cp_comm_type) == {"a2a"} and set(valid[valid.cp == 1].cp_comm_type) == {"p2p"}


# Exports


def test_megatron_args_write_te_spelling_and_the_hierarchical_sizes():
    llama = io.load_model("llama3.1-70b")
    plan = Plan(tp=1, pp=4, cp=16, dp=1, gbs=64, cp_comm_type="a2a+p2p")
    args = " ".join(megatron_args(llama, plan))
    assert "--cp-comm-type a2a+p2p" in args and "--hierarchical-context-parallel-sizes 8 2" in args
    args = " ".join(megatron_args(llama, dataclasses.replace(plan, cp_comm_type="allgather")))
    assert "--cp-comm-type all_gather" in args and "hierarchical" not in args
    config = nemo2_recipe(llama, plan)["model"]["config"]
    assert config["cp_comm_type"] == "a2a+p2p" and config["hierarchical_context_parallel_sizes"] == [8, 2]
    assert nemo2_recipe(llama, dataclasses.replace(plan, cp_comm_type="allgather"))["model"]["config"][
        "cp_comm_type"] == "all_gather"
    assert "--cp-comm-type" not in " ".join(megatron_args(llama, dataclasses.replace(plan, cp=1, dp=16)))
    # NeMo 1's model block: TransformerConfig / ModelParallelConfig fields, read from it by name (a
    # non-p2p plan exported without them ran the ring)
    block = nemo1_config(llama, plan)["model"]
    assert block["cp_comm_type"] == "a2a+p2p" and block["hierarchical_context_parallel_sizes"] == [8, 2]
    assert "cp_comm_type" not in nemo1_config(llama, dataclasses.replace(plan, cp=1, dp=16))["model"]


def test_the_export_parses_with_megatrons_own_argument(tmp_path):
    """--cp-comm-type nargs='+' and --hierarchical-context-parallel-sizes nargs='+' type=int, as
    Megatron-LM d98e8a64dd's arguments.py declares them, read back what the export writes."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--cp-comm-type", nargs="+", type=str, default=["p2p"])
    parser.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=int, default=None)
    llama = io.load_model("llama3.1-70b")
    plan = Plan(tp=1, pp=4, cp=16, dp=1, gbs=64, cp_comm_type="a2a+p2p")
    flags = [f for f in megatron_args(llama, plan) if f.startswith(("--cp-comm-type", "--hierarchical"))]
    parsed, _ = parser.parse_known_args(" ".join(flags).split())
    assert parsed.cp_comm_type == ["a2a+p2p"] and parsed.hierarchical_context_parallel_sizes == [8, 2]
    assert np.prod(parsed.hierarchical_context_parallel_sizes) == plan.cp  # Megatron asserts it
