"""DeepSeek-V3's own run on 2,048 H800 (the validation row ``deepseek-v3-report-h800-...``, issue 22):
where its predicted memory and time go.

Prints, for each candidate of the row (the micro-batch size is not stated), the prediction, the
memory by kind and the step's breakdown; then, for the one validate reports, one MoE layer's
costs per micro-batch, each stage's time per micro-batch, one dispatch, and what the V3 report
states beside them (arXiv 2412.19437 §3.2-3.3). Last, the peak of a DualPipe end rank (the first
stage and the last one) and of a middle rank (two copies of a middle stage), which hold the
attention output in the report's E5M6 (§3.3.3, 1.5 B per element; priced since 2026-11-27).

    PYTHONPATH=$PWD python benchmarks/bench_dsv3_h800.py
"""

from __future__ import annotations

import numpy as np

from autoparallel import io, measured_runs
from autoparallel.costmodel import dispatch, layer_time, peak_memory, pipeline
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import BREAKDOWN_KEYS, MEMORY_KEYS, estimate_columns
from autoparallel.costmodel.stages import stage_params, stage_times

GIB = 2.0**30


def main() -> None:
    runs = measured_runs.read_runs()
    row = runs[runs["id"].str.startswith("deepseek-v3-report")].iloc[0]
    prepared = measured_runs.prepare_row(row, io.read_yaml(measured_runs.ASSUMPTIONS))
    out = estimate_columns(prepared.model, prepared.hardware, prepared.cols, prepared.memory_fraction)
    best = measured_runs.best_candidate(out)
    print(f"{prepared.id}: measured {float(row['measured_tokens_per_s_per_gpu']):.0f} tokens/s/GPU")
    for i, plan in prepared.candidates.iterrows():
        mark = "  <- reported" if i == best else ""
        print(f"\nmbs {plan['mbs']}  layout {plan['pipeline_model_parallel_layout']}  "
              f"recompute {plan['recompute_modules']}{mark}")
        print(f"  predicted {out['tokens_per_s_per_gpu'][i]:.0f} tokens/s/GPU, step {out['step_time_s'][i]:.2f} s, "
              f"peak {out['peak_memory_gib'][i]:.1f} GiB, fits {bool(out['fits'][i])}")
        print("  memory GiB: " + ", ".join(f"{k[:-4]} {out[k][i]:.2f}" for k in MEMORY_KEYS))
        print("  time s: " + ", ".join(f"{k[:-2]} {out[k][i]:.3f}" for k in BREAKDOWN_KEYS))

    cols = {k: v[best:best + 1] for k, v in prepared.cols.items()}
    x = candidates(prepared.model, prepared.hardware, cols)
    layers = layer_time.layers(x)
    moe = layers.moe
    print("\nOne MoE layer, one micro-batch (ms): forward "
          f"{moe['forward'][0] * 1e3:.1f} (attention core {layer_time.attention_time(x)[0] * 1e3:.1f}, "
          f"routed experts {layer_time.routed_experts_time(x)[0] * 1e3:.1f}); "
          + ", ".join(f"{k} {moe[k][0] * 1e3:.2f}" for k in layer_time.LAYER_TIME_TERMS if moe[k][0]))
    stages = stage_times(x, layers)
    print(f"Stage time per micro-batch (ms): first {stages.first[0] * 1e3:.0f}, middle {stages.middle[0] * 1e3:.0f}, "
          f"last {stages.last[0] * 1e3:.0f} (of which output layers, loss and MTP {stages.logits[0] * 1e3:.0f})")
    one = dispatch.dispatch_time(x.hw, x.model, x.tokens / x.t, x.e, x.et, x.imbalance,
                                 x.knobs["moe_token_dispatcher_type"])[0]
    total = 4 * one
    print(f"One flex (DeepEP) dispatch {one * 1e3:.2f} ms; dispatch + combine each way {total * 1e3:.1f} ms per "
          f"layer and micro-batch against {moe['compute'][0] * 1e3:.1f} ms of compute (report §3.2.1: "
          f"computation-to-communication ratio about 1:1); a token reaches "
          f"{float(dispatch.nodes_per_token(x.model, 8.0)):.1f} of 8 nodes (node-limited routing: at most 4); "
          f"{dispatch.FLEX_DISPATCHER_SMS} SMs for communication (report: 20); IB {x.hw.internode_gbps:.0f} GB/s "
          f"per GPU (report: 50); busiest EP rank {x.imbalance[0]:.2f}x the even share")

    first_moe, last_moe = peak_memory.dualpipe_stage_moe(x)  # contiguous stages
    params = stage_params(x, layers, (first_moe, last_moe))
    counts = [(x.first_layers, first_moe), (x.middle_layers, x.middle_moe), (x.last_layers, last_moe)]
    acts, _ = peak_memory.activation_bytes(x, layers)
    states = [sum(peak_memory.model_states(x, layers, p, n, n_moe)) for p, (n, n_moe) in zip(params, counts)]
    end = (acts[0] + states[0] + states[2])[0] / GIB + x.hw.reserve_gib
    middle = (acts[1] + pipeline.DUALPIPE_PARAMETER_COPIES * states[1])[0] / GIB + x.hw.reserve_gib
    print(f"\nDualPipe ranks (reserve included): an end rank {end:.1f} GiB (the first stage's and the last's states, "
          f"PP micro-batches of the first, one of the last; the first stage the model's first {x.first_layers[0]:.0f} "
          f"layers, {first_moe[0]:.0f} of them MoE), a middle rank {middle:.1f} GiB (two copies of the middle "
          f"stage's states, PP+1 micro-batches); the attention output kept in the report's E5M6 (1.5 B per element, "
          f"§3.3.3; column attention_output_cache_precision), {x.hw.memory_gib:g} GiB GPU")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
