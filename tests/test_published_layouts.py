"""Every published layout is a candidate of the default search space and predicted to fit.

The rows are the runs of both published files, dense and MoE, (what the source states pinned, what it leaves
open searched), the entries of search_spaces/published_layouts.yaml, and those of recipe_layouts.yaml (the layouts
of Megatron-Bridge's VR200 recipes, which no published run measures yet). The 2021-2022 A100 rows
trained in FP16, which the default space leaves out: their layout is checked in BF16 (the same
bytes and tensor-core rate).
"""

import dataclasses

import pytest

from autoparallel import io, measured_runs
from autoparallel.search.grid import evaluate
from autoparallel.space import generate, load_space

STATED = ("tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "precision", "fsdp")


def _published_rows():
    frame = measured_runs.read_runs()
    return [row for _, row in frame.iterrows()]


def _yaml_entries(name: str = "published_layouts.yaml"):
    data = io.read_yaml(io.SEARCH_SPACES / name)
    return [(model, entry) for model, entries in data.items() for entry in entries]


def _check(model, gpu: str, gpus: int, knobs: dict) -> None:
    hw = io.load_hardware(gpu)
    pins = {k: v for k, v in knobs.items() if k in STATED and k != "gbs"}
    candidates = generate(model, hw, gpus, int(knobs["gbs"]), load_space().pinned(**pins))
    valid = candidates[candidates.reason == ""]
    assert not valid.empty, f"not a candidate: {candidates.reason.iloc[0]}"
    ranked = evaluate(model, hw, valid, load_space().memory_fraction)
    assert ranked.fits.any(), f"predicted not to fit: at least {ranked.peak_memory_gib.min():.1f} GiB"


@pytest.mark.parametrize("row", _published_rows(), ids=lambda r: r["id"])
def test_every_published_run_is_a_fitting_candidate(row):
    knobs = {k: v for k, v in measured_runs._pins(row).items() if k in STATED} | {"gbs": row["gbs"]}
    if knobs["precision"] not in load_space().precision:
        knobs["precision"] = "bf16"
    _check(measured_runs.model_from_row(row), str(row["gpu"]), int(row["num_gpus"]), knobs)


def _finetune_rows():
    """Megatron-Bridge's newer SFT / LoRA rows (issue 27): fine-tuning layouts the default space must offer."""
    from autoparallel import resources
    frame = measured_runs.read_runs_table(resources.data_file("finetune_runs_newer.csv"), measured_runs.RUN_COLUMNS)
    return [row for _, row in frame.iterrows()]


@pytest.mark.parametrize("row", _finetune_rows(), ids=lambda r: r["id"])
def test_every_newer_finetuning_run_is_a_fitting_candidate(row):
    knobs = {k: v for k, v in measured_runs._pins(row).items() if k in STATED} | {"gbs": row["gbs"]}
    _check(measured_runs.model_from_row(row), str(row["gpu"]), int(row["num_gpus"]), knobs)


@pytest.mark.parametrize("name, entry", _yaml_entries(), ids=lambda v: str(v))
def test_every_layout_in_published_layouts_yaml_is_a_fitting_candidate(name, entry):
    _check(io.load_model(name), entry["gpu"], entry["gpus"], entry)


@pytest.mark.parametrize("name, entry", _yaml_entries("recipe_layouts.yaml"), ids=lambda v: str(v))
def test_every_layout_in_recipe_layouts_yaml_is_a_fitting_candidate(name, entry):
    """Megatron-Bridge@067f987df0's VR200 recipes (perf_recipes/*/vr200/*.py) on the vr200 preset, and the
    recipes of the models with no published run (gpt-oss-20b, DeepSeek-V4-Pro, GLM-5) on every GPU they name,
    at the entry's sequence length where it states one (GLM-5's 128k fine-tuning)."""
    model = io.load_model(name)
    if "seq_length" in entry:
        model = dataclasses.replace(model, seq_length=entry["seq_length"])
    _check(model, entry["gpu"], entry["gpus"], entry)


def test_recipe_layouts_cover_every_vr200_recipe_with_a_preset_and_seed_a_sampler_search():
    """The ten preset models Bridge has VR200 pre-training recipes for are all there (30 layouts), the three
    models with recipes and no published run on every GPU (gpt-oss-20b 13, DeepSeek-V4-Pro 1, GLM-5 6), and a
    sampler search on vr200 enqueues them as it does the measured layouts of published_layouts.yaml; an entry
    stating its sequence length (GLM-5's 128k fine-tuning) seeds only a search at that length."""
    from autoparallel.search import sampler
    entries = _yaml_entries("recipe_layouts.yaml")
    vr200 = {"llama3-8b", "llama3-70b", "llama3.1-405b", "qwen3-30b-a3b", "qwen3-235b-a22b",
             "deepseek-v3", "gpt-oss-120b", "kimi-k2", "nemotron-3-nano", "nemotron-3-super"}
    new = {"gpt-oss-20b": 13, "deepseek-v4-pro": 1, "glm-5": 6}
    assert {m for m, _ in entries} == vr200 | set(new)
    assert len([e for m, e in entries if m in vr200]) == 30 and {e["gpu"] for m, e in entries if m in vr200} == {"vr200"}
    assert {m: len([e for n, e in entries if n == m]) for m in new} == new
    glm = io.load_model("glm-5")
    assert len(sampler.published_layouts(glm, 192, "gb200")) == 1  # the 4k pre-training one, not the 128k SFT
    assert len(sampler.published_layouts(dataclasses.replace(glm, seq_length=131072), 192, "gb200")) == 3
    seeds = sampler.published_layouts(io.load_model("deepseek-v3"), 256, "vr200")
    assert {(s["pp"], s["vp"], s["ep"], s["mbs"], s["precision"]) for s in seeds} == {
        (4, 4, 64, 1, "bf16"), (2, 8, 32, 2, "fp8-current"), (2, 8, 32, 1, "mxfp8"), (2, 8, 32, 2, "nvfp4")}


def test_the_128_gpu_deepseek_v3_vr200_recipe_is_refused_as_megatron_refuses_it():
    """deepseek_v3_pretrain_128gpu_vr200_*_config sets TP1 PP4 VP4 EP64 on 128 GPUs: Megatron-LM d98e8a64dd
    megatron/core/parallel_state.py raises "world_size (128) is not divisible by expert_tensor_model_pipeline_parallel
    size (256)" (ETP x EP x PP); the space refuses it with the same rule, so recipe_layouts.yaml leaves it out."""
    knobs = dict(tp=1, pp=4, vp=4, cp=1, ep=64, mbs=1, precision="bf16")
    candidates = generate(io.load_model("deepseek-v3"), io.load_hardware("vr200"), 128, 2048, load_space().pinned(**knobs))
    assert (candidates.reason != "").all()
    assert "ep*etp=64 does not divide the 32 GPUs of a pipeline stage" in candidates.reason.iloc[0]
