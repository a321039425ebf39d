"""GLM-5's DeepSeek Sparse Attention as priced (session 50 s50h4): Megatron-Bridge's GLM-5 recipe layouts
(search_spaces/recipe_layouts.yaml) at their pins, the 128k SFT ones also as full SFT on packed sequences of one
document (how the recipes run them: packed THD), then GLM-5 against DeepSeek-V3 on the same GPUs and batch (each
model's best fitting BF16 layout of the default space, CP pinned). Markdown tables of predicted tokens/s/GPU.

    PYTHONPATH=$PWD python benchmarks/bench_glm5_dsa.py
"""

from __future__ import annotations

import dataclasses

from autoparallel import io
from autoparallel.search.grid import evaluate
from autoparallel.space import generate, load_space
from autoparallel.specs.finetune import Finetune

STATED = ("tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "precision", "fsdp")
# (GPU, GPUs, sequence, global batch, CP) of the comparison with DeepSeek-V3.
COMPARED = (("h100-sxm", 256, 4096, 1024, 1), ("gb200", 256, 4096, 1024, 1),
            ("h100-sxm", 512, 131072, 512, 32), ("gb200", 512, 131072, 512, 32))


def best(model, gpu: str, gpus: int, gbs: int, pins: dict):
    """The best fitting candidate at ``pins`` (a pandas row), or None."""
    hw, space = io.load_hardware(gpu), load_space()
    candidates = generate(model, hw, gpus, gbs, space.pinned(**pins))
    valid = candidates[candidates.reason == ""]
    if valid.empty:
        return None
    ranked = evaluate(model, hw, valid, space.memory_fraction)
    fitting = ranked[ranked.fits]
    return None if fitting.empty else fitting.iloc[0]


def recipe_rows():
    print("| recipe layout | as | tokens/s/GPU | MFU | step s | compute s | recompute s | cp_comm s | ep_comm s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    seen = set()
    for entry in io.read_yaml(io.SEARCH_SPACES / "recipe_layouts.yaml")["glm-5"]:
        key = tuple(sorted(entry.items()))
        if key in seen:  # GLM-5.1's and 5.2's recipes share their layouts
            continue
        seen.add(key)
        base = io.load_model("glm-5")
        variants = [("pre-training", base)]
        if "seq_length" in entry:
            base = dataclasses.replace(base, seq_length=entry["seq_length"])
            variants = [("unpacked", base),
                        ("packed SFT", dataclasses.replace(base, finetune=Finetune(packed_sequence=True)))]
        pins = {k: v for k, v in entry.items() if k in STATED and k != "gbs"}
        for label, model in variants:
            row = best(model, entry["gpu"], entry["gpus"], int(entry["gbs"]), pins)
            name = (f"{entry['gpu']} {entry['gpus']}, {model.seq_length // 1024}k, TP{entry['tp']} PP{entry['pp']} "
                    f"VP{entry['vp']} CP{entry['cp']} EP{entry['ep']}")
            print(f"| {name} | {label} | {row.tokens_per_s_per_gpu:,.1f} | {100 * row.mfu:.1f} % | {row.step_time_s:.1f} "
                  f"| {row.compute_s:.1f} | {row.recompute_s:.1f} | {row.cp_comm_s:.1f} | {row.ep_comm_s:.1f} |")


def comparison_rows():
    print("\n| GPUs, sequence, gbs, CP | GLM-5 | DeepSeek-V3 | DSv3 / GLM-5 |")
    print("|---|---|---|---:|")
    for gpu, gpus, seq, gbs, cp in COMPARED:
        rows = [best(dataclasses.replace(io.load_model(name), seq_length=seq), gpu, gpus, gbs,
                     {"precision": "bf16", "cp": cp}) for name in ("glm-5", "deepseek-v3")]
        cells = [f"{r.tokens_per_s_per_gpu:,.1f} (MFU {100 * r.mfu:.1f} %, TP{r.tp} PP{r.pp} EP{r.ep} mbs {r.mbs}, "
                 f"{r.recompute})" for r in rows]
        ratio = rows[1].tokens_per_s_per_gpu / rows[0].tokens_per_s_per_gpu
        print(f"| {gpus} {gpu}, {seq // 1024}k, {gbs}, {cp} | {cells[0]} | {cells[1]} | {ratio:.2f} |")


if __name__ == "__main__":
    recipe_rows()
    comparison_rows()
