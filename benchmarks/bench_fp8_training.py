"""FP8 recipes on the tiny model: the 200-step loss table, FP8-linear error bounds, broken recipe.

    python benchmarks/bench_fp8_training.py                 # loss table, 200 steps per recipe
    python benchmarks/bench_fp8_training.py --linear-errors  # FP8 Linear vs float64, per recipe
    python benchmarks/bench_fp8_training.py --broken         # statistics of a margin=-6 recipe

Every recipe trains from the same initialisation on the same batches (generated corpus, seed 0),
so the loss gap is the recipe's alone. "final" is the mean training loss of the last 20 steps.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from autoparallel.model.fp8 import Fp8Linear, update_fp8_scales  # noqa: E402
from autoparallel.model.numerics import collect_numerics  # noqa: E402
from autoparallel.model.recipes import (BlockwiseScaling, CurrentScaling,  # noqa: E402
                                        DelayedScaling, Fp8Policy)
from autoparallel.model.train import TrainConfig, train  # noqa: E402

POLICIES = {
    "bf16": Fp8Policy(),
    "delayed": Fp8Policy(DelayedScaling()),
    "current": Fp8Policy(CurrentScaling()),
    "blockwise": Fp8Policy(BlockwiseScaling()),
}
U = {"E4M3": 2.0 ** -4, "E5M2": 2.0 ** -3}


def loss_table(steps: int, batch_size: int, seq_length: int, seed: int, names: list[str]) -> None:
    config = TrainConfig(steps=steps, batch_size=batch_size, seq_length=seq_length, seed=seed)
    print(f"tiny model, {steps} steps, batch {batch_size} x seq {config.seq_length}, "
          f"seed {seed}, torch {torch.__version__}, {config.num_threads} torch thread(s)")
    print("| recipe | loss step 1 | loss step 50 | loss last step | final (mean last 20) "
          "| vs bf16 | seconds |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for name in names:
        result = train(POLICIES[name], config)
        final = result.final_loss()
        base = final if base is None and name == "bf16" else base
        gap = f"{100 * (final - base) / base:+.2f} %" if base is not None else "n/a"
        print(f"| {name} | {result.losses[0]:.4f} | {result.losses[min(49, steps - 1)]:.4f} | "
              f"{result.losses[-1]:.4f} | {final:.4f} | {gap} | {result.seconds:.1f} |",
              flush=True)


def linear_errors(seeds: int) -> None:
    """Relative (norm-wise) error of y, dx, dw vs float64, over seeds and three shapes."""
    recipes = {"delayed HYBRID": DelayedScaling(),
               "delayed E4M3": DelayedScaling(fp8_format="E4M3"),
               "current HYBRID": CurrentScaling(), "blockwise E4M3": BlockwiseScaling()}
    shapes = [(128, 256, 128), (256, 512, 384), (64, 1024, 256)]
    print("| recipe | tensor | formats | bound sqrt(ua^2+ub^2) | mean rel. error "
          "| max rel. error |")
    print("|---|---|---|---|---|---|")
    for label, recipe in recipes.items():
        grad = "E5M2" if recipe.fp8_format == "HYBRID" else "E4M3"
        formats = {"y": ("E4M3", "E4M3"), "dx": (grad, "E4M3"), "dw": (grad, "E4M3")}
        errs: dict[str, list[float]] = {k: [] for k in formats}
        for seed in range(seeds):
            for m, k, n in shapes:
                torch.manual_seed(seed)
                layer = Fp8Linear(k, n, recipe)
                ref = torch.nn.Linear(k, n, bias=False).double()
                ref.weight.data.copy_(layer.weight.data)
                for _ in range(2):  # the second step runs on delayed (history) scales
                    x = (torch.randn(m, k) * 2).requires_grad_(True)
                    g = torch.randn(m, n) * 1e-3
                    layer.zero_grad()
                    y = layer(x)
                    y.backward(g)
                    update_fp8_scales(layer)
                xd = x.detach().double().requires_grad_(True)
                yd = ref(xd)
                yd.backward(g.double())
                for key, (got, want) in {"y": (y, yd), "dx": (x.grad, xd.grad),
                                         "dw": (layer.weight.grad, ref.weight.grad)}.items():
                    errs[key].append(((got.double() - want).norm() / want.norm()).item())
        for key, (a, b) in formats.items():
            bound = math.sqrt(U[a] ** 2 + U[b] ** 2)
            values = errs[key]
            print(f"| {label} | {key} | {a} x {b} | {bound:.4f} | "
                  f"{sum(values) / len(values):.4f} | {max(values):.4f} |")


def broken(steps: int) -> None:
    config = TrainConfig(steps=steps, batch_size=8)
    for label, recipe in {"delayed margin=0": DelayedScaling(),
                          "delayed margin=-6 (broken)": DelayedScaling(margin=-6)}.items():
        summary, losses = collect_numerics(recipe, config=config)
        inputs = summary[summary["tensor"] == "input"]
        print(f"{label}: loss after {steps} steps {losses[-1]:.4f}; FP8 layers with input "
              f"overflow > 0: {(inputs['overflow_pct'] > 0).sum()}/{len(inputs)}; "
              f"max input overflow {inputs['overflow_pct'].max():.2f} %; "
              f"min cos_sim {summary['cos_sim'].min():.4f}")
        print(summary[["layer", "tensor", "format", "overflow_pct", "underflow_pct", "cos_sim",
                       "delayed_current_ratio"]].head(6).to_string(index=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipes", nargs="+", choices=list(POLICIES), default=list(POLICIES))
    parser.add_argument("--linear-errors", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--broken", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.linear_errors:
        linear_errors(args.seeds)
    elif args.broken:
        broken(min(args.steps, 10))
    else:
        loss_table(args.steps, args.batch_size, args.seq_length, args.seed, args.recipes)
    print(f"total {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
