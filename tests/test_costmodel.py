import dataclasses

import numpy as np
import pytest

from autoparallel.costmodel import memory
from autoparallel.costmodel.estimate import BREAKDOWN_KEYS, MEMORY_KEYS, estimate_columns, estimate_plan, plan_columns
from autoparallel.costmodel.pipeline import bubble_microbatches, inflight_layer_fraction
from autoparallel.space import generate, load_space
from autoparallel.specs.plan import Plan

S, B, T = 2048, 1, 8


def test_activations_reproduce_korthikanti_without_sp(gpt175b):
    h, a = gpt175b.hidden_size, gpt175b.num_attention_heads
    got = memory.layer_activation_bytes(gpt175b, B, S, T, sp=False, keep_scores=True)
    assert got == pytest.approx(S * B * h * (10 + 24 / T + 5 * a * S / (h * T)))


def test_activations_reproduce_korthikanti_with_sp_and_selective(gpt175b):
    got = memory.layer_activation_bytes(gpt175b, B, S, T, sp=True, keep_scores=False)
    assert got == pytest.approx(34 * S * B * gpt175b.hidden_size / T)


def test_full_recompute_keeps_only_the_layer_input(gpt175b):
    assert memory.layer_input_bytes(gpt175b, B, S, T, sp=False) == 2 * S * B * gpt175b.hidden_size


def test_pipeline_formulas():
    assert bubble_microbatches(8, 1) == 7 and bubble_microbatches(8, 4) == 7 / 4
    assert inflight_layer_fraction(np.array(8), np.array(3), np.array(64)) == pytest.approx(1 + 7 / 24)
    assert inflight_layer_fraction(np.array(8), np.array(1), np.array(4)) == pytest.approx(0.5)


def _plan(**kw):
    base = dict(tp=4, pp=8, dp=16, gbs=2048, mbs=2, vp=6, sp=True, precision="fp8-delayed",
                tp_comm_overlap=True, recompute="selective")
    return Plan(**{**base, **kw})


def test_breakdown_adds_up_to_step_time(gpt175b, h100):
    r = estimate_plan(gpt175b, h100, _plan())
    assert sum(r["breakdown"]["time_s"].values()) == pytest.approx(r["step_time_s"], rel=1e-9)
    mem = r["breakdown"]["memory_gib"]
    assert set(mem) == set(MEMORY_KEYS) and set(r["breakdown"]["time_s"]) == set(BREAKDOWN_KEYS)
    assert sum(mem.values()) == pytest.approx(r["peak_memory_gib"], rel=1e-9)


def test_fp8_is_faster_than_bf16(gpt175b, h100):
    fp8 = estimate_plan(gpt175b, h100, _plan())
    bf16 = estimate_plan(gpt175b, h100, _plan(precision="bf16"))
    assert fp8["step_time_s"] < 0.85 * bf16["step_time_s"]


def test_recompute_trades_time_for_memory(gpt175b, h100):
    none, sel, full = (estimate_plan(gpt175b, h100, _plan(recompute=r)) for r in ("none", "selective", "full"))
    assert none["step_time_s"] < sel["step_time_s"] < full["step_time_s"]
    assert full["peak_memory_gib"] < none["peak_memory_gib"]
    assert full["step_time_s"] / none["step_time_s"] == pytest.approx(4 / 3, abs=0.12)


def test_interleaving_shrinks_the_bubble(gpt175b, h100):
    one = estimate_plan(gpt175b, h100, _plan(vp=1, mbs=1, dp=16))
    six = estimate_plan(gpt175b, h100, _plan(vp=6, mbs=1, dp=16))
    assert six["breakdown"]["time_s"]["bubble_s"] < one["breakdown"]["time_s"]["bubble_s"] / 4


def test_distributed_optimizer_shards_optimizer_states(gpt175b, h100):
    on = estimate_plan(gpt175b, h100, _plan())
    off = estimate_plan(gpt175b, h100, _plan(distributed_optimizer=False, overlap_param_gather=False))
    assert off["breakdown"]["memory_gib"]["optimizer_gib"] == pytest.approx(
        16 * on["breakdown"]["memory_gib"]["optimizer_gib"])


def test_tp_across_nodes_is_slower(gpt175b, h100):
    wide = dataclasses.replace(h100, nvlink_domain=2)
    assert estimate_plan(gpt175b, wide, _plan(tp_comm_overlap=False))["breakdown"]["time_s"]["tp_comm_s"] > \
        3 * estimate_plan(gpt175b, h100, _plan(tp_comm_overlap=False))["breakdown"]["time_s"]["tp_comm_s"]


def test_columns_equal_one_plan_at_a_time(gpt175b, h100):
    space = load_space().pinned(tp=4, cp=1, mbs=1)
    valid = generate(gpt175b, h100, 512, 2048, space).query("reason == ''").head(200)
    cols = {k: valid[k].to_numpy() for k in Plan.field_names()}
    together = estimate_columns(gpt175b, h100, cols)["step_time_s"]
    from autoparallel.space import row_to_plan
    one_by_one = [estimate_columns(gpt175b, h100, plan_columns([row_to_plan(r)]))["step_time_s"][0]
                  for _, r in valid.iterrows()]
    np.testing.assert_allclose(together, one_by_one, rtol=1e-12)


def test_costmodel_imports_no_heavy_frameworks():
    import subprocess
    import sys
    code = ("import sys, autoparallel.costmodel, autoparallel.space, autoparallel.search.grid;"
            "print(sorted(m for m in ('torch', 'optuna', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("model_name, gpus", [("gpt3-175b", 512), ("deepseek-v3", 256)])
def test_candidates_moved_to_another_gpu_price_as_if_built_there(model_name, gpus):
    # A calibration builds a row's candidates once and reprices them per trial (``on_hardware``):
    # every field that reads the GPU must follow it, here across GPU kinds (NVLink domain, MXFP8).
    from autoparallel import io
    from autoparallel.costmodel.candidates import candidates, on_hardware
    from autoparallel.costmodel.estimate import estimate_candidates
    model, h100, gb200 = io.load_model(model_name), io.load_hardware("h100-sxm"), io.load_hardware("gb200")
    frame = generate(model, gb200, gpus, model.global_batch_size, load_space())
    valid = frame[frame["reason"] == ""].sample(300, random_state=0)
    cols = {k: valid[k].to_numpy() for k in Plan.field_names()}
    moved = estimate_candidates(on_hardware(candidates(model, h100, cols), gb200))
    built = estimate_columns(model, gb200, cols)
    assert built["step_time_s"].min() != estimate_columns(model, h100, cols)["step_time_s"].min()
    for key, values in built.items():
        np.testing.assert_array_equal(moved[key], values, err_msg=key)
