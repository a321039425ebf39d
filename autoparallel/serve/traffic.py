"""Serving under traffic: the steady-state search's best layouts re-priced by simulation (issue 29).

Why two stages: the steady-state model (``costmodel.inflight``) prices thousands of candidates in
milliseconds but knows one request length and no tail; the simulation (``serve.simulate``) gives
percentiles over a workload under Poisson arrivals but costs ~0.1 s a run. So the steady-state
search ranks every candidate first (its mean-latency bounds are a loose pre-filter: a percentile
at or above the median is at least the steady-state figure), and the best row of each of the
``structures`` best layout structures (TP, PP, EP, precisions, token budget) is simulated.

Scenarios (MLPerf Inference's): ``offline`` — every request at once, the throughput;
``server`` — each layout's largest Poisson request rate whose latency percentiles stay within the
bounds (found by bisection on the rate), ranked by the output tokens/s per GPU sustained there;
``interactive`` — ``server`` with MLPerf's tighter bounds as defaults. Without a scenario the
rate is ``--request-rate`` (offline when none). The bounds' defaults per scenario are in
``inference_assumptions.yaml`` (``scenarios``) with their source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoparallel.errors import UserError
from autoparallel.serve.simulate import PERCENTILES, replica, run_workload
from autoparallel.serve.workload import Workload

SCENARIOS = ("offline", "server", "interactive")
KEY = ("tp", "pp", "ep", "weight_precision", "kv_precision", "max_num_tokens")
_RATE_STEPS = 6  # bisection steps on the request rate: to within 1/64 of the offline rate


@dataclass(frozen=True)
class Traffic:
    """What to simulate: the workload, the scenario, the percentile the bounds hold at."""

    workload: Workload
    scenario: str | None = None  # None: at the Request's rate (offline without one)
    percentile: float = 99.0
    requests: int = 5000
    seed: int = 0
    structures: int = 8
    # Each layout's TP ranks run attention data-parallel around an expert-parallel MoE (``infer
    # --attention-dp``; costmodel.inference.layout): every rank with its own max batch, token budget
    # and KV pool (TensorRT-LLM's per-rank limits), the TP group's ranks simulated in lock-step as one
    # replica (serve/attention_dp.py; ``--requests`` are the group's); the steady-state search still
    # picks the layouts as TP ones.
    attention_dp: bool = False

    def __post_init__(self) -> None:
        if self.scenario is not None and self.scenario not in SCENARIOS:
            raise UserError(f"--scenario {self.scenario!r} is not one of {', '.join(SCENARIOS)}")
        if not 0 < self.percentile <= 100:
            raise UserError(f"--latency-percentile {self.percentile:g} is not in (0, 100]")


def scenario_bounds(scenario: str | None) -> dict[str, float]:
    """The default (max_ttft_ms, max_tpot_ms) of a scenario (none for offline / no scenario)."""
    from autoparallel.serve.assumptions import load_assumptions
    if scenario in (None, "offline"):
        return {}
    block = (load_assumptions().get("scenarios") or {})[scenario]
    return {"max_ttft_ms": float(block["max_ttft_ms"]), "max_tpot_ms": float(block["max_tpot_ms"])}


def _summary(cost, sched, traffic: Traffic, rate: float | None) -> dict:
    p = traffic.percentile
    sim = run_workload(cost, sched, traffic.workload, rate, traffic.requests, traffic.seed)
    out = sim.summary(sorted({*PERCENTILES, p}))
    out["ttft_at_ms"], out["tpot_at_ms"], out["e2e_at_ms"] = (out[f"ttft_p{p:g}_ms"], out[f"tpot_p{p:g}_ms"],
                                                               out[f"e2e_p{p:g}_ms"])
    out["preemptions"] = sim.preemptions
    out["keeps_up"] = sim.keeps_up
    return out


def _bounds(request) -> tuple[tuple[str, float], ...]:
    """The latency bounds the simulation holds at the percentile: (metric, ms) for each one given."""
    return tuple((name, bound) for name, bound in (("ttft", request.max_ttft_ms), ("tpot", request.max_tpot_ms),
                                                    ("e2e", request.max_e2e_ms)) if bound is not None)


def _ok(s: dict, request) -> bool:
    return s["keeps_up"] and all(s[f"{name}_at_ms"] <= bound for name, bound in _bounds(request))


def _largest_rate(cost, sched, traffic: Traffic, request) -> tuple[float, dict | None]:
    """The largest Poisson rate (requests/s, this replica) whose percentiles meet the bounds,
    and its summary (0 and None where even a light load misses them)."""
    # No arrival process sustains more than every request at once: the offline rate while the
    # queue still feeds the batch bounds the search (the drain of the last batch left out).
    offline = run_workload(cost, sched, traffic.workload, None,
                           max(traffic.requests, 8 * sched.max_running * sched.dp), traffic.seed)
    hi = offline.steady_requests_per_s
    lo, best = 0.0, None
    for _ in range(_RATE_STEPS):
        mid = 0.5 * (lo + hi)
        s = _summary(cost, sched, traffic, mid)
        if _ok(s, request):
            lo, best = mid, s
        else:
            hi = mid
    return lo, best


def candidates(ranked: pd.DataFrame, structures: int) -> pd.DataFrame:
    """The best steady-state row of each of the ``structures`` best layout structures."""
    pool = ranked[ranked["feasible"]]
    if pool.empty:
        pool = ranked[ranked["fits"].astype(bool) & ~ranked["overloaded"].astype(bool)]
    pool = pool.sort_values("output_tokens_per_s_per_gpu", ascending=False, kind="stable")
    return pool.drop_duplicates(subset=list(KEY)).head(structures)


def simulate_ranked(result, traffic: Traffic, progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Simulate the best candidates of a steady-state ``serve.search`` result; rank them by the
    simulated output tokens/s per GPU among those meeting the bounds at the percentile.
    ``progress(done, total)`` after each layout (a server scenario's bisection takes seconds each)."""
    if result.engine.batching != "inflight":
        raise UserError(f"the traffic simulation needs an in-flight batching engine; {result.engine.name} "
                        f"batches statically (drop --workload / --scenario / --latency-percentile)")
    rows, simulated = candidates(result.ranked, traffic.structures), []
    for _, row in rows.iterrows():
        simulated.append(simulate_layout(result, traffic, row))
        if progress is not None:
            progress(len(simulated), len(rows))
    frame = pd.DataFrame(simulated)
    if frame.empty:
        return frame
    frame["feasible"] = frame["reason"] == ""
    frame = frame.sort_values(["feasible", "output_tokens_per_s_per_gpu", "tp", "pp"],
                              ascending=[False, False, True, True], ignore_index=True)
    frame.insert(0, "rank", np.where(frame["feasible"], np.arange(1, len(frame) + 1), 0))
    return frame


def simulate_layout(result, traffic: Traffic, row) -> dict:
    """One layout (a row with ``serve.search.LAYOUT``'s keys) of ``result``'s deployment simulated
    under ``traffic``: its percentiles, rate and output tokens/s (whole deployment and per GPU),
    and why it misses the bounds ("" when it meets them)."""
    from autoparallel.serve.search import LAYOUT
    request, gpus = result.request, result.gpus
    longest = traffic.workload.max_input + traffic.workload.max_output
    cost, sched = replica(result.model, result.hardware, result.efficiency, result.engine, int(row["tp"]),
                          int(row["pp"]), int(row["max_batch"]), int(row["max_num_tokens"]),
                          row["weight_precision"], row["kv_precision"], int(row["ep"]), longest,
                          traffic.workload.max_output, traffic.attention_dp)
    # under attention DP a replica is its TP group's ranks in lock-step (with PP: each rank, ``replica``)
    replicas = int(row["replicas"]) * (int(row["tp"]) // sched.dp if traffic.attention_dp else 1)
    if traffic.scenario in ("server", "interactive"):
        rate, s = _largest_rate(cost, sched, traffic, request)
        reason = "" if s is not None else f"misses the p{traffic.percentile:g} bounds at every rate tried"
        if s is None:  # report the lightest load tried, sustaining nothing
            s = {**_summary(cost, sched, traffic, rate or 1e-3), "output_tokens_per_s": 0.0}
    else:
        rate = None if request.request_rate is None else request.request_rate / replicas
        s = _summary(cost, sched, traffic, rate)
        reason = "" if _ok(s, request) else _missed(s, request, traffic.percentile)
        rate = s["requests_per_s"] if rate is None else rate
    out = {k: row[k] for k in LAYOUT}
    out.update(s)
    out["request_rate"] = rate * replicas
    out["output_tokens_per_s"] = s["output_tokens_per_s"] * replicas
    out["output_tokens_per_s_per_gpu"] = out["output_tokens_per_s"] / gpus
    out["reason"] = reason
    return out


def none_meet(frame: pd.DataFrame, traffic: Traffic, request) -> str:
    """Why no simulated layout ranks (each missed a bound or fell behind the rate), with the nearest
    figures, as the steady-state search says it of its own bounds."""
    p = f"p{traffic.percentile:g}"
    if frame["reason"].str.startswith("overloaded").all():
        return (f"no layout of the {len(frame)} simulated keeps up with {request.request_rate:g} requests/s: the most "
                f"one serves is {(frame['requests_per_s'] * frame['replicas']).max():.3g}; lower the rate or "
                f"add GPUs")
    lowest_of = lambda n: frame[f"{n}_{p}_ms"].min()  # noqa: E731
    bounds = [(n, b) for n, b in _bounds(request) if lowest_of(n) > b] or _bounds(request)  # the ones none meets
    said = ", ".join(f"{p} {n.upper()} <= {b:g} ms" for n, b in bounds)
    lowest = ", ".join(f"the lowest {p} {n.upper()} simulated is {lowest_of(n):.3g} ms" for n, _ in bounds)
    return f"no layout of the {len(frame)} simulated meets {said}: {lowest}"


def _missed(s: dict, request, p: float) -> str:
    if not s["keeps_up"]:
        return f"overloaded: serves {s['requests_per_s']:.3g} of the requests/s sent"
    for name, bound in _bounds(request):
        if s[f"{name}_at_ms"] > bound:
            return f"p{p:g} {name} {s[f'{name}_at_ms']:.1f} ms > bound {bound:g} ms"
    return ""


def record(row: pd.Series, percentile: float, attention_dp: bool = False) -> dict:
    """One simulated layout as JSON: the layout (``attention_dp: true`` where it ran so), the rate,
    the percentiles, the throughput."""
    from autoparallel.serve.search import LAYOUT
    pcts = sorted({*PERCENTILES, percentile})
    config = {k: (str(row[k]) if "precision" in k else int(row[k])) for k in LAYOUT}
    return {
        "config": {**config, "attention_dp": True} if attention_dp else config,
        "request_rate": float(row["request_rate"]),
        "output_tokens_per_s": float(row["output_tokens_per_s"]),
        "output_tokens_per_s_per_gpu": float(row["output_tokens_per_s_per_gpu"]),
        "ttft_ms": {f"p{p:g}": float(row[f"ttft_p{p:g}_ms"]) for p in pcts},
        "tpot_ms": {f"p{p:g}": float(row[f"tpot_p{p:g}_ms"]) for p in pcts},
        "e2e_ms": {f"p{p:g}": float(row[f"e2e_p{p:g}_ms"]) for p in pcts},
        "preemptions": int(row["preemptions"]),
        "meets_bounds": bool(row["feasible"]),
        "reason": str(row["reason"]),
    }


def best_document(result, frame: pd.DataFrame, traffic: Traffic) -> dict:
    """best.yaml of a simulated run: the layout the simulated table ranks first (its steady-state
    row gives the commands and the steady-state prediction) and what the simulation measured."""
    from autoparallel.serve.export import best_document as document
    from autoparallel.serve.search import LAYOUT, record as steady_record
    top, ranked = frame.iloc[0], result.ranked
    row = ranked[np.logical_and.reduce([ranked[k] == top[k] for k in LAYOUT])].iloc[0]
    doc = document(result, row, steady_record(row), traffic.attention_dp)
    simulated = record(top, traffic.percentile)
    del simulated["config"]
    doc["simulated"] = {"scenario": traffic.scenario or "rate", "workload": traffic.workload.name,
                        "requests": traffic.requests, "percentile": traffic.percentile, **simulated}
    return doc


def title(result, traffic: Traffic) -> str:
    r = result.request
    what = traffic.scenario or ("offline" if r.request_rate is None else f"{r.request_rate:g} requests/s")
    bounds = ", ".join(f"p{traffic.percentile:g} {n.upper()} <= {b:g} ms" for n, b in _bounds(r))
    adp = ", attention DP" if traffic.attention_dp else ""
    return (f"{result.model.name} on {result.gpus} x {result.hardware.name} ({result.engine.name}{adp}), "
            f"{traffic.workload.name}, {what}{', ' + bounds if bounds else ''}: {traffic.requests:,} simulated "
            f"requests per layout")


def _columns(percentile: float):
    from autoparallel.report.fit import Column
    p = f"p{percentile:g}"
    return (Column("rank", "#", lambda v: str(int(v)) if v else "-"), Column("tp", "TP", knob=True),
            Column("pp", "PP", knob=True), Column("ep", "EP", drop=3, knob=True),
            Column("replicas", "replicas", knob=True), Column("max_batch", "batch", knob=True),
            Column("max_num_tokens", "max tokens", drop=2, knob=True),
            Column("weight_precision", "weights", drop=1, knob=True),
            Column("kv_precision", "KV", drop=1, knob=True), Column("request_rate", "req/s", "{:,.2f}"),
            Column("ttft_p50_ms", "TTFT p50", "{:,.0f}", drop=4), Column(f"ttft_{p}_ms", f"TTFT {p}", "{:,.0f}"),
            Column("tpot_p50_ms", "TPOT p50", "{:.1f}", drop=4), Column(f"tpot_{p}_ms", f"TPOT {p}", "{:.1f}"),
            Column("output_tokens_per_s_per_gpu", "tok/s/GPU", "{:,.0f}"))


def table_rows(frame: pd.DataFrame, percentile: float, top: int) -> tuple[tuple, list[list[str]]]:
    from autoparallel.report.fit import cell
    columns = _columns(percentile)
    if not (frame["ep"] > 1).any():
        columns = tuple(c for c in columns if c.key != "ep")
    return columns, [[cell(r[c.key], c.fmt) for c in columns] for _, r in frame.head(top).iterrows()]


# Two lines, each whole at 80 columns (one line wrapped by the terminal read "... whose bounds" / "hold);").
LEGEND = ("req/s: of the whole deployment (server: the largest rate whose bounds hold)",
          "TTFT / TPOT in ms; tok/s/GPU: output tokens/s per GPU sustained")


def print_simulated(frame: pd.DataFrame, title_line: str, percentile: float, top: int, console, wide: bool) -> None:
    from autoparallel.report.fit import print_table
    columns, rows = table_rows(frame, percentile, top)
    print_table(console, title_line, columns, rows, LEGEND, wide, constant_first=True)
    for _, r in frame[~frame["feasible"]].head(top).iterrows():
        console.print(f"not ranked: TP{int(r['tp'])} PP{int(r['pp'])} batch {int(r['max_batch'])}: {r['reason']}",
                      markup=False)


def markdown(frame: pd.DataFrame, title_line: str, percentile: float) -> str:
    columns, rows = table_rows(frame, percentile, len(frame))
    lines = [f"# {title_line}", "", "| " + " | ".join(c.header for c in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n\n" + "".join(f"- {line}\n" for line in LEGEND)
