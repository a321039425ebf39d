"""FP8 check benchmark: wall time of a default check, and the seed noise behind its thresholds.

    python benchmarks/bench_fp8_check.py --model llama3-70b            # time one default check
    python benchmarks/bench_fp8_check.py --noise --seeds 0 1 2         # loss gap per seed, 200 steps
    python benchmarks/bench_fp8_check.py --broken                      # one damaged layer / recipe

Prints markdown tables (pasted into benchmarks/RESULTS.md (FP8 check section)). Needs torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from autoparallel import io
from autoparallel.fp8check.proxy import proxy_spec
from autoparallel.fp8check.settings import load_settings


def noise(models: list[str], seeds: list[int], recipes: list[str], steps: int) -> None:
    from autoparallel.fp8check.runner import run_policy
    from autoparallel.model.recipes import recipe_from_name
    settings = load_settings()
    window = settings.run.final_window
    print("| model proxy | seed | bf16 final | " + " | ".join(recipes) + " | worst underflow % | "
          "worst overflow % |")
    print("|---|---|---|" + "---|" * (len(recipes) + 2))
    for name in models:
        spec = proxy_spec(io.load_model(name), settings.proxy)
        for seed in seeds:
            run = dataclasses.replace(settings.run, seed=seed, steps=steps)
            base = run_policy(spec, None, run).final_loss(window)
            gaps, under, over = [], 0.0, 0.0
            for recipe in recipes:
                r = run_policy(spec, recipe_from_name(recipe), run)
                gaps.append(100 * (r.final_loss(window) - base) / base)
                per = r.stats.groupby(["layer", "tensor"])[["underflow_pct", "overflow_pct"]].mean()
                under, over = max(under, per.underflow_pct.max()), max(over, per.overflow_pct.max())
            print(f"| {name} | {seed} | {base:.4f} | " + " | ".join(f"{g:+.2f} %" for g in gaps)
                  + f" | {under:.3f} | {over:.4f} |", flush=True)


def timed_check(model: str, steps: int | None, results: str | None) -> None:
    """The default check as `autoparallel fp8-check --model M` runs it, timed end to end."""
    from pathlib import Path

    from autoparallel.fp8check.check import run_check
    from autoparallel.fp8check.report import verdict_table, write_check_folder
    settings = load_settings()
    if steps:
        settings = dataclasses.replace(settings, run=dataclasses.replace(settings.run, steps=steps))
    start = time.perf_counter()
    result = run_check(io.load_model(model), settings)
    elapsed = time.perf_counter() - start
    runs = 1 + sum(len(r) for r in result.runs.values())
    print(verdict_table(result))
    print("| run | seconds |\n|---|---|")
    print(f"| bf16 | {result.bf16.seconds:.1f} |")
    for label, rs in result.runs.items():
        for r in rs:
            print(f"| {label}{' + BF16 ' + str(list(r.bf16_layers)) if r.bf16_layers else ''} | "
                  f"{r.seconds:.1f} |")
    print(f"\n{model}: fp8-check of the default proxy ({settings.run.steps} steps, {runs} training "
          f"runs) took {elapsed:.1f} s")
    if results:
        start = time.perf_counter()
        run_dir = write_check_folder(result, Path(results), ["benchmarks/bench_fp8_check.py",
                                                             "--model", model])
        print(f"run folder {run_dir} written in {time.perf_counter() - start:.1f} s")


def broken(model: str, steps: int) -> None:
    from autoparallel.fp8check.check import run_check
    from autoparallel.fp8check.report import verdict_table
    from autoparallel.model.recipes import CurrentScaling, DelayedScaling
    settings = load_settings()
    settings = dataclasses.replace(settings, run=dataclasses.replace(settings.run, steps=steps))
    spec = io.load_model(model)
    cases = {
        "whole recipe margin -6 (overflow everywhere)": ({"fp8-delayed": DelayedScaling(margin=-6)},
                                                          None),
        "layer 1 FC2 margin -6 (overflow in one layer)": (
            {"fp8-current": CurrentScaling()}, {"layers.1.mlp.w2": CurrentScaling(margin=-6)}),
        "layer 2 all Linears margin +14 (underflow in one layer)": (
            {"fp8-current": CurrentScaling()}, {"layers.2.*": CurrentScaling(margin=14)}),
    }
    for title, (recipes, faults) in cases.items():
        result = run_check(spec, settings, recipes=recipes, module_recipes=faults)
        print(f"\n### {title}\n")
        print(verdict_table(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="llama3-70b")
    p.add_argument("--models", nargs="+", default=["llama3-70b", "gpt3-175b"])
    p.add_argument("--steps", type=int)
    p.add_argument("--results", default="results", help="write the check's run folder here ('' = no)")
    p.add_argument("--noise", action="store_true")
    p.add_argument("--broken", action="store_true")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--recipes", nargs="+", default=["fp8-delayed", "fp8-current", "fp8-blockwise"])
    a = p.parse_args()
    if a.noise:
        noise(a.models, a.seeds, a.recipes, a.steps or 200)
    elif a.broken:
        broken(a.model, a.steps or 100)
    else:
        timed_check(a.model, a.steps, a.results)


if __name__ == "__main__":
    main()
