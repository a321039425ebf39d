"""What the CPU can measure of the FP8 runtime (issue 15): operators per FP8 Linear, weight casts
per step, bytes a layer saves for backward, and job start time. (Host time per Linear call needs
a GPU: on a CPU the FP8 arithmetic itself is emulated and swamps it; see bench_issue15_gpu.py.)

    PYTHONPATH=. python benchmarks/bench_fp8_runtime.py                 # every part
    PYTHONPATH=. python benchmarks/bench_fp8_runtime.py --parts saved,start

Every part except ``ops`` uses only functions the code before issue 15 also had, so the same
command with ``PYTHONPATH`` pointing at an older checkout measures "before" on the same machine.
CPU figures say nothing about GPU speed; the GPU table is ``bench_issue15_gpu.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from autoparallel.model.fp8 import Fp8Linear, update_fp8_scales  # noqa: E402
from autoparallel.model.recipes import (BlockwiseScaling, CurrentScaling,  # noqa: E402
                                        DelayedScaling, Fp8Policy)
from autoparallel.specs.model import ModelSpec  # noqa: E402

RECIPES = {"fp8-delayed": DelayedScaling(), "fp8-current": CurrentScaling(),
           "fp8-blockwise": BlockwiseScaling()}
# A Llama-like layer small enough for a CPU: GQA 8 heads / 2 groups, SwiGLU.
LAYER = {"hidden": 1024, "ffn": 3584, "heads": 8, "groups": 2, "head_dim": 128, "seq": 512,
         "cp": 1, "mbs": 1, "activation": "swiglu", "norm": "rmsnorm", "recompute": "none"}


def part_ops() -> None:
    """Non-view operators one FP8 Linear forward + backward dispatches (torch's dispatch mode),
    steady state (weight cached, delayed scales set), scaled_mm backend: one operator per
    GEMM and per cast, as on a GPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and func is not torch.ops.aten.detach.default:
                self.names.append(func.name())
            return func(*args, **(kwargs or {}))

    x = torch.randn(256, 512, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(256, 384, dtype=torch.bfloat16)
    print("| layer | operators fwd+bwd | of which casts | GEMMs |")
    print("|---|---|---|---|")
    layers = {"bf16 nn.Linear": torch.nn.Linear(512, 384, bias=False).to(torch.bfloat16)}
    for name in ("fp8-delayed", "fp8-current"):
        layers[name] = Fp8Linear(512, 384, RECIPES[name], gemm_backend="scaled_mm").to(
            torch.bfloat16)
    layers["fp8-blockwise (GEMMs emulated on CPU)"] = Fp8Linear(
        512, 384, RECIPES["fp8-blockwise"]).to(torch.bfloat16)
    for name, layer in layers.items():
        for _ in range(2):
            layer(x).backward(dy)
            update_fp8_scales(layer)
        layer(x).backward(dy)  # first micro-batch of the step casts the weight
        x.grad = layer.weight.grad = None
        with Count() as c:
            layer(x).backward(dy)
        casts = sum(n.startswith("autoparallel::") for n in c.names)
        gemms = sum(n in ("aten::mm", "aten::_scaled_mm") for n in c.names)
        shown = len(c.names) if "emulated" not in name else "-"
        print(f"| {name} | {shown} | {casts} | {gemms if 'emulated' not in name else '-'} |")


def _count_weight_casts(layer, steps: int, microbatches: int, shape) -> list[int]:
    """Weight quantizations per step, counted at Fp8Linear.quantize(role='weight')."""
    from autoparallel.model.transformer import rotary_tables
    calls = []
    real = Fp8Linear.quantize

    def spy(self, x, role, *args, **kwargs):
        if role == "weight":
            calls.append(1)
        return real(self, x, role, *args, **kwargs)
    Fp8Linear.quantize = spy
    try:
        cos, sin = rotary_tables(shape["seq"], shape["head_dim"])
        per_step = []
        for _ in range(steps):
            calls.clear()
            for _ in range(microbatches):
                x = torch.randn(shape["mbs"], shape["seq"], shape["hidden"], requires_grad=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    y = layer(x, cos, sin)
                y.float().sum().backward()
            with torch.no_grad():
                for p in layer.parameters():
                    p.add_(1e-4)
            update_fp8_scales(layer)
            per_step.append(len(calls))
        return per_step
    finally:
        Fp8Linear.quantize = real


def part_weight_casts() -> None:
    from autoparallel.model.transformer import Recompute, TransformerLayer
    small = {**LAYER, "hidden": 256, "ffn": 768, "head_dim": 64, "seq": 64}
    spec = _spec(small)
    print("| recipe | FP8 linears | micro-batches per step | weight casts per step (steps 1, 2) |")
    print("|---|---|---|---|")
    for name, recipe in RECIPES.items():
        torch.manual_seed(0)
        layer = TransformerLayer(spec, Fp8Policy(recipe), 0, Recompute())
        linears = sum(isinstance(m, Fp8Linear) for m in layer.modules())
        casts = _count_weight_casts(layer, 2, 4, small)
        print(f"| {name} | {linears} | 4 | {casts} |")


def _spec(shape: dict) -> ModelSpec:
    return ModelSpec(name="layer", num_layers=1, hidden_size=shape["hidden"],
                     ffn_hidden_size=shape["ffn"], num_attention_heads=shape["heads"],
                     num_query_groups=shape["groups"], kv_channels=shape["head_dim"],
                     vocab_size=8, seq_length=shape["seq"], activation=shape["activation"],
                     normalization=shape["norm"])


def part_saved() -> None:
    """Saved-for-backward bytes and CPU fwd+bwd time of one layer (profile_layer)."""
    from autoparallel.profiling.layer import profile_layer
    torch.set_num_threads(1)
    print(f"layer: hidden {LAYER['hidden']}, ffn {LAYER['ffn']}, heads {LAYER['heads']}/"
          f"{LAYER['groups']} groups, seq {LAYER['seq']}, mbs 1, 1 thread")
    print("| precision | saved MiB | vs BF16 | CPU fwd+bwd ms |")
    print("|---|---|---|---|")
    base = None
    for precision in ("bf16", *RECIPES):
        out = profile_layer({**LAYER, "precision": precision}, steps=3, warmup=1)
        mib = out["saved_bytes"] / 2**20
        base = base or mib
        print(f"| {precision} | {mib:.2f} | {mib / base:.2f}x | {out['fwd_bwd_s'] * 1e3:.0f} |")


def _build_rank(rank: int, world: int, spec: ModelSpec, plan) -> float:
    from autoparallel.parallel.parallelize import ParallelModel
    start = time.perf_counter()
    ParallelModel(spec, plan)
    return time.perf_counter() - start


def part_start() -> None:
    """Seconds to build one rank's share of a job (ParallelModel), slowest of 2 ranks: a
    Llama-3-8B-shaped model cut to 2 layers and a 32k vocabulary (a CPU's memory), TP 2."""
    import dataclasses

    from autoparallel import io
    from autoparallel.parallel import spawn
    from autoparallel.specs.plan import Plan
    spec = dataclasses.replace(io.load_model("llama3-8b"), num_layers=2, vocab_size=32000,
                               seq_length=512)
    plan = Plan(tp=2, pp=1, dp=1, gbs=2, sp=True)
    print(f"model: {spec.name} shape, 2 layers, vocab 32000 ({spec.num_parameters / 1e9:.2f} B "
          f"params), TP 2, 2 ranks on this CPU")
    print("| run | slowest rank build s |")
    print("|---|---|")
    for run in range(2):
        result = spawn.run(_build_rank, 2, (spec, plan), timeout=900)
        if not result.ok:
            print(f"| {run + 1} | failed: {result.reason} |")
            continue
        print(f"| {run + 1} | {max(result.values):.1f} |")


PARTS = {"ops": part_ops, "weight_casts": part_weight_casts, "saved": part_saved,
         "start": part_start}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated subset of {', '.join(PARTS)}")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads available")
    for part in args.parts.split(","):
        print(f"\n## {part}\n")
        PARTS[part]()
