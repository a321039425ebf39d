"""Held-out check of calibrating on one's own training logs (issue 17).

The published H100 runs play the user's cluster. Each dense H100 row of the shipped runs CSVs
becomes a Megatron-LM training log, written through Megatron-LM's own print formats (the
``_print_args`` block, ``training_log`` lines with a warm-up first interval and +-0.4 % jitter
around the published step time, the tokenizer's padded-vocab line). What the papers leave
unstated (recompute, TP overlap, micro-batch where missing) is what the validation's search
picks with the *uncalibrated* constants, so no published figure leaks into a layout. The logs go
through ``runs import`` (``import_logs``), the round trip is checked, the rows are split in two
halves (sorted by id, alternating), and each half is predicted after a refit on the other:

- uncalibrated: the ``Efficiency`` defaults, what a new GPU preset starts from;
- refit: ``calibrate.fit`` on the other half's logs, starting from the uncalibrated constants
  (leak-free: nothing of the predicted half was seen);
- shipped h100-sxm: the preset as shipped, fitted on all published rows (in-sample, reference);
- ``calibrate --runs HALF --gpu h100-sxm --as``: the user's command, which starts from the
  shipped preset (so it has seen the predicted half through it: shown, not the headline).

    python benchmarks/bench_log_calibration.py
"""

from __future__ import annotations

import dataclasses
import io as textio
import statistics
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from autoparallel import io, measured_runs
from autoparallel.costmodel import calibrate, flops
from autoparallel.costmodel.estimate import estimate_columns
from autoparallel.runlogs.runrow import FP8_RECIPES
from autoparallel.runlogs.runsfile import import_logs
from autoparallel.space import row_to_plan

GPU = "h100-sxm"
LOG_INTERVAL, TRAIN_ITERS = 10, 100
JITTER = (0.004, -0.003, 0.001, -0.002, 0.0, 0.003, -0.001, 0.002, -0.004, 0.0)  # median 0
WARMUP_FACTOR = 3.0


# --- the generator: Megatron-LM's print formats --------------------------------------------------

def print_args(args: dict) -> list[str]:
    """megatron/training/arguments.py ``_print_args("arguments", args)``."""
    title = "arguments"
    lines = [f"------------------------ {title} ------------------------"]
    str_list = ["  {} {} {}".format(arg, "." * (48 - len(arg)), value) for arg, value in args.items()]
    lines += sorted(str_list, key=lambda x: x.lower())
    return lines + [f"-------------------- end of {title} ---------------------"]


def training_line(iteration: int, elapsed_ms: float, tflops: float, batch: int) -> str:
    """megatron/training/training.py ``training_log``'s line (with --log-throughput)."""
    s = f" [2026-11-23 10:{iteration % 60:02d}:00.000000]"
    s += " iteration {:8d}/{:8d} |".format(iteration, TRAIN_ITERS)
    s += " consumed samples: {:12d} |".format(batch * iteration)
    s += " elapsed time per iteration (ms): {:.1f} |".format(elapsed_ms)
    s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += f" learning rate: {1e-4:.6E} |"
    s += f" global batch size: {batch:5d} |"
    s += " {}: {:.6E} |".format("lm loss", 8.0)
    s += f" loss scale: {1.0:.1f} |"
    s += " number of skipped iterations: {:3d} |".format(0)
    s += " number of nan iterations: {:3d} |".format(0)
    return s


def megatron_arguments(model, plan, gpus: int) -> dict:
    """The arguments a Megatron-LM job of ``plan`` prints (the ones the reader uses, and a few)."""
    fp8 = plan.precision in FP8_RECIPES.values()
    recipe = {v: k for k, v in FP8_RECIPES.items()}.get(plan.precision)
    return {
        "num_layers": model.num_layers, "hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads, "group_query_attention": model.num_query_groups is not None,
        "num_query_groups": model.num_query_groups or 1, "kv_channels": model.head_dim,
        "seq_length": model.seq_length, "max_position_embeddings": model.seq_length,
        "swiglu": model.activation == "swiglu", "squared_relu": model.activation == "squared_relu",
        "normalization": "RMSNorm" if model.normalization == "rmsnorm" else "LayerNorm", "vocab_size": None,
        "untie_embeddings_and_output_weights": not model.tie_embeddings, "hidden_dropout": model.hidden_dropout,
        "attention_dropout": model.attention_dropout,
        "num_experts": None, "world_size": gpus, "rank": 0, "data_parallel_size": plan.dp,
        "tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
        "virtual_pipeline_model_parallel_size": plan.vp if plan.vp > 1 else None,
        "context_parallel_size": plan.cp, "expert_model_parallel_size": plan.ep,
        "sequence_parallel": plan.sp, "micro_batch_size": plan.mbs, "global_batch_size": plan.gbs,
        "decoder_first_pipeline_num_layers": plan.num_layers_in_first_pipeline_stage or None,
        "decoder_last_pipeline_num_layers": plan.num_layers_in_last_pipeline_stage or None,
        "account_for_embedding_in_pipeline_split": plan.account_for_embedding_in_pipeline_split,
        "account_for_loss_in_pipeline_split": plan.account_for_loss_in_pipeline_split,
        "recompute_granularity": None if plan.recompute == "none" else plan.recompute,
        "recompute_method": (("block" if plan.recompute_num_layers else "uniform")
                             if plan.recompute == "full" else None),
        "recompute_num_layers": (plan.recompute_num_layers or 1) if plan.recompute == "full" else None,
        "recompute_modules": ["core_attn"],
        "bf16": plan.precision != "fp16", "fp16": plan.precision == "fp16",
        "fp8": "hybrid" if fp8 else None, "fp8_recipe": recipe or "delayed",
        "first_last_layers_bf16": plan.fp8_bf16_edge_layers > 0,
        "num_layers_at_start_in_bf16": plan.fp8_bf16_edge_layers or 1,
        "num_layers_at_end_in_bf16": plan.fp8_bf16_edge_layers or 1,
        "use_distributed_optimizer": plan.distributed_optimizer and not plan.fsdp,
        "use_megatron_fsdp": plan.fsdp,
        "data_parallel_sharding_strategy": "optim_grads_params" if plan.fsdp else "no_shard",
        "overlap_grad_reduce": plan.overlap_grad_reduce, "overlap_param_gather": plan.overlap_param_gather,
        "accumulate_allreduce_grads_in_fp32": plan.grad_reduce_in_fp32,
        "grad_reduce_in_bf16": not plan.grad_reduce_in_fp32,
        "tp_comm_overlap": plan.tp_comm_overlap,
        "attention_backend": "AttnBackend.auto" if plan.flash_attention else "AttnBackend.unfused",
        "cpu_offloading": plan.cpu_offloading_num_layers > 0,
        "cpu_offloading_num_layers": plan.cpu_offloading_num_layers,
        "transformer_impl": "transformer_engine", "log_interval": LOG_INTERVAL, "log_throughput": True,
        "train_iters": TRAIN_ITERS, "lr": 0.0001, "seed": 1234, "params_dtype": "torch.bfloat16",
    }


def write_log(model, plan, gpus: int, step_s: float) -> str:
    """A Megatron-LM log of ``plan`` whose steady iterations take ``step_s`` (median)."""
    padded = int(flops.padded_vocab_size(model, plan.tp))
    tflops_per_s = flops.model_flops_per_token(model, plan.tp) * plan.gbs * model.seq_length / (step_s * gpus) / 1e12
    lines = print_args(megatron_arguments(model, plan, gpus))
    lines.append(f"INFO:megatron.core.num_microbatches_calculator:setting number of microbatches to constant "
                 f"{plan.num_microbatches}")
    lines.append(" > padded vocab (size: {}) with {} dummy tokens (new size: {})".format(
        model.vocab_size, padded - model.vocab_size, padded))
    lines.append("training ...")
    lines.append(training_line(1, 1000 * step_s * WARMUP_FACTOR, tflops_per_s / WARMUP_FACTOR, plan.gbs))
    for k, iteration in enumerate(range(LOG_INTERVAL, TRAIN_ITERS + 1, LOG_INTERVAL)):
        factor = 1 + JITTER[k % len(JITTER)]
        lines.append(training_line(iteration, 1000 * step_s * factor, tflops_per_s / factor, plan.gbs))
    return "\n".join(lines) + "\n"


# --- the check -----------------------------------------------------------------------------------

def chosen_plan(prepared: measured_runs.PreparedRow, efficiency):
    """The layout the validation's search picks for a published row with ``efficiency``."""
    hw = dataclasses.replace(prepared.hardware, efficiency=efficiency)
    out = estimate_columns(prepared.model, hw, prepared.cols, prepared.memory_fraction)
    return row_to_plan(prepared.candidates.iloc[measured_runs.best_candidate(out)])


def errors(rows, efficiency) -> dict[str, float]:
    return {p.id: measured_runs.predict_row(p, efficiency)["error_pct"] for p in rows}


def mean_abs(values) -> float:
    return float(np.mean(np.abs(list(values))))


def main() -> None:
    hw = io.load_hardware(GPU)
    uncalibrated = calibrate.uncalibrated(hw.efficiency)
    published = sorted((p for p in measured_runs.load_runs() if p.hardware.name == hw.name), key=lambda p: p.id)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for p in published:
            plan = chosen_plan(p, uncalibrated)
            step_s = plan.gbs * p.model.seq_length / (float(p.row["measured_tokens_per_s_per_gpu"]) * plan.num_gpus)
            (folder / f"{p.id}.log").write_text(write_log(p.model, plan, plan.num_gpus, step_s))
        runs = folder / "runs.csv"
        imported = import_logs(sorted(folder.glob("*.log")), GPU, runs)
        skipped = [f"{r.path.name}: {r.reason}" for r in imported if r.row is None]
        rows = sorted(measured_runs.load_runs([runs]), key=lambda p: p.id)
        by_source = {Path(str(p.row["source"]).split(" log ")[1]).stem: p for p in rows}
        mismatched = []
        for p in published:
            mine = by_source[p.id].row
            step_s = p.row["gbs"] * p.row["seq_length"] / (p.row["measured_tokens_per_s_per_gpu"]
                                                           * p.row["num_gpus"])
            knobs = ("num_layers", "hidden_size", "tp", "pp", "cp", "mbs", "gbs", "num_gpus")
            same = all(int(mine[k]) == int(p.row[k]) for k in knobs) and mine["precision"] == p.row["precision"]
            if not same or abs(mine["measured_iteration_time_s"] / step_s - 1) > 1e-4:
                mismatched.append(p.id)
        print(f"{len(published)} dense {GPU} rows -> {len(published)} logs -> {len(rows)} imported rows; "
              f"skipped: {skipped or 'none'}; round-trip mismatches: {mismatched or 'none'}\n")

        halves = (rows[0::2], rows[1::2])
        print("| fold | fit on | predict | uncalibrated | refit (from uncalibrated) | in-sample of refit "
              "| shipped h100-sxm | `calibrate --runs HALF --as` |")
        print("|---|---|---|---|---|---|---|---|")
        per_row = []
        for fold, (train, test) in enumerate((halves, halves[::-1]), start=1):
            refit = calibrate.fit(train, uncalibrated)
            after = dataclasses.replace(uncalibrated, **refit.values)
            half_csv = folder / f"half{fold}.csv"
            pd.read_csv(runs).set_index("id").loc[[p.id for p in train]].reset_index().to_csv(half_csv, index=False)
            preset = folder / f"half{fold}.yaml"
            calibrate.main(GPU, half_csv, write=True, console=Console(file=textio.StringIO()), output=preset,
                           as_name=f"bench-half{fold}")
            user = io.from_dict(type(hw), io.read_yaml(preset), str(preset)).efficiency
            before_e, after_e, shipped_e, user_e = (errors(test, e) for e in (uncalibrated, after, hw.efficiency, user))
            print(f"| {fold} | {len(train)} rows | {len(test)} rows | {mean_abs(before_e.values()):.1f} % "
                  f"| {mean_abs(after_e.values()):.1f} % (max {max(map(abs, after_e.values())):.1f}) "
                  f"| {mean_abs(errors(train, after).values()):.1f} % | {mean_abs(shipped_e.values()):.1f} % "
                  f"| {mean_abs(user_e.values()):.1f} % |")
            print(f"|  | fitted: {', '.join(refit.fitted)} | | | | | | |")
            per_row += [(i, before_e[i], after_e[i], shipped_e[i]) for i in before_e]
        print("\n| held-out run (as a log) | uncalibrated err % | after refit err % | shipped err % |")
        print("|---|---|---|---|")
        for run_id, before_v, after_v, shipped_v in sorted(per_row):
            print(f"| {run_id} | {before_v:+.1f} | {after_v:+.1f} | {shipped_v:+.1f} |")
        print(f"\nall {len(per_row)} held-out predictions: mean |error| uncalibrated "
              f"{statistics.mean(abs(r[1]) for r in per_row):.1f} %, after refit on the other half "
              f"{statistics.mean(abs(r[2]) for r in per_row):.1f} %, shipped preset (in-sample) "
              f"{statistics.mean(abs(r[3]) for r in per_row):.1f} %")


if __name__ == "__main__":
    main()
