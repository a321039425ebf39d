"""How few evaluations a sampler needs on the 175B / 1024 x H100 space (issue 5).

For each seed, run the sampler with the cost model as the objective, with no grid or published
seeds (a pure sampler), until the best feasible layout is within 2 % of the grid optimum's
predicted throughput. An *evaluation* is a call of the evaluator on a layout, as in the grid
(which evaluates every valid candidate once); trials only reach valid layouts (the sampler walks
``LayoutTree``), and a repeated layout reuses its first result. Give up at 5 % of the grid's evaluations. In-memory storage: this counts
evaluations, not storage speed.

    python benchmarks/bench_optuna.py [--sampler tpe] [--seeds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from autoparallel import io
from autoparallel.search import run, sampler
from autoparallel.search.evaluators import CostModelEvaluator
from autoparallel.space import load_space


class CountingEvaluator:
    """The cost model, counting the layouts it is asked to price."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def evaluate(self, candidates):
        self.calls += int((candidates["reason"] == "").sum())
        return self.inner.evaluate(candidates)


def evaluations_to_target(index, hw, inner, name: str, seed: int, target: float, cap: int, max_trials: int):
    """(evaluations until within target or None, evaluations run, trials run, best found)."""
    optuna = sampler._optuna()
    study = optuna.create_study(sampler=sampler.make_sampler(sampler.StudySettings(sampler=name, seed=seed)),
                                direction="maximize")
    evaluator = CountingEvaluator(inner)
    objective = sampler.make_objective(index, hw, evaluator, ("throughput",), 0.95)
    best = [0.0]
    reached: list[int] = []

    def watch(s, trial):
        if trial.user_attrs.get("reason") == "":
            best[0] = max(best[0], trial.user_attrs["metrics"]["tokens_per_s_per_gpu"])
        if best[0] >= target and not reached:
            reached.append(evaluator.calls)
        if reached or evaluator.calls >= cap:
            s.stop()
    study.optimize(objective, n_trials=max_trials, callbacks=[watch])
    return (reached[0] if reached else None), evaluator.calls, len(study.trials), best[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sampler", default="tpe")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-trials", type=int, default=2500,
                        help="stop a seed after this many trials even below the evaluation cap (time)")
    args = parser.parse_args()
    model, hw, space = io.load_model("175b"), io.load_hardware("h100-sxm"), load_space()
    grid = run.search(model, hw, 1024, 2048, space)
    valid = int((grid.ranked["reason"].eq("") | grid.ranked["reason"].str.startswith("out of memory")).sum())
    optimum = float(grid.feasible["tokens_per_s_per_gpu"].iloc[0])
    target, cap = 0.98 * optimum, int(0.05 * valid)
    index = sampler.LayoutTree(model, hw, 1024, 2048, space)
    evaluator = CostModelEvaluator(model, hw, space.memory_fraction)
    print(f"grid: {valid:,} evaluations, optimum {optimum:.1f} tok/s/GPU; target {target:.1f} within {cap:,} evaluations")
    print(f"| seed | {args.sampler} evaluations to within 2 % | share of grid evaluations | trials | best found | seconds |")
    print("|---|---|---|---|---|---|")
    counts = []
    for seed in range(args.seeds):
        start = time.perf_counter()
        n, used, trials, best = evaluations_to_target(index, hw, evaluator, args.sampler, seed, target, cap,
                                               args.max_trials)
        counts.append(n if n is not None else cap + 1)
        shown = f"{n}" if n is not None else f"not reached in {used} evaluations"
        share = f"{100 * n / valid:.2f} %" if n is not None else "-"
        print(f"| {seed} | {shown} | {share} | {trials} | {best:.1f} | {time.perf_counter() - start:.0f} |", flush=True)
    median = statistics.median(counts)
    print(f"\nmedian {median:g} evaluations = {100 * median / valid:.2f} % of the grid's evaluations "
          f"(min {min(counts)}, max {max(counts)}; {cap + 1} stands for not reached)")


if __name__ == "__main__":
    main()
