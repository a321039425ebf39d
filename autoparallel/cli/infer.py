"""``autoparallel infer``: rank serving layouts under a latency bound."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from autoparallel import io
from autoparallel.argtypes import positive, positive_number
from autoparallel.cli.common import add_target, console


def add_parser(sub) -> None:
    i = sub.add_parser("infer", help="rank serving layouts (TP, PP, replicas, batch, precision) under a latency bound")
    add_target(i)
    i.add_argument("--input-len", type=positive, default=2048, help="prompt tokens per request (default 2048)")
    i.add_argument("--output-len", type=positive, default=256, help="generated tokens per request (default 256)")
    i.add_argument("--max-latency-ms", type=positive_number, help="latency bound in ms (default: none)")
    i.add_argument("--latency-metric", default="tpot",
                   help="ttft | tpot | e2e: what the bound applies to (default tpot)")
    g = i.add_argument_group("layout knobs (any given knob is pinned; tp, pp and batch all pinned = one estimate)")
    g.add_argument("--tp", type=positive, help="pin tensor parallel size")
    g.add_argument("--pp", type=positive, help="pin pipeline parallel size")
    g.add_argument("--batch", type=positive, help="pin requests in flight per replica")
    g.add_argument("--weight-precision", help="pin weights: bf16 | fp16 | fp8")
    g.add_argument("--kv-precision", help="pin KV cache: bf16 | fp16 | fp8")
    i.add_argument("--space", default="inference", help="search space preset or YAML path (default inference)")
    i.add_argument("--top", type=positive, default=10, help="entries to print (default 10)")
    i.add_argument("--json", action="store_true", help="print JSON (one object when tp, pp and batch are pinned)")
    i.add_argument("--results", default="results", help="folder for run folders (default results/)")
    i.add_argument("--no-save", action="store_true", help="do not write a run folder")
    i.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from autoparallel.report import run_folder
    from autoparallel.serve import search as serve
    from autoparallel.serve.report import print_ranked
    from autoparallel.serve.space import load_space, parse_precision
    model = io.load_model(args.model)
    hw = io.load_hardware(args.gpu)
    if not args.no_save:
        run_folder.check_root(Path(args.results))
    request = serve.Request(args.input_len, args.output_len, args.max_latency_ms, args.latency_metric)
    point = args.tp is not None and args.pp is not None and args.batch is not None
    wp = parse_precision(args.weight_precision, "--weight-precision")
    kp = parse_precision(args.kv_precision, "--kv-precision")
    if point:  # one layout: 16-bit weights and KV cache unless pinned
        wp, kp = wp or "bf16", kp or "bf16"
    space = load_space(args.space).pinned(tp=args.tp, pp=args.pp, batch=args.batch,
                                          weight_precision=wp, kv_precision=kp)
    if point:
        space = space.pinned(tp_within_nvlink_domain=False)
        row = serve.estimate_point(model, hw, args.gpus, request, space)
        if args.json:
            print(json.dumps(serve.record(row), indent=1))
        else:
            title = serve.point_title(model, hw, args.gpus, request, row)
            print_ranked(row.to_frame().T.assign(feasible=True, rank=1), title, 1, console)
            if row["reason"]:
                console.print(f"[red]{row['reason']}[/red]")
        return
    start = time.perf_counter()
    result = serve.search(model, hw, args.gpus, request, space)
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps(result.records(args.top), indent=1))
    else:
        title = (f"{serve.title_of(result)}: top {min(args.top, len(result.feasible))} of "
                 f"{len(result.feasible):,} feasible ({len(result.ranked):,} candidates in {elapsed:.2f} s)")
        print_ranked(result.ranked, title, args.top, console)
    if not args.no_save:  # serve.save makes the folder inside the staging folder it is given
        run_dir = run_folder.staged(Path(args.results), lambda staging: serve.save(result, staging, sys.argv))
        if not args.json:
            console.print(f"run folder: {run_dir}")
