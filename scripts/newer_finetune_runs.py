"""Write autoparallel/data/finetune_runs_newer.csv: NVIDIA's published fine-tuning runs newer than the fit.

Every row of the "SFT Performance" and "LoRA Performance" tables of the Megatron-Bridge performance
summaries that newer_runs.py reads (releases after 25.11), as validation-only rows with the
fine-tuning columns of nemo_finetune_runs.csv. No fit has fine-tuning rows, so these are never fitted
(``validate`` reports them as kinds ``sft-newer`` and ``lora-newer``). The layout is the table's; every
other setting is read from the performance scripts and recipes of the Megatron-Bridge release the
container shipped (``RECIPES``), each cited in the row's notes; what no source states is said so.
Re-run after a new summary appears:

    python scripts/newer_finetune_runs.py [--git-dir /work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo]
"""

from __future__ import annotations

import argparse

import pandas as pd
from newer_runs import ARCH, GPUS, MODELS, MORE, PRECISIONS, ROOT, layout_of, number, summaries, tables, whole_numbers

OUT = ROOT / "autoparallel" / "data" / "finetune_runs_newer.csv"
FINETUNE = ROOT / "autoparallel" / "data" / "nemo_finetune_runs.csv"
SECTIONS = {"SFT Performance": "sft", "LoRA Performance": "lora"}
# The Megatron-Bridge release whose scripts/performance built each container's runs (the summary's
# 26.06 section first appears in v0.5.0's docs/performance-summary.md). A release not listed is
# skipped: its settings are not read.
RECIPES = {"26.06": "fcbb603110"}
PERF = "scripts/performance/configs/llama"
# Bridge's precision names in its workload config names (scripts/performance/utils/precision.py).
CONFIG_PRECISION = {"BF16": "BF16", "FP8": "FP8_CS", "MXFP8": "FP8_MX"}
# Workload configs (llama3_workload_base_configs.py at the release) that set TransformerEngine CUDA
# graphs of the MLP only (cuda_graph_impl "transformer_engine", cuda_graph_scope "mlp"): not priced, the
# cost model's graphs being whole layers.
MLP_GRAPHS = {"LLAMA3_70B_SFT_CONFIG_GB300_BF16_V1", "LLAMA3_70B_SFT_CONFIG_GB300_FP8_CS_V1",
              "LLAMA3_70B_SFT_CONFIG_GB300_FP8_MX_V1", "LLAMA3_70B_SFT_CONFIG_GB200_BF16_V1",
              "LLAMA3_70B_SFT_CONFIG_GB200_FP8_CS_V1", "LLAMA3_70B_SFT_CONFIG_GB200_FP8_MX_V1",
              "LLAMA3_70B_SFT_CONFIG_H100_FP8_CS_V1",
              "LLAMA3_70B_LORA_CONFIG_GB300_BF16_V1", "LLAMA3_70B_LORA_CONFIG_GB300_FP8_CS_V1",
              "LLAMA3_70B_LORA_CONFIG_GB300_FP8_MX_V1", "LLAMA3_70B_LORA_CONFIG_GB200_BF16_V1",
              "LLAMA3_70B_LORA_CONFIG_GB200_FP8_CS_V1", "LLAMA3_70B_LORA_CONFIG_GB200_FP8_MX_V1"}
# The one workload config of these tables' models that recomputes (full, block method, 1 layer a chunk).
RECOMPUTE_LAYERS = {"LLAMA3_70B_LORA_CONFIG_H100_BF16_V1": 1}
# SQuAD v1.1 packed to the sequence length: the mean document length is published nowhere. 200 tokens
# is what NeMo 24.07's table of the same packed SQuAD implies (nemo_finetune_runs.csv, Llama 2's
# tokenizer; Llama 3's is denser). At 4,096 tokens it moves a prediction by 0.1-0.3 % per 100 tokens;
# unpacked data (the launcher's default --data mock) by 6-8 % (python benchmarks/bench_newer_finetune.py).
SQUAD_DOCUMENT_TOKENS = 200

COMMON = (
    "Megatron-Bridge {c}:{perf}/llama3_llm_finetune.py llama3_70b_{task}_config_{gpu} (seq_length {seq}; "
    "set_llama3_common_peft_configs: distributed optimizer, grad_reduce_in_fp32 False; CommOverlapConfig("
    "tp_comm_overlap=TP>1): sequence parallel with TP>1 (WorkloadBaseConfig.sequence_parallel), and with the "
    "distributed optimizer overlap_grad_reduce / overlap_param_gather on where DP>1, "
    "src/megatron/bridge/training/comm_overlap.py _get_optimizer_overlap_cfgs) over {recipe} "
    "(src/megatron/bridge/recipes/llama/llama3.py: no recompute, no offload, {fusion}); workload config "
    "{config} ({perf}/llama3_workload_base_configs.py): {graphs}; {precision}; ")
LORA = ("LoRA dim 16 (alpha 32) from llama3_70b_peft_config, target_modules ['linear_qkv'] (the performance "
        "script's override), dropout 0.0 position pre and a2a_experimental False (recipes/common.py _peft_common); ")
DATA = ("dataset not stated by the summary: packed SQuAD assumed ({why}); mean packed document length not "
        "published: {d} tokens, as nemo_finetune_runs.csv's packed SQuAD rows")
WHY = {"lora": "its model TFLOP/s per token, 0.279, is Bridge's LoRA count, which flop_utils.py applies only to "
               "packed SQuAD on Llama 3 70B; the generic count is 0.433",
       "sft": "as the LoRA rows of the same release; the recipe's default, recipes/common.py _sft_common, but the "
              "performance launcher's default --data mock would run unpacked synthetic sequences, and the SFT "
              "TFLOP/s per token, 0.432, is Bridge's generic count, which does not tell them apart"}


def precision_note(prec: str) -> str:
    if prec == "BF16":
        return "BF16"
    scaling = ("FP8 current scaling (utils/precision.py fp8_cs: first_last_layers_bf16 False)" if prec == "FP8"
               else "MXFP8 (bf16_with_mxfp8_mixed)")
    return f"{scaling}, fp8_param_gather True (src/megatron/bridge/training/mixed_precision.py)"


def rows(git_dir: str) -> tuple[list[dict], set[str]]:
    commit, texts = summaries(git_dir)
    more = pd.read_csv(MORE)
    out, skipped = [], set()
    for path, text in texts:
        for section, task in SECTIONS.items():
            for release, title, header, cells in tables(text, section):
                if release not in RECIPES or title not in MODELS:
                    skipped.add(f"{release} {title}")
                    continue
                cell = dict(zip(header, cells))
                model = MODELS[title]
                layout = layout_of(cell)
                gpu, gpus, prec = GPUS[cell["System"]], int(cell["#-GPUs"]), cell["Precision"]
                mbs, gbs, seq = int(cell["MBS"]), int(cell["GBS"]), int(cell["Sequence Length"])
                dp = gpus // (layout["tp"] * layout["pp"] * layout["cp"])
                config = (f"{model.replace('-', '_').upper()}_{task.upper()}_CONFIG_{gpu.split('-')[0].upper()}_"
                          f"{CONFIG_PRECISION[prec]}_V1")
                layers = RECOMPUTE_LAYERS.get(config)
                graphs = ("TransformerEngine CUDA graphs of the MLP only (cuda_graph_scope mlp), not priced: "
                          "cuda_graph none" if config in MLP_GRAPHS else "no CUDA graphs")
                fusion = ("cross_entropy_loss_fusion True; defer_embedding_wgrad_compute, wgrad_deferral_limit 22 "
                          "(llama3_llm_finetune.py), not priced" if task == "sft"
                          else "cross_entropy_loss_fusion False")
                recipe = "llama3_70b_sft_config" if task == "sft" else "llama3_70b_peft_config"
                note = COMMON.format(c=RECIPES[release], perf=PERF, task=task, gpu=gpu.split("-")[0], seq=seq,
                                     recipe=recipe, fusion=fusion, config=config, graphs=graphs,
                                     precision=precision_note(prec))
                if layers:
                    note += f"recompute_num_layers {layers} (full, block); "
                if dp > 1 and layout["pp"] > 1 and layout["vp"] > 1 and prec in ("BF16", "FP8"):
                    note += ("overlap_param_gather_with_optimizer_step True (utils/overrides.py set_post_overrides: "
                             "DP, PP and VP > 1, not MXFP8), not priced; ")
                note += (LORA if task == "lora" else "SFT: every weight trains; ")
                note += DATA.format(why=WHY[task], d=SQUAD_DOCUMENT_TOKENS)
                rid = (f"bridge-{release}-{model}-{task}-{gpu}-{gpus}gpu-{PRECISIONS[prec]}-tp{layout['tp']}"
                       f"pp{layout['pp']}cp{layout['cp']}vp{layout['vp']}ep{layout['ep']}-mbs{mbs}-gbs{gbs}")
                out.append({
                    "id": rid, "model": model, **more[more.model == model].iloc[0][list(ARCH)].to_dict(),
                    "seq_length": seq, "gpu": gpu, "num_gpus": gpus, **layout, "sp": int(layout["tp"] > 1),
                    "recompute": "full" if layers else "none", "recompute_num_layers": layers or "",
                    "cpu_offloading_num_layers": 0, "mbs": mbs, "gbs": gbs, "precision": PRECISIONS[prec],
                    "tp_comm_overlap": int(layout["tp"] > 1), "fp8_param_gather": int(prec != "BF16"),
                    "distributed_optimizer": 1, "grad_reduce_in_fp32": 0, "overlap_grad_reduce": int(dp > 1),
                    "overlap_param_gather": int(dp > 1), "cuda_graph": "none",
                    "finetune": "full" if task == "sft" else "lora", "lora_rank": 16 if task == "lora" else "",
                    "lora_targets": "linear_qkv" if task == "lora" else "", "packed_sequence": 1,
                    "document_tokens": SQUAD_DOCUMENT_TOKENS, "lora_dropout": 0.0 if task == "lora" else "",
                    "lora_a2a": 0 if task == "lora" else "",
                    "measured_tokens_per_s_per_gpu": number(cell["Tokens / sec / GPU"]),
                    "measured_model_tflops_per_gpu": number(cell["Model TFLOP / sec / GPU"]),
                    "source": f"NVIDIA-NeMo/Megatron-Bridge@{commit}:{path} [{release} NeMo Container / {section}]",
                    "notes": note, "release": release,
                })
    return out, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default="/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
    found, skipped = rows(parser.parse_args().git_dir)
    columns = list(pd.read_csv(FINETUNE, nrows=0).columns)
    columns = columns[:columns.index("measured_tokens_per_s_per_gpu")] + [
        "recompute_num_layers", "cpu_offloading_num_layers", "grad_reduce_in_fp32", "overlap_param_gather",
        "cuda_graph", "lora_dropout", "lora_a2a", "release"] + columns[columns.index("measured_tokens_per_s_per_gpu"):]
    frame = whole_numbers(pd.DataFrame(found).reindex(columns=columns))
    assert frame["id"].is_unique, frame["id"][frame["id"].duplicated()].tolist()
    frame.to_csv(OUT, index=False)
    print(f"{len(frame)} rows -> {OUT.relative_to(ROOT)}; skipped (no recipe read or no preset): "
          f"{', '.join(sorted(skipped)) or 'none'}")


if __name__ == "__main__":
    main()
