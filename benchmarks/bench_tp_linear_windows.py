"""Issue 27 (session 39, s39h1): each TP Linear's ring-exchange step against its own chunked GEMM.

Llama-2 70B at 8,192 tokens (MLPerf LoRA's packed sequence), FP8, userbuffers, TP2 and TP4 on H100
and H200: one ring step's transfer (BF16 and FP8 bytes), each Linear's chunk of forward GEMM (its
FLOP share of the layer's TP-split GEMM time, ``layer_time.tp_linear_shares``), the layer's average
Linear's chunk (what ``tp_comm_time`` used before), the userbuffers reduce-scatter's final sum
(``tensor_parallel.ring_reduce_time``), and the layer's ``tp_comm`` term per micro-batch (both
with FP8 all-gathers and the final reduce: only the windows differ).

    PYTHONPATH=. python benchmarks/bench_tp_linear_windows.py
"""

from __future__ import annotations

import dataclasses

from autoparallel import io
from autoparallel.costmodel import comm, layer_time as lt, tensor_parallel as tpm
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import plan_columns
from autoparallel.specs.plan import Plan

NAMES = ("QKV", "proj", "FC1", "FC2")


def layout(model, hw, tp: int, lora: bool):
    """The 8-GPU layout at ``tp`` (DP the rest), MBS 1, SP, FP8 delayed scaling, userbuffers."""
    plan = Plan(tp=tp, pp=1, vp=1, cp=1, dp=8 // tp, mbs=1, gbs=8, sp=True, precision="fp8-delayed",
                recompute="none", tp_comm_overlap=True, grad_reduce_in_fp32=False)
    if lora:
        from autoparallel.specs.finetune import Finetune
        targets = ("linear_qkv", "linear_proj")
        model = dataclasses.replace(model, finetune=Finetune("lora", 16, targets))
    return candidates(model, hw, plan_columns([plan]))


def main() -> None:
    model = dataclasses.replace(io.load_model("llama2-70b"), seq_length=8192)
    for gpu in ("h100-sxm", "h200"):
        hw = io.load_hardware(gpu)
        for tp in (2, 4):
            x = layout(model, hw, tp, lora=False)
            t_chunked = lt.linear_time(x, model.dense_layer_params, chunks=x.t)[0]
            per_domain = comm.ranks_per_domain(hw, x.t, 1)
            activation = x.tokens * model.hidden_size
            latency = comm.group(hw, x.t, per_domain).latency_s[0]
            whole = {b: comm.reduce_scatter_time(hw, b * activation, x.t, per_domain)[0] for b in (2.0, 1.0)}
            step = {b: (t - latency) / (tp - 1) + latency for b, t in whole.items()}
            shares = [s[0] for block in lt.tp_linear_shares(x, False) for s in block]
            chunks = {n: s * t_chunked / tp for n, s in zip(NAMES, shares)}
            average = t_chunked / lt.GEMMS_PER_LAYER / tp
            print(f"{gpu} TP{tp}: step BF16 {step[2.0] * 1e6:.0f} us, FP8 {step[1.0] * 1e6:.0f} us; "
                  f"reduce {tpm.ring_reduce_time(x)[0] * 1e6:.0f} us")
            print("  chunk of GEMM (us): "
                  + ", ".join(f"{n} {c * 1e6:.0f}" for n, c in chunks.items())
                  + f", average Linear {average * 1e6:.0f}")
            print("  BF16 step / chunk: "
                  + ", ".join(f"{n} {step[2.0] / c:.2f}" for n, c in chunks.items())
                  + f", average {step[2.0] / average:.2f}")
            lora = layout(model, hw, tp, lora=True)
            even = [(0.25, 0.25)] * 2
            for name, y in (("full", x), ("LoRA", lora)):
                t_lin = lt.linear_time(y, model.dense_layer_params)
                t_ch = lt.linear_time(y, model.dense_layer_params, chunks=y.t)
                per_linear = tpm.tp_comm_time(y, lt.tp_linear_shares(y, False), t_lin, t_ch)[0]
                averaged = tpm.tp_comm_time(y, even, t_lin, t_ch)[0]
                print(f"  tp_comm per layer and micro-batch, {name}: average Linear "
                      f"{averaged * 1e3:.3f} ms, per Linear {per_linear * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
