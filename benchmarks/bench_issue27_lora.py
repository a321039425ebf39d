"""Issue 27's figure: does `search --model llama2-70b --gpus 8 --finetune lora --seq-length 8192`
offer the layouts MLPerf's Llama-2-70B LoRA submissions used on 8 GPUs as candidates predicted to
fit, and where does it rank them? Per LoRA setting (Megatron-Bridge's defaults: rank 32 on all four
Linears, unpacked; Megatron-Bridge's Llama 3 70B LoRA recipe: rank 16 on all four, packed; MLPerf's: rank 16 on QKV and projection, packed, the frozen FP8 base transposed in every
micro-batch as MLPerf's TransformerEngine 1.x runs did, and FP8 dot-product attention offered to
every FP8 candidate, as the submitted configs set FP8_DPA; MLPerf's on TE 2.x: the same with the FP8
transposes kept, as Megatron-Bridge's TE 2.x keeps them; MLPerf's on v4.0's TE 1.6: MLPerf's, with
no FP8 attention under context parallelism, which TE runs only from 1.10, and TE 1.6's activation
offloading one layer at a time), GPU (h100-sxm, h200) and global batch (the
preset's 128, and MLPerf's 8): each submitted 8-GPU layout (TP, CP; PP 1, MBS 1, FP8; with its own
FP8 attention where the search offers it) at its best variant (the
unpublished knobs searched), its rank among the feasible layouts and the share above it, and its
rank among the distinct layouts (the ranked table's rows: one per TP/PP/CP/DP/EP, its best variant).

On H100 at MLPerf's global batch, per setting, what ranks above the submitted TP4: the layouts by
(TP, CP, PP), virtual pipeline, recompute, LoRA's input re-gather, offloading and mbs > 1 apart,
their count and fastest step (the fastest kinds).

Then the MLPerf LoRA rows' mean and max |error| with the fixed step cost (``step_overhead_s``) set
to each of a few values, the rest of the shipped constants kept; and the mean packed SQuAD document
length NeMo 24.07's fine-tuning table implies (nemo_finetune_runs.csv's document_tokens).

    PYTHONPATH=. python benchmarks/bench_issue27_lora.py
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from autoparallel import io, resources
from autoparallel.costmodel import flops
from autoparallel.cli.finetune import with_finetune
from autoparallel.cli.common import with_seq_length
from autoparallel.search.run import search
from autoparallel.space import FP8_ATTENTION_RECIPES, load_space
from autoparallel.measured_runs import load_runs, predict_row, read_runs_table
from autoparallel.report.tables import LAYOUT_KEYS


def submitted_layouts(gpu: str) -> set[tuple[int, int, bool]]:
    """(tp, cp, FP8 attention) of the 8-GPU submissions on ``gpu`` (as mlperf_corrections.yaml sets them
    right: every H100 TP4 and H200 TP2 config sets FP8_DPA=1, every H200 TP1 CP2 one FP8_DPA=0)."""
    rows = read_runs_table(resources.data_file("mlperf_training_lora_hopper.csv"))
    rows = rows[(rows.gpu == gpu) & (rows.num_gpus == 8)]
    return {(int(r.tp), int(r.cp), bool(r.fp8_attention)) for r in rows.itertuples()}


SETTINGS = {"defaults": dict(lora_rank=None, lora_targets=None, packed_sequence=None),
            # Megatron-Bridge's Llama 3 70B LoRA recipe (067f987df src/megatron/bridge/recipes/llama/h100/
            # llama3.py ``llama3_70b_peft_8gpu_h100_bf16_config``: dim 16, LoRA's four default targets;
            # recipes/common.py ``_peft_common``: offline packing on): the nearest Bridge recipe to
            # llama2-70b (Bridge has no Llama 2 70B one).
            "Bridge's 70B recipe": dict(lora_rank=16, lora_targets=None, packed_sequence=True),
            "MLPerf's": dict(lora_rank=16, lora_targets=("linear_qkv", "linear_proj"), packed_sequence=True,
                             fp8_transpose_per_microbatch=True),
            "MLPerf's on TE 2.x": dict(lora_rank=16, lora_targets=("linear_qkv", "linear_proj"), packed_sequence=True),
            "MLPerf's on v4.0's TE 1.6": dict(lora_rank=16, lora_targets=("linear_qkv", "linear_proj"),
                                             packed_sequence=True, fp8_transpose_per_microbatch=True)}
# The TransformerEngine each setting runs, where it matters: v4.0's images pin TE 1.6, which runs no
# FP8 attention under context parallelism and offloads one layer at a time
# (SearchSpace.transformer_engine_version, stages.offload_time); "MLPerf's"
# (TE 1.x) stands for v4.1's 24.09 images, whose TE was not pinned (TE_REVISION=SKIP: the PyTorch
# 24.09 container's), taken to be 1.10 or later as TE's release v1.10 (2024-09-11) precedes it.
# NeMo Framework 24.09's component list names TE 1.10 (RESULTS, session 38 lead), so "MLPerf's" pins
# 1.10: FP8 attention under CP and windowed offloading both open at 1.10, but 1.10 runs no a2a CP
# (``cp_kinds``: from 1.11) and TE 1.x has only the delayed-scaling recipe, so the
# current-scaling and blockwise candidates (TE >= 2.2 / 2.3, ``candidates.RECIPE_FIRST_RELEASE``) are
# not offered.
SPACE_BY_SETTING = {"MLPerf's": dict(transformer_engine_version="1.10"),
                    "MLPerf's on v4.0's TE 1.6": dict(transformer_engine_version="1.6")}
# What MLPerf's runs set that these settings leave out: dropout 0.1 and the all-to-all on the adapters.
MLPERF_UNFLAGGED = dict(lora_dropout=0.1, lora_a2a=True)
# And the search knob their configs set (config_common.sh's FP8_DPA=1, NVTE_FP8_DPA_BWD=1): FP8
# dot-product attention, offered beside BF16 attention to every FP8 candidate.
MLPERF_SPACE = dict(fp8_attention=(False, True))


def main() -> None:
    for name, setting in SETTINGS.items():
        flags = argparse.Namespace(finetune="lora", document_tokens=None, lora_dropout=None, lora_a2a=None,
                                   **{"fp8_transpose_per_microbatch": None, **setting})
        print(f"--- LoRA with {name} settings")
        model = with_finetune(with_seq_length(io.load_model("llama2-70b"), 8192), flags)
        space = load_space("training")
        if name.startswith("MLPerf's"):
            model = dataclasses.replace(model, finetune=dataclasses.replace(model.finetune, **MLPERF_UNFLAGGED))
            space = dataclasses.replace(space, **MLPERF_SPACE, **SPACE_BY_SETTING.get(name, {}))
        rank_layouts(model, space)
    floor_ablation()
    squad_document_length()


def squad_document_length() -> None:
    """NeMo 24.07's fine-tuning table (nemo_finetune_runs.csv) publishes model TFLOP/s beside tokens/s:
    their ratio is the FLOPs it counted per token, and what exceeds the Linears and the output layer
    is the packed documents' causal attention, which grows with their length. Each row's implied mean
    document length, +- what the table's rounding (0.5 TFLOP/s) leaves, and the inverse-variance mean
    that the CSV's document_tokens rounds."""
    frame = read_runs_table(resources.data_file("nemo_finetune_runs.csv")).set_index("id")
    lengths, weights = [], []
    print("--- packed SQuAD document length implied by NeMo 24.07's model TFLOP/s")
    for r in load_runs([resources.data_file("nemo_finetune_runs.csv")]):
        row = frame.loc[r.id]
        per_token = row.measured_model_tflops_per_gpu * 1e12 / row.measured_tokens_per_s_per_gpu
        s = r.model.seq_length
        at = lambda d: flops.model_flops_per_token(dataclasses.replace(  # noqa: E731
            r.model, finetune=dataclasses.replace(r.model.finetune, packed_sequence=True, document_tokens=d)))
        slope = (at(s) - at(1)) / (s - 1)
        length, spread = 1 + (per_token - at(1)) / slope, 0.5e12 / row.measured_tokens_per_s_per_gpu / slope
        lengths.append(length)
        weights.append(1 / spread ** 2)
        print(f"  {r.id}: {per_token / 1e9:.2f} GFLOP/token, {length:.0f} +- {spread:.0f} tokens")
    print(f"  inverse-variance mean: {np.average(lengths, weights=weights):.0f} tokens")


def floor_ablation() -> None:
    rows = load_runs([resources.data_file("mlperf_training_lora_hopper.csv")])
    print(f"--- {len(rows)} MLPerf LoRA rows by step_overhead_s (shipped: {rows[0].hardware.efficiency.step_overhead_s})")
    for floor in (0.0, 0.02, 0.04, 0.06, 0.1, 0.145):
        errors = np.abs([predict_row(r, dataclasses.replace(r.hardware.efficiency, step_overhead_s=floor))["error_pct"]
                         for r in rows])
        print(f"  {floor:.3f} s: mean |error| {errors.mean():.1f} %, max {errors.max():.1f} %")


def rank_layouts(model, space) -> None:
    """Where FP8 attention is offered (MLPerf's settings), each submitted layout is ranked at the
    setting its configs state, applied to every candidate it applies to (FP8_DPA=1: every FP8
    candidate with FP8 attention, BF16 ones as they are; FP8_DPA=0: none), then among the
    candidates with the knob searched both ways. A TE that runs no FP8 attention under CP
    (``transformer_engine_version`` before 1.10) runs FP8_DPA=1 at CP > 1 in BF16: those candidates keep their
    BF16 attention."""
    searched = True in space.fp8_attention
    for gpu in ("h100-sxm", "h200"):
        hw = io.load_hardware(gpu)
        for gbs in (128, 8):
            result = search(model, hw, 8, gbs, space)
            everything = result.feasible.reset_index(drop=True)
            print(f"{gpu}, gbs {gbs}: {len(everything):,} feasible candidates")
            for tp, cp, fp8a in sorted(submitted_layouts(gpu)):
                feasible = everything
                if searched:  # the configs' FP8_DPA, on every candidate whose recipe runs it
                    runs_it = everything.precision.isin(FP8_ATTENTION_RECIPES) & (
                        space.fp8_attention_with_cp | (everything.cp == 1))
                    feasible = everything[~runs_it | (everything.fp8_attention == fp8a)].reset_index(drop=True)
                match = feasible[(feasible.tp == tp) & (feasible.cp == cp) & (feasible.pp == 1) & (feasible.mbs == 1)
                                 & (feasible.precision == "fp8-delayed")]
                if match.empty:
                    print(f"  TP{tp} CP{cp}: NOT offered as fitting")
                    continue
                rank = int(match.index[0]) + 1
                if gpu == "h100-sxm" and gbs == 8:
                    above_the_submission(feasible.iloc[:rank - 1])
                attention = f" FP8_DPA={int(fp8a)}" if searched else ""
                print(f"  TP{tp} CP{cp} PP1 MBS1 fp8{attention}: rank {rank} of {len(feasible):,} "
                      f"(top {100 * rank / len(feasible):.2f} %), "
                      f"{match.iloc[0].step_time_s:.3f} s/step, {match.iloc[0].peak_memory_gib:.1f} GiB")
                if searched:
                    both = everything[(everything.tp == tp) & (everything.cp == cp) & (everything.pp == 1)
                                      & (everything.mbs == 1) & (everything.precision == "fp8-delayed")
                                      & (everything.fp8_attention == fp8a)]
                    at = int(both.index[0]) + 1
                    print(f"    with FP8 attention searched both ways: rank {at} of {len(everything):,} "
                          f"(top {100 * at / len(everything):.2f} %)")
                layouts = feasible.drop_duplicates(list(LAYOUT_KEYS)).reset_index(drop=True)
                at = int(layouts[(layouts.tp == tp) & (layouts.cp == cp) & (layouts.pp == 1)].index[0]) + 1
                print(f"    as the ranked table groups them (one row per {'/'.join(LAYOUT_KEYS)} layout): "
                      f"{at} of {len(layouts)} ({100 * at / len(layouts):.1f} %)")


ABOVE_KINDS_SHOWN = 12  # the fastest kinds above the submission printed, the rest counted


def above_the_submission(above) -> None:
    """The layouts ranked above the submitted one, by kind: (TP, CP, PP), virtual pipeline,
    recompute, offloaded, mbs > 1, LoRA's input re-gather; the fastest ``ABOVE_KINDS_SHOWN`` kinds."""
    def kind(r):
        what = f"TP{r.tp} CP{r.cp} PP{r.pp}" + (" VP" if r.vp > 1 else "") + (
            f" {r.recompute} recompute" if r.recompute != "none" else "")
        what += " regather" if getattr(r, "lora_input_regather", False) else ""
        if r.mbs > 1:
            return f"{what} mbs > 1"
        return f"{what} offloading {r.cpu_offloading_num_layers} layers" if r.cpu_offloading_num_layers else what
    if above.empty:
        return
    kinds = above.apply(kind, axis=1)
    groups = sorted(above.groupby(kinds), key=lambda g: g[1].step_time_s.min())
    for name, group in groups[:ABOVE_KINDS_SHOWN]:
        print(f"    above it: {name}: {len(group)} variants, fastest {group.step_time_s.min():.3f} s/step, "
              f"TP {group.tp_comm_s.min():.3f} s")
    if len(groups) > ABOVE_KINDS_SHOWN:
        rest = sum(len(g) for _, g in groups[ABOVE_KINDS_SHOWN:])
        print(f"    above it: {len(groups) - ABOVE_KINDS_SHOWN} more kinds, {rest} variants")


if __name__ == "__main__":
    main()
