"""The ``mhc`` recompute module (Megatron-LM caeff8c80d ``hyper_connection.py``: output-discarding
checkpoints of each mHC block's aggregation and H_res / H_post merge, rerun before the backward):
it spares the n-stream tensors each layer keeps (``hyper_connection_saved_bytes``) and reruns both
blocks' mHC forward (``mhc_recompute_time``); only models with Hyper-Connections take it."""

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import dsv4
from autoparallel.costmodel import layer_time as lt
from autoparallel.costmodel.candidates import candidates
from autoparallel.costmodel.estimate import estimate_plan, plan_columns
from autoparallel.space import modules_apply
from autoparallel.specs.plan import Plan


def _plans(modules):
    return [Plan(tp=1, pp=4, vp=4, dp=64, ep=64, mbs=1, gbs=4096, precision="mxfp8", recompute="selective",
                 recompute_modules=m, pipeline_model_parallel_layout="Et*4|(tttt|)*14tmL",
                 distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
                 fp8_param_gather=True, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep") for m in modules]


def test_only_models_with_hyper_connections(dsv4_pro):
    assert modules_apply("mla_up_proj mhc", dsv4_pro) == ""
    assert "Hyper-Connections" in modules_apply("mla_up_proj mhc", io.load_model("deepseek-v3"))
    assert "Hyper-Connections" in modules_apply("mhc", io.load_model("llama3-8b"))


def test_mhc_spares_the_streams_and_reruns_their_forward(dsv4_pro, gb300):
    """Per layer: the stored bytes fall by both blocks' n-stream tensors (2 x 4 x 7168 BF16 a token:
    114,688 bytes) and the recompute adds the mHC forward, nothing else."""
    x = candidates(dsv4_pro, gb300, plan_columns(_plans(["mla_up_proj", "mla_up_proj mhc"])))
    stored = lt.stored_activation_bytes(x, True)
    tokens = 4096  # mbs 1 x seq 4096, TP 1
    assert stored[0] - stored[1] == pytest.approx(2 * 4 * 7168 * 2 * tokens, rel=1e-12)
    zero = np.zeros_like(x.t)
    extra = lt.selective_recompute_time(x, zero, zero, True)
    assert extra[1] - extra[0] == pytest.approx(dsv4.hyper_connection_time(x)[0][1], rel=1e-12)
    assert extra[1] > extra[0]


def test_recipe_plan_fits_with_less_memory_and_a_slower_step(dsv4_pro, gb300):
    """The 256-GB300 recipe's modules (mla_up_proj, mhc) against mla_up_proj alone (the recipe's other
    knobs as the space's): mla_up_proj alone does not fit a GB300 (299 GiB), with mhc it does (266 GiB),
    for a step longer by the recompute (22.80 -> 23.19 s)."""
    base, mhc = (estimate_plan(dsv4_pro, gb300, p) for p in _plans(["mla_up_proj", "mla_up_proj mhc"]))
    assert not base["fits"] and mhc["fits"]
    assert mhc["peak_memory_gib"] < base["peak_memory_gib"] - 30
    assert mhc["step_time_s"] > base["step_time_s"]
