"""``autoparallel estimate --from-log``: the prediction for a logged run beside what it measured.

The log's layout is priced exactly as ``calibrate`` prices it (``measured_runs.prepare_row`` on the
row ``runs import`` would write), so what this shows is the error a calibration sees. Terms the
log measures are compared one to one: the step time, Megatron's TFLOP/s, tokens/s, the
``forward-backward`` and ``optimizer`` timers (``--timing-log-level`` >= 1) against the step
without and with only the optimizer step, and the peak memory PyTorch allocated against the
predicted peak less the runtime reserve the preset adds for what PyTorch does not allocate
(CUDA context, NCCL buffers, fragmentation). The rest of the breakdown is shown as predicted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from autoparallel import io
from autoparallel.runlogs.runrow import read_log, steady_intervals, to_row


def compare(path: Path, gpu: str, warmup: int | None = None) -> dict[str, Any]:
    """``{"log", "gpu", "run", "terms": [{term, measured, predicted, error_pct}], "prediction"}``."""
    from autoparallel import measured_runs
    from autoparallel.costmodel.estimate import estimate_columns, estimate_plan
    from autoparallel.space import row_to_plan

    log = read_log(path)
    hw = io.load_hardware(gpu)
    row = to_row(log, hw.name, warmup)
    prepared = measured_runs.prepare_row(pd.Series(row), io.read_yaml(measured_runs.ASSUMPTIONS))
    out = estimate_columns(prepared.model, prepared.hardware, prepared.cols, prepared.memory_fraction)
    plan = row_to_plan(prepared.candidates.iloc[measured_runs.best_candidate(out)])
    prediction = estimate_plan(prepared.model, prepared.hardware, plan, prepared.memory_fraction)
    time_s, memory = prediction["breakdown"]["time_s"], prediction["breakdown"]["memory_gib"]
    steady = steady_intervals(log, warmup)

    def timer_s(name: str) -> float | None:
        ms = log.measurements.median_timer_ms(name, steady)
        return None if ms is None else ms / 1000.0

    pairs = [
        ("step time (s)", row["measured_iteration_time_s"], prediction["step_time_s"]),
        ("TFLOP/s/GPU (Megatron's count)", row["measured_model_tflops_per_gpu"], prediction["model_tflops_per_gpu"]),
        ("tokens/s/GPU", row["measured_tokens_per_s_per_gpu"], prediction["tokens_per_s_per_gpu"]),
        ("forward-backward timer (s)", timer_s("forward-backward"),
         prediction["step_time_s"] - time_s["optimizer_s"]),
        ("optimizer timer (s)", timer_s("optimizer"), time_s["optimizer_s"]),
        ("peak memory allocated (GiB)", row["measured_max_allocated_gib"],
         prediction["peak_memory_gib"] - memory["reserve_gib"]),
        ("peak memory reserved (GiB)", row["measured_max_reserved_gib"], prediction["peak_memory_gib"]),
    ]
    terms = [{"term": name, "measured": measured, "predicted": float(predicted),
              "error_pct": None if measured is None else 100.0 * (predicted - measured) / measured}
             for name, measured, predicted in pairs]
    return {"log": str(path), "framework": log.framework, "gpu": hw.name, "run": row["id"],
            "num_gpus": row["num_gpus"], "terms": terms, "prediction": prediction}


def _figure(value: float) -> str:
    """Four significant figures, thousands grouped: 10,160 tokens/s, not 1.016e+04."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def main(path: Path, gpu: str, as_json: bool, console: Console, warmup: int | None = None) -> None:
    result = compare(path, gpu, warmup)
    if as_json:
        print(json.dumps(result, indent=1))
        return
    c = result["prediction"]["config"]
    title = (f"{Path(result['log']).name} ({result['framework']}): {result['num_gpus']} x {result['gpu']}, "
             f"TP{c['tp']} PP{c['pp']} VP{c['vp']} CP{c['cp']} DP{c['dp']} MBS{c['mbs']} GBS{c['gbs']} "
             f"{c['precision']} recompute={c['recompute']}" + (" FSDP" if c["fsdp"] else ""))
    console.print(title, highlight=False)  # a line of its own: as the table's title rich centred it over three
    t = Table(header_style="bold")
    for name in ("term", "measured", "predicted", "error %"):
        t.add_column(name, justify="left" if name == "term" else "right")
    for term in result["terms"]:
        measured = "not logged" if term["measured"] is None else _figure(term["measured"])
        error = "" if term["error_pct"] is None else f"{term['error_pct']:+.1f}"
        t.add_row(term["term"], measured, _figure(term["predicted"]), error)
    breakdown = result["prediction"]["breakdown"]
    for key, value in breakdown["time_s"].items():
        t.add_row(f"  predicted: {key[:-2]} (s)", "", _figure(value), "")
    for key, value in breakdown["memory_gib"].items():
        t.add_row(f"  predicted: {key[:-4]} (GiB)", "", _figure(value), "")
    console.print(t)
    console.print("Allocated memory is compared with the predicted peak less the preset's runtime reserve "
                  "(CUDA context, NCCL buffers, fragmentation), which PyTorch does not count as allocated.")
