"""Every constant no fit moves has a source (issue 28 item 3): search_spaces/hand_set_constants.yaml
lists it with the value the code and the shipped presets hold, so a value changed in one place
without the other, or a new unfitted constant without a source, turns this red."""

import dataclasses
import importlib

import pytest

from autoparallel import io
from autoparallel.costmodel import calibrate
from autoparallel.costmodel.inference import InferenceEfficiency
from autoparallel.serve.assumptions import efficiency_for, engine_names, load_engine
from autoparallel.serve.fit import FIT_KEYS
from autoparallel.specs.hardware import Efficiency, HardwareSpec

REGISTRY = io.read_yaml(io.SEARCH_SPACES / "hand_set_constants.yaml")
KINDS = {"measurement", "datasheet", "code", "guess"}
FITTED_TRAINING = {*calibrate.FITTED, *calibrate.MOE_FITTED, "moe_load_imbalance", "release_speed", "gpu_speed"}


def _gpu_presets():
    """Shipped presets with constants of their own, fitted on published runs (cpu-local's are fitted
    to its profiled runs, which move other constants)."""
    presets = [io.load_hardware(name) for name in sorted(io.preset_files("hardware"))]
    return [hw for hw in presets if not hw.efficiency_from and not hw.calibrated_on.startswith("profiling jobs")]


@pytest.mark.parametrize("section", sorted(REGISTRY))
def test_every_entry_has_a_value_a_kind_and_a_source(section):
    for name, entry in REGISTRY[section].items():
        assert set(entry) <= {"value", "kind", "source", "presets"}, (section, name)
        assert entry["kind"] in KINDS, (section, name)
        assert len(str(entry.get("source", "")).split()) >= 5, f"{section}.{name} needs a source"


def test_every_unfitted_training_constant_is_listed_with_the_code_and_preset_value():
    listed = REGISTRY["training_efficiency"]
    unfitted = {f.name for f in dataclasses.fields(Efficiency)} - FITTED_TRAINING
    assert set(listed) == unfitted
    for name, entry in listed.items():
        assert getattr(Efficiency(), name) == entry["value"], name
        for hw in _gpu_presets():
            assert getattr(hw.efficiency, name) == entry.get("presets", {}).get(hw.name, entry["value"]), (hw.name, name)


def test_hardware_defaults_match_the_code_and_the_presets():
    defaults = {f.name: f.default for f in dataclasses.fields(HardwareSpec)}
    for name, entry in REGISTRY["hardware_defaults"].items():
        assert defaults[name] == entry["value"], name
        for hw in _gpu_presets():
            assert getattr(hw, name) == entry["value"], (hw.name, name)


def test_costmodel_module_constants_match_the_code():
    for dotted, entry in REGISTRY["costmodel"].items():
        module, name = dotted.rsplit(".", 1)
        value = getattr(importlib.import_module(f"autoparallel.costmodel.{module}"), name)
        assert value == pytest.approx(entry["value"]), dotted


def test_every_serving_constant_an_engine_does_not_fit_is_listed_with_its_value():
    listed = REGISTRY["serving_efficiency"]
    every = {f.name for f in dataclasses.fields(InferenceEfficiency)}
    unfitted = {name for keys in FIT_KEYS.values() for name in every - set(keys)}
    assert set(listed) == unfitted
    for name, entry in listed.items():
        assert getattr(InferenceEfficiency(), name) == entry["value"], name
    for engine in engine_names():
        eff = efficiency_for(engine)
        for name in every - set(FIT_KEYS[load_engine(engine).batching]):
            assert getattr(eff, name) == listed[name]["value"], (engine, name)
