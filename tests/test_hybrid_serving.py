"""Hybrid Mamba-Transformer models (``hybrid_layer_pattern``) in the serving cost model
(``costmodel.mamba_serving``, ``inference.hybrid_layer_work``).

The Mamba state of a sequence and an M layer's decode time are written out by hand from the
kernels' shapes (vLLM's ``MambaStateShapeCalculator``); a pattern of attention and MLP (or MoE)
layers only is checked against the standard model it spells; ``infer`` runs on Nemotron 3 Nano.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autoparallel.costmodel import mamba_serving
from autoparallel.costmodel.inference import (InferenceEfficiency, estimate_static_columns, layout, pass_work,
                                              price_pass)
from autoparallel.costmodel.inflight import estimate_inflight_columns
from autoparallel.errors import UnpricedModelError, UserError
from autoparallel.serve.assumptions import load_engine
from autoparallel.specs.model import ModelSpec

from test_hybrid_costmodel import _dense_pair, _moe_pair, nano

ROOT = Path(__file__).resolve().parents[1]


def _inflight_cols(n_tp=(1, 2)):
    tp = np.array(n_tp, dtype=float)
    one = np.ones_like(tp)
    return {"tp": tp, "pp": one, "max_batch": 256 * one, "max_num_tokens": 8192 * one, "input_len": 1024 * one,
            "output_len": 512 * one, "weight_precision": np.array(["bf16", "fp8"][:len(tp)]),
            "kv_precision": np.array(["bf16"] * len(tp))}


@pytest.mark.parametrize("pair", [_dense_pair, _moe_pair])
@pytest.mark.parametrize("engine_name", ["tensorrt-llm", "sglang"])
def test_attention_and_ffn_layers_serve_as_the_standard_model(pair, engine_name, hw):
    """``*-`` / ``*E`` pairs: every in-flight and static figure the standard model's, to 1e-9
    (an engine that keeps Mamba states in a pool of its own: no M layer, no state)."""
    standard, hybrid = pair()
    eff, engine = InferenceEfficiency(), load_engine(engine_name)
    cols = _inflight_cols()
    a, b = (estimate_inflight_columns(m, hw, eff, engine, cols) for m in (standard, hybrid))
    for key in a:
        np.testing.assert_allclose(np.asarray(b[key], float), np.asarray(a[key], float), rtol=1e-9, err_msg=key)
    static = {**{k: cols[k] for k in ("tp", "pp", "input_len", "output_len", "weight_precision", "kv_precision")},
              "batch": np.array([1.0, 64.0])}
    a, b = (estimate_static_columns(m, hw, eff, static) for m in (standard, hybrid))
    for key in a:
        np.testing.assert_allclose(np.asarray(b[key], float), np.asarray(a[key], float), rtol=1e-9, err_msg=key)


def test_nano_mamba_state_per_sequence_by_hand():
    """Nano: conv state 3 x (4096 + 2·8·128) BF16 = 36,864 B; SSM state 64 x 64 x 128 FP32 =
    2,097,152 B: 2,134,016 B per M layer, x 23 M layers = 49,082,368 B (46.8 MiB) a sequence. At TP 2
    both halve; at TP 16 the 8 groups are replicated to 16 (one a rank)."""
    model = nano()
    assert mamba_serving.state_bytes(model, 1) == 3 * 6144 * 2 + 64 * 64 * 128 * 4 == 2_134_016
    assert 23 * mamba_serving.state_bytes(model, 1) == 49_082_368
    assert mamba_serving.state_bytes(model, 2) == 2_134_016 / 2
    assert mamba_serving.state_bytes(model, 16) == 3 * (256 + 2 * 1 * 128) * 2 + 4 * 64 * 128 * 4


def test_vllm_admission_by_hand(hw):
    """vLLM's unified pages for Nano at TP 1, BF16 KV: one token of one attention layer is
    2 x 2 KV heads x 128 x 2 B = 1,024 B, so the attention block is 16 x ceil(2,134,016 / 16,384)
    = 2,096 tokens (page 2,146,304 B); 6 * layers and 23 M layers group by 6 (one attention group,
    four Mamba groups). A 1,536-token request holds 1 + 4 blocks of 6 pages."""
    lay = layout(nano(), hw, None, np.array([1.0]), np.array([1.0]), ["bf16"], ["bf16"])
    page = 2096 * 1024
    pool = 1000.0 * 6 * page + 123.0
    requests, fits = mamba_serving.admission(lay, load_engine("vllm"), np.array([pool]), np.array([1536.0]),
                                             np.array([2048.0]))
    assert requests[0] == 1000 // 5 and fits[0]
    requests, fits = mamba_serving.admission(lay, load_engine("sglang"), np.array([pool]), np.array([1536.0]),
                                             np.array([2048.0]))
    assert requests[0] == np.floor(pool / (1536 * 6 * 1024 + 23 * 2_134_016))


def test_mamba_decode_is_its_state_bytes_over_bandwidth(hw):
    """One M layer, 64 decoding sequences, TP 1: each reads and writes its 2,134,016 B of state and
    moves its token's activations (BF16: conv update 2 x 6144, state update in 6144 + 64 + 4096,
    out 4096, norm 2 x 4096: 69,760 B); FLOPs 5 per SSM element. The term in the pass is
    the roofline of those FLOPs at the attention share of BF16 peak and those bytes over the
    achieved HBM bandwidth, added to the layer: the pass with 64 decoding sequences minus the pass
    without them, per M layer, is that term to 1e-12 (pure decode: the only change is this term)."""
    model = nano()
    lay = layout(model, hw, None, np.array([1.0]), np.array([1.0]), ["bf16"], ["bf16"])
    flops, nbytes = mamba_serving.pass_work(lay, 0.0, 0.0, 64.0)
    by_hand = 64 * (2 * 2_134_016 + 2 * (2 * 6144 + 6144 + 64 + 4096 + 4096 + 2 * 4096))
    assert float(nbytes[0]) == by_hand
    assert float(flops[0]) == 64 * 5 * 64 * 64 * 128
    eff = InferenceEfficiency()
    zero = np.zeros(1)
    with_decode = price_pass(eff, pass_work(lay, zero, zero, zero, zero, (flops, nbytes)))
    without = price_pass(eff, pass_work(lay, zero, zero, zero, zero, (zero, zero)))
    k = eff.roofline_sharpness
    c, m = float(flops[0]) / (hw.bf16_tflops * 1e12 * eff.attention), by_hand / (hw.hbm_tbps * 1e12 * eff.hbm)
    term = max(c, m) * ((c / max(c, m)) ** k + (m / max(c, m)) ** k) ** (1 / k)
    assert m > 100 * c  # memory-bound
    assert float((with_decode["time"] - without["time"])[0]) == pytest.approx(23 * term, rel=1e-12)


def test_prefill_reuses_the_training_mamba_kernels(hw):
    """A prompt token's M-layer work: the SSD forward's FLOPs and bytes, the conv1d's and the
    norm's forward bytes (``costmodel.mamba``), sharded by TP."""
    from autoparallel.costmodel import mamba
    model = nano()
    lay = layout(model, hw, None, np.array([2.0]), np.array([1.0]), ["bf16"], ["bf16"])
    flops, nbytes = mamba_serving.pass_work(lay, 1000.0, 0.0, 0.0)
    assert float(flops[0]) == pytest.approx(1000 * mamba.ssd_flops_per_token(model)[0] / 2, rel=1e-12)
    per_token = mamba.ssd_bytes_per_token(model)[0] + 2 * 2 * 6144 + 2 * 2 * 4096
    assert float(nbytes[0]) == pytest.approx(1000 * per_token / 2, rel=1e-12)


@pytest.mark.parametrize("engine_name", ["fastertransformer", "tensorrt-llm-0.10"])
def test_engines_without_mamba_refuse_a_hybrid_model(engine_name, hw):
    with pytest.raises(UnpricedModelError, match="valid engines for it: vllm, sglang, tensorrt-llm") as exc:
        layout(nano(), hw, None, np.array([1.0]), np.array([1.0]), ["bf16"], ["bf16"], engine=load_engine(engine_name))
    assert isinstance(exc.value, UserError) and engine_name in str(exc.value)


def test_more_state_fewer_requests(hw):
    """Doubling the SSM state dimension roughly halves the requests vLLM admits (the state
    dominates a short request's bytes) and slows the decode."""
    eff, engine = InferenceEfficiency(), load_engine("vllm")
    cols = _inflight_cols((1,))
    a = estimate_inflight_columns(nano(), hw, eff, engine, cols)
    b = estimate_inflight_columns(nano(mamba_state_dim=256), hw, eff, engine, cols)
    assert b["kv_capacity_requests"][0] < 0.6 * a["kv_capacity_requests"][0]


def _infer(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "autoparallel", "infer", "--model", "nemotron-3-nano", "--gpus", "1",
                           "--no-save", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.mark.parametrize("gpu", ["h100", "b200"])
def test_infer_nano_prints_a_table_in_80_columns(gpu):
    out = _infer("--gpu", gpu)
    assert out.returncode == 0, out.stderr
    assert "nemotron-3-nano" in out.stdout and "tok/s/GPU" in out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= 80


@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_infer_nano_scenarios(scenario):
    out = _infer("--gpu", "h100", "--engine", "vllm", "--scenario", scenario, "--requests", "300", "--top", "3")
    assert out.returncode == 0, out.stderr
    assert "simulated requests" in out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= 80


def test_infer_refuses_an_engine_without_mamba():
    out = _infer("--gpu", "h100", "--engine", "fastertransformer")
    assert out.returncode == 2 and "fastertransformer" in out.stderr and "vllm, sglang, tensorrt-llm" in out.stderr


def test_dense_pair_is_a_model_spec():
    """The pairs the equivalence reads are what they claim (guards the import from the training test)."""
    standard, hybrid = _dense_pair()
    assert isinstance(hybrid, ModelSpec) and hybrid.num_parameters == standard.num_parameters
    assert dataclasses.replace(standard).is_hybrid is False
