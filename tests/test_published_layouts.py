"""Every published layout is a candidate of the default search space and predicted to fit.

The rows are the runs of both published files, dense and MoE, (what the source states pinned, what it leaves
open searched) and the entries of search_spaces/published_layouts.yaml. The 2021-2022 A100 rows
trained in FP16, which the default space leaves out: their layout is checked in BF16 (the same
bytes and tensor-core rate).
"""

import pytest

from autoparallel import io, measured_runs
from autoparallel.search.grid import evaluate
from autoparallel.space import generate, load_space

STATED = ("tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "precision", "fsdp")


def _published_rows():
    frame = measured_runs.read_runs()
    return [row for _, row in frame.iterrows()]


def _yaml_entries():
    data = io.read_yaml(io.SEARCH_SPACES / "published_layouts.yaml")
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
