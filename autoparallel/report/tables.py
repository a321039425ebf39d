"""Ranked tables for the terminal (rich) and for files (markdown), from the candidates frame.

Many of the best candidates are one layout (TP/PP/CP/DP/EP) with another VP, micro-batch,
precision or recompute: a table row is one layout, showing its best variant, how many other
variants of it the window holds and which knobs they change (as short codes, ``KNOB_CODES``).
Knobs the columns do not show get one column ("other") so that two rows never look the same.
The terminal gets the columns that fit its width (``report.fit``) and a three-line legend; the
full legend and the code key are in ranked.md and under ``--explain``. Predictions within the cost
model's cross-validated error of the best are marked as a tie (``search_spaces/prediction_error.yaml``).
MFU is against the BF16 dense peak, as NeMo and Megatron-LM report it, FP8 utilisation beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from rich.console import Console

from autoparallel import io
from autoparallel.costmodel.finetune import is_lora
from autoparallel.report.fit import Column, cell, output_width, phrase_lines, print_table
from autoparallel.report.time_to_train import TimeToTrain, dollars, si
from autoparallel.resources import SEARCH_SPACES
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import FP8_PRECISIONS, Plan

LAYOUT_KEYS = ("tp", "pp", "cp", "dp", "ep")
# The precision where a narrow table has no room for its name (what tells FP8 from BF16 stays).
PRECISION_CODES = (("fp8-delayed", "fp8d"), ("fp8-current", "fp8c"), ("fp8-blockwise", "fp8b"))
# The layout, the measures and the tie mark are never dropped (drop=0); the others go whole when
# the terminal is too narrow, the highest ``drop`` first (report.fit). Headers stay short: the
# legend and ``--explain`` say what each means.
RANKED_COLUMNS = (
    Column("rank", "#", "{:.0f}"),
    Column("tp", "TP", "{:.0f}", knob=True), Column("pp", "PP", "{:.0f}", knob=True),
    Column("vp", "VP", "{:.0f}", knob=True), Column("cp", "CP", "{:.0f}", knob=True),
    Column("ep", "EP", "{:.0f}", knob=True), Column("dp", "DP", "{:.0f}", knob=True),
    Column("mbs", "MBS", "{:.0f}", knob=True), Column("sp", "SP", knob=True),
    Column("precision", "precision", drop=1, knob=True, short="prec", codes=PRECISION_CODES), Column("recompute", "recompute", drop=2, knob=True),
    Column("tp_comm_overlap", "TP ovl", drop=4, knob=True),
    Column("peak_memory_gib", "mem GiB", "{:.1f}"),
    Column("step_time_s", "step s", "{:.2f}"),
    Column("tokens_per_s_per_gpu", "tok/s/GPU", "{:,.0f}"),
    Column("model_tflops_per_gpu", "TFLOP/s", "{:.0f}", drop=6),
    Column("mfu", "MFU", "{:.1%}"),
    Column("fp8_utilisation", "FP8 util", "{:.1%}", drop=6),
    Column("tie", "tie", alike=(("yes", "every row is a tie"),)),
    Column("variants", "var", drop=3),
    Column("differs_in", "differs", drop=5),
    Column("other_knobs", "other", drop=7, knob=True),
)
# Shown only when the frame has them: the verdict of `search --fp8-check` for the row's recipe,
# `search --profile job` (issue 4): measured beside predicted, and the time to train (issue 24).
OPTIONAL_COLUMNS = (Column("fp8_check", "FP8 check", drop=8),
                    Column("measured_step_time_s", "meas. step s", "{:.3f}", drop=1),
                    Column("measured_tokens_per_s_per_gpu", "meas. tok/s/GPU", "{:,.0f}", drop=2),
                    Column("measured_peak_memory_gib", "meas. mem GiB", "{:.3f}", drop=3),
                    Column("measured_model_tflops_per_gpu", "meas. TFLOP/s", "{:.0f}", drop=4),
                    Column("profiled", "profiled", drop=9),
                    # asked for with --tokens / --train-days: dropped after the precision only
                    Column("train_days", "days", "{:,.1f}", drop=1), Column("train_tokens", "tokens", si, drop=1),
                    Column("gpu_hours", "GPU-h", si, drop=6), Column("cost_usd", "cost", dollars, drop=6))
# Knobs as the "differs" and "other" columns write them: a short code, and what it means.
KNOB_CODES = {"vp": ("vp", "virtual pipeline stages"), "mbs": ("mbs", "micro-batch size"),
              "sp": ("sp", "sequence parallel"), "recompute": ("rc", "recompute"),
              "recompute_num_layers": ("rcn", "layers full recompute covers"),
              "precision": ("prec", "precision"), "tp_comm_overlap": ("tpov", "TP communication overlap"),
              "fp8_bf16_edge_layers": ("edge", "first/last layers kept in BF16 under FP8 (edgeN: N each)"),
              "grad_reduce_in_fp32": ("g32", "gradients reduced in FP32"),
              "distributed_optimizer": ("dopt", "distributed optimizer"),
              "overlap_grad_reduce": ("dpov", "DP gradient reduce / parameter gather overlapped"),
              "flash_attention": ("fa", "flash attention"),
              "fsdp": ("fsdp", "fully sharded data parallel (Megatron-FSDP)"),
              "num_layers_in_first_pipeline_stage": ("first", "layers of the first pipeline stage (firstN)"),
              "num_layers_in_last_pipeline_stage": ("last", "layers of the last pipeline stage (lastN)"),
              "account_for_embedding_in_pipeline_split": ("emb", "embedding counted as a layer in the split"),
              "account_for_loss_in_pipeline_split": ("loss", "loss counted as a layer in the split"),
              "fp8_param_gather": ("fp8pg", "FP8 weights kept and gathered in FP8 (--fp8-param-gather)"),
              "precision_aware_optimizer": ("bf16m", "Adam moments in BF16 (precision-aware optimizer)"),
              "cuda_graph": ("cg", "CUDA graphs (cglayer, cgfull_iteration)"),
              "moe_shared_expert_overlap": ("shov", "shared experts beside the all-to-alls"),
              "fp8_attention": ("fp8a", "FP8 dot-product attention"),
              "tp_overlap_rs_pipeline": ("rspipe", "forward reduce-scatters as TE's pipeline method"),
              "lora_input_regather": ("regather", "LoRA's QKV / FC1 adapters keep their input's sequence shard"),
              "tp_only_amax_red": ("tpamax", "FP8 amaxes reduced over TP only (--tp-only-amax-red)"),
              "activation_func_fp8_input_store": ("fp8act", "SwiGLU inputs kept in FP8 for backward"),
              "param_remainders": ("prem", "16 bits per master weight (Apex store_param_remainders)"),
              "cross_entropy_loss_fusion": ("cefuse", "TransformerEngine's fused cross-entropy"),
              "cutedsl_fused_grouped_mlp": ("fgmlp", "MoE experts as TE's fused CuTe-DSL grouped MLP"),
              "cp_comm_type": ("cpx", "CP exchange other than the p2p ring (cpxa2a, cpxallgather, cpxa2a+p2p)")}
# Knobs without a column of their own: "other" writes each one away from its default.
HIDDEN_KNOBS = ("fp8_bf16_edge_layers", "grad_reduce_in_fp32", "distributed_optimizer", "overlap_grad_reduce",
                "flash_attention", "fsdp", "num_layers_in_first_pipeline_stage",
                "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split", "fp8_param_gather", "precision_aware_optimizer", "cuda_graph",
                "moe_shared_expert_overlap", "fp8_attention", "tp_only_amax_red", "activation_func_fp8_input_store",
                "param_remainders", "cross_entropy_loss_fusion", "cutedsl_fused_grouped_mlp", "tp_overlap_rs_pipeline",
                "cp_comm_type", "lora_input_regather")
VARIANT_KNOBS = ("vp", "mbs", "sp", "recompute", "recompute_num_layers", "precision", "tp_comm_overlap",
                 *HIDDEN_KNOBS)
PLAN_DEFAULTS = {f: getattr(Plan(tp=1, pp=1, dp=1, gbs=1), f) for f in HIDDEN_KNOBS}


@dataclass(frozen=True)
class PredictionError:
    """The relative step-time error within which two predictions are a tie, and where it comes
    from: pooled over every GPU, and per GPU family (a preset and those that take its fitted
    constants) for dense and MoE models, as ``validate --tie-bands`` writes them."""

    step_time_relative_error: float
    source: str
    moe_step_time_relative_error: float | None = None
    # The held-out hybrid Mamba-Transformer rows' error (validate's "hybrid-newer" kind), pooled.
    hybrid_step_time_relative_error: float | None = None
    # The held-out DeepSeek-V4 rows' error (validate's "dsv4-newer" kind), pooled.
    dsv4_step_time_relative_error: float | None = None
    # family -> {"dense": error, "dense_rows": n, "moe": error, "moe_rows": n} (kinds it has rows of)
    by_family: dict[str, dict[str, float]] = field(default_factory=dict)
    # vendor -> {"error": e, "rows": n}: the held-out error of the rows on a vendor's GPUs other than NVIDIA's,
    # which price with a borrowed NVIDIA family's constants (validate's "lora-amd" kind).
    by_vendor: dict[str, dict[str, float]] = field(default_factory=dict)

    def for_model(self, hw: HardwareSpec | None, model: ModelSpec | None = None) -> PredictionError:
        """The band of ``hw``'s family for ``model``'s kind (``for_hardware``: MoE, a LoRA fine-tune,
        a hybrid Mamba-Transformer, DeepSeek-V4), dense without a model."""
        if model is None:
            return self.for_hardware(hw)
        return self.for_hardware(hw, model.is_moe, is_lora(model), model.is_hybrid, model.is_dsv4)

    def for_hardware(self, hw: HardwareSpec | None, moe: bool = False, lora: bool = False,
                     hybrid: bool = False, dsv4: bool = False) -> PredictionError:
        """The band of ``hw``'s family and the model's kind (dense, moe, a LoRA fine-tune, a
        hybrid Mamba-Transformer or DeepSeek-V4); the pooled one (dense for LoRA) where the family has
        no held-out rows of that kind. A LoRA fine-tune on Blackwell takes the family's
        ``lora-blackwell`` band (MLPerf's Blackwell LoRA rows) where it has no ``lora`` one."""
        kind = ("dsv4-newer" if dsv4 else "hybrid-newer" if hybrid else "moe" if moe else "lora" if lora
                else "dense")
        pooled = self.step_time_relative_error
        if dsv4 and self.dsv4_step_time_relative_error:
            pooled = self.dsv4_step_time_relative_error
        elif hybrid and self.hybrid_step_time_relative_error:
            pooled = self.hybrid_step_time_relative_error
        elif moe and self.moe_step_time_relative_error:
            pooled = self.moe_step_time_relative_error
        family = (hw.efficiency_from or hw.name) if hw is not None else ""
        vendor = self.by_vendor.get(hw.vendor) if hw is not None else None
        if vendor:  # its constants are borrowed: the borrowed family's band is not its error
            return PredictionError(vendor["error"], f"{int(vendor['rows'])} held-out rows on {hw.vendor} GPUs; "
                                   f"{self.source}")
        band = self.by_family.get(family, {})
        if lora and kind not in band and "lora-blackwell" in band:  # MLPerf's LoRA rows of that family
            kind = "lora-blackwell"
        if kind not in band:
            return PredictionError(pooled, f"{kind} rows of every GPU; {self.source}")
        rows = int(band[f"{kind}_rows"])
        return PredictionError(band[kind], f"{rows} {kind} rows of the {family} family; {self.source}")


def prediction_error() -> PredictionError:
    return io.from_dict(PredictionError, io.read_yaml(SEARCH_SPACES / "prediction_error.yaml"),
                        "prediction_error.yaml")


def _columns(ranked: pd.DataFrame) -> tuple[Column, ...]:
    return RANKED_COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if c.key in ranked.columns)


def _code(knob: str, value) -> str:
    """A hidden knob's value as "other" writes it: code and number, the code alone for on, no+code for off."""
    code = KNOB_CODES[knob][0]
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return code if value else f"no{code}"
    return f"{code}{value}"


def _other_knobs(row: pd.Series) -> str:
    return ",".join(_code(k, row[k]) for k in HIDDEN_KNOBS if k in row and row[k] != PLAN_DEFAULTS[k]) or "-"


def grouped(ranked: pd.DataFrame, candidates: int, hw: HardwareSpec | None = None,
            error: PredictionError | None = None) -> pd.DataFrame:
    """The best ``candidates`` feasible rows as one row per layout (the best variant), with the
    columns the tables add: variants, differs_in, other_knobs, fp8_utilisation, tie."""
    # The first ``candidates`` fitting rows by position: a filter of the whole frame copied every
    # row of every column (millions on MoE searches) to keep a few dozen.
    window = ranked.iloc[np.flatnonzero(ranked["fits"].to_numpy(dtype=bool))[:candidates]].copy()
    if window.empty:
        return window
    keys = [k for k in LAYOUT_KEYS if k in window]
    groups = window.groupby(keys, sort=False)
    best = groups.head(1).copy()
    others = groups.size().rename("n")
    best["variants"] = [f"+{n - 1}" if n > 1 else "-" for n in best.join(others, on=keys)["n"]]
    varying = groups[[k for k in VARIANT_KNOBS if k in window]].nunique()
    best["differs_in"] = [",".join(KNOB_CODES[k][0] for k in varying.columns if varying.loc[idx, k] > 1) or "-"
                          for idx in best.set_index(keys).index]
    best["other_knobs"] = [_other_knobs(row) for _, row in best.iterrows()]
    if "measurement_error" in best:
        best["profiled"] = _profiled(best)
    if "precision_utilization" in best:  # the cost model's utilisation of the FP8 peak, FP8 rows only
        fp8 = best["precision"].astype(str).isin(FP8_PRECISIONS)
        best["fp8_utilisation"] = best["precision_utilization"].where(fp8)
    error = error or prediction_error().for_hardware(hw)
    top = window["tokens_per_s_per_gpu"].iloc[0]
    best["tie"] = ["yes" if t >= top * (1 - error.step_time_relative_error) else "-"
                   for t in best["tokens_per_s_per_gpu"]]
    return best


def _profiled(rows: pd.DataFrame) -> list[str]:
    """Which rows ``search --profile job`` measured: "measured", the reason its job failed, or
    "-" (not profiled), so that a reader never takes a prediction for a measurement."""
    error = rows["measurement_error"].fillna("").astype(str)
    measured = pd.to_numeric(rows.get("measured_step_time_s", pd.Series(index=rows.index)), errors="coerce").notna()
    return [f"failed: {e}" if e else "measured" if m else "-" for e, m in zip(error, measured)]


def _cell(row: pd.Series, column: Column) -> str:
    value = row.get(column.key)
    if column.key == "recompute" and value == "full" and row.get("recompute_num_layers", 0):
        return f"full({int(row['recompute_num_layers'])})"
    return cell(value, column.fmt)


def _table(ranked: pd.DataFrame, candidates: int, hw: HardwareSpec | None = None,
           train: TimeToTrain | None = None, error: PredictionError | None = None
           ) -> tuple[tuple[Column, ...], list[list[str]]]:
    """The columns and cells of the grouped table, with the time to train when asked for."""
    rows = grouped(ranked, candidates, hw, error)
    if train is not None and not rows.empty:
        rows = rows.assign(**train.columns(rows["tokens_per_s_per_gpu"]))
    columns = _columns(rows if not rows.empty else ranked)
    return columns, [[_cell(row, c) for c in columns] for _, row in rows.iterrows()]


def ranked_rows(ranked: pd.DataFrame, candidates: int, hw: HardwareSpec | None = None) -> list[list[str]]:
    return _table(ranked, candidates, hw)[1]


def legend(hw: HardwareSpec | None, memory_fraction: float | None = None,
           error: PredictionError | None = None) -> list[str]:
    """What the columns mean in full: units, the MFU basis, the memory limit, the tie band's
    source and the knob codes (``--explain`` and ranked.md)."""
    error = error or prediction_error().for_hardware(hw)
    lines = ["One row per layout (TP/PP/CP/DP/EP): its best variant; var = the other candidates of that "
             "layout in this window, differs = the knobs they change; other = knobs without a column that the "
             "row sets away from their default.",
             "step s = predicted seconds per optimizer step; tok/s/GPU = trained tokens per second per GPU; "
             "TFLOP/s = model FLOPs per second per GPU as NeMo counts them (6 x parameters + attention, "
             "per token, recompute not counted).",
             f"tie = predicted throughput within {error.step_time_relative_error:.1%} of the best, the cost "
             f"model's cross-validated step-time error ({error.source}): the order among ties is not meaningful; "
             "measure them (search --profile job).",
             "meas. = measured by `search --profile job` (the job's step time, tok/s/GPU, peak memory, TFLOP/s); "
             "profiled = measured, failed: why, or - (a prediction only).",
             "TP ovl = TP communication overlapped with GEMMs (--tp-comm-overlap, TE Userbuffers); "
             "recompute full(n) = n layers of each pipeline chunk recomputed.",
             "days, GPU-h, cost (with --tokens) or tokens (with --train-days): the whole run at the predicted "
             "steady-state throughput (no restarts, evaluation or checkpoint stalls); GPU-h = days x 24 x GPUs.",
             "Codes in differs and other: " + "; ".join(f"{code} = {text}" for code, text in KNOB_CODES.values())
             + "; noX = X off."]
    if hw is not None:
        fp8 = f", FP8 util against the FP8 dense peak ({hw.fp8_tflops:,.0f} TFLOP/s)" if hw.fp8_tflops else ""
        limit = (f" against a limit of {memory_fraction * hw.memory_gib:.1f} GiB ({memory_fraction:.0%} of "
                 f"{hw.memory_gib:g} GiB)") if memory_fraction else ""
        lines.insert(2, f"MFU = model TFLOP/s over the BF16 dense peak ({hw.bf16_tflops:,.0f} TFLOP/s on "
                        f"{hw.name}), also for FP8 runs, as NeMo and Megatron-LM report it{fp8}; mem GiB = "
                        f"predicted peak of the fullest GPU{limit}.")
    return lines


def short_legend(hw: HardwareSpec | None, memory_fraction: float | None = None,
                 error: PredictionError | None = None) -> list[str]:
    """The terminal's legend: at most three lines of under 80 characters each."""
    error = error or prediction_error().for_hardware(hw)
    lines = [f"tie: within {error.step_time_relative_error:.1%} of the best tok/s/GPU, the model's error: "
             "ties are unordered"]
    if hw is not None:
        limit = f", limit {memory_fraction * hw.memory_gib:.1f}" if memory_fraction else ""
        lines.append(f"MFU: of the BF16 peak, {hw.bf16_tflops:,.0f} TFLOP/s; mem GiB: fullest GPU{limit}")
    lines.append("one row per layout, its best variant; --explain: every column and code")
    return lines


def print_ranked(ranked: pd.DataFrame, title: str | Callable[[int], str], top: int = 10, console: Console | None = None,
                 hw: HardwareSpec | None = None, memory_fraction: float | None = None, wide: bool = False,
                 explain: bool = False, where: str = "", train: TimeToTrain | None = None,
                 model: ModelSpec | None = None) -> None:
    """The ranked table as wide as the terminal allows (all columns with ``wide``), the short
    legend, or the full one with ``explain``; with ``train``, the time to train of each layout
    and a line on the winner's; ``model``: whose kind's tie band (``PredictionError.for_model``);
    ``title``: the title, or the title of the number of layouts (rows) shown."""
    console = console or Console()
    error = prediction_error().for_model(hw, model)
    text = legend(hw, memory_fraction, error) if explain else short_legend(hw, memory_fraction, error)
    if train is not None and ranked["fits"].any():  # broken between its phrases: "$5.35M at" / "$2.5/GPU-h" read as two
        summary = train.summary(float(ranked.loc[ranked["fits"], "tokens_per_s_per_gpu"].iloc[0]))
        text = [*phrase_lines(summary, output_width(console)), *text]
    columns, rows = _table(ranked, top, hw, train, error)
    print_table(console, title(len(rows)) if callable(title) else title, columns, rows, text, wide, where)


def markdown_table(ranked: pd.DataFrame, top: int = 50, hw: HardwareSpec | None = None,
                   memory_fraction: float | None = None, feasible: int | None = None,
                   train: TimeToTrain | None = None, model: ModelSpec | None = None) -> str:
    """ranked.md's table; ``feasible``: the run's count when ``ranked`` keeps only the best;
    ``train``: the time to train beside each layout; ``model``: whose kind's tie band
    (``PredictionError.for_model``)."""
    error = prediction_error().for_model(hw, model)
    columns, rows = _table(ranked, top, hw, train, error)
    headers = [c.header for c in columns]
    feasible = feasible or int(ranked["fits"].sum())
    lines = [f"Best {min(top, feasible)} of {feasible:,} feasible candidates in {len(rows)} layouts.", "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n\n" + "".join(f"- {line}\n" for line in legend(hw, memory_fraction, error))


def _rules(ranked: pd.DataFrame) -> pd.Series:
    """The rule that rejected each rejected row: its reason, memory rejections counted together."""
    reasons = ranked.loc[~ranked["fits"], "reason"].astype(str)
    return reasons.where(~reasons.str.startswith("out of memory"), "out of memory")


def rejection_summary(ranked: pd.DataFrame, rejections: pd.DataFrame | None = None) -> pd.Series:
    """How many candidates each rule rejected, memory rejections counted together; ``rejections``:
    the per-rule counts of a summarised run folder (rejection_examples), added in."""
    counts = _rules(ranked).value_counts()
    if rejections is not None and not rejections.empty:
        counts = counts.add(rejections.set_index("rule")["count"].astype(int), fill_value=0).astype(int)
    return counts.sort_values(ascending=False, kind="stable")


def rejection_examples(ranked: pd.DataFrame) -> pd.DataFrame:
    """One row per rejecting rule, most frequent first: the rule, its count and its first candidate
    (a summarised run folder's rejections.csv)."""
    rules = _rules(ranked)
    counts = rules.value_counts()
    # Each rule's first row, found on the rules alone (not on every column of the rejected rows).
    first = ranked.loc[rules.groupby(rules.to_numpy(), sort=False).head(1).index]
    first = first.assign(rule=rules.loc[first.index].to_numpy())
    first.insert(0, "count", first["rule"].map(counts).to_numpy())
    first = first[["rule", *[c for c in first.columns if c != "rule"]]]
    return first.sort_values("count", ascending=False, kind="stable").reset_index(drop=True)
