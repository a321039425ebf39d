"""Attention-DP ranks simulated in lock-step (serve/attention_dp.py): TensorRT-LLM's context balancing
(``PyExecutor._balance_adp_requests``) and request placement on a hand-computed tiny case, the
lock-step price against ``IterationCost`` and by hand, ``inference.routed_moe_time`` against the
pass's own terms, and one rank equal to the one-replica simulation."""

import dataclasses

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel.inference import (_soft_max, layout, moe_dispatch_time, pass_work, price_routed_experts,
                                              routed_moe_time)
from autoparallel.serve.assumptions import efficiency_for, load_engine
from autoparallel.serve.attention_dp import _Ranks, simulate_ranks
from autoparallel.serve.simulate import IterationCost, Scheduler, _Replay, replica


class _Flat:
    """A cost whose every iteration takes 1 s whatever its shape (the tables ``simulate_ranks`` reads)."""

    pp, k, pass_s, max_tokens, max_seqs = 1, 4.0, 0.0, 64, 16
    ctx_flops = ctx_bytes = chunk_flops = per_flop = per_byte = 0.0
    per_tokens = [1.0] * 65
    per_moe = hop = [0.0] * 65
    per_sampled = [0.0] * 17

    def attention(self, flops, nbytes):
        return 0.0


def _sched(balance=()):
    return Scheduler(max_running=4, budget=64, kv_blocks=100, block=4, reserve_full=True, chunked=False, dp=2,
                     adp_balance=balance)


# Requests 0 (8-token prompt) and 1 (4) at t = 0, request 2 (4) at t = 1.5, ten tokens each.
ARRIVAL, INP, OUT = [0.0, 0.0, 1.5], [8, 4, 4], [10, 10, 10]


def test_placement_puts_the_longest_prompt_first_on_the_rank_with_fewest_prompt_tokens():
    """``_balance_requests_across_ranks``: 0 and 1 to ranks 0 and 1 (longest first, both empty: rank 0 first);
    2 to rank 1, which holds 4 prompt tokens against rank 0's 8."""
    ranks = _Ranks(_Flat(), _sched(), ARRIVAL, INP, OUT)
    ranks.place([1, 0])
    assert (ranks.rank[0], ranks.rank[1]) == (0, 1)
    ranks.place([2])
    assert ranks.rank[2] == 1 and ranks.active == [1, 2] and ranks.active_tokens == [8, 8]


def test_without_balance_a_prompt_runs_at_the_next_iteration():
    """Iterations of 1 s from t = 0: 0 and 1 prefill in [0, 1] (first tokens at 1) and decode nine more (finish
    at 10); 2, arriving at 1.5, prefills in [2, 3]: first token at 3, finish at 12."""
    sim = simulate_ranks(_Flat(), _sched(), ARRIVAL, INP, OUT)
    assert list(sim.first_token) == [1.0, 1.0, 3.0] and list(sim.finish) == [10.0, 10.0, 12.0]


def test_the_balance_holds_a_lone_ranks_prompt_until_the_timeout():
    """timeout_iters 3: the counter runs on every iteration where not every rank has a context (1 at the
    iteration starting at 1, 2 at 2, where rank 1 alone has request 2's prompt: held), and reaches 3 at the
    iteration starting at 3, which runs it: first token at 4 (TTFT 2.5 s, not 1.5), finish at 13."""
    sim = simulate_ranks(_Flat(), _sched((0, 3)), ARRIVAL, INP, OUT)
    assert list(sim.first_token) == [1.0, 1.0, 4.0] and list(sim.finish) == [10.0, 10.0, 13.0]
    # the first prompts ran at once: no rank had a generation request (the source's escape)


def test_the_balance_waits_batching_wait_iters_when_every_rank_has_a_prompt():
    """Two prompts at 1.5, one on each rank, every rank decoding: batching_wait_iters 2 holds them at the
    iterations starting at 2 and 3 and runs them at 4: first tokens at 5."""
    arrival, inp, out = [0.0, 0.0, 1.5, 1.5], [8, 4, 4, 4], [10, 10, 10, 10]
    sim = simulate_ranks(_Flat(), _sched((2, 50)), arrival, inp, out)
    assert list(sim.first_token) == [1.0, 1.0, 5.0, 5.0]
    assert list(simulate_ranks(_Flat(), _sched(), arrival, inp, out).first_token) == [1.0, 1.0, 3.0, 3.0]


@pytest.fixture(scope="module")
def mixtral():
    """Mixtral-8x7B as 4 attention-DP ranks on B200 (NVFP4 weights), as the traffic simulation builds it."""
    model, hw = io.load_model("mixtral-8x7b"), io.load_hardware("b200")
    eff = efficiency_for("tensorrt-llm")
    cost, sched = replica(model, hw, eff, load_engine("tensorrt-llm"), 4, 1, 64, 2048, "nvfp4", "fp8", 4, 4096,
                          0, True, (3, 9))
    return model, hw, eff, cost, sched


def test_routed_moe_time_is_the_passs_moe_terms_by_hand(mixtral):
    """The MoE part of a 64-token pass: the layers x (the routed experts' roofline, their plugin bytes over
    HBM, the token exchange with its latencies), each a term of ``price_pass``'s layer sum."""
    model, hw, eff, _, _ = mixtral
    lay = layout(model, hw, eff, 4.0, 1.0, "nvfp4", "fp8", 4.0, load_engine("tensorrt-llm"), True)
    w = pass_work(lay, np.array([64.0]), np.zeros(1), np.zeros(1), np.zeros(1))
    gemm_peak = w.peak8 * eff.fp8_gemm_relative
    hbm = w.hbm * eff.hbm
    t_experts, expert_read = price_routed_experts(eff, w.experts, gemm_peak, hbm)
    hand = w.layers * (w.moe_share * _soft_max(t_experts, expert_read, eff.roofline_sharpness) + w.moe_bytes / hbm
                       + w.moe_share * moe_dispatch_time(eff, w))
    assert float(routed_moe_time(lay, np.array([64.0]))[0]) == pytest.approx(float(np.ravel(hand)[0]), rel=1e-9)
    dense = layout(io.load_model("llama2-70b"), hw, eff, 4.0, 1.0, "fp8", "fp8", 1.0)
    assert float(routed_moe_time(dense, np.array([64.0]))[0]) == 0.0


def test_identical_ranks_price_as_one_rank(mixtral):
    """Every rank with the same decode batch: the slowest rank less its MoE part plus the MoE part at the mean
    is ``IterationCost.time`` of that batch (the one-rank simulation's price)."""
    *_, cost, sched = mixtral
    ranks = _Ranks(cost, sched, [0.0], [8], [8])
    ranks.n_dec, ranks.ctx_sum = [32] * 4, [32 * 700] * 4
    flops, nbytes = 32 * 700 * cost.ctx_flops, 32 * 700 * cost.ctx_bytes
    assert ranks.price([[]] * 4) == pytest.approx(cost.time(32, 32, flops, nbytes, 32), rel=1e-12)


def test_a_prompt_on_one_rank_stalls_every_rank(mixtral):
    """Rank 0 prefills 512 prompt tokens beside its 32 decodes; the others decode 32: the iteration is rank 0's
    pass less its MoE part, plus the MoE part at the mean tokens ((544 + 3 x 32) / 4 = 160), by hand."""
    *_, cost, sched = mixtral
    ranks = _Ranks(cost, sched, [0.0], [512], [8])
    ranks.target[0], ranks.done[0] = 512, 0
    ranks.n_dec, ranks.ctx_sum = [32] * 4, [32 * 700] * 4
    dec_f, dec_b = 32 * 700 * cost.ctx_flops, 32 * 700 * cost.ctx_bytes
    prompt_f = cost.chunk_flops * 512 * 256.0
    rank0 = (cost.per_tokens[544] - cost.per_moe[544] + cost.per_sampled[33]
             + cost.attention(dec_f + prompt_f, dec_b))
    hand = rank0 + cost.per_moe[160] + cost.hop[160] + cost.pass_s
    assert ranks.price([[(0, 512)], [], [], []]) == pytest.approx(hand, rel=1e-12)
    # more than the one-rank price of a decode-only rank, less than every rank prefilling
    assert cost.time(32, 32, dec_f, dec_b, 32) < hand < cost.time(544, 33, dec_f + prompt_f, dec_b, 33)


def test_one_rank_is_the_one_replica_simulation(mixtral):
    """With one rank and no balance, the lock-step simulation is ``simulate``'s replica (to rounding)."""
    model, hw, eff, cost, sched = mixtral
    one = dataclasses.replace(sched, dp=1, adp_balance=())
    rng = np.random.default_rng(3)
    n = 300
    arrival = np.cumsum(rng.exponential(0.05, n))
    inp, out = rng.integers(20, 600, n), rng.integers(2, 300, n)
    a = _Replay(cost, one, arrival, inp, out).run()
    b = simulate_ranks(cost, one, arrival, inp, out)
    assert a.iterations == b.iterations
    np.testing.assert_allclose(b.first_token, a.first_token, rtol=1e-9)
    np.testing.assert_allclose(b.finish, a.finish, rtol=1e-9)


def test_the_simulation_dispatches_attention_dp_replicas(mixtral):
    """``replica(..., attention_dp=True)`` is the TP group's ranks (``Scheduler.dp``), simulated together."""
    *_, cost, sched = mixtral
    assert sched.dp == 4 and sched.adp_balance == (3, 9) and isinstance(cost, IterationCost)
    assert cost.per_moe is not None and len(cost.per_moe) == len(cost.per_tokens)
