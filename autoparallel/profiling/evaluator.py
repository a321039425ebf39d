"""Profiling jobs behind the search's ``Evaluator`` protocol (DESIGN.md §2).

``ProfilingEvaluator.evaluate`` runs one job per valid candidate it is given (the search hands
it the top-k predicted layouts) and writes the measurement beside any prediction:
``measured_step_time_s``, ``measured_tokens_per_s_per_gpu``, ``measured_peak_memory_gib``,
``measured_activation_bytes``, ``measured_loss``, ``measured_device`` (the name of the device
that measured) and ``measurement_error`` (the reason of a failed job, '' when it ran). Given
candidates without predictions it fills ``fits`` and ``reason`` from the measurement itself, so
a sampler can use it alone. A failing job never raises: the launcher turns it into a reason and
the next candidate runs. A launcher with ``run_all`` (Slurm) gets every candidate at once, so
that a cluster's queue runs them side by side; the others run one job at a time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoparallel.space import row_to_plan
from autoparallel.profiling.job import JobSpec, Measurement
from autoparallel.specs.model import ModelSpec

MEASURED_COLUMNS = {
    "measured_step_time_s": "step_time_s",
    "measured_tokens_per_s_per_gpu": "tokens_per_s_per_gpu",
    "measured_peak_memory_gib": "peak_memory_gib",
    "measured_activation_bytes": "activation_bytes",
    "measured_loss": "loss",
    "measured_device": "device",
    "measured_model_tflops_per_gpu": "model_tflops_per_gpu",
}
# Written only when some job measured it (Megatron-LM logs TFLOP/s; the built-in jobs do not).
OPTIONAL_MEASURED = ("measured_model_tflops_per_gpu",)


class ProfilingEvaluator:
    def __init__(self, model: ModelSpec, launcher, steps: int = 20, warmup: int = 5,
                 timeout_s: float = 600.0, memory_cap_gib: float | None = None,
                 on_result=None, **job_options) -> None:
        self.model, self.launcher = model, launcher
        self.job_options = dict(steps=steps, warmup=warmup, timeout_s=timeout_s,
                                memory_cap_gib=memory_cap_gib, **job_options)
        self.on_result = on_result  # called with (plan, Measurement) after each job

    def measure(self, plan) -> Measurement:
        try:
            job = JobSpec(self.model, plan, **self.job_options)
        except ValueError as exc:
            return Measurement(ok=False, reason=f"not runnable: {exc}")
        try:
            return self.launcher.run(job)
        except Exception as exc:  # noqa: BLE001 - a launcher bug must not end the search
            return Measurement(ok=False, reason=f"launcher error: {type(exc).__name__}: {exc}")

    def measure_all(self, plans: list) -> list[Measurement]:
        """One Measurement per plan, in order (``on_result`` called as each one ends)."""
        run_all = getattr(self.launcher, "run_all", None)
        if run_all is None:
            out = []
            for plan in plans:
                out.append(self.measure(plan))
                if self.on_result is not None:
                    self.on_result(plan, out[-1])
            return out
        out: list[Measurement | None] = [None] * len(plans)
        jobs = []
        for i, plan in enumerate(plans):
            try:
                jobs.append((i, JobSpec(self.model, plan, **self.job_options)))
            except ValueError as exc:
                out[i] = Measurement(ok=False, reason=f"not runnable: {exc}")

        def done(k: int, m: Measurement) -> None:
            if self.on_result is not None:
                self.on_result(jobs[k][1].plan, m)
        for (i, _), m in zip(jobs, run_all([job for _, job in jobs], done)):
            out[i] = m
        return out

    def evaluate(self, candidates: pd.DataFrame) -> pd.DataFrame:
        out = candidates.copy()
        had = set(out.columns)
        for col in MEASURED_COLUMNS:
            if col not in out:
                out[col] = "" if col == "measured_device" else np.nan
        if "measurement_error" not in out:
            out["measurement_error"] = ""
        predicted = "fits" in out
        valid = [i for i, row in out.iterrows() if row["reason"] == ""]
        measured = dict(zip(valid, self.measure_all([row_to_plan(out.loc[i]) for i in valid])))
        fits, reasons = [], []
        for i, row in out.iterrows():
            if row["reason"] != "":
                fits.append(False)
                reasons.append(row["reason"])
                continue
            m = measured[i]
            for col, attr in MEASURED_COLUMNS.items():
                out.at[i, col] = getattr(m, attr)
            out.at[i, "measurement_error"] = "" if m.ok else m.reason
            fits.append(m.ok)
            reasons.append("" if m.ok else f"profiling failed: {m.reason}")
        if not predicted:
            out["fits"], out["reason"] = fits, reasons
        for col in OPTIONAL_MEASURED:
            if col not in had and not pd.to_numeric(out[col], errors="coerce").notna().any():
                out = out.drop(columns=col)
        return out
