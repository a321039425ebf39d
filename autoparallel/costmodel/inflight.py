"""Steady state of an in-flight (continuous) batching engine (pure numpy).

TensorRT-LLM, vLLM and SGLang run one forward pass ("iteration") after another over a running
batch that requests join and leave at every iteration. This module prices that steady state
for columns of candidates, using the per-stage pass and memory terms of
``costmodel.inference``. What the engines do, and how it is modelled:

- **Paged KV cache.** After weights, the activations of one iteration (``max_num_tokens``
  tokens) and the reserve, the engine turns a fraction of the memory into a pool of blocks of
  ``kv_block_tokens`` tokens (TensorRT-LLM: ``kv_cache_free_gpu_mem_fraction`` of the free
  memory; vLLM: ``gpu_memory_utilization`` of the whole GPU). A request holds whole blocks:
  TensorRT-LLM's GUARANTEED_NO_EVICT reserves ceil((input + output) / block) when it admits
  it; vLLM allocates as tokens arrive, ceil((input + output / 2) / block) on average. The
  requests in flight are ``min(pp * max_batch, blocks / blocks per request)`` (each of the
  ``pp`` micro-batches holds up to ``max_batch``).
- **Token budget and chunked prefill.** Each iteration processes one token of every decoding
  request first, then prompt tokens up to ``max_num_tokens`` (TensorRT-LLM's
  MicroBatchScheduler, vLLM's chunked-prefill scheduler). With chunking a prompt is split over
  iterations (first come, first served); without it a whole prompt must fit.
- **Steady state** (a fluid model): every iteration ``lam`` requests finish and ``lam`` start,
  so it holds ``p = lam * input`` prompt tokens and ``d = lam * (output - 1)`` decode tokens
  (the prefill yields the first output token). ``lam`` is the largest rate both limits allow:
  ``p + d <= max_num_tokens`` and ``lam * (prefill iterations + output - 1) <= requests in
  flight``. A prompt takes ``max(1, input / (max_num_tokens - d))`` iterations.
- **Iteration time**: ``stage_pass`` over ``p + d`` tokens, causal attention of ``lam`` whole
  prompts (chunks re-read the K/V of earlier chunks), ``d`` decode reads of the KV cache at the
  mean context ``input + output / 2``; with PP the ``pp`` micro-batches follow each other
  through the stages, so a request's token takes ``max(m, pp)`` stage times.
- **Metrics**: output tokens/s = ``m * lam * output / iteration``; TPOT = the mean iteration
  time (every running request advances one token per iteration, prompt chunks included);
  TTFT = the prompt's prefill iterations, each as heavy as the budget allows (its chunk of
  ``min(input, max_num_tokens - d)`` tokens beside the decode tokens; + half an iteration of
  waiting under a request rate); e2e = TTFT + (output - 1) x TPOT.

Load: unbounded arrival (offline max throughput, ``request_rate`` NaN or inf) keeps the
running batch full: TTFT then counts from admission into the running batch (a request queued
outside it waits for a free slot, which offline benchmarks never stop adding). A finite
``request_rate`` (requests/s per replica) below the capacity solves the iteration time
``tau = time(lam = rate * tau / m)`` by bisection; at or above the capacity the row is
``overloaded`` (the queue grows without bound).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from autoparallel.costmodel import mamba_serving
from autoparallel.costmodel.inference import (PASS_KEYS, InferenceEfficiency, PassWork, ServingEngine,
                                              decode_attention, layout, pass_work, prefill_attention,
                                              price_hop, price_pass)
from autoparallel.costmodel.memory import GIB
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

INFLIGHT_COLUMNS = ("tp", "pp", "max_batch", "max_num_tokens", "input_len", "output_len",
                    "weight_precision", "kv_precision")
#: Optional columns: ``max_model_len`` (default input + output: the engine refuses to start
#: unless one such sequence fits in the KV pool), ``request_rate`` (requests/s per replica) and
#: ``ep`` (expert parallel size of a MoE model, default 1).
INFLIGHT_KEYS = ("concurrency", "kv_capacity_requests", "decode_batch", "prefill_tokens_per_iteration",
                 "capacity_requests_per_s", "overloaded")
_FIXED_POINT_STEPS = 8
#: What the engines' pool sizing leaves out besides their own tensors, from TensorRT-LLM's
#: documented H100 log (NVIDIA/TensorRT-LLM@7ff53023 docs/source/reference/memory.md, FAQ 1):
#: cudaMemGetInfo's total is 79.10 GiB and 70.48 GiB are free once the engine (6,678 MiB of
#: weights), its execution-context (activation) memory (1,134.01 MiB), runtime buffers (43.29 MB)
#: and decoder (180.30 MB) exist. ``DRIVER_HELD_GIB``: the presets' ``memory_gib`` (nvidia-smi's
#: 81,559 MiB = 79.65 GiB on h100-sxm) less cudaMemGetInfo's total. ``CONTEXT_GIB``: the CUDA
#: context and the libraries' handles and workspaces (cuBLAS / cuBLASLt): 79.10 - 70.48 - 7.85.
#: They replace the training ``hw.reserve_gib`` (4 GiB, a guess that also covers NCCL's buffers
#: and the allocator's fragmentation) in the pool's sizing of a one-GPU engine. An engine over
#: several GPUs also holds NCCL's communicators (TensorRT-LLM's all-reduce plugin makes them when
#: the engine is deserialized, before the pool is sized): no measurement of what they take under
#: TensorRT-LLM was found, so such an engine keeps ``hw.reserve_gib`` as the whole of it.
DRIVER_HELD_GIB = 0.55
CONTEXT_GIB = 0.77
_BISECTION_STEPS = 40


def kv_pool(lay, engine: ServingEngine, max_batch, max_num_tokens) -> dict[str, np.ndarray]:
    """Bytes per GPU of weights, activations, reserve and the KV pool the engine allocates."""
    memory = lay.hw.memory_gib * GIB
    weights = lay.weights()
    activations = (max_num_tokens * lay.activations_per_token()
                   + lay.logits(np.minimum(max_batch, max_num_tokens)))
    # TensorRT-LLM (``free``): the fraction of what cudaMemGetInfo reports free after the engine,
    # its buffers, the CUDA context and NCCL's communicators exist. vLLM (``total``): the fraction
    # of cudaMemGetInfo's total less the peak measured from the free memory once the context was
    # made (vllm/worker/worker.py determine_num_available_blocks: init_gpu_memory - free), which
    # counts the weights, the profiled activations and NCCL (set up after that first reading).
    r = lay.hw.reserve_gib
    held, context = min(DRIVER_HELD_GIB, r) * GIB, min(CONTEXT_GIB, r) * GIB
    nccl = np.where(lay.tp * lay.pp * lay.ep > 1, max(r - DRIVER_HELD_GIB - CONTEXT_GIB, 0.0) * GIB, 0.0)
    reserve = held + context + nccl
    f = engine.kv_memory_fraction
    if engine.kv_memory == "free":
        pool = f * (memory - reserve - weights - activations)
    else:
        pool = f * (memory - held) - weights - activations - nccl
    fixed = weights + activations + reserve
    return {"weights": weights, "activations": activations, "reserve": reserve,
            "pool": np.maximum(pool, 0.0), "fixed_fits": fixed < memory}


class Steady(NamedTuple):
    """``InflightBatch.steady``: one iteration of the running batch (time ``tau``, its stage parts
    and pipeline hop) with ``lam`` requests finishing per iteration, their prompts' ``n_pre``
    prefill iterations, the capacity (requests/s per replica) and which rows are overloaded or
    below it at their request rate; ``pass_s``: the host's overhead per iteration."""

    pass_s: np.ndarray
    lam: np.ndarray
    tau: np.ndarray
    n_pre: np.ndarray
    stage: dict
    hop: np.ndarray
    capacity: np.ndarray
    overloaded: np.ndarray
    below: np.ndarray


def estimate_inflight_columns(model: ModelSpec, hw: HardwareSpec, eff: InferenceEfficiency,
                              engine: ServingEngine, cols: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Predict in-flight batching layouts (``INFLIGHT_COLUMNS`` -> arrays).

    Returns ``inference.OUTPUT_KEYS`` (throughput, TTFT, TPOT, e2e, memory, one iteration's
    parts) plus ``INFLIGHT_KEYS``. ``kv_cache_gib`` is the pool the engine allocates, so
    ``memory_per_gpu_gib`` is its whole footprint.
    """
    return InflightBatch(model, hw, engine, cols).estimate(eff)


class InflightBatch:
    """The steady state of in-flight layouts up to the fitted constants (``estimate`` prices it).

    Why apart: the KV pool, the requests in flight, the saturated composition of an iteration
    (``lam``, the prefill iterations) and the work of its passes depend on the model, the GPU, the
    engine and the columns alone. A serving fit prices the same rows under thousands of trial
    constants, so it builds this once per group of rows and calls ``estimate`` per trial (as
    training reprices ``candidates.on_hardware``). Its layout holds no constants (``lay.eff`` is
    None), so nothing built here can depend on them.
    """

    def __init__(self, model: ModelSpec, hw: HardwareSpec, engine: ServingEngine, cols: Mapping[str, np.ndarray]):
        f64 = lambda k: np.asarray(cols[k], dtype=float)  # noqa: E731
        self.engine = engine
        s_in, s_out = self.s_in, self.s_out = f64("input_len"), f64("output_len")
        max_batch, budget = f64("max_batch"), f64("max_num_tokens")
        n = self.n = np.broadcast_shapes(s_in.shape, max_batch.shape, np.shape(cols["tp"]))
        model_len = f64("max_model_len") if "max_model_len" in cols else s_in + s_out
        self.rate = f64("request_rate") if "request_rate" in cols else np.full(n, np.nan)
        lay = self.lay = layout(model, hw, None, cols["tp"], cols["pp"], cols["weight_precision"],
                                cols["kv_precision"], cols["ep"] if "ep" in cols else 1, engine)
        pp = lay.pp

        # --- KV pool and requests in flight ------------------------------------------------
        mem = self.mem = kv_pool(lay, engine, max_batch, budget)
        block = engine.kv_block_tokens
        held = s_in + s_out if engine.kv_reservation == "full" else s_in + 0.5 * s_out
        if model.is_hybrid:  # KV blocks and each request's Mamba states from one pool
            self.kv_requests, fits = mamba_serving.admission(lay, engine, mem["pool"], held, model_len)
            self.fits = mem["fixed_fits"] & fits
        else:
            blocks = np.floor(mem["pool"] / (block * lay.kv_bytes_per_token()))
            self.kv_requests = np.floor(blocks / np.ceil(held / block))
            self.fits = mem["fixed_fits"] & (blocks >= np.ceil(model_len / block))
        self.concurrency = np.maximum(np.minimum(pp * max_batch, self.kv_requests), 1.0)
        m = self.m = np.minimum(pp, self.concurrency)  # micro-batches in flight
        per_mb = self.concurrency / m

        # --- composition of one iteration at saturation ------------------------------------
        self.tokens_cap = budget if engine.chunked_prefill else np.maximum(budget, s_in)
        self.decode_steps = np.maximum(s_out - 1.0, 0.0)
        n_pre = self.prefill_iterations(np.zeros(n))
        for _ in range(_FIXED_POINT_STEPS):
            lam_sat = np.minimum(self.tokens_cap / (s_in + self.decode_steps), per_mb / (n_pre + self.decode_steps))
            n_pre = self.prefill_iterations(lam_sat)
        self.lam_sat, self.n_pre_sat = lam_sat, n_pre

        self.ctx = s_in + 0.5 * s_out
        self.kv_token_layer = lay.kv_bytes_per_token() / np.maximum(lay.attention_layers, 1.0)  # (a hybrid may have none)
        self.slots = np.maximum(m, pp)
        self.saturated = self.work(lam_sat, n_pre)
        self.saturated_first = self.work(lam_sat, n_pre, self.first_prompts(lam_sat))

    def prefill_iterations(self, lam):
        """Iterations a prompt's prefill spans beside ``lam * (output - 1)`` decode tokens."""
        if not self.engine.chunked_prefill:
            return np.ones_like(lam)
        return np.maximum(1.0, self.s_in / np.maximum(self.tokens_cap - lam * self.decode_steps, 1.0))

    def first_prompts(self, lam):
        """Prompts' worth of prefill tokens in an iteration of a prompt's prefill: its chunk as heavy
        as the budget leaves after the decode tokens (iterations with a prompt are the heavy ones)."""
        s_in = self.s_in
        chunk = (np.minimum(s_in, self.tokens_cap - lam * self.decode_steps) if self.engine.chunked_prefill
                 else s_in)
        return np.maximum(chunk / s_in, lam)

    def work(self, lam, n_pre, prompts=None) -> PassWork:
        """One micro-batch's pass over one stage (``inference.pass_work``): ``lam`` requests finish
        per iteration (``lam * (output - 1)`` decode tokens); ``prompts`` (default ``lam``):
        prompts' worth of prefill tokens in this iteration."""
        lay, s_in = self.lay, self.s_in
        prompts = lam if prompts is None else prompts
        d = lam * self.decode_steps
        tokens = prompts * s_in + d
        pre_flops, _ = prefill_attention(lay, prompts, s_in)
        reread = prompts * s_in * (n_pre - 1.0) / 2.0 * self.kv_token_layer  # chunks read earlier chunks
        dec_flops, dec_bytes = decode_attention(lay, d, self.ctx)
        mamba_work = mamba_serving.pass_work(lay, prompts * s_in, prompts * n_pre, d) if lay.model.is_hybrid else None
        return pass_work(lay, tokens, d + prompts, pre_flops + dec_flops, reread + dec_bytes, mamba_work)

    def iteration(self, eff: InferenceEfficiency, pass_s, work: PassWork):
        """One micro-batch's pass of ``work`` over every stage under the constants ``eff``; a
        request's token takes ``slots`` stage times (and the ``m`` micro-batch steps' host
        overhead ``pass_s``). Returns (time, the stage's parts, the pipeline hop)."""
        stage = price_pass(eff, work)
        hop = price_hop(eff, work.hop)
        return self.slots * (stage["time"] + hop) + pass_s, stage, hop

    def steady(self, eff: InferenceEfficiency) -> Steady:
        """The running batch's steady state under the constants ``eff``: saturated, or, where a
        request rate below the capacity is given, at the iteration time that rate solves."""
        n, m, rate = self.n, self.m, self.rate
        # The host's pass overhead comes once per micro-batch step, not once per round: TensorRT-LLM's
        # last pipeline rank blocks in ``decoderSync`` on each micro-batch's forward and decoder before
        # it schedules and prepares the next one (trtGptModelInflightBatching.cpp ``forwardAsync``), so
        # its GPU idles through the host work of every step; without PP (m = 1) it is once a pass.
        pass_s = m * eff.pass_overhead_us * 1e-6

        def iteration(lam, n_pre, prompts=None):
            return self.iteration(eff, pass_s, self.work(lam, n_pre, prompts))

        tau_sat, stage, hop = self.iteration(eff, pass_s, self.saturated)
        capacity = m * self.lam_sat / tau_sat  # requests per second per replica
        lam, tau, n_pre = self.lam_sat, tau_sat, self.n_pre_sat

        loaded = np.isfinite(rate)
        overloaded = loaded & (rate >= capacity)
        below = loaded & ~overloaded
        if below.any():  # solve tau = time(rate * tau / m) on [time(0), tau_sat]
            lo = np.where(below, iteration(np.zeros(n), np.ones(n))[0], tau_sat)
            hi = tau_sat.copy()
            r = np.where(below, rate, 0.0)
            for _ in range(_BISECTION_STEPS):
                mid = 0.5 * (lo + hi)
                lam_mid = r * mid / m
                too_slow = iteration(lam_mid, self.prefill_iterations(lam_mid))[0] > mid
                lo, hi = np.where(too_slow, mid, lo), np.where(too_slow, hi, mid)
            lam_r = r * hi / m
            n_pre_r = self.prefill_iterations(lam_r)
            tau_r, stage_r, hop_r = iteration(lam_r, n_pre_r)
            pick = lambda a, b: np.where(below, a, b)  # noqa: E731
            lam, tau, n_pre = pick(lam_r, lam), pick(tau_r, tau), pick(n_pre_r, n_pre)
            stage = {k: pick(stage_r[k], stage[k]) for k in stage}
            hop = pick(hop_r, hop)
        return Steady(pass_s, lam, tau, n_pre, stage, hop, capacity, overloaded, below)

    def throughput(self, eff: InferenceEfficiency) -> np.ndarray:
        """``estimate``'s output tokens/s per replica alone (what a fit reads: no TTFT pass priced)."""
        return self._throughput(self.steady(eff))

    def _throughput(self, st: Steady) -> np.ndarray:
        """Output tokens/s per replica: an overloaded row serves its capacity."""
        return np.where(st.overloaded, st.capacity, self.m * st.lam / st.tau) * self.s_out

    def estimate(self, eff: InferenceEfficiency) -> dict[str, np.ndarray]:
        """``estimate_inflight_columns``' outputs under the constants ``eff``."""
        n, m, s_in = self.n, self.m, self.s_in
        decode_steps, slots = self.decode_steps, self.slots
        st = self.steady(eff)
        pass_s, lam, tau, n_pre, stage, hop, capacity, overloaded, below = st
        # TTFT: the prompt's ``n_pre`` prefill iterations, each as heavy as the budget allows.
        first_work = self.work(lam, n_pre, self.first_prompts(lam)) if below.any() else self.saturated_first
        ttft = n_pre * self.iteration(eff, pass_s, first_work)[0] + np.where(below, 0.5 * tau, 0.0)
        tpot = tau
        throughput = self._throughput(st)
        mem = self.mem
        weights, activations, pool = mem["weights"], mem["activations"], mem["pool"]
        total = weights + activations + mem["reserve"] + pool
        out = {
            "ttft_s": ttft,
            "tpot_s": tpot,
            "latency_s": ttft + decode_steps * tpot,
            "output_tokens_per_s_per_replica": throughput,
            "fits": self.fits.copy(),  # the caller's own: this batch is priced again
            "memory_per_gpu_gib": total / GIB,
            "weights_gib": weights / GIB,
            "kv_cache_gib": pool / GIB,
            "activations_gib": activations / GIB,
            "reserve_gib": mem["reserve"] / GIB * np.ones(n),
            "concurrency": np.where(below, m * lam * (n_pre + decode_steps), self.concurrency),
            "kv_capacity_requests": self.kv_requests.copy(),
            "decode_batch": m * lam * decode_steps,
            "prefill_tokens_per_iteration": m * lam * s_in,
            "capacity_requests_per_s": capacity,
            "overloaded": overloaded,
        }
        parts = ("compute", "memory", "tp_comm", "overhead")
        out.update({key: slots * stage[part] for key, part in zip(PASS_KEYS, parts)})
        out["decode_overhead_s"] = out["decode_overhead_s"] + pass_s
        out["decode_pp_s"] = slots * hop
        return out
