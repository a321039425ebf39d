"""One dense layer's time terms (ms per micro-batch) on NeMo's fine-tuning rows, as run.

Why: the SFT/LoRA pairs of ``nemo_finetune_runs.csv`` show what a frozen base saves per layer;
this prints the layer's ``LAYER_TIME_TERMS`` (non-zero ones) and the measured vs modelled
step-time gap of the one SFT/LoRA pair on the same layout (Llama 2 7B, TP1 PP1, 8 GPUs), then
what the cost model credits the frozen 7B base per layer and micro-batch, piece by piece, beside
the one piece it does not price: the wgrad GEMM's accumulation into ``main_grad`` in its epilogue
(cuBLAS beta = 1: each weight's gradient read and written once per micro-batch), as a bound at the
HBM rate, for BF16 main_grads (as these runs sync them) and FP32 ones (benchmarks/RESULTS.md,
session 40 s40h2).
Run: ``PYTHONPATH=$PWD python benchmarks/nemoft_layer_terms.py``.
"""

import numpy as np

from autoparallel import measured_runs as mr
from autoparallel.costmodel import finetune
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import estimate_columns


def main():
    rows = [r for r in mr.load_runs(mr.validation_runs()) if r.id.startswith("nemoft-")]
    steps, cands = {}, {}
    for run in rows:
        out = estimate_columns(run.model, run.hardware, run.cols, run.memory_fraction)
        i = mr.best_candidate(out)
        best = {k: v[i:i + 1] if hasattr(v, "__len__") and len(v) == len(out["step_time_s"]) else v
                for k, v in run.cols.items()}
        x = candidates(run.model, run.hardware, best)
        cands[run.id] = x
        layer = lt.dense_layer(x)
        terms = {k: round(float(layer[k][0]) * 1e3, 3) for k in lt.LAYER_TIME_TERMS + ("time",) if float(layer[k][0])}
        pred = mr.predict_row(run)
        steps[run.id] = (pred["measured"], pred["predicted"])
        print(run.id, terms)
    sft, lora = (next(v for k, v in steps.items() if k.startswith(f"nemoft-llama2-7b-{kind}-")) for kind in ("sft", "lora"))
    tokens = 32 * 4096 / 8  # GBS x sequence per GPU, per step
    measured, modelled = tokens / sft[0] - tokens / lora[0], tokens / sft[1] - tokens / lora[1]
    print(f"7B SFT - LoRA step time: measured {measured:.3f} s, modelled {modelled:.3f} s; "
          f"per layer and micro-batch (32 x 4): {measured / 128 * 1e3:.2f} vs {modelled / 128 * 1e3:.2f} ms; "
          f"LoRA/SFT throughput {lora[0] / sft[0]:.3f} measured, {lora[1] / sft[1]:.3f} modelled")
    x = next(v for k, v in cands.items() if k.startswith("nemoft-llama2-7b-lora-"))
    model = x.model
    inputs = lt.gemm_input_elements(x, False)
    copies = finetune.frozen_column_copy_elements(model, inputs, lt.row_parallel_output_elements(x, False))
    first = lambda v: float(np.ravel(v)[0])  # noqa: E731 - one candidate
    weights, hbm = model.dense_layer_params / first(x.t), first(x.hbm)
    pieces = {
        "wgrad GEMMs (priced: one forward's Linear time, FP8)": first(lt.linear_time(x, model.dense_layer_params)),
        "column-wise FP8 copies not written (priced)": first(x.quantized_fraction * x.quantized_input_bytes * x.tokens
                                                             * copies / x.t) / hbm,
        "main_grad epilogue, BF16 (not priced; bound)": 2 * 2.0 * weights / hbm,
        "main_grad epilogue, FP32 (not priced; bound)": 2 * 4.0 * weights / hbm,
    }
    print("7B frozen base, per layer and micro-batch (ms):")
    for name, seconds in pieces.items():
        print(f"  {name}: {seconds * 1e3:.3f}")


if __name__ == "__main__":
    main()
