"""The precision check on FP4: NVFP4 / MXFP8 runs report per-layer statistics in their own formats,
NVFP4 is judged by its own thresholds, and a damaged end layer is answered with the last layers
in BF16 and Megatron's ``--num-layers-at-end-in-bf16`` in the real model's layers."""

import pandas as pd
import pytest

from autoparallel import io
from autoparallel.fp8check import verdict as V
from autoparallel.fp8check.check import end_layers_flag, run_check
from autoparallel.model.recipes import CurrentScaling

FAULT = CurrentScaling(margin=-6)  # a stale scale: ~95 % of one layer's values clip


def test_end_sets_hold_every_damaged_layer():
    bad = pd.DataFrame({"layer_index": [2]})
    assert V.end_sets(bad, 4, 2) == [(2, 3)]
    assert V.end_sets(bad.iloc[:0], 4, 2) == [(3,), (2, 3)]
    assert V.end_sets(pd.DataFrame({"layer_index": [0]}), 4, 3) == []


def test_end_layers_flag_counts_real_layers():
    assert end_layers_flag((3,), 4, 32) == "--num-layers-at-end-in-bf16 8"
    assert end_layers_flag((2, 3), 4, 126) == "--num-layers-at-end-in-bf16 63"


@pytest.fixture(scope="module")
def fp4_result(tiny_settings):
    model = io.load_model("llama3.1-8b")
    return run_check(model, tiny_settings, ["mxfp8", "nvfp4"],
                     module_recipes={"layers.3.mlp.w2": FAULT})


def test_nvfp4_damaged_end_layer_gets_end_layers_in_bf16(fp4_result):
    v = fp4_result.verdicts["nvfp4"]
    assert v.status == V.OK_BF16 and v.bf16_layers == (3,)
    assert v.text == "ok with BF16 layers [3] (--num-layers-at-end-in-bf16 8)"
    assert "layers.3.mlp.w2 input overflow" in v.worst


def test_statistics_in_the_recipes_own_formats(fp4_result):
    nv = fp4_result.summary("nvfp4")
    healthy = nv[nv.layer_index < 3]
    assert set(healthy.format) == {"E2M1"}
    assert set(healthy.tensor) == {"input", "weight", "input_t", "grad_output", "grad_output_t"}
    # E2M1 flushes far more than FP8 does, but stays under NVFP4's own limit
    limit = fp4_result.settings.fp4_thresholds.max_underflow_pct
    assert 1.0 < healthy.underflow_pct.max() < limit
    mx = fp4_result.summary("mxfp8")
    assert set(mx[mx.layer_index < 3].format) == {"E4M3"}
    assert "weight_t" in set(mx.tensor)  # MXFP8 quantizes W^T along its other dim for dgrad
    assert mx[mx.layer_index < 3].underflow_pct.max() < 1.0


def test_ablation_rht_lowers_the_wgrad_operands_error_on_the_proxy():
    """The report's ablation at the scale where it is robust: on the first step (same weights,
    same batch) of the llama3.1-8b proxy, the wgrad GEMM's NVFP4 operands carry less error with
    the RHT than without, for X and for dY (seeds 0-2: 5-7 % and 4-5 % less; the error norm is
    the same before and after the orthogonal transform, so the two compare). The loss-level
    ablation is a benchmark (bench_nvfp4_ablation.py): over 60 steps its seed noise exceeds it.
    Stochastic rounding's part, an unbiased weight gradient, is tested in test_mx_linear.py."""
    from autoparallel.fp8check.proxy import proxy_spec
    from autoparallel.fp8check.runner import run_policy
    from autoparallel.fp8check.settings import CheckRun, load_settings
    from autoparallel.model.recipes import Nvfp4BlockScaling
    spec = proxy_spec(io.load_model("llama3.1-8b"), load_settings().proxy)
    run = CheckRun(steps=1, batch_size=8, seq_length=32, seed=0, stats_every=1, final_window=1)
    mse = {rht: run_policy(spec, Nvfp4BlockScaling(random_hadamard=rht), run)
           .stats.groupby("tensor")["mse"].mean() for rht in (True, False)}
    for tensor in ("input_t", "grad_output_t"):
        assert mse[True][tensor] < 0.97 * mse[False][tensor]
    for tensor in ("input", "weight"):  # fprop operands do not see the RHT
        assert mse[True][tensor] == mse[False][tensor]


@pytest.mark.slow
def test_ablation_no_stochastic_rounding_ends_worse_at_200_steps():
    """The loss-level ablation where it is robust: without stochastic rounding the llama3.1-8b
    proxy ends further from BF16 than with it, at 200 steps (seeds 0 / 1 / 2: +2.35 / +1.41 /
    +1.58 points; benchmarks/RESULTS.md). Seed 0, the largest margin. ~2 min on one core; the
    numerics are not recorded (they do not change the losses). Removing the RHT is not asserted:
    at this scale it is worse on seeds 0 and 1 only."""
    import dataclasses

    from autoparallel.fp8check.proxy import proxy_spec
    from autoparallel.fp8check.runner import run_policy
    from autoparallel.fp8check.settings import load_settings
    from autoparallel.model.recipes import Nvfp4BlockScaling
    settings = load_settings()
    run = dataclasses.replace(settings.run, seed=0, stats_every=settings.run.steps + 1)
    spec = proxy_spec(io.load_model("llama3.1-8b"), settings.proxy)
    base = run_policy(spec, None, run).final_loss(run.final_window)
    gap = {sr: V.loss_gap_pct(run_policy(spec, Nvfp4BlockScaling(stochastic_rounding=sr), run)
                              .final_loss(run.final_window), base) for sr in (True, False)}
    assert gap[False] > gap[True] + 1.0
