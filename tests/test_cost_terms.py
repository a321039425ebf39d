"""Each term of the cost model pinned to a hand computation on one small case.

The hand values are written out from the formula the term stands for (bytes over bandwidth,
FLOPs over peak, the schedule's formula), with the preset's constants, not by calling the
helpers the term calls; the sums (a layer's time, a stage's, the step's) are checked against the
named terms one by one, so that deleting or doubling any term fails here.
"""

import dataclasses
import math

import numpy as np
import pytest

from autoparallel import io, resources
from autoparallel.costmodel import gemm
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel import pipeline
from autoparallel.costmodel import peak_memory as pm
from autoparallel.costmodel import stages as st
from autoparallel.costmodel import step_time as stp
from autoparallel.costmodel import tensor_parallel
from autoparallel.costmodel.candidates import (CUDNN_FRONTEND_COLUMN, CUTLASS_DSL_COLUMN, DP_MAX_CTAS_COLUMN,
                                               TE_VERSION_COLUMN, candidates)
from autoparallel.costmodel.estimate import estimate_columns, plan_columns
from autoparallel.costmodel.memory import GIB
from autoparallel.specs.plan import Plan

REL = 1e-12


@pytest.fixture(scope="module")
def gpt(gpt175b):
    return gpt175b


@pytest.fixture(scope="module")
def mixtral():
    return io.load_model("mixtral-8x7b")


def _cands(model, hw, **knobs):
    """Candidates of one plan: GPT-3 175B's default is tp 4, pp 8, vp 2, cp 2, dp 4 (256 GPUs),
    mbs 1, gbs 64 (16 micro-batches), SP, BF16 with BF16 gradient reduce, no recompute, flash
    attention."""
    base = dict(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64, sp=True, precision="bf16", recompute="none",
                tp_comm_overlap=False, fp8_bf16_edge_layers=0, grad_reduce_in_fp32=False)
    return candidates(model, hw, plan_columns([Plan(**{**base, **knobs})]))


def _nvlink(hw):
    return hw.nvlink_gbps / 2 * 1e9 * hw.efficiency.nvlink  # unidirectional, achieved


def _network(hw):
    return hw.internode_gbps * 1e9 * hw.efficiency.internode


def _hbm(hw):
    return hw.hbm_tbps * 1e12 * hw.efficiency.hbm


def _nccl_ring_latency(n, nodes, protocol):
    """NCCL's tuner's latency of one ring reduce-scatter by hand (NVIDIA/nccl@5067397c src/graph/tuning.cc):
    baseLatencies Ring, hwLatencies NVLINK / NET Ring (NET Tree with one rank a node), getNetOverhead 1 us
    (x3 for Simple): base + (nsteps - nInterSteps) x max(NVLink step, overhead) + nInterSteps x net step."""
    base, nvlink, net, overhead = {"simple": (8.4, 3.4, 14.0, 3.0), "ll128": (14.0, 1.9, 4.0, 1.0),
                                   "ll": (6.6, 0.6, 2.7, 1.0)}[protocol]
    if n == nodes:
        net = {"simple": 14.0, "ll128": 8.5, "ll": 5.0}[protocol]
    return (base + (n - 1 - (nodes - 1)) * max(nvlink, overhead) + (nodes - 1) * net) * 1e-6


def _reduce_scatter(hw, nbytes, n, per_node, nvlink=None, calls=1):
    """nccl-tests' reduce-scatter as NCCL's ring in ``calls`` equal collectives: (n-1)/n of the buffer
    at the slower of the GPU's NVLink and its domain's per_node NICs (inside one domain, NVLink alone
    plus the model's 5 us); across domains each call NCCL's latency at the cheapest of Simple, LL128
    (0.92 of the bandwidth) and LL (0.5)."""
    nodes = n / per_node
    nvlink = _nvlink(hw) if nvlink is None else nvlink
    bus = min(nvlink, per_node * _network(hw)) if nodes > 1 else nvlink
    transfer = (n - 1) / n * nbytes / calls / bus
    if nodes == 1:
        return calls * (transfer + (hw.nvlink_latency_us if per_node > 1 else 0) * 1e-6)
    return calls * min(transfer + _nccl_ring_latency(n, nodes, "simple"),
                       transfer / 0.92 + _nccl_ring_latency(n, nodes, "ll128"),
                       transfer / 0.5 + _nccl_ring_latency(n, nodes, "ll"))


def test_a_collective_over_several_domains_runs_at_its_slowest_link_as_nccls_ring(hw):
    """NCCL's tuning model (NVIDIA/nccl@5067397c src/graph/tuning.cc, ncclTopoTuneModel) prices a
    ring at busBw = nChannels * bw, one per-channel speed on every link a channel crosses (NVLink
    and NIC at once), and time = lat + nBytes / (busBw * nRanks / nsteps), nsteps = nRanks - 1 for a
    reduce-scatter. H100 (900 GB/s NVLink both ways at 0.75, 50 GB/s NIC at 0.8), 1 GB over 32
    ranks, 8 to a node: busBw = min(337.5, 8 x 40) = 320 GB/s; Simple's latency 8.4 + 28 x 3.4 + 3 x
    14 = 145.6 us beats LL128's 79.2 us at 0.92 of the bandwidth; the series legs would take
    7/8 GB / 337.5 GB/s + 3/4 x 1/8 GB / 40 GB/s = 4.94 ms. 1 MB: LL, 6.6 + 28 x max(0.6, 1.0) + 3 x 2.7 =
    42.7 us at half the bandwidth (48.8 us against LL128's 82.5 and Simple's 148.6)."""
    assert (hw.nvlink_gbps, hw.efficiency.nvlink, hw.internode_gbps, hw.efficiency.internode) == (900, 0.75, 50, 0.8)
    assert hw.nvlink_latency_us == 5.0
    ring = 1e9 * 31 / 32 / 320e9 + 145.6e-6
    assert lt.comm.reduce_scatter_time(hw, 1e9, 32, 8) == pytest.approx(ring, rel=1e-9)
    assert ring < 7 / 8 * 1e9 / 337.5e9 + 3 / 4 / 8 * 1e9 / 40e9
    assert lt.comm.reduce_scatter_time(hw, 1e6, 32, 8) == pytest.approx(1e6 * 31 / 32 / (0.5 * 320e9) + 42.7e-6,
                                                                       rel=1e-9)
    # 1 GB in 10 buckets of 100 MB: 10 calls, each LL128's (0.329 + 0.079 ms against Simple's 0.303 + 0.146).
    assert lt.comm.group(hw, 32, 8).reduce_scatter_time(1e9, 10) == pytest.approx(
        10 * (1e8 * 31 / 32 / (0.92 * 320e9) + 79.2e-6), rel=1e-9)
    # 2 ranks to a node: their 2 NICs bind (80 GB/s); one domain: NVLink alone, (g-1)/g and 5 us as before.
    assert lt.comm.reduce_scatter_time(hw, 1e9, 8, 2) == pytest.approx(
        1e9 * 7 / 8 / 80e9 + (8.4 + 4 * 3.4 + 3 * 14) * 1e-6, rel=1e-9)
    assert lt.comm.reduce_scatter_time(hw, 1e9, 8, 8) == pytest.approx(1e9 * 7 / 8 / 337.5e9 + 5e-6, rel=1e-9)
    assert lt.comm.all_reduce_time(hw, 1e9, 32, 8) == pytest.approx(2 * ring, rel=1e-9)


def test_nccls_ring_latency_grows_with_the_ranks_as_its_tuner_prices_it():
    """tuning.cc's ring latency, Simple: 8.4 + (nsteps - nInterSteps) x max(3.4, 3 x 1.0) + nInterSteps
    x 14 us: 64 ranks over 8 nodes 8.4 + 56 x 3.4 + 7 x 14 = 296.8 us; 256 over 32, 1,204.0 us; one
    rank a node (NET Tree's 14 us, no NVLink step), 8 over 8: 8.4 + 7 x 14 = 106.4 us. LL128: 14 +
    224 x 1.9 + 31 x 4 = 563.6 us at 256 over 32."""
    latency = lt.comm.nccl_ring_latency
    assert latency("simple", 64, 8) == pytest.approx(296.8e-6, rel=1e-12)
    assert latency("simple", 256, 32) == pytest.approx(1204.0e-6, rel=1e-12)
    assert latency("simple", 8, 8) == pytest.approx(106.4e-6, rel=1e-12)
    assert latency("ll128", 256, 32) == pytest.approx(563.6e-6, rel=1e-12)
    assert latency("ll128", 8, 8) == pytest.approx((14 + 7 * 8.5) * 1e-6, rel=1e-12)
    assert latency("ll", 16, 2) == pytest.approx((6.6 + 14 * 1.0 + 2.7) * 1e-6, rel=1e-12)  # LL: max(0.6, 1.0)


def test_a_small_all_reduce_across_nodes_takes_nccls_tree(hw):
    """tuning.cc's tree all-reduce: base + 2 x ((ppn - 1) x NVLink step + log2(nodes) x network step), LL:
    6.8 + 2 x (7 x 0.6 + 1 x 5.0) = 25.2 us over 16 ranks in 2 nodes, against the ring's two reduce-scatters
    (LL: 2 x (6.6 + 14 x 1.0 + 2.7) = 46.6 us). 1 kB: the tree, its bytes at 1/3.8 of half the ring's bus
    bandwidth (min(337.5, 8 x 40) = 320 GB/s); 1 GB: the ring."""
    assert lt.comm.nccl_tree_all_reduce_latency("ll", 16, 2) == pytest.approx(25.2e-6, rel=1e-12)
    assert lt.comm.nccl_tree_all_reduce_latency("simple", 64, 8) == pytest.approx(
        (8.4 + 2 * (7 * 4.0 + 3 * 14.0)) * 1e-6, rel=1e-12)
    assert lt.comm.all_reduce_time(hw, 1e3, 16, 8) == pytest.approx(2 * 1e3 * 3.8 / 320e9 + 25.2e-6, rel=1e-9)
    assert lt.comm.all_reduce_time(hw, 1e9, 16, 8) == pytest.approx(2 * _reduce_scatter(hw, 1e9, 16, 8), rel=1e-9)
    assert lt.comm.all_reduce_time(hw, 1e3, 8, 8) == pytest.approx(2 * _reduce_scatter(hw, 1e3, 8, 8), rel=1e-9)


# --- shapes ------------------------------------------------------------------------------------

def test_candidates_derive_the_shapes(gpt, hw):
    x = _cands(gpt, hw, recompute="full", recompute_num_layers=3)
    assert x.s_local[0] == 1024 and x.tokens[0] == 1024 and x.m[0] == 16
    assert x.first_layers[0] == x.middle_layers[0] == x.last_layers[0] == 12  # 96 / 8
    assert x.recomputed_fraction[0] == 0.5  # 3 of the 6 layers of a chunk
    assert x.dp_group[0] == 8 and x.dp_per_node[0] == 2  # dp*cp, TP groups of 4 fill a node pairwise


# --- layer terms -------------------------------------------------------------------------------

def test_linear_time_is_flops_over_peak_at_the_gemm_efficiency(gpt, hw):
    x = _cands(gpt, hw)
    params = 1e9
    gemm_flops = 2 * 1024 * params / 4
    eff = hw.efficiency.gemm_max / (1 + hw.efficiency.gemm_half_gflop / (gemm_flops / 4 / 1e9))
    assert lt.linear_time(x, params)[0] == pytest.approx(gemm_flops / (989e12 * eff), rel=REL)


def test_attention_time_is_the_slower_of_causal_flops_and_exponentials(gpt, hw):
    x = _cands(gpt, hw)
    attn_flops = 0.5 * 2 * 2048 * 2048 * 96 * 256 / 8  # causal half of QK^T and PV, over tp*cp
    exponentials = 2048 * 2048 * 96 / 2 / 8
    assert attn_flops / 989e12 > exponentials / 4.2e12  # BF16 on H100: the GEMMs bound it
    expected = attn_flops / 989e12 / hw.attention_peak_share(x.s_local[0])
    assert lt.attention_time(x)[0] == pytest.approx(expected, rel=REL)


def test_unfused_softmax_moves_the_scores_through_hbm(gpt, hw):
    # 2 B softmax output + 3 B dropout per score, written and read, local queries x all keys.
    score_bytes = 2 * 5 * 96 * 1024 * 2048 / 4
    assert lt.softmax_time(_cands(gpt, hw, flash_attention=False))[0] == pytest.approx(score_bytes / _hbm(hw), rel=REL)
    assert lt.softmax_time(_cands(gpt, hw))[0] == 0.0


def test_fp8_cast_reads_bf16_and_writes_both_fp8_layouts(gpt, hw):
    x = _cands(gpt, hw, precision="fp8-delayed")
    elements = 2 * 1024 * (12288 + 96 * 128 + 12288 + 49152) / 4  # QKV, proj, FC1, FC2 inputs; fwd + bwd
    assert lt.fp8_cast_time(x, False)[0] == pytest.approx(elements * 4.0 / _hbm(hw), rel=REL)
    assert lt.fp8_cast_time(_cands(gpt, hw), False)[0] == 0.0


@pytest.fixture(scope="module")
def b200():
    return io.load_hardware("b200")


def test_nvfp4_runs_the_linear_gemms_at_the_fp4_peak(gpt, b200):
    """NVFP4 (Blackwell): all three GEMMs of a Linear at the FP4 peak (B200's 9 PF dense, twice FP8,
    held to the measured 1.81x FP8: gemm.fp4_tflops), at the FP8 GEMMs' fitted efficiency; BF16
    edge layers at the BF16 peak (harmonic mix)."""
    params, gemm_flops = 1e9, 2 * 1024 * 1e9 / 4
    eff = b200.efficiency.gemm_max / (1 + b200.efficiency.gemm_half_gflop / (gemm_flops / 4 / 1e9))
    fp4 = 4500 * 6.812 / 3.764 * 1e12 * b200.efficiency.fp8_gemm_relative
    x = _cands(gpt, b200, precision="nvfp4", sp=True, tp_comm_overlap=False)
    assert lt.linear_time(x, params)[0] == pytest.approx(gemm_flops / (fp4 * eff), rel=REL)
    edge = _cands(gpt, b200, precision="nvfp4", fp8_bf16_edge_layers=12)  # 24 of 96 layers in BF16
    mixed = 1 / (0.75 / fp4 + 0.25 / (b200.bf16_tflops * 1e12))
    assert lt.linear_time(edge, params)[0] == pytest.approx(gemm_flops / (mixed * eff), rel=REL)


def test_nvfp4_cast_passes(gpt, b200):
    """Per element: the per-tensor amax (read BF16 2 B), the amax of the Hadamard-transformed copy
    (2 B), the cast (read 2 B, write row- and column-wise E2M1 0.5 B + one E4M3 scale per 16)."""
    x = _cands(gpt, b200, precision="nvfp4")
    elements = 2 * 1024 * (12288 + 96 * 128 + 12288 + 49152) / 4
    per_element = 2 + 2 + 2 + 2 * (0.5 + 1 / 16)
    assert lt.fp8_cast_time(x, False)[0] == pytest.approx(elements * per_element / _hbm(b200), rel=REL)


def test_nvfp4_keeps_half_byte_inputs_and_weights(gpt, b200):
    """A quantized layer keeps each Linear input's column-wise copy: 1 B under FP8, 0.5625 B under
    NVFP4, but the projection's, which keeps the BF16 attention output the fused attention saves
    (Megatron's set_save_original_input for recipes other than delayed scaling); each weight's two
    layouts: 2 B under FP8, 2 x (0.5 + 1/256) under NVFP4 (16x16 blocks)."""
    fp8, fp4 = _cands(gpt, b200, precision="mxfp8"), _cands(gpt, b200, precision="nvfp4")
    gemm_inputs = 1024 * (12288 + 12288 + 49152) / 4  # per layer, SP and TP 4: QKV, FC1, FC2
    saved = lt.activation_bytes(fp8, False, False)[0] - lt.activation_bytes(fp4, False, fp4.keep_scores)[0]
    bf16 = lt.activation_bytes(fp8, False, False)[0] - lt.activation_bytes(fp8, False, fp8.keep_scores)[0]
    assert bf16 == pytest.approx(gemm_inputs * (2 - 1), rel=1e-9)
    assert saved == pytest.approx(gemm_inputs * (2 - 0.5625), rel=1e-9)
    _, _, _, copies = pm.model_states(fp4, _fake_layers(fp4), (1e9, 0.0), 12, 0)
    assert copies[0] == pytest.approx(2 * (0.5 + 1 / 256) * 12 * 1e8)


def test_forward_and_compute(gpt, hw):
    x = _cands(gpt, hw)
    eff = hw.efficiency
    elementwise = eff.elementwise_bytes_per_token_hidden / 34.0 * lt.activation_bytes(x, False, False)[0] / _hbm(hw)
    forward = lt.forward_time(x, 0.5, 0.25, 0.125, False)[0]
    assert forward == pytest.approx(0.5 + 0.25 + elementwise + 0.125 + eff.layer_overhead_s, rel=REL)
    assert lt.compute_time(x, 2.0, 0.5) == 6.0


def test_recompute_terms(gpt, hw):
    full = _cands(gpt, hw, recompute="full", recompute_num_layers=3)
    assert lt.full_recompute_time(full, 2.0)[0] == 1.0
    selective = _cands(gpt, hw, recompute="selective", recompute_modules="core_attn")
    assert lt.selective_recompute_time(selective, 0.3, 0.1, False)[0] == pytest.approx(0.4)
    assert lt.selective_recompute_time(_cands(gpt, hw), 0.3, 0.1, False)[0] == 0.0


def test_norm_recompute_reruns_two_norms_through_hbm(gpt, hw):
    """--recompute-modules layernorm: each norm reads its BF16 input and writes its BF16 output
    again in the backward pass; 1024 tokens x 12288 hidden, SP-sharded over tp 4."""
    x = _cands(gpt, hw, recompute="selective", recompute_modules="layernorm")
    norms = 2 * (2 + 2) * 1024 * 12288 / 4 / _hbm(hw)
    assert lt.norm_recompute_time(x)[0] == pytest.approx(norms, rel=REL)
    assert lt.selective_recompute_time(x, 0.3, 0.1, False)[0] == pytest.approx(norms, rel=REL)


def test_norm_recompute_spares_the_norms_outputs(gpt, mixtral, hw):
    """The attention's first Linear input and FC1's (BF16: 2 B each; under FP8 the Linears keep
    the original input, so the FP8 copies go too); in a MoE layer the router's BF16 input."""
    sbh = 1024 * 12288 / 4  # SP-sharded tokens x hidden
    bf16 = _cands(gpt, hw, recompute="selective", recompute_modules="layernorm")
    spared = lt.stored_activation_bytes(_cands(gpt, hw), False)[0] - lt.stored_activation_bytes(bf16, False)[0]
    assert spared == pytest.approx((2 + 2) * sbh, rel=REL)
    fp8 = _cands(gpt, hw, recompute="selective", recompute_modules="layernorm", precision="fp8-current")
    kept = lt.stored_activation_bytes(_cands(gpt, hw, precision="fp8-current"), False)[0]
    assert kept - lt.stored_activation_bytes(fp8, False)[0] == pytest.approx((1 + 1) * sbh, rel=REL)
    moe = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=8)
    plain, normed = _cands(mixtral, hw, **moe), _cands(mixtral, hw, recompute="selective", recompute_modules="layernorm", **moe)
    moe_spared = lt.stored_activation_bytes(plain, True)[0] - lt.stored_activation_bytes(normed, True)[0]
    assert moe_spared == pytest.approx((2 + 2) * 4096 * 4096, rel=REL)  # attention input, router input


def test_tp_comm_is_five_collectives_per_block_as_transformer_engine_runs_them(gpt, hw):
    one = 3 / 4 * 2 * 1024 * 12288 / _nvlink(hw) + hw.nvlink_latency_us * 1e-6  # one AG or RS over tp 4
    hide = lambda c, window: max((1 - hw.efficiency.tp_overlap) * c, c - window)  # noqa: E731
    linear, chunked = 1.0e-4, 1.6e-4  # forward GEMMs of the layer's two blocks: whole, in 4 chunks
    half, half_chunked = linear / 2 / 2, chunked / 2 / 2
    # Without userbuffers: forward AG and RS and the output-gradient AG are waited on; the input
    # AG and the dgrad RS run beside the column Linear's dgrad and wgrad.
    plain = 2 * (3 * one + 2 * hide(one, half))
    assert tensor_parallel.tp_comm_time(_cands(gpt, hw), 2.0, linear, chunked)[0] == pytest.approx(plain, rel=REL)
    # Userbuffers: the three waited ones ring-exchange (copy engines) beside their chunked GEMMs,
    # which run slower; each of the 3 steps' transfers outlasting one chunk's GEMM is exposed.
    step = 2 * 1024 * 12288 / 4 / _nvlink(hw) + hw.nvlink_latency_us * 1e-6
    ring = 2 * (3 * 3 * max(step - half_chunked / 4, 0.0) + 2 * hide(one, half) + 3 * (half_chunked - half))
    assert step > half_chunked / 4  # some exposed: the term is seen
    overlapped = _cands(gpt, hw, tp_comm_overlap=True)
    assert tensor_parallel.tp_comm_time(overlapped, 2.0, linear, chunked)[0] == pytest.approx(ring, rel=REL)
    # Without SP: the forward all-reduce waited on, the dgrad all-reduce beside the wgrad.
    no_sp = 2 * (2 * one + hide(2 * one, half))
    assert tensor_parallel.tp_comm_time(_cands(gpt, hw, sp=False), 2.0, linear, chunked)[0] == pytest.approx(no_sp, rel=REL)
    assert tensor_parallel.tp_comm_time(_cands(gpt, hw, tp=1, dp=16), 2.0, linear, chunked)[0] == 0.0


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_ring_exchange_hides_each_step_behind_one_chunk_not_the_whole_gemm(gpt, hw, tp):
    """TE's split_overlap_ag / split_overlap_rs: tp GEMM chunks, tp-1 transfers of one chunk, each
    beside one chunk's GEMM (the AG's last chunk and the RS's first have none): the window is
    (tp-1)/tp of the chunked GEMM, not all of it."""
    x = _cands(gpt, hw, tp=tp, dp=32 // tp, tp_comm_overlap=True)
    nbytes = 2 * 1024 * 12288  # the gathered activation, BF16: 1024 tokens x hidden
    latency = hw.nvlink_latency_us * 1e-6
    one = (tp - 1) / tp * nbytes / _nvlink(hw) + latency  # the whole AG / RS
    step = nbytes / tp / _nvlink(hw) + latency  # one chunk, its own latency
    chunked = one  # a chunked GEMM as long as the collective: the old window hid it all
    exposed = (tp - 1) * max(step - chunked / tp, 0.0)
    got = tensor_parallel.ring_exchange_exposed(x, one, chunked)[0]
    assert got == pytest.approx(exposed, rel=REL)
    assert got > 0.0  # ... which (tp-1)/tp of it does not
    # Only the bandwidth part with one latency per step: TP2 exposes one step's latency less half
    # the GEMM's share of it; each step's GEMM covers chunked/tp.
    bandwidth = (tp - 1) / tp * nbytes / _nvlink(hw)
    assert got == pytest.approx((tp - 1) * (bandwidth / (tp - 1) + latency) - (tp - 1) / tp * chunked, rel=1e-9)
    # A chunked GEMM tp/(tp-1) times the per-step transfer x (tp-1) hides every step.
    assert tensor_parallel.ring_exchange_exposed(x, one, tp * step)[0] == 0.0
    # Through tp_comm_time: forward AG + RS and the output-gradient AG, per block, ring-exchanged.
    linear, whole = 1.0e-4, 4 * one  # two blocks' forward GEMMs: whole, chunked (half each per Linear)
    plain = tensor_parallel.tp_comm_time(_cands(gpt, hw, tp=tp, dp=32 // tp), 2.0, linear, whole)[0]
    hide = lambda c, window: max((1 - hw.efficiency.tp_overlap) * c, c - window)  # noqa: E731
    assert plain == pytest.approx(2 * (3 * one + 2 * hide(one, linear / 4)), rel=REL)
    ring = 2 * (3 * exposed + 2 * hide(one, linear / 4) + 3 * (one - linear / 4))
    assert tensor_parallel.tp_comm_time(x, 2.0, linear, whole)[0] == pytest.approx(ring, rel=REL)


def test_pipelined_forward_rs_as_mlperf_lora_configs_run_it(gpt, hw):
    """TE's pipeline method (NVIDIA's MLPerf LoRA TP4 conf/tp_overlap/h100tp4mbs1.yaml: num_splits 4,
    num_sm 32 / 16, set_sm_margin, atomic GEMM, fp8_buf on proj_fprop only): the whole GEMM on the SMs the collective leaves,
    its output reduce-scattered in 4 pieces, each beside the next piece's GEMM, the last exposed."""
    assert hw.sm_count == 132
    x = _cands(gpt, hw, tp_comm_overlap=True, tp_overlap_rs_pipeline=True)
    latency = hw.nvlink_latency_us * 1e-6
    one = 3 / 4 * 2 * 1024 * 12288 / _nvlink(hw) + latency  # the whole RS over tp 4
    piece = 3 / 4 * 2 * 1024 * 12288 / 4 / _nvlink(hw) + latency  # a quarter of it, its own latency
    loss = (32 / 100 + 16 / 116) / 2  # the GEMM runs on 100 (proj) / 116 (fc2) of 132 SMs
    gemm = 1.0e-6  # a GEMM far shorter than a piece: every piece is exposed but the GEMM's share
    assert tensor_parallel.pipelined_rs_exposed(x, one, gemm)[0] == pytest.approx(
        gemm * loss + 3 * (piece - gemm * (1 + loss) / 4) + piece, rel=REL)
    gemm = 1.0  # a GEMM far longer: the last piece and the SMs' loss only
    assert tensor_parallel.pipelined_rs_exposed(x, one, gemm)[0] == pytest.approx(gemm * loss + piece, rel=REL)
    # Through tp_comm_time: the forward RS (one per block) leaves the ring exchange for the pipeline;
    # the forward AG and the output-gradient AG stay ring exchanges.
    linear, chunked = 1.0e-4, 1.6e-4
    half, half_chunked = linear / 4, chunked / 4
    hide = lambda c, window: max((1 - hw.efficiency.tp_overlap) * c, c - window)  # noqa: E731
    step = 2 * 1024 * 12288 / 4 / _nvlink(hw) + latency
    ring_one = 3 * max(step - half_chunked / 4, 0.0) + (half_chunked - half)
    pipelined = sum(half * lost + 3 * max(piece - half * (1 + lost) / 4, 0.0) + piece
                    for lost in (32 / 100, 16 / 116)) / 2
    expected = 2 * (2 * ring_one + pipelined + 2 * hide(one, half))
    assert tensor_parallel.tp_comm_time(x, 2.0, linear, chunked)[0] == pytest.approx(expected, rel=REL)
    # An FP8 recipe: proj_fprop's fp8_buf moves its pieces in FP8 (half the bytes); fc2_fprop stays BF16.
    fp8 = _cands(gpt, hw, tp_comm_overlap=True, tp_overlap_rs_pipeline=True, precision="fp8-delayed")
    fp8_piece = 3 / 4 * 1024 * 12288 / 4 / _nvlink(hw) + latency
    gemm = 1.0
    assert tensor_parallel.pipelined_rs_exposed(fp8, one, gemm)[0] == pytest.approx(
        gemm * loss + (fp8_piece + piece) / 2, rel=REL)
    # Without userbuffers the knob prices nothing (the search refuses it there).
    plain = _cands(gpt, hw, tp_overlap_rs_pipeline=True)
    assert tensor_parallel.tp_comm_time(plain, 2.0, linear, chunked)[0] == pytest.approx(
        tensor_parallel.tp_comm_time(_cands(gpt, hw), 2.0, linear, chunked)[0], rel=REL)


def test_ring_exchange_chunks_each_gemm_into_tp_row_blocks(gpt, hw):
    x = _cands(gpt, hw)
    params = gpt.dense_layer_params
    gemm_flops = 2 * 1024 * params / 4 / 4  # one of the layer's four GEMMs, SP-gathered tokens
    eff = lambda f: hw.efficiency.gemm_max / (1 + hw.efficiency.gemm_half_gflop / (f / 1e9))  # noqa: E731
    assert lt.linear_time(x, params, chunks=4)[0] == pytest.approx(4 * gemm_flops / (989e12 * eff(gemm_flops / 4)), rel=REL)


def test_cp_ring_exchange_sends_kv_cp_minus_one_hops_three_times(gpt, hw):
    x = _cands(gpt, hw)  # tp 4 x cp 2 = one NVLink domain
    kv_bytes = 2 * 1 * 1024 * 256 * (96 / 4)  # K and V (qk + v dims) of the local heads
    ring = 3 * 1 * (kv_bytes / _nvlink(hw) + hw.nvlink_latency_us * 1e-6)
    assert lt.cp_comm_time(x, 0.0)[0] == pytest.approx(ring, rel=REL)
    assert lt.cp_comm_time(x, 1.0)[0] == pytest.approx((1 - hw.efficiency.cp_overlap) * ring, rel=REL)
    assert lt.cp_comm_time(_cands(gpt, hw, cp=1, dp=8), 0.0)[0] == 0.0


def test_cp_with_softmax_sinks_is_te_all_to_all_of_q_k_v_and_o_both_ways(gpt, hw):
    """A model with softmax sinks runs TE's all-to-all CP (AttnFuncWithCPAndQKVOA2A), the only CP
    TransformerEngine allows with them: Q, K, V in and O out forward, dO in and dQ, dK, dV out
    backward, each one all-to-all of the local tensor over the CP group (tp apart), none hidden."""
    sinks = dataclasses.replace(gpt, softmax_type="learnable", num_query_groups=8)
    x = _cands(sinks, hw, cp=4, dp=2)  # tp 4 x cp 4: two 8-GPU NVLink domains
    q = 2 * 1 * 512 * (96 / 4) * 128   # BF16, mbs 1 x s/cp tokens, 24 local heads of 128
    kv = 2 * 1 * 512 * (8 / 4) * 128   # 2 local query groups
    inside = 8 // 4                    # CP ranks tp apart: 2 share a domain, 2 domains
    nvlink = hw.nvlink_gbps / 2 * 1e9 * hw.efficiency.alltoall
    network = hw.internode_gbps * 1e9 * hw.efficiency.alltoall
    latency = (hw.nvlink_latency_us + hw.internode_latency_us) * 1e-6  # inside - 1 = 1 NVLink peer

    def a2a(nbytes):
        return max(nbytes * (inside - 1) / 4 / nvlink, nbytes * (4 - inside) / 4 / network) + latency

    hand = 2 * (2 * a2a(q) + 2 * a2a(kv))  # Q and O, K and V; forward and backward
    assert lt.cp_comm_time(x, 0.0)[0] == pytest.approx(hand, rel=REL)
    assert lt.cp_comm_time(x, 1.0)[0] == pytest.approx(hand, rel=REL)  # not hidden behind attention
    assert lt.cp_comm_time(_cands(sinks, hw, cp=1, dp=8), 0.0)[0] == 0.0
    vanilla = dataclasses.replace(sinks, softmax_type="vanilla")
    assert lt.cp_comm_time(_cands(vanilla, hw, cp=4, dp=2), 0.0)[0] != pytest.approx(hand, rel=1e-3)


def test_fsdp_gathers_twice_and_reduce_scatters_once_per_layer(gpt, hw):
    x = _cands(gpt, hw, fsdp=True)
    params = 1e8
    one = _reduce_scatter(hw, params * 2.0, 8, 2)  # BF16 weights or BF16 gradients over dp*cp = 8
    # Nothing to hide behind (forward 0): gather before forward, gather + reduce after backward.
    assert lt.fsdp_time(x, params, 0.0, 0.0, 0.0, False)[0] == pytest.approx(3 * one, rel=REL)
    assert lt.fsdp_time(_cands(gpt, hw), params, 0.0, 0.0, 0.0, False)[0] == 0.0


def test_ep_all_to_alls_dispatch_and_combine_each_way(mixtral, hw):
    x = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    imbalance = 1 + hw.efficiency.moe_load_imbalance * math.sqrt(2 * math.log(8))
    assert x.imbalance[0] == pytest.approx(imbalance, rel=REL)
    nbytes = 4096 * 2 * 4096 * 2.0 * imbalance  # tokens x top-2 x hidden, BF16, busiest rank
    # NCCL's all-to-all: one send/receive per peer, each of the 7 NVLink peers paying the latency.
    link = hw.nvlink_gbps / 2 * 1e9 * hw.efficiency.alltoall
    alltoall = nbytes * 7 / 8 / link + 7 * hw.nvlink_latency_us * 1e-6
    # Each dispatch also sends every copy's FP32 routing probability in an all-to-all of its own.
    probs = 4096 * 2 * 4.0 * imbalance * 7 / 8 / link + 7 * hw.nvlink_latency_us * 1e-6
    assert lt.ep_comm_time(x, 1.0, True)[0] == pytest.approx(4 * alltoall + 2 * probs, rel=REL)
    assert lt.ep_comm_time(x, 1.0, False)[0] == 0.0
    overlapped = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64,
                        overlap_moe_expert_parallel_comm=True)
    assert lt.ep_comm_time(overlapped, 1.0, True)[0] == pytest.approx(
        (1 - hw.efficiency.ep_overlap) * (4 * alltoall + 2 * probs), rel=REL)


def test_a_dualpipe_row_hides_all_its_all_to_alls_and_p2p_sends_the_compute_beside_can(mixtral, gpt, hw):
    """DeepSeek-V3 report §3.2.1: "both all-to-all and PP communication can be fully hidden"."""
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, overlap_moe_expert_parallel_comm=True)
    cols = plan_columns([Plan(**{**dict(mbs=1, precision="bf16", recompute="none", grad_reduce_in_fp32=False), **knobs})])
    dual = candidates(mixtral, hw, {**cols, "pipeline_schedule": np.array(["dualpipe"], dtype=object)})
    alltoall = lt.ep_comm_time(_cands(mixtral, hw, **knobs), 1e9, True)[0] / (1 - hw.efficiency.ep_overlap)
    assert lt.ep_comm_time(dual, 1e9, True)[0] == 0.0  # alltoall: no SMs taken
    assert lt.ep_comm_time(dual, 0.25 * alltoall, True)[0] == pytest.approx(0.75 * alltoall, rel=REL)
    pp_cols = plan_columns([Plan(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64)])
    assert st.pp_comm_time(candidates(gpt, hw, {**pp_cols, "pipeline_schedule": np.array(["dualpipe"], dtype=object)}))[0] == 0.0


def test_shared_expert_overlap_hides_the_all_to_alls_behind_the_shared_experts_gemms(hw):
    """Forward, backward (twice the forward) and nothing recomputed: the window is the shared
    experts' three GEMM passes; at most ep_overlap of the all-to-alls hides."""
    model = io.load_model("deepseek-v3")
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, moe_token_dispatcher_type="alltoall")
    plain, shared = _cands(model, hw, **knobs), _cands(model, hw, moe_shared_expert_overlap=True, **knobs)
    total = lt.ep_comm_time(plain, 1.0, True)[0]
    window = 3.0 * lt.linear_time(shared, model.shared_expert_params)[0]
    expected = max((1 - hw.efficiency.ep_overlap) * total, total - window)
    assert lt.ep_comm_time(shared, 1.0, True)[0] == pytest.approx(expected, rel=REL)
    assert expected < total


def test_a_moe_layers_elementwise_work_is_in_proportion_to_what_it_saves(mixtral, hw):
    x = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    eff = hw.efficiency
    expected = eff.elementwise_bytes_per_token_hidden / 34.0 * lt.activation_bytes(x, True, False)[0] / _hbm(hw) \
        + eff.layer_overhead_s
    assert lt.forward_time(x, 0.0, 0.0, 0.0, True)[0] == pytest.approx(expected, rel=REL)


def test_the_calls_per_local_expert_are_transformer_engines_gemms_and_quantizes(mixtral, hw):
    """Mixtral at ep 8: one local expert, two GroupedLinears (FC1, FC2). BF16: one GEMM each
    forward, a dgrad and a wgrad backward (2 and 4 calls); FP8: a quantize per GEMM input or
    output gradient too (4 and 6). At ep 2 a GPU holds 4 experts: four times the calls. Each costs
    the host ``moe_expert_call_s``; a plain schedule waits for the forward's only (the backward's
    are issued ahead of the GPU)."""
    call = hw.efficiency.moe_expert_call_s
    bf16 = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    forward, backward = lt.moe_expert_calls(bf16)
    assert forward[0] == pytest.approx(2 * call, rel=REL) and backward[0] == 0.0
    assert [c[0] for c in lt.expert_call_count(bf16)] == [2, 4]
    fp8 = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, precision="fp8-delayed")
    forward, backward = lt.moe_expert_calls(fp8)
    assert forward[0] == pytest.approx(4 * call, rel=REL) and backward[0] == 0.0
    assert [c[0] for c in lt.expert_call_count(fp8)] == [4, 6]
    two = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=2, sp=False, gbs=64, precision="fp8-delayed")
    assert lt.moe_expert_calls(two)[0][0] == pytest.approx(4 * 4 * call, rel=REL)
    # NVFP4 (a Blackwell recipe) fuses its splits' quantize kernels into one launch, but TE's
    # split_quantize still builds a Python tensor object per split: the FP8 count, as MXFP8's.
    b200 = io.load_hardware("b200")
    call = b200.efficiency.moe_expert_call_s
    for precision in ("nvfp4", "mxfp8"):
        x = _cands(mixtral, b200, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, precision=precision)
        forward, backward = lt.moe_expert_calls(x)
        assert forward[0] == pytest.approx(4 * call, rel=REL) and backward[0] == 0.0
        assert [c[0] for c in lt.expert_call_count(x)] == [4, 6]


def test_each_local_experts_rows_are_padded_to_the_quantization_alignment(mixtral):
    """Megatron-Core pads each local expert's segment to the recipe's alignment under a quantized
    recipe (HybridEP in its dispatch, else TEGroupedMLP's Fp8Padding): half an alignment on average,
    at the routed experts' GEMM speed, twice in the backward. Mixtral on B200 at ep 2 (4 local
    experts): 4096 tokens x 2 copies x ep 2 / 8 experts = 2048 rows per expert (times the busiest
    rank's imbalance); MXFP8 pads 16 rows on average, NVFP4 64, per-tensor FP8 8; BF16 none."""
    b200 = io.load_hardware("b200")
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=2, sp=False, gbs=64)
    imbalance = 1.0 + b200.efficiency.moe_load_imbalance * math.sqrt(2.0 * math.log(2.0))
    for precision, half in (("mxfp8", 16.0), ("nvfp4", 64.0), ("fp8-current", 8.0), ("bf16", 0.0)):
        x = _cands(mixtral, b200, precision=precision, **knobs)
        t_experts = lt.routed_experts_time(x)
        padding = t_experts[0] * half / (2048.0 * imbalance)
        forward, backward = lt.quantization_padding_time(x, t_experts)
        assert forward[0] == pytest.approx(padding, rel=1e-9), precision
        assert backward[0] == pytest.approx(2 * padding, rel=1e-9), precision
        calls = lt.moe_expert_calls(x)
        assert [c[0] for c in lt.expert_calls(x, t_experts)] == pytest.approx(
            [calls[0][0] + padding, calls[1][0] + 2 * padding], rel=1e-9)
    # The fused grouped MLP pads to its own 256 rows instead: no second padding.
    fused = _cands(mixtral, b200, precision="mxfp8", cutedsl_fused_grouped_mlp=True, **knobs)
    t_experts = lt.routed_experts_time(fused)
    assert lt.expert_calls(fused, t_experts)[0][0] == pytest.approx(lt.fused_grouped_mlp_calls(fused, t_experts)[0][0])


def test_the_fused_grouped_mlp_pays_its_kernels_once_per_pass_and_half_a_256_row_tile_per_expert(mixtral):
    """Mixtral (SwiGLU, 8 experts, top-2) on B200 under MXFP8 at ep 2: 4 local experts. With the
    CuTe-DSL fused grouped MLP (Megatron-Bridge cutedsl_fused_grouped_mlp), 3 kernels forward and 5
    backward whatever the local experts (TE v2.16 forward_grouped_mlp.py / backward_grouped_mlp.py),
    each at one call's cost, plus each expert's rows padded to 256: 4096 tokens x 2 copies x ep 2 /
    8 experts = 2048 rows per expert (times the busiest rank's imbalance), 128 pad rows on average,
    at the routed experts' GEMM speed (twice in the backward). Off, the per-expert loop's 4 forward
    calls per local expert and MXFP8's padding to 32 rows. The backward's kernels / calls are issued ahead of the GPU (no host sync
    in the backward of a plain schedule): not waited for."""
    b200 = io.load_hardware("b200")
    call = b200.efficiency.moe_expert_call_s
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=2, sp=False, gbs=64, precision="mxfp8")
    fused = _cands(mixtral, b200, cutedsl_fused_grouped_mlp=True, **knobs)
    looped = _cands(mixtral, b200, **knobs)
    t_experts = lt.routed_experts_time(fused)
    imbalance = 1.0 + b200.efficiency.moe_load_imbalance * math.sqrt(2.0 * math.log(2.0))
    padding = t_experts[0] * 128.0 / (2048.0 * imbalance)
    forward, backward = lt.expert_calls(fused, t_experts)
    assert forward[0] == pytest.approx(3 * call + padding, rel=1e-9)
    assert backward[0] == pytest.approx(2 * padding, rel=1e-9)
    off_forward, off_backward = lt.expert_calls(looped, lt.routed_experts_time(looped))
    mxfp8_padding = lt.routed_experts_time(looped)[0] * 16.0 / (2048.0 * imbalance)
    assert off_forward[0] == pytest.approx(4 * 4 * call + mxfp8_padding, rel=REL)
    assert off_backward[0] == pytest.approx(2 * mxfp8_padding, rel=REL)
    assert forward[0] < off_forward[0]
    # The MoE layer takes the fused calls in its compute.
    layer = lt.moe_layer(fused)
    own = sum(b[0] - 2 * f[0] for f, b in (lt.router_time(fused), lt.permutation_time(fused), (forward, backward),
                                           lt.post_sync_host_calls(fused)))
    assert layer["compute"][0] == pytest.approx(3 * layer["forward"][0] + own, rel=1e-9)


def test_the_host_calls_after_the_dropless_sync_are_counted_per_dispatcher(mixtral):
    """After the dropless dispatcher's host sync the GPU waits for every call the host issues in
    the MoE layer's forward, not only the per-expert ones. Mixtral (SwiGLU: one fused weighted
    activation; no shared experts, no latent projection) on B200. alltoall, one local expert, BF16:
    4 dispatcher calls (tokens', probabilities' and combine all-to-alls, unpermute) + 4 experts'
    module calls + 1 activation + 1 residual add = 10; 4 local experts under FP8 add the two sorts by
    local expert and the three Fp8Padding / Unpadding calls (15); DeepEP 19 dispatcher calls (its
    unfused multihot), HybridEP 4 and no padding of its own. Each at ``moe_expert_call_s``, forward
    only; none under a full-iteration CUDA graph (no sync)."""
    b200 = io.load_hardware("b200")
    call = b200.efficiency.moe_expert_call_s
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, sp=False, gbs=64)
    cases = ((dict(ep=8, moe_token_dispatcher_type="alltoall"), 10),
             (dict(ep=2, moe_token_dispatcher_type="alltoall", precision="fp8-current"), 15),
             (dict(ep=8, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep", precision="mxfp8"), 28),
             (dict(ep=8, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep", precision="mxfp8"), 10))
    for extra, count in cases:
        x = _cands(mixtral, b200, **knobs, **extra)
        assert lt.post_sync_call_count(x)[0] == pytest.approx(count), extra
        forward, backward = lt.post_sync_host_calls(x)
        assert forward[0] == pytest.approx(count * call, rel=1e-12) and backward[0] == 0.0
    graphed = _cands(mixtral, b200, **knobs, ep=8, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                     precision="mxfp8", cuda_graph="full_iteration")
    assert lt.post_sync_host_calls(graphed)[0][0] == 0.0


def _stack_cands(model, hw, stack, **knobs):
    """``_cands`` with a container's (cuDNN frontend, CUTLASS DSL) row-only columns; ``stack`` None: none."""
    base = dict(tp=1, pp=1, vp=1, cp=1, mbs=4, gbs=1280, sp=False, precision="bf16", recompute="none",
                tp_comm_overlap=False, fp8_bf16_edge_layers=0, grad_reduce_in_fp32=False)
    cols = plan_columns([Plan(**{**base, **knobs})])
    if stack is not None:
        cols = {**cols, CUDNN_FRONTEND_COLUMN: np.array([stack[0]], dtype=object),
                CUTLASS_DSL_COLUMN: np.array([stack[1]], dtype=object)}
    return candidates(model, hw, cols)


def test_the_regressed_dglu_bias_gradient_loop_costs_its_measured_excess_over_fc2s_data_gradient():
    """cudnn-frontend issue 256 / PR 322: under CUTLASS DSL 4.5 the fused MLP's dGLU kernel with the
    bias gradient took 1,362.768 us against 155.632 us fixed and 138.960 us without the bias gradient
    (SM100, GPT-OSS-20B's shape). GPT-OSS-120B (expert biases, a GLU: FC1 2 x 2880 wide, FC2 2880) on
    GB200 at EP 64 under MXFP8 with the fused MLP, in the 26.06.01 container's stack (1.24.0, 4.5.0):
    the backward pays (1362.768 - 155.632) / 138.960 = 8.687 times FC2's data gradient, a third of the
    routed experts' forward GEMMs. Nothing with 26.06's stack (1.23.0, 4.4.1), 26.08's (1.26.0, 4.5.0),
    1.24.0 under DSL 4.4.1, no stated stack (a search), or a model without expert biases (Mixtral)."""
    gb200 = io.load_hardware("gb200")
    oss = io.load_model("gpt-oss-120b")
    knobs = dict(dp=64, ep=64, precision="mxfp8", cutedsl_fused_grouped_mlp=True)
    x = _stack_cands(oss, gb200, ("1.24.0", "4.5.0"), **knobs)
    t_experts = lt.routed_experts_time(x)
    excess = (1362.768 - 155.632) / 138.960
    assert excess == pytest.approx(8.6869, abs=1e-4)
    expected = excess * t_experts[0] / 3.0
    assert lt.dglu_dbias_regression_time(x, t_experts)[0] == pytest.approx(expected, rel=1e-12)
    fused = lt.fused_grouped_mlp_calls(x, t_experts)
    plain = lt.fused_grouped_mlp_calls(_stack_cands(oss, gb200, None, **knobs), t_experts)
    assert fused[0][0] == pytest.approx(plain[0][0], rel=1e-12)  # forward untouched
    assert fused[1][0] - plain[1][0] == pytest.approx(expected, rel=1e-9)
    for stack in (("1.23.0", "4.4.1"), ("1.26.0", "4.5.0"), ("1.24.0", "4.4.1"), None):
        y = _stack_cands(oss, gb200, stack, **knobs)
        assert lt.dglu_dbias_regression_time(y, lt.routed_experts_time(y))[0] == 0.0, stack
    assert lt.dglu_dbias_regressed(_stack_cands(oss, gb200, ("1.25.0", "4.5.0"), **knobs))[0]
    mixtral = _stack_cands(io.load_model("mixtral-8x7b"), gb200, ("1.24.0", "4.5.0"), dp=64, ep=8, precision="mxfp8",
                           cutedsl_fused_grouped_mlp=True)
    assert lt.dglu_dbias_regression_time(mixtral, lt.routed_experts_time(mixtral))[0] == 0.0


def test_the_newer_bridge_rows_carry_their_containers_cutedsl_stack():
    """The Megatron-Bridge summaries' rows of 26.06 / 26.06.01 / 26.08 carry their tag's pinned cuDNN
    frontend and CUTLASS DSL (``measured_runs.BRIDGE_CUTEDSL_STACK``) as row-only columns: the 26.06.01
    GPT-OSS rows 1.24.0 / 4.5.0, so the regressed dGLU loop is priced there and nowhere else among them;
    older releases and other sources carry none."""
    from autoparallel import measured_runs as mr
    frame = mr.read_runs_table(resources.data_file("training_runs_newer.csv"), mr.RUN_COLUMNS)
    rows = {str(r["id"]): r for _, r in frame.iterrows()}
    regressed = "bridge-26.06.01-gpt-oss-120b-gb200-64gpu-mxfp8-tp1pp1cp1vp1ep64-mbs4-gbs1280"
    assert mr.container_columns(rows[regressed]) == {CUDNN_FRONTEND_COLUMN: "1.24.0", CUTLASS_DSL_COLUMN: "4.5.0"}
    fixed = "bridge-26.08-gpt-oss-120b-gb200-64gpu-mxfp8-tp1pp1cp1vp1ep64-mbs4-gbs1280"
    assert mr.container_columns(rows[fixed]) == {CUDNN_FRONTEND_COLUMN: "1.26.0", CUTLASS_DSL_COLUMN: "4.5.0"}
    assert mr.container_columns(rows["bridge-26.04-gpt-oss-120b-gb200-64gpu-bf16-tp1pp1cp1vp1ep64-mbs4-gbs1280"]) == {}
    prepared = mr.prepare_row(rows[regressed], io.read_yaml(mr.ASSUMPTIONS), mr.recipe_settings())
    assert set(prepared.cols[CUDNN_FRONTEND_COLUMN]) == {"1.24.0"}
    assert set(prepared.cols[CUTLASS_DSL_COLUMN]) == {"4.5.0"}


def test_paged_stashing_copies_the_fused_mlps_saved_tensors_out_and_back_under_the_full_iteration_graph(mixtral):
    """Megatron-Core's paged stash (set with the 1.5 capacity on the Bridge recipes' MXFP8
    full-iteration graphs) copies the tensors TE's fused grouped MLP marks as grouped
    (``mark_grouped_tensor``) into a paged buffer after the forward and back before the backward:
    per routed token copy FC1's input h + h/32 scale bytes, FC1's BF16 output 2 x 2f (gated), the
    FP32 probability and FC2's input f + f/32. Mixtral (h 4096, f 14336): 4224 + 57344 + 4 +
    14784 = 76,356 bytes; 4096 tokens x top-2 copies x the busiest rank's imbalance, each byte
    read and written once a pass. Qwen3-30B-A3B (h 2048, f 768): 2112 + 3072 + 4 + 792 = 5,980.
    Not without the full-iteration graph, nor for the per-expert loop."""
    assert lt.paged_stash_bytes_per_copy(mixtral) == pytest.approx(76356.0)
    assert lt.paged_stash_bytes_per_copy(io.load_model("qwen3-30b-a3b")) == pytest.approx(5980.0)
    b200 = io.load_hardware("b200")
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=2, sp=False, gbs=64, precision="mxfp8")
    graphed = _cands(mixtral, b200, cutedsl_fused_grouped_mlp=True, cuda_graph="full_iteration", **knobs)
    eager = _cands(mixtral, b200, cutedsl_fused_grouped_mlp=True, **knobs)
    imbalance = 1.0 + b200.efficiency.moe_load_imbalance * math.sqrt(2.0 * math.log(2.0))
    one_pass = 2.0 * 4096 * 2 * imbalance * 76356.0 / _hbm(b200)
    assert lt.paged_stash_time(graphed)[0][0] == pytest.approx(one_pass, rel=1e-9)
    with_stash = lt.expert_calls(graphed, lt.routed_experts_time(graphed))
    without = lt.expert_calls(eager, lt.routed_experts_time(eager))
    assert with_stash[0][0] - without[0][0] == pytest.approx(one_pass, rel=1e-9)
    assert with_stash[1][0] - without[1][0] == pytest.approx(one_pass, rel=1e-9)
    looped = _cands(mixtral, b200, cuda_graph="full_iteration", **knobs)
    t_looped = lt.routed_experts_time(looped)
    assert lt.expert_calls(looped, t_looped)[0][0] == pytest.approx(
        lt.moe_expert_calls(looped)[0][0] + lt.quantization_padding_time(looped, t_looped)[0][0], rel=1e-9)


def test_the_token_permutations_are_one_pass_each_way_and_a_sort_per_local_expert_group(mixtral, hw):
    """Mixtral, ep 8 (one local expert: no sort): permute reads 4096 tokens and writes 8192
    copies, unpermute the reverse, BF16 x hidden 4096; backward the same bytes. At ep 4 (two local
    experts) the alltoall dispatcher also sorts the received copies and sorts them back."""
    x = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    one_way = 2 * (4096 + 4096 * 2) * 2.0 * 4096 / _hbm(hw)
    forward, backward = lt.permutation_time(x)
    assert forward[0] == pytest.approx(one_way, rel=REL) and backward[0] == pytest.approx(one_way, rel=REL)
    sorted_ = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=4, sp=False, gbs=64)
    received = 4096 * 2 * sorted_.imbalance[0]
    expected = one_way + 2 * 2 * received * 2.0 * 4096 / _hbm(hw)
    assert lt.permutation_time(sorted_)[0][0] == pytest.approx(expected, rel=REL)
    flex = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=4, sp=False, gbs=64, moe_token_dispatcher_type="flex")
    assert lt.permutation_time(flex)[0][0] == pytest.approx(one_way, rel=REL)


def test_the_router_is_a_bf16_gemm_of_its_own_size_and_tf32_backward_when_routed_in_fp32(mixtral, hw):
    """Mixtral (8 experts, BF16 routing): forward 2 x 4096 tokens x 4096 x 8, backward twice it,
    never at the FP8 peak. DeepSeek-V3 (256 experts, routed in FP32): the backward's two GEMMs at
    the TF32 rate, half the BF16 one."""
    eff = hw.efficiency

    def bf16_gemm(f):
        return f / (989e12 * eff.gemm_max / (1 + eff.gemm_half_gflop / (f / 1e9)))
    x = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, precision="fp8-delayed")
    flops = 2 * 4096 * 4096 * 8
    forward, backward = lt.router_time(x)
    assert forward[0] == pytest.approx(bf16_gemm(flops), rel=REL)
    assert backward[0] == pytest.approx(2 * bf16_gemm(flops), rel=REL)
    dsv3 = io.load_model("deepseek-v3")
    y = _cands(dsv3, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    flops = 2 * 4096 * 7168 * 256
    forward, backward = lt.router_time(y)
    assert forward[0] == pytest.approx(bf16_gemm(flops), rel=REL)
    assert backward[0] == pytest.approx(2 * 2 * bf16_gemm(flops), rel=REL)


def test_a_moe_layers_compute_gives_the_router_and_the_permutations_their_own_backward(mixtral, hw):
    x = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    layer = lt.moe_layer(x)
    kernels = (lt.router_time(x), lt.permutation_time(x), lt.moe_expert_calls(x), lt.post_sync_host_calls(x))
    own = sum(b[0] - 2 * f[0] for f, b in kernels)
    assert layer["compute"][0] == pytest.approx(3 * layer["forward"][0] + own, rel=REL)
    assert own != 0.0


def test_routed_experts_run_k_copies_of_each_token_at_the_dense_gemm_efficiency_of_one_experts_gemm(mixtral, hw):
    """Each expert's FC1 / FC2 is a cuBLAS GEMM of its own (TE's multi-stream loop), priced on the
    dense GEMM curve at one expert's size."""
    x = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    copies = 4096 * 2 * x.imbalance[0]
    group_flops = 2 * (4096 * 2 * 8 / 8) * 176160768 / 2  # one expert's FC1 or FC2 on its tokens
    eff = hw.efficiency.gemm_max / (1 + hw.efficiency.gemm_half_gflop / (group_flops / 1e9))
    expected = 2 * copies * 176160768 / (989e12 * eff)
    assert lt.routed_experts_time(x)[0] == pytest.approx(expected, rel=REL)


def test_local_experts_gemms_share_the_gemm_curve_over_te_s_four_compute_streams(hw):
    """GPT-OSS-120B (128 experts of 3 x 2880 x 2880 weights, top-4) on 8 GPUs, mbs 1: ep 8 leaves 16
    local experts, whose GEMMs TransformerEngine's loop puts on its 4 compute streams: the curve is
    read at 4 experts' GEMM size, 4096 x 4 x 8 / 128 = 1024 rows each (2 x 1024 x 24,883,200 / 2 FLOPs
    per FC1 or FC2, one expert). At ep 64 (2 local experts) at 2 experts' size; Mixtral at ep 8 (1 local
    expert) at one expert's, as before."""
    model = io.load_model("gpt-oss-120b")
    eff = hw.efficiency
    per_expert = 2 * 1024 * 24883200 / 2
    x = _cands(model, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    assert lt.concurrent_experts(model, x.e)[0] == 4.0
    share = eff.gemm_max / (1 + eff.gemm_half_gflop / (4 * per_expert / 1e9))
    copies = 4096 * 4 * x.imbalance[0]
    assert lt.routed_experts_time(x)[0] == pytest.approx(2 * copies * 24883200 / (989e12 * share), rel=REL)
    alone = eff.gemm_max / (1 + eff.gemm_half_gflop / (per_expert / 1e9))
    assert lt.routed_experts_time(x)[0] < 2 * copies * 24883200 / (989e12 * alone)
    assert lt.concurrent_experts(model, np.array([64.0, 128.0]))[0] == 2.0
    assert lt.concurrent_experts(model, np.array([64.0, 128.0]))[1] == 1.0


@pytest.mark.parametrize("model_name", ["175b", "mixtral-8x7b"])
@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_layer_time_is_the_sum_of_its_named_terms(model_name, recompute, hw):
    model = io.load_model(model_name)
    knobs = dict(tp=2, pp=2, vp=1, cp=2, dp=2, ep=2 if model.is_moe else 1, fsdp=True, recompute=recompute,
                 recompute_num_layers=1 if recompute == "full" else 0, precision="fp8-delayed",
                 tp_comm_overlap=True, gbs=16, flash_attention=False)
    x = _cands(model, hw, **knobs)
    layers = lt.layers(x)
    attention, softmax = lt.attention_time(x), lt.softmax_time(x)
    for layer, is_moe in ((layers.dense, False), (layers.moe, True)) if model.is_moe else ((layers.dense, False),):
        forward = layer["forward"]
        named = {k: layer[k][0] for k in ("compute", "fp8_cast", "selective_recompute", "full_recompute", "tp_comm",
                                          "cp_comm", "cp_merge", "fsdp", "ep_comm", "lora_adapters", "amax_reduction")}
        idle = ({"selective_recompute" if recompute == "full" else "full_recompute", "lora_adapters"}
                | (set() if is_moe else {"ep_comm"}))
        assert all((value > 0) != (name in idle) for name, value in named.items()), named
        own = sum(b[0] - 2 * f[0] for f, b in (lt.router_time(x), lt.permutation_time(x), lt.moe_expert_calls(x),
                                               lt.post_sync_host_calls(x))) if is_moe else 0.0
        assert named["compute"] == pytest.approx(3 * forward[0] + own, rel=REL)
        assert named["fp8_cast"] == pytest.approx(lt.fp8_cast_time(x, is_moe)[0], rel=REL)
        if recompute == "full":  # one layer of each chunk (pp 2, vp 1: a stage's layers)
            assert named["full_recompute"] == pytest.approx(forward[0] / x.first_layers[0], rel=REL)
        elif not is_moe:  # core_attn: the attention core and the unfused softmax again
            assert named["selective_recompute"] == pytest.approx(attention[0] + softmax[0], rel=REL)
        assert named["cp_comm"] == pytest.approx(lt.cp_comm_time(x, attention)[0], rel=REL)
        assert named["cp_merge"] == pytest.approx(lt.cp_merge_time(x)[0], rel=REL)
        assert layer["time"][0] == pytest.approx(sum(named.values()), rel=REL)
        assert layer["recompute"][0] == pytest.approx(named["selective_recompute"] + named["full_recompute"], rel=REL)


def test_delayed_scaling_all_reduces_each_chunks_amaxes_twice_over_tp_dp_cp(gpt, hw):
    # tp 4 x cp 2 x dp 4 = 32 ranks, 8 per NVLink domain: 4 nodes, a tree of 2 levels; a chunk is
    # 96 / (8 x 2) = 6 layers, its forward and its backward each reduce once.
    x = _cands(gpt, hw, precision="fp8-delayed")
    tree = 2 * (hw.nvlink_latency_us + 2 * hw.internode_latency_us) * 1e-6
    assert lt.amax_reduction_time(x)[0] == pytest.approx(2 * tree / 6, rel=REL)
    # --tp-only-amax-red: tp 4 x cp 2 = 8 ranks in one domain, NVLink only.
    tp_only = _cands(gpt, hw, precision="fp8-delayed", tp_only_amax_red=True)
    assert lt.amax_reduction_time(tp_only)[0] == pytest.approx(2 * 2 * hw.nvlink_latency_us * 1e-6 / 6, rel=REL)
    # 448 nodes' worth of ranks: ceil(log2(56 domains)) = 6 levels.
    wide = _cands(gpt, hw, precision="fp8-delayed", cp=1, dp=112, gbs=2688)
    tree = 2 * (hw.nvlink_latency_us + 6 * hw.internode_latency_us) * 1e-6
    assert lt.amax_reduction_time(wide)[0] == pytest.approx(2 * tree / 6, rel=REL)
    # Other recipes keep no amax history to reduce.
    for precision in ("bf16", "fp8-current"):
        assert lt.amax_reduction_time(_cands(gpt, hw, precision=precision))[0] == 0.0
    # The step counts it on every micro-batch of the bottleneck stage, in fp8_cast_s.
    plans = [Plan(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64, precision="fp8-delayed", tp_only_amax_red=t)
             for t in (False, True)]
    out = estimate_columns(gpt, hw, plan_columns(plans))
    added = 16 * 12 * (lt.amax_reduction_time(x)[0] - lt.amax_reduction_time(tp_only)[0])  # m x stage layers
    assert out["fp8_cast_s"][0] - out["fp8_cast_s"][1] == pytest.approx(added, rel=1e-9)


def test_a_layer_keeps_its_activations_or_only_its_input_when_recomputed(gpt, hw):
    sbh = 1024 * 12288  # one micro-batch's tokens on this CP rank x hidden
    kept = 34 * sbh / 4  # Korthikanti et al.: 34 sbh / t with SP and no stored scores
    x = _cands(gpt, hw)
    assert lt.activation_bytes(x, False, False)[0] == pytest.approx(kept, rel=REL)
    assert lt.stored_activation_bytes(x, False)[0] == pytest.approx(kept, rel=REL)
    half = _cands(gpt, hw, recompute="full", recompute_num_layers=3)  # 3 of 6 layers per chunk
    assert lt.stored_activation_bytes(half, False)[0] == pytest.approx(0.5 * 2 * sbh / 4 + 0.5 * kept, rel=REL)


# --- stage terms -------------------------------------------------------------------------------

def test_logits_are_the_output_gemms_and_the_loss_passes(gpt, hw):
    x = _cands(gpt, hw)
    logit_flops = 2 * 1024 * 12288 * 50304 / 4
    eff = hw.efficiency.gemm_max / (1 + hw.efficiency.gemm_half_gflop / (logit_flops / 1e9))
    loss = 4 * 4.0 * 1024 * 50304 / 4 / _hbm(hw)  # four passes over the FP32 logits
    assert st.logits_time(x)[0] == pytest.approx(3 * logit_flops / (989e12 * eff) + loss, rel=REL)


def test_pipeline_p2p_sends_each_chunks_activations_and_gradients(gpt, hw):
    x = _cands(gpt, hw)  # 256 GPUs: neighbouring stages on different nodes
    p2p = 2 * 1024 * 12288 / 4 / _network(hw) + hw.internode_latency_us * 1e-6
    assert st.pp_comm_time(x)[0] == pytest.approx(2 * 2 * (1 - hw.efficiency.pp_overlap) * p2p, rel=REL)
    assert st.pp_comm_time(_cands(gpt, hw, pp=1, vp=1, dp=32))[0] == 0.0


def _fake_layers(x, **dense):
    base = dict(time=1.0, forward=0.5e-3, compute=1.5e-3, stored=1e9, working=2e9, params=1e8, expert_params=0.0,
                fp8_cast=0.0, recompute=0.0, tp_comm=0.0, cp_comm=0.0, cp_merge=0.0, ep_comm=0.0, fsdp=0.0, lora_adapters=0.0,
                amax_reduction=0.0, adapter_params=1e6, stored_imbalance=0.0)
    values = {k: np.full_like(x.t, v) for k, v in {**base, **dense}.items()}
    return lt.Layers(values, {k: np.zeros_like(x.t) for k in values})


def test_offloading_exposes_what_the_passes_cannot_hide(gpt, hw):
    x = _cands(gpt, hw, pp=1, vp=1, dp=32, cpu_offloading_num_layers=10)
    layers = _fake_layers(x)
    transfer = 10 * 1e9 / (hw.host_link_gbps * 1e9)
    expected = max(transfer - 96 * 0.5e-3, 0) + max(transfer - 96 * 1.0e-3, 0)
    assert st.offload_time(x, layers)[0] == pytest.approx(expected, rel=REL)
    assert st.offload_time(_cands(gpt, hw, pp=1, vp=1, dp=32), layers)[0] == 0.0


def test_before_te_1_10_each_offloaded_layer_hides_behind_one_layers_pass_only(gpt, hw):
    """TE 1.6-1.9's AsyncDoubleBufferGroupOffloadHandler copies each offloaded layer's tensors into a
    GPU double buffer, sends them while the next layer computes and synchronizes the device at its
    end; the backward prefetches one group ahead. Per offloaded layer: the transfer against one
    layer's forward and one layer's backward, plus the copy (read and write on the GPU). TE 1.10's
    windows (and a run without a version) keep the whole pass's."""
    def offload(version, **layer):
        x = candidates(gpt, hw, {**plan_columns([Plan(tp=4, pp=1, vp=1, cp=2, dp=32, mbs=1, gbs=64, sp=True,
                                                      precision="bf16", cpu_offloading_num_layers=10)]),
                                 TE_VERSION_COLUMN: version})
        return st.offload_time(x, _fake_layers(x, **layer))[0]
    # TE < 1.11's stack leaves a layer's GELU input (2 B x 49,152 / 4 a token) and its CP attention's
    # Q, K, V and output (2 B x 4 x 96 x 128 / 4) on the GPU: 1,024 tokens a GPU (``offload_left_bytes``).
    moved = 1e9 - 1024 * (2 * 49152 / 4 + 2 * 4 * 96 * 128 / 4)
    layer_transfer = moved / (hw.host_link_gbps * 1e9)  # 17 ms against a 0.5 ms forward, 1.0 ms backward
    expected = 10 * ((layer_transfer - 0.5e-3) + (layer_transfer - 1.0e-3) + 2 * moved / _hbm(hw))
    assert offload("1.6") == pytest.approx(expected, rel=REL)
    assert offload("1.9") == pytest.approx(expected, rel=REL)
    layer_transfer = 1e9 / (hw.host_link_gbps * 1e9)  # from 1.11 (and 1.10's windows: below) all of it
    windowed = 2 * 10 * layer_transfer - 96 * 0.5e-3 - 96 * 1.0e-3
    assert offload("1.11") == offload("") == pytest.approx(windowed, rel=REL)
    assert offload("1.10") == pytest.approx(2 * 10 * moved / (hw.host_link_gbps * 1e9) - 96 * 1.5e-3, rel=REL)
    # A layer whose passes outlast its transfer exposes only the copy.
    slow = dict(forward=0.1, compute=0.3)
    assert offload("1.6", **slow) == pytest.approx(10 * 2 * moved / _hbm(hw), rel=REL)
    assert offload("2.9", **slow) == 0.0


def _mlperf_lora_layer(hw, release: str, **knobs):
    """One MLPerf LoRA H100 candidate (Llama 2 70B, rank 16 on QKV and the projection, dropout 0.1,
    8,192 tokens, FP8 delayed with FP8 attention), TP2 CP1 with 40 of 80 layers offloaded, on TE ``release``."""
    from autoparallel.specs.finetune import Finetune

    model = io.load_model("llama2-70b")
    model = dataclasses.replace(model, seq_length=8192, finetune=Finetune(
        "lora", 16, ("linear_qkv", "linear_proj"), True, lora_dropout=0.1))
    plan = {**dict(tp=2, pp=1, vp=1, cp=1, dp=4, mbs=1, gbs=8, sp=True, precision="fp8-delayed", fp8_attention=True,
                   recompute="none", cpu_offloading_num_layers=40), **knobs}
    return candidates(model, hw, {**plan_columns([Plan(**plan)]), TE_VERSION_COLUMN: release})


def test_te_1_10s_stack_leaves_the_tensors_it_does_not_mark_on_the_gpu():
    """TE's offload handler moves only tensors marked ``activation_offloading`` (v1.x); on TE 1.10's stack
    an offloaded LoRA layer keeps, per micro-batch: Megatron's SwiGLU input (2 B x 2 x 28,672 / 2 a
    token), FP8 attention's Q, K, V and output (1 B x (2 x 64 + 2 x 8) x 128 / 2), the QKV adapter's
    gathered input (2 B x 8,192 over the whole sequence), and the dropout's masks (1 B x 8,192 / 2 beside
    QKV under SP, 1 B x 8,192 / 2 beside the projection) with the projection adapter's dropped copy (2 B
    x 8,192 / 2). Nothing from TE 1.11 or without a release; no attention tensors under BF16 attention at cp 1."""
    hw = io.load_hardware("h100-sxm")
    tokens = 8192
    per_token = 2 * 2 * 28672 / 2 + (2 * 64 + 2 * 8) * 128 / 2 + 2 * 8192 + 8192 / 2 + 8192 / 2 + 2 * 8192 / 2
    assert st.offload_left_bytes(_mlperf_lora_layer(hw, "1.10"))[0] == pytest.approx(tokens * per_token, rel=REL)
    bf16_attention = per_token - (2 * 64 + 2 * 8) * 128 / 2
    assert (st.offload_left_bytes(_mlperf_lora_layer(hw, "1.10", fp8_attention=False))[0]
            == pytest.approx(tokens * bf16_attention, rel=REL))
    for release in ("1.11", ""):
        assert np.all(st.offload_left_bytes(_mlperf_lora_layer(hw, release)) == 0.0)
    # The first stage's activations hold it for each of the 40 layers offloaded.
    (at_110, _, _), _ = pm.activation_bytes(old := _mlperf_lora_layer(hw, "1.10"), lt.layers(old))
    (at_111, _, _), _ = pm.activation_bytes(new := _mlperf_lora_layer(hw, "1.11"), lt.layers(new))
    assert (at_110 - at_111)[0] == pytest.approx(40 * tokens * per_token, rel=1e-9)


def test_lora_dropout_keeps_its_masks_and_the_projection_adapters_dropped_copy():
    """PyTorch's dropout keeps a one-byte mask per element; beside QKV (under SP its shard) and the
    projection (TP-split), and the projection's adapter saves the dropped BF16 copy; nothing without
    dropout or for a full fine-tune."""
    from autoparallel.costmodel import finetune
    from autoparallel.specs.finetune import Finetune

    model = dataclasses.replace(io.load_model("llama2-70b"),
                                finetune=Finetune("lora", 16, ("linear_qkv", "linear_proj"), lora_dropout=0.1))
    b, s, t = 1, 8192, 4
    expected = b * s * (8192 / t + 8192 / t + 2 * 8192 / t)
    assert finetune.dropout_saved_bytes(model, b, s, t, True) == pytest.approx(expected, rel=REL)
    assert finetune.dropout_saved_bytes(model, b, s, t, False) == pytest.approx(expected + b * s * 8192 * (1 - 1 / t),
                                                                                rel=REL)
    for other in (Finetune("lora", 16, ("linear_qkv", "linear_proj")), Finetune("full")):
        assert np.all(finetune.dropout_saved_bytes(dataclasses.replace(model, finetune=other), b, s, t, True) == 0.0)


def test_stage_times_add_what_only_each_stage_does(gpt, hw):
    x = _cands(gpt, hw)
    stages = st.stage_times(x, _fake_layers(x))
    pp, logits = st.pp_comm_time(x)[0], st.logits_time(x)[0]
    assert stages.first[0] == pytest.approx(12 + pp, rel=REL)
    assert stages.middle[0] == pytest.approx(12 + pp, rel=REL)
    assert stages.last[0] == pytest.approx(12 + pp + logits, rel=REL)
    single = _cands(gpt, hw, pp=1, vp=1, dp=32, cpu_offloading_num_layers=10)
    one = st.stage_times(single, _fake_layers(single))
    offload = st.offload_time(single, _fake_layers(single))[0]
    assert one.first[0] == pytest.approx(96 + st.logits_time(single)[0] + offload, rel=REL)


def test_stage_params_hold_the_embedding_first_and_the_output_layer_last(gpt, hw):
    x = _cands(gpt, hw)
    (first, _), (middle, _), (last, _) = st.stage_params(x, _fake_layers(x))
    embedding = 50304 * 12288 / 4
    assert first[0] == pytest.approx(12 * 1e8 + embedding) and middle[0] == 12 * 1e8
    assert last[0] == pytest.approx(12 * 1e8 + embedding)  # GPT-3 ties them: a copy on the last stage


# --- schedule and step terms -------------------------------------------------------------------

def _stages(first, middle, last, logits=0.1, offload=0.0):
    arr = lambda v: np.array([v])  # noqa: E731
    return st.StageTimes(arr(first), arr(middle), arr(last), arr(logits), arr(0.01), arr(offload))


def test_schedule_runs_the_slowest_stage_m_times_plus_fill_and_drain(gpt, hw):
    x = _cands(gpt, hw)  # pp 8, vp 2, m 16
    sched = stp.schedule(x, _stages(1.0, 1.2, 1.1))
    total = 1.0 + 6 * 1.2 + 1.1
    assert sched.time[0] == pytest.approx(16 * 1.2 + (total - 1.2) / 2, rel=REL)
    assert sched.slowest[0] == 1.2 and sched.layers[0] == 12 and sched.logits[0] == 0.0
    last = stp.schedule(x, _stages(1.0, 1.0, 1.3))
    assert last.logits[0] == 0.1 and last.slowest[0] == 1.3


def test_dp_comm_reduces_gradients_and_gathers_parameters_per_chunk(gpt, hw):
    x = _cands(gpt, hw, distributed_optimizer=True, overlap_grad_reduce=False, overlap_param_gather=False)
    params = 4e8
    chunk = _reduce_scatter(hw, params / 2 * 2.0, 8, 2)  # BF16 gradients (and weights) of one of 2 chunks
    assert stp.dp_comm_time(x, params, 0.0, 1.0)[0] == pytest.approx(2 * chunk + 2 * chunk, rel=REL)
    plain = _cands(gpt, hw, distributed_optimizer=False, overlap_grad_reduce=False, overlap_param_gather=False)
    assert stp.dp_comm_time(plain, params, 0.0, 1.0)[0] == pytest.approx(2 * 2 * chunk, rel=REL)  # all-reduce
    assert stp.dp_comm_time(_cands(gpt, hw, fsdp=True), params, 0.0, 1.0)[0] == 0.0


@pytest.mark.parametrize("tp, dp, per_node", [(4, 4, 2), (1, 16, 8)])
def test_a_cap_on_the_dp_communicators_ctas_slows_their_nvlink_only(gpt, hw, tp, dp, per_node):
    """A config's ``max_ctas`` for the DP communicators (MLPerf's Llama 3.1 rows: 8) leaves the ring
    8 of the 32 channels that run NVLink at full speed (``dataparallel.cta_capped``): NVLink runs at a
    quarter of its rate, the NICs as before, and the ring at the slower of the two. With 2 of the DP x
    CP group's ranks to a node their 2 NICs (80 GB/s) still bind; with 8, the capped NVLink (84 GB/s
    of 337.5) does. At 32 or more CTAs, and without the column (a search), nothing changes."""
    plan = plan_columns([Plan(tp=tp, pp=8, vp=2, cp=2, dp=dp, mbs=1, gbs=64, sp=True, precision="bf16",
                              recompute="none", grad_reduce_in_fp32=False, distributed_optimizer=True,
                              overlap_grad_reduce=False, overlap_param_gather=False)])
    params = 4e8
    nbytes = params / 2 * 2.0  # one of 2 chunks, BF16
    ranks = dp * 2  # the DP x CP group, per_node of them to a node

    def priced(ctas):
        cols = plan if ctas is None else {**plan, DP_MAX_CTAS_COLUMN: np.array([str(ctas)], dtype=object)}
        return stp.dp_comm_time(candidates(gpt, hw, cols), params, 0.0, 1.0)[0]
    full = _reduce_scatter(hw, nbytes, ranks, per_node)
    capped = _reduce_scatter(hw, nbytes, ranks, per_node, nvlink=_nvlink(hw) / 4)
    assert priced(None) == pytest.approx(4 * full, rel=REL) == pytest.approx(priced(32), rel=REL)
    assert priced(64) == pytest.approx(priced(None), rel=REL)
    assert priced(8) == pytest.approx(4 * capped, rel=REL)
    assert (priced(8) > priced(None)) == (per_node == 8)


def test_overlapped_dp_comm_hides_the_reduce_behind_later_backwards_and_each_gather_behind_one_forward(gpt, hw):
    """vp 2, pp 8: the last chunk's reduce hides behind its own backward, the other's behind pp
    chunk backwards; each chunk's all-gather (one bucket ahead of the forward) behind one chunk
    forward. Stage compute 6 ms: chunk forward 1 ms, chunk backward 2 ms."""
    x = _cands(gpt, hw, distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True)
    params, keep = 4e8, 1 - hw.efficiency.dp_overlap
    # Megatron's default bucket max(40M, 1M x 8) parameters: 2e8 a chunk in 5 collectives.
    chunk = _reduce_scatter(hw, params / 2 * 2.0, 8, 2, calls=5)
    assert chunk > _reduce_scatter(hw, params / 2 * 2.0, 8, 2)

    def hidden(comm, window):
        return max(keep * comm, comm - window)
    expected = hidden(chunk, 0.002) + hidden(chunk, 8 * 0.002) + 2 * hidden(chunk, 0.001)
    assert stp.dp_comm_time(x, params, 0.0, 0.006)[0] == pytest.approx(expected, rel=REL)
    assert chunk - 0.001 > keep * chunk and chunk - 8 * 0.002 < keep * chunk  # each window matters


def test_optimizer_reads_and_writes_its_share_of_the_states(gpt, hw):
    params = 4e8
    sharded = _cands(gpt, hw, distributed_optimizer=True)
    floor = hw.efficiency.step_overhead_s
    assert stp.optimizer_time(sharded, params, 0.0)[0] == pytest.approx(params / 8 * 32 / _hbm(hw) + floor, rel=REL)
    whole = _cands(gpt, hw, distributed_optimizer=False)
    assert stp.optimizer_time(whole, params, 0.0)[0] == pytest.approx(params * 32 / _hbm(hw) + floor, rel=REL)


def test_every_step_pays_the_fixed_step_overhead_once(gpt, hw):
    """The fixed cost of a step (``step_overhead_s``) is one term, whatever the micro-batches."""
    floor = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, step_overhead_s=0.2))
    none = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, step_overhead_s=0.0))
    for gbs in (16, 64):
        plan = plan_columns([Plan(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=gbs, sp=True, precision="bf16")])
        with_floor, without = estimate_columns(gpt, floor, plan), estimate_columns(gpt, none, plan)
        assert with_floor["step_time_s"][0] - without["step_time_s"][0] == pytest.approx(0.2, rel=1e-9)
        assert with_floor["optimizer_s"][0] - without["optimizer_s"][0] == pytest.approx(0.2, rel=1e-9)


def test_cuda_graphs_remove_the_launch_overhead_of_a_layer_but_not_a_moe_layers_sync(gpt, mixtral, hw):
    eff = hw.efficiency
    for graph in ("layer", "full_iteration"):
        dense = lt.forward_time(_cands(gpt, hw, cuda_graph=graph), 0.5, 0.25, 0.125, False)[0]
        assert lt.forward_time(_cands(gpt, hw), 0.5, 0.25, 0.125, False)[0] - dense == pytest.approx(
            eff.layer_overhead_s, rel=1e-9)
        moe_graphed = lt.forward_time(_cands(mixtral, hw, cuda_graph=graph, ep=8, dp=8, cp=1, vp=1, pp=4,
                                             tp=1, gbs=64), 0.0, 0.0, 0.0, True)[0]
        moe_plain = lt.forward_time(_cands(mixtral, hw, ep=8, dp=8, cp=1, vp=1, pp=4, tp=1, gbs=64),
                                    0.0, 0.0, 0.0, True)[0]
        assert moe_plain - moe_graphed == pytest.approx(eff.layer_overhead_s, rel=1e-9)


def test_fp8_param_gather_moves_one_byte_per_parameter(gpt, hw):
    x = _cands(gpt, hw, precision="fp8-delayed", fp8_param_gather=True, overlap_grad_reduce=False,
               overlap_param_gather=False)
    params = 4e8
    grads = _reduce_scatter(hw, params / 2 * 2.0, 8, 2)  # BF16 gradients of one of 2 chunks
    weights = _reduce_scatter(hw, params / 2 * 1.0, 8, 2)  # FP8 weights
    assert stp.dp_comm_time(x, params, 0.0, 1.0)[0] == pytest.approx(2 * grads + 2 * weights, rel=REL)


def test_bf16_moments_halve_the_moments_traffic_of_the_optimizer(gpt, hw):
    params = 4e8
    x = _cands(gpt, hw, distributed_optimizer=True, precision_aware_optimizer=True)
    assert stp.optimizer_time(x, params, 0.0)[0] == pytest.approx(
        params / 8 * (32 - 8) / _hbm(hw) + hw.efficiency.step_overhead_s, rel=REL)


def test_weight_cast_is_once_per_step_on_the_bottleneck_stage(gpt, hw):
    x = _cands(gpt, hw, precision="fp8-delayed")
    sched = stp.schedule(x, _stages(1.0, 1.2, 1.1))
    assert stp.weight_cast_time(x, _fake_layers(x), sched)[0] == pytest.approx(12 * 1e8 * 4.0 / _hbm(hw), rel=REL)


def test_step_is_the_schedule_plus_the_once_per_step_terms(gpt, hw):
    x = _cands(gpt, hw, precision="fp8-delayed")
    layers = _fake_layers(x, compute=0.6, fp8_cast=0.1, recompute=0.1, tp_comm=0.1, cp_comm=0.05, fsdp=0.05)
    stages = _stages(1.0, 1.2, 1.1)
    params = st.stage_params(x, layers)
    out = stp.step_breakdown(x, layers, stages, stp.heaviest_stage_params(x, params))
    sched = stp.schedule(x, stages)
    dense, experts = stp.heaviest_stage_params(x, params)
    expected = (sched.time + stp.dp_comm_time(x, dense, experts, 12.0) + stp.optimizer_time(x, dense, experts)
                + stp.weight_cast_time(x, layers, sched))
    assert out["step_time_s"][0] == pytest.approx(expected[0], rel=REL)
    assert out["cp_comm_s"][0] == pytest.approx(16 * 12 * 0.05) and out["pp_comm_s"][0] == pytest.approx(16 * 0.01)
    assert out["bubble_s"][0] == pytest.approx(sched.time[0] - 16 * 1.2)


# --- memory terms ------------------------------------------------------------------------------

def test_model_states_follow_the_distributed_optimizer(gpt, hw):
    x = _cands(gpt, hw, precision="fp8-delayed", distributed_optimizer=True)
    layers = _fake_layers(x)
    weights, grads, optimizer, fp8 = pm.model_states(x, layers, (1e9, 0.0), 12, 0)
    assert (weights[0], grads[0]) == (2e9, 2e9)  # BF16 weights, BF16-reduced gradients
    assert optimizer[0] == pytest.approx(12 * 1e9 / 8)  # Adam sharded over dp*cp
    assert fp8[0] == pytest.approx(2 * 12 * 1e8)  # FP8 weight and its transpose, per layer


def test_fp8_param_gather_and_bf16_moments_shrink_the_model_states(gpt, hw):
    """--fp8-param-gather: an FP8 layer's BF16 weight is not kept (its FP8 copies stay); the
    precision-aware optimizer: FP32 master 4 B + two BF16 moments 2 B each."""
    x = _cands(gpt, hw, precision="fp8-delayed", distributed_optimizer=True, fp8_param_gather=True,
               precision_aware_optimizer=True)
    weights, grads, optimizer, fp8 = pm.model_states(x, _fake_layers(x), (1e9, 0.0), 12, 0)
    assert weights[0] == pytest.approx(2e9 - 2 * 12 * 1e8)  # only the non-layer parameters in BF16
    assert grads[0] == 2e9 and fp8[0] == pytest.approx(2 * 12 * 1e8)
    assert optimizer[0] == pytest.approx((4 + 2 + 2) * 1e9 / 8)


def test_precision_aware_optimizer_keeps_master_weight_remainders(gpt, hw):
    """Without FP8 parameters Megatron-Core's precision-aware optimizer keeps only the low 16 bits
    of each FP32 master weight (store_param_remainders): 2 B + two BF16 moments 2 B each = 6 B."""
    x = _cands(gpt, hw, precision="fp8-delayed", distributed_optimizer=True, precision_aware_optimizer=True)
    optimizer = pm.model_states(x, _fake_layers(x), (1e9, 0.0), 12, 0)[2]
    assert optimizer[0] == pytest.approx((2 + 2 + 2) * 1e9 / 8)
    plain = _cands(gpt, hw, precision="fp8-delayed", distributed_optimizer=True)
    assert pm.model_states(plain, _fake_layers(plain), (1e9, 0.0), 12, 0)[2][0] == pytest.approx(12 * 1e9 / 8)


def test_cuda_graphs_keep_static_buffers(gpt, hw):
    """Per-layer graphs: one BF16 layer input (SP-sharded) per layer and micro-batch in flight;
    a full-iteration graph: ids, labels and loss mask (20 B/token) of the step's 16 micro-batches."""
    held, layer_input = 4.5, 2 * 1024 * 12288 / 4
    layer = _cands(gpt, hw, cuda_graph="layer")
    assert pm.cuda_graph_bytes(layer, held, 12)[0] == pytest.approx(held * 12 * layer_input, rel=REL)
    full = _cands(gpt, hw, cuda_graph="full_iteration")
    assert pm.cuda_graph_bytes(full, held, 12)[0] == pytest.approx(16 * 1024 * 20, rel=REL)
    assert pm.cuda_graph_bytes(_cands(gpt, hw), held, 12)[0] == 0.0
    (first, _, _), _ = pm.activation_bytes(layer, _fake_layers(layer))
    (eager, _, _), _ = pm.activation_bytes(_cands(gpt, hw), _fake_layers(layer))
    held_first = ((2 - 1) * 8 + 2 * 7 + 1) / 2
    assert first[0] - eager[0] == pytest.approx(held_first * 12 * layer_input, rel=REL)


def test_logits_and_head_inputs_on_the_last_stage(gpt, hw):
    x = _cands(gpt, hw)
    softmax_and_logits = (4 + 2) * 1024 * 50304 / 4
    head_inputs = 2 * (2 * 1024 * 12288 / 4)  # final norm and output layer inputs, SP-sharded
    assert pm.logits_bytes(x)[0] == pytest.approx(softmax_and_logits + head_inputs, rel=REL)


def test_activations_in_flight_on_the_first_stage(gpt, hw):
    x = _cands(gpt, hw)  # pp 8, vp 2, m 16
    (first, middle, last), logits = pm.activation_bytes(x, _fake_layers(x))
    held = ((2 - 1) * 8 + 2 * 7 + 1) / 2  # interleaved warm-up plus the one in flight, in chunks
    embedding = 8 * 1024 + 1024 * 12288  # token ids and the dropout mask per micro-batch
    # The 23 chunk-micro-batches are 11.5 micro-batches of the rank's 12 layers, whichever chunks
    # they are (both hold 6); the embedding's inputs are held per micro-batch of chunk 0, of which
    # the fullest such state holds all 16 (chunk 1 then holds 7).
    assert first[0] == pytest.approx(held * 12 * 1e9 + 2e9 + 16 * embedding, rel=REL)
    # The head's logits (90 MB here) are freed before the last layer's backward needs its 2 GB
    # working set: they add only what they exceed it by.
    held_last = ((2 - 1) * 8 + 1) / 2
    assert last[0] == pytest.approx(held_last * 12 * 1e9 + 2e9, rel=REL)
    assert logits[0] == 0.0 and logits[2][0] == 0.0
    (_, _, last), logits = pm.activation_bytes(x, _fake_layers(x, working=1e7))
    assert last[0] == pytest.approx(held_last * 12 * 1e9 + pm.logits_bytes(x)[0], rel=REL)
    assert logits[2][0] == pytest.approx(pm.logits_bytes(x)[0] - 1e7, rel=REL)


def _dualpipe_replay(pp, rank, micro_batches):
    """Forward chunks alive (of phase 0, of phase 1) at the fullest moment of one rank, replaying
    deepseek-ai/DualPipe 3da1bbe dualpipe/dualpipe.py ``DualPipe.step`` (lines 358-425) chunk by
    chunk, an overlapped F&B counted forward first."""
    half, h, half_chunks = pp // 2, min(rank, pp - 1 - rank), micro_batches // 2
    alive, fullest = [0, 0], (0, (0, 0))

    def forward(phase):
        nonlocal fullest
        alive[phase] += 1
        fullest = max(fullest, (sum(alive), tuple(alive)))

    def backward(phase):
        alive[phase] -= 1
    for _ in range((half - h - 1) * 2):  # step 1: nF0
        forward(0)
    for _ in range(h + 1):  # step 2: nF0F1
        forward(0), forward(1)
    for _ in range(half - h - 1):  # step 3: nB1W1F1
        backward(1), forward(1)
    for _ in range(half_chunks - pp + h + 1):  # step 4: nF0B1F1B0
        forward(0), backward(1), forward(1), backward(0)
    for _ in range(half - h - 1):  # step 5: nB1F1B0
        backward(1), forward(1), backward(0)
    for _ in range(h + 1):  # step 6: nB1B0
        backward(1), backward(0)
    for _ in range(half - h - 1):  # step 7: nWB0
        backward(0)
    assert alive == [0, 0]
    return fullest[1]


@pytest.mark.parametrize("pp", [4, 8, 16])
def test_dualpipe_chunks_are_what_its_schedule_holds(pp):
    """PP-h micro-batches of a rank's forward-direction stage and h+1 of its other stage at the peak,
    PP+1 in all (the README's "Activation PP+1"), h = min(r, PP-1-r)."""
    for rank in range(pp):
        h = min(rank, pp - 1 - rank)
        assert tuple(float(c) for c in pipeline.dualpipe_chunks(pp, h)) == _dualpipe_replay(pp, rank, 6 * pp)
        assert sum(_dualpipe_replay(pp, rank, 6 * pp)) == pipeline.dualpipe_inflight(pp)


def test_a_dualpipe_row_holds_its_two_stages_and_pp_plus_one_micro_batches(gpt, hw):
    """DualPipe's rank r holds stage r and stage PP-1-r (2x the parameters): an end rank the first
    stage's states and the last's (embedding and output layer once each), PP micro-batches of the
    first stage (with the embedding's inputs) and one of the last; a middle rank two middle stages'
    states and PP+1 of its micro-batches (pp 8: 9, where interleaved 1F1B holds 12.5 on the first)."""
    cols = plan_columns([Plan(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64)])
    dual = candidates(gpt, hw, {**cols, "pipeline_schedule": np.array(["dualpipe"], dtype=object)})
    layers = _fake_layers(dual)
    (first, middle, last), _ = pm.activation_bytes(dual, layers)
    embedding = 8 * 1024 + 1024 * 12288
    assert first[0] == pytest.approx(8 * (12 * 1e9 + embedding) + 12 * 1e9 + 2e9, rel=REL)
    assert last[0] == first[0]
    assert middle[0] == pytest.approx(9 * 12 * 1e9 + 2e9, rel=REL)
    plain = candidates(gpt, hw, cols)
    params = st.stage_params(plain, layers)
    once = [pm.model_states(plain, layers, p, n, n_moe, kinds) for p, (n, n_moe, kinds) in zip(params, plain.stage_layer_counts)]
    dual_peak = pm.peak_memory(dual, layers, params, 0.95)
    for i, key in enumerate(("weights_gib", "grads_gib", "optimizer_gib")):  # the end rank is the fullest
        assert dual_peak[key][0] == pytest.approx((once[0][i][0] + once[2][i][0]) / GIB, rel=REL)
        assert once[0][i][0] + once[2][i][0] > 2 * once[1][i][0]
    assert dual_peak["peak_memory_gib"][0] == pytest.approx(
        (sum(st_[0] for st_ in once[0]) + sum(st_[0] for st_ in once[2]) + first[0]) / GIB + hw.reserve_gib, rel=REL)


def test_the_busiest_ep_rank_keeps_its_excess_tokens_averaged_over_a_stages_moe_layers(mixtral, hw):
    """Each MoE layer keeps its routed copies at the busiest rank's load (``imbalance`` times the
    even share: BF16 FC1 input, gate, up and FC2 input, FP32 probability per copy); a stage of n
    MoE layers keeps n even shares plus 1/sqrt(n) of n layers' excess."""
    x = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    per_copy = 2.0 * 4096 + (2 * 2.0 + 2.0) * 14336 + 4.0
    excess = 4096 * 2 * (x.imbalance[0] - 1) * per_copy  # tokens x top-2 beyond the even share
    assert lt.layers(x).moe["stored_imbalance"][0] == pytest.approx(excess, rel=1e-9)
    assert lt.layers(x).dense["stored_imbalance"][0] == 0.0
    ones = np.ones(1)
    layers = lt.Layers({"stored": 1e9 * ones, "stored_imbalance": 0 * ones},
                       {"stored": 3e9 * ones, "stored_imbalance": 1e9 * ones})
    assert pm.stored_bytes(layers, 4 * ones, 4 * ones)[0] == pytest.approx(4 * 3e9 - 4 * 1e9 * (1 - 1 / 2), rel=REL)
    assert pm.stored_bytes(layers, 1 * ones, 1 * ones)[0] == pytest.approx(3e9, rel=REL)
    assert pm.stored_bytes(layers, 6 * ones, 2 * ones)[0] == pytest.approx(
        4 * 1e9 + 2 * 3e9 - 2 * 1e9 * (1 - 1 / math.sqrt(2)), rel=REL)


def test_a_plan_fits_when_its_fullest_stage_is_under_the_memory_share(gpt, hw):
    cols = plan_columns([Plan(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64)])
    peak = estimate_columns(gpt, hw, cols, 1.0)["peak_memory_gib"][0]
    share = peak / hw.memory_gib
    assert estimate_columns(gpt, hw, cols, share * 1.001)["fits"][0]
    assert not estimate_columns(gpt, hw, cols, share * 0.999)["fits"][0]


def test_estimate_reports_every_named_term(gpt, hw):
    cols = plan_columns([Plan(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64, precision="fp8-delayed")])
    out = estimate_columns(gpt, hw, cols)
    assert sum(out[k][0] for k in stp.BREAKDOWN_KEYS) == pytest.approx(out["step_time_s"][0], rel=1e-9)
    assert all(out[k][0] > 0 for k in ("compute_s", "fp8_cast_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "bubble_s",
                                       "dp_comm_s", "optimizer_s"))
    slower = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, internode=0.4))
    assert estimate_columns(gpt, slower, cols)["pp_comm_s"][0] > out["pp_comm_s"][0]


def test_mtp_adds_a_layer_and_another_output_pass_to_the_last_stage(gpt, hw):
    model = dataclasses.replace(gpt, mtp_num_layers=1, position_embedding_type="rope")  # Megatron: MTP needs rope
    x = _cands(model, hw)
    layers = _fake_layers(x)
    logits = st.logits_time(x)[0]
    projection = 3 * lt.linear_time(x, 2 * 12288 ** 2)[0]  # [embedding; hidden] -> hidden, fwd + bwd
    stages = st.stage_times(x, layers)
    assert stages.last[0] == pytest.approx(12 + st.pp_comm_time(x)[0] + logits + projection + 1.0 + logits, rel=REL)
    assert stages.first[0] == pytest.approx(12 + st.pp_comm_time(x)[0], rel=REL)
    (_, _), (_, _), (last, _) = st.stage_params(x, layers)
    assert last[0] == pytest.approx(12 * 1e8 + 50304 * 12288 / 4 + 1e8 + 2 * 12288 ** 2 / 4)
    (_, _, with_mtp), _ = pm.activation_bytes(x, layers)
    (_, _, without), _ = pm.activation_bytes(_cands(gpt, hw), _fake_layers(x))
    # The MTP layer runs in the last chunk of the last rank, whose backward follows its forward at
    # once: one micro-batch of it is held (the rank's 4.5 micro-batches are of its other chunk).
    held = 1
    # Its loss keeps the FP32 softmax (4 B per logit, vocab-parallel over tp 4) and its head's two BF16
    # inputs (SP-sharded); its BF16 logits are freed before the main head computes its own.
    kept = 4 * 1024 * 50304 / 4 + 2 * (2 * 1024 * 12288 / 4)
    assert with_mtp[0] - without[0] == pytest.approx(held * 1e9 + kept, rel=REL)
    assert kept < pm.logits_bytes(x)[0]


# --- fine-tuning: LoRA and packed sequences (issue 27) --------------------------------------------

@pytest.fixture(scope="module")
def llama():
    """Llama 2 70B at 8,192 tokens (h 8192, 64 heads of 128, 8 KV groups, FFN 28672, SwiGLU)."""
    return dataclasses.replace(io.load_model("llama2-70b"), seq_length=8192)


def _lora(model, rank=16, targets=("linear_qkv", "linear_proj"), **packing):
    from autoparallel.specs.finetune import Finetune
    return dataclasses.replace(model, finetune=Finetune("lora", rank, targets, **packing))


def _llama_cands(model, hw, **knobs):
    """MLPerf's 8-GPU H100 layout: tp 4, dp 2, mbs 1, gbs 8 (4 micro-batches), SP, FP8."""
    base = dict(tp=4, pp=1, vp=1, cp=1, dp=2, mbs=1, gbs=8, sp=True, precision="fp8-delayed", recompute="none",
                tp_comm_overlap=False, grad_reduce_in_fp32=False)
    return candidates(model, hw, plan_columns([Plan(**{**base, **knobs})]))


def test_lora_adapters_split_as_megatron_bridge_splits_them(llama):
    from autoparallel.costmodel import finetune
    # Both halves split over TP 4 (Megatron-Bridge ParallelLinearAdapter): linear_qkv's A 8192 x 16/4
    # (ColumnParallelLinear over the rank), B 16 x 10240/4; linear_proj's A 8192/4 x 16, B 16 x 8192/4.
    expected = 16 * (8192 + 10240) / 4 + 16 * (8192 + 8192) / 4
    assert finetune.adapter_params_gpu(_lora(llama), 4) == pytest.approx(expected, rel=REL)
    fc = 16 * (8192 + 2 * 28672) / 4 + 16 * (28672 + 8192) / 4  # FC1 (gate and up) and FC2
    assert finetune.adapter_params_gpu(_lora(llama, targets=("linear_fc1", "linear_fc2")), 4) == pytest.approx(fc)
    assert finetune.adapter_params_gpu(llama, 4) == 0.0


def test_lora_adapters_stream_their_activations_and_run_their_own_tp_collectives(llama, hw):
    """Rank-16 GEMMs are memory-bound: the adapters take the HBM time of what they stream (GEMM
    passes 3x each side, the eager scale/add/gradient-sum ops), then their collectives under SP
    with userbuffers: QKV's input all-gathered and reduce-scattered back, the projection's output
    gathered forward and its scattered gradient gathered backward (four all-gathers of 8192 x 8192
    BF16 over TP 4); without userbuffers QKV's adapter takes the norm output TE gathered (two)."""
    from autoparallel.costmodel import finetune
    x = _llama_cands(_lora(llama), hw, tp_comm_overlap=True)
    qkv = 3 * (8192 + 10240 / 4) + 7 * 10240 / 4 + 3 * 8192 / 4
    proj = 3 * (8192 + 8192) / 4 + 7 * 8192 / 4 + 3 * 8192 / 4
    assert finetune.adapter_stream_elements(x.model, 4, True) == pytest.approx(qkv + proj, rel=REL)
    stream = 8192 * (qkv + proj) * 2 / _hbm(hw)
    gathers = 4 * lt.comm.reduce_scatter_time(hw, 2.0 * 8192 * 8192, 4.0, 4.0)
    flops = 3 * 2 * 8192 * finetune.adapter_params_gpu(x.model, 4) / (989e12 * hw.efficiency.gemm_max)
    assert flops < stream
    assert lt.lora_adapters_time(x)[0] == pytest.approx(stream + gathers, rel=REL)
    assert lt.lora_adapters_time(_llama_cands(_lora(llama), hw))[0] == pytest.approx(stream + gathers / 2, rel=REL)
    assert lt.lora_adapters_time(_llama_cands(llama, hw))[0] == 0.0
    # Without SP no sequence gather: QKV's input gradient all-reduced (two), the projection's output gathered.
    no_sp = _llama_cands(_lora(llama), hw, sp=False)
    assert [(w, float(c)) for w, c in finetune.adapter_collectives(no_sp.model, 4, False)] == [(8192, 2.0), (8192, 1.0)]
    # Megatron-Bridge's a2a_experimental: the projection's output goes over the sequence by one
    # all-to-all of its 8192 x 8192/4 shard each way.
    a2a = _llama_cands(_lora(llama, lora_a2a=True), hw, tp_comm_overlap=True)
    assert lt.lora_adapters_time(a2a)[0] == pytest.approx(
        stream + 2 * lt.comm.reduce_scatter_time(hw, 2.0 * 8192 * 8192, 4.0, 4.0)
        + 2 * lt.comm.reduce_scatter_time(hw, 2.0 * 8192 * 8192 / 4, 4.0, 4.0), rel=REL)
    # Dropout on the inputs (MLPerf's 0.1) adds its passes over each input as the base lays it out.
    dropped = _lora(llama, lora_dropout=0.1)
    assert finetune.adapter_stream_elements(dropped, 4, True) - (qkv + proj) == pytest.approx(
        finetune.DROPOUT_PASSES * (8192 / 4 + 8192 / 4), rel=REL)


def test_a_frozen_bases_fp8_casts_write_no_column_wise_copy(llama, hw):
    """TransformerEngine makes the column-wise (transposed) FP8 copies only for the weight
    gradient, module by module: a frozen base skips every Linear's input copy and the output
    gradient's copy of the row-parallel Linears (projection, FC2), but QKV and FC1
    (LayerNormLinear) cast their output gradients in both layouts whatever the weight. Llama 2
    70B at TP 4, 8,192 tokens: inputs h + heads x 128 + h + FFN = 3 x 8192 + 28672 per token,
    the row-parallel outputs 2 x 8192, 1 B each, per TP rank."""
    lora, full = _llama_cands(_lora(llama), hw), _llama_cands(llama, hw)
    inputs, row_outputs, tokens = 3 * 8192 + 28672, 2 * 8192, 8192
    charged = 4.0 * 2 * tokens * inputs / 4 / _hbm(hw)  # read 2 B, write 1 + 1 B, forward and backward
    assert lt.fp8_cast_time(full, False)[0] == pytest.approx(charged, rel=REL)
    assert lt.fp8_cast_time(lora, False)[0] == pytest.approx(
        charged - 1.0 * tokens * (inputs + row_outputs) / 4 / _hbm(hw), rel=REL)
    assert lt.row_parallel_output_elements(lora, False) == row_outputs
    from autoparallel.costmodel import finetune
    assert finetune.frozen_column_copy_elements(lora.model, 10.0, 3.0) == 13.0
    assert finetune.frozen_column_copy_elements(full.model, 10.0, 3.0) == 0.0


def test_the_row_parallel_outputs_are_the_projections_and_fc2s(mixtral, hw):
    """The output gradients whose column-wise copy a frozen ``Linear`` skips: the projection's (h)
    and FC2's, once per routed copy (top-k) and shared expert in a MoE layer."""
    x = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    assert lt.row_parallel_output_elements(x, True) == 4096 + 2 * 4096
    assert lt.row_parallel_output_elements(x, False) == 2 * 4096
    y = _cands(io.load_model("deepseek-v3"), hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    assert lt.row_parallel_output_elements(y, True) == 7168 + 8 * 7168 + 7168


def test_a_frozen_fp8_base_is_transposed_for_its_dgrad_once_per_micro_batch_on_hopper(llama, hw):
    """MLPerf's frozen base is kept in FP8 only, without TE's transpose cache: TE 1.x's backward
    transposes each FP8 weight for its dgrad GEMM once per micro-batch (1 B read, 1 B written per
    weight on the GPU); a weight that learns, BF16, Blackwell's any-layout FP8 GEMMs, and TE 2.x,
    which keeps the transpose it makes (``fp8_transpose_per_microbatch`` False), pay none."""
    mlperf = _lora(llama, fp8_transpose_per_microbatch=True)
    lora = _llama_cands(mlperf, hw)
    transpose = 2.0 * llama.dense_layer_params / 4 / _hbm(hw)
    layer = lt.layers(lora).dense
    assert layer["fp8_cast"][0] == pytest.approx(lt.fp8_cast_time(lora, False)[0] + transpose, rel=REL)
    assert lt.frozen_transpose_time(lora, llama.dense_layer_params / 4)[0] == pytest.approx(transpose, rel=REL)
    for other in (_llama_cands(llama, hw), _llama_cands(mlperf, hw, precision="bf16"),
                  _llama_cands(mlperf, io.load_hardware("b200")), _llama_cands(_lora(llama), hw)):
        assert lt.frozen_transpose_time(other, llama.dense_layer_params / 4)[0] == 0.0
    # Per weight on the GPU and per micro-batch: TP 1 CP 4 PP 2 (35B weights, 8 micro-batches)
    # transposes four times what TP 4 (17.5B weights, 4 micro-batches) does in a step.
    def step_transposes(**knobs):
        x = _llama_cands(mlperf, hw, **knobs)
        per_layer = lt.frozen_transpose_time(x, llama.dense_layer_params / x.t)[0]
        return per_layer * llama.num_layers / x.p[0] * x.m[0]
    assert step_transposes(tp=1, cp=4, pp=2, dp=1, sp=False) == pytest.approx(4 * step_transposes(), rel=REL)


def test_a_frozen_base_skips_its_weight_gradients(llama, hw):
    lora, full = _llama_cands(_lora(llama), hw), _llama_cands(llama, hw)
    assert lt.compute_time(lora, 2.0, 0.5) == 5.5 and lt.compute_time(full, 2.0, 0.5) == 6.0
    layer = lt.layers(lora).dense
    assert layer["compute"][0] == pytest.approx(3 * layer["forward"][0] - lt.linear_time(lora, llama.dense_layer_params)[0],
                                                rel=REL)
    named = {k: layer[k][0] for k in ("compute", "fp8_cast", "tp_comm", "lora_adapters", "amax_reduction")}  # the others are 0 here
    assert named["lora_adapters"] > 0 and named["lora_adapters"] == pytest.approx(lt.lora_adapters_time(lora)[0], rel=REL)
    assert layer["time"][0] == pytest.approx(sum(named.values()), rel=REL)
    # The output layer: forward and dgrad only.
    logit_flops = 2 * 8192 * 8192 * 32000 / 4
    eff = hw.efficiency.gemm_max / (1 + hw.efficiency.gemm_half_gflop / (logit_flops / 1e9))
    loss = 4 * 4.0 * 8192 * 32000 / 4 / _hbm(hw)
    assert st.logits_time(lora)[0] == pytest.approx(2 * logit_flops / (989e12 * eff) + loss, rel=REL)


def test_tp_overlap_of_a_frozen_base_has_no_wgrad_to_hide_behind(llama, hw):
    x = _llama_cands(_lora(llama), hw, tp_comm_overlap=True)
    one = lt.comm.reduce_scatter_time(hw, 2.0 * 8192 * 8192, 4.0, 4.0)
    half, half_chunked = 0.001 / 4, 0.002 / 4
    # No wgrad: no input AG for it; the dgrad RS joins the ring exchanges (four per block).
    expected = 2 * (4 * max(one - half_chunked, 0.0) + 4 * (half_chunked - half))
    assert tensor_parallel.tp_comm_time(x, 2.0, 0.001, 0.002)[0] == pytest.approx(expected, rel=REL)
    plain = _llama_cands(_lora(llama), hw)
    assert tensor_parallel.tp_comm_time(plain, 2.0, 0.001, 0.002)[0] == pytest.approx(2 * 4 * one, rel=REL)


def test_packed_documents_attend_to_themselves_only(llama, hw):
    x = _llama_cands(_lora(llama, packed_sequence=True), hw)
    one = lt.attention_time(x)[0]
    quarter = lt.attention_time(_llama_cands(_lora(llama, packed_sequence=True, document_tokens=2048), hw))[0]
    attn_flops = 0.5 * 2 * 8192 * 8192 * 64 * 256 / 4
    exponentials = 8192 * 8192 * 64 / 2 / 4
    assert one == pytest.approx(max(attn_flops / 989e12, exponentials / 4.2e12) / hw.attention_peak_share(x.s_local[0]),
                                rel=REL)
    assert quarter == pytest.approx(one / 4, rel=REL)  # 4 documents of 2,048: (s/d)·d²/2 = s·d/2 scores


def test_a_lora_layer_keeps_the_adapters_inputs_not_the_frozen_linears(llama, hw):
    from autoparallel.costmodel import finetune
    x = _llama_cands(_lora(llama), hw)
    # FP8: the base keeps 1 B per Linear input element, split by SP over tp 4; frozen, QKV's and FC1's
    # (h, 0) and FC2's (ffn, 0) go; QKV's adapter keeps its 2 B BF16 input whole (the gathered norm
    # output), the projection's (target) takes 2 B of its TP-split input.
    per_token = 2 * 8192 + ((0 - 1) * 8192 + (0 - 1) * 8192) / 4 + ((0 - 1) * 28672 + (2 - 1) * 8192) / 4
    assert finetune.frozen_activation_bytes(x.model, 1, 8192, 4, True, 1.0) == pytest.approx(8192 * per_token)
    full = lt.activation_bytes(_llama_cands(llama, hw), False, x.keep_scores)[0]
    # Full training under delayed scaling counts the attention output as the fused attention's BF16
    # copy and the projection's FP8 one (3 B); the LoRA layer keeps the BF16 one only (2 B).
    output = (3 - 1) * 8192 / 4
    assert lt.activation_bytes(x, False, x.keep_scores)[0] == pytest.approx(full + 8192 * (per_token - output),
                                                                             rel=REL)


def test_lora_model_states_hold_the_frozen_base_and_train_the_adapters(llama, hw):
    x = _llama_cands(_lora(llama, fp8_transpose_per_microbatch=True), hw)
    layers = _fake_layers(x)  # 1e8 base and 1e6 adapter parameters a layer
    weights, grads, optimizer, fp8 = pm.lora_model_states(x, layers, (80 * 1e8 + 5e8, 0.0), 80, 0)
    # MLPerf's TE 1.x runs: one FP8 layout of the base (transposed per micro-batch), BF16 embeddings and adapters.
    assert weights[0] == pytest.approx(1.0 * 80e8 + 2 * 5e8 + 2 * 80e6)
    assert grads[0] == 2 * 80e6 and optimizer[0] == pytest.approx(12 * 80e6 / 2) and fp8[0] == 0
    # TE 2.x keeps the FP8 parameter's transpose (Hopper: both layouts, 2 B); Blackwell's per-tensor FP8 one layout.
    kept = _llama_cands(_lora(llama), hw)
    assert pm.lora_model_states(kept, _fake_layers(kept), (80 * 1e8 + 5e8, 0.0), 80, 0)[0][0] == pytest.approx(
        2.0 * 80e8 + 2 * 5e8 + 2 * 80e6)
    blackwell = _llama_cands(_lora(llama), io.load_hardware("b200"))
    assert pm.lora_model_states(blackwell, _fake_layers(blackwell), (80 * 1e8 + 5e8, 0.0), 80, 0)[0][0] == pytest.approx(
        1.0 * 80e8 + 2 * 5e8 + 2 * 80e6)
    bf16 = _llama_cands(_lora(llama), hw, precision="bf16")
    assert pm.lora_model_states(bf16, _fake_layers(bf16), (80 * 1e8 + 5e8, 0.0), 80, 0)[0][0] == pytest.approx(
        2.0 * 80e8 + 2 * 5e8 + 2 * 80e6)


def test_only_the_adapters_are_reduced_stepped_and_never_cast(llama, hw):
    x = _llama_cands(_lora(llama), hw)
    layers = _fake_layers(x)
    trainable = st.trainable_params(x, layers, st.stage_params(x, layers))
    assert trainable[0][0][0] == 80 * 1e6 and trainable[0][1][0] == 0
    full = _llama_cands(llama, hw)
    assert st.trainable_params(full, layers, st.stage_params(full, layers)) == st.stage_params(full, layers)
    sched = stp.schedule(x, _stages(1.0, 1.0, 1.0))
    assert stp.weight_cast_time(x, layers, sched)[0] == 0.0
    assert stp.optimizer_time(x, 80e6, 0.0)[0] == pytest.approx(80e6 / 2 * 32.0 / _hbm(hw)
                                                                + hw.efficiency.step_overhead_s, rel=REL)


def test_a_lora_estimate_adds_up_and_counts_no_wgrad_flops(llama, hw):
    from autoparallel.costmodel import flops
    model = _lora(llama, packed_sequence=True)
    cols = plan_columns([Plan(tp=4, pp=1, dp=2, mbs=1, gbs=8, sp=True, precision="fp8-delayed", tp_comm_overlap=True)])
    out = estimate_columns(model, hw, cols)
    assert sum(out[k][0] for k in stp.BREAKDOWN_KEYS) == pytest.approx(out["step_time_s"][0], rel=1e-9)
    assert out["optimizer_gib"][0] < 0.5 and out["fp8_weights_gib"][0] == 0 and out["fits"][0]
    adapters = 80 * (16 * (8192 + 10240) + 16 * (8192 + 8192))
    expected = 4 * llama.num_layers * llama.dense_layer_params + 3 * 80 * 8192 * 64 * 256 + 4 * 8192 * 32000 + 6 * adapters
    assert flops.model_flops_per_token(model) == pytest.approx(expected, rel=REL)


def test_fp8_attention_runs_both_gemms_at_the_fp8_peak(llama, hw):
    x = _llama_cands(llama, hw, fp8_attention=True)
    attn_flops = 0.5 * 2 * 8192 * 8192 * 64 * 256 / 4
    exponentials = 8192 * 8192 * 64 / 2 / 4  # the softmax stays on the SFUs
    expected = max(attn_flops / (hw.fp8_tflops * 1e12), exponentials / 4.2e12) / hw.attention_peak_share(x.s_local[0])
    assert hw.fp8_tflops == 1979 and lt.attention_time(x)[0] == pytest.approx(expected, rel=REL)


def test_mxfp8_attention_takes_the_bf16_kernels_time_at_head_dim_128_per_score_and_is_searchable(llama):
    """Megatron-Bridge's newer MoE recipes set fp8_dot_product_attention under the MXFP8 recipe
    (v0.6.0 perf_recipes/qwen/common.py); TransformerEngine runs it as cuDNN's MXFP8 fused attention
    on sm100+ (TE 2.16, cuDNN >= 9.21). cuDNN's own benchmark (NVIDIA/cudnn-frontend 3929da2
    benchmark/sdpa_benchmark_training/results, GB300 / GB200) measures it at a fixed time per score
    element whatever the head dimension, the BF16 kernel's at head dimension 128 (1.345 / 1.348 ns
    per causal score forward + backward at d 128 / 192 on GB300, BF16 1.326 at d 128, 1.859 at 192).
    GB300 (BF16 2,500 TFLOPS, 10.7 Tera-exponentials/s), Llama 2 70B (d 128) at tp 4, mbs 1, 8,192
    tokens, causal: MXFP8 attention takes what BF16 attention takes (QK^T and P.V at the BF16 peak,
    the exponentials on the SFUs, the slower at the fitted efficiency), not half; per-tensor FP8
    (fp8-current: cuDNN's FP8 kernel) keeps its GEMMs at the FP8 peak; DeepSeek-V3 (QK 192, V 128)
    under MXFP8 takes 256 / 320 of its BF16 time."""
    from autoparallel.space import generate, load_space
    gb300 = io.load_hardware("gb300")
    attn_flops = 0.5 * 2 * 8192 * 8192 * 64 * 256 / 4  # causal half; QK^T and P.V, 2 FLOPs each
    exponentials = 8192 * 8192 * 64 / 2 / 4  # one per score element
    plain, mxfp8_attn = (_llama_cands(llama, gb300, precision="mxfp8", fp8_attention=f) for f in (False, True))
    speed = 2500e12 * gemm.tensor_speed(gb300)  # its SMs x max clock over B200's (or a fitted factor)
    bf16 = max(attn_flops / speed, exponentials / 10.7e12) / gb300.attention_peak_share(8192)
    assert gb300.bf16_tflops == 2500 and gb300.fp8_tflops == 5000 and gb300.exp_tera_per_s == 10.7
    assert attn_flops / speed > exponentials / 10.7e12  # the GEMMs bound BF16 attention on GB300
    assert lt.attention_time(plain)[0] == pytest.approx(bf16, rel=REL)
    assert lt.attention_time(mxfp8_attn)[0] == pytest.approx(bf16, rel=REL)
    assert lt.MXFP8_ATTENTION_HEAD_DIM == 128
    # Per-tensor FP8 attention (not MXFP8) keeps both GEMMs at the FP8 peak.
    current = _llama_cands(llama, gb300, precision="fp8-current", fp8_attention=True)
    assert lt.attention_time(current)[0] == pytest.approx(bf16 / 2.0, rel=REL)
    # DeepSeek-V3's 192-wide QK and 128-wide V: 2 x (192 + 128) FLOPs per score in BF16, the MXFP8
    # kernel's time is that of 2 x (128 + 128), still above its FP8 GEMMs and its exponentials.
    ds = io.load_model("deepseek-v3")
    assert (ds.qk_dim, ds.v_dim) == (192, 128)
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, precision="mxfp8")
    ds_plain, ds_mx = (_cands(ds, gb300, fp8_attention=f, **knobs) for f in (False, True))
    assert lt.attention_time(ds_mx)[0] == pytest.approx(lt.attention_time(ds_plain)[0] * 256.0 / 320.0, rel=REL)
    # The search does not refuse it under MXFP8 (it still does under BF16).
    space = dataclasses.replace(load_space().pinned(tp=4, pp=1, vp=1, cp=1, mbs=1, recompute="none",
                                                    fp8_attention=True), precision=("bf16", "mxfp8"))
    out = generate(llama, gb300, 8, 8, space)
    mxfp8, bf16_plans = out[out.precision == "mxfp8"], out[out.precision == "bf16"]
    assert (mxfp8.reason == "").any()
    assert bf16_plans.reason.str.contains("needs the fp8-delayed, fp8-current, mxfp8 or nvfp4 recipe").all()


def test_an_fp8_kept_swiglu_input_halves_its_bytes_and_costs_its_casts(mixtral, hw):
    """TransformerConfig.activation_func_fp8_input_store: Megatron's fused SwiGLU saves
    input.to(float8_e4m3fn), 1 B per element of the gate and up outputs instead of 2, and converts
    it back before the backward. Mixtral 8x7B at tp 1, ep 8, mbs 1: 4,096 tokens, each sent to 2
    experts of FFN 14,336; the busiest rank has ``imbalance`` times the even share."""
    base = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    plain, kept = (_cands(mixtral, hw, activation_func_fp8_input_store=k, **base) for k in (False, True))
    elements = 2 * 4096 * 2 * plain.imbalance[0] * 14336  # gate and up of every routed copy
    assert (lt.stored_activation_bytes(plain, True) - lt.stored_activation_bytes(kept, True))[0] == pytest.approx(
        elements * (2.0 - 1.0), rel=REL)
    # To E4M3 after the forward (read 2, write 1), back to BF16 before the backward (read 1, write 2).
    assert (lt.fp8_cast_time(kept, True) - lt.fp8_cast_time(plain, True))[0] == pytest.approx(
        6.0 * elements / _hbm(hw), rel=REL)
    # A dense layer's MLP keeps its SwiGLU input in FP8 too.
    assert (lt.stored_activation_bytes(plain, False) - lt.stored_activation_bytes(kept, False))[0] == pytest.approx(
        2 * 4096 * 14336 * 1.0, rel=REL)


@pytest.mark.parametrize("fp8_fraction", [0.0, 1.0])
def test_mla_up_projection_recompute_keeps_only_the_latents(fp8_fraction):
    """--recompute-modules mla_up_proj (Megatron-LM d98e8a64dd multi_latent_attention.py lines
    983-990): the up projections and RoPE run in a CheckpointWithoutOutput that keeps its inputs,
    the BF16 latents (their norms fused into the up projections under TE), so Q, K, V and the up
    projections' own input copies (BF16, or FP8 under an FP8 recipe) go: DeepSeek-V3 at 4,096
    tokens, tp 1."""
    from autoparallel.costmodel import memory
    dsv3 = io.load_model("deepseek-v3")
    tokens, copy = 4096, 2.0 - fp8_fraction
    args = (dsv3, 1, tokens, 1, False, fp8_fraction, False, 1, 1.0)
    spared = memory.recomputed_bytes(*args, True, False, False)
    assert memory.recomputed_bytes(*args, False, False, False) == 0.0
    qkv = 2.0 * 128 * (2 * 192 + 128)  # BF16 Q, K (nope 128 + rope 64) and V (128) per head
    assert spared == pytest.approx(tokens * (qkv + copy * (1536 + 512)), rel=REL)
    # What a dense layer keeps replicated: the norms' BF16 inputs, the down projections' and FC1's input
    # copies and, per token, the latents with their up projections' input copies and the shared RoPE key.
    replicated = memory.replicated_bytes_per_token_hidden(dsv3, fp8_fraction) * 7168
    latents = (2.0 + copy) * (1536 + 512) + 2.0 * 64
    assert replicated == pytest.approx((4.0 + 2 * copy) * 7168 + latents, rel=REL)
    assert latents - copy * (1536 + 512) == 2.0 * (1536 + 512 + 64)  # kept under the recompute


def test_expert_bias_bytes_follow_megatrons_eager_per_expert_add():
    """``cat([t + b * p ...]).to(bf16)``: FP32 probabilities, forward b*p 4 + add 2+4+4 + cat 4+4
    + cast 4+2 = 28 B, backward cast 2+4, add's gradient cast 4+2, two products and reductions
    2 x (4+4+4) = 36 B; BF16 probabilities: 2 + 6 + 4 = 12 forward, 2 x 6 = 12 backward."""
    assert lt.expert_bias_bytes(4.0) == (28.0, 36.0)
    assert lt.expert_bias_bytes(2.0) == (12.0, 12.0)


def test_expert_biases_cost_hbm_passes_over_the_routed_copies_and_nothing_without_them(mixtral, hw):
    """GPT-OSS-120B (expert biases, routed in BF16 as its preset states), ep 8, mbs 1: 4096 tokens x
    top-4 copies x imbalance x hidden 2880 elements, 12 B forward and 12 B backward each; routed in
    FP32, 28 and 36. Mixtral has no bias: zero."""
    model = io.load_model("gpt-oss-120b")
    x = _cands(model, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    elements = 4096 * 4 * x.imbalance[0] * 2880
    forward, backward = lt.expert_bias_time(x)
    assert forward[0] == pytest.approx(12 * elements / _hbm(hw), rel=REL)
    assert backward[0] == pytest.approx(12 * elements / _hbm(hw), rel=REL)
    fp32 = _cands(dataclasses.replace(model, moe_router_dtype="fp32"), hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8,
                  sp=False, gbs=64)
    assert [t[0] for t in lt.expert_bias_time(fp32)] == pytest.approx(
        [28 * elements / _hbm(hw), 36 * elements / _hbm(hw)], rel=REL)
    layer = lt.moe_layer(x)
    kernels = (lt.router_time(x), lt.permutation_time(x), lt.moe_expert_calls(x), lt.post_sync_host_calls(x),
               (forward, backward), lt.glu_clamp_time(x, True), lt.unfused_rope_time(x))
    own = sum(b[0] - 2 * f[0] for f, b in kernels)
    assert layer["compute"][0] == pytest.approx(3 * layer["forward"][0] + own, rel=REL)
    no_bias = dataclasses.replace(model, add_bias_linear=False)
    y = _cands(no_bias, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    assert lt.moe_layer(y)["compute"][0] == pytest.approx(layer["compute"][0] - forward[0] - backward[0], rel=1e-9)
    z = _cands(mixtral, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    assert all(t[0] == 0.0 for t in lt.expert_bias_time(z))


def test_flex_dispatchers_hand_the_eager_expert_bias_fp32_probabilities(hw):
    """GPT-OSS-120B routes in BF16, but every flex backend (HybridEP, DeepEP, NCCL-EP) casts the
    probabilities to FP32 before dispatching them (Megatron-LM token_dispatcher.py), so under flex the
    eager bias step moves 28 B forward and 36 B backward per element (4096 tokens x top-4 x imbalance x
    hidden 2880, ep 8, mbs 1) where alltoall's BF16 probabilities move 12 and 12: 2.67x. Under the
    fused grouped MLP the bias is the FC2 epilogue's, priced at the BF16 step's 12 + 12 B whatever
    the dispatcher."""
    model = io.load_model("gpt-oss-120b")
    assert not model.moe_router_fp32
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    alltoall = _cands(model, hw, moe_token_dispatcher_type="alltoall", **knobs)
    flex = _cands(model, hw, moe_token_dispatcher_type="flex", **knobs)
    fused = _cands(model, hw, moe_token_dispatcher_type="flex", cutedsl_fused_grouped_mlp=True, **knobs)
    assert list(lt.fp32_expert_probs(alltoall)) == [False]
    assert list(lt.fp32_expert_probs(flex)) == [True]
    assert list(lt.fp32_expert_probs(fused)) == [False]
    assert flex.imbalance[0] == alltoall.imbalance[0]
    elements = 4096 * 4 * flex.imbalance[0] * 2880
    assert [t[0] for t in lt.expert_bias_time(flex)] == pytest.approx(
        [28 * elements / _hbm(hw), 36 * elements / _hbm(hw)], rel=REL)
    assert [t[0] for t in lt.expert_bias_time(alltoall)] == pytest.approx(
        [12 * elements / _hbm(hw), 12 * elements / _hbm(hw)], rel=REL)
    assert [t[0] for t in lt.expert_bias_time(fused)] == pytest.approx(
        [12 * elements / _hbm(hw), 12 * elements / _hbm(hw)], rel=REL)
    # the layer's compute holds the FP32 step: 3 x its forward plus each own-backward kernel's excess
    layer = lt.moe_layer(flex)
    kernels = (lt.router_time(flex), lt.permutation_time(flex), lt.moe_expert_calls(flex),
               lt.post_sync_host_calls(flex), lt.expert_bias_time(flex), lt.glu_clamp_time(flex, True),
               lt.unfused_rope_time(flex))
    own = sum(b[0] - 2 * f[0] for f, b in kernels)
    assert layer["compute"][0] == pytest.approx(3 * layer["forward"][0] + own, rel=REL)


def test_yarn_on_gqa_attention_runs_megatrons_unfused_rope(hw):
    """GPT-OSS-120B's YaRN scales RoPE's cos and sin by 0.1 ln 32 + 1, which TE's fused RoPE cannot
    take, so Megatron-Core runs its unfused RoPE: 20 B forward and 16 B backward beyond the fused
    kernel per query / key element, 4096 tokens x (64 + 8) heads x 64 at mbs 1, HBM-bound, in the
    layer's forward and compute; plain RoPE (Mixtral, the same model at scale 1) pays nothing."""
    model = io.load_model("gpt-oss-120b")
    assert model.rope_concentration == pytest.approx(0.1 * math.log(32) + 1, abs=1e-4)
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    x = _cands(model, hw, **knobs)
    elements = 4096 * (64 + 8) * 64
    forward, backward = lt.unfused_rope_time(x)
    assert [forward[0], backward[0]] == pytest.approx([20 * elements / _hbm(hw), 16 * elements / _hbm(hw)], rel=REL)
    plain = _cands(dataclasses.replace(model, rope_concentration=1.0), hw, **knobs)
    assert [t[0] for t in lt.unfused_rope_time(plain)] == [0.0, 0.0]
    with_rope, without = lt.moe_layer(x), lt.moe_layer(plain)
    assert with_rope["forward"][0] - without["forward"][0] == pytest.approx(forward[0], rel=REL)
    assert with_rope["compute"][0] - without["compute"][0] == pytest.approx(forward[0] + backward[0], rel=REL)
    with pytest.raises(ValueError, match="rope_concentration"):
        dataclasses.replace(model, rope_concentration=0.0)


def test_a_quick_geglus_clamp_is_eager_hbm_passes_over_the_glu_inputs(hw):
    """GPT-OSS-120B (quick-GEGLU clamped at 7), ep 8, mbs 1: 4096 tokens x top-4 x imbalance x
    2 x 2880 GLU input elements, 8 B forward (two clamps, a cat), 10 B backward (masked gradients,
    the chunk's cat); under moe_act recompute the forward again in the backward. Without the clamp,
    or as a SwiGLU (whose clamp is fused), nothing."""
    model = io.load_model("gpt-oss-120b")
    x = _cands(model, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    elements = 4096 * 4 * x.imbalance[0] * 2 * 2880
    forward, backward = lt.glu_clamp_time(x, True)
    assert forward[0] == pytest.approx(8 * elements / _hbm(hw), rel=REL)
    assert backward[0] == pytest.approx(10 * elements / _hbm(hw), rel=REL)
    layer = lt.moe_layer(x)
    kernels = (lt.router_time(x), lt.permutation_time(x), lt.expert_bias_time(x), lt.moe_expert_calls(x),
               lt.post_sync_host_calls(x), (forward, backward), lt.unfused_rope_time(x))
    own = sum(b[0] - 2 * f[0] for f, b in kernels)
    assert layer["compute"][0] == pytest.approx(3 * layer["forward"][0] + own, rel=REL)
    r = _cands(model, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, recompute="selective",
               recompute_modules="moe_act")
    assert lt.glu_clamp_time(r, True)[1][0] == pytest.approx(18 * elements / _hbm(hw), rel=REL)
    for other in (dataclasses.replace(model, activation_func_clamp_value=None),
                  dataclasses.replace(model, quick_geglu=False)):
        y = _cands(other, hw, tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
        assert all(t[0] == 0.0 for t in lt.glu_clamp_time(y, True))
        assert lt.moe_layer(y)["compute"][0] == pytest.approx(layer["compute"][0] - forward[0] - backward[0],
                                                              rel=1e-9)


def test_moe_act_recompute_reruns_the_routed_activation_kernel_in_the_backward(hw):
    """--recompute-modules moe_act (Megatron-LM experts.py: ``bias_act_func`` under
    CheckpointWithoutOutput) reruns the fused bias-activation kernel before FC2's backward. By hand
    for GPT-OSS-120B, ep 8, mbs 1: 4096 tokens x top-4 x imbalance x 2880 output elements, 6 B each
    (gate and up read, one written: BF16), backward only, and the layer's compute holds exactly that;
    a plain (ungated) activation 4 B; nothing without moe_act, or where ``moe`` reruns the block."""
    model = io.load_model("gpt-oss-120b")
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64)
    plain = _cands(model, hw, **knobs)
    r = _cands(model, hw, recompute="selective", recompute_modules="moe_act", **knobs)
    out = 4096 * 4 * r.imbalance[0] * 2880
    forward, backward = lt.moe_act_recompute_time(r)
    assert forward[0] == 0.0
    assert backward[0] == pytest.approx(6 * out / _hbm(hw), rel=REL)
    assert [t[0] for t in lt.moe_act_recompute_time(plain)] == [0.0, 0.0]
    clamp_rerun = lt.glu_clamp_time(r, True)[1][0] - lt.glu_clamp_time(plain, True)[1][0]
    assert lt.moe_layer(r)["compute"][0] - lt.moe_layer(plain)["compute"][0] == pytest.approx(
        clamp_rerun + backward[0], rel=REL)
    assert lt.moe_layer(r)["forward"][0] == pytest.approx(lt.moe_layer(plain)["forward"][0], rel=1e-12)
    ungated = _cands(dataclasses.replace(model, activation="gelu", quick_geglu=False, activation_func_clamp_value=None), hw, recompute="selective",
                     recompute_modules="moe_act", **knobs)
    assert lt.moe_act_recompute_time(ungated)[1][0] == pytest.approx(4 * out / _hbm(hw), rel=REL)
    whole = _cands(model, hw, recompute="selective", recompute_modules="moe moe_act", **knobs)
    assert lt.moe_act_recompute_time(whole)[1][0] == 0.0


def test_a_dense_quick_geglu_mlp_pays_its_clamp_on_the_mlps_glu_input(hw):
    model = dataclasses.replace(io.load_model("llama3-8b"), quick_geglu=True, activation_func_clamp_value=7.0)
    x = _cands(model, hw, tp=1, pp=1, vp=1, cp=1, dp=8, sp=False, gbs=64)
    elements = 8192 * 2 * model.ffn_hidden_size
    forward, backward = lt.glu_clamp_time(x, False)
    assert forward[0] == pytest.approx(8 * elements / _hbm(hw), rel=REL)
    plain = lt.dense_layer(_cands(io.load_model("llama3-8b"), hw, tp=1, pp=1, vp=1, cp=1, dp=8, sp=False, gbs=64))
    assert lt.dense_layer(x)["compute"][0] == pytest.approx(plain["compute"][0] + forward[0] + backward[0],
                                                            rel=1e-9)


def test_a_quick_geglus_clamp_keeps_one_more_bf16_copy_of_the_glu_input_unless_moe_act_recomputes(hw):
    """The clamps keep the FC1 output (2 B per GLU input element) beside the fused GLU's clamped copy:
    4096 tokens x top-4 x imbalance x 2 x 2880 elements more per layer; moe_act's checkpoint keeps the
    FC1 output only, as without the clamp."""
    model = io.load_model("gpt-oss-120b")
    plain = dataclasses.replace(model, activation_func_clamp_value=None)
    for recompute, extra in ((dict(), True), (dict(recompute="selective", recompute_modules="moe_act"), False)):
        knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, **recompute)
        x, y = _cands(model, hw, **knobs), _cands(plain, hw, **knobs)
        elements = 4096 * 4 * x.imbalance[0] * 2 * 2880
        difference = lt.stored_activation_bytes(x, True)[0] - lt.stored_activation_bytes(y, True)[0]
        assert difference == pytest.approx(2.0 * elements if extra else 0.0, rel=1e-9, abs=1e-3)


def _schedule_table(m, vp, group):
    """Megatron-LM d98e8a64dd schedules.py ``get_schedule_table``: (micro-batch, chunk) in forward order."""
    table = []
    for low in range(0, m, group):
        high = m if low + group >= m else low + group
        table += [(mb, c) for c in range(vp) for mb in range(low, high)]
    return table


def _megatron_peak(pp, vp, m, rank, weights):
    """The most ``weights`` (one per chunk) summed over the chunk-micro-batches alive on ``rank``,
    replaying Megatron's schedule step by step: warm-up forwards ((pp - rank - 1) * 2 + (vp - 1) * N
    interleaved, pp - rank - 1 not; ``get_pp_rank_microbatches``), then one forward and one backward
    per step, the backwards in table order with the chunk reversed (``get_model_chunk_id``)."""
    group = (pipeline.microbatch_group_size(m, pp) or pp) if vp > 1 else 1
    table = _schedule_table(m, vp, group)
    warmup = min((pp - rank - 1) * 2 + (vp - 1) * group if vp > 1 else pp - rank - 1, len(table))
    alive, best, forwards, backwards = [0] * vp, 0.0, 0, 0
    while backwards < len(table):
        if forwards < len(table) and (forwards < warmup or forwards == backwards + warmup):
            alive[table[forwards][1]] += 1
            forwards += 1
            best = max(best, sum(a * w for a, w in zip(alive, weights)))
        else:
            alive[vp - 1 - table[backwards][1]] -= 1
            backwards += 1
    return best


# (layers, MoE pattern or None, pp, vp, micro-batches, split): even, accounted, explicit, flexible
# layouts, groups of N != pp with a shorter last group (m not a multiple of pp: its states near the
# step's end differ), every micro-batch in the warm-up, no interleaving.
HELD_CASES = [
    (126, None, 16, 4, 384, (0, 0, True, True, "")),  # Llama 3.1 405B on 256 GB200
    (96, None, 8, 2, 16, pipeline.EVEN),
    (30, None, 4, 2, 20, (0, 0, True, True, "")),  # 32 slots
    (34, None, 6, 3, 29, (0, 0, True, True, "")),  # 36 slots; m = 29: groups of 10, the last of 9
    (61, (0,) * 3 + (1,) * 58, 6, 4, 26, (0, 0, False, False, pipeline.rank_balanced_layout(61, 6, 4, 1))),  # 9, 8
    (60, None, 4, 3, 12, (12, 12, False, False, "")),
    (61, (0,) * 3 + (1,) * 58, 16, 2, 120, (0, 0, False, False, "Et*2|(t*2|)*14t|(t*2|)*15mL")),
    (61, (0,) * 3 + (1,) * 58, 4, 4, 36, (0, 0, False, False, pipeline.rank_balanced_layout(61, 4, 4, 1))),
    # every micro-batch in the warm-up
    (61, (0,) * 3 + (1,) * 58, 2, 8, 2, (0, 0, False, False, pipeline.rank_balanced_layout(61, 2, 8, 1))),
    (5, None, 4, 1, 8, (0, 0, False, False, "Et|t|t*2|tL")),
    (40, (1, 0) * 20, 8, 5, 256, pipeline.EVEN),
]


@pytest.mark.parametrize("case", HELD_CASES, ids=lambda c: f"L{c[0]}-pp{c[2]}-vp{c[3]}-m{c[4]}")
def test_held_at_peak_is_what_megatrons_schedule_holds(case):
    """Every rank's peak, for any weights of its dense layers, MoE layers and edge chunk (the
    embedding's on the first rank, the loss's on the last), is a state ``held_at_peak`` prices:
    the first rank, the fullest middle rank (over every middle rank), the last rank."""
    num_layers, pattern, pp, vp, m, split = case
    pattern = pattern or (0,) * num_layers
    sizes = pipeline.virtual_stage_sizes(num_layers, pp, vp, *split)
    ends = np.cumsum(sizes)
    moe_sizes = [sum(pattern[e - s:e]) for s, e in zip(sizes, ends)]
    positions = pipeline.held_at_peak(pattern, np.array([pp]), np.array([vp]), np.array([m]),
                                      *(np.array([v]) for v in split))
    rng = np.random.default_rng(pp * 100 + vp * 10 + m)
    for weights in [(1.0, 1.0, 0.0), (1.0, 1.0, 1.0), (0.0, 0.0, 1.0), *rng.uniform(0, 3, (6, 3))]:
        dense_w, moe_w, edge_w = weights
        peaks = []
        for rank in range(pp):
            per_chunk = [dense_w * (sizes[c * pp + rank] - moe_sizes[c * pp + rank]) + moe_w * moe_sizes[c * pp + rank]
                         for c in range(vp)]
            if rank == 0:
                per_chunk[0] += edge_w
            elif rank == pp - 1:
                per_chunk[-1] += edge_w
            peaks.append(_megatron_peak(pp, vp, m, rank, per_chunk))
        expected = {0: peaks[0], 2: peaks[-1], **({1: max(peaks[1:-1])} if pp > 2 else {})}  # a middle from pp 3
        for position, want in expected.items():
            dense, moe, edge = (np.broadcast_to(a, (a.shape[0], 1))[:, 0] for a in positions[position])
            got = (dense_w * dense + moe_w * moe + edge_w * (edge if position != 1 else 0)).max()
            assert got == pytest.approx(want, abs=1e-9), (position, weights)


def test_held_at_peak_moves_each_end_rank_its_own_way():
    """Llama 3.1 405B, TP4 PP16 VP4, 384 micro-batches, the embedding and the loss counted in the
    split (chunks of [1, 2, 2, 2] layers on rank 0, [2, 2, 2, 1] on rank 15): Megatron holds 127
    layer-micro-batches on rank 0 (inflight_chunks / vp of the average chunk: 138.25), 154 on rank 1
    (154 either way) and 98 on rank 15 (85.75); and on a flexible layout whose third rank holds more
    layers the fullest middle rank is that one, not rank 1 (pp 4: rank 1 holds 3 micro-batches of 1
    layer, rank 2 two of 3)."""
    split = (np.array([0]), np.array([0]), np.array([True]), np.array([True]), np.array([""]))
    first, middle, last = pipeline.held_at_peak((0,) * 126, np.array([16]), np.array([4]), np.array([384]), *split)
    assert [float((d + mo).max()) for d, mo, _ in (first, middle, last)] == [127, 154, 98]
    for rank, chunks in ((0, [1, 2, 2, 2]), (15, [2, 2, 2, 1])):
        assert float(pipeline.inflight_chunks(16, 4, 384, rank)) / 4 * sum(chunks) == {0: 138.25, 15: 85.75}[rank]
    layout = (np.array([0]), np.array([0]), np.array([False]), np.array([False]), np.array(["Et|t|t*3|tL"]))
    _, middle, _ = pipeline.held_at_peak((0,) * 6, np.array([4]), np.array([1]), np.array([8]), *layout)
    assert float(middle[0].max()) == 2 * 3


def test_interleaved_activations_are_priced_at_the_fullest_state(gpt, hw):
    """The memory step prices a stage at the fullest of ``held_at_peak``'s states: a rank whose
    two states hold (30 dense layer-micro-batches, 0 edge) and (28, 4) keeps 30 layers' or 28
    layers' and 4 edge chunks' activations, whichever is more."""
    x = _cands(gpt, hw)
    layers = _fake_layers(x)
    states = (np.array([[30.0], [28.0]]), np.zeros((2, 1)), np.array([[0.0], [4.0]]))
    for edge_bytes, want in ((0.4e9, 30e9), (0.6e9, 28e9 + 2.4e9)):
        peak, edge = pm._in_flight(x, layers, states, x.middle_layers, x.middle_moe, edge_bytes)
        assert peak[0] == pytest.approx(want + 2e9, rel=REL)  # + the working set of the layer computing
        assert edge[0] == (0.0 if want == 30e9 else 4.0)


def test_moe_act_recompute_keeps_the_routed_experts_bf16_fc1_output(mixtral, hw):
    """``--recompute-modules moe_act`` runs the routed experts' SwiGLU in a CheckpointWithoutOutput
    that keeps its BF16 input (Megatron-LM d98e8a64dd experts.py lines 1019-1023; the activation
    runs without autograd, so no FP8 copy is kept): 2 B per element of the two FC1 halves whatever
    ``activation_func_fp8_input_store`` says, where without the recompute the knob keeps 1 B. A
    published row's own FP8 cache (DeepSeek-V3 §3.3.2, ``moe_act_cache_precision`` fp8) keeps 1 B."""
    moe = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=8, precision="fp8-current")
    act = dict(recompute="selective", recompute_modules="moe_act")
    stored = lambda x: lt.stored_activation_bytes(x, True)[0]  # noqa: E731
    recomputed = [_cands(mixtral, hw, activation_func_fp8_input_store=fp8, **act, **moe) for fp8 in (False, True)]
    assert stored(recomputed[1]) == stored(recomputed[0])
    x = recomputed[1]
    halves = 4096 * 2 * x.imbalance[0] * 2 * 14336  # token copies (top 2, busiest rank) x the two FC1 halves
    plain = [_cands(mixtral, hw, activation_func_fp8_input_store=fp8, **moe) for fp8 in (False, True)]
    assert stored(plain[0]) - stored(plain[1]) == pytest.approx(halves * (2 - 1), rel=1e-9)
    cols = plan_columns([Plan(**{**dict(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64, sp=True, recompute="none",
                                        tp_comm_overlap=False, fp8_bf16_edge_layers=0, grad_reduce_in_fp32=False),
                                 **moe, **act, "activation_func_fp8_input_store": True})])
    row = candidates(mixtral, hw, {**cols, "moe_act_cache_precision": np.array(["fp8"], dtype=object)})
    assert stored(x) - stored(row) == pytest.approx(halves * (2 - 1), rel=1e-9)


def test_a_rows_e5m6_attention_output_cache_keeps_one_and_a_half_bytes(hw):
    """DeepSeek-V3 caches the attention output (the output projection's input, which the
    attention's backward reads too) in its E5M6 format (report §3.3.3), 12 bits packed: 1.5 B per
    element instead of the BF16 copy Megatron shares between the two under blockwise FP8. Each
    layer, dense or MoE, keeps tokens x heads x v_head_dim elements of it; nothing else moves."""
    dsv3 = io.load_model("deepseek-v3")
    knobs = dict(tp=1, pp=16, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=128, precision="fp8-blockwise",
                 recompute="selective", recompute_modules="layernorm mla_up_proj moe_act")
    cols = plan_columns([Plan(**{**dict(tp_comm_overlap=False, fp8_bf16_edge_layers=0, grad_reduce_in_fp32=True,
                                        mbs=1), **knobs})])
    megatron = candidates(dsv3, hw, cols)
    e5m6 = candidates(dsv3, hw, {**cols, "attention_output_cache_precision": np.array(["e5m6"], dtype=object)})
    assert megatron.attention_output_bytes[0] == 2.0 and e5m6.attention_output_bytes[0] == 1.5
    per_layer = 4096 * 128 * 128 * (2.0 - 1.5)  # tokens x heads x v_head_dim x the byte spared
    for moe in (False, True):
        assert (lt.stored_activation_bytes(megatron, moe)[0] - lt.stored_activation_bytes(e5m6, moe)[0]
                == pytest.approx(per_layer, rel=1e-9))
    unknown = candidates(dsv3, hw, {**cols, "attention_output_cache_precision": np.array([""], dtype=object)})
    assert unknown.attention_output_bytes[0] == 2.0


def test_the_headroom_is_the_fixed_reserve_alone(gpt, hw):
    """The search's default share is 1 (spaces/training.yaml memory_fraction): a plan fits when
    its tensors and the GPU's fixed reserve (4 GiB on an H100, what the CUDA context, NCCL's
    buffers and the allocator's slack take: hand_set_constants.yaml reserve_gib) fit the GPU's
    memory; 0.95 of 80 GiB on top of the reserve left 8 GiB to the runtime."""
    from autoparallel.space import load_space
    assert load_space().memory_fraction == 1.0 and hw.reserve_gib == 4.0
    cols = plan_columns([Plan(tp=4, pp=8, vp=2, cp=2, dp=4, mbs=1, gbs=64)])
    out = estimate_columns(gpt, hw, cols)
    tensors = sum(out[k][0] for k in pm.MEMORY_KEYS if k != "reserve_gib")
    assert out["peak_memory_gib"][0] == pytest.approx(tensors + 4.0, rel=1e-12)
    assert out["fits"][0] == (tensors + 4.0 <= hw.memory_gib)
    # 74.2 GiB of tensors (SP, MBS 2): within the whole H100 (79.65 GiB the driver gives) with the reserve,
    # not within the old 0.95 share; 76.2 GiB of tensors: beyond the GPU with the reserve.
    fits = plan_columns([Plan(tp=4, pp=8, vp=1, cp=1, dp=16, mbs=2, gbs=512, sp=True)])
    over = plan_columns([Plan(tp=4, pp=16, vp=3, cp=1, dp=4, mbs=2, gbs=512, sp=True)])
    assert 76.0 < estimate_columns(gpt, hw, fits)["peak_memory_gib"][0] <= hw.memory_gib < estimate_columns(
        gpt, hw, over)["peak_memory_gib"][0]
    assert estimate_columns(gpt, hw, fits)["fits"][0] and not estimate_columns(gpt, hw, fits, 0.95)["fits"][0]
    assert not estimate_columns(gpt, hw, over)["fits"][0]


def test_dualpipe_stages_are_contiguous_slices_of_the_model(hw):
    """DualPipe splits the model in PP contiguous stages (deepseek-ai/DualPipe example_dualpipe.py):
    with DeepSeek-V3's published layout (rank 0: the embedding and 2 + 2 layers of chunks 0 and
    16; rank 15: 1 layer, the MTP module and the head) its first stage is the embedding and layers
    0-3, three dense and one MoE, where the interleaved rank 0 holds two of each. The end rank's PP
    micro-batches of the first stage keep three dense layers' and one MoE layer's activations, and
    its states are those of that stage beside the last; the priced ranks (the step time) keep the
    interleaved counts."""
    dsv3 = io.load_model("deepseek-v3")
    cols = plan_columns([Plan(tp=1, pp=16, vp=2, cp=1, dp=128, ep=64, mbs=1, gbs=15360, precision="fp8-blockwise",
                              pipeline_model_parallel_layout="Et*2|(t*2|)*14t|(t*2|)*15mL", grad_reduce_in_fp32=True)])
    x = candidates(dsv3, hw, {**cols, "pipeline_schedule": np.array(["dualpipe"], dtype=object)})
    assert (x.first_layers[0], x.first_moe[0], x.last_layers[0], x.last_moe[0]) == (4, 2, 1, 1)
    assert tuple(float(m[0]) for m in pm.dualpipe_stage_moe(x)) == (1.0, 1.0)
    plain = candidates(dsv3, hw, cols)
    assert tuple(float(m[0]) for m in pm.dualpipe_stage_moe(plain)) == (2.0, 1.0)  # no DualPipe: the ranks'
    ones = np.ones(1)
    dense = dict(stored=2e9 * ones, stored_imbalance=0 * ones, working=2e9 * ones, params=5e8 * ones,
                 expert_params=0 * ones, adapter_params=0 * ones)
    moe = {**dense, "stored": 1e9 * ones, "params": 2e8 * ones, "expert_params": 1e8 * ones}
    layers = lt.Layers(dense, moe)  # stand-ins: a dense layer keeping more, so that the end rank is the fullest
    (first, _, _), _ = pm.activation_bytes(x, layers)
    embedding = 8 * 4096  # int64 token ids, no dropout
    mtp = pm.mtp_bytes(x, layers, 1.0)
    head = max(pm.logits_bytes(x)[0] - 2e9, 0.0)
    assert first[0] == pytest.approx(16 * (3 * 2e9 + 1e9 + embedding) + 1e9 + 2e9 + mtp[0] + head, rel=REL)
    embedding_params = 129280 * 7168
    first_stage = 3 * 5e8 + 2e8 + embedding_params + 1e8
    last_stage = 2e8 + embedding_params + 1e8 + (2e8 + 2 * 7168 ** 2) + 1e8  # a MoE layer, the head, the MTP module
    out = pm.peak_memory(x, layers, st.stage_params(x, layers), 1.0)
    assert out["grads_gib"][0] == pytest.approx(4.0 * (first_stage + last_stage) / GIB, rel=REL)


def test_the_1f1b_all_to_all_overlap_waits_for_the_host_to_issue_both_passes_per_expert_calls():
    """Qwen3-30B-A3B (128 experts) on B200 under MXFP8 at ep 8: 16 local experts, two GroupedLinears,
    forward a quantize and a GEMM each (64 calls), backward a quantize, a dgrad and a wgrad (96):
    160 per-expert host calls per layer and micro-batch, and 15 more in the forward after the
    alltoall dispatcher's sync (``post_sync_call_count``: 4 dispatcher calls, 2 sorts by local expert,
    4 experts' module calls, the fused weighted SwiGLU, 3 Fp8Padding calls, the residual add). Under
    the 1F1B all-to-all overlap the layer takes at least 175 x ``moe_expert_call_s``: the stall is
    what that exceeds the layer's other terms by. Not
    without the overlap, not under a full-iteration CUDA graph, and at ep 64 (2 local experts, 20
    calls) the GPU's own time covers it."""
    model, b200 = io.load_model("qwen3-30b-a3b"), io.load_hardware("b200")
    knobs = dict(tp=1, pp=1, vp=1, cp=1, dp=8, ep=8, sp=False, gbs=64, precision="mxfp8")
    host = 175 * b200.efficiency.moe_expert_call_s
    assert lt.post_sync_call_count(_cands(model, b200, **knobs))[0] == pytest.approx(15)
    plain = lt.moe_layer(_cands(model, b200, **knobs))
    overlapped = lt.moe_layer(_cands(model, b200, **knobs, overlap_moe_expert_parallel_comm=True))
    priced = sum(overlapped[k][0] for k in lt.LAYER_TIME_TERMS if k != "compute") + plain["compute"][0]
    assert host > priced  # this case is host-bound
    assert overlapped["time"][0] == pytest.approx(host, rel=1e-9)
    assert overlapped["compute"][0] == pytest.approx(plain["compute"][0] + host - priced, rel=1e-9)
    assert plain["time"][0] < host  # no stall without the overlap
    graphed = lt.moe_layer(_cands(model, b200, **knobs, overlap_moe_expert_parallel_comm=True,
                                  cuda_graph="full_iteration"))
    assert graphed["time"][0] < host
    wide = _cands(model, b200, **{**knobs, "dp": 64, "ep": 64, "gbs": 512}, overlap_moe_expert_parallel_comm=True)
    assert lt.combined_host_stall(wide, lt.moe_layer(wide)["time"])[0] == 0.0
    assert 20 * b200.efficiency.moe_expert_call_s < lt.moe_layer(wide)["time"][0]


def test_lora_input_regather_keeps_the_sequence_shard_and_gathers_it_again(llama, hw):
    """Megatron-Bridge's LoRA.sequence_parallel_input_regather (v0.6.0+): beside QKV and FC1 the adapter's
    A keeps the norm output's sequence shard (1/TP of the 8,192 x 8,192 BF16 it keeps otherwise) and its
    ColumnParallelLinear gathers it forward, gathers it again backward and reduce-scatters its input
    gradient: three collectives of 8,192 x 8,192 BF16 over TP 4 beside QKV, userbuffers or not (two
    with userbuffers, none without them, when off). Llama 2 70B at TP 4, rank 16 on QKV and projection."""
    from autoparallel.costmodel import finetune
    model = _lora(llama)
    whole, shard = 2.0 * 8192 * 8192, 2.0 * 8192 * 8192 / 4  # one micro-batch's QKV adapter input, BF16
    assert finetune.adapter_input_bytes(model, 1, 8192, 4) == pytest.approx(whole, rel=REL)
    assert finetune.adapter_input_bytes(model, 1, 8192, 4, True) == pytest.approx(shard, rel=REL)
    assert [float(c) for _, c in finetune.adapter_collectives(model, 4, True, False, True)][0] == 3.0
    assert [float(c) for _, c in finetune.adapter_collectives(model, 4, True, True, True)][0] == 3.0
    gather = lt.comm.reduce_scatter_time(hw, whole, 4.0, 4.0)
    for ub, added in ((True, 1), (False, 3)):
        off = _llama_cands(model, hw, tp_comm_overlap=ub)
        on = _llama_cands(model, hw, tp_comm_overlap=ub, lora_input_regather=True)
        assert lt.lora_adapters_time(on)[0] - lt.lora_adapters_time(off)[0] == pytest.approx(added * gather, rel=REL)
    off, on = _llama_cands(model, hw), _llama_cands(model, hw, lora_input_regather=True)
    keep = off.keep_scores
    assert lt.activation_bytes(on, False, keep)[0] - lt.activation_bytes(off, False, keep)[0] == pytest.approx(
        shard - whole, rel=REL)
