"""Write autoparallel/data/training_runs_newer.csv: NVIDIA's published runs newer than the fit.

Every pre-training row that NVIDIA published for the NeMo containers after 25.11 (26.02 to 26.08)
and whose model autoparallel has a preset for, layout columns exactly as published; the
architecture columns as the 25.11 rows of training_runs_more.csv state them (Kimi-K2, which has
no 25.11 row, from its preset). These rows are validation-only: calibration never fits them, so
they are the runs the fit did not see. One more row: Megatron-LM's own DeepSeek-V3 GB200 guide
(970 model TFLOP/s/GPU), every knob from its reproduce guide's launch script.

The Nemotron 3 rows (hybrid Mamba-Transformer MoE: Nano, 3.5 Lightning, Super, Ultra) go to
autoparallel/data/training_runs_hybrid.csv instead, their architecture columns (the hybrid ones
too) as the model's preset states them: they are the held-out "hybrid-newer" group, priced only
once the cost model prices Mamba-2 and LatentMoE layers. Re-run after a new summary appears:

    python scripts/newer_runs.py [--git-dir /work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo]
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "autoparallel" / "data" / "training_runs_newer.csv"
HYBRID_OUT = ROOT / "autoparallel" / "data" / "training_runs_hybrid.csv"
MORE = ROOT / "autoparallel" / "data" / "training_runs_more.csv"
SUMMARIES = ("docs/performance-summary.md", "docs/performance-summary-archive.md")
FIRST_UNSEEN = (26, 2)  # releases after 25.11, the last one training_runs_more.csv holds
MODELS = {"DeepSeekV3": "deepseek-v3", "GPT OSS 120B": "gpt-oss-120b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
          "Qwen3_235B_a22B": "qwen3-235b-a22b", "Kimi_K2": "kimi-k2", "LLAMA3_70B": "llama3-70b",
          "LLAMA3.1_405B": "llama3.1-405b"}
# The hybrid Mamba-Transformer models (written to HYBRID_OUT, architecture from the preset).
HYBRID = {"Nemotron_3_Nano": "nemotron-3-nano", "Nemotron_3_5_Lightning": "nemotron-3.5-lightning",
          "Nemotron_3_Super": "nemotron-3-super", "Nemotron_3_Ultra": "nemotron-3-ultra"}
# Beyond ARCH: the hybrid layer pattern and Mamba-2 mixer, LatentMoE, routing groups, MTP, and the
# norm and position embedding model_from_row cannot infer from the activation (squared ReLU with RMSNorm).
HYBRID_ARCH = ("hybrid_layer_pattern", "mamba_num_heads", "mamba_head_dim", "mamba_state_dim", "mamba_num_groups",
               "mamba_conv_kernel", "moe_latent_size", "moe_router_num_groups", "moe_router_group_topk",
               "mtp_num_layers", "normalization", "position_embedding_type", "tie_embeddings")
# Nemotron 3 Ultra's recipe (Megatron-Bridge v0.6.0 51885cf1 perf_recipes/nemotronh/common.py
# _apply_nemotron_3_ultra_fsdp_hsdp) runs Megatron-FSDP sharded within a 64-GPU NVLink domain
# (_GB300_NVLINK_DOMAIN_GPUS; HSDP, 256 / 64 = 4 optimizer instances, on GB300 and GB200 alike); the 26.08
# table has no FSDP column, so the recipe's shard size is stated.
RECIPE_FSDP = {"nemotron-3-ultra": 64}
GPUS = {"DGX-GB300": "gb300", "DGX-GB200": "gb200", "DGX-B300": "b300", "DGX-B200": "b200", "DGX-H100": "h100-sxm"}
# Bridge's "FP8" is current scaling (scripts/performance/utils/precision.py: fp8_cs), as in 25.11.
PRECISIONS = {"BF16": "bf16", "FP8": "fp8-current", "MXFP8": "mxfp8", "NVFP4": "nvfp4"}
ARCH = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
        "activation", "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
        "moe_layer_freq", "kv_channels", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
        "v_head_dim")
# Bridge's DeepSeek-V3 recipe builds one MTP layer (recipes/deepseek/deepseek_v3.py: mtp_num_layers=1 at
# v0.3.0 21b02e0cf line 198 and v0.5.0 fcbb60311 line 122), and from 26.02 on the summaries count its
# FLOPs: Model TFLOP / tokens = 0.2600 TFLOP/token, Megatron-LM's num_floating_point_operations with
# --mtp-num-layers 1 (0.2500 without, the 25.11 tables' ratio).
MTP = {"deepseek-v3": 1}
# Bridge's Llama 3.1 405B recipe counts the embedding and the loss as pipeline layers (126 + 2 = 128 on
# PP16 VP8): recipes/llama/llama3.py llama31_405b_pretrain_config, v0.3.0 21b02e0cf lines 413-414,
# v0.5.0 fcbb60311 lines 1146-1147.
SPLIT = {"llama3.1-405b": dict(account_for_embedding_in_pipeline_split=1, account_for_loss_in_pipeline_split=1)}
KIMI_K2 = dict(num_layers=61, hidden_size=7168, num_attention_heads=64, num_query_groups=64, ffn_hidden_size=18432,
               vocab_size=163840, activation="swiglu", num_experts=384, moe_router_topk=8, moe_ffn_hidden_size=2048,
               moe_shared_expert_intermediate_size=2048, moe_layer_freq="([0]*1+[1]*60)", q_lora_rank=1536,
               kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
NOTES = {"kimi-k2": "Muon optimizer (the summary's note), priced as Adam; ",
         "gpt-oss-120b@26.06.01": "the summary flags a GPT-OSS regression in this container "
                                  "(cudnn-frontend issue 256); "}


# NVIDIA/Megatron-LM eb0783b6d3 docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md
# §3 (last row of the table: 970.01 TFLOPS/GPU) and, beside it at 8a2ac1fdc7, deepseek-v3-gb200-reproduce-guide.md
# (the launch script): no --mtp-num-layers; --cuda-graph-impl transformer_engine with --cuda-graph-modules attn
# moe_router moe_preprocess graphs parts of every layer (not the experts): not priced (the cost model's
# CUDA graphs are whole layers, refused for a dropless MoE layer), so the row states none.
GUIDE = "docs/discussions/deepseek-v3-gb200-optimization"
MEGATRON_GUIDE = dict(
    id="megatron-deepseek-v3-gb200-256gpu-mxfp8-tp1pp8cp1vp4ep32-mbs1-gbs2048", model="deepseek-v3", seq_length=4096,
    gpu="gb200", num_gpus=256, tp=1, pp=8, cp=1, vp=4, ep=32, etp=1, sp=1, recompute="selective", mbs=1, gbs=2048,
    precision="mxfp8", measured_model_tflops_per_gpu=970.01, fsdp="", release="",
    distributed_optimizer=1, overlap_grad_reduce=1, overlap_param_gather=1, fp8_param_gather=1,
    precision_aware_optimizer=1, grad_reduce_in_fp32=1, cuda_graph="none",
    pipeline_model_parallel_layout="Et|(tt|)*30L",
    moe_token_dispatch="dropless",
    source=f"NVIDIA/Megatron-LM@eb0783b6d3:{GUIDE}/deepseek-v3-gb200-optimization.md §3 (HybridEP, cuDNN 9.14 row); "
           f"flags: NVIDIA/Megatron-LM@8a2ac1fdc7:{GUIDE}/deepseek-v3-gb200-reproduce-guide.md",
    notes="Megatron-LM's model TFLOP/s/GPU (num_floating_point_operations; = 3883 tokens/s/GPU at 0.2498 TFLOP/token); "
          "MXFP8 with FP8 parameter gather, BF16 Adam moments, flex dispatcher with HybridEP (32 SMs), "
          "forced load balancing, layout Et|(tt|)*30L, recompute moe_act + the dense layers' MLP; its partial CUDA "
          "graphs (attn, moe_router, moe_preprocess) are not priced",
)


def release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def tables(text: str, wanted: str = "Pre-Training Performance"):
    """(release, model title, header cells, row cells) of every table of section ``wanted`` (the
    pre-training tables; "SFT Performance" and "LoRA Performance" for newer_finetune_runs.py)."""
    release = section = model = None
    header: list[str] = []
    for line in text.splitlines():
        if m := re.match(r"## (\S+) NeMo Container", line):
            release, section = m.group(1), None
        elif line.startswith("### "):
            section = line[4:].strip()
        elif m := re.match(r"#### Model: (.+)", line):
            model, header = m.group(1).strip(), []
        elif line.startswith("|") and release and section == wanted and model:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not header:
                header = cells
            elif not set(cells[0]) <= set("-"):
                yield release, model, header, cells


def number(cell: str) -> float:
    return float(re.sub(r"\[\^[^\]]*\]", "", cell).replace(",", ""))


def summaries(git_dir: str) -> tuple[str, list[tuple[str, str]]]:
    """The Megatron-Bridge mirror's HEAD (short hash) and each performance summary's (path, text)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True,
                              check=True).stdout
    return git("rev-parse", "--short=10", "HEAD").strip(), [(p, git("show", f"HEAD:{p}")) for p in SUMMARIES]


def layout_of(cell: dict) -> dict:
    """A table row's tp, pp, cp, vp, ep ("n/a", "0" or empty: 1)."""
    one = lambda k: 1 if cell.get(k, "n/a") in ("n/a", "0", "") else int(number(cell[k]))  # noqa: E731
    return {k.lower(): one(k) for k in ("TP", "PP", "CP", "VP", "EP")}


def preset_arch(name: str) -> dict:
    """A hybrid model's architecture columns (ARCH and HYBRID_ARCH) as its preset states them."""
    from autoparallel import io
    model = io.load_model(name)
    mla = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
    out = {k: getattr(model, k) for k in (*ARCH, *HYBRID_ARCH)
           if k != "moe_layer_freq" and (model.multi_latent_attention or k not in mla)}
    out["tie_embeddings"] = int(model.tie_embeddings)
    return out


def rows(git_dir: str) -> tuple[list[dict], list[dict], set[str]]:
    """(the newer rows of preset models, the hybrid rows, the tables' models without a preset)."""
    commit, texts = summaries(git_dir)
    more = pd.read_csv(MORE)
    out, hybrid, skipped = [], [], set()
    for path, text in texts:
        for release, title, header, cells in tables(text):
            if release_key(release)[:2] < FIRST_UNSEEN:
                continue
            if title not in MODELS and title not in HYBRID:
                skipped.add(title)
                continue
            cell = dict(zip(header, cells))
            model = MODELS.get(title) or HYBRID[title]
            if title in HYBRID:
                arch = preset_arch(model)
            else:
                known = more[more.model == model]
                arch = KIMI_K2 if model == "kimi-k2" else known.iloc[0][list(ARCH)].to_dict()
            layout = layout_of(cell)
            gpu, gpus, prec = GPUS[cell["System"]], int(cell["#-GPUs"]), PRECISIONS[cell["Precision"]]
            mbs, gbs, seq = int(cell["MBS"]), int(cell["GBS"]), int(cell["Sequence Length"])
            fsdp = int(cell.get("FSDP", "0") or 0) or RECIPE_FSDP.get(model, 0)
            rid = (f"bridge-{release}-{model}-{gpu}-{gpus}gpu-{prec}-tp{layout['tp']}pp{layout['pp']}cp{layout['cp']}"
                   f"vp{layout['vp']}ep{layout['ep']}-mbs{mbs}-gbs{gbs}" + (f"-fsdp{fsdp}" if fsdp else ""))
            note = NOTES.get(model, "") + NOTES.get(f"{model}@{release}", "")
            if model in RECIPE_FSDP and "FSDP" not in cell:
                note += f"FSDP {fsdp} from the recipe (HSDP within a 64-GPU NVLink domain; the table has no FSDP column); "
            (hybrid if title in HYBRID else out).append({
                "id": rid, "model": model, **arch, "seq_length": seq, "gpu": gpu, "num_gpus": gpus, **layout,
                "mbs": mbs, "gbs": gbs, "precision": prec,
                "measured_tokens_per_s_per_gpu": number(cell["Tokens / sec / GPU"]),
                "measured_model_tflops_per_gpu": number(cell["Model TFLOP / sec / GPU"]),
                "source": f"NVIDIA-NeMo/Megatron-Bridge@{commit}:{path} "
                          f"[{release} NeMo Container / Pre-Training Performance]",
                "notes": note + ("one published figure; recompute, dispatcher and overlap as the recipe ran them "
                                 "(recipe_settings.yaml)" if title in HYBRID else
                                 "one published figure; recompute, overlap and dispatcher not stated (searched)"),
                "fsdp": fsdp or "", "release": release, "mtp_num_layers": MTP.get(model, ""), **SPLIT.get(model, {}),
                **({k: arch[k] for k in HYBRID_ARCH} if title in HYBRID else {}),
            })
    deepseek = more[more.model == "deepseek-v3"].iloc[0][list(ARCH)].to_dict()
    return out + [{**deepseek, **MEGATRON_GUIDE}], hybrid, skipped


def whole_numbers(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns of whole numbers print as such ("256", not "256.0"), the measurements as published."""
    for c in frame:
        values = pd.to_numeric(frame[c], errors="coerce")
        if values.notna().any() and values.notna().sum() == frame[c].replace("", None).notna().sum() \
                and (values.dropna() % 1 == 0).all() and not c.startswith("measured_"):
            frame[c] = values.astype("Int64")
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", default="/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
    found, hybrid, skipped = rows(parser.parse_args().git_dir)
    columns = list(pd.read_csv(MORE, nrows=0).columns) + [
        "mtp_num_layers", "etp", "distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
        "fp8_param_gather", "precision_aware_optimizer", "grad_reduce_in_fp32", "cuda_graph",
        "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split"]
    for rows_, path, cols in ((found, OUT, columns),
                              (hybrid, HYBRID_OUT, columns + [c for c in HYBRID_ARCH if c not in columns])):
        frame = whole_numbers(pd.DataFrame(rows_).reindex(columns=cols))
        assert frame["id"].is_unique, frame["id"][frame["id"].duplicated()].tolist()
        frame.to_csv(path, index=False)
        print(f"{len(frame)} rows -> {path.relative_to(ROOT)}")
    print(f"skipped (no preset): {', '.join(sorted(skipped))}")


if __name__ == "__main__":
    main()
