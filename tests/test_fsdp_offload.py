"""FSDP and activation offloading: what they save, what they cost, when Megatron-LM allows them."""

import dataclasses

import pytest

from autoparallel import io
from autoparallel.costmodel.estimate import estimate_plan
from autoparallel.space import generate, load_space
from autoparallel.specs.plan import Plan

GIB = 2**30


@pytest.fixture(scope="module")
def llama8b():
    return io.load_model("llama3-8b")


def _8b(**kw):
    """NeMo 25.11's Llama-3 8B layout on 8 H100: TP1 PP1 CP1 MBS1, FP8 current scaling."""
    return Plan(**{**dict(tp=1, pp=1, dp=8, gbs=128, mbs=1, precision="fp8-current"), **kw})


def test_fsdp_shards_weights_and_gradients_too(llama8b, h100):
    zero1 = estimate_plan(llama8b, h100, _8b())["breakdown"]["memory_gib"]
    fsdp = estimate_plan(llama8b, h100, _8b(fsdp=True))["breakdown"]["memory_gib"]
    assert fsdp["weights_gib"] == pytest.approx(zero1["weights_gib"] / 8)
    assert fsdp["optimizer_gib"] == pytest.approx(zero1["optimizer_gib"])  # the distributed optimizer shards it already
    # FSDP keeps one layer's gradients and two layers' weights unsharded besides its shard.
    layer_params = llama8b.layer_params
    assert fsdp["grads_gib"] == pytest.approx(zero1["grads_gib"] / 8 + layer_params * (4 + 4) / GIB, rel=1e-6)


def test_nemos_llama3_8b_layout_fits_an_h100_only_with_fsdp(llama8b, h100):
    assert not estimate_plan(llama8b, h100, _8b())["fits"]
    assert estimate_plan(llama8b, h100, _8b(fsdp=True))["fits"]


def test_fsdp_gathers_every_micro_batch(llama8b, h100):
    narrow = dataclasses.replace(h100, nvlink_domain=1)  # every gather crosses the network
    few = estimate_plan(llama8b, narrow, _8b(fsdp=True, gbs=32))
    many = estimate_plan(llama8b, narrow, _8b(fsdp=True, gbs=128))
    assert many["breakdown"]["time_s"]["dp_comm_s"] == pytest.approx(4 * few["breakdown"]["time_s"]["dp_comm_s"])


def _70b_gb200(**kw):
    """NeMo 25.11's Llama-3 70B on 64 GB200: TP1 PP1 FSDP over 64, MBS2 (its recipe offloads 40 layers)."""
    return Plan(**{**dict(tp=1, pp=1, dp=64, gbs=256, mbs=2, precision="fp8-current", fsdp=True,
                          grad_reduce_in_fp32=False), **kw})


def test_offloading_frees_activation_memory_and_hides_behind_compute_over_c2c():
    model, gb200 = io.load_model("llama3-70b"), io.load_hardware("gb200")
    kept = estimate_plan(model, gb200, _70b_gb200())
    offloaded = estimate_plan(model, gb200, _70b_gb200(cpu_offloading_num_layers=40))
    saved = kept["breakdown"]["memory_gib"]["activations_gib"] - offloaded["breakdown"]["memory_gib"]["activations_gib"]
    assert saved == pytest.approx(40 / 80 * kept["breakdown"]["memory_gib"]["activations_gib"], rel=0.05)
    assert offloaded["breakdown"]["time_s"]["offload_s"] == 0.0
    assert offloaded["step_time_s"] == pytest.approx(kept["step_time_s"])


def test_offloading_over_pcie_competes_with_the_network():
    model, h100 = io.load_model("llama3-70b"), io.load_hardware("h100-sxm")
    plan = _70b_gb200(cpu_offloading_num_layers=40)
    shared = estimate_plan(model, h100, plan)
    private = estimate_plan(model, dataclasses.replace(h100, network_shares_host_link=False), plan)
    assert shared["breakdown"]["time_s"]["offload_s"] > private["breakdown"]["time_s"]["offload_s"]


@pytest.mark.parametrize("pins, reason", [
    (dict(pp=2), "CPU offloading needs pp=1"),
    (dict(pp=1, recompute="full"), "CPU offloading does not work with recompute"),
    (dict(pp=1, recompute="none", cpu_offloading_num_layers=80), "CPU offloading covers fewer than 80 layers"),
])
def test_megatrons_offloading_rules(pins, reason):
    model, hw = io.load_model("llama3-70b"), io.load_hardware("gb200")
    space = load_space().pinned(tp=1, cp=1, mbs=1, cpu_offloading_num_layers=pins.pop("cpu_offloading_num_layers", 8),
                                **pins)
    out = generate(model, hw, 64, 256, space)
    assert reason in set(out.reason)


def test_fsdp_means_nothing_without_data_parallel(llama8b, h100):
    out = generate(llama8b, h100, 8, 128, load_space().pinned(tp=8, pp=1, cp=1))
    assert not out[out.reason == ""].fsdp.any()
