"""What profiling the tie band on Slurm would submit for GPT-3 175B on 1,024 H100 (issue 26).

The default ``search --profile job --executor slurm`` profiles the ``--top-k`` (5) best predicted
candidates, each a job on all 1,024 GPUs of ``--profile-warmup`` + ``--profile-steps`` (5 + 20)
iterations; ``profiling.budget`` prices each at the predicted step time plus a start-up
allowance, as the command prints before it submits. Also: the distinct layouts in the tie band
(ranked.md's "tie" rows: predicted within the cost model's cross-validated error of the best),
and what profiling every one of them would cost, beside NeMo AutoConfigurator's ~9 jobs of 50
steps on the whole cluster (~2,000 GPU-hours).

    python benchmarks/bench_slurm_budget.py
"""

from __future__ import annotations

from autoparallel import io
from autoparallel.profiling import budget
from autoparallel.report.tables import grouped
from autoparallel.search import run
from autoparallel.search.measured import choose
from autoparallel.search.run import default_gbs
from autoparallel.space import load_space

GPUS, TOP_K, ITERATIONS = 1024, 5, 25


def main() -> None:
    model, hw, space = io.load_model("175b"), io.load_hardware("h100-sxm"), load_space()
    result = run.search(model, hw, GPUS, default_gbs(model, None), space)
    top = result.ranked.loc[choose(result.ranked, TOP_K)]
    band = grouped(result.ranked, 50_000, hw)
    band = band[band["tie"] == "yes"]
    for label, rows in ((f"default --top-k {TOP_K}", top), ("every layout in the tie band", band)):
        steps = list(rows["step_time_s"])
        hours = budget.gpu_hours([GPUS] * len(rows), steps, ITERATIONS)
        running = budget.gpu_hours([GPUS] * len(rows), steps, ITERATIONS, startup_s=0.0)
        layouts = rows[["tp", "pp", "vp", "cp", "dp", "mbs"]].drop_duplicates()
        print(f"| {label} | {len(rows)} jobs ({len(layouts)} distinct layouts) | step {min(steps):.2f}-{max(steps):.2f} s "
              f"| {hours:,.0f} GPU-hours ({running:,.0f} in the {ITERATIONS} iterations, the rest start-up) | at most {GPUS * len(rows) * 11 / 60:,.0f} GPU-hours (11-min limit) |")


if __name__ == "__main__":
    main()
