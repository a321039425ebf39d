"""DeepSeek-R1 under attention data parallelism (TensorRT-LLM's PyTorch backend) is predicted ~1.5-2.2x too fast:
the missing time per iteration on runs whose per-rank batch is known, and each sourced candidate's size (s52h11).

Rows (output tokens/s per GPU, measured): three ``trtllm-bench throughput`` runs of NVIDIA/TensorRT-LLM@f0c873f5
docs/source/blogs/Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md (ISL 1024 / OSL 2048 with zero spread,
``enable_attention_dp``, TP8 EP8, the concurrency = 8 x ``max_batch_size``, so each rank holds its whole batch):
H200 "max-throughput" (DeepSeek-R1 FP8, KV at the model's BF16, batch 128, max_num_tokens 1151: 1,436), B200 "R1
with FP16 KV" (NVFP4, batch 384, 1536 tokens: 4,548), B200 "R1-0528 with FP8 KV" (NVFP4, batch 896, 2048 tokens:
5,393); and the MLPerf Inference v5.1 DeepSeek-R1 Offline rows of ``data/mlperf_inference_v51.csv`` (512 a rank,
NVIDIA's B200 / GB200; 1536 on GB300).

Per row: ``infer --attention-dp --scenario offline`` (the MLPerf rows: ``mlperf.predict_rows``), the iteration
both imply at the full batch (batch / tokens/s per GPU), the gap in ms and per sequence, and what each candidate
would need or gives:

- ``balance``: the ranks run in lock-step (every MoE layer all-gathers all ranks' tokens), so an iteration takes
  the slowest rank's time. TensorRT-LLM's own measurement on the MLPerf DeepSeek-R1 dataset (GB200, DEP8, ADP
  balance on: NVIDIA/TensorRT-LLM@011cfc2c docs/source/blogs/tech_blog/blog10_ADP_Balance_Strategy.md) puts the
  perfectly balanced ("SOL") throughput at 37,912 against 34,140 measured: a factor 1.110; the ratio left after it.
- ``mla_tflops``: the MLA decode rate (TFLOP/s) at which the absorbed decode attention alone would fill the gap
  (the model prices it at the fitted ``attention`` share 1.0 of the KV precision's peak); FlashMLA's dense decode
  reaches 660 TFLOP/s, 67 % of H800's BF16 peak (deepseek-ai/FlashMLA README).
- ``bf16_proj_ms``: NVIDIA's NVFP4 checkpoint leaves ``self_attn.fused_a``, ``q_b_proj`` and ``kv_b_proj`` (and
  the router) unquantized (mlcommons/inference_results_v5.1@965182b0 closed/NVIDIA/code/deepseek-r1/tensorrt/
  hf_quant_config.json ``exclude_modules``), so those GEMMs run in BF16 where the model prices NVFP4: the added
  time per iteration (the GEMM terms only; Hopper FP8 rows: 0).
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd

from autoparallel import io
from autoparallel.costmodel import inference as I
from autoparallel.serve import mlperf as M
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.workload import load_workload

MIRROR = "/work/.mirror/mlcommons+inference_results_v5.1/repo"
#: (label, GPU, weights, KV, max batch a rank, max_num_tokens, requests simulated, measured tokens/s per GPU)
BEST_PERF = [("bp h200 b128", "h200", "fp8", "bf16", 128, 1151, 5120, 1436.1584),
             ("bp b200 b384", "b200", "nvfp4", "bf16", 384, 1536, 12288, 4548.0105),
             ("bp b200 b896", "b200", "nvfp4", "fp8", 896, 2048, 28672, 5393.2755)]
#: blog10's perfectly balanced over measured throughput with ADP balance on (37,912 / 34,140)
BALANCE = 37912 / 34140
#: parameters per layer of the projections NVIDIA's NVFP4 checkpoint keeps in BF16: fused_a (q_a + kv_a with the
#: rotary key), q_b and kv_b
def bf16_projection_params(m) -> float:
    fused_a = m.hidden_size * (m.q_lora_rank + m.kv_lora_rank + m.qk_pos_emb_head_dim)
    q_b = m.q_lora_rank * m.num_attention_heads * m.qk_dim
    kv_b = m.kv_lora_rank * m.num_attention_heads * (m.qk_dim - m.qk_pos_emb_head_dim + m.v_dim)
    return float(fused_a + q_b + kv_b)


def infer_pred(gpu, weights, kv, batch, tokens, requests) -> float:
    cmd = [sys.executable, "-m", "autoparallel", "infer", "--model", "deepseek-v3", "--gpus", "8", "--gpu", gpu,
           "--tp", "8", "--pp", "1", "--attention-dp", "--weight-precision", weights, "--kv-precision", kv,
           "--max-batch", str(batch), "--max-num-tokens", str(tokens), "--input-len", "1024", "--output-len", "2048",
           "--scenario", "offline", "--requests", str(requests), "--no-save", "--json"]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["ranked"][0][
        "output_tokens_per_s_per_gpu"]


def candidates(eff, spec, gpu, weights, kv, batch, ctx, prompt_per_iter, gap_s) -> dict:
    """The per-iteration MLA decode rate that would close ``gap_s`` alone, and the BF16 projections' added time."""
    hw = io.load_hardware(gpu)
    lay = I.layout(spec, hw, eff, 8.0, 1.0, weights, kv, ep=8.0, attention_dp=True)
    df, _ = I.decode_attention(lay, float(batch), float(ctx))
    w = I.pass_work(lay, np.array([batch + prompt_per_iter]), np.array([float(batch)]), np.ravel(df), np.zeros(1))
    layers = float(np.ravel(w.layers)[0])
    flops = layers * float(np.ravel(df)[0])
    t_attn = flops / (float(np.ravel(w.attn_peak)[0]) * eff.attention)
    mla = flops / (t_attn + gap_s) / 1e12
    extra = 0.0
    if weights == "nvfp4":
        f = 2.0 * bf16_projection_params(spec) * (batch + prompt_per_iter)
        g = w.lin_gflop
        t16 = I._gemm_time(eff, f, g, w.peak16)
        t4 = I._gemm_time(eff, f, g, w.peak8 * eff.fp8_gemm_relative)
        extra = layers * float(np.ravel(t16 - t4)[0])
    return dict(attn_tflop=round(flops / 1e12, 1), model_attn_ms=round(1e3 * t_attn, 1), mla_tflops=round(mla),
                mla_pct_peak=round(100 * mla * 1e12 / float(np.ravel(w.attn_peak)[0]), 1),
                bf16_proj_ms=round(1e3 * extra, 1))


def model_iteration(eff, spec, gpu, weights, kv, n, ctx, prompt) -> float:
    """Seconds of one rank's iteration of ``n`` decoding sequences at context ``ctx`` beside ``prompt`` prompt
    tokens (their causal attention left out), priced by the cost model (``stage_pass``)."""
    lay = I.layout(spec, io.load_hardware(gpu), eff, 8.0, 1.0, weights, kv, ep=8.0, attention_dp=True)
    df, db = I.decode_attention(lay, float(n), float(ctx))
    return float(I.stage_pass(lay, np.array([n + prompt]), np.array([float(n)]), np.ravel(df), np.ravel(db))["time"][0])


def server_table(eff, spec, rows, ctx, mean_in) -> pd.DataFrame:
    """The Server rows' mean TPOT against the model's iteration at their Little's-law load per rank (LoadGen's
    samples/s x (mean latency - mean TTFT) over the ranks; prompt tokens an iteration: the rank's arrivals x the mean
    input x TPOT), from each run's ``mlperf_log_summary.txt`` in the mirror."""
    import re
    out = []
    for _, r in rows[(rows.model == "deepseek-r1") & (rows.scenario == "Server")].iterrows():
        path = re.search(r"@[0-9a-f]+: (\S+mlperf_log_summary.txt)", r.source).group(1)
        text = subprocess.run(["git", "-C", MIRROR, "show", "HEAD:" + path], capture_output=True, text=True).stdout
        field = lambda name: float(re.search(re.escape(name) + r"\s*:\s*([0-9.]+)", text).group(1))  # noqa: E731
        qps = field("Completed samples per second")
        lat, ttft, tpot = (field(f) / 1e9 for f in ("Mean latency (ns)", "Mean First Token latency (ns)",
                                                    "Mean Time to Output Token (ns)"))
        n = qps * (lat - ttft) / r.gpus
        prompt = qps / r.gpus * mean_in * tpot
        it = model_iteration(eff, spec, r.hardware, r.weight_precision, r.kv_precision, n, ctx, prompt)
        out.append(dict(row=f"{r.submitter} {r.hardware} Server", per_rank=round(n), tpot_mean_ms=round(1e3 * tpot, 1),
                        model_ms=round(1e3 * it, 1), gap_ms=round(1e3 * (tpot - it), 1),
                        gap_us_per_seq=round(1e6 * (tpot - it) / n)))
    return pd.DataFrame(out)


def main() -> None:
    eff, spec = efficiency_for("tensorrt-llm"), io.load_model("deepseek-v3")
    out = []
    for label, gpu, weights, kv, batch, tokens, requests, meas in BEST_PERF:
        pred = infer_pred(gpu, weights, kv, batch, tokens, requests)
        gap = batch / meas - batch / pred
        # uniform 1024 / 2048: the decode context averages 1024 + 1024; batch / 2048 prompts of 1024 an iteration
        out.append(dict(row=label, batch=batch, meas=round(meas), pred=round(pred), ratio=round(pred / meas, 2),
                        it_meas_ms=round(1e3 * batch / meas, 1), it_model_ms=round(1e3 * batch / pred, 1),
                        gap_ms=round(1e3 * gap, 1), gap_us_per_seq=round(1e6 * gap / batch),
                        ratio_after_balance=round(pred / meas / BALANCE, 2),
                        **candidates(eff, spec, gpu, weights, kv, batch, 2048, batch / 2, gap)))
    rows, _ = M.load_rows("mlperf_inference_v51.csv")
    off = rows[(rows.model == "deepseek-r1") & (rows.scenario == "Offline")]
    rep = M.predict_rows(off, cross=False)
    inp, outl = load_workload(M.settings()["workloads"]["deepseek-r1"]).sample(50_000, 0)
    # a long-tailed answer is in flight in proportion to its length: the time-averaged context of a decoding sequence
    ctx = float(np.mean(inp)) + float(np.mean(outl.astype(float) ** 2) / (2 * np.mean(outl)))
    prompt_per_iter_share = float(np.mean(inp)) / float(np.mean(outl))
    for (hw_, batch), g in rep.groupby(["hardware", "max_batch"]):
        meas = float((g.tokens_per_s / g.gpus).mean())
        pred = float((g.tokens_per_s / g.gpus * (1 + g.in_sample_pct / 100)).mean())
        gap = batch / meas - batch / pred
        weights, kv = g.weight_precision.iloc[0], g.kv_precision.iloc[0]
        out.append(dict(row=f"mlperf {hw_} Offline ({len(g)})", batch=int(batch), meas=round(meas), pred=round(pred),
                        ratio=round(pred / meas, 2), it_meas_ms=round(1e3 * batch / meas, 1),
                        it_model_ms=round(1e3 * batch / pred, 1), gap_ms=round(1e3 * gap, 1),
                        gap_us_per_seq=round(1e6 * gap / batch), ratio_after_balance=round(pred / meas / BALANCE, 2),
                        **candidates(eff, spec, hw_, weights, kv, int(batch), ctx,
                                     batch * prompt_per_iter_share, gap)))
    df = pd.DataFrame(out)
    # the two B200 runs of the same workload at 384 and 896 a rank: iteration = fixed + per sequence x batch
    b = df[df.row.isin(["bp b200 b384", "bp b200 b896"])]
    for col, name in (("it_meas_ms", "measured"), ("it_model_ms", "model")):
        slope = (b[col].iloc[1] - b[col].iloc[0]) / (b.batch.iloc[1] - b.batch.iloc[0])
        print(f"B200 1K/2K {name:8s} iteration = {b[col].iloc[0] - slope * b.batch.iloc[0]:5.1f} ms + "
              f"{1e3 * slope:5.1f} us x sequences a rank")
    pd.set_option("display.width", 250)
    print(f"MLPerf decode context (time-averaged, long-tailed answers): {ctx:,.0f} tokens")
    print(df.to_string(index=False))
    print("\nServer: mean TPOT vs the model's iteration at the runs' load per rank")
    srv = server_table(eff, spec, rows, ctx, float(np.mean(inp)))
    print(srv.to_string(index=False))
    # the MLPerf B200 / GB200 runs (Offline at the full batch, Server at their load) on one line each
    pts = [(r.batch, r.it_meas_ms, r.it_model_ms) for r in df.itertuples()
           if r.row.startswith(("mlperf b200", "mlperf gb200"))]
    pts += [(r.per_rank, r.tpot_mean_ms, r.model_ms) for r in srv.itertuples() if " gb300 " not in r.row]
    n, meas, model = (np.array(v, dtype=float) for v in zip(*pts))
    for y, name in ((meas, "measured"), (model, "model")):
        slope, icept = np.polyfit(n, y, 1)
        worst = np.max(np.abs(y - icept - slope * n))
        print(f"MLPerf B200/GB200 {name:8s} iteration = {icept:5.1f} ms + {1e3 * slope:5.1f} us x sequences a rank "
              f"(least squares over {len(n)} points: Offline per GPU, each Server run; max |residual| {worst:.1f} ms)")


if __name__ == "__main__":
    main()
