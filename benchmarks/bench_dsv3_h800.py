"""DeepSeek-V3's own run on 2,048 H800 (the validation row ``deepseek-v3-report-h800-...``, issue 22):
where its predicted memory and time go.

Prints, for each candidate of the row (the micro-batch size is not stated), the prediction, the
memory by kind and the step's breakdown; then, for the one validate reports, one MoE layer's
costs per micro-batch, each stage's time per micro-batch, one dispatch, and what the V3 report
states beside them (arXiv 2412.19437 §3.2-3.3). Last, the memory a stated item the cost model
does not price would spare, by hand: the attention output cached once in DeepSeek's E5M6 (§3.3.2,
12 bits if packed; the row keeps Megatron's BF16 copy, which the fused attention and the output
projection share), on a DualPipe middle rank (PP+1 micro-batches of its stage's layers) and on an
end rank (PP of the first stage's, one of the last's with its MTP layer).

    PYTHONPATH=$PWD python benchmarks/bench_dsv3_h800.py
"""

from __future__ import annotations

import numpy as np

from autoparallel import io, measured_runs
from autoparallel.costmodel import dispatch, layer_time, memory, pipeline
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import BREAKDOWN_KEYS, MEMORY_KEYS, estimate_columns
from autoparallel.costmodel.stages import stage_times

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

    model, tokens = x.model, float(x.tokens[0])
    per_layer = (memory.GEMM_INPUT_BYTES - 1.5) * tokens * model.num_attention_heads * model.v_dim  # BF16 -> E5M6
    held = float(pipeline.dualpipe_inflight(x.p)[0])
    own, other = (float(np.ravel(c)[0]) for c in pipeline.dualpipe_chunks(x.p, 0))
    middle = held * float(x.middle_layers[0])
    end = own * float(x.first_layers[0]) + other * (float(x.last_layers[0]) + model.mtp_num_layers)
    print(f"\nNot priced, by hand: the attention output in E5M6 (1.5 B per element, not BF16's 2) spares "
          f"{per_layer / GIB:.3f} GiB per layer and micro-batch; a middle rank's {middle:.0f} layer-micro-batches "
          f"{middle * per_layer / GIB:.1f} GiB, an end rank's {end:.0f} {end * per_layer / GIB:.1f} GiB")

if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
