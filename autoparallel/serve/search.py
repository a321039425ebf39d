"""Latency-bounded serving search: the layout with the most output tokens/s per GPU under a bound.

Candidates are every valid (tp, pp, weight precision, KV precision) crossed with the batch
sizes of the space, plus, per structure, the largest batch that fits in memory and the largest
that also meets the latency bound (found by a vectorised bisection: latency and memory grow
with the batch). Every candidate is priced at once by ``costmodel.inference``; those that break
a rule, do not fit or miss the bound stay in the table with the reason. The feasible ones are
ranked by output tokens/s per GPU (the whole deployment: ``replicas = gpus / (tp * pp)``
independent servers), ties broken by the lower latency metric.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autoparallel import io
from autoparallel.costmodel.inference import (LATENCY_METRICS, InferenceEfficiency,
                                              estimate_static_columns)
from autoparallel.errors import UserError
from autoparallel.report import run_folder
from autoparallel.serve import export
from autoparallel.serve.space import InferenceSpace, check_lengths, structures
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

METRIC_COLUMN = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "latency_ms"}
POINT_KEYS = ("ttft_ms", "tpot_ms", "latency_ms", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
              "fits", "memory_per_gpu_gib")
LAYOUT = ("tp", "pp", "replicas", "batch", "weight_precision", "kv_precision")
MAX_BATCH = 1 << 15


@dataclass(frozen=True)
class Request:
    """What the deployment must serve and how fast."""

    input_len: int
    output_len: int
    max_latency_ms: float | None = None
    latency_metric: str = "tpot"

    def __post_init__(self) -> None:
        if self.latency_metric not in LATENCY_METRICS:
            raise UserError(f"--latency-metric {self.latency_metric!r} is not one of {', '.join(LATENCY_METRICS)}")
        if self.max_latency_ms is not None and not self.max_latency_ms > 0:
            raise UserError(f"--max-latency-ms must be positive, got {self.max_latency_ms:g}")


@dataclass
class InferenceResult:
    model: ModelSpec
    hardware: HardwareSpec
    gpus: int
    request: Request
    space: InferenceSpace
    efficiency: InferenceEfficiency
    ranked: pd.DataFrame  # every candidate, feasible first and best first; rank NA elsewhere

    @property
    def feasible(self) -> pd.DataFrame:
        return self.ranked[self.ranked["feasible"]]

    def entry(self, rank: int) -> pd.Series:
        n = len(self.feasible)
        if not 1 <= rank <= n:
            raise UserError(f"rank {rank} is out of range: this run has {n} feasible layouts (1..{n})")
        return self.feasible.iloc[rank - 1]

    def records(self, top: int) -> list[dict]:
        return [record(row) for _, row in self.feasible.head(top).iterrows()]


def record(row) -> dict:
    """One candidate as the stable JSON object (the issue's keys first, then the layout)."""
    out = {k: (bool(row[k]) if k == "fits" else float(row[k])) for k in POINT_KEYS}
    out["config"] = {k: (str(row[k]) if "precision" in k else int(row[k])) for k in LAYOUT}
    out["breakdown"] = {
        "memory_gib": {k: float(row[k]) for k in ("weights_gib", "kv_cache_gib", "activations_gib", "reserve_gib")},
        "decode_pass_ms": {k[:-2]: 1e3 * float(row[k]) for k in
                           ("decode_compute_s", "decode_memory_s", "decode_tp_comm_s", "decode_overhead_s",
                            "decode_pp_s")},
    }
    return out


def _estimate(model, hw, eff, space, request, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    n = len(frame)
    cols = {k: frame[k].to_numpy() for k in ("tp", "pp", "batch", "weight_precision", "kv_precision")}
    cols["input_len"] = np.full(n, request.input_len)
    cols["output_len"] = np.full(n, request.output_len)
    return estimate_static_columns(model, hw, eff, cols, space.memory_fraction, space.prefill_chunk_tokens)


def _meets(est: dict, request: Request) -> np.ndarray:
    if request.max_latency_ms is None:
        return np.ones_like(est["fits"], dtype=bool)
    key = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "latency_s"}[request.latency_metric]
    return est[key] * 1e3 <= request.max_latency_ms


def _largest_batch(model, hw, eff, space, request, valid: pd.DataFrame, with_bound: bool) -> np.ndarray:
    """Per structure, the largest batch that fits (and meets the bound): 0 where none does."""
    lo = np.zeros(len(valid))  # lo always passes (0: nothing)
    hi = np.full(len(valid), float(MAX_BATCH + 1))  # hi always fails
    frame = valid.copy()
    while ((hi - lo) > 1).any():
        mid = np.floor((lo + hi) / 2)
        frame["batch"] = np.maximum(mid, 1).astype(int)
        est = _estimate(model, hw, eff, space, request, frame)
        ok = est["fits"] & (_meets(est, request) if with_bound else True)
        active = (hi - lo) > 1
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid, hi)
    return lo.astype(int)


def candidates(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, space: InferenceSpace,
               eff: InferenceEfficiency) -> pd.DataFrame:
    """Every candidate layout (rule-breaking structures once, with their reason)."""
    check_lengths(model, request.input_len, request.output_len)
    s = structures(model, hw, gpus, space)
    valid = s[s["reason"] == ""].drop(columns="reason").reset_index(drop=True)
    parts = [valid.merge(pd.DataFrame({"batch": list(space.batch), "batch_rule": "grid"}), how="cross")]
    if space.add_max_batch and not valid.empty:
        rules = [("max-fit", False)] + ([("max-under-bound", True)] if request.max_latency_ms is not None else [])
        for name, with_bound in rules:
            largest = _largest_batch(model, hw, eff, space, request, valid, with_bound)
            keep = largest >= 1
            parts.append(valid[keep].assign(batch=largest[keep], batch_rule=name))
    crossed = pd.concat(parts, ignore_index=True)
    crossed = crossed.drop_duplicates(subset=list(LAYOUT), keep="last", ignore_index=True)
    crossed["reason"] = ""
    rejected = s[s["reason"] != ""].assign(batch=pd.NA, batch_rule="")
    return pd.concat([crossed, rejected], ignore_index=True)


def evaluate(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, space: InferenceSpace,
             eff: InferenceEfficiency, frame: pd.DataFrame) -> pd.DataFrame:
    """Price the valid rows of ``frame``; rank the feasible ones. Returns every row."""
    valid = frame[frame["reason"] == ""].copy()
    valid["batch"] = valid["batch"].astype(int)
    est = _estimate(model, hw, eff, space, request, valid)
    replicas = valid["replicas"].to_numpy()
    valid["ttft_ms"] = est["ttft_s"] * 1e3
    valid["tpot_ms"] = est["tpot_s"] * 1e3
    valid["latency_ms"] = est["latency_s"] * 1e3
    valid["output_tokens_per_s"] = est["output_tokens_per_s_per_replica"] * replicas
    valid["output_tokens_per_s_per_gpu"] = valid["output_tokens_per_s"] / gpus
    valid["fits"] = est["fits"]
    valid["meets_bound"] = _meets(est, request)
    for k in ("memory_per_gpu_gib", "weights_gib", "kv_cache_gib", "activations_gib", "reserve_gib",
              "decode_compute_s", "decode_memory_s", "decode_tp_comm_s", "decode_overhead_s", "decode_pp_s"):
        valid[k] = est[k]
    limit = space.memory_fraction * hw.memory_gib
    metric = METRIC_COLUMN[request.latency_metric]
    oom = [f"out of memory: {m:.1f} GiB > {limit:.1f} GiB" for m in valid["memory_per_gpu_gib"]]
    bound = request.max_latency_ms
    slow = [f"{request.latency_metric} {v:.1f} ms > bound {bound:g} ms" if bound is not None else ""
            for v in valid[metric]]
    valid["reason"] = np.where(~valid["fits"], oom, np.where(~valid["meets_bound"], slow, ""))
    valid["feasible"] = valid["reason"] == ""
    rejected = frame[frame["reason"] != ""].assign(fits=False, meets_bound=False, feasible=False)
    out = pd.concat([valid, rejected], ignore_index=True)
    out = out.sort_values(["feasible", "output_tokens_per_s_per_gpu", metric, "tp", "pp"],
                          ascending=[False, False, True, True, True], na_position="last", ignore_index=True)
    out.insert(0, "rank", pd.array(np.where(out["feasible"], np.arange(1, len(out) + 1), 0), dtype="Int64"))
    out.loc[~out["feasible"], "rank"] = pd.NA
    return out


def search(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, space: InferenceSpace,
           eff: InferenceEfficiency | None = None, require_feasible: bool = True) -> InferenceResult:
    from autoparallel.serve.assumptions import efficiency_for
    eff = eff or efficiency_for(hw.name)
    frame = candidates(model, hw, gpus, request, space, eff)
    ranked = evaluate(model, hw, gpus, request, space, eff, frame)
    result = InferenceResult(model, hw, gpus, request, space, eff, ranked)
    if require_feasible and result.feasible.empty:
        raise UserError(no_feasible_message(result))
    return result


def no_feasible_message(result: InferenceResult) -> str:
    r = result.ranked
    reasons = r["reason"].astype(str)
    reasons = reasons.where(~reasons.str.startswith("out of memory"), "out of memory")
    reasons = reasons.where(~reasons.str.contains(" > bound "), f"{result.request.latency_metric} over the bound")
    top = "; ".join(f"{n} x {reason}" for reason, n in reasons.value_counts().head(3).items())
    where = f"{result.model.name} on {result.gpus} x {result.hardware.name}"
    if "tpot_ms" not in r or r["tpot_ms"].isna().all():
        return f"no valid serving layout of {where}: {top}"
    fitting = r[r["fits"] & r["tpot_ms"].notna()]
    if fitting.empty:
        return f"no serving layout of {where} fits in memory: {top} (try more GPUs or fp8 weights / KV cache)"
    best = fitting[METRIC_COLUMN[result.request.latency_metric]].min()
    return (f"no serving layout of {where} meets {result.request.latency_metric} <= "
            f"{result.request.max_latency_ms:g} ms: {top}; the lowest predicted is {best:.1f} ms")


def save(result: InferenceResult, root: Path, command: list[str], top_md: int = 50) -> Path:
    from autoparallel.serve.report import markdown_table
    run_dir = run_folder.new_run_dir(root, f"{result.model.name}-infer", result.gpus, result.hardware.name)
    run_folder.write_yaml(run_dir / run_folder.MANIFEST, run_folder.manifest(command, {
        "kind": "inference",
        "model": io.to_dict(result.model),
        "hardware": io.to_dict(result.hardware),
        "gpus": result.gpus,
        "request": io.to_dict(result.request),
        "space": io.to_dict(result.space),
        "efficiency": io.to_dict(result.efficiency),
        "candidates": len(result.ranked),
        "feasible": int(result.ranked["feasible"].sum()),
    }))
    title = title_of(result)
    run_folder.write_atomic(run_dir / run_folder.RANKED, f"# {title}\n\n" + markdown_table(result.ranked, top_md))
    run_folder.write_yaml(run_dir / run_folder.BEST, export.best_document(result, result.entry(1)))
    run_folder.write_csv(run_dir / run_folder.CANDIDATES, result.ranked)
    return run_dir


def title_of(result: InferenceResult) -> str:
    r = result.request
    bound = (f", {r.latency_metric} <= {r.max_latency_ms:g} ms" if r.max_latency_ms is not None else "")
    return (f"{result.model.name} on {result.gpus} x {result.hardware.name}, input {r.input_len} / "
            f"output {r.output_len} tokens{bound}")


def estimate_point(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request,
                   space: InferenceSpace) -> pd.Series:
    """One fully pinned layout (space with one value per knob): its row, fits or not."""
    from autoparallel.serve.assumptions import efficiency_for
    eff = efficiency_for(hw.name)
    frame = candidates(model, hw, gpus, request, space, eff)
    if (frame["reason"] != "").all():
        raise UserError(f"invalid layout: {frame['reason'].iloc[0]}")
    ranked = evaluate(model, hw, gpus, request, space, eff, frame[frame["reason"] == ""])
    return ranked.iloc[0]


def point_title(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, row: pd.Series) -> str:
    state = "fits" if row["fits"] else "DOES NOT FIT"
    return (f"{model.name} on {gpus} x {hw.name}: TP{int(row['tp'])} PP{int(row['pp'])} x {int(row['replicas'])} "
            f"replicas, batch {int(row['batch'])}, weights {row['weight_precision']}, KV {row['kv_precision']}, "
            f"input {request.input_len} / output {request.output_len}: {state}")
