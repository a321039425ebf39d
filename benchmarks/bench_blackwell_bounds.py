"""Why the b200 family's dense fit pressed its bounds (issue 22): the 17 rows it fits, what each
row's step is made of, which rows push each fitted constant, and the attention / elementwise valley.

    python benchmarks/bench_blackwell_bounds.py            # decomposition and gradient, ~1 min
    python benchmarks/bench_blackwell_bounds.py --valley   # + refits along the valley, ~3 min more

1. *Decomposition* (the shipped constants): each row's residual (log predicted / measured, %) and
   the share of its step in the GEMMs (d log step / d log(1 / gemm_max)), the attention core, the
   elementwise kernels, the FP8 casts, the exposed TP traffic and the rest (bubble, PP, DP, ...).
2. *Gradient*: the rows refitted as ``calibrate`` does (``calibrate.fit``), then per row
   residual x d residual / d log(constant): the sum is the fit's gradient, so the rows with the
   largest terms are what holds a constant on its bound (+: the loss rises with the constant).
3. *Valley* (``--valley``): refits with the attention core's share of peak held at given values at
   every length (``HardwareSpec.attention_efficiency``): the elementwise constant the fit then takes,
   and the error. With the attention fitted, the two trade nearly one for one across these rows; the
   cuDNN measurements b200.yaml states (``measured_attention_ms``) pin the attention instead.
4. *cuDNN's measured attention* (b200.yaml ``measured_attention_ms``; and cuDNN 9.19 on H200,
   NVIDIA/cudnn-frontend 3929da2 ``h200_919_only_cudnn``, against what h100-sxm prices) per causal
   score by sequence length, the share of peak it implies, and the fitted rows' kernel lengths.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from autoparallel import io
from autoparallel.costmodel import calibrate
from autoparallel.measured_runs import default_runs, load_runs, log_error, priced

FAMILY = "b200"
# cuDNN 9.19 on H200 (NVIDIA/cudnn-frontend 3929da2 benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/
# llama3.1_20260227_034703.csv, BF16, top_left (causal), 64 query / 8 KV heads, head dim 128):
# [batch, tokens, query heads, forward ms, backward ms], kernel times from the profiler.
CUDNN_H200 = ((1, 2048, 64, 0.142, 0.464), (1, 4096, 64, 0.465, 1.450), (1, 8192, 64, 1.708, 5.083),
              (1, 16384, 64, 6.531, 19.002), (1, 32768, 64, 25.566, 75.688))
OTHER = ("cp_comm_s", "pp_comm_s", "bubble_s", "dp_comm_s", "offload_s", "optimizer_s", "recompute_s")


def family_rows():
    return [p for p in load_runs(list(default_runs())) if p.family == FAMILY]


def _step(p, hw, **constants):
    hw = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **constants))
    out, i = priced(p, hw)
    return out, i


def decomposition(rows) -> None:
    print("## 1. What each fitted row's step is made of (shipped constants; % of the step)\n")
    print("| row | resid % | GEMMs | attention | elementwise | FP8 casts | TP exposed | rest |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in rows:
        hw = p.hardware
        out, i = _step(p, hw)
        total = out["step_time_s"][i]
        gemm = (total - _step(p, hw, gemm_max=hw.efficiency.gemm_max * 1.01)[0]["step_time_s"][i]) / (1 - 1 / 1.01)
        slow = dataclasses.replace(hw, attention_efficiency=tuple((t, share / 2) for t, share in hw.attention_efficiency))
        attention = priced(p, slow)[0]["step_time_s"][i] - total
        elementwise = total - _step(p, hw, elementwise_bytes_per_token_hidden=1e-9)[0]["step_time_s"][i]
        rest = sum(out[k][i] for k in OTHER)
        cells = [gemm, attention, elementwise, out["fp8_cast_s"][i], out["tp_comm_s"][i], rest]
        print(f"| {p.id[5:]} | {100 * log_error(p):+.1f} | " + " | ".join(f"{100 * c / total:.1f}" for c in cells) + " |")


def gradient(rows) -> None:
    hw = io.load_hardware(FAMILY)
    fit = calibrate.fit(rows, hw.efficiency, donor=calibrate.speed_donor(hw))
    values = {k: v for k, v in fit.values.items() if k in calibrate.FITTED}
    eff = dataclasses.replace(hw.efficiency, release_speed=fit.values["release_speed"], **values)
    names = list(values)
    base = np.array([log_error(p, eff) for p in rows])
    print(f"\n## 2. What holds each constant (refitted: {fit.before:.2f} -> {fit.after:.2f} %; "
          + ", ".join(f"{k} {v:.4g}" for k, v in values.items())
          + f"; on a bound: {', '.join(h.name for h in fit.at_bounds) or 'none'})\n")
    print("residual x d residual / d log(constant), x 1e4; the sum is the fit's gradient (+: the loss rises "
          "with the constant)\n")
    print("| row | resid % | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    terms = {}
    for n in names:
        step = -0.05 if getattr(eff, n) >= calibrate.FITTED[n][1] else 0.05
        moved = dataclasses.replace(eff, **{n: getattr(eff, n) * np.exp(step)})
        terms[n] = base * (np.array([log_error(p, moved) for p in rows]) - base) / step
    for i, p in enumerate(rows):
        print(f"| {p.id[5:]} | {100 * base[i]:+.2f} | " + " | ".join(f"{1e4 * terms[n][i]:+.2f}" for n in names) + " |")
    print("| **sum** | | " + " | ".join(f"**{1e4 * terms[n].sum():+.2f}**" for n in names) + " |")


def valley(rows, shares=(0.3309, 0.3842, 0.42, 0.45)) -> None:
    print("\n## 3. The attention / elementwise valley: refits with the attention's share held\n")
    print("| attention share | per score, ps (B200, d 128) | elementwise | gemm_max | mean abs error % | on a bound |")
    print("|---:|---:|---:|---:|---:|---|")
    for share in shares:
        held = [dataclasses.replace(p, hardware=dataclasses.replace(p.hardware, attention_efficiency=((8192, share),)))
                for p in rows]
        hw = io.load_hardware(FAMILY)
        fit = calibrate.fit(held, hw.efficiency, donor=calibrate.speed_donor(hw))
        ps = 3 * 2 * 2 * 128 / 2250e12 / share * 1e12
        print(f"| {share:.4f} | {ps:.3f} | {fit.values['elementwise_bytes_per_token_hidden']:.1f} | "
              f"{fit.values['gemm_max']:.4f} | {fit.after:.2f} | {', '.join(h.name for h in fit.at_bounds)} |")


def _ps_per_score(batch, tokens, heads, forward_ms, backward_ms) -> float:
    return (forward_ms + backward_ms) * 1e-3 / (batch * heads * tokens**2 / 2) * 1e12


def cudnn_table(rows) -> None:
    hw = io.load_hardware(FAMILY)
    bound = 3 * max(2 * 2 * 128 / (hw.bf16_tflops * 1e12), 1 / (hw.exp_tera_per_s * 1e12)) * 1e12
    print("\n## 4. cuDNN's measured attention per causal score (forward + backward), the share of peak it prices\n")
    print(f"b200.yaml measured_attention_ms, less measured_attention_host_ms {hw.measured_attention_host_ms} ms (the "
          f"model's full-efficiency time on B200 {bound:.3f} ps):\n")
    print("| tokens | forward ms | backward ms | ps per score as timed | less the host floor | share of peak |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in hw.measured_attention_ms:
        kernel = (*row[:3], row[3] + row[4] - hw.measured_attention_host_ms, 0.0)
        print(f"| {row[1]:.0f} | {row[3]} | {row[4]} | {_ps_per_score(*row):.3f} | {_ps_per_score(*kernel):.3f} | "
              f"{hw.attention_peak_share(row[1]):.3f} |")
    lengths = sorted({float(s) for p in rows for s in p.built.s_local})
    print("\nThe fitted rows' kernel lengths (s / cp): " + ", ".join(
        f"{t:.0f} ({bound / hw.attention_peak_share(t):.2f} ps)" for t in lengths))
    h100 = io.load_hardware("h100-sxm")
    h_bound = 3 * max(2 * 2 * 128 / (h100.bf16_tflops * 1e12), 1 / (h100.exp_tera_per_s * 1e12)) * 1e12
    print(f"\nH200, cuDNN 9.19 kernel times (CUPTI; NVIDIA/cudnn-frontend 3929da2 h200_919_only_cudnn), against what "
          f"h100-sxm prices (its fitted share, {h100.efficiency.attention:.4f}, where it states no measurement):\n")
    print("| tokens | ps per score | share of peak | h100-sxm prices, ps |")
    print("|---:|---:|---:|---:|")
    for row in CUDNN_H200:
        print(f"| {row[1]} | {_ps_per_score(*row):.3f} | {h_bound / _ps_per_score(*row):.3f} | "
              f"{h_bound / h100.attention_peak_share(row[1]):.3f} |")


def main(argv: list[str]) -> None:
    rows = family_rows()
    decomposition(rows)
    gradient(rows)
    if "--valley" in argv:
        valley(rows)
    cudnn_table(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
