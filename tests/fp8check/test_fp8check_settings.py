"""Settings come from YAML strictly; CLI flags override the run length and the recipes."""

import pytest

from autoparallel.errors import SpecError, UserError
from autoparallel.fp8check.command import settings_from_flags
from autoparallel.fp8check.settings import DEFAULT_PATH, Thresholds, load_settings


def test_shipped_yaml_loads_and_names_every_section():
    s = load_settings()
    assert DEFAULT_PATH.name == "fp8_check.yaml"
    assert s.recipes == ("fp8-delayed", "fp8-current", "fp8-blockwise")
    assert s.thresholds.max_loss_gap_pct > 0 and s.thresholds.max_overflow_pct > 0
    assert s.run.steps == 200 and s.run.final_window <= s.run.steps
    assert s.proxy.num_layers == 4 and s.layer_search.max_bf16_layers < s.proxy.num_layers


def test_yaml_values_are_used(tiny_yaml):
    s = load_settings(tiny_yaml)
    assert s.run.steps == 16 and s.proxy.hidden_size == 32 and s.recipes == ("fp8-current",
                                                                              "fp8-blockwise")


def test_unknown_key_and_bad_value_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("thresholds: {max_loss_gap: 3}\n")
    with pytest.raises(SpecError, match=r"bad.yaml.*max_loss_gap.*max_loss_gap_pct"):
        load_settings(bad)
    bad.write_text("thresholds: {max_loss_gap_pct: -1}\n")
    with pytest.raises(SpecError, match="max_loss_gap_pct.: expected a finite number >= 0, got -1"):
        load_settings(bad)
    with pytest.raises(ValueError):
        Thresholds(max_underflow_pct=-0.1)


def test_flags_override_steps_window_and_recipes(tiny_yaml):
    s = settings_from_flags(str(tiny_yaml), steps=3, recipes="fp8-delayed", seed=7)
    assert (s.run.steps, s.run.final_window, s.run.seed) == (3, 3, 7)
    assert s.recipes == ("fp8-delayed",)
    both = settings_from_flags(None, None, "delayed,current,mxfp8,nvfp4")
    assert both.recipes == ("fp8-delayed", "fp8-current", "mxfp8", "nvfp4")  # aliases read as their recipes
    with pytest.raises(UserError, match=r"mxfp4 cannot be checked; choose from .*nvfp4"):
        settings_from_flags(None, None, "fp8-current,mxfp4")
    # a recipe named twice (an alias counts) and an empty item were taken silently before s55h8
    with pytest.raises(UserError, match=r"names fp8-current twice \(as current and fp8-current\)"):
        settings_from_flags(None, None, "delayed,current,mxfp8,nvfp4,fp8-current")
    with pytest.raises(UserError, match="has an empty item"):
        settings_from_flags(None, None, " , ")


def test_nvfp4_is_judged_by_its_own_thresholds():
    from autoparallel.fp8check.settings import thresholds_for
    s = load_settings()
    assert thresholds_for(s, "nvfp4") is s.fp4_thresholds
    assert thresholds_for(s, "mxfp8") is s.thresholds
    assert s.fp4_thresholds.max_underflow_pct > s.thresholds.max_underflow_pct
