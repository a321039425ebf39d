"""What a frozen base saves per layer on a GPU: one Llama 2 7B layer (TP1, seq 4096, mbs 1), the
shape of NeMo's one SFT / LoRA pair on the same layout, forward + backward with every weight
trainable and with every weight frozen (LoRA's base: no wgrad GEMM, no transposed copies).

Why: NeMo's table implies the frozen base saves 2.40 ms per layer and micro-batch where the cost
model prices 1.13 ms (`benchmarks/nemoft_layer_terms.py`); this measures what freezing saves in
the built-in runtime, BF16 and FP8, each step alone and back to back (CUDA events).

    PYTHONPATH=. python3 benchmarks/bench_issue27_frozen_gpu.py

Needs a CUDA GPU; without one it says so and exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench_issue15_gpu import shape_for  # noqa: E402
from autoparallel.profiling import layer as layer_profile  # noqa: E402


def timed(shape: dict, frozen: bool, steps: int = 20) -> tuple[float, float]:
    """(ms each step alone, ms back to back) of one fwd+bwd, weights frozen or not."""
    run, layer, x, dy, cos, sin = layer_profile.make_layer(shape, "cuda")
    for p in layer.parameters():
        p.requires_grad_(not frozen)
    step = lambda: torch.autograd.backward(run(x, cos, sin), dy)  # noqa: E731
    for _ in range(3):
        step()
    alone = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        alone.append(start.elapsed_time(end))
    alone.sort()
    return alone[len(alone) // 2], layer_profile.back_to_back_s(step, steps) * 1e3


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_issue27_frozen_gpu: no CUDA GPU; nothing to measure.")
        return 0
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| precision | trainable ms (alone / back to back) | frozen ms | saved ms |")
    print("|---|---|---|---|")
    for precision in ("bf16", "fp8-delayed"):
        shape = shape_for("llama2-7b", 1, 4096, 1, precision)[0]
        live, cold = timed(shape, False), timed(shape, True)
        print(f"| {precision} | {live[0]:.2f} / {live[1]:.2f} | {cold[0]:.2f} / {cold[1]:.2f} | "
              f"{live[0] - cold[0]:.2f} / {live[1] - cold[1]:.2f} |", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
