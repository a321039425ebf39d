import dataclasses
import os
from pathlib import Path

import pytest

from autoparallel import io, resources
from autoparallel.errors import SpecError, UserError
from autoparallel.specs.model import ModelSpec

REQUIRED_MODELS = ["gpt3-5b", "gpt3-20b", "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b",
                   "llama3-8b", "llama3-70b", "llama3.1-405b", "nemotron-15b", "nemotron-340b"]
REQUIRED_HARDWARE = ["a100-sxm-80g", "h100-sxm", "h200", "h200-nvl", "b200", "b300", "gb200", "gb300", "vr200"]


@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_every_model_preset_loads(name):
    assert io.load_model(name).name == name


@pytest.mark.parametrize("name", REQUIRED_HARDWARE)
def test_every_hardware_preset_loads(name):
    hw = io.load_hardware(name)
    assert hw.name == name and hw.efficiency.gemm_max > 0


def test_alias_resolves():
    assert io.load_model("175b").name == "gpt3-175b"


@pytest.mark.parametrize("name, billions", [("gpt3-175b", 175), ("llama2-70b", 69), ("llama3-8b", 8.0),
                                            ("llama3.1-405b", 405), ("llama2-7b", 6.7)])
def test_parameter_counts_match_model_cards(name, billions):
    assert io.load_model(name).num_parameters / 1e9 == pytest.approx(billions, rel=0.03)


def test_gb200_is_one_72_gpu_nvlink_domain():
    assert io.load_hardware("gb200").nvlink_domain == 72


def test_memory_is_what_the_driver_reports():
    """memory_gib is the total nvidia-smi reports (what a process can allocate), as h100-sxm's 81,559 MiB:
    GB200 189,471 MiB, GB300 284,208 MiB and VR200 286,524 MiB (NVIDIA/k8s-test-infra's qx-gb200.xml / qx-gb300.xml /
    qx-vrnvl72.xml), B200 183,359 MiB; not the marketing GB read as 10^9 bytes (174 and 268 GiB before)."""
    for name, mib in (("gb200", 189471), ("gb300", 284208), ("vr200", 286524), ("b200", 183359), ("h100-sxm", 81559)):
        assert abs(io.load_hardware(name).memory_gib - mib / 1024) < 0.1, name


def test_blackwell_ultra_presets_follow_their_datasheets():
    """HGX B300: 8 GPUs of 288 GB per node, dense FP4 3x FP8 (Blackwell: 2x); GB300 trays hold 4 GPUs."""
    b300, gb300, b200 = (io.load_hardware(n) for n in ("b300", "gb300", "b200"))
    assert (b300.gpus_per_node, b300.nvlink_domain, b300.memory_gib) == (8, 8, 268)
    assert b300.fp4_tflops == 3 * b300.fp8_tflops and b200.fp4_tflops == 2 * b200.fp8_tflops
    assert (gb300.gpus_per_node, gb300.nvlink_domain) == (4, 72)
    assert b300.efficiency == gb300.efficiency == b200.efficiency


def test_vr200_is_a_72_gpu_rubin_rack_priced_with_blackwell_constants():
    """Vera Rubin NVL72 (Megatron-Bridge's vr200): trays of 4 GPUs (Bridge's NUM_GPUS_PER_NODE_MAP), one 72-GPU NVLink
    domain at 3.6 TB/s per GPU, NVIDIA's dense NVFP4 *training* peak (35 PF, not the 50 PF inference figure) and FP8
    1.2 EF / 72, BF16 half of FP8 (an assumption: NVIDIA states none); Blackwell's fitted constants borrowed, and no
    max SM clock, so its peaks are not rescaled by Blackwell's FLOP per SM per clock."""
    vr, b200, gb300 = (io.load_hardware(n) for n in ("vr200", "b200", "gb300"))
    assert (vr.gpus_per_node, vr.nvlink_domain, vr.nvlink_gbps, vr.internode_gbps) == (4, 72, 3600, 200)
    assert (vr.fp4_tflops, vr.fp8_tflops, vr.bf16_tflops) == (35000, 16667, 8333) and vr.mxfp8
    assert vr.fp8_tflops == pytest.approx(1.2e6 / 72, abs=1) and vr.bf16_tflops == pytest.approx(vr.fp8_tflops / 2, abs=1)
    assert vr.hbm_tbps == 22.0 and vr.memory_gib > gb300.memory_gib
    assert vr.efficiency_from == "b200" and vr.efficiency == b200.efficiency
    assert vr.max_sm_clock_mhz is None and vr.clock_speed == 1.0
    assert io.load_hardware("vera-rubin-nvl72").name == io.load_hardware("vr200-nvl72").name == "vr200"


def test_h200_nvl_is_a_slower_h200_in_4_gpu_bridges():
    nvl, sxm = io.load_hardware("h200-nvl"), io.load_hardware("h200")
    assert nvl.memory_gib == sxm.memory_gib and nvl.nvlink_domain == 4 < nvl.gpus_per_node
    assert nvl.bf16_tflops / sxm.bf16_tflops == pytest.approx(0.845, abs=0.01)
    assert nvl.fp4_tflops is None and not nvl.mxfp8


def test_uncalibrated_gpu_inherits_h100_constants():
    assert io.load_hardware("h200").efficiency == io.load_hardware("h100-sxm").efficiency


def test_unknown_model_lists_valid_names_and_suggests():
    with pytest.raises(UserError, match=r"unknown model 'lama3-8b'.*Did you mean 'llama3-8b'.*Valid: .*gpt3-175b"):
        io.load_model("lama3-8b")


def test_unknown_hardware_is_a_user_error():
    with pytest.raises(UserError, match="unknown hardware 'h900'"):
        io.load_hardware("h900")


def _write(tmp_path, text):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return str(path)


GOOD = """name: tiny
num_layers: 2
hidden_size: 64
ffn_hidden_size: 256
num_attention_heads: 4
vocab_size: 128
seq_length: 32
"""


def test_model_yaml_path_loads(tmp_path):
    assert io.load_model(_write(tmp_path, GOOD)) == ModelSpec(
        name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
        vocab_size=128, seq_length=32)


def test_a_yaml_file_edited_between_reads_is_read_again(tmp_path):
    """read_yaml keeps parsed files while their stat is unchanged; an edit of the same size within
    the same second (a test, an editor's quick save) changes mtime_ns and is seen."""
    path = _write(tmp_path, GOOD)
    assert io.load_model(path).num_layers == 2
    stat = os.stat(path)
    Path(path).write_text(GOOD.replace("num_layers: 2", "num_layers: 4"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert io.load_model(path).num_layers == 4


def test_read_yaml_gives_each_caller_its_own_mapping(tmp_path):
    path = Path(_write(tmp_path, GOOD))
    io.read_yaml(path)["num_layers"] = 99
    assert io.read_yaml(path)["num_layers"] == 2


def test_a_user_preset_alias_edited_in_one_process_resolves(tmp_path):
    """resolve_preset reads every preset's aliases per look-up (through the read_yaml cache)."""
    folder = resources.user_dir() / "models"
    folder.mkdir(parents=True, exist_ok=True)
    preset = folder / "cache-test-tiny.yaml"
    try:
        preset.write_text(GOOD + "aliases: [first-alias]\n")
        assert io.resolve_preset("models", "first-alias") == preset
        preset.write_text(GOOD + "aliases: [second-alias]\n")
        os.utime(preset, ns=(0, preset.stat().st_mtime_ns + 1))
        assert io.resolve_preset("models", "second-alias") == preset
        with pytest.raises(UserError, match="unknown model 'first-alias'"):
            io.resolve_preset("models", "first-alias")
    finally:
        preset.unlink()


def test_unknown_key_names_file_and_key(tmp_path):
    path = _write(tmp_path, GOOD + "num_layer: 3\n")
    with pytest.raises(SpecError, match=r"m\.yaml: unknown key 'num_layer' \(did you mean 'num_layers'\?\)"):
        io.load_model(path)


def test_wrong_type_names_key_and_expected_type(tmp_path):
    path = _write(tmp_path, GOOD.replace("num_layers: 2", "num_layers: two"))
    with pytest.raises(SpecError, match=r"key 'num_layers': expected int, got 'two'"):
        io.load_model(path)


def test_missing_key_is_named(tmp_path):
    path = _write(tmp_path, GOOD.replace("vocab_size: 128\n", ""))
    with pytest.raises(SpecError, match="missing required key 'vocab_size'"):
        io.load_model(path)


def test_bad_literal_lists_choices(tmp_path):
    path = _write(tmp_path, GOOD + "activation: relu\n")
    with pytest.raises(SpecError, match="expected one of 'gelu' | 'swiglu' | 'squared_relu'"):
        io.load_model(path)


def test_inconsistent_heads_are_rejected(tmp_path):
    path = _write(tmp_path, GOOD + "num_query_groups: 3\n")
    with pytest.raises(SpecError, match="not a multiple of num_query_groups=3"):
        io.load_model(path)


def test_malformed_yaml_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="not valid YAML"):
        io.load_model(_write(tmp_path, "name: [unclosed\n"))


def _numeric_fields(cls):
    """(key, is_int, is_list) for every number a spec reads from YAML, also in lists and Optionals."""
    import typing
    out = []
    for name, tp in typing.get_type_hints(cls).items():
        args = [a for arg in (typing.get_args(tp) or (tp,)) for a in (typing.get_args(arg) or (arg,))]
        if int in args or float in args:
            out.append((name, float not in args, typing.get_origin(tp) is tuple))
    assert out
    return out


def _spec_classes():
    from autoparallel.costmodel.inference import InferenceEfficiency
    from autoparallel.fp8check.settings import CheckRun, LayerSearch, Thresholds
    from autoparallel.search.sampler import StudySettings
    from autoparallel.serve.space import InferenceSpace
    from autoparallel.space import SearchSpace
    from autoparallel.specs.hardware import Efficiency, HardwareSpec
    from autoparallel.specs.plan import Plan
    base = {"name": "x", "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4,
            "vocab_size": 128, "seq_length": 32}
    hw = {"name": "x", "bf16_tflops": 1.0, "memory_gib": 80.0, "hbm_tbps": 1.0, "nvlink_domain": 8,
          "nvlink_gbps": 1.0, "internode_gbps": 1.0}
    return [(ModelSpec, base), (HardwareSpec, hw), (Efficiency, {}), (SearchSpace, {}), (Thresholds, {}),
            (CheckRun, {}), (LayerSearch, {}), (InferenceEfficiency, {}), (InferenceSpace, {}),
            (StudySettings, {}), (Plan, {"tp": 1, "pp": 1, "dp": 1, "gbs": 1})]


@pytest.mark.parametrize("cls, valid", _spec_classes(), ids=lambda v: getattr(v, "__name__", ""))
def test_every_number_read_from_yaml_is_finite_and_not_negative(cls, valid):
    """NaN, infinity, negative numbers and counts beyond 2^31 are refused for every numeric key of
    every spec a YAML file (or a run folder's manifest) describes, naming the key."""
    assert io.from_dict(cls, valid, "ok.yaml") is not None
    for name, is_int, is_list in _numeric_fields(cls):
        bad_values = [-1, 2**40] if is_int else [float("nan"), float("inf"), -0.5]
        for bad in bad_values:
            with pytest.raises(SpecError, match=f"key '{name}'"):
                io.from_dict(cls, {**valid, name: [bad] if is_list else bad}, "bad.yaml")


@pytest.mark.parametrize("cls, valid", [c for c in _spec_classes() if c[0].__name__ in ("ModelSpec", "Plan")],
                         ids=lambda v: getattr(v, "__name__", ""))
def test_positive_counts_quote_the_range_taken(cls, valid):
    """A count that must be >= 1 (``POSITIVE_KEYS``) out of range, 0 included, is refused quoting
    1..2^31-1 (not 0..: 0 is refused too), from YAML; built directly, 0 is refused naming the key."""
    for name in cls.POSITIVE_KEYS:
        for bad in (0, -1, 10**30):
            with pytest.raises(SpecError, match=rf"bad\.yaml: key '{name}': expected an integer in 1\.\.2147483647, "
                                                rf"got {bad}$"):
                io.from_dict(cls, {**valid, name: bad}, "bad.yaml")
        with pytest.raises(ValueError, match=f"{name} must be a positive integer, got 0"):
            cls(**{**valid, name: 0})


def test_quick_geglu_is_a_gated_activation_and_its_clamp_positive():
    """Megatron-LM's --quick-geglu builds a GLU (activation "swiglu" stands for the three matrices);
    --activation-func-clamp-value must be finite and above zero (TransformerConfig.__post_init__)."""
    base = io.load_model("gpt-oss-120b")
    with pytest.raises(ValueError, match="quick_geglu is a gated activation"):
        dataclasses.replace(base, activation="gelu")
    for bad in (0.0, -7.0, float("inf")):
        with pytest.raises(ValueError, match="activation_func_clamp_value must be finite"):
            dataclasses.replace(base, activation_func_clamp_value=bad)
    assert (base.quick_geglu, base.activation_func_clamp_value) == (True, 7.0)


def test_a_preset_calibrated_before_the_moe_experts_were_priced_per_call_still_loads(tmp_path, capsys):
    """Presets `calibrate --moe` wrote before 2026-11-27 state grouped_gemm_max, grouped_gemm_half_gflop
    and moe_expert_overhead_s: they load without them, and the user is told to refit."""
    text = (io.SEARCH_SPACES / "hardware" / "h100-sxm.yaml").read_text().replace("name: h100-sxm", "name: my-cluster")
    text = text.replace("efficiency:\n", "efficiency:\n  grouped_gemm_max: 0.7191\n  grouped_gemm_half_gflop: 0.01\n"
                        "  moe_expert_overhead_s: 0.0001365\n", 1)
    path = tmp_path / "my-cluster.yaml"
    path.write_text(text)
    hw = io.load_hardware(str(path))
    assert hw.efficiency == io.load_hardware("h100-sxm").efficiency
    err = capsys.readouterr().err
    assert "grouped_gemm_max, grouped_gemm_half_gflop, moe_expert_overhead_s no longer priced" in err
    assert "calibrate --moe" in err
