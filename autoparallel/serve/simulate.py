"""Discrete-event simulation of an in-flight batching engine serving a workload (issue 29).

Why: the steady-state model (``costmodel.inflight``) gives one TTFT and one TPOT for one request
length. A serving team's bounds are on the 99th percentile under random arrivals of requests of
varying length, where queueing, long prompts stalling the token budget and KV-cache pressure make
the tail. As Vidur (MLSys 2024) does for vLLM / Sarathi, this module replays the engine's
scheduler iteration by iteration and prices each iteration with the existing per-iteration cost
model (``costmodel.inference.stage_pass``), so the tail comes from the same constants the
throughput tables are fitted on.

The scheduler (``Scheduler``; one replica, its requests FIFO):

- **admission**: a waiting request joins the running batch while fewer than ``max_running``
  requests run and the paged KV pool has its blocks: under TensorRT-LLM's GUARANTEED_NO_EVICT
  (``reserve_full``) the whole request's as the engine knows it, ceil((input + max new tokens) /
  block) — the engine cannot know where an answer will stop, so it reserves the request's
  ``max_tokens`` (``max_new_tokens``; 0: the request's own output, as trtllm-bench sets
  ``max_tokens`` to each request's output length); else its prompt's, with one more block each
  time a decoding request fills its last one (vLLM, SGLang, TensorRT-LLM's MAX_UTILIZATION).
  A head that does not fit blocks the queue (first come, first served).
- **iteration**: one token of every decoding request, then prompt chunks in admission order
  under the token budget (chunked prefill; without it a prompt runs whole or waits). With PP an
  iteration is ``pp`` micro-batch steps, each with its own budget, its prompts spread over the
  steps as the engine's per-step admission spreads them (``Scheduler.fill``). Under
  ``prefill_priority`` (SGLang's default scheduler) an iteration with prompts to prefill runs
  only prompts, and decoding waits.
- **multi-step scheduling** (``multi_step`` S > 1, vLLM V0's ``num_scheduler_steps``): the scheduler
  runs once per S decode iterations. A decode-only iteration it schedules starts a run of S, whose
  next S - 1 iterations admit nothing (a request arriving meanwhile waits for the run's end); an
  iteration with prompts is a run of one. vLLM's ``LLMEngine.step``: "Skip the scheduler if there
  are any remaining steps in the seq groups. This ensures that the scheduler is only called again
  when the current batch has completed"; a prompt's seq group gets one step, a decode's
  ``num_lookahead_slots + 1`` = S (``SequenceGroup.init_multi_step_from_lookahead_slots``; AMD's vLLM
  0.9.0.2 as mlcommons/inference_results_v5.1@965182b0 closed/Dell_MangoBoost/code/llama2-70b-99.9/
  amd/setup/vllm/vllm/engine/llm_engine.py, sequence.py). Simplifications: a request that finishes
  inside a run leaves at its last token (vLLM computes its frozen batch to the run's end), and a run
  whose batch empties ends.
- **prefill gate** (``prefill_min_waiting`` q > 0, AMD's V0 MLPerf scheduler patch,
  ``VLLM_LLAMA2_MLPERF_MIN_REQUIRE_PREFILL_QUERY``): a scheduler call admits prompts only while fewer
  than ``max_running`` requests run and either q prompts wait or the previous call admitted none
  (``do_prefill = do_prefill and (has_enough_query or self._do_prefill)``; ``self._do_prefill = not
  do_prefill``: mlcommons/inference_results_v5.1@965182b0 closed/AMD/setup/vllm_patches/
  add-MIN_REQUIRE_PREFILL_QUERY-condition.patch), so with fewer waiting a prefill runs at most every
  other call.
- **preemption** (allocate-as-you-go engines): when decoding requests need more blocks than are
  free, the most recently admitted request is evicted (vLLM's recompute: its blocks are freed and
  it re-joins the front of the queue to prefill its prompt and the tokens it generated again).
- a request's first token comes with its prompt's last chunk; each later token with one decode
  iteration. TTFT = first token - arrival; TPOT = (finish - first token) / (output - 1), MLPerf's
  definition (the mean interval between a request's output tokens).

Pricing (``IterationCost``): an iteration of T tokens, s sampled sequences and attention F FLOPs /
B bytes costs ``A[T] + S[s] + roofline(F, B)`` per pipeline stage, exactly ``stage_pass``'s sum
(tables of A and S are computed once per layout: the per-batch-shape cache); with ``pp`` stages
the running batch is split into ``min(pp, sequences)`` micro-batches and a token takes ``pp``
stage times, as in ``costmodel.inflight``; the host's pass overhead comes once per micro-batch step.

Two implementations of the same scheduler: ``simulate_reference`` (plain Python, one request
object at a time, small enough to check by hand) and ``simulate`` (aggregated state: decoding
requests as counts, sums and a heap of finishing iterations, and stretches of decode-only
iterations priced at once with numpy), which the tests hold to the reference.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections import deque
from dataclasses import dataclass
from heapq import heappop, heappush

import numpy as np

from autoparallel.costmodel import mamba_serving
from autoparallel.costmodel.inference import (InferenceEfficiency, ServingEngine, decode_attention, layout,
                                              pipeline_hop, prefill_attention, routed_moe_time, stage_pass)
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Scheduler:
    """One replica's scheduling limits and policy (see the module docstring)."""

    max_running: int  # requests in the running batch (max batch x pipeline micro-batches)
    budget: int  # tokens one iteration may process (max_num_tokens)
    kv_blocks: int  # blocks in the paged KV pool
    block: int  # tokens per block
    reserve_full: bool = True
    chunked: bool = True
    prefill_priority: bool = False
    max_new_tokens: int = 0  # the output a full reservation holds (0: each request's own)
    steps: int = 1  # micro-batch steps per iteration (pp), each with its own ``budget``
    multi_step: int = 1  # decode iterations per scheduler call (``ServingEngine.scheduler_steps``)
    prefill_min_waiting: int = 0  # AMD's V0 prefill gate (``MIN_REQUIRE_PREFILL_QUERY``; 0: none)
    dp: int = 1  # attention-DP ranks run in lock-step as one replica, each with these limits (``serve.attention_dp``)
    adp_balance: tuple = ()  # their context balancing: (batching_wait_iters, timeout_iters); (): off

    @staticmethod
    def of(engine: ServingEngine, max_batch: int, max_num_tokens: int, pp: int, kv_blocks: int,
           max_new_tokens: int = 0) -> Scheduler:
        return Scheduler(int(max_batch * pp), int(max_num_tokens), int(kv_blocks), engine.kv_block_tokens,
                         engine.kv_reservation == "full", engine.chunked_prefill, engine.prefill_priority,
                         int(max_new_tokens), int(pp), int(engine.scheduler_steps))

    def blocks(self, tokens: int) -> int:
        return -(-int(tokens) // self.block)

    def reserved(self, inp: int, out: int) -> int:
        """Tokens a full reservation holds for a request of ``inp`` prompt and ``out`` output tokens."""
        return int(inp) + max(int(out), self.max_new_tokens)

    def chunks(self, decodes: int, remaining) -> list[tuple[int, int]]:
        """Prompt chunks of one iteration: (tokens, micro-batch step) of the first prompts in
        admission order, over ``remaining`` (each prompt's tokens still to prefill), beside
        ``decodes`` decode tokens, under the token budget (chunked prefill; without it a prompt runs
        whole or waits, but alone it always runs); with PP, ``fill``."""
        if self.steps > 1:
            return self.fill(decodes, remaining)
        out, tokens = [], int(decodes)
        for rem in remaining:
            left = self.budget - tokens
            c = min(rem, left) if self.chunked else (rem if rem <= left or tokens == 0 else 0)
            if c <= 0:
                break
            tokens += c
            out.append((c, 0))
        return out

    def fill(self, decodes: int, remaining) -> list[tuple[int, int]]:
        """Prompt chunks of one pipelined iteration: (tokens, micro-batch step) per prompt, in
        admission order, over ``remaining`` (each prompt's tokens still to prefill), beside
        ``decodes`` decode tokens spread evenly over the ``steps`` steps.

        With PP, TensorRT-LLM runs one micro-batch scheduler call per micro-batch step, each
        with the whole ``max_num_tokens`` (and ``max_batch_size``): trtGptModelInflightBatching.cpp
        ``forwardAsync`` calls ``(*mMicroBatchScheduler)(fittingRequests, mInflightReqIds,
        mMaxBatchSizeRuntime, mMaxNumTokensRuntime)`` once per micro-batch, skipping the requests
        in flight in the other steps (NVIDIA/TensorRT-LLM, cpp/tensorrt_llm/batch_manager). A
        chunk runs whole in one step. An iteration of ``steps`` steps may thus prefill up to
        ``steps`` x the budget, less its decode tokens.

        Which step a prompt goes to: the engine runs its capacity scheduler in every
        ``forwardAsync`` too (once per micro-batch, over one shared KV pool), and a micro-batch's
        finished requests free their blocks in its own ``forwardSync`` just before it is scheduled
        again, so each step takes the contexts its own finishers made room for, about 1/steps of
        an iteration's, first come first served, plus any backlog. This simulation admits once per
        iteration; each prompt in admission order therefore goes to the step with the most room
        left (the first such step on ties), which spreads an iteration's new prompts over its steps
        as the engine's per-step admission does, and fills every step to the budget when a backlog
        waits. (Until session 38 the steps were filled in turn, step 0 first: an iteration's few new
        prompts all landed in step 0 and the round, ``pp`` x its slowest step, priced a bubble the
        engine does not have: RESULTS.md, s38h3.)"""
        out = []
        base, extra = divmod(int(decodes), self.steps)
        room = [self.budget - base - (1 if i < extra else 0) for i in range(self.steps)]
        used = [i < decodes for i in range(self.steps)]
        steps = range(self.steps)
        for rem in remaining:
            # the most room, the first such step on ties: an unused step (a whole budget) if any is left,
            # so an unchunked prompt too large for every step still runs alone there
            s = max(steps, key=room.__getitem__)
            c = min(rem, room[s]) if self.chunked else (rem if rem <= room[s] or not used[s] else 0)
            if c <= 0:
                break
            room[s] -= c
            used[s] = True
            out.append((c, s))
        return out


class IterationCost:
    """Seconds of one engine iteration of one layout, by batch shape (tables built once)."""

    def __init__(self, model: ModelSpec, hw: HardwareSpec, eff: InferenceEfficiency, tp: int, pp: int,
                 weight_precision: str, kv_precision: str, ep: int = 1, max_tokens: int = 8192,
                 max_seqs: int = 2048, engine: ServingEngine | None = None, attention_dp: bool = False):
        lay = layout(model, hw, eff, float(tp), float(pp), weight_precision, kv_precision, float(ep), engine,
                     attention_dp)
        zero = np.zeros(1)
        base = float(stage_pass(lay, zero, zero, zero, zero)["time"][0])
        # The tables as lists of Python floats: the simulation reads one element at a time, where a
        # numpy scalar's arithmetic costs several times a float's (the same IEEE doubles).
        tokens = np.arange(max_tokens + 1, dtype=float)
        self.per_tokens = stage_pass(lay, tokens, 0.0 * tokens, 0.0 * tokens, 0.0 * tokens)["time"].tolist()
        self.hop = np.broadcast_to(pipeline_hop(lay, tokens), tokens.shape).astype(float).tolist()
        seqs = np.arange(max_seqs + 1, dtype=float)
        self.per_sampled = (stage_pass(lay, 0.0 * seqs, seqs, 0.0 * seqs, 0.0 * seqs)["time"] - base).tolist()
        unit = 1e12  # the attention term is linear in FLOPs alone and in bytes alone
        self.per_flop = (float(stage_pass(lay, zero, zero, zero + unit, zero)["time"][0]) - base) / unit
        self.per_byte = (float(stage_pass(lay, zero, zero, zero, zero + unit)["time"][0]) - base) / unit
        self.k = eff.roofline_sharpness
        self.pp = int(pp)
        self.pass_s = eff.pass_overhead_us * 1e-6
        dec_flops, dec_bytes = decode_attention(lay, 1.0, 1.0)
        self.ctx_flops, self.ctx_bytes = float(np.ravel(dec_flops)[0]), float(np.ravel(dec_bytes)[0])
        # A chunk of c prompt tokens after k earlier ones: c * (k + c / 2) units of causal attention.
        self.chunk_flops = 2.0 * float(np.ravel(prefill_attention(lay, 1.0, 1.0)[0])[0])
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        # under attention DP, the part of ``per_tokens`` the MoE layers' routed part takes (``serve.attention_dp``)
        self.per_moe = routed_moe_time(lay, tokens).tolist() if attention_dp else None

    def attention(self, flops: float, nbytes: float) -> float:
        a, b = flops * self.per_flop, nbytes * self.per_byte
        hi = max(a, b)
        return hi * ((a / hi) ** self.k + (b / hi) ** self.k) ** (1.0 / self.k) if hi > 0 else 0.0

    def time(self, tokens: int, sampled: int, flops: float, nbytes: float, seqs: int, chunks=()) -> float:
        """One iteration: ``tokens`` processed, ``sampled`` sequences sampled, attention ``flops`` /
        ``nbytes`` (one layer, one GPU), ``seqs`` sequences in the batch; ``chunks``: the prompt
        chunks among them, (tokens, 1 if it ends its prompt, attention FLOPs, bytes[, its step]) each.

        With PP the round is ``m`` micro-batch steps; TensorRT-LLM's micro-batch scheduler fills
        each step with the requests not in flight and the contexts waiting at that moment, a chunk
        whole in one step (trtGptModelInflightBatching.cpp ``forwardAsync``), so the decode tokens
        are spread evenly while each chunk goes to its step (the one ``Scheduler.fill`` placed it
        in, when a chunk's shape names it; else chunk j to step j mod m). A
        micro-batch's next step waits for its previous one to leave the last stage, so the round
        takes ``pp`` times the slowest step's stage time (a pipeline of balanced steps: ``pp`` times
        the mean), plus the host's pass overhead once per step: the last rank blocks in
        ``decoderSync`` on each micro-batch before it schedules the next (``forwardAsync``), its GPU
        idle meanwhile."""
        m = min(self.pp, max(seqs, 1))
        if m > 1 and chunks:
            return self._unbalanced(tokens, sampled, flops, nbytes, m, chunks)
        t_mb, s_mb = min(round(tokens / m), self.max_tokens), min(round(sampled / m), self.max_seqs)
        stage = self.per_tokens[t_mb] + self.per_sampled[s_mb] + self.attention(flops / m, nbytes / m)
        return self.pp * (stage + self.hop[t_mb]) + m * self.pass_s

    def _unbalanced(self, tokens, sampled, flops, nbytes, m: int, chunks) -> float:
        # per step: tokens, sampled, attention FLOPs, bytes of its chunks
        st, ss, sf, sb = [0.0] * m, [0.0] * m, [0.0] * m, [0.0] * m
        for j, shape in enumerate(chunks):  # (tokens, ends its prompt, FLOPs, bytes[, its step])
            c, ends, f, b = shape[:4]
            i = (shape[4] if len(shape) > 4 else j) % m
            st[i] += c
            ss[i] += ends
            sf[i] += f
            sb[i] += b
        # the decode requests spread evenly over the steps
        rt, rs, rf, rb = ((tokens - sum(st)) / m, (sampled - sum(ss)) / m, (flops - sum(sf)) / m,
                          (nbytes - sum(sb)) / m)
        per_tokens, per_sampled, hop, max_t, max_s = (self.per_tokens, self.per_sampled, self.hop, self.max_tokens,
                                                      self.max_seqs)
        slowest = 0.0
        for i in range(m):
            t_mb, s_mb = min(round(st[i] + rt), max_t), min(round(ss[i] + rs), max_s)
            slowest = max(slowest, per_tokens[t_mb] + per_sampled[s_mb] + self.attention(sf[i] + rf, sb[i] + rb)
                          + hop[t_mb])
        return self.pp * float(slowest) + m * self.pass_s

    def decode_times(self, n: int, ctx_sums: np.ndarray) -> np.ndarray:
        """Decode-only iterations of ``n`` sequences whose contexts sum to each of ``ctx_sums``
        (numpy's elementwise operations, in place: one array allocated besides ``a`` and ``b``)."""
        m = min(self.pp, max(n, 1))
        t_mb = min(round(n / m), self.max_tokens)
        fixed = self.per_tokens[t_mb] + self.per_sampled[min(t_mb, self.max_seqs)] + self.hop[t_mb]
        a = ctx_sums * (self.ctx_flops / m * self.per_flop)
        b = ctx_sums * (self.ctx_bytes / m * self.per_byte)
        hi = np.maximum(a, b)
        np.maximum(hi, 1e-300, out=hi)  # the roofline of ``attention``, over the array
        a /= hi
        b /= hi
        a **= self.k  # (``**``, as ``attention`` writes it: numpy's own paths for some exponents)
        b **= self.k
        a += b
        a **= 1.0 / self.k
        a *= hi  # the attention term
        a += fixed
        if self.pp != 1:  # (x * 1 is x)
            a *= self.pp
        a += m * self.pass_s
        return a

    def decode_floor(self, n: int, ctx_sum: int) -> float:
        """At most ``decode_times(n, [ctx_sum])[0]``: the same sum in Python floats (whose ``**``
        may differ from numpy's in the last bits), less one part in 10^9. ``simulate`` bounds with
        it how many decode iterations can start before the next arrival (a bound only)."""
        m = min(self.pp, max(n, 1))
        t_mb = min(round(n / m), self.max_tokens)
        fixed = self.per_tokens[t_mb] + self.per_sampled[min(t_mb, self.max_seqs)] + self.hop[t_mb]
        att = self.attention(ctx_sum * self.ctx_flops / m, ctx_sum * self.ctx_bytes / m)
        return (self.pp * (fixed + att) + m * self.pass_s) * (1.0 - 1e-9)


@dataclass
class SimResult:
    """Per-request times of one simulated run (seconds; NaN for a request never finished)."""

    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    iterations: int
    preemptions: int

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> np.ndarray:
        many = self.output_len > 1
        return (self.finish[many] - self.first_token[many]) / (self.output_len[many] - 1)

    @property
    def duration(self) -> float:
        return float(np.nanmax(self.finish) - self.arrival.min())

    @property
    def keeps_up(self) -> bool:
        """Whether the replica serves the arrivals without a growing queue: the last quarter of
        arrivals waits for its first token at most 1.5 x as long as the second quarter (plus one
        median TPOT of slack). A queue growing from empty gives about 2.3 x; a stable one ~1 x.
        Needed because a finite run above capacity can end before its queue breaks a TTFT bound
        (MLPerf's 600 s minimum run guards against the same)."""
        n = len(self.arrival)
        if n < 8 or float(self.arrival.max()) <= 0:
            return True
        ttft, q = self.ttft, n // 4
        slack = float(np.median(self.tpot)) if len(self.tpot) else 0.0
        return float(ttft[-q:].mean()) <= 1.5 * float(ttft[q:2 * q].mean()) + slack

    @property
    def output_tokens_per_s(self) -> float:
        """Offline (every request at 0): all output tokens over the run. Under arrivals that it
        keeps up with: the arrival rate x the mean output (what a long run completes; a finite
        run's empty start and drain would dilute it). Overloaded: the tokens produced between the
        end of the warm-up (the median request's end-to-end time, at most half the arrivals) and
        the last arrival, each request's tokens spread evenly from its first token to its finish."""
        end = float(self.arrival.max())
        if end <= 0:
            return float(self.output_len.sum() / self.duration)
        n = len(self.arrival)
        if self.keeps_up:
            return float((n - 1) / end * self.output_len.mean())
        start = min(float(np.median(self.finish - self.arrival)), 0.5 * end)
        return float((self._made_by(end) - self._made_by(start)).sum() / (end - start))

    @property
    def steady_requests_per_s(self) -> float:
        """Requests/s an all-at-once (Offline) run serves while its queue still feeds the batch:
        the output tokens made up to the last request's first token (from then on the batch only
        drains) over that time, in requests of the mean output. The whole run's rate counts the
        drain of the last batch, its longest answers decoding at a shrinking batch: a large share
        of a few-thousand-request run (Mixtral on one H100, 7,168 requests at max batch 896: 41.4
        requests/s against 44.8 over 60,000)."""
        end = float(np.nanmax(self.first_token))
        if end <= 0:
            return len(self.arrival) / self.duration
        return float(self._made_by(end).sum() / end / self.output_len.mean())

    def _made_by(self, t: float) -> np.ndarray:
        """Output tokens each request has produced by time ``t``."""
        span = np.maximum(self.finish - self.first_token, 1e-12)
        later = np.clip((t - self.first_token) / span, 0.0, 1.0) * (self.output_len - 1)
        return np.where(self.first_token <= t, 1.0 + later, 0.0)

    def summary(self, percentiles=PERCENTILES) -> dict[str, float]:
        out = {"output_tokens_per_s": self.output_tokens_per_s, "requests_per_s": len(self.arrival) / self.duration}
        tpot = self.tpot
        for p in percentiles:
            out[f"ttft_p{p:g}_ms"] = 1e3 * float(np.percentile(self.ttft, p))
            out[f"tpot_p{p:g}_ms"] = 1e3 * float(np.percentile(tpot, p)) if len(tpot) else 0.0
            out[f"e2e_p{p:g}_ms"] = 1e3 * float(np.percentile(self.finish - self.arrival, p))
        return out


def arrivals(n: int, rate: float | None, seed: int = 0) -> np.ndarray:
    """Poisson arrival times of ``n`` requests at ``rate``/s (None or inf: all at 0, MLPerf Offline)."""
    if rate is None or not math.isfinite(rate):
        return np.zeros(n)
    gaps = np.random.default_rng([seed, 1]).exponential(1.0 / rate, n)
    return np.cumsum(gaps) - gaps[0]


def _check(sched: Scheduler, inp, out) -> None:
    """Every request fits the pool alone (``Scheduler.reserved`` / ``blocks``, over the arrays at once)."""
    inp, out = np.asarray(inp).astype(np.int64), np.asarray(out).astype(np.int64)
    tokens = inp + (np.maximum(out, sched.max_new_tokens) if sched.reserve_full else out)
    need = int(np.max(-(-tokens // sched.block)))
    if need > sched.kv_blocks:
        raise ValueError(f"a request of {need} KV blocks never fits the pool of {sched.kv_blocks}")


def simulate_reference(cost: IterationCost, sched: Scheduler, arrival, inp, out) -> SimResult:
    """The scheduler one iteration and one request at a time (plain Python, for checking ``simulate``)."""
    _check(sched, inp, out)
    n = len(arrival)
    first, finish = np.full(n, np.nan), np.full(n, np.nan)
    waiting, running = deque(), []  # running: dicts in admission order
    free, t, nxt, iterations, preemptions = sched.kv_blocks, 0.0, 0, 0, 0
    run_left = 0  # decode iterations left in the multi-step run before the scheduler runs again
    idle_call = True  # the previous scheduler call admitted nothing (the prefill gate's alternation)
    gen = [0] * n
    while nxt < n or waiting or running:
        while nxt < n and arrival[nxt] <= t:
            waiting.append({"id": nxt, "target": int(inp[nxt]), "done": 0})
            nxt += 1
        admit = not run_left
        if admit and sched.prefill_min_waiting:  # a scheduler call under the prefill gate
            admit = len(running) < sched.max_running and (len(waiting) >= sched.prefill_min_waiting or idle_call)
            idle_call = not admit
        while admit and waiting and len(running) < sched.max_running:
            r = waiting[0]
            held = sched.reserved(inp[r["id"]], out[r["id"]]) if sched.reserve_full else r["target"]
            need = sched.blocks(held)
            if need > free:
                break
            waiting.popleft()
            free -= need
            r.update(blocks=need, pos=0)
            running.append(r)
        if not running:
            if run_left or waiting:  # the run's batch is gone, or the gate held prompts: the scheduler runs
                run_left = 0
                continue
            t = max(t, float(arrival[nxt]))
            continue
        prefilling = [r for r in running if r["done"] < r["target"]]
        decode = not (sched.prefill_priority and prefilling)
        while decode and not sched.reserve_full:  # blocks for the decode tokens, evicting the latest admitted
            need = sum(1 for r in running if r["done"] == r["target"] and r["pos"] % sched.block == 0)
            if need <= free:
                free -= need
                for r in running:
                    if r["done"] == r["target"] and r["pos"] % sched.block == 0:
                        r["blocks"] += 1
                break
            victim = running.pop()
            free += victim["blocks"]
            preemptions += 1
            victim.update(target=int(inp[victim["id"]]) + gen[victim["id"]], done=0)
            waiting.appendleft(victim)
            prefilling = [r for r in running if r["done"] < r["target"]]
            decode = not (sched.prefill_priority and prefilling)
        decoders = [r for r in running if r["done"] == r["target"]] if decode else []
        tokens = len(decoders)
        flops = sum(r["pos"] for r in decoders) * cost.ctx_flops
        nbytes = sum(r["pos"] for r in decoders) * cost.ctx_bytes
        chunks, shapes = [], []
        placed = sched.chunks(tokens, [r["target"] - r["done"] for r in prefilling])
        for r, (c, step) in zip(prefilling, placed):
            f, b = cost.chunk_flops * c * (r["done"] + c / 2.0), cost.ctx_bytes * r["done"]
            flops += f
            nbytes += b
            tokens += c
            chunks.append((r, c))
            shapes.append((c, float(r["done"] + c == r["target"]), f, b, step))
        completing = sum(1 for r, c in chunks if r["done"] + c == r["target"])
        t += cost.time(tokens, len(decoders) + completing, flops, nbytes, len(decoders) + len(chunks), shapes)
        iterations += 1
        if decoders and not chunks:  # a decode iteration: inside a run, or the first of one
            run_left = run_left - 1 if run_left else sched.multi_step - 1
        free += sum(r["blocks"] for r in end_iteration(t, decoders, chunks, running, gen, out, first, finish))
    return SimResult(np.asarray(arrival, float), first, finish, np.asarray(inp), np.asarray(out), iterations,
                     preemptions)


def end_iteration(t: float, decoders: list, chunks: list, running: list, gen: list, out, first, finish) -> list:
    """What an iteration of ``simulate_reference`` ending at ``t`` leaves (its request dicts, ``gen``
    each request's tokens so far): every decoder one token on, each chunk's prompt that far on, a
    prompt's last chunk its first token (stamped once: a preempted request's recompute keeps its
    first), and the requests whose last token it was finished at ``t`` and out of ``running``:
    returned, their blocks for the caller to free. One call an iteration."""
    for r in decoders:
        r["pos"] += 1
        gen[r["id"]] += 1
    for r, c in chunks:
        r["done"] += c
        if r["done"] == r["target"]:
            r["pos"] = r["target"]
            gen[r["id"]] += 1
            if np.isnan(first[r["id"]]):
                first[r["id"]] = t
    gone = [r for r in running if gen[r["id"]] >= out[r["id"]]]
    for r in gone:
        finish[r["id"]] = t
        running.remove(r)
    return gone


def simulate(cost: IterationCost, sched: Scheduler, arrival, inp, out) -> SimResult:
    """``simulate_reference``'s scheduler with aggregated decode state and decode-only stretches
    priced at once (the search runs this one).

    Written for speed (``validate --inference`` runs it ~600 times over ~20,000 requests each) with
    the float operations of the plain version, in the same order, so its times are the same to the
    last bit: without PP (one micro-batch step, an ``IterationCost``) an iteration's prompt chunks
    and its price are computed by ``_pp1_iteration`` (``Scheduler.chunks`` and ``IterationCost.time``
    written out; a PP layout or another cost calls them); the finishing decodes are a heap of integer keys
    ``finish counter x n + id`` (an entry is stale unless its request still decodes towards that
    counter); a stretch's bound from the next arrival takes its first iteration from
    ``IterationCost.decode_floor`` (a bound only: the stretch ends where the arrival is, computed
    as before). The loop is ``_Replay.run``; its steps are commented there, or functions of their
    own where a call costs little (``_Replay``'s methods, ``_pp1_iteration``)."""
    _check(sched, inp, out)
    if sched.dp > 1:  # attention-DP ranks in lock-step
        from autoparallel.serve.attention_dp import simulate_ranks
        return simulate_ranks(cost, sched, arrival, inp, out)
    return _Replay(cost, sched, arrival, inp, out).run()


class _Replay:
    """One ``simulate`` run: the requests' state as lists indexed by request id, the decoding
    requests aggregated (a count, a context sum, the blocks they need by iteration residue, a heap
    of finish counters). A class so that ``run``'s loop and the steps split out of it (an
    iteration's chunks and price, a preemption, a decode-only stretch) share those lists."""

    def __init__(self, cost: IterationCost, sched: Scheduler, arrival, inp, out):
        n = self.n = len(arrival)
        self.arrival_in, self.inp_in, self.out_in = arrival, inp, out
        self.arrival = np.asarray(arrival, float).tolist()
        inp_a, out_a = np.asarray(inp).astype(np.int64), np.asarray(out).astype(np.int64)
        self.inp, self.out = inp_a.tolist(), out_a.tolist()
        self.first, self.finish = [math.nan] * n, [math.nan] * n
        B = self.B = sched.block
        self.full = sched.reserve_full
        # blocks a full reservation holds per request (``Scheduler.reserved`` / ``blocks``, over the arrays)
        self.need_full = ((-(-(inp_a + np.maximum(out_a, sched.max_new_tokens)) // B)).tolist()
                          if self.full else None)
        self.gen, self.target, self.done, self.held = [0] * n, [0] * n, [0] * n, [0] * n
        self.d0, self.p0 = [0] * n, [0] * n  # decode entry: counter, cached positions
        self.fin = [0] * n  # the counter a decoding request finishes at
        self.residue = [0] * n  # the ``cnt`` slot of a decoding request
        self.phase = [0] * n  # 0 waiting / gone, 1 prefilling, 2 decoding
        self.waiting, self.prefilling, self.order = deque(), deque(), []
        self.heap: list[int] = []  # fin[r] * n + r of each decode entry (stale ones included, skipped when popped)
        self.cnt = [0] * B  # decoding requests needing a new block at decode iteration D where D % B == residue
        self.cost, self.sched, self.pipelined = cost, sched, cost.pp > 1
        self.ctx_flops, self.ctx_bytes, self.chunk_flops = cost.ctx_flops, cost.ctx_bytes, cost.chunk_flops
        self.inline = type(cost) is IterationCost and cost.pp == 1 and sched.steps == 1
        self.decode_floor = cost.decode_floor if isinstance(cost, IterationCost) else None
        self.counters = np.arange(0, dtype=float)  # 0, 1, ... (grown as needed): a stretch's iterations

    def run(self) -> SimResult:
        """Iterations until every request has arrived and finished. The steps every iteration takes
        (admission, the decode blocks, the decode step and its finishers, the completed prompts,
        the stretch's checks) stay in this loop, its state in local variables: a method per step,
        its state on ``self``, made the benchmark's runs ~25 % slower (session 53,
        bench_issue29_serving.py's cases). The iteration's chunks and price (one call an
        iteration, its constants bound in a closure), a preemption and a decode-only stretch (rare,
        or numpy's) are functions of their own."""
        n, B, full, sched = self.n, self.B, self.full, self.sched
        max_running, prefill_priority = sched.max_running, sched.prefill_priority
        arrival, inp, out, need_full, first, finish = self.arrival, self.inp, self.out, self.need_full, self.first, self.finish
        gen, target, done, held, d0, p0, fin, residue, phase = (self.gen, self.target, self.done, self.held, self.d0,
                                                                self.p0, self.fin, self.residue, self.phase)
        waiting, prefilling, order, heap, cnt = self.waiting, self.prefilling, self.order, self.heap, self.cnt
        iterate = (_pp1_iteration(self.cost, sched, prefilling, done, target) if self.inline
                   else self._iterate_general)
        inf = math.inf
        n_dec, ctx_sum, D = 0, 0, 0
        free, t, nxt, iterations, preemptions, running = sched.kv_blocks, 0.0, 0, 0, 0, 0
        multi_step, run_left = sched.multi_step, 0  # as ``simulate_reference``'s
        gate, idle_call = sched.prefill_min_waiting, True
        while nxt < n or waiting or running:
            # Arrivals, then admission: the queue's head joins while a slot and its blocks are free.
            while nxt < n and arrival[nxt] <= t:
                waiting.append(nxt)
                target[nxt] = inp[nxt]
                nxt += 1
            admit = not run_left
            if admit and gate:  # a scheduler call under the prefill gate
                admit = running < max_running and (len(waiting) >= gate or idle_call)
                idle_call = not admit
            while admit and waiting and running < max_running:
                r = waiting[0]
                need = need_full[r] if full else -(-target[r] // B)
                if need > free:
                    break
                waiting.popleft()
                free -= need
                held[r], phase[r], done[r] = need, 1, 0
                prefilling.append(r)
                order.append(r)
                running += 1
            if not running:
                if run_left or waiting:  # the run's batch is gone, or the gate held prompts: the scheduler runs
                    run_left = 0
                    continue
                t = max(t, arrival[nxt])
                continue
            # The decode tokens' new blocks (allocate-as-you-go), evicting while the pool is short.
            decode = not (prefill_priority and prefilling)
            while decode and not full:
                need = cnt[(D + 1) % B]
                if need <= free:
                    free -= need
                    break
                free, running, n_dec, ctx_sum = self._evict(D, free, running, n_dec, ctx_sum)
                preemptions += 1
                decode = not (prefill_priority and prefilling)
            decodes = n_dec if decode else 0
            step, ended, chunked = iterate(decodes, ctx_sum)  # the price, the prompts completed, the chunks
            t += step
            iterations += 1
            if decodes and not chunked:  # a decode iteration: in a multi-step run or its first
                run_left = run_left - 1 if run_left else multi_step - 1
            if decodes:  # every decoding request one token on; those whose last token it was finish
                D += 1
                ctx_sum += n_dec
                below = (D + 1) * n  # the keys of entries finishing at D or before
                while heap and heap[0] < below:
                    f, r = divmod(heappop(heap), n)
                    if phase[r] != 2 or fin[r] != f:  # stale: left decoding since (preempted)
                        continue
                    finish[r] = t
                    pos = p0[r] + (D - d0[r])  # out of the decode aggregate, its blocks freed (as in _evict)
                    n_dec -= 1
                    ctx_sum -= pos
                    cnt[residue[r]] -= 1
                    free += held[r] if full else -(-pos // B)
                    phase[r] = 0
                    running -= 1
            for r in ended:  # their first token: a one-token answer finishes, the others start decoding
                gen[r] += 1
                if first[r] != first[r]:  # NaN: its first token
                    first[r] = t
                if gen[r] >= out[r]:
                    finish[r] = t
                    free += held[r]  # release of a prefilling request
                    phase[r] = 0
                    running -= 1
                    continue
                phase[r], d0[r], p0[r] = 2, D, target[r]
                residue[r] = (D + 1 - target[r]) % B
                cnt[residue[r]] += 1
                n_dec += 1
                ctx_sum += target[r]
                fin[r] = D + out[r] - gen[r]
                heappush(heap, fin[r] * n + r)
            # Decode-only stretch: no prompt to prefill and nothing the next iterations could admit.
            if prefilling or not n_dec or not heap:
                continue
            if multi_step > 1:  # the rest of the run (admitting nothing); a run's first iteration comes above
                horizon = inf
                if not run_left:
                    continue
            elif gate:  # every iteration is a scheduler call that moves the gate's alternation
                continue
            elif waiting:
                head = waiting[0]
                need = need_full[head] if full else -(-target[head] // B)
                if running < max_running and need <= free:
                    continue
                horizon = inf
            else:
                horizon = arrival[nxt] if nxt < n else inf
                if horizon <= t:
                    continue
            k = heap[0] // n - D - 1  # stop one iteration before the first finish
            if multi_step > 1:
                k = min(k, run_left)
            if k > 0:
                k, span, used = self._stretch(k, horizon, t, D, n_dec, ctx_sum, free)
                t += span
                iterations += k
                D += k
                ctx_sum += k * n_dec
                free -= used
                if multi_step > 1:
                    run_left -= k
        return SimResult(np.asarray(self.arrival_in, float), np.asarray(first), np.asarray(finish),
                         np.asarray(self.inp_in), np.asarray(self.out_in), iterations, preemptions)

    def _evict(self, D: int, free: int, running: int, n_dec: int, ctx_sum: int) -> tuple[int, int, int, int]:
        """vLLM's recompute preemption: the latest admitted request still running gives its blocks
        back and re-joins the front of the queue, to prefill its prompt and the tokens it has
        generated again (``order`` keeps the admissions; requests gone since are skipped). Takes and
        returns ``run``'s pool and decode aggregate: free blocks, running, decoding, context sum."""
        order, phase = self.order, self.phase
        victim = order.pop()
        while phase[victim] == 0:
            victim = order.pop()
        positions = self.p0[victim] + (D - self.d0[victim])
        if phase[victim] == 2:  # out of the decode aggregate, its tokens so far counted
            self.gen[victim] += D - self.d0[victim]
            n_dec -= 1
            ctx_sum -= positions
            self.cnt[self.residue[victim]] -= 1
        else:
            self.prefilling.remove(victim)
        free += self.held[victim] if (self.full or phase[victim] == 1) else -(-positions // self.B)
        phase[victim] = 0
        self.target[victim] = self.inp[victim] + self.gen[victim]
        self.waiting.appendleft(victim)
        return free, running - 1, n_dec, ctx_sum

    def _iterate_general(self, decodes: int, ctx_sum: int) -> tuple[float, list[int], int]:
        """One iteration of a PP layout or of another cost: its seconds, the prompts it
        completes (out of ``prefilling``) and its prompt chunks. ``Scheduler.chunks`` places the chunks and ``cost.time``
        prices them (with PP, each chunk's shape and micro-batch step)."""
        prefilling, done, target = self.prefilling, self.done, self.target
        chunk_flops, ctx_bytes, pipelined = self.chunk_flops, self.ctx_bytes, self.pipelined
        tokens = decodes
        flops = (ctx_sum * self.ctx_flops) if decodes else 0.0
        nbytes = (ctx_sum * ctx_bytes) if decodes else 0.0
        completing, chunks, shapes = 0, [], []
        placed = self.sched.chunks(tokens, (target[r] - done[r] for r in prefilling))  # read up to the budget
        for r, (c, step) in zip(prefilling, placed):
            f, b = chunk_flops * c * (done[r] + c / 2.0), ctx_bytes * done[r]
            flops += f
            nbytes += b
            tokens += c
            chunks.append((r, c))
            ends = done[r] + c == target[r]
            completing += ends
            if pipelined:
                shapes.append((c, float(ends), f, b, step))
        seconds = self.cost.time(tokens, decodes + completing, flops, nbytes, decodes + len(chunks), shapes)
        ended = []
        for r, c in chunks:
            done[r] += c
            if done[r] < target[r]:
                continue
            if prefilling[0] == r:  # chunks run in admission order: a finished prompt is the first,
                prefilling.popleft()
            else:  # except where a later micro-batch step finished a later prompt (PP)
                prefilling.remove(r)
            ended.append(r)
        return seconds, ended, len(chunks)

    def _stretch(self, k: int, horizon: float, t: float, D: int, n_dec: int, ctx_sum: int,
                 free: int) -> tuple[int, float, int]:
        """Decode-only iterations priced at once (numpy, by ``IterationCost.decode_times``), where
        nothing can change the batch: at most ``k`` (one before the first finish), fewer where the
        next arrival (at ``horizon``) or the free blocks come first. Returns how many, their
        seconds and the blocks they take (0, 0.0, 0: none)."""
        cost, full, B = self.cost, self.full, self.B
        if horizon < math.inf:  # iterations only get longer: at most this many start before the arrival
            first_step = (self.decode_floor(n_dec, ctx_sum) if self.decode_floor is not None
                          else cost.decode_times(n_dec, np.array([float(ctx_sum)]))[0])
            k = min(k, int((horizon - t) / first_step) + 2)
        if not full:  # as many as the free blocks last: cnt repeats every B iterations, n_dec blocks a round
            s = (D + 1) % B
            ring = list(itertools.accumulate(self.cnt[s:] + self.cnt[:s]))
            rounds, rest = divmod(free, n_dec)
            k = min(k, rounds * B + bisect.bisect_right(ring, rest))
            if k <= 0:
                return 0, 0.0, 0
        if k > len(self.counters):
            self.counters = np.arange(max(k, 2 * len(self.counters)), dtype=float)
        times = cost.decode_times(n_dec, ctx_sum + n_dec * self.counters[:k])
        if horizon < math.inf:  # the iterations that start before the arrival (the first starts at t < horizon)
            k = 1 + int(np.searchsorted(t + np.cumsum(times[:k - 1]), horizon, side="left"))
        used = (k - 1) // B * n_dec + ring[(k - 1) % B] if not full else 0
        return k, float(np.sum(times[:k])), used


def _pp1_iteration(cost: IterationCost, sched: Scheduler, prefilling: deque, done: list, target: list):
    """``simulate``'s iteration without PP (one micro-batch step, an ``IterationCost``): a function
    of the decode count and context sum giving the iteration's seconds, the prompts it
    completes and its prompt chunks. ``Scheduler.chunks`` and ``IterationCost.time`` at pp = 1 written out, their
    constants bound here once: the hot path of every search, where a method reading them off
    ``self`` at each call measured a few % slower than this closure."""
    budget, chunked, chunk_flops, ctx_flops, ctx_bytes = (sched.budget, sched.chunked, cost.chunk_flops,
                                                          cost.ctx_flops, cost.ctx_bytes)
    per_tokens, per_sampled, hop, pass_s, max_t, max_s, per_flop, per_byte, kk, inv_k = (
        cost.per_tokens, cost.per_sampled, cost.hop, cost.pass_s, cost.max_tokens, cost.max_seqs, cost.per_flop,
        cost.per_byte, cost.k, 1.0 / cost.k)

    def iterate(decodes: int, ctx_sum: int) -> tuple[float, list[int], int]:
        # the chunks: the first prompts, each whole but the last (which may stop at the budget), so
        # the completed ones are the first ``completing`` of ``prefilling``, popped here
        tokens = decodes
        flops = (ctx_sum * ctx_flops) if decodes else 0.0
        nbytes = (ctx_sum * ctx_bytes) if decodes else 0.0
        ended, chunked_n, last = [], 0, 0
        for r in prefilling:
            dr = done[r]
            rem = target[r] - dr
            left = budget - tokens
            c = (rem if rem <= left else left) if chunked else (rem if rem <= left or tokens == 0 else 0)
            if c <= 0:
                break
            flops += chunk_flops * c * (dr + c / 2.0)
            nbytes += ctx_bytes * dr
            tokens += c
            chunked_n += 1
            last = c
            if c == rem:
                ended.append(r)
        completing = len(ended)
        if chunked_n > completing:  # the last chunk, short of its prompt's end
            done[prefilling[completing]] += last
        for _ in ended:
            prefilling.popleft()
        # IterationCost.time at pp = 1 (one micro-batch: its divisions by 1 and products by 1 are exact)
        tm = tokens if tokens < max_t else max_t
        sm = decodes + completing
        if sm > max_s:
            sm = max_s
        a, b = flops * per_flop, nbytes * per_byte
        if a > b:  # IterationCost.attention: (hi / hi) ** k is 1.0 exactly
            att = a * (1.0 + (b / a) ** kk) ** inv_k if a > 0 else 0.0
        else:
            att = b * ((a / b) ** kk + 1.0) ** inv_k if b > 0 else 0.0
        return per_tokens[tm] + per_sampled[sm] + att + hop[tm] + pass_s, ended, chunked_n

    return iterate


def replica(model: ModelSpec, hw: HardwareSpec, eff: InferenceEfficiency, engine: ServingEngine, tp: int, pp: int,
            max_batch: int, max_num_tokens: int, weight_precision: str, kv_precision: str, ep: int = 1,
            longest: int = 0, max_new_tokens: int = 0, attention_dp: bool = False,
            adp_balance: tuple = ()) -> tuple[IterationCost, Scheduler]:
    """The iteration cost and scheduler of one replica of a layout, its KV pool as
    ``costmodel.inflight.kv_pool`` allocates it; ``longest``: the longest request (tokens);
    ``max_new_tokens``: the requests' ``max_tokens`` (what a full reservation holds; 0: each
    request's own output). ``attention_dp`` (``costmodel.inference.layout``): the ``tp``
    attention-DP ranks of one TP group as one replica run in lock-step (``serve.attention_dp``),
    each with its own scheduler, ``max_batch``, ``max_num_tokens`` and KV pool (the engine's
    per-rank limits: the scheduler's are one rank's, its ``dp`` the ranks), its cost one rank's
    (``per_moe``: the MoE part on every rank's tokens); ``adp_balance``: the executor's context
    balancing (batching_wait_iters, timeout_iters; (): off). With PP (not simulated in lock-step) the
    replica is one rank, the others assumed its mirror image: the TP group is ``tp / sched.dp`` replicas."""
    from autoparallel.costmodel.inflight import kv_pool
    lay = layout(model, hw, eff, float(tp), float(pp), weight_precision, kv_precision, float(ep),
                 attention_dp=attention_dp)
    pool = float(np.ravel(kv_pool(lay, engine, float(max_batch), float(max_num_tokens))["pool"])[0])
    running = None
    if model.is_hybrid:  # the running requests' Mamba states set apart, the rest paged K/V
        running, pool = mamba_serving.reserve_states(lay, engine, pool, max_batch * pp, longest)
    blocks = int(pool // (engine.kv_block_tokens * float(np.ravel(lay.kv_bytes_per_token())[0])))
    sched = Scheduler.of(engine, max_batch, max_num_tokens, pp, blocks, max_new_tokens)
    if running is not None:
        sched = dataclasses.replace(sched, max_running=running)
    if attention_dp and pp == 1:  # with PP the ranks stay apart: each a replica, the others its mirror image
        sched = dataclasses.replace(sched, dp=int(tp), adp_balance=tuple(int(x) for x in adp_balance))
    cost = IterationCost(model, hw, eff, tp, pp, weight_precision, kv_precision, ep,
                         max(max_num_tokens, longest), sched.max_running, engine, attention_dp)
    return cost, sched


def run_workload(cost: IterationCost, sched: Scheduler, workload, rate: float | None, requests: int = 5000,
                 seed: int = 0) -> SimResult:
    """``requests`` of ``workload`` (a ``serve.workload.Workload``) arriving as a Poisson process
    at ``rate``/s for this replica (None: all at once, MLPerf Offline)."""
    inp, out = workload.sample(requests, seed)
    return simulate(cost, sched, arrivals(requests, rate, seed), inp, out)
