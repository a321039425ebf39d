"""Why MLPerf Inference v5.1's B200 llama3.1-8b runs are predicted too fast: implied iterations (s51h8).

Five tables, none of which changes a figure the package prints:

1. Offline, per GPU and model: the simulated steady iteration (decoding sequences, prompt tokens, from
   the simulated run), the mean iteration the measured tokens/s implies (the same iterations, so the
   simulated mean times predicted / measured), and the cost model's terms of one pass at that shape
   (GEMM, weight read, KV read, attention math, the gated activation's pass).
2. Server / Interactive, per run: the decoding batch by Little's law from LoadGen's means
   (completed samples/s x (mean latency - mean TTFT), per replica), the prompt tokens an iteration
   carries (samples/s x mean input x mean TPOT), the measured mean TPOT as the iteration time, and the
   cost model's iteration at that shape (``IterationCost.time``). The mean input is the one of
   search_spaces/workloads.yaml (870.7 for the 8B since s52h5, from a reference-harness log; 778 assumed before).
3. Offline sensitivities: the 8B under other mean inputs (H200 FP8 and B200 NVFP4, and B200 priced as
   FP8), and the B200 8B and 70B under other NVFP4 / FP8 GEMM ratios (the measured 1.81 of
   ``gemm.NVFP4_OVER_FP8_GEMM``; 1.49 and 1.29, the same TransformerEngine table's Fprop ratios with
   the input quantization included, against FP8 current and delayed scaling; 1.0).
4. (s52h5) Each llama3.1-8b Offline row with the serving path its config runs (``serving_path``: trtllm-serve
   on TensorRT-LLM's PyTorch backend, or a TRT engine on the C++ executor), predicted vs measured.
5. (s52h5) The PyTorch backend outside MLPerf: TensorRT-LLM's perf-overview 70B rows (``PERF_OVERVIEW_70B``)
   against ``autoparallel infer``'s best layout at the same TP.
6. (s52h7) Candidate terms for the Blackwell NVFP4 residual on the PyTorch backend, each applied as a temporary
   patch (``patched``; nothing the package prints changes): the NVFP4 Linear's activation quantization as a
   kernel of its own (``activation_quant_bytes``), and the NVFP4 / FP8 GEMM ratio at the measured B200 kernel
   rates (``NVFP4_RATIO_NOQUANT``, ``NVFP4_RATIO_QUANT``); per variant the mean signed error of the perf-overview
   rows, of the v5.1 Offline rows (the 8B by serving path, DeepSeek-R1, the 70B on the C++ executor) and the
   Server iteration ratio (table 2's) of the B200 8B and 70B.
7. (s52h7) DeepSeek-R1 outside MLPerf: the perf-overview's DeepSeek-R1-0528 rows (``PERF_OVERVIEW_DSR1``, attention
   DP on the PyTorch backend, Blackwell NVFP4 and Hopper FP8) against ``infer --attention-dp``'s Offline simulation,
   at its best layout and with the max batch pinned to 512 a rank.

    PYTHONPATH=$PWD python benchmarks/bench_mlperf_v51_8b_iterations.py   # ~6 min; reads the v5.1 mirror
    # any autoparallel command under one of table 6's variants, e.g. the whole held-out report (~7 min):
    COLUMNS=400 PYTHONPATH=$PWD python benchmarks/bench_mlperf_v51_8b_iterations.py --patched \
        "ratio 1.53 + quant pass" validate --inference
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import subprocess

import numpy as np
import pandas as pd

from autoparallel import io
from autoparallel.costmodel import gemm
from autoparallel.costmodel import inference as I
from autoparallel.serve import mlperf as M
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.workload import load_workload

MIRROR = "/work/.mirror/mlcommons+inference_results_v5.1/repo"
REQUESTS = 8000  # simulated Offline requests per replica (the steady shape, not the run's count)


def replica_of(r, eff, workload=None):
    s = M.settings()
    spec, hw = io.load_model(s["models"][r.model]), io.load_hardware(r.hardware)
    wl = workload or load_workload(s["workloads"][r.model])
    cost, sched = M.harness_replica(spec, hw, eff, wl, int(r.tp), int(r.pp), int(r.max_batch), int(r.max_num_tokens),
                                    r.weight_precision, r.kv_precision, float(r.kv_fraction))
    return spec, hw, wl, cost, sched


def offline_table(rows, eff) -> pd.DataFrame:
    out = []
    for (hw_, model), g in rows[rows.scenario == "Offline"].groupby(["hardware", "model"]):
        if model not in ("llama3.1-8b", "llama2-70b") or hw_ not in ("b200", "h200"):
            continue
        r = g.iloc[0]
        meas = float((g.tokens_per_s / g.gpus).mean()) * r.tp * r.pp
        spec, hw, wl, cost, sched = replica_of(r, eff)
        run = M.run_workload(cost, sched, wl, None, REQUESTS)
        it = run.duration / run.iterations
        n = float(np.sum(run.finish - run.first_token)) / run.duration
        prompt = float(np.sum(run.input_len)) / run.iterations
        mean_in, mean_out = float(np.mean(run.input_len)), float(np.mean(run.output_len))
        lay = I.layout(spec, hw, eff, float(r.tp), float(r.pp), r.weight_precision, r.kv_precision)
        df, db = I.decode_attention(lay, 1.0, 1.0)
        pf, _ = I.prefill_attention(lay, 1.0, 1.0)
        ctx = n * (mean_in + mean_out / 2)
        af = float(np.ravel(df)[0]) * ctx + float(np.ravel(pf)[0]) * prompt * mean_in
        w = I.pass_work(lay, np.array([n + prompt]), np.array([n]), np.array([af]), np.array([float(np.ravel(db)[0]) * ctx]))
        peak = np.where(w.fp8_gemms, w.peak8 * eff.fp8_gemm_relative, w.peak16)
        hbm = w.hbm * eff.hbm
        ms = lambda x: round(1e3 * float(np.ravel(w.layers)[0]) * float(np.ravel(x)[0]), 1)  # noqa: E731
        pred = run.output_tokens_per_s
        out.append(dict(gpu=hw_, model=model, weights=r.weight_precision, runs=len(g), pred=round(pred), meas=round(meas),
                        err_pct=round(100 * (pred - meas) / meas, 1), decoding=round(n), prompt_tok=round(prompt),
                        iter_sim_ms=round(1e3 * it, 1), iter_implied_ms=round(1e3 * it * pred / meas, 1),
                        gemm=ms(I._gemm_time(eff, w.lin_flops, w.lin_gflop, peak)), weight_read=ms(w.weight_bytes / hbm),
                        kv_read=ms(w.attn_bytes / hbm), attn_math=ms(w.attn_flops / (w.attn_peak * eff.attention)),
                        gated=ms(w.gated_bytes / hbm)))
    return pd.DataFrame(out)


def summary_field(text: str, name: str) -> float:
    m = re.search(re.escape(name) + r"\s*:\s*([0-9.]+)", text)
    return float(m.group(1)) if m else np.nan


def server_table(rows, eff) -> pd.DataFrame:
    out, cache = [], {}
    keep = rows[(rows.scenario != "Offline") & rows.model.isin(["llama3.1-8b", "llama2-70b"])
                & rows.hardware.isin(["b200", "h200", "gb200"])]
    for _, r in keep.iterrows():
        path = re.search(r"@[0-9a-f]+: (\S+mlperf_log_summary.txt)", r.source).group(1)
        text = subprocess.run(["git", "-C", MIRROR, "show", "HEAD:" + path], capture_output=True, text=True).stdout
        key = (r.model, r.hardware, r.tp, r.pp, r.max_batch, r.max_num_tokens, r.weight_precision, r.kv_fraction)
        if key not in cache:
            _, _, wl, cost, _ = replica_of(r, eff)
            inp, outl = wl.sample(50_000, 0)
            cache[key] = cost, float(np.mean(inp)), float(np.mean(outl))
        cost, mean_in, mean_out = cache[key]
        qps = summary_field(text, "Completed samples per second") / int(r.replicas)
        lat, ttft, tpot = (summary_field(text, f) / 1e9 for f in
                           ("Mean latency (ns)", "Mean First Token latency (ns)", "Mean Time to Output Token (ns)"))
        n = qps * (lat - ttft)
        prompt = qps * mean_in * tpot
        ctx = n * (mean_in + mean_out / 2)
        flops = cost.ctx_flops * ctx + qps * tpot * cost.chunk_flops * mean_in * mean_in / 2
        t = cost.time(int(round(n + prompt)), int(round(n + qps * tpot)), flops, cost.ctx_bytes * ctx, int(round(n)))
        out.append(dict(gpu=r.hardware, model=r.model, scenario=r.scenario, submitter=r.submitter,
                        qps_per_replica=round(qps, 1), decoding=round(n), prompt_tok=round(prompt),
                        iter_meas_ms=round(1e3 * tpot, 1), iter_model_ms=round(1e3 * t, 1),
                        ratio=round(tpot / t, 2)))
    return pd.DataFrame(out).sort_values(["model", "gpu", "scenario", "submitter"])


def offline_pred(r, eff, workload=None, weights=None) -> float:
    if weights:
        r = r.copy()
        r["weight_precision"] = weights
    _, _, wl, cost, sched = replica_of(r, eff, workload)
    return M.run_workload(cost, sched, wl, None, REQUESTS).output_tokens_per_s


def sensitivities(rows, eff) -> list[str]:
    lines = []
    off = rows[rows.scenario == "Offline"]
    base = load_workload(M.settings()["workloads"]["llama3.1-8b"])
    for hw_, variants in (("h200", (None,)), ("b200", (None, "fp8"))):
        g = off[(off.model == "llama3.1-8b") & (off.hardware == hw_)]
        meas = float((g.tokens_per_s / g.gpus).mean())
        for mean_in in (778, 900, 1000, 1100):
            wl = dataclasses.replace(base, input=dataclasses.replace(base.input, mean=mean_in))
            for weights in variants:
                p = offline_pred(g.iloc[0], eff, wl, weights)
                lines.append(f"{hw_} llama3.1-8b mean input {mean_in}, weights {weights or g.iloc[0].weight_precision}: "
                             f"{p:.0f} vs {meas:.0f} tok/s/GPU ({100 * (p - meas) / meas:+.1f} %)")
    saved = gemm.NVFP4_OVER_FP8_GEMM
    try:
        for ratio in (saved, 2.879 / 1.932, 2.486 / 1.932, 1.0):
            gemm.NVFP4_OVER_FP8_GEMM = ratio
            parts = []
            for model in ("llama3.1-8b", "llama2-70b"):
                g = off[(off.model == model) & (off.hardware == "b200")]
                meas = float((g.tokens_per_s / g.gpus).mean())
                p = offline_pred(g.iloc[0], eff)
                parts.append(f"{model} {p:.0f} vs {meas:.0f} ({100 * (p - meas) / meas:+.1f} %)")
            lines.append(f"b200 NVFP4/FP8 GEMM ratio {ratio:.2f}: " + "; ".join(parts))
    finally:
        gemm.NVFP4_OVER_FP8_GEMM = saved
    return lines


def serving_path(r) -> str:
    """The path a row's config runs (s52h5): flags only TrtllmEndpointConfig reads (``workers_per_core``,
    ``max_concurrency``; closed/NVIDIA/code/llmlib/config.py) mean trtllm-serve on the PyTorch backend
    (NVIDIA's README: "Using TRTLLM serve (used for Deepseek-R1 and Llama3.1-8b)"); otherwise a TRT
    engine on the C++ executor."""
    path = re.search(r"(closed/\S+/configs/\S+\.py)", r.source)
    text = subprocess.run(["git", "-C", MIRROR, "show", "HEAD:" + path.group(1)], capture_output=True,
                          text=True).stdout if path else ""
    return "pytorch (trtllm-serve)" if re.search(r"'(workers_per_core|max_concurrency)'", text) else "C++ executor"


def offline_rows_8b(rows, eff) -> pd.DataFrame:
    """Each llama3.1-8b Offline row: its serving path, budget, measured and predicted tokens/s per GPU."""
    out = []
    for _, r in rows[(rows.model == "llama3.1-8b") & (rows.scenario == "Offline")].iterrows():
        meas, pred = r.tokens_per_s / r.gpus, offline_pred(r, eff) / (r.tp * r.pp)
        out.append(dict(submitter=r.submitter, gpu=r.hardware, weights=r.weight_precision, path=serving_path(r),
                        max_num_tokens=int(r.max_num_tokens), meas=round(meas), pred=round(pred),
                        err_pct=round(100 * (pred - meas) / meas, 1)))
    return pd.DataFrame(out).sort_values(["gpu", "path", "submitter"])


#: TensorRT-LLM's perf-overview, trtllm-bench throughput on the PyTorch backend ("Testing was performed using
#: the PyTorch backend"), output tokens/s per GPU, Llama 3.3 70B (NVIDIA/TensorRT-LLM@03e27c7d
#: docs/source/developer-guide/perf-overview.md): (GPU preset, TP, weights, ISL, OSL, measured). Llama 3.3
#: 70B has Llama 3.1 70B's shape (oumi-ai/oumi@bd18cd68 configs/recipes/llama3_3/README.md: vocab 128,256,
#: hidden 8,192, MLP 28,672, 80 layers, 64 / 8 heads), so the llama3.1-70b preset prices it.
PERF_OVERVIEW_70B = [("b200", 1, "nvfp4", 1000, 1000, 6920), ("b200", 1, "nvfp4", 1024, 1024, 6842),
                     ("b200", 1, "nvfp4", 1024, 8192, 3242), ("b200", 1, "nvfp4", 8192, 1024, 1362),
                     ("gb200", 1, "nvfp4", 1000, 1000, 7769), ("gb200", 1, "nvfp4", 8192, 1024, 1491),
                     ("h200", 2, "fp8", 1000, 1000, 2587), ("h200", 2, "fp8", 1024, 8192, 2009),
                     ("h200", 2, "fp8", 8192, 1024, 537), ("h100-sxm", 2, "fp8", 1000, 1000, 2209),
                     ("h100-sxm", 2, "fp8", 8192, 1024, 398)]


def perf_overview_table(variant: str = "") -> pd.DataFrame:
    """The PyTorch backend outside MLPerf (s52h5): the perf-overview's 70B rows against ``infer``'s best
    layout at the row's TP (KV FP8; ~10 s a row), under ``patched(variant)`` (s52h7)."""
    import json
    import sys
    from pathlib import Path
    here = str(Path(__file__).resolve().parent)
    prelude = (f"import runpy, sys; sys.path.insert(0, {here!r}); import bench_mlperf_v51_8b_iterations as B; "
               f"patch = B.patched({variant!r}); patch.__enter__(); sys.argv = ['autoparallel'] + sys.argv[1:]; "
               "runpy.run_module('autoparallel', run_name='__main__')")
    out = []
    for gpu, tp, weights, isl, osl, meas in PERF_OVERVIEW_70B:
        cmd = [sys.executable, "-c", prelude, "infer", "--model", "llama3.1-70b", "--gpus", str(tp), "--gpu", gpu,
               "--tp", str(tp), "--pp", "1", "--input-len", str(isl), "--output-len", str(osl), "--weight-precision",
               weights, "--kv-precision", "fp8", "--no-save", "--json"]
        best = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["ranked"][0]
        pred = best["output_tokens_per_s_per_gpu"]
        out.append(dict(gpu=gpu, tp=tp, weights=weights, isl=isl, osl=osl, meas=meas, pred=round(pred),
                        err_pct=round(100 * (pred - meas) / meas, 1)))
    return pd.DataFrame(out)


#: The NVFP4 / FP8 GEMM ratio measured on Blackwell (SM100 CUTLASS kernels, vLLM's kernel benchmark) at a
#: Llama-3.1-8B shape, M=16384 N=6144 K=4096, TFLOP/s: NVFP4 3,904.3 without and 3,038.8 with its activation
#: quantization (vllm-project/vllm PR #20646, "Before" table), FP8 per-tensor 2,544.7 without and 2,225.8 with
#: (PR #19566, B200 per its series #18778). Against 1.81 (``gemm.NVFP4_OVER_FP8_GEMM``, TransformerEngine's
#: Blackwell Ultra training kernels), which the serving model prices NVFP4 GEMMs at.
NVFP4_RATIO_NOQUANT = 3904.329097 / 2544.683145
NVFP4_RATIO_QUANT = 3038.844961 / 2225.828721
#: Bytes per element of one NVFP4 activation quantization kernel: the 16-bit input read, 4-bit values and one
#: E4M3 scale per 16 written.
QUANT_PASS_BYTES = 2.0 + 0.5 + 1.0 / 16.0
#: The variants of table 6: a name -> (NVFP4 / FP8 GEMM ratio or None for the shipped one, quantization pass).
CANDIDATES = {"as shipped": (None, False), "quant pass": (None, True),
              "ratio 1.53 + quant pass": (NVFP4_RATIO_NOQUANT, True), "ratio 1.37": (NVFP4_RATIO_QUANT, False)}


def activation_quant_bytes(lay, tokens):
    """HBM bytes per layer and GPU of the NVFP4 activation quantization TensorRT-LLM's PyTorch backend runs as a
    kernel of its own before a Linear (``fp4_quantize`` unless the input already is an ``Fp4QuantizedTensor``:
    NVIDIA/TensorRT-LLM tensorrt_llm/_torch/modules/linear.py, NVFP4 ``apply``; its Llama layer at TP1 fuses no
    norm with it, modeling_llama.py @012cf909): the QKV, output-projection and FC1 inputs (FC2's is the gated
    activation's write, priced there at the weights' bytes). Zeros for weights of a byte or more."""
    m = lay.model
    tokens = np.asarray(tokens, dtype=float)
    per_token = 2.0 * m.hidden_size + m.num_attention_heads * m.head_dim / lay.tp
    return np.where(lay.weight_bytes < 1.0, tokens * per_token * QUANT_PASS_BYTES, 0.0)


@contextlib.contextmanager
def patched(variant: str):
    """``CANDIDATES[variant]`` applied to the cost model while the block runs (``""``: as shipped)."""
    ratio, quant = CANDIDATES.get(variant or "as shipped")
    saved = gemm.NVFP4_OVER_FP8_GEMM, I.gated_activation_bytes
    try:
        if ratio is not None:
            gemm.NVFP4_OVER_FP8_GEMM = ratio
        if quant:
            I.gated_activation_bytes = lambda lay, tokens, _o=saved[1]: _o(lay, tokens) + activation_quant_bytes(lay, tokens)
        yield
    finally:
        gemm.NVFP4_OVER_FP8_GEMM, I.gated_activation_bytes = saved


def candidates_table(rows, eff) -> pd.DataFrame:
    """Table 6: per candidate variant, the mean signed error % of output tokens/s per GPU by source and group,
    and the B200 Server iteration ratio (measured / model, table 2's)."""
    offline = rows[(rows.scenario == "Offline") & rows.model.isin(["llama3.1-8b", "llama2-70b", "deepseek-r1"])]
    paths = {i: serving_path(r) for i, r in offline[offline.model == "llama3.1-8b"].iterrows()}
    out = {}
    for variant in CANDIDATES:
        col = {}
        po = perf_overview_table(variant)
        for (gpu, weights, wide), g in po.groupby(["gpu", "weights", po.osl > po.isl]):
            col[("perf-overview 70B", f"{gpu} {weights}" + (" decode-heavy" if wide else ""))] = g.err_pct.mean()
        with patched(variant):
            M.clear_simulations()
            rep = M.predict_rows(offline, cross=False)
            server = server_table(rows, eff)
        M.clear_simulations()
        for i, r in rep.iterrows():
            key = ("v5.1 Offline", f"{r.hardware} {r.model} " + (paths[i].split()[0] if i in paths else
                                                                  "pytorch ADP" if r.model == "deepseek-r1" else "C++"))
            col.setdefault(key, []).append(r.in_sample_pct)
        for (model, gpu), g in server[server.gpu.isin(["b200", "gb200"]) & (server.scenario == "Server")].groupby(
                ["model", "gpu"]):
            col[("v5.1 Server ratio", f"{gpu} {model}")] = g.ratio.mean()
        out[variant] = {k: float(np.mean(v)) for k, v in col.items()}
    return pd.DataFrame(out).round(2)


#: The perf-overview's DeepSeek-R1-0528 table (NVIDIA/TensorRT-LLM@03e27c7d docs/source/developer-guide/
#: perf-overview.md; trtllm-bench throughput on the PyTorch backend with ``enable_attention_dp``, the CUTLASS MoE,
#: FP8 KV cache, CUDA graphs with padding): (GPU preset, ranks, weights, ISL, OSL, measured output tokens/s per
#: GPU). B200 / GB200 "DEP4 (FP4)" (nvidia/DeepSeek-R1-0528-NVFP4-v2), H200 "DEP8 (FP8)" (deepseek-ai/
#: DeepSeek-R1-0528: block-scaled FP8, priced as FP8 weights); the deepseek-v3 preset prices it (s52h1).
PERF_OVERVIEW_DSR1 = [("b200", 4, "nvfp4", 1000, 1000, 6463), ("b200", 4, "nvfp4", 1024, 8192, 3862),
                      ("b200", 4, "nvfp4", 8192, 1024, 1168), ("gb200", 4, "nvfp4", 1000, 1000, 6939),
                      ("gb200", 4, "nvfp4", 1024, 8192, 4379), ("h200", 8, "fp8", 1000, 1000, 1627),
                      ("h200", 8, "fp8", 1024, 8192, 1218)]


def perf_overview_dsr1_table(requests: int = 3000) -> pd.DataFrame:
    """Table 7: the perf-overview's DeepSeek-R1 rows against ``infer --attention-dp --scenario offline`` (its
    best layout, and the max batch pinned to 512 a rank; ``requests`` simulated, 3,000 as the doc's 1K/1K runs)."""
    import json
    import sys
    out = []
    for gpu, ranks, weights, isl, osl, meas in PERF_OVERVIEW_DSR1:
        row = dict(gpu=gpu, ranks=ranks, weights=weights, isl=isl, osl=osl, meas=meas)
        for label, extra in (("best", []), ("batch 512", ["--max-batch", "512"])):
            cmd = [sys.executable, "-m", "autoparallel", "infer", "--model", "deepseek-v3", "--gpus", str(ranks),
                   "--gpu", gpu, "--tp", str(ranks), "--pp", "1", *extra, "--attention-dp", "--weight-precision",
                   weights, "--kv-precision", "fp8", "--input-len", str(isl), "--output-len", str(osl), "--scenario",
                   "offline", "--requests", str(requests), "--no-save", "--json"]
            best = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["ranked"][0]
            pred = best["output_tokens_per_s_per_gpu"]
            row[f"pred_{label}"] = round(pred)
            row[f"err_{label}_pct"] = round(100 * (pred - meas) / meas, 1)
            if label == "best":
                row["best_max_batch"] = best["config"]["max_batch"]
        out.append(row)
    return pd.DataFrame(out)


def main() -> None:
    rows, _ = M.load_rows("mlperf_inference_v51.csv")
    eff = efficiency_for("tensorrt-llm")
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 500)
    print("Offline: steady iteration, simulated vs implied, and the cost model's terms there (ms)")
    print(offline_table(rows, eff).to_string(index=False))
    print("\nServer / Interactive: Little's-law iteration from LoadGen's means vs the cost model there")
    print(server_table(rows, eff).to_string(index=False))
    print("\nllama3.1-8b Offline per row: serving path (from the config's flags), predicted vs measured")
    print(offline_rows_8b(rows, eff).to_string(index=False))
    print("\nOffline sensitivities (tokens/s per GPU, predicted vs measured mean)")
    print("\n".join(sensitivities(rows, eff)))
    print("\nTensorRT-LLM perf-overview (PyTorch backend) Llama 3.3 70B, output tokens/s per GPU vs infer's best layout")
    print(perf_overview_table().to_string(index=False))
    print("\nCandidate terms (s52h7): mean signed error % (Server: measured / model iteration) per variant")
    print(candidates_table(rows, eff).to_string())
    print("\nTensorRT-LLM perf-overview DeepSeek-R1-0528 (attention DP, PyTorch backend), output tokens/s per GPU vs "
          "infer --attention-dp --scenario offline")
    print(perf_overview_dsr1_table().to_string(index=False))


if __name__ == "__main__":
    import runpy
    import sys
    if sys.argv[1:2] == ["--patched"]:  # an autoparallel command under ``patched(variant)``
        with patched(sys.argv[2]):
            sys.argv = ["autoparallel", *sys.argv[3:]]
            runpy.run_module("autoparallel", run_name="__main__")
    else:
        main()
