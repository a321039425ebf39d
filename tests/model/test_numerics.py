"""Numerics statistics: each signal on a constructed tensor, then the broken recipe in a model."""

import pandas as pd
import pytest
import torch

from autoparallel.model import reference as R
from autoparallel.model.fp8 import Fp8Tensor
from autoparallel.model.numerics import (COLUMNS, NumericsRecorder, collect_numerics,
                                         policy_from_numerics, tensor_stats)
from autoparallel.model.recipes import BlockwiseScaling, CurrentScaling, DelayedScaling
from autoparallel.model.train import TrainConfig

E4M3 = torch.float8_e4m3fn


def tensorwise(x, scale):
    s = torch.tensor(float(scale))
    return Fp8Tensor(R.saturating_cast(x, E4M3, s), s.reciprocal())


def test_overflow_and_underflow_counts():
    x = torch.tensor([1.0, 2.0, 1000.0, -5000.0, 1e-6, 0.0, 3.0, 4.0])
    stats = tensor_stats(x, tensorwise(x, 1.0))
    assert stats["overflow_pct"] == pytest.approx(100 * 2 / 8)   # 1000 and -5000 clip at 448
    assert stats["underflow_pct"] == pytest.approx(100 * 1 / 7)  # 1e-6 of 7 non-zeros -> 0
    assert stats["amax"] == 5000.0 and stats["scale"] == 1.0


def test_exact_round_trip_is_perfect_and_fp32_scale_rounding_is_not_overflow():
    x = torch.tensor([0.5, -1.0, 448.0, 0.0])
    stats = tensor_stats(x, tensorwise(x, 1.0))
    assert stats["mse"] == 0.0 and stats["cos_sim"] == pytest.approx(1.0)
    assert stats["overflow_pct"] == 0.0 and stats["underflow_pct"] == 0.0
    y = torch.randn(4096) * 7.3
    q, s_inv, _ = R.current_scale_cast(y, E4M3)
    assert tensor_stats(y, Fp8Tensor(q, s_inv))["overflow_pct"] == 0.0


def test_mse_and_cosine_track_the_error():
    x = torch.randn(10_000)
    good = tensor_stats(x, tensorwise(x, 100.0))
    bad = tensor_stats(x, tensorwise(x, 1e4))  # everything beyond 0.0448 clips
    assert good["cos_sim"] > 0.999 > bad["cos_sim"]
    assert bad["mse"] > 100 * good["mse"]
    assert bad["overflow_pct"] > 90


def test_delayed_current_ratio_and_blockwise_scale():
    x = torch.randn(256) * 2
    current = R.compute_scale(R.amax(x), E4M3)
    stats = tensor_stats(x, tensorwise(x, current.item() / 4), current)
    assert stats["delayed_current_ratio"] == pytest.approx(0.25)
    q, s = R.blockwise_cast_1d(x.view(2, 128), E4M3)
    blk = tensor_stats(x.view(2, 128), Fp8Tensor(q, s, (1, 128)))
    assert blk["overflow_pct"] == 0 and blk["scale"] == pytest.approx((1 / s).min().item())


def test_recorder_returns_a_dataframe_and_every_skips_steps():
    rec = NumericsRecorder(every=2)
    x = torch.randn(8, 16)
    for step in range(4):
        rec.step = step
        rec("layers.0.mlp.w1", "input", x, tensorwise(x, 10.0), None)
    df = rec.dataframe()
    assert isinstance(df, pd.DataFrame) and list(df.columns) == list(COLUMNS)
    assert df["step"].tolist() == [0, 2]
    with pytest.raises(ValueError, match="every=0"):
        NumericsRecorder(every=0)


def test_broken_recipe_is_caught_per_layer():
    """A negative margin scales past fp8_max: overflow % > 0 in every FP8 layer's input."""
    config = TrainConfig(steps=3, batch_size=4, seq_length=32)
    broken, _ = collect_numerics(DelayedScaling(margin=-6), config=config)
    healthy, _ = collect_numerics(CurrentScaling(), config=config)
    inputs = broken[broken["tensor"] == "input"]
    assert len(inputs) == 8 and (inputs["overflow_pct"] > 0).all()  # 2 layers x 4 GEMMs
    assert (healthy["overflow_pct"] == 0).all()
    assert inputs["cos_sim"].max() < healthy["cos_sim"].min()
    policy = policy_from_numerics(broken, DelayedScaling())
    assert set(policy.bf16_modules) == set(broken["layer"])
    assert policy_from_numerics(healthy, CurrentScaling()).bf16_modules == ()


def test_recorder_detaches_after_use():
    config = TrainConfig(steps=1, batch_size=2, seq_length=16)
    summary, losses = collect_numerics(BlockwiseScaling(), config=config)
    assert {"input", "weight", "grad_output"} == set(summary["tensor"])
    assert set(summary["format"]) == {"E4M3"}
    assert len(losses) == 1
