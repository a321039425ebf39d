"""Ranked tables for the terminal (rich) and for files (markdown), from the candidates frame.

Many of the best candidates are one layout (TP/PP/CP/DP/EP) with another VP, micro-batch,
precision or recompute: a table row is one layout, showing its best variant, how many other
variants of it the window holds and which knobs they change. Knobs the columns do not show get
one column ("other knobs") so that two rows never look the same. Predictions within the cost
model's cross-validated error of the best are marked as a tie (``search_spaces/prediction_error.yaml``).
MFU is against the BF16 dense peak, as NeMo and Megatron-LM report it, FP8 utilisation beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from autoparallel import io
from autoparallel.resources import SEARCH_SPACES
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.plan import FP8_PRECISIONS, Plan

LAYOUT_KEYS = ("tp", "pp", "cp", "dp", "ep")
# (column, header, format); the layout columns first, then what was predicted.
RANKED_COLUMNS = (
    ("rank", "#", "{:.0f}"),
    ("tp", "TP", "{:.0f}"), ("pp", "PP", "{:.0f}"), ("vp", "VP", "{:.0f}"), ("cp", "CP", "{:.0f}"),
    ("ep", "EP", "{:.0f}"), ("dp", "DP", "{:.0f}"), ("mbs", "MBS", "{:.0f}"),
    ("sp", "SP", "{}"), ("recompute", "recompute", "{}"), ("precision", "precision", "{}"),
    ("tp_comm_overlap", "TP overlap", "{}"), ("other_knobs", "other knobs", "{}"),
    ("peak_memory_gib", "mem GiB", "{:.1f}"),
    ("step_time_s", "step s", "{:.2f}"),
    ("tokens_per_s_per_gpu", "tok/s/GPU", "{:,.0f}"),
    ("model_tflops_per_gpu", "model TFLOP/s", "{:.0f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("fp8_utilisation", "FP8 util", "{:.1%}"),
    ("tie", "tie", "{}"),
    ("variants", "variants", "{}"),
    ("differs_in", "variants differ in", "{}"),
)
# Shown only when the frame has them: the verdict of `search --fp8-check` for the row's recipe.
OPTIONAL_COLUMNS = (("fp8_check", "FP8 check", "{}"),
                    # `search --profile job` (issue 4): measured beside predicted
                    ("measured_step_time_s", "meas. step s", "{:.3f}"),
                    ("measured_tokens_per_s_per_gpu", "meas. tok/s/GPU", "{:,.0f}"),
                    ("measured_peak_memory_gib", "meas. mem GiB", "{:.3f}"),
                    ("measurement_error", "profiling", "{}"))
# Knobs without a column of their own, as "other knobs" writes a non-default value.
HIDDEN_KNOBS = {"fp8_bf16_edge_layers": "BF16 edge layers {}", "grad_reduce_in_fp32": "grad reduce in FP32: {}",
                "distributed_optimizer": "distributed optimizer: {}", "overlap_grad_reduce": "DP overlap: {}",
                "flash_attention": "flash attention: {}", "fsdp": "FSDP: {}",
                "num_layers_in_first_pipeline_stage": "first stage {} layers",
                "num_layers_in_last_pipeline_stage": "last stage {} layers",
                "account_for_embedding_in_pipeline_split": "embedding counted in split: {}",
                "account_for_loss_in_pipeline_split": "loss counted in split: {}"}
VARIANT_KNOBS = {"vp": "VP", "mbs": "MBS", "sp": "SP", "recompute": "recompute",
                 "recompute_num_layers": "recompute layers", "precision": "precision",
                 "tp_comm_overlap": "TP overlap",
                 **{k: text.split(":")[0].replace(" {}", "") for k, text in HIDDEN_KNOBS.items()}}
PLAN_DEFAULTS = {f: getattr(Plan(tp=1, pp=1, dp=1, gbs=1), f) for f in HIDDEN_KNOBS}


@dataclass(frozen=True)
class PredictionError:
    """The relative step-time error within which two predictions are a tie, and where it comes from."""

    step_time_relative_error: float
    source: str


def prediction_error() -> PredictionError:
    return io.from_dict(PredictionError, io.read_yaml(SEARCH_SPACES / "prediction_error.yaml"),
                        "prediction_error.yaml")


def _columns(ranked: pd.DataFrame) -> tuple:
    return RANKED_COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if c[0] in ranked.columns)


def _other_knobs(row: pd.Series) -> str:
    shown = [text.format(row[k] if not isinstance(row[k], bool) else "no" if not row[k] else "yes")
             for k, text in HIDDEN_KNOBS.items() if k in row and row[k] != PLAN_DEFAULTS[k]]
    return ", ".join(shown) or "-"


def grouped(ranked: pd.DataFrame, candidates: int, hw: HardwareSpec | None = None,
            error: PredictionError | None = None) -> pd.DataFrame:
    """The best ``candidates`` feasible rows as one row per layout (the best variant), with the
    columns the tables add: variants, differs_in, other_knobs, fp8_utilisation, tie."""
    window = ranked[ranked["fits"]].head(candidates).copy()
    if window.empty:
        return window
    keys = [k for k in LAYOUT_KEYS if k in window]
    groups = window.groupby(keys, sort=False)
    best = groups.head(1).copy()
    others = groups.size().rename("n")
    best["variants"] = [f"+{n - 1}" if n > 1 else "-" for n in best.join(others, on=keys)["n"]]
    varying = groups[[k for k in VARIANT_KNOBS if k in window]].nunique()
    best["differs_in"] = [", ".join(VARIANT_KNOBS[k] for k in varying.columns if varying.loc[idx, k] > 1) or "-"
                          for idx in best.set_index(keys).index]
    best["other_knobs"] = [_other_knobs(row) for _, row in best.iterrows()]
    if "precision_utilization" in best:  # the cost model's utilisation of the FP8 peak, FP8 rows only
        fp8 = best["precision"].astype(str).isin(FP8_PRECISIONS)
        best["fp8_utilisation"] = best["precision_utilization"].where(fp8)
    error = error or prediction_error()
    top = window["tokens_per_s_per_gpu"].iloc[0]
    best["tie"] = ["yes" if t >= top * (1 - error.step_time_relative_error) else "-"
                   for t in best["tokens_per_s_per_gpu"]]
    return best


def _cell(row: pd.Series, column: str, fmt: str) -> str:
    value = row.get(column)
    if value is None or (isinstance(value, float) and value != value):
        return "-"  # not measured (only the top-k are profiled), or not an FP8 run
    if column == "recompute" and value == "full" and row.get("recompute_num_layers", 0):
        return f"full({int(row['recompute_num_layers'])})"
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return "yes" if value else "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def ranked_rows(ranked: pd.DataFrame, candidates: int, hw: HardwareSpec | None = None) -> list[list[str]]:
    rows = grouped(ranked, candidates, hw)
    return [[_cell(row, c, f) for c, _, f in _columns(ranked)] for _, row in rows.iterrows()]


def legend(hw: HardwareSpec | None, memory_fraction: float | None = None,
           error: PredictionError | None = None) -> list[str]:
    """What the columns mean: units, the MFU basis, the memory limit and the tie band's source."""
    error = error or prediction_error()
    lines = ["One row per layout (TP/PP/CP/DP/EP): its best variant; variants = the other candidates of that "
             "layout in this window, 'variants differ in' = the knobs they change; other knobs = knobs without "
             "a column that the row sets away from their default.",
             "step s = predicted seconds per optimizer step; tok/s/GPU = trained tokens per second per GPU; "
             "model TFLOP/s = model FLOPs per second per GPU as NeMo counts them (6 x parameters + attention, "
             "per token, recompute not counted).",
             f"tie = predicted throughput within {error.step_time_relative_error:.1%} of the best, the cost "
             f"model's cross-validated step-time error ({error.source}): the order among ties is not meaningful; "
             "measure them (search --profile job).",
             "TP overlap = TP communication overlapped with GEMMs (--tp-comm-overlap, TE Userbuffers); "
             "recompute full(n) = n layers of each pipeline chunk recomputed."]
    if hw is not None:
        fp8 = f", FP8 util against the FP8 dense peak ({hw.fp8_tflops:,.0f} TFLOP/s)" if hw.fp8_tflops else ""
        limit = (f" against a limit of {memory_fraction * hw.memory_gib:.1f} GiB ({memory_fraction:.0%} of "
                 f"{hw.memory_gib:g} GiB)") if memory_fraction else ""
        lines.insert(2, f"MFU = model TFLOP/s over the BF16 dense peak ({hw.bf16_tflops:,.0f} TFLOP/s on "
                        f"{hw.name}), also for FP8 runs, as NeMo and Megatron-LM report it{fp8}; mem GiB = "
                        f"predicted peak of the fullest GPU{limit}.")
    return lines


def print_ranked(ranked: pd.DataFrame, title: str, top: int = 10, console: Console | None = None,
                 hw: HardwareSpec | None = None, memory_fraction: float | None = None) -> None:
    console = console or Console()
    table = Table(title=title, header_style="bold", caption="\n".join(legend(hw, memory_fraction)),
                  caption_justify="left")
    for _, header, _ in _columns(ranked):
        table.add_column(header, justify="right", no_wrap=True)
    for row in ranked_rows(ranked, top, hw):
        table.add_row(*row)
    if not console.is_terminal:  # logs and pipes: as wide as the table needs, never a truncated value
        width = Measurement.get(console, console.options.update(width=100_000), table).maximum
        console = Console(file=console.file, width=width, force_terminal=False, color_system=None)
    console.print(table)


def markdown_table(ranked: pd.DataFrame, top: int = 50, hw: HardwareSpec | None = None,
                   memory_fraction: float | None = None) -> str:
    headers = [h for _, h, _ in _columns(ranked)]
    rows = ranked_rows(ranked, top, hw)
    feasible = int(ranked["fits"].sum())
    lines = [f"Best {min(top, feasible)} of {feasible:,} feasible candidates in {len(rows)} layouts.", "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n\n" + "".join(f"- {line}\n" for line in legend(hw, memory_fraction))


def rejection_summary(ranked: pd.DataFrame) -> pd.Series:
    """How many candidates each rule rejected, memory rejections counted together."""
    reasons = ranked.loc[~ranked["fits"], "reason"].astype(str)
    reasons = reasons.where(~reasons.str.startswith("out of memory"), "out of memory")
    return reasons.value_counts()
