"""What a batch of Slurm profiling jobs costs, said before anything is submitted (issue 26).

Why: on a cluster each job holds all of a layout's GPUs; the tie band of a 1,024-GPU search is
thousands of GPU-hours if profiled carelessly. Before submitting, ``confirm`` prints the number
of jobs and the GPU-hours they are predicted to take (each job: its GPUs x (iterations x the
predicted step time + a start-up allowance)) and the most they may take (GPUs x the time
limit), and asks; ``--yes`` skips the question, and where no one can answer (stdin is not a
terminal) the command stops unless ``--yes`` was given.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from autoparallel.errors import UserError
from autoparallel.words import plural

# Per job: queue start to the first timed iteration of a Megatron-LM job on a large cluster
# (imports, NCCL communicators, model build, the first iteration's compilation and allocation).
STARTUP_S = 300.0


def gpu_hours(gpus: Sequence[int], step_times_s: Sequence[float], iterations: int,
              startup_s: float = STARTUP_S) -> float:
    """Predicted GPU-hours of jobs of ``gpus`` GPUs whose step times are ``step_times_s``."""
    return sum(g * (iterations * t + startup_s) for g, t in zip(gpus, step_times_s)) / 3600.0


def summary(gpus: Sequence[int], step_times_s: Sequence[float] | None, iterations: int, limit_s: float) -> str:
    jobs, total = len(gpus), sum(gpus)
    most = total * limit_s / 3600.0
    text = f"{plural(jobs, 'Slurm job')}, {plural(total, 'GPU')} in all"
    if step_times_s is not None:
        text += (f": about {gpu_hours(gpus, step_times_s, iterations):,.1f} GPU-hours predicted ({iterations} "
                 f"iterations at the predicted step time + {STARTUP_S:.0f} s start-up each)")
    return text + f", at most {most:,.1f} GPU-hours (the time limit of {limit_s / 60:.0f} min each)"


def confirm(text: str, yes: bool, console=None) -> None:
    """Print ``text``; go on with ``yes``, else ask on the terminal (UserError if declined, or
    if there is no terminal to ask on)."""
    if console is not None:
        console.print(f"about to submit {text}")
    if yes:
        return
    if not sys.stdin.isatty():
        raise UserError(f"about to submit {text}; nothing submitted: add --yes to submit without a prompt")
    answer = input("submit? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise UserError("nothing submitted (answered no)")
