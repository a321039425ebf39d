"""The MLPerf Inference v5.1 DeepSeek-R1 rows (TensorRT-LLM's PyTorch backend, attention DP; held out, never
fitted): per row, measured against simulated output tokens/s per GPU and p99 TPOT, and one rank's iteration at the
row's load split into the cost model's terms, with and without the executor's per-request time
(``inference.attention_dp_host_time``, session 55).

The load per rank: Offline, the row's full batch (``max_batch``, 512; 1,536 on GB300 NVL72) and the measured
iteration batch / tokens-per-s-per-GPU (every rank full); Server, Little's law from the run's
``mlperf_log_summary.txt`` in the mirror (samples/s x (mean latency - mean TTFT) / GPUs) and the measured mean
TPOT as its iteration. Decoding sequences sit at the workload's time-averaged decode context (a long answer is
in flight in proportion to its length), beside the prompt tokens that arrive per iteration (Offline: a prompt per
finished answer; Server: the arrivals).

The terms (ms of one pass, layers x per-layer term): ``gemm`` (everything but the routed experts, its roofline
with the weight read), ``experts`` (the routed experts' GEMMs or weight read), ``attn`` (MLA decode: FLOPs or
the latent KV read), ``elem`` (element-wise and the MoE plugin's permute / finalize passes), ``moe_x`` (the
attention-DP token gather and reduce-scatter), ``launch`` (the fitted per-layer overhead), ``out`` (LM head and
sampler), ``host`` (the executor's per-request time). ``before``: the same pass with ``host`` at 0 (main before
session 55).

First the rate's derivation (``derivation``). ``python benchmarks/bench_dsr1_serving_gap.py`` (~1-3 min: it simulates the 16 rows twice, with and without the
per-request time)."""
from __future__ import annotations

import math
import re
import subprocess
from unittest import mock

import numpy as np
import pandas as pd

from autoparallel import io
from autoparallel.costmodel import inference as I
from autoparallel.serve import mlperf as M
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.workload import load_workload

MIRROR = "/work/.mirror/mlcommons+inference_results_v5.1/repo"


def summary_field(text: str, name: str) -> float:
    return float(re.search(re.escape(name) + r"\s*:\s*([0-9.]+)", text).group(1))


def server_load(row) -> tuple[float, float, float]:
    """(sequences a rank, samples/s a rank, mean TPOT in s) of a Server run, from its LoadGen summary."""
    path = re.search(r"@[0-9a-f]+: (\S+mlperf_log_summary.txt)", row.source).group(1)
    text = subprocess.run(["git", "-C", MIRROR, "show", "HEAD:" + path], capture_output=True, text=True,
                          check=True).stdout
    qps = summary_field(text, "Completed samples per second")
    lat, ttft, tpot = (summary_field(text, f) / 1e9 for f in ("Mean latency (ns)", "Mean First Token latency (ns)",
                                                            "Mean Time to Output Token (ns)"))
    return qps * (lat - ttft) / row.gpus, qps / row.gpus, tpot


def terms(eff, spec, row, n: float, ctx: float, prompt_tokens: float) -> dict[str, float]:
    """ms of one rank's pass of ``n`` decoding sequences at context ``ctx`` beside ``prompt_tokens`` prompt tokens
    (their own causal attention left out), term by term as ``inference.price_pass`` sums them."""
    hw = io.load_hardware(row.hardware)
    lay = I.layout(spec, hw, eff, float(row.tp), 1.0, row.weight_precision, row.kv_precision, float(row.tp),
                   attention_dp=True)
    df, db = I.decode_attention(lay, float(n), float(ctx))
    w = I.pass_work(lay, np.array([n + prompt_tokens]), np.array([float(n)]), np.ravel(df), np.ravel(db))
    v = lambda x: float(np.ravel(x)[0])  # noqa: E731
    k = eff.roofline_sharpness
    gemm_peak = np.where(w.fp8_gemms, w.peak8 * eff.fp8_gemm_relative, w.peak16)
    hbm = w.hbm * eff.hbm
    t_lin = I._gemm_time(eff, w.lin_flops, w.lin_gflop, gemm_peak) + I._gemm_time(eff, w.lin16_flops, w.lin_gflop,
                                                                                  w.peak16)
    t_exp, exp_read = I.price_routed_experts(eff, w.experts, gemm_peak, hbm)
    elem = (eff.elementwise_bytes_per_token_hidden * w.tokens * w.hidden + w.gated_bytes + w.moe_bytes) / hbm
    L = v(w.layers)
    out = {"gemm": L * v(I._soft_max(t_lin, w.weight_bytes / hbm, k)),
           "experts": L * w.moe_share * v(I._soft_max(t_exp, exp_read, k)),
           "attn": L * v(I._soft_max(w.attn_flops / (w.attn_peak * eff.attention), w.attn_bytes / hbm, k)),
           "elem": L * v(elem),
           "moe_x": L * w.moe_share * v(I.moe_dispatch_time(eff, w)),
           "launch": L * eff.layer_overhead_us * 1e-6,
           "out": v(I._soft_max(w.out_flops / (w.peak16 * eff.gemm_max), w.out_bytes / hbm, k))
           + v(w.logits) * eff.sampling_ns_per_logit * 1e-9,
           "host": v(w.host)}
    total = v(I.price_pass(eff, w)["time"])
    assert math.isclose(sum(out.values()), total, rel_tol=1e-9), (sum(out.values()), total)
    return {key: 1e3 * val for key, val in out.items()}


def predicted(rows: pd.DataFrame, host: bool) -> pd.DataFrame:
    M.clear_simulations()
    if host:
        return M.predict_rows(rows, cross=False)
    with mock.patch.object(I, "_attention_dp_host_us", lambda: 0.0):
        return M.predict_rows(rows, cross=False)


#: NVIDIA's two B200 trtllm-bench runs the per-request rate is derived from (NVIDIA/TensorRT-LLM@f0c873f5
#: docs/source/blogs/Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md; ISL 1024 / OSL 2048, every rank full):
#: (sequences a rank, KV precision, output tokens/s per GPU)
BEST_PERF_B200 = ((384, "bf16", 4548.0105), (896, "fp8", 5393.2755))


def derivation(eff, spec) -> None:
    """The rate's derivation: the two runs' iterations (batch / tokens-per-s-per-GPU) against one rank's pass at
    their shape (the mean context 2,048, batch / 2 prompt tokens an iteration), with and without the term."""
    hw = io.load_hardware("b200")
    pts = []
    for n, kv, tps in BEST_PERF_B200:
        lay = I.layout(spec, hw, eff, 8.0, 1.0, "nvfp4", kv, 8.0, attention_dp=True)
        df, db = I.decode_attention(lay, float(n), 2048.0)
        w = I.pass_work(lay, np.array([1.5 * n]), np.array([float(n)]), np.ravel(df), np.ravel(db))
        t = float(np.ravel(I.price_pass(eff, w)["time"])[0])
        pts.append((n, n / tps, t - float(np.ravel(w.host)[0]), t))
    (n0, *a), (n1, *b) = pts
    for k, name in enumerate(("measured", "pass without the term", "pass with the term")):
        slope = (b[k] - a[k]) / (n1 - n0)
        print(f"B200 trtllm-bench {name:22s}: {1e3 * a[k]:6.1f} / {1e3 * b[k]:6.1f} ms at {n0} / {n1} a rank = "
              f"{1e3 * (a[k] - slope * n0):5.1f} ms + {1e6 * slope:5.1f} us a sequence")


def main() -> None:
    eff, spec = efficiency_for("tensorrt-llm"), io.load_model("deepseek-v3")
    derivation(eff, spec)
    rows, _ = M.load_rows("mlperf_inference_v51.csv")
    rows = rows[rows.model == "deepseek-r1"].sort_values(["scenario", "hardware", "submitter"]).reset_index(drop=True)
    after, before = predicted(rows, True), predicted(rows, False)
    inp, outl = load_workload(M.settings()["workloads"]["deepseek-r1"]).sample(50_000, 0)
    mean_in, mean_out = float(np.mean(inp)), float(np.mean(outl))
    ctx = mean_in + float(np.mean(outl.astype(float) ** 2) / (2 * mean_out))
    table, parts = [], []
    for i, r in rows.iterrows():
        if r.scenario == "Offline":
            n = float(r.max_batch)
            measured_it = n / (r.tokens_per_s / r.gpus)
            prompts = n / mean_out * mean_in  # a prompt per finished answer
        else:
            n, rate, measured_it = server_load(r)
            prompts = rate * mean_in * measured_it
        t = terms(eff, spec, r, n, ctx, prompts)
        model_it = sum(t.values())
        pct = lambda pred, meas: round(100 * (pred - meas) / meas, 1)  # noqa: E731
        table.append(dict(
            row=f"{r.submitter[:12]} {r.hardware} {r.scenario}", per_rank=round(n),
            tok_meas=round(r.tokens_per_s / r.gpus), tok_before=round(before.in_sample_tokens_per_s_per_gpu[i]),
            tok_after=round(after.in_sample_tokens_per_s_per_gpu[i]),
            err_before=pct(before.in_sample_tokens_per_s_per_gpu[i], r.tokens_per_s / r.gpus),
            err_after=pct(after.in_sample_tokens_per_s_per_gpu[i], r.tokens_per_s / r.gpus),
            tpot99_meas=r.tpot_p99_ms if r.scenario != "Offline" else np.nan,
            tpot99_before=round(before.in_sample_tpot_ms[i], 1), tpot99_after=round(after.in_sample_tpot_ms[i], 1),
            it_meas=round(1e3 * measured_it, 1), it_before=round(model_it - t["host"], 1),
            it_after=round(model_it, 1)))
        parts.append(dict(row=table[-1]["row"], per_rank=round(n), ctx=round(ctx),
                          prompt_tok=round(prompts), **{k: round(v, 1) for k, v in t.items()},
                          sum=round(model_it, 1), measured=round(1e3 * measured_it, 1)))
    pd.set_option("display.width", 250)
    df = pd.DataFrame(table)
    print("Per row: output tokens/s per GPU, p99 TPOT (ms, Server at the submitted QPS) and one rank's iteration "
          "(ms), measured / before (no per-request time) / after")
    print(df.to_string(index=False))
    print(f"\nThe iteration's terms (ms) at each row's load per rank (decode context {ctx:,.0f}, time-averaged)")
    print(pd.DataFrame(parts).to_string(index=False))
    for scen, g in df.groupby(df.row.str.split().str[-1]):
        print(f"{scen}: mean |error| of tokens/s per GPU {g.err_before.abs().mean():.1f} % before -> "
              f"{g.err_after.abs().mean():.1f} % after ({len(g)} runs)")


if __name__ == "__main__":
    main()
