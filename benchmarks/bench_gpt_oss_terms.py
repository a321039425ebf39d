"""GPT-OSS-120B's published rows as `validate` prices them, with the terms issue 22's helper h5 added.

For every MoE row whose id contains PATTERN (default gpt-oss): measured and predicted tokens/s/GPU, the
error, the peak memory, and per step on the priced bottleneck stage: `compute_s`, the routed experts'
eager FC2 bias (`layer_time.expert_bias_time`, forward + backward), the quick-GEGLU's eager clamp
(`layer_time.glu_clamp_time`) and the attention core (3 x its forward), in seconds; and the share of
peak the routed experts' GEMMs reach (the dense GEMM curve at the size of the GEMMs in flight together
over TransformerEngine's compute streams, `layer_time.concurrent_experts`).

    PYTHONPATH=$PWD python benchmarks/bench_gpt_oss_terms.py [PATTERN ...]
"""

from __future__ import annotations

import sys

from autoparallel.costmodel import gemm, moe
from autoparallel.costmodel import layer_time as lt
from autoparallel.measured_runs import chosen, load_runs, predict_row, priced, validation_runs


def main(patterns: list[str]) -> None:
    print("| row | measured | predicted | error % | peak GiB | step s | compute s | expert bias s | GLU clamp s | attention s | expert GEMM share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in load_runs(validation_runs(), moe=True):
        if not any(s in p.id for s in patterns):
            continue
        r = predict_row(p)
        out, i = priced(p)
        x = chosen(p, i)
        # layer-micro-batches on the stage priced: the model's layers over PP (these rows split evenly)
        n = float(x.m[0]) * p.model.num_layers / float(x.p[0])
        bias, clamp = lt.expert_bias_time(x), lt.glu_clamp_time(x, True)
        in_flight = moe.expert_gemm_flops(p.model, x.tokens / x.t, x.e, x.et) * lt.concurrent_experts(p.model, x.e)
        share = float(gemm.efficiency(x.hw, in_flight)[0])
        print(f"| {p.id} | {r['measured']:.0f} | {r['predicted']:.0f} | {r['error_pct']:+.1f} | "
              f"{r['peak_memory_gib']:.1f} | {float(out['step_time_s'][i]):.3f} | {float(out['compute_s'][i]):.3f} | "
              f"{float(bias[0][0] + bias[1][0]) * n:.3f} | {float(clamp[0][0] + clamp[1][0]) * n:.3f} | "
              f"{3 * float(lt.attention_time(x)[0]) * n:.3f} | {share:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["gpt-oss"])
