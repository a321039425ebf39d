"""One dense layer's time terms (ms per micro-batch) on NeMo's fine-tuning rows, as run.

Why: the SFT/LoRA pairs of ``nemo_finetune_runs.csv`` show what a frozen base saves per layer;
this prints the layer's ``LAYER_TIME_TERMS`` (non-zero ones) and the measured vs modelled
step-time gap of the one SFT/LoRA pair on the same layout (Llama 2 7B, TP1 PP1, 8 GPUs).
Run: ``PYTHONPATH=$PWD python benchmarks/nemoft_layer_terms.py``.
"""

from autoparallel import measured_runs as mr
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import estimate_columns


def main():
    rows = [r for r in mr.load_runs(mr.validation_runs()) if r.id.startswith("nemoft-")]
    steps = {}
    for run in rows:
        out = estimate_columns(run.model, run.hardware, run.cols, run.memory_fraction)
        i = mr.best_candidate(out)
        best = {k: v[i:i + 1] if hasattr(v, "__len__") and len(v) == len(out["step_time_s"]) else v
                for k, v in run.cols.items()}
        layer = lt.dense_layer(candidates(run.model, run.hardware, best))
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


if __name__ == "__main__":
    main()
