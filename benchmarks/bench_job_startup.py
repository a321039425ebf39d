"""Where a profiling job's time before its first step goes (issue 15 row 9), run after run.

    PYTHONPATH=. python benchmarks/bench_job_startup.py                    # CPU default below
    PYTHONPATH=. python benchmarks/bench_job_startup.py --device cuda --layers 4 --seq 8192 \\
        --vocab 0 --gbs 8                                                   # row 9's job on a GPU

Runs ``--runs`` times the job ``launcher.run_local`` runs for a search (one rank, warm-up 1,
``--steps`` timed steps) of llama3-8b cut to ``--layers`` layers and ``--seq`` tokens (and, on
the CPU, a ``--vocab`` of 16384 so that the states fit; 0 keeps the model's; ``--hidden 256``
shrinks it to show the fixed costs alone), and prints each run's split and the median of each
column:

  spawn   launcher start -> the rank's function entered (interpreter, imports: torch, the
          parent's __main__ re-imported by the spawn start method, unpickling)
  group   joining the process group
  build   the rank's model (meta build, parameters initialised, optimizer)
  first   the first (warm-up) step
  exit    the last step's end -> the launcher returns (result sent back, processes joined)
  before  wall less (warm-up + steps) x the median step: row 9's "launcher wall less steps"

This script imports only what the launcher needs, so the spawned rank's re-import of it is
cheap; ``--heavy-main`` imports the cost model at module level as bench_issue15_gpu.py does, to
show what that re-import costs a rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if "--heavy-main" in sys.argv:  # what bench_issue15_gpu.py's module level imports
    for name in ("torch", "autoparallel.costmodel.estimate", "autoparallel.profiling.layer"):
        importlib.import_module(name)

COLUMNS = ("spawn_s", "group_s", "build_s", "first_step_s", "exit_s")


def job_spec(args: argparse.Namespace):
    """Row 9's job (llama3-8b, TP1, mbs 1, BF16) cut to this machine."""
    from autoparallel import io
    from autoparallel.profiling.job import JobSpec
    from autoparallel.specs.plan import Plan
    spec = io.load_model("llama3-8b")
    spec = dataclasses.replace(spec, num_layers=args.layers, seq_length=args.seq,
                               vocab_size=args.vocab or spec.vocab_size)
    if args.hidden:  # the same shape scaled down (head dim 128, FFN 3.5x, 4 heads a group)
        heads = max(1, args.hidden // 128)
        spec = dataclasses.replace(spec, hidden_size=args.hidden, num_attention_heads=heads,
                                   ffn_hidden_size=7 * args.hidden // 2,
                                   num_query_groups=max(1, heads // 4))
    plan = Plan(tp=1, pp=1, dp=1, gbs=args.gbs, mbs=1, precision="bf16")
    return JobSpec(spec, plan, steps=args.steps, warmup=1, timeout_s=560, device=args.device)


def split(m, steps: int) -> dict:
    """The Measurement's start-up columns, its wall and row 9's figure."""
    row = {k: getattr(m, k) for k in COLUMNS}
    row["wall_s"] = m.wall_s
    row["step_s"] = m.step_time_s
    row["before_s"] = m.wall_s - (steps + 1) * m.step_time_s
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=16384, help="0: the model's own")
    parser.add_argument("--hidden", type=int, default=0,
                        help="a hidden size to scale the model down to, for the fixed costs "
                        "alone (0: the model's 4096)")
    parser.add_argument("--gbs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--heavy-main", action="store_true")
    args = parser.parse_args(argv)
    from autoparallel.profiling.launcher import run_local
    job = job_spec(args)
    rows = []
    names = (*COLUMNS, "step_s", "wall_s", "before_s")
    print("run " + " ".join(f"{n.split('_')[0]:>7}" for n in names), flush=True)
    for run in range(args.runs):
        m = run_local(job)
        if not m.ok:
            print(f"run {run}: failed: {m.reason}")
            return 1
        rows.append(split(m, args.steps))
        print(f"{run:>3} " + " ".join(f"{rows[-1][n]:7.2f}" for n in names), flush=True)
    print("med " + " ".join(f"{statistics.median(r[n] for r in rows):7.2f}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
