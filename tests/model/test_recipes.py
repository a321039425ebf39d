"""Recipes and the per-layer policy: validation names the bad value and the valid ones."""

import pytest
import torch

from autoparallel.model.recipes import (BlockwiseScaling, CurrentScaling, DelayedScaling,
                                        Fp8Policy, recipe_from_name, role_dtype)


def test_defaults_follow_transformer_engine():
    r = DelayedScaling()
    assert (r.fp8_format, r.margin, r.amax_history_len, r.amax_compute_algo) == (
        "HYBRID", 0, 1024, "max")
    assert r.name == "fp8-delayed" and CurrentScaling().name == "fp8-current"
    assert BlockwiseScaling().block_size == 128 and BlockwiseScaling().name == "fp8-blockwise"


@pytest.mark.parametrize("kwargs, message", [
    ({"fp8_format": "E5M2"}, "fp8_format='E5M2' is not valid; choose one of E4M3, HYBRID"),
    ({"amax_compute_algo": "mean"}, "amax_compute_algo='mean' is not valid"),
    ({"amax_history_len": 0}, "amax_history_len=0 must be an integer >= 1"),
    ({"margin": 0.5}, "margin=0.5 must be an integer"),
])
def test_delayed_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        DelayedScaling(**kwargs)


def test_blockwise_is_e4m3_only_and_recipes_are_frozen():
    with pytest.raises(ValueError, match="fp8_format='HYBRID' is not valid; choose one of E4M3"):
        BlockwiseScaling(fp8_format="HYBRID")
    with pytest.raises(ValueError, match="block_size=0"):
        BlockwiseScaling(block_size=0)
    with pytest.raises(AttributeError):
        DelayedScaling().margin = 3  # frozen


def test_negative_margin_is_allowed_for_provoking_overflow():
    assert DelayedScaling(margin=-4).margin == -4


def test_role_dtypes():
    assert role_dtype("HYBRID", "grad_output") == torch.float8_e5m2
    assert role_dtype("HYBRID", "input") == torch.float8_e4m3fn
    assert role_dtype("E4M3", "grad_output") == torch.float8_e4m3fn


def test_recipe_from_name():
    assert recipe_from_name("bf16") is None
    assert recipe_from_name("fp8-delayed", margin=1) == DelayedScaling(margin=1)
    with pytest.raises(ValueError, match="precision='fp8' is not valid; choose one of bf16"):
        recipe_from_name("fp8")


def test_policy_selects_layers():
    p = Fp8Policy(CurrentScaling(), bf16_first_layers=1, bf16_last_layers=1,
                  bf16_modules=("layers.*.mlp.w2",))
    assert not p.uses_fp8("layers.0.attention.wq", 0, 4)
    assert not p.uses_fp8("layers.3.attention.wq", 3, 4)
    assert p.uses_fp8("layers.1.attention.wq", 1, 4)
    assert not p.uses_fp8("layers.1.mlp.w2", 1, 4)
    assert not Fp8Policy().uses_fp8("layers.1.attention.wq", 1, 4)
    assert Fp8Policy().name == "bf16" and p.name == "fp8-current"


def test_policy_validation():
    with pytest.raises(ValueError, match="delayed scaling cannot be combined with BF16 first/last"):
        Fp8Policy(DelayedScaling(), bf16_first_layers=1)
    with pytest.raises(ValueError, match="bf16_last_layers=-1 must be an integer >= 0"):
        Fp8Policy(CurrentScaling(), bf16_last_layers=-1)
    with pytest.raises(ValueError, match="must be a tuple of name patterns"):
        Fp8Policy(CurrentScaling(), bf16_modules="layers.0.mlp.w2")
    with pytest.raises(ValueError, match="is not an FP8 or FP4 recipe; use one of .*Nvfp4BlockScaling"):
        Fp8Policy("fp8-delayed")
    assert Fp8Policy(DelayedScaling(), bf16_modules=("layers.0.*",))  # named modules are fine
