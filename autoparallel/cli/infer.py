"""``autoparallel infer``: rank serving layouts under TTFT, TPOT and end-to-end latency bounds."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from autoparallel import io
from autoparallel.argtypes import percentile, positive, positive_number, seed
from autoparallel.cli.common import add_table_flags, add_target, console, simulation_progress
from autoparallel.errors import UserError

DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN = 2048, 256


def add_parser(sub) -> None:
    i = sub.add_parser("infer", help="rank serving layouts (TP, PP, replicas, max batch, max tokens, precisions) "
                                     "under TTFT / TPOT / e2e bounds")
    add_target(i)
    i.add_argument("--engine", default="tensorrt-llm",
                   help="serving engine whose scheduler and fitted constants to use: tensorrt-llm (default), "
                        "vllm, sglang, tensorrt-llm-0.10, fastertransformer (static batching)")
    i.add_argument("--capacity-policy", choices=("guaranteed_no_evict", "max_utilization"),
                   help="TensorRT-LLM's KV capacity scheduler (trtllm-bench --scheduler_policy): "
                        "guaranteed_no_evict admits a request only when the KV pool holds its prompt and its max "
                        "new tokens (never pauses; the default of tensorrt-llm); max_utilization allocates KV "
                        "blocks as tokens come and pauses the newest request when the pool is full (more in flight; "
                        "NVIDIA's MLPerf configs; the default of tensorrt-llm-0.10). TensorRT-LLM engines only")
    i.add_argument("--input-len", type=positive, help="prompt tokens per request (default 2048)")
    i.add_argument("--output-len", type=positive, help="generated tokens per request (default 256)")
    i.add_argument("--workload",
                   help="request lengths from a distribution instead of one fixed pair: mlperf-llama2-70b, "
                        "mlperf-mixtral-8x7b, mlperf-llama3.1-405b, mlperf-llama3.1-8b, mlperf-deepseek-r1, sharegpt, or a CSV, JSONL or JSON-array "
                        "file of input_len,output_len pairs (the search prices the mean lengths)")
    i.add_argument("--max-model-len", type=positive,
                   help="longest sequence the engine must accept (default input + output; past the model's "
                        "context it is accepted with a warning, as the engines accept it)")
    b = i.add_argument_group("latency bounds (ms; any combination; default none)")
    b.add_argument("--max-ttft-ms", type=positive_number, help="time to first token")
    b.add_argument("--max-tpot-ms", type=positive_number, help="time per output token after the first")
    b.add_argument("--max-e2e-ms", type=positive_number, help="end-to-end latency of a request")
    b.add_argument("--max-latency-ms", type=positive_number,
                   help="older spelling: a bound on --latency-metric (same as --max-<metric>-ms)")
    b.add_argument("--latency-metric", help="ttft | tpot | e2e: what --max-latency-ms bounds (default tpot)")
    i.add_argument("--request-rate", type=positive_number,
                   help="requests/s the whole deployment must serve (default: offline, unbounded arrival)")
    t = i.add_argument_group("traffic simulation (on with any of these or --workload)")
    t.add_argument("--scenario",
                   help="offline: all requests at once; server: each layout's largest Poisson request rate whose "
                        "percentile bounds hold (default bounds: MLPerf Server's p99 TTFT 2000 / TPOT 200 ms); "
                        "interactive: server with MLPerf's tighter bounds (450 / 40 ms)")
    t.add_argument("--latency-percentile", type=percentile,
                   help="percentile --max-ttft-ms / --max-tpot-ms bound in the simulation (default 99)")
    t.add_argument("--requests", type=positive, help="simulated requests per layout (default 5000)")
    t.add_argument("--seed", type=seed, help="seed of the lengths and arrivals (default 0)")
    g = i.add_argument_group("layout knobs (a given one is pinned; tp, pp and max batch pinned: one estimate)")
    g.add_argument("--tp", type=positive, help="pin tensor parallel size")
    g.add_argument("--pp", type=positive, help="pin pipeline parallel size")
    g.add_argument("--expert-parallel", action=argparse.BooleanOptionalAction,
                   help="MoE models: pin whole experts spread over the TP group (ep = tp) or, with --no-expert-parallel, "
                        "a share of every expert on each GPU")
    g.add_argument("--attention-dp", action="store_true",
                   help="MoE models on tensorrt-llm, in the traffic simulation: each TP rank runs attention (and "
                        "the dense MLPs, shared experts) whole on its own requests around an expert-parallel MoE "
                        "(TensorRT-LLM's enable_attention_dp; pins --expert-parallel); max batch, max tokens and "
                        "the KV pool are per rank")
    g.add_argument("--max-batch", "--batch", dest="max_batch", type=positive,
                   help="pin requests in flight per micro-batch (vLLM --max-num-seqs, TensorRT-LLM max_batch_size)")
    g.add_argument("--max-num-tokens", type=positive, help="pin the tokens one iteration may process")
    g.add_argument("--weight-precision", help="pin weights: bf16 | fp16 | fp8 | nvfp4 (Blackwell's FP4 tensor cores)")
    g.add_argument("--kv-precision", help="pin KV cache: bf16 | fp16 | fp8")
    i.add_argument("--space", default="inference", help="search space preset or YAML path (default inference)")
    i.add_argument("--top", type=positive, default=10, help="entries to print (default 10)")
    i.add_argument("--json", action="store_true", help="print JSON (one object when tp, pp and max batch are pinned)")
    add_table_flags(i, explain=False)
    i.add_argument("--results", help="folder for run folders (default results/)")
    i.add_argument("--no-save", action="store_true", help="do not write a run folder")
    i.set_defaults(func=run)


SIMULATION_DEFAULTS = {"requests": 5000, "seed": 0}


def check_combos(args: argparse.Namespace) -> None:
    """Flags with no effect in the combination given (``cli.combos``), then their defaults."""
    from autoparallel.cli import combos
    if not simulated(args):
        for dest in combos.given(args, SIMULATION_DEFAULTS):
            raise combos.no_effect(combos.flag(dest), "no --workload, --scenario or --latency-percentile",
                                   "only the traffic simulation reads it; add one of them or drop it")
    combos.fill_defaults(args, SIMULATION_DEFAULTS)
    combos.check_results(args)


def simulated(args: argparse.Namespace) -> bool:
    """Whether the flags ask for the traffic simulation (else the steady-state model alone)."""
    return bool(args.scenario or args.workload or args.latency_percentile is not None)


def request_of(args: argparse.Namespace):
    """The Request the flags describe; --max-latency-ms folds into the bound it names; a server
    or interactive scenario supplies the bounds not given."""
    from autoparallel.serve import search as serve
    from autoparallel.serve.traffic import Traffic, scenario_bounds
    bounds = {"max_ttft_ms": args.max_ttft_ms, "max_tpot_ms": args.max_tpot_ms, "max_e2e_ms": args.max_e2e_ms}
    metric = args.latency_metric or "tpot"
    for field, value in serve.legacy_bound(args.max_latency_ms, metric).items():
        if bounds[field] is not None and bounds[field] != value:
            raise UserError(f"--max-latency-ms {value:g} --latency-metric {metric} contradicts "
                            f"--{field.replace('_', '-')} {bounds[field]:g}; give one of them")
        bounds[field] = value
    if args.latency_metric is not None and args.max_latency_ms is None:
        from autoparallel.cli.combos import no_effect
        raise no_effect("--latency-metric", "no --max-latency-ms", "it says which latency --max-latency-ms bounds; "
                        f"add --max-latency-ms, or bound it directly with --max-{args.latency_metric}-ms")
    if simulated(args):
        Traffic(None, args.scenario, 99.0 if args.latency_percentile is None else args.latency_percentile)  # checks
        if args.scenario in ("server", "interactive") and args.request_rate is not None:
            raise UserError(f"--scenario {args.scenario} finds each layout's request rate; drop --request-rate")
        if args.scenario == "offline" and args.request_rate is not None:  # was simulated at the rate, titled offline
            raise UserError(f"--scenario offline sends every request at once; drop --request-rate "
                            f"{args.request_rate:g}, or drop --scenario to simulate {args.request_rate:g} requests/s")
        for field, value in scenario_bounds(args.scenario).items():
            bounds[field] = value if bounds[field] is None else bounds[field]
    if args.workload is None:
        return serve.Request(args.input_len or DEFAULT_INPUT_LEN, args.output_len or DEFAULT_OUTPUT_LEN, **bounds,
                             request_rate=args.request_rate, max_model_len=args.max_model_len)
    if args.input_len is not None or args.output_len is not None:
        raise UserError(f"--workload {args.workload} gives the request lengths; drop --input-len / --output-len")
    from autoparallel.serve.workload import load_workload
    return serve.Request.of_workload(load_workload(args.workload), **bounds, request_rate=args.request_rate,
                                     max_model_len=args.max_model_len)


def check_attention_dp(args: argparse.Namespace, model, engine) -> None:
    """``--attention-dp`` where it is priced (``costmodel.inference.refuse_attention_dp``: a MoE model
    on tensorrt-llm), in the traffic simulation (the steady-state model has no per-rank schedulers),
    with expert parallelism over the TP group; else a one-line error naming what is valid."""
    from autoparallel.costmodel.inference import refuse_attention_dp
    if not simulated(args):
        raise UserError("--attention-dp is priced by the traffic simulation only: add --workload or --scenario")
    if args.expert_parallel is False:
        raise UserError("--attention-dp spreads the experts over the TP ranks (expert parallel): drop "
                        "--no-expert-parallel")
    if args.tp is not None and args.tp < 2:
        raise UserError(f"--attention-dp needs --tp 2 or more (the attention ranks), got --tp {args.tp}")
    refuse_attention_dp(model, engine, 2, 2)  # the model and the engine; the layout's tp = ep is pinned here


def _check_replica(gpus: int, tp: int | None, pp: int | None) -> None:
    """A replica takes tp*pp GPUs, so a pinned --tp, --pp or both must divide --gpus: said here, with
    the values that would, rather than as every candidate's rejection."""
    from autoparallel.search.diagnose import divisors_listed
    for flag, value in (("--tp", tp), ("--pp", pp)):
        if value is not None and gpus % value:
            raise UserError(f"{flag} {value} does not divide --gpus {gpus}: {flag} can be {divisors_listed(gpus)}")
    if tp is not None and pp is not None and gpus % (tp * pp):
        raise UserError(f"--tp {tp} x --pp {pp} = {tp * pp} GPUs a replica does not divide --gpus {gpus}")


def run(args: argparse.Namespace) -> None:
    from autoparallel.costmodel.inference import KV_PRECISIONS
    from autoparallel.report import run_folder
    from autoparallel.serve import search as serve
    from autoparallel.serve.assumptions import load_engine, with_capacity_policy
    from autoparallel.serve.report import print_ranked
    from autoparallel.serve.space import context_warning, load_space, parse_precision
    check_combos(args)
    _check_replica(args.gpus, args.tp, args.pp)
    model = io.load_model(args.model)
    hw = io.load_hardware(args.gpu)
    if not args.no_save:
        run_folder.check_root(Path(args.results))
    engine = with_capacity_policy(load_engine(args.engine), args.capacity_policy)
    request = request_of(args)
    warning = context_warning(model, request.input_len, request.output_len, request.max_model_len)
    if warning:
        from autoparallel.report.fit import for_stderr
        print(for_stderr(f"autoparallel: warning: {warning}"), file=sys.stderr)
    point = args.tp is not None and args.pp is not None and args.max_batch is not None
    if args.attention_dp:
        check_attention_dp(args, model, engine)
        args.expert_parallel = True
    wp = parse_precision(args.weight_precision, "--weight-precision")
    kp = parse_precision(args.kv_precision, "--kv-precision", KV_PRECISIONS)
    if point:  # one layout: 16-bit weights and KV cache and the engine's token budget unless pinned
        wp, kp = wp or "bf16", kp or "bf16"
        args.expert_parallel = bool(args.expert_parallel)
        args.max_num_tokens = args.max_num_tokens or engine.max_num_tokens
    space = load_space(args.space).pinned(tp=args.tp, pp=args.pp, max_batch=args.max_batch,
                                          max_num_tokens=args.max_num_tokens, weight_precision=wp, kv_precision=kp,
                                          expert_parallel=args.expert_parallel)
    if point:
        space = space.pinned(tp_within_nvlink_domain=False)
    if point and not simulated(args):
        row = serve.estimate_point(model, hw, args.gpus, request, space, engine)
        if args.json:
            print(json.dumps(serve.record(row), indent=1))
        else:
            print_ranked(row.to_frame().T.assign(rank=1), serve.point_title(model, hw, args.gpus, request, row),
                         1, console, args.wide)
            if row["reason"]:
                console.print(f"[red]{row['reason']}[/red]")
        if not args.no_save:
            _save_point(args, model, hw, request, space, engine, bool(row["feasible"]))
        return
    if simulated(args):
        return run_simulated(args, model, hw, request, space, engine)
    start = time.perf_counter()
    result = serve.search(model, hw, args.gpus, request, space, engine)
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps({"ranked": result.records(args.top),
                          "pareto": [serve.record(r) for _, r in result.pareto.iterrows()]}, indent=1))
    else:
        title = (f"{serve.title_of(result)}: top {min(args.top, len(result.feasible))} of "
                 f"{len(result.feasible):,} feasible ({len(result.ranked):,} candidates in {elapsed:.2f} s)")
        where = "" if args.no_save else "; all in the run folder's ranked.md"
        print_ranked(result.feasible, title, args.top, console, args.wide, legend=False, where=where)
        print_ranked(result.pareto, "Pareto front: output tokens/s per GPU vs TPOT (fitting layouts, any bound)",
                     len(result.pareto), console, args.wide, where=where)
    if not args.no_save:  # serve.save makes the folder inside the staging folder it is given
        run_dir = run_folder.staged(Path(args.results), lambda staging: serve.save(result, staging, sys.argv))
        if not args.json:
            console.print(f"run folder: {run_dir}")


def _save_point(args: argparse.Namespace, model, hw, request, space, engine, feasible: bool) -> None:
    """The run folder of one pinned layout (its best.yaml holds the engines' commands), as a search's;
    none where it does not fit or misses a bound: nothing to deploy."""
    from autoparallel.report import run_folder
    from autoparallel.serve import search as serve
    if not feasible:
        if not args.json:
            console.print("nothing saved: the layout does not fit or misses a bound (no commands to deploy)")
        return
    result = serve.search(model, hw, args.gpus, request, space, engine)  # the one pinned candidate
    run_dir = run_folder.staged(Path(args.results), lambda staging: serve.save(result, staging, sys.argv))
    if not args.json:
        console.print(f"run folder: {run_dir}")


def run_simulated(args: argparse.Namespace, model, hw, request, space, engine) -> None:
    """The steady-state search, then its best layouts simulated under the workload's traffic."""
    from autoparallel.report import run_folder
    from autoparallel.serve import search as serve
    from autoparallel.serve import traffic
    from autoparallel.serve.workload import Workload, load_workload
    workload = load_workload(args.workload) if args.workload else Workload.fixed(request.input_len, request.output_len)
    percentile = 99.0 if args.latency_percentile is None else args.latency_percentile
    plan = traffic.Traffic(workload, args.scenario, percentile, args.requests, args.seed,
                           attention_dp=bool(args.attention_dp))
    start = time.perf_counter()
    with simulation_progress(args.json) as progress:
        result = serve.search(model, hw, args.gpus, request, space, engine, require_feasible=False)
        frame = traffic.simulate_ranked(result, plan, progress)
    elapsed = time.perf_counter() - start
    if frame.empty:
        raise UserError(serve.no_feasible_message(result))
    if not frame["feasible"].any():  # nothing to rank or deploy: said as the steady-state search says it
        raise UserError(traffic.none_meet(frame, plan, request))
    title = traffic.title(result, plan)
    if args.json:
        print(json.dumps({"scenario": args.scenario or "rate", "workload": workload.name, "percentile": percentile,
                          "ranked": [traffic.record(r, percentile, plan.attention_dp)
                                     for _, r in frame.head(args.top).iterrows()]},
                         indent=1))
    else:
        traffic.print_simulated(frame, f"{title} ({len(frame)} layouts in {elapsed:.1f} s)", percentile, args.top,
                                console, args.wide)
    if not args.no_save:
        extra = {"simulated.md": traffic.markdown(frame, title, percentile)}
        best = traffic.best_document(result, frame, plan)
        run_dir = run_folder.staged(Path(args.results),
                                    lambda staging: serve.save(result, staging, sys.argv, extra=extra, best=best))
        if not args.json:
            console.print(f"run folder: {run_dir}")
