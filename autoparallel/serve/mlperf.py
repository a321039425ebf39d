"""MLPerf Inference LLM results as the check of the traffic simulation (issue 29 item 4).

Why these rows: they are the only published measurements of serving under the question the
simulation answers (a dataset's length distribution; Offline = every request at once; Server =
Poisson arrivals with p99 TTFT / TPOT bounds), each with the layout the submitter ran (TP, PP,
replicas, max batch, max tokens, FP8 weights and KV cache, the KV memory fraction in the notes).

Each kept row (``data/mlperf_inference_runs.csv``: closed division, TensorRT-LLM, a GPU with a
preset, the layout published; the -99 and -99.9 copies of one run counted once) is predicted by
simulating one replica of its layout over the benchmark's workload (``--workload mlperf-<model>``)
with the TensorRT-LLM constants fitted on ``serving_runs.csv`` (which hold no MLPerf row), the
engine run as NVIDIA's harness runs it (``harness_engine``: MAX_UTILIZATION, the row's KV fraction):

- Offline: output tokens/s with every request at once, times the replicas, over as many requests
  as LoadGen issues: its Offline query holds max(dataset size, 1.1 x min_duration x the config's
  ``offline_expected_qps``) samples (mlcommons/inference loadgen/test_settings_internal.cc, ``kSlack``;
  e.g. 200,640 in NVIDIA's DGX-H100 llama2-70b log), shared by the replicas, so the last batch's
  drain is the small share of a 2,400 s run it is in MLPerf, not its share of one pass over the
  dataset (+1 to +4 % on the H100 Offline runs); where the
  config's QPS would end the simulated run before the row's ``min_duration_ms`` (a valid run
  lasts that long: the config published is not the one run), the count is raised to 1.1 x what
  the simulated replica serves in that time;
- Server: the largest Poisson rate whose p99 TTFT / TPOT meet the round's bounds, its output
  tokens/s times the replicas (the measured figure is at the submitter's target QPS, which is at
  most the largest valid rate), and the p99 TTFT / TPOT / end-to-end latency at the measured
  target QPS over the run's minimum duration (a run the simulated replica cannot keep up with is
  flagged, its p99s NaN). The end-to-end p99 is a diagnostic the issue does not ask for: the p99 request is
  one of the longest answers (~1,000 tokens), so its latency over its output length is the mean
  iteration time at that load, which tells a missed mean apart from a missed tail shape.
- Server, the same p99 TTFT / TPOT at the simulated replica's **own** Server rate (``*_own_*``): a
  Server result is one operating point, the QPS the submitter found valid and the p99s LoadGen
  measured there (mlcommons/inference loadgen: the run is valid only if both p99s are within the
  bounds, and submitters raise the QPS until it is not). The tokens/s above are predicted at the
  simulated system's own operating point (its largest valid rate); these p99s are taken there too,
  so the predicted Server result is one point with no measured QPS in it. At the submitted QPS a
  p99 near capacity inherits its elasticity (2-44, RESULTS "issue 29, fifth part") times the
  capacity error; at the own rate it does not, but it carries the bisection's 1/64 step of the
  Offline rate and, where a bound binds, sits at that bound.

What NVIDIA's v4.1 harness does that the simulation leaves out (mlcommons/inference_results_v4.1
closed/NVIDIA/code/harness/harness_llm; RESULTS.md, session 40, s40h4): it streams every token in
Server and none in Offline (main_llm.cc: ``mIsStreaming = streaming && scenario != Offline``), a
host cost per streamed token that no published figure sizes (matching LoadGen's mean TPOT takes
1.6 us on HPE's H100 run and 14-17 us on NVIDIA's); it does not give each replica an independent
Poisson share: with TP or PP > 1 (mpirun, one process per GPU and one for LoadGen) it sends each
Server sample to the replica with the fewest in flight (llm_server.cc ``getLeastBusyIdx``,
``traffic_distribution_policy`` 2), and with TP = PP = 1 (one process: code/common/harness.py
``_construct_terminal_command`` runs mpirun only for TP or PP > 1; every v4.1 Mixtral and H200 /
GH200 Llama-2 row) all the GPUs' engines share ONE request queue (``LLMServer``: ``RequestQueueVec(1)``),
each GptManager loop taking every queued request up to its free slots at its own iteration boundary
(``GptManager::fetchNewRequests``: ``getMaxNumSequences() - mActiveRequests.size()``;
``LLMCore::getInferenceRequest``). Either narrows the simulated spread and lowers today's p99s,
which are mostly low already (RESULTS.md s40h4; the shared queue: s55h7,
benchmarks/bench_mixtral_server_ttft.py ``--shared-queue``); it runs TensorRT-LLM's GptManager without chunked context (the harness never
sets ``enableChunkedContext``, off by default before TensorRT-LLM 0.16; with ``max_num_tokens``
4,096 or more the budget seldom binds: inert here); and the EOS step it runs is not a token LoadGen
counts (sampling kernels leave EOS out of the sequence length; ``n_tokens`` is the streamed tokens),
so a request of n counted tokens spans n, not n - 1, decode iterations after its first token.
LoadGen's definitions are the simulation's: TPOT = (latency - TTFT) / (n_tokens - 1) per request,
its p99 the element ``floor(0.99 x samples)`` of the sorted per-request values (loadgen v4.1
logging.cc ``RecordSampleCompletion``, results.cc ``ProcessTokenLatencies``).

``lomo``: the same with the constants refitted without the row's model's rows of
``serving_runs.csv`` (Llama-2-70B, Mixtral-8x7B), from the uncalibrated constants, as
``validate --inference`` does for its rows.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from autoparallel import io, resources
from autoparallel.processes import in_processes
from autoparallel.serve.assumptions import efficiency_for, load_assumptions, load_engine, with_capacity_policy
from autoparallel.serve.search import Request
from autoparallel.serve.simulate import replica, run_workload
from autoparallel.serve.traffic import Traffic, _largest_rate, scenario_bounds
from autoparallel.serve.workload import load_workload

DATA = "mlperf_inference_runs.csv"
LAYOUT = ("tp", "pp", "replicas", "max_batch", "max_num_tokens", "weight_precision", "kv_precision")
SAME_RUN = ("round", "submitter", "system", "gpu", "gpus", "model", "scenario", *LAYOUT, "tokens_per_s")
REQUESTS = 3000  # simulated requests per run of the bisection on the sustained rate


def settings() -> dict:
    return load_assumptions()["validation"]["mlperf"]


def held_out_sets() -> list[dict]:
    """The further MLPerf Inference CSVs predicted beside ``DATA`` and never fitted
    (``validation.mlperf.held_out``: csv, engine, engine_column, group)."""
    return list(settings().get("held_out") or [])


def load_rows(data: str = DATA, engine: str = "tensorrt-llm",
              engine_column: str = "TensorRT-LLM") -> tuple[pd.DataFrame, pd.Series]:
    """The rows predicted (one per run) and the reason each other row is not; ``data`` a CSV of
    ``mlperf_inference_runs.csv``'s columns whose rows ``engine`` runs (``engine_column``: its name
    in the CSV's ``engine`` column)."""
    from autoparallel.costmodel.inference import PRECISIONS
    frame = pd.read_csv(resources.data_file(data))
    s = settings()
    reason = pd.Series("", index=frame.index, dtype=object)
    checks = [
        # MXFP4 (AMD's MI355X rows): OCP MX block-scaled FP4, which the cost model does not price
        (frame["weight_precision"] == "mxfp4", "MXFP4 weights (the serving cost model prices NVIDIA's NVFP4, not MX)"),
        (frame["division"] != "closed", "open division (its own model changes)"),
        (frame["engine"] != engine_column, f"not {engine_column}"),
        (frame[["tp", "pp", "max_batch", "max_num_tokens"]].isna().any(axis=1), "layout not published"),
        (~frame["gpu"].isin(s["gpus"]), "GPU without a preset"),
        (~frame["model"].isin(s["models"]), "model without a preset"),
        # NVIDIA's MaxQ configs cap the board power (power_limit 500 W on a 700 W H200): the
        # presets' peaks are the GPUs' at full power, as the MaxP runs use them.
        (frame["notes"].fillna("").str.contains("PowerSetting.MaxQ", regex=False),
         "power-capped run (MaxQ): the preset is the GPU at full power"),
        (frame["kv_precision"].isna(), "KV cache precision not stated in the config"),
        (~frame["weight_precision"].isin(PRECISIONS), "weight precision not priced by the serving cost model"),
    ]
    for broken, why in checks:
        reason[broken & (reason == "")] = why
    kept = frame[reason == ""]
    dup = kept.duplicated(subset=list(SAME_RUN))
    reason[dup[dup].index] = "same run submitted as -99 and -99.9"
    rows = frame[reason == ""].copy()
    rows["hardware"] = rows["gpu"].map(s["gpus"])
    notes = rows["notes"].fillna("")
    if engine == "tensorrt-llm":
        kv = notes.str.extract(r"kvcache_free_gpu_mem_frac=([0-9.]+)")[0].astype(float)
        rows["kv_fraction"] = kv.fillna(load_engine("tensorrt-llm").kv_memory_fraction)
        # NVIDIA's v5.1 DeepSeek-R1 configs run TensorRT-LLM's PyTorch backend with attention DP
        # (``enable_attention_dp: True`` beside TP8 EP8): the TP group's ranks in lock-step (``_simulate``),
        # with the context balancing their config sets (``attention_dp_balance``, by the config file).
        rows["attention_dp"] = notes.str.contains("enable_attention_dp=True", regex=False)
        # the harness's runtime flag (NVIDIA's v5.1 DeepSeek-R1 configs but one: False; every other row: True)
        rows["chunked_context"] = ~notes.str.contains("enable_chunked_context=False", regex=False)
        balance = s.get("attention_dp_balance") or {}
        rows["adp_balance"] = [next((tuple(v) for k, v in balance.items() if k in str(src)), ()) if adp else ()
                               for src, adp in zip(rows["source"], rows["attention_dp"])]
    else:  # vLLM's gpu_memory_utilization, KV block size and scheduler as each row's config sets them
        own = load_engine(engine)
        rows["kv_fraction"] = notes.str.extract(r"gpu_memory_utilization=([0-9.]+)")[0].astype(float).fillna(
            own.kv_memory_fraction)
        rows["engine_settings"] = [vllm_settings(own, n) for n in notes]
    expected = rows["notes"].fillna("").str.extract(r"offline_expected_qps=([0-9.]+)")[0].astype(float)
    least = rows["notes"].fillna("").str.extract(r"run min_query_count=([0-9]+)")[0].astype(float)
    rows["offline_requests"] = [offline_sample_count(m, q, d, n) for m, q, d, n in
                                zip(rows["model"], expected, rows["min_duration_ms"], least)]
    return rows, reason[reason != ""]


def offline_sample_count(model: str, expected_qps: float, min_duration_ms: float,
                         min_query_count: float = math.nan) -> int:
    """Samples in LoadGen's Offline query: ``max(min_query_count, 1.1 * min_duration * offline_expected_qps)``
    (loadgen/test_settings_internal.cc), the dataset size standing for the minimum count where the
    run's log does not give it (``requested_min_query_count`` of its mlperf_log_detail.txt, in the
    v5.1 rows' notes: 26,328 = 6 x the dataset for NVIDIA's DeepSeek-R1 configs, above what their
    expected QPS asks); the dataset size alone where the config's expected QPS is not published."""
    dataset = int(settings()["offline_requests"][model])
    least = max(dataset, int(min_query_count)) if math.isfinite(min_query_count) else dataset
    if not (math.isfinite(expected_qps) and math.isfinite(min_duration_ms)):
        return least
    return max(least, int(1.1 * min_duration_ms / 1e3 * expected_qps))


def offline_run(cost, sched, workload, requests: int, min_duration_s: float = 0.0):
    """One replica's Offline run of ``requests`` samples, all at once; a valid MLPerf run lasts at
    least ``min_duration_s``, so where the config's sample count would end sooner (the config
    published is not the one run) the run gets 1.1 x what the replica serves in that time."""
    run = run_workload(cost, sched, workload, None, requests)
    if run.duration < min_duration_s:
        run = run_workload(cost, sched, workload, None, math.ceil(requests * 1.1 * min_duration_s / run.duration))
    return run


def harness_engine(kv_fraction: float | None = None, chunked_context: bool = True):
    """TensorRT-LLM as NVIDIA's MLPerf harness runs it: its capacity policy
    (``validation.mlperf.capacity_policy``), KV memory fraction (the engine's default if None) and
    chunked context (the runtime flag ``enable_chunked_context``, in the v5.1 rows' notes)."""
    engine = with_capacity_policy(load_engine("tensorrt-llm"), settings()["capacity_policy"])
    return dataclasses.replace(engine, kv_memory_fraction=engine.kv_memory_fraction if kv_fraction is None
                               else kv_fraction, chunked_prefill=engine.chunked_prefill and chunked_context)


class HarnessSettings(NamedTuple):
    """A held-out vLLM row's engine as its harness config ran it (``vllm_settings``)."""
    engine: str               # the serving engine's name (serve/engines)
    kv_block_tokens: int
    chunked_prefill: bool
    prefill_first: bool       # vLLM V0 without chunked prefill: prefills first, no decode mixed in
    admission_cap: int        # AMD's V0 target decode batch (0: none)
    gfx_clock_mhz: int        # the clock the harness holds the GPU at (0: the preset's)
    scheduler_steps: int = 1  # vLLM V0's num_scheduler_steps (multi-step scheduling; V1: 1)
    prefill_min_waiting: int = 0  # AMD's V0 MIN_REQUIRE_PREFILL_QUERY prefill gate (0: none)


def vllm_settings(engine, notes: str) -> HarnessSettings:
    """The engine, KV block tokens, chunked prefill, prefill first and admission cap of a vLLM row's
    harness config (its notes: scripts/mlperf_inference_amd_rows.py), the engine's defaults where unset.

    AMD's v5.1 configs run vLLM's V0 engine (``VLLM_USE_V1: 0`` in the harness's base config.yaml)
    without chunked prefill, except the MI325X Interactive ones (V1, chunked). V0's scheduler then
    runs prefill first and mixes nothing: "Don't schedule decodes if prefills are scheduled"
    (``Scheduler._schedule_default``; AMD's vLLM 0.9.0.2.dev108+g71faa1880 as Dell_MangoBoost publishes
    it, mlcommons/inference_results_v5.1@965182b0 closed/Dell_MangoBoost/code/llama2-70b-99.9/amd/setup/
    vllm/vllm/core/scheduler.py), so ``prefill_priority``. With ``VLLM_LLAMA2_MLPERF_SCHED`` AMD's V0
    scheduler admits prompts only while fewer than ``VLLM_LLAMA2_MLPERF_MAX_TARGET_DECODE_BATCH``
    requests run (``do_prefill = len(self.running) < ...MAX_TARGET_DECODE_BATCH``, same file): that
    target caps the running batch below ``max_num_seqs`` (0: no cap). The V1 scheduler reads none of
    these (vllm/v1/core/scheduler.py there). The partners' vLLM 0.6.5.dev964+mlperf50 (AMD's v5.0
    build) is not published; that it schedules as the v5.1 build does is an assumption. Last, the
    GFX clock (MHz) the harness holds the GPU at (``perfdeterminism_mhz``: ``gfx_clock``), 0 if none;
    and V0's ``num_scheduler_steps`` (multi-step scheduling, ``simulate.Scheduler.multi_step``: 7 to 19
    in every V0 config). V1 has no multi-step (AMD's V1 configs, MI325X Interactive, set 1): 1 there.
    With ``VLLM_LLAMA2_MLPERF_SCHED`` the V0 scheduler also gates prefills on
    ``VLLM_LLAMA2_MLPERF_MIN_REQUIRE_PREFILL_QUERY`` (``simulate.Scheduler.prefill_min_waiting``; the
    patch's default 10 where the config leaves it unset: vllm/envs.py in
    closed/AMD/setup/vllm_patches/add-MIN_REQUIRE_PREFILL_QUERY-condition.patch); 0 elsewhere."""
    grab = lambda pattern: re.search(pattern, notes)  # noqa: E731
    block, chunked = grab(r"block_size=([0-9]+)"), grab(r"enable_chunked_prefill=(True|False)")
    chunked = (chunked.group(1) == "True") if chunked else engine.chunked_prefill
    v0 = bool(grab(r"VLLM_USE_V1=0"))
    target = grab(r"VLLM_LLAMA2_MLPERF_MAX_TARGET_DECODE_BATCH=([0-9]+)")
    amd_sched = v0 and grab(r"VLLM_LLAMA2_MLPERF_SCHED=1")  # AMD's V0 scheduler patches in force
    cap = int(target.group(1)) if amd_sched and target else 0
    clock = grab(r"perfdeterminism_mhz=([0-9]+)")
    steps = grab(r"num_scheduler_steps=([0-9]+)")
    query = grab(r"VLLM_LLAMA2_MLPERF_MIN_REQUIRE_PREFILL_QUERY=([0-9]+)")
    gate = (int(query.group(1)) if query else 10) if amd_sched else 0
    return HarnessSettings(engine.name, int(block.group(1)) if block else engine.kv_block_tokens, chunked,
                           v0 and not chunked, cap, int(clock.group(1)) if clock else 0,
                           int(steps.group(1)) if v0 and steps else 1, gate)


def gfx_clock(hw, mhz: float):
    """``hw`` with its compute peaks at a GFX clock of ``mhz`` instead of the one they are quoted at
    (``validation.mlperf.peak_clock_mhz``); memory and links as they are. AMD's MLPerf harness holds the
    clock with ``rocm-smi --setperfdeterminism`` (scripts/power_settings.sh, sourced by run_harness.sh
    before main.py): 1,300-2,000 MHz by GPU, model and scenario, against the 2,100 MHz the MI300X / MI325X
    peaks are quoted at (presets' comments: 304 CUs x FLOP per CU per clock x 2.1 GHz). The exponential
    units scale with the lock; each matrix peak by the lock but no faster than the GPU's sustained GEMM
    rate measured against the H100 (``matrix_clock``). 0: the preset as it is."""
    peak = settings().get("peak_clock_mhz", {}).get(hw.name)
    if not mhz or not peak:
        return hw
    f = min(1.0, float(mhz) / float(peak))
    return dataclasses.replace(hw, bf16_tflops=hw.bf16_tflops * matrix_clock(f, hw.bf16_clock_speed or hw.clock_speed),
                               exp_tera_per_s=hw.exp_tera_per_s * f,
                               fp8_tflops=None if hw.fp8_tflops is None else hw.fp8_tflops * matrix_clock(f, hw.clock_speed))


def matrix_clock(lock: float, sustained: float) -> float:
    """The factor on a datasheet matrix peak under a harness clock lock (``lock``: the lock over the
    clock the peak is quoted at): the lock, but no more than the sustained GEMM speed measured against the
    H100 (``sustained``: ``HardwareSpec.clock_speed`` for FP8, ``bf16_clock_speed`` for BF16, from
    specs.hardware.measured_speed), since the serving constants' GEMM shares are the H100's fit. Under a
    dense GEMM the power limit holds the GPU below any lock AMD sets (AMD's max-achievable FLOPs,
    ROCm/rocm-blogs 8e011952 measuring-max-achievable-flops-part2: MI300X FP8 at a median 1,230 MHz,
    MI325X 1,464), so a lock above the sustained speed (MI300X Interactive: 2,000 of 2,100 MHz, 0.952,
    against 0.717 in FP8) does not make the prefill GEMMs faster. ASSUMPTION: the two combine as a min
    of two bounds, not as the lock scaling the measured rate; the lower locks (1,300-1,700 MHz, under
    the sustained speed in FP8) stay as they were, as the Offline / Server rows they predict within a few
    per cent say (the rate at the power-limited clock alone, never the lock, puts llama2-70b Offline and
    Server 5-15 % too fast)."""
    return min(lock, sustained)


def engine_as_run(run: HarnessSettings, kv_fraction: float):
    """A serving engine as a held-out row's harness runs it (``vllm_settings``: KV block tokens,
    chunked prefill, prefill first, multi-step scheduling) and its KV memory fraction (vLLM's gpu_memory_utilization)."""
    return dataclasses.replace(load_engine(run.engine), kv_block_tokens=int(run.kv_block_tokens),
                               chunked_prefill=bool(run.chunked_prefill), prefill_priority=bool(run.prefill_first),
                               kv_memory_fraction=float(kv_fraction), scheduler_steps=int(run.scheduler_steps))


def harness_replica(spec, hw, eff, workload, tp: int, pp: int, max_batch: int, max_tokens: int,
                    weight_precision: str = "fp8", kv_precision: str = "fp8", kv_fraction: float | None = None,
                    engine_settings: HarnessSettings | None = None, attention_dp: bool = False,
                    adp_balance: tuple = (), chunked_context: bool = True):
    """(cost, scheduler) of one TensorRT-LLM replica as NVIDIA's MLPerf harness runs it
    (``harness_engine``), or of the engine ``engine_settings`` names as a held-out row ran it
    (``engine_as_run``), its engine built for ``workload``'s longest request and answer.
    ``attention_dp``: the attention-DP ranks of a TP ``tp`` EP ``tp`` layout (``simulate.replica``),
    ``adp_balance`` their context balancing (``serve.attention_dp``),
    ``max_batch`` and ``max_tokens`` per rank as TensorRT-LLM's PyTorch backend applies them (each
    rank schedules its own requests; its MoE takes ``max_num_tokens`` x the ranks: NVIDIA/
    TensorRT-LLM@000a01de tensorrt_llm/_torch/modules/fused_moe/fused_moe_cutlass.py, "The maximum
    number of tokens in MoE are multiplied by DP size when attention DP is enabled")."""
    engine = (engine_as_run(engine_settings, kv_fraction) if engine_settings
              else harness_engine(kv_fraction, chunked_context))
    if engine_settings and engine_settings.admission_cap:  # AMD's V0 scheduler (vllm_settings)
        max_batch = min(max_batch, int(engine_settings.admission_cap))
    cost, sched = replica(spec, hw, eff, engine, tp, pp, max_batch, max_tokens, weight_precision,
                          kv_precision, tp if attention_dp else 1, workload.max_input + workload.max_output,
                          workload.max_output, attention_dp, adp_balance)
    if engine_settings and engine_settings.prefill_min_waiting:  # AMD's V0 prefill gate (vllm_settings)
        sched = dataclasses.replace(sched, prefill_min_waiting=int(engine_settings.prefill_min_waiting))
    return cost, sched


_SIMULATED: dict = {}  # ``_simulate``'s results by its arguments, in this process


def clear_simulations() -> None:
    """Forget every run simulated so far (the benchmarks that change a setting between reports)."""
    _SIMULATED.clear()


def _simulated(keys: list[tuple], workers: int | None) -> list[tuple[float, ...]]:
    """``_simulate(*key)`` of each key, once per key and process: the keys not simulated yet in
    ``workers`` processes (None: one per CPU; ``processes.in_processes``: each run's simulation is
    seeded, the same in any process)."""
    missing = [k for k in dict.fromkeys(keys) if k not in _SIMULATED]
    _SIMULATED.update(zip(missing, in_processes(_simulate, missing, workers)))
    return [_SIMULATED[k] for k in keys]


def _simulate(model: str, hardware: str, scenario: str, layout: tuple, kv_fraction: float, ttft_ms: float,
             tpot_ms: float, target_qps: float, eff_key: str, requests: int,
             duration_s: float = 0.0, offline_requests: int = 0, engine_settings: HarnessSettings | None = None,
             attention_dp: bool = False, adp_balance: tuple = (),
             chunked_context: bool = True) -> tuple[float, ...]:
    """(tokens/s of the deployment, p99 TTFT, TPOT and end-to-end latency in ms at the target QPS,
    1.0 where the simulated replica does not keep up with the target QPS else 0.0, p99 TTFT and
    TPOT in ms at the simulated replica's own Server rate: the largest rate within the bounds, the
    one its Server tokens/s is taken at; NaN for Offline).

    The p99s at the target QPS are taken over as many requests as LoadGen issues in the run's
    minimum duration (``duration_s``, the row's ``min_duration_ms``: 600 or 2,400 s), at least
    ``requests``: a run starts from an empty engine, and over a few thousand requests the ramp to
    the steady batch (a long answer lives ~1-2 minutes) is a large share of the run and pulls the
    percentiles down; over MLPerf's 2,400 s it is a small one. Where the simulated replica cannot
    keep up with the target QPS (its modelled capacity is below what the submission sustained:
    a tokens/s error, counted there), its queue grows for the whole run and the p99s have no
    value to compare: NaN, and the run is flagged. Offline: ``offline_requests`` (LoadGen's sample
    count, ``offline_sample_count``) over the replicas, at least as many as last ``duration_s``.
    ``engine_settings``: a held-out row's engine as run (``engine_as_run``); None: NVIDIA's harness.
    Interactive (MLPerf v5.0 on) is a Server run under tighter bounds: any scenario not Offline is one.
    ``attention_dp``: the row's TP group runs attention data-parallel (``harness_replica``): its ``tp``
    ranks are simulated together as the replica (``serve.attention_dp``), with ``adp_balance``.
    ``chunked_context``: the harness's ``enable_chunked_context`` (``harness_engine``)."""
    s = settings()
    spec = io.load_model(s["models"][model])
    hw = io.load_hardware(hardware)
    if engine_settings:  # a held-out row's GPU at the clock its harness holds (gfx_clock)
        hw = gfx_clock(hw, engine_settings.gfx_clock_mhz)
    eff = _efficiency(eff_key)
    workload = load_workload(s["workloads"][model])
    tp, pp, replicas, max_batch, max_tokens, wp, kp = layout
    cost, sched = harness_replica(spec, hw, eff, workload, tp, pp, max_batch, max_tokens, wp, kp, kv_fraction,
                                  engine_settings, attention_dp, adp_balance, chunked_context)
    if attention_dp:  # the ranks not simulated together (``replica``: with PP) are replicas of their own
        replicas *= tp // sched.dp
    if scenario == "Offline":  # LoadGen's one query of ``offline_requests`` samples, this replica's share
        share = math.ceil((offline_requests or int(s["offline_requests"][model])) / replicas)
        offline = offline_run(cost, sched, workload, share, duration_s)
        return offline.output_tokens_per_s * replicas, np.nan, np.nan, np.nan, 0.0, np.nan, np.nan
    plan = Traffic(workload, "server", 99.0, requests)
    own_rate, best = _largest_rate(cost, sched, plan, Request(1, 1, max_ttft_ms=ttft_ms, max_tpot_ms=tpot_ms))
    sustained = best["output_tokens_per_s"] * replicas if best else 0.0
    own = _p99s(cost, sched, workload, own_rate, requests, duration_s)[:2] if best else (np.nan, np.nan)
    at_target = _p99s(cost, sched, workload, target_qps / replicas, requests, duration_s)
    return (sustained, *at_target, 0.0 if np.isfinite(at_target[0]) else 1.0, *own)


def _p99s(cost, sched, workload, rate: float, requests: int, duration_s: float) -> tuple[float, float, float]:
    """LoadGen's p99 TTFT, TPOT and end-to-end latency (ms) of one replica at ``rate`` requests/s
    over as many requests as arrive in ``duration_s`` (at least ``requests``); NaN where the
    replica does not keep up with the rate (its queue grows for the whole run)."""
    sim = run_workload(cost, sched, workload, rate, max(requests, math.ceil(rate * duration_s)))
    if not sim.keeps_up:
        return np.nan, np.nan, np.nan
    return (1e3 * loadgen_percentile(sim.ttft, 99.0), 1e3 * loadgen_percentile(sim.tpot, 99.0),
            1e3 * loadgen_percentile(sim.finish - sim.arrival, 99.0))


def tokens_held_per_request(workload, block: int, samples: int = 200_000) -> float:
    """KV tokens an in-flight request of ``workload`` holds, time-averaged: its prompt and half its
    answer in whole blocks of ``block`` tokens, each request weighted by its answer's length (the
    time it stays). A pool of P tokens holds about P / this many requests (Little's law checks)."""
    inp, out = workload.sample(samples, 0)
    return float(np.mean(np.ceil((inp + out / 2) / block) * block * out) / np.mean(out))


def rate_at_concurrency(cost, sched, workload, rate: float, n: float, steps: int = 10, requests: int = 20_000):
    """The Poisson rate (within [0.8, 1.3] x ``rate``) at which the simulated replica holds ``n``
    requests in flight (rate x mean latency: Little's law), by bisection, and the run there (the
    largest rate below ``n`` that the replica keeps up with)."""
    lo, hi = 0.8 * rate, 1.3 * rate
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        sim = run_workload(cost, sched, workload, mid, requests)
        if sim.keeps_up and mid * float(np.mean(sim.finish - sim.arrival)) < n:
            lo = mid
        else:
            hi = mid
    return lo, run_workload(cost, sched, workload, lo, 2 * requests)


def loadgen_percentile(values, p: float) -> float:
    """The ``p``-th percentile as LoadGen reports it: the sorted samples' element at index
    ``floor(count x p / 100)`` (mlcommons/inference loadgen/results.cc ``ProcessLatencies`` /
    ``ProcessTokenLatencies``: ``latencies[sample_count * percentile]``), no interpolation."""
    x = np.sort(np.asarray(values, dtype=float))
    return float(x[min(int(len(x) * p / 100.0), len(x) - 1)])


_EFFICIENCIES: dict = {}


def _efficiency(key: str):
    return _EFFICIENCIES[key]


def lomo_efficiency(model_name: str):
    """TensorRT-LLM's constants refitted from the uncalibrated ones without ``model_name``'s rows of
    serving_runs.csv (``fit.refit_without``)."""
    from autoparallel.serve.fit import refit_without
    from autoparallel.serve.measured import load_serving_runs
    return refit_without(next(m for m in load_serving_runs() if m.engine.name == "tensorrt-llm"), model_name)


def predict_rows(rows: pd.DataFrame, cross: bool = True, requests: int = REQUESTS,
                 workers: int | None = None, engine: str = "tensorrt-llm") -> pd.DataFrame:
    """Each run's predicted tokens/s per GPU and p99s, with the in-sample and (``cross``) LOMO errors;
    the runs are simulated in ``workers`` processes (default: one per CPU). ``engine``: the engine's
    fitted constants (an engine without its own fit borrows one: ``efficiency_from``; vLLM's are
    TensorRT-LLM's, so its LOMO refits are TensorRT-LLM's too); a held-out set's rows carry their
    engine's settings as run (``load_rows``'s ``engine_settings``)."""
    s = settings()
    fit = "fit" if engine == "tensorrt-llm" else f"fit:{engine}"
    _EFFICIENCIES[fit] = efficiency_for(engine)
    keys = {"in_sample": fit}
    if cross:
        for model in rows["model"].unique():
            _EFFICIENCIES[f"lomo:{model}"] = lomo_efficiency(s["serving_model"][model])
        keys["lomo"] = "lomo:{model}"
    out = rows.copy()
    for label, key in keys.items():
        preds = _simulated([(r["model"], r["hardware"], r["scenario"],
                             tuple(int(r[k]) if k not in ("weight_precision", "kv_precision") else r[k] for k in LAYOUT),
                             float(r["kv_fraction"]), float(r["ttft_bound_ms"]), float(r["tpot_bound_ms"]),
                             float(r["target_qps"]) if r["scenario"] != "Offline" else 0.0,
                             key.format(model=r["model"]), requests,
                             float(r["min_duration_ms"]) / 1e3 if r["min_duration_ms"] > 0 else 0.0,
                             int(r["offline_requests"]) if r["scenario"] == "Offline" else 0,
                             r["engine_settings"] if "engine_settings" in r else None,
                             bool(r["attention_dp"]) if "attention_dp" in r else False,
                             tuple(r["adp_balance"]) if "adp_balance" in r else (),
                             bool(r["chunked_context"]) if "chunked_context" in r else True)
                            for _, r in rows.iterrows()], workers)
        tokens, ttft, tpot, e2e, over, ttft_own, tpot_own = ((np.array(x, dtype=float) for x in zip(*preds))
                                                            if preds else ([],) * 7)
        out[f"{label}_tokens_per_s_per_gpu"] = tokens / out["gpus"].to_numpy()
        out[f"{label}_overloaded"] = np.asarray(over, dtype=float) > 0
        for suffix, predicted, measured in (("", tokens, "tokens_per_s"), ("_ttft", ttft, "ttft_p99_ms"),
                                            ("_tpot", tpot, "tpot_p99_ms"), ("_latency", e2e, "latency_p99_ms"),
                                            ("_ttft_own", ttft_own, "ttft_p99_ms"), ("_tpot_own", tpot_own, "tpot_p99_ms")):
            out[f"{label}{suffix}_ms" if suffix else f"{label}_tokens_per_s"] = predicted
            out[f"{label}{suffix}_pct"] = 100.0 * (predicted - out[measured].to_numpy()) / out[measured].to_numpy()
    return out


#: (summary column, report column): mean |error| % of tokens/s and of the Server p99s (the
#: end-to-end p99 is measured on every run; Offline's is the whole run, so only Server's counts).
#: ``*_own_*``: the p99s at the simulated replica's own Server rate instead of the submitted QPS
#: (see the module docstring).
ERRORS = (("tokens_pct", "in_sample_pct"), ("lomo_pct", "lomo_pct"),
          ("ttft_p99_pct", "in_sample_ttft_pct"), ("ttft_p99_lomo_pct", "lomo_ttft_pct"),
          ("tpot_p99_pct", "in_sample_tpot_pct"), ("tpot_p99_lomo_pct", "lomo_tpot_pct"),
          ("latency_p99_pct", "in_sample_latency_pct"),
          ("ttft_p99_own_pct", "in_sample_ttft_own_pct"), ("ttft_p99_own_lomo_pct", "lomo_ttft_own_pct"),
          ("tpot_p99_own_pct", "in_sample_tpot_own_pct"), ("tpot_p99_own_lomo_pct", "lomo_tpot_own_pct"))


def summary(report: pd.DataFrame) -> pd.DataFrame:
    """Mean |error| % per round, GPU, benchmark and scenario: tokens/s and the Server p99s, in
    sample and LOMO (NaN where not predicted or not measured)."""
    def agg(g: pd.DataFrame) -> pd.Series:
        server = g["scenario"] != "Offline"  # Server and Interactive (a Server run under tighter bounds)
        return pd.Series({"runs": len(g), **{name: g.loc[server if "p99" in name else g.index, col].abs().mean()
                                             if col in g else np.nan for name, col in ERRORS}})
    return (report.groupby(["round", "hardware", "model", "scenario"], sort=True)[list(report.columns)]
            .apply(agg).reset_index())


def scenario_means(report: pd.DataFrame) -> dict[str, float]:
    """The headline figures: mean |error| % of tokens/s per GPU by scenario (in sample, LOMO), of
    the Server p99s (over the runs the simulation keeps up with at the target QPS) and how many it
    does not keep up with (``server_overloaded_<in_sample|lomo>_runs``)."""
    out = {}
    for scenario, g in report.groupby("scenario"):
        out[f"{scenario.lower()}_tokens_pct"] = float(g["in_sample_pct"].abs().mean())
        if "lomo_pct" in g:
            out[f"{scenario.lower()}_tokens_lomo_pct"] = float(g["lomo_pct"].abs().mean())
    server = report[report["scenario"] == "Server"]
    for name, col in ERRORS[2:]:
        if col in server:
            out[name] = float(server[col].abs().mean())
    for label in ("in_sample", "lomo"):
        if f"{label}_overloaded" in server:
            out[f"server_overloaded_{label}_runs"] = int(server[f"{label}_overloaded"].sum())
    return out


def held_out_means(report: pd.DataFrame, by: tuple[str, ...] = ("scenario",)) -> list[dict]:
    """Mean |error| % per ``by`` group of the held-out rows: tokens/s (every run), p99 TTFT / TPOT at
    the submitted QPS (Server and Interactive, over the runs the simulated replica keeps up with) and
    at its own rate, and how many runs it does not keep up with at the submitted QPS."""
    out = []
    for key, g in report.groupby(list(by), sort=True):
        served = g[g["scenario"] != "Offline"]
        row = {**dict(zip(by, key if isinstance(key, tuple) else (key,))), "runs": len(g),
               "tokens_pct": float(g["in_sample_pct"].abs().mean()),
               "tokens_signed_pct": float(g["in_sample_pct"].mean())}
        if len(served):
            for name, col in (("ttft_p99_pct", "in_sample_ttft_pct"), ("tpot_p99_pct", "in_sample_tpot_pct"),
                              ("ttft_p99_own_pct", "in_sample_ttft_own_pct"),
                              ("tpot_p99_own_pct", "in_sample_tpot_own_pct")):
                row[name] = float(served[col].abs().mean())
            row["overloaded_runs"] = int(served["in_sample_overloaded"].sum())
        out.append(row)
    return out


#: NVIDIA's own measurement of TensorRT-LLM's pipeline parallelism on this benchmark, the only one
#: found (issue 29, RESULTS.md session 38 s38h3): "use of pipeline parallelism enabled a 1.2x speedup
#: in the MLPerf Inference v4.1 Llama 2 70B benchmark on HGX H100 compared to our results published in
#: August" (NVIDIA technical blog, "Boosting Llama 3.1 405B Throughput by Another 1.5x on NVIDIA H200
#: Tensor Core GPUs and NVLink Switch", 2024-10). ``before``: the August (v4.1) layout,
#: mlcommons/inference_results_v4.1@a2f5d66 closed/NVIDIA/configs/llama2-70b/Offline/__init__.py
#: ``H100_SXM_80GB_TP2x1`` (TP2, gpu_batch_size 896, the parent config's max_num_tokens 4,096, KV 0.90);
#: ``after``: the layout NVIDIA's next round configures for the same GPU and benchmark,
#: inference_results_v5.0@6069beb, same file, ``H100_SXM_80GB_PP2x1`` (TP1 PP2, gpu_batch_size
#: 1,024, max_num_tokens 1,024, kvcache_free_gpu_mem_frac 0.95) -- the blog names no layout, so
#: that it is the one measured is an assumption. The 1.2x also holds whatever else the two months of
#: TensorRT-LLM changed (v5.0 adds ``gemm_swiglu_plugin`` fp8, which the cost model does not price).
PP_SPEEDUP = {"model": "llama2-70b", "hardware": "h100-sxm", "published": 1.2,
              "before": {"tp": 2, "pp": 1, "max_batch": 896, "max_num_tokens": 4096, "kv_fraction": 0.90},
              "after": {"tp": 1, "pp": 2, "max_batch": 1024, "max_num_tokens": 1024, "kv_fraction": 0.95}}


def pp_speedup(requests: int = REQUESTS) -> dict[str, float]:
    """The simulated speedup per GPU of ``PP_SPEEDUP``'s ``after`` layout over its ``before`` one, as
    the MLPerf rows are simulated (the harness engine, the fitted TensorRT-LLM constants): Offline
    (the dataset's samples per replica at once, the least LoadGen's query holds) and Server (the
    largest Poisson rate within the round's p99 bounds, bisected over ``requests``), beside the
    published figure."""
    s, c = settings(), PP_SPEEDUP
    spec, hw = io.load_model(s["models"][c["model"]]), io.load_hardware(c["hardware"])
    workload = load_workload(s["workloads"][c["model"]])
    eff = efficiency_for("tensorrt-llm")
    bounds = Request(1, 1, **scenario_bounds("server"))
    out = {"published": float(c["published"])}
    for key in ("before", "after"):
        k = c[key]
        cost, sched = harness_replica(spec, hw, eff, workload, k["tp"], k["pp"], k["max_batch"], k["max_num_tokens"],
                                      kv_fraction=k["kv_fraction"])
        gpus = k["tp"] * k["pp"]
        offline = offline_run(cost, sched, workload, int(s["offline_requests"][c["model"]]))
        out[f"{key}_offline"] = offline.output_tokens_per_s / gpus
        _, best = _largest_rate(cost, sched, Traffic(workload, "server", 99.0, requests), bounds)
        out[f"{key}_server"] = (best["output_tokens_per_s"] if best else 0.0) / gpus
    for scenario in ("offline", "server"):
        out[f"{scenario}_speedup"] = out[f"after_{scenario}"] / out[f"before_{scenario}"]
    return out


#: The two submitted layouts furthest from the search's best (``bench_issue29_serving.py --layouts``)
#: beside that best: what separates them, term by term (``pp_gap``; RESULTS.md, session 43, s43h2).
PP_GAP = {"model": "llama2-70b",
          "lines": (("l40s", (4, 1, 1024, 4096), (1, 4, 512, 512)),
                    ("h100-sxm", (2, 1, 896, 4096), (1, 2, 512, 512)))}


def pp_gap(requests: int | None = None, pass_overhead_us: float | None = None) -> list[dict]:
    """Per ``PP_GAP`` line, Offline tokens/s per GPU of the submitted TP layout and of the search's
    best TP1 PPn, each as simulated for the MLPerf rows, and again with the TP all-reduce free
    (bandwidth unbounded, no latency: what TP pays that PP does not) and with the pipeline's
    hand-offs free; ``pass_overhead_us`` replaces the fitted host overhead (a probe of what an
    unpriced per-step cost would do). ``requests``: the dataset's sample count if None."""
    s = settings()
    spec, workload = io.load_model(s["models"][PP_GAP["model"]]), load_workload(s["workloads"][PP_GAP["model"]])
    n = int(s["offline_requests"][PP_GAP["model"]]) if requests is None else int(requests)
    eff = efficiency_for("tensorrt-llm")
    if pass_overhead_us is not None:
        eff = dataclasses.replace(eff, pass_overhead_us=float(pass_overhead_us))
    free_eff = dataclasses.replace(eff, allreduce_latency_us=0.0, p2p_latency_us=0.0)

    def run(hw, e, tp, pp, b, t):
        cost, sched = harness_replica(spec, hw, e, workload, tp, pp, b, t)
        return run_workload(cost, sched, workload, None, n).output_tokens_per_s / (tp * pp)

    out = []
    for name, submitted, best in PP_GAP["lines"]:
        hw = io.load_hardware(name)
        free_hw = dataclasses.replace(hw, nvlink_gbps=1e9, nvlink_latency_us=0.0)
        row = {"hardware": name, "submitted": submitted, "best": best,
               "submitted_tps": run(hw, eff, *submitted),
               "submitted_free_allreduce_tps": run(free_hw, free_eff, *submitted),
               "best_tps": run(hw, eff, *best), "best_free_p2p_tps": run(free_hw, free_eff, *best)}
        row["share"] = row["submitted_tps"] / row["best_tps"]
        row["share_free_allreduce"] = row["submitted_free_allreduce_tps"] / row["best_free_p2p_tps"]
        out.append(row)
    return out


#: The columns of one run in ``validate --inference --json`` (``rows``).
ROW_COLUMNS = ("round", "submitter", "system", "hardware", "gpus", "model", "scenario", *LAYOUT, "target_qps",
               "tokens_per_s", "ttft_p99_ms", "tpot_p99_ms", "latency_p99_ms")


def records(report: pd.DataFrame) -> list[dict]:
    """Every predicted run: what was measured, what was predicted (in sample, LOMO) and the errors."""
    import json
    predicted = [c for c in report.columns if c.startswith(("in_sample_", "lomo_"))]
    return json.loads(report[[*ROW_COLUMNS, *predicted]].to_json(orient="records"))
