"""Context parallelism's kind (--cp-comm-type) on long-context cases, and the search's runtime.

``--table``: for each case (model, GPU, GPUs, sequence length, global batch) the search's best plan
over the default training space (which offers every kind the model and the heads allow where cp > 1),
then the best plan with each kind pinned, its predicted step time, its CP exchange per layer
(``cp_comm`` of the breakdown over the layers of a stage... given here as the term per micro-batch
and layer, priced by ``layer_time.cp_comm_time``) and the bytes one rank sends per layer and
micro-batch (BF16, written out from the tensors, not from the cost model's helpers):

- p2p: 3 (c-1) x KV (K/V forward, K/V and dK/dV backward, round the ring);
- a2a: 2 x (c-1)/c x (Q + K + V + O) (Q, K, V in and O out; dO in and dQ, dK, dV out);
- allgather: 3 x (c-1) x KV (all-gather of K/V twice, reduce-scatter of dK/dV once);
- a2a+p2p: 2 x (A-1)/A x (Q + K + V + O) + 3 (c/A-1) x KV (A: the a2a group);

KV = 2 B x mbs x s/c x (qk + v dims) x max(groups/tp, 1), Q and O with heads/tp heads.

``--timing``: in-process wall and CPU seconds of ``run.search`` for GPT-3 175B on 1024 H100s and a
long-context case (best and median of ``--repeats`` after a warm-up). It imports only what every
checkout has, so it can time another one (``PYTHONPATH=/path/to/other/checkout``).

    PYTHONPATH=$PWD python benchmarks/bench_cp_comm_type.py --table --timing
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from autoparallel import io
from autoparallel.search import run
from autoparallel.space import load_space

# (model, GPU, GPUs, sequence length, global batch in sequences)
CASES = [("llama3.1-70b", "h100-sxm", 64, 32768, 64), ("llama3.1-70b", "h100-sxm", 128, 131072, 32),
         ("llama3.1-70b", "gb200", 128, 131072, 32), ("llama3.1-405b", "gb200", 256, 131072, 32)]
TIMED = [("gpt3-175b", "h100-sxm", 1024, None, None), ("llama3.1-70b", "h100-sxm", 128, 131072, 32)]
KINDS = ("p2p", "a2a", "allgather", "a2a+p2p")


def _model(name: str, seq: int | None):
    model = io.load_model(name)
    return model if seq is None else dataclasses.replace(model, seq_length=seq)


def _sent_bytes(model, kind: str, tp: int, cp: int, mbs: int) -> float:
    """Bytes one CP rank sends per layer and micro-batch (the module docstring's formulas)."""
    from autoparallel.costmodel import cp_kinds
    s = model.seq_length // cp
    kv_heads, heads = max(model.query_groups / tp, 1.0), model.num_attention_heads / tp
    kv = 2 * mbs * s * (model.qk_dim + model.v_dim) * kv_heads
    qkvo = 2 * mbs * s * (heads * (model.qk_dim + model.v_dim) + kv_heads * (model.qk_dim + model.v_dim))
    if kind == "p2p":
        return 3 * (cp - 1) * kv
    if kind == "allgather":
        return 3 * (cp - 1) * kv
    if kind == "a2a":
        return 2 * (cp - 1) / cp * qkvo
    inner = int(cp_kinds.a2a_group(model, tp, cp, kind))
    return 2 * (inner - 1) / inner * qkvo + 3 * (cp // inner - 1) * kv


def _cp_term(model, hw, row) -> float:
    """``cp_comm_time`` of the row's plan: seconds per layer and micro-batch."""
    from autoparallel.costmodel import layer_time
    from autoparallel.costmodel.candidates import candidates
    from autoparallel.costmodel.estimate import plan_columns
    from autoparallel.space import row_to_plan
    x = candidates(model, hw, plan_columns([row_to_plan(row)]))
    return float(layer_time.cp_comm_time(x, layer_time.attention_time(x))[0])


def table() -> None:
    print("| case | kind | best plan with it (TP PP VP CP DP MBS, recompute, precision) | step s | "
          "CP exchange ms per layer and micro-batch | MB a rank sends per layer and micro-batch |")
    print("|---|---|---|---|---|---|")
    for name, gpu, gpus, seq, gbs in CASES:
        model, hw = _model(name, seq), io.load_hardware(gpu)
        space = load_space()
        best = run.search(model, hw, gpus, gbs, space).feasible.iloc[0]
        case = f"{name} seq {seq // 1024}k, {gpus} x {gpu}, gbs {gbs}"
        print(f"| {case} | search picks **{best.cp_comm_type if best.cp > 1 else 'no CP'}** | "
              f"{_layout(best)} | {best.step_time_s:.2f} | | |")
        for kind in KINDS:
            try:
                row = run.search(model, hw, gpus, gbs, space.pinned(cp_comm_type=kind)).feasible
            except Exception as exc:  # a kind no layout of the space can run
                print(f"| | {kind} | none: {str(exc).splitlines()[0][:90]} | | | |")
                continue
            row = row[row.cp > 1].iloc[0] if (row.cp > 1).any() else None
            if row is None:
                print(f"| | {kind} | no feasible plan with cp > 1 | | | |")
                continue
            sent = _sent_bytes(model, kind, int(row.tp), int(row.cp), int(row.mbs))
            print(f"| | {kind} | {_layout(row)} | {row.step_time_s:.2f} | {_cp_term(model, hw, row) * 1e3:.2f} | "
                  f"{sent / 1e6:.1f} |")


def _layout(row) -> str:
    return (f"{row.tp:.0f} {row.pp:.0f} {row.vp:.0f} {row.cp:.0f} {row.dp:.0f} {row.mbs:.0f}, {row.recompute}, "
            f"{row.precision}")


def timing(repeats: int) -> None:
    print("| search | candidates | run.search wall s (best / median) | CPU s (best / median) |")
    print("|---|---|---|---|")
    for name, gpu, gpus, seq, gbs in TIMED:
        model, hw, space = _model(name, seq), io.load_hardware(gpu), load_space()
        gbs = gbs or model.global_batch_size
        result = run.search(model, hw, gpus, gbs, space)  # warm-up
        wall, cpu = [], []
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            run.search(model, hw, gpus, gbs, space)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        cell = lambda v: f"{min(v):.2f} / {statistics.median(v):.2f}"  # noqa: E731
        print(f"| {name}{f' seq {seq // 1024}k' if seq else ''}, {gpus} x {gpu} | {len(result.ranked):,} | "
              f"{cell(wall)} | {cell(cpu)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.table:
        table()
    if args.timing:
        timing(args.repeats)


if __name__ == "__main__":
    main()
