"""How few trials a sampler needs on the 175B / 1024 x H100 space (issue 5).

For each seed, run the sampler with the cost model as the objective, with no grid or published
seeds (a pure sampler), and record the number of trials until the best feasible layout is within
2 % of the grid optimum's predicted throughput; give up at 5 % of the grid's evaluations.
In-memory storage: this measures trials, not storage speed.

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


def trials_to_target(index, hw, evaluator, name: str, seed: int, target: float, cap: int) -> tuple[int | None, float]:
    optuna = sampler._optuna()
    settings = sampler.StudySettings(sampler=name, seed=seed, trials=cap)
    study = optuna.create_study(sampler=sampler.make_sampler(settings), direction="maximize")
    objective = sampler.make_objective(index, hw, evaluator, ("throughput",))
    best = [0.0]
    reached: list[int] = []

    def watch(s, trial):
        if trial.user_attrs.get("reason") == "":
            best[0] = max(best[0], trial.user_attrs["metrics"]["tokens_per_s_per_gpu"])
        if best[0] >= target and not reached:
            reached.append(trial.number + 1)
            s.stop()
    study.optimize(objective, n_trials=cap, callbacks=[watch])
    return (reached[0] if reached else None), best[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sampler", default="tpe")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    model, hw, space = io.load_model("175b"), io.load_hardware("h100-sxm"), load_space()
    grid = run.search(model, hw, 1024, 2048, space)
    valid = int((grid.ranked["reason"].eq("") | grid.ranked["reason"].str.startswith("out of memory")).sum())
    optimum = float(grid.feasible["tokens_per_s_per_gpu"].iloc[0])
    target, cap = 0.98 * optimum, int(0.05 * valid)
    index = sampler.CandidateIndex(model, hw, 1024, 2048, space)
    evaluator = CostModelEvaluator(model, hw, space.memory_fraction)
    print(f"grid: {valid:,} evaluations, optimum {optimum:.1f} tok/s/GPU; target {target:.1f} within {cap:,} trials")
    print(f"| seed | {args.sampler} trials to within 2 % | share of grid evaluations | best found | seconds |")
    print("|---|---|---|---|---|")
    counts = []
    for seed in range(args.seeds):
        start = time.perf_counter()
        n, best = trials_to_target(index, hw, evaluator, args.sampler, seed, target, cap)
        counts.append(n if n is not None else cap + 1)
        shown = f"{n}" if n is not None else f"not within {cap}"
        share = f"{100 * n / valid:.2f} %" if n is not None else "-"
        print(f"| {seed} | {shown} | {share} | {best:.1f} | {time.perf_counter() - start:.0f} |", flush=True)
    median = statistics.median(counts)
    print(f"\nmedian {median:g} trials = {100 * median / valid:.2f} % of the grid's evaluations "
          f"(min {min(counts)}, max {max(counts)})")


if __name__ == "__main__":
    main()
