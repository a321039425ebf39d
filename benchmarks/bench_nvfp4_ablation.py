"""NVFP4 ablation on the fp8-check proxy: the full recipe against the recipe without the random
Hadamard transform, without stochastic rounding, and without 16x16 weight blocks (issue 23
item 2; NVIDIA's NVFP4 report, arXiv 2509.25149, ablates the same parts at 12B scale).

Every run trains the proxy of ``--model`` from the same initial weights on the same batches as
the BF16 run (``autoparallel.fp8check.runner``); the table gives the final-loss gap to BF16 per
seed and its mean, and the mean squared quantization error of the wgrad GEMM's operands
(input_t, grad_output_t: the error norm is the same before and after the orthogonal RHT, so the
columns compare across variants). MXFP8 is the reference row.

    PYTHONPATH=. python benchmarks/bench_nvfp4_ablation.py --steps 60 --seeds 0,1,2
    PYTHONPATH=. python benchmarks/bench_nvfp4_ablation.py --steps 200 --seeds 0 --variants nvfp4,no-rht,no-sr
    PYTHONPATH=. python benchmarks/bench_nvfp4_ablation.py --rounding-bias --steps 20 --seeds 0,1,2

``--rounding-bias`` measures the mechanism instead of the loss (the slow test's statistic): on
the dY^T every wgrad GEMM of the full recipe's run casts at its last step, the error of the mean
of 32 stochastic casts against round-to-nearest's (``microscaling.rounding_bias``).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from autoparallel import io
from autoparallel.fp8check import verdict as V
from autoparallel.fp8check.proxy import proxy_spec
from autoparallel.fp8check.runner import last_step_casts, run_policy
from autoparallel.fp8check.settings import load_settings
from autoparallel.model.microscaling import rounding_bias
from autoparallel.model.recipes import Mxfp8BlockScaling, Nvfp4BlockScaling

VARIANTS = {
    "nvfp4": Nvfp4BlockScaling(),                                  # the full recipe
    "no-rht": Nvfp4BlockScaling(random_hadamard=False),
    "no-sr": Nvfp4BlockScaling(stochastic_rounding=False),         # round-to-nearest gradients
    "no-2d": Nvfp4BlockScaling(weight_2d=False),                   # 1x16 weight blocks
    "mxfp8": Mxfp8BlockScaling(),
}


def ablation(model: str, steps: int, seeds: list[int], variants: dict) -> list[dict]:
    """One row per variant: loss gap to BF16 per seed and mean, wgrad operand MSE."""
    settings = load_settings()
    spec = proxy_spec(io.load_model(model), settings.proxy)
    rows = {label: {"variant": label} for label in variants}
    for seed in seeds:
        run = dataclasses.replace(settings.run, steps=steps, seed=seed,
                                  final_window=min(settings.run.final_window, steps))
        base = run_policy(spec, None, run).final_loss(run.final_window)
        for label, recipe in variants.items():
            record = run_policy(spec, recipe, run)
            rows[label][f"gap_seed{seed}_pct"] = V.loss_gap_pct(
                record.final_loss(run.final_window), base)
            stats = V.summarize(record.stats)
            for tensor in ("input_t", "grad_output_t"):
                mse = stats.loc[stats["tensor"] == tensor, "mse"].mean()
                rows[label].setdefault(f"{tensor}_mse", []).append(mse)
    out = []
    for row in rows.values():
        gaps = [row[f"gap_seed{s}_pct"] for s in seeds]
        row["mean_gap_pct"] = sum(gaps) / len(gaps)
        for tensor in ("input_t", "grad_output_t"):
            values = row[f"{tensor}_mse"]
            row[f"{tensor}_mse"] = sum(values) / len(values)
        out.append(row)
    return out


def bias_table(model: str, steps: int, seeds: list[int], draws: int = 32) -> str:
    """Per seed, over the 16 wgrad dY casts: stochastic rounding's mean-of-``draws`` error,
    round-to-nearest's error (both relative to |dY|, against the clamped dY) and their ratio."""
    settings = load_settings()
    spec = proxy_spec(io.load_model(model), settings.proxy)
    lines = ["| seed | casts | SR mean-of-32 error | RTN error | ratio min / max |",
             "|---|---|---|---|---|"]
    for seed in seeds:
        run = dataclasses.replace(settings.run, steps=steps, seed=seed)
        grads = last_step_casts(spec, Nvfp4BlockScaling(), run)
        torch.manual_seed(seed)
        pairs = [rounding_bias(g, draws) for g in grads.values()]
        ratios = [sr / rtn for sr, rtn in pairs]
        lines.append(f"| {seed} | {len(pairs)} | {sum(p[0] for p in pairs) / len(pairs):.4f} | "
                     f"{sum(p[1] for p in pairs) / len(pairs):.4f} | "
                     f"{min(ratios):.3f} / {max(ratios):.3f} |")
    return "\n".join(lines)


def markdown(rows: list[dict], seeds: list[int]) -> str:
    head = (["variant"] + [f"gap seed {s} (%)" for s in seeds]
            + ["mean gap (%)", "wgrad X MSE", "wgrad dY MSE"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ([r["variant"]] + [f"{r[f'gap_seed{s}_pct']:+.2f}" for s in seeds]
                 + [f"{r['mean_gap_pct']:+.2f}", f"{r['input_t_mse']:.3e}",
                    f"{r['grad_output_t_mse']:.3e}"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3.1-8b")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--rounding-bias", action="store_true",
                        help="the stochastic-rounding mechanism instead of the loss ablation")
    args = parser.parse_args()
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown or not chosen:
        parser.error(f"--variants: {', '.join(unknown) or 'none given'}; choose from "
                     f"{', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    start = time.perf_counter()
    if args.rounding_bias:
        table = bias_table(args.model, args.steps, seeds)
        print(f"NVFP4 rounding bias, proxy of {args.model}, step {args.steps}, seeds {seeds} "
              f"({time.perf_counter() - start:.0f} s)\n\n{table}")
        return
    rows = ablation(args.model, args.steps, seeds, {v: VARIANTS[v] for v in chosen})
    print(f"NVFP4 ablation, proxy of {args.model}, {args.steps} steps, seeds {seeds} "
          f"({time.perf_counter() - start:.0f} s)\n")
    print(markdown(rows, seeds))


if __name__ == "__main__":
    main()
