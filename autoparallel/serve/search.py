"""Latency-bounded serving search: the layout with the most output tokens/s per GPU under the bounds.

Candidates are every valid (tp, pp, weight precision, KV precision, max_num_tokens) crossed with
the ``max_batch`` values of the space, plus, per structure, the largest max batch the KV cache
holds and the largest that also meets every bound (found by a vectorised bisection: TPOT, TTFT
and e2e grow with the batch). Every candidate is priced at once by the engine's cost model
(``costmodel.inflight`` for in-flight batching engines, ``costmodel.inference`` for static
batching); those that break a rule, do not fit, cannot sustain the request rate or miss a bound
stay in the table with the reason. The feasible ones are ranked by output tokens/s per GPU (the
whole deployment: ``replicas = gpus / (tp * pp)`` independent servers), ties broken by the lower
TPOT, then the smaller TP, PP and EP. ``pareto`` marks the candidates no other fitting candidate
beats on both throughput per GPU and TPOT: the trade-off a tighter or looser TPOT bound moves along.

Load: by default offline (unbounded arrival: every replica's running batch stays full, the
throughput tables' setting); with ``request_rate`` (requests/s for the whole deployment, split
evenly over the replicas) the latencies are those at that load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autoparallel import io
from autoparallel.costmodel.inference import (InferenceEfficiency, ServingEngine,
                                              estimate_static_columns, refuse_unpriced)
from autoparallel.costmodel.inflight import estimate_inflight_columns
from autoparallel.errors import UserError
from autoparallel.report import run_folder
from autoparallel.serve import export
from autoparallel.serve.space import InferenceSpace, check_lengths, structures
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

#: (metric name, Request field, result column)
BOUNDS = (("ttft", "max_ttft_ms", "ttft_ms"), ("tpot", "max_tpot_ms", "tpot_ms"), ("e2e", "max_e2e_ms", "latency_ms"))
POINT_KEYS = ("ttft_ms", "tpot_ms", "latency_ms", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
              "fits", "memory_per_gpu_gib")
LAYOUT = ("tp", "pp", "ep", "replicas", "max_batch", "max_num_tokens", "weight_precision", "kv_precision")
SERVING = ("concurrency", "kv_capacity_requests", "decode_batch", "prefill_tokens_per_iteration",
           "capacity_requests_per_s")
MEMORY = ("weights_gib", "kv_cache_gib", "activations_gib", "reserve_gib")
PASS = ("decode_compute_s", "decode_memory_s", "decode_tp_comm_s", "decode_overhead_s", "decode_pp_s")
MAX_BATCH = 1 << 14
LATENCY_METRICS = tuple(name for name, _, _ in BOUNDS)


@dataclass(frozen=True)
class Request:
    """What the deployment must serve and how fast (every bound in ms; None: unbounded)."""

    input_len: int
    output_len: int
    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    max_e2e_ms: float | None = None
    request_rate: float | None = None  # requests/s for the whole deployment; None: offline
    max_model_len: int | None = None  # the engine's longest sequence; None: input + output
    workload: str | None = None  # a length distribution's name; input_len / output_len are its means

    @staticmethod
    def of_workload(workload, max_model_len: int | None = None, **kw) -> Request:
        """A request of a ``serve.workload.Workload``: the fluid model prices its mean lengths and
        the engine must accept its longest request (default max input + max output)."""
        model_len = max_model_len or workload.max_input + workload.max_output
        return Request(max(1, round(workload.mean_input)), max(1, round(workload.mean_output)),
                       max_model_len=model_len, workload=workload.name, **kw)

    def __post_init__(self) -> None:
        for _, field, _ in BOUNDS:
            value = getattr(self, field)
            if value is not None and not value > 0:
                raise UserError(f"--{field.replace('_', '-')} must be positive, got {value:g}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise UserError(f"--request-rate must be positive, got {self.request_rate:g}")

    @property
    def bounds(self) -> list[tuple[str, float, str]]:
        """(metric, bound ms, result column) of every bound given."""
        return [(name, getattr(self, field), column) for name, field, column in BOUNDS
                if getattr(self, field) is not None]

    def describe(self) -> str:
        parts = [f"{name} <= {bound:g} ms" for name, bound, _ in self.bounds]
        if self.request_rate is not None:
            parts.append(f"{self.request_rate:g} requests/s")
        return ", ".join(parts)


def legacy_bound(max_latency_ms: float | None, latency_metric: str) -> dict:
    """``--max-latency-ms X --latency-metric M`` as the Request field it stands for (M: ttft, tpot, e2e)."""
    if latency_metric not in LATENCY_METRICS:
        raise UserError(f"--latency-metric {latency_metric!r} is not one of {', '.join(LATENCY_METRICS)}")
    if max_latency_ms is None:
        return {}
    if not max_latency_ms > 0:
        raise UserError(f"--max-latency-ms must be positive, got {max_latency_ms:g}")
    return {dict((n, f) for n, f, _ in BOUNDS)[latency_metric]: max_latency_ms}


@dataclass
class InferenceResult:
    model: ModelSpec
    hardware: HardwareSpec
    gpus: int
    request: Request
    space: InferenceSpace
    engine: ServingEngine
    efficiency: InferenceEfficiency
    ranked: pd.DataFrame  # every candidate, feasible first and best first; rank NA elsewhere

    @property
    def feasible(self) -> pd.DataFrame:
        return self.ranked[self.ranked["feasible"]]

    @property
    def pareto(self) -> pd.DataFrame:
        """The throughput-vs-TPOT front, lowest TPOT first."""
        return self.ranked[self.ranked["pareto"]].sort_values("tpot_ms")

    def entry(self, rank: int) -> pd.Series:
        n = len(self.feasible)
        if not 1 <= rank <= n:
            raise UserError(f"rank {rank} is out of range: this run has {n:,} feasible layouts (1..{n:,})")
        return self.feasible.iloc[rank - 1]

    def records(self, top: int) -> list[dict]:
        return [record(row) for _, row in self.feasible.head(top).iterrows()]


def record(row) -> dict:
    """One candidate as the stable JSON object (the issue's keys first, then the layout)."""
    out = {k: (bool(row[k]) if k == "fits" else float(row[k])) for k in POINT_KEYS}
    out["config"] = {k: (str(row[k]) if "precision" in k else int(row[k])) for k in LAYOUT}
    out["serving"] = {k: None if pd.isna(row[k]) else float(row[k]) for k in SERVING}  # NaN: static batching
    out["breakdown"] = {
        "memory_gib": {k: float(row[k]) for k in MEMORY},
        "decode_pass_ms": {k[:-2]: 1e3 * float(row[k]) for k in PASS},
    }
    return out


def _estimate(model, hw, eff, engine: ServingEngine, request: Request, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    refuse_unpriced(model, engine)  # the static path's layout has no engine to refuse
    n = len(frame)
    cols = {k: frame[k].to_numpy() for k in ("tp", "pp", "ep", "max_batch", "max_num_tokens", "weight_precision",
                                             "kv_precision")}
    cols["input_len"] = np.full(n, request.input_len)
    cols["output_len"] = np.full(n, request.output_len)
    cols["max_model_len"] = np.full(n, request.max_model_len or request.input_len + request.output_len)
    rate = np.nan if request.request_rate is None else request.request_rate
    cols["request_rate"] = rate / frame["replicas"].to_numpy()
    if engine.batching == "inflight":
        return estimate_inflight_columns(model, hw, eff, engine, cols)
    est = estimate_static_columns(model, hw, eff, {**cols, "batch": cols["max_batch"]}, engine.kv_memory_fraction,
                                  microbatching=engine.microbatching, flash_attention=engine.flash_attention)
    batch = np.asarray(cols["max_batch"], dtype=float)
    capacity = batch / est["latency_s"]
    est.update(concurrency=batch, kv_capacity_requests=np.full(n, np.nan), decode_batch=batch,
               prefill_tokens_per_iteration=batch * request.input_len, capacity_requests_per_s=capacity,
               overloaded=np.isfinite(cols["request_rate"]) & (cols["request_rate"] >= capacity))
    return est


def _meets(est: dict, request: Request) -> np.ndarray:
    ok = np.ones_like(est["fits"], dtype=bool)
    for _, bound, column in request.bounds:
        key = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "latency_ms": "latency_s"}[column]
        ok &= est[key] * 1e3 <= bound
    return ok


def _largest_batch(model, hw, eff, engine, request, valid: pd.DataFrame, with_bounds: bool) -> np.ndarray:
    """Per structure, the largest max batch that fits (and meets the bounds): 0 where none does.

    Without bounds this is where the KV cache stops admitting more requests (a larger max batch
    changes nothing); with bounds, the largest whose latencies stay within them.
    """
    frame = valid.copy()
    frame["max_batch"] = MAX_BATCH
    full = _estimate(model, hw, eff, engine, request, frame)
    if engine.batching == "inflight":
        cap = np.ceil(np.maximum(full["kv_capacity_requests"], 0) / valid["pp"].to_numpy())
    else:
        cap = np.full(len(valid), float(MAX_BATCH))
    lo = np.zeros(len(valid))  # lo always passes (0: nothing)
    hi = np.minimum(cap, MAX_BATCH) + 1.0  # hi always fails (or adds nothing)
    while ((hi - lo) > 1).any():
        mid = np.floor((lo + hi) / 2)
        frame["max_batch"] = np.maximum(mid, 1).astype(int)
        est = _estimate(model, hw, eff, engine, request, frame)
        ok = est["fits"] & ~est["overloaded"] & (_meets(est, request) if with_bounds else True)
        active = (hi - lo) > 1
        lo = np.where(active & ok, mid, lo)
        hi = np.where(active & ~ok, mid, hi)
    return lo.astype(int)


def candidates(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, space: InferenceSpace,
               engine: ServingEngine, eff: InferenceEfficiency) -> pd.DataFrame:
    """Every candidate layout (rule-breaking structures once, with their reason)."""
    check_lengths(model, request.input_len, request.output_len, request.max_model_len)
    s = structures(model, hw, gpus, space, engine, request.input_len)
    valid = s[s["reason"] == ""].drop(columns="reason").reset_index(drop=True)
    parts = [valid.merge(pd.DataFrame({"max_batch": list(space.max_batch), "batch_rule": "grid"}), how="cross")]
    if space.add_max_batch and not valid.empty:
        rules = [("kv-limit", False)] + ([("max-under-bounds", True)] if request.bounds else [])
        for name, with_bounds in rules:
            largest = _largest_batch(model, hw, eff, engine, request, valid, with_bounds)
            keep = largest >= 1
            parts.append(valid[keep].assign(max_batch=largest[keep], batch_rule=name))
    crossed = pd.concat(parts, ignore_index=True)
    crossed = crossed.drop_duplicates(subset=list(LAYOUT), keep="last", ignore_index=True)
    crossed["reason"] = ""
    rejected = s[s["reason"] != ""].assign(max_batch=pd.NA, batch_rule="")
    return pd.concat([crossed, rejected], ignore_index=True)


PARETO_STEP = 1.01  # a front point adds at least 1 % throughput over every point with a lower TPOT


def _pareto(frame: pd.DataFrame) -> np.ndarray:
    """Rows that fit and that no other fitting row beats on both throughput per GPU and TPOT.

    Walking up in TPOT, a row joins the front when it beats the best so far by ``PARETO_STEP``
    (layouts that differ only in a knob that moves neither figure would crowd the front).
    """
    out = np.zeros(len(frame), dtype=bool)
    usable = frame["fits"].to_numpy(dtype=bool) & ~frame["overloaded"].to_numpy(dtype=bool)
    throughput = frame["output_tokens_per_s_per_gpu"].to_numpy()
    order = np.lexsort((-throughput, frame["tpot_ms"].to_numpy()))
    best = 0.0
    for i in order:
        if usable[i] and throughput[i] > best * PARETO_STEP:
            out[i] = True
            best = throughput[i]
    return out


def _reasons(valid: pd.DataFrame, request: Request, hw: HardwareSpec) -> np.ndarray:
    model_len = request.max_model_len or request.input_len + request.output_len
    reasons = []
    for _, r in valid.iterrows():
        if not r["fits"]:
            reasons.append(f"out of memory: weights {r['weights_gib']:.1f} GiB + activations "
                           f"{r['activations_gib']:.1f} GiB leave no KV cache for one {model_len}-token "
                           f"request on {hw.memory_gib:g} GiB")
        elif r["overloaded"]:
            reasons.append(f"request rate {request.request_rate / r['replicas']:.3g}/s per replica exceeds its "
                           f"capacity {r['capacity_requests_per_s']:.3g}/s")
        else:
            missed = [f"{name} {r[column]:.1f} ms > bound {bound:g} ms" for name, bound, column in request.bounds
                      if r[column] > bound]
            reasons.append(missed[0] if missed else "")
    return np.array(reasons, dtype=object)


def evaluate(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, space: InferenceSpace,
             engine: ServingEngine, eff: InferenceEfficiency, frame: pd.DataFrame) -> pd.DataFrame:
    """Price the valid rows of ``frame``; rank the feasible ones. Returns every row."""
    valid = frame[frame["reason"] == ""].copy()
    valid["max_batch"] = valid["max_batch"].astype(int)
    est = _estimate(model, hw, eff, engine, request, valid)
    replicas = valid["replicas"].to_numpy()
    valid["ttft_ms"] = est["ttft_s"] * 1e3
    valid["tpot_ms"] = est["tpot_s"] * 1e3
    valid["latency_ms"] = est["latency_s"] * 1e3
    valid["output_tokens_per_s"] = est["output_tokens_per_s_per_replica"] * replicas
    valid["output_tokens_per_s_per_gpu"] = valid["output_tokens_per_s"] / gpus
    valid["fits"] = est["fits"].astype(bool)
    valid["overloaded"] = est["overloaded"].astype(bool)
    valid["meets_bounds"] = _meets(est, request)
    for k in ("memory_per_gpu_gib", *MEMORY, *PASS, *SERVING):
        valid[k] = est[k]
    valid["reason"] = _reasons(valid, request, hw)
    valid["feasible"] = valid["reason"] == ""
    valid["pareto"] = _pareto(valid)
    rejected = frame[frame["reason"] != ""].assign(fits=False, overloaded=False, meets_bounds=False,
                                                   feasible=False, pareto=False)
    out = pd.concat([valid, rejected], ignore_index=True)
    out = out.sort_values(["feasible", "output_tokens_per_s_per_gpu", "tpot_ms", "tp", "pp", "ep"],
                          ascending=[False, False, True, True, True, True], na_position="last", ignore_index=True)
    out.insert(0, "rank", pd.array(np.where(out["feasible"], np.arange(1, len(out) + 1), 0), dtype="Int64"))
    out.loc[~out["feasible"], "rank"] = pd.NA
    return out


def _engine_and_efficiency(engine: ServingEngine | None, eff: InferenceEfficiency | None):
    from autoparallel.serve.assumptions import DEFAULT_ENGINE, efficiency_for, load_engine
    engine = engine or load_engine(DEFAULT_ENGINE)
    return engine, eff or efficiency_for(engine.name)


def search(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, space: InferenceSpace,
           engine: ServingEngine | None = None, eff: InferenceEfficiency | None = None,
           require_feasible: bool = True) -> InferenceResult:
    engine, eff = _engine_and_efficiency(engine, eff)
    if engine.batching == "static":  # a static batch has no iteration token budget to search
        space = space.pinned(max_num_tokens=engine.max_num_tokens)
    frame = candidates(model, hw, gpus, request, space, engine, eff)
    ranked = evaluate(model, hw, gpus, request, space, engine, eff, frame)
    result = InferenceResult(model, hw, gpus, request, space, engine, eff, ranked)
    if require_feasible and result.feasible.empty:
        raise UserError(no_feasible_message(result))
    return result


def no_feasible_message(result: InferenceResult) -> str:
    r = result.ranked
    reasons = r["reason"].astype(str)
    reasons = reasons.where(~reasons.str.startswith("out of memory"), "out of memory")
    reasons = reasons.where(~reasons.str.contains(" > bound "), "over a latency bound")
    reasons = reasons.where(~reasons.str.startswith("request rate"), "request rate over capacity")
    # The space's tp*pp that do not divide the GPUs are no candidates at all: named only when nothing
    # else is (--tp 16 on 16 GPUs of 8-GPU nodes read "tp=16 crosses ...; tp*pp=32 does not divide 16 GPUs; ...").
    undivided = reasons.str.contains(" does not divide ")
    if not undivided.all():
        reasons = reasons[~undivided]
    top = "; ".join(f"{n} x {reason}" for reason, n in reasons.value_counts().head(3).items())
    where = f"{result.model.name} on {result.gpus} x {result.hardware.name}"
    if "tpot_ms" not in r or r["tpot_ms"].isna().all():
        return f"no valid serving layout of {where}: {top}"
    fitting = r[r["fits"].astype(bool) & r["tpot_ms"].notna()]
    if fitting.empty:
        return f"no serving layout of {where} fits in memory: {top} (try more GPUs or fp8 weights / KV cache)"
    usable = fitting[~fitting["overloaded"].astype(bool)]
    if usable.empty:  # they fit, but none keeps up with the arrivals
        return (f"no serving layout of {where} serves --request-rate {result.request.request_rate:g} requests/s: "
                f"{top} (lower the rate or add GPUs)")
    lowest = "; ".join(f"the lowest {name} predicted is {usable[column].min():.1f} ms"
                       for name, _, column in result.request.bounds)
    # Only the bound is the cause here: the other reasons (the space's tp*pp that do not divide the
    # GPUs, ...) counted beside it read as if they were.
    keep_up = " and keep up" if result.request.request_rate else ""
    them = "it" if len(result.request.bounds) == 1 else "them"
    return (f"no serving layout of {where} meets {result.request.describe()}: all {len(usable):,} that fit"
            f"{keep_up} are over {them}; {lowest}")


def save(result: InferenceResult, root: Path, command: list[str], top_md: int = 50,
         extra: dict[str, str] | None = None, best: dict | None = None) -> Path:
    """The run folder: manifest, ranked.md, best.yaml, candidates.csv and ``extra`` files (name -> text).
    ``best``: best.yaml's document where the winner is not the steady-state rank 1 (a simulated run's,
    ``traffic.best_document``)."""
    from autoparallel.serve.report import markdown_table
    run_dir = run_folder.new_run_dir(root, f"{result.model.name}-infer", result.gpus, result.hardware.name)
    run_folder.write_yaml(run_dir / run_folder.MANIFEST, run_folder.manifest(command, {
        "kind": "inference",
        "model": io.to_dict(result.model),
        "hardware": io.to_dict(result.hardware),
        "gpus": result.gpus,
        "request": io.to_dict(result.request),
        "space": io.to_dict(result.space),
        "engine": io.to_dict(result.engine),
        "efficiency": io.to_dict(result.efficiency),
        "candidates": len(result.ranked),
        "feasible": int(result.ranked["feasible"].sum()),
    }))
    title = title_of(result)
    run_folder.write_atomic(run_dir / run_folder.RANKED, f"# {title}\n\n" + markdown_table(result.feasible, top_md)
                            + "\n## Pareto front: throughput per GPU vs TPOT\n\n"
                            + markdown_table(result.pareto, len(result.pareto), feasible_only=False))
    if best is None:
        best = export.best_document(result, result.entry(1), record(result.entry(1)))
    run_folder.write_yaml(run_dir / run_folder.BEST, best)
    run_folder.write_csv(run_dir / run_folder.CANDIDATES, result.ranked)
    for name, text in (extra or {}).items():
        run_folder.write_atomic(run_dir / name, text)
    return run_dir


def title_of(result: InferenceResult) -> str:
    r = result.request
    bound = f", {r.describe()}" if r.describe() else ""
    return (f"{result.model.name} on {result.gpus} x {result.hardware.name} ({result.engine.name}), "
            f"{lengths_of(r)}{bound}")


def lengths_of(r: Request) -> str:
    """The request lengths in a title: the fixed pair, or the workload and its mean lengths."""
    if r.workload:
        return f"workload {r.workload} (means {r.input_len} / {r.output_len} tokens)"
    return f"input {r.input_len} / output {r.output_len} tokens"


def estimate_point(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, space: InferenceSpace,
                   engine: ServingEngine | None = None) -> pd.Series:
    """One fully pinned layout (space with one value per knob): its row, fits or not."""
    engine, eff = _engine_and_efficiency(engine, None)
    frame = candidates(model, hw, gpus, request, space, engine, eff)
    if (frame["reason"] != "").all():
        raise UserError(f"invalid layout: {frame['reason'].iloc[0]}")
    ranked = evaluate(model, hw, gpus, request, space, engine, eff, frame[frame["reason"] == ""])
    return ranked.iloc[0]


def point_title(model: ModelSpec, hw: HardwareSpec, gpus: int, request: Request, row: pd.Series) -> str:
    state = "fits" if row["fits"] else "DOES NOT FIT"
    ep = f" EP{int(row['ep'])}" if int(row["ep"]) > 1 else ""
    replicas = int(row["replicas"])
    return (f"{model.name} on {gpus} x {hw.name}: TP{int(row['tp'])} PP{int(row['pp'])}{ep} x {replicas} "
            f"replica{'s' if replicas != 1 else ''}, max batch {int(row['max_batch'])}, max tokens {int(row['max_num_tokens'])}, weights "
            f"{row['weight_precision']}, KV {row['kv_precision']}, {lengths_of(request)}: {state}")
