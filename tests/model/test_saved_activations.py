"""What one layer saves for backward is what the cost model counts (Korthikanti per tensor).

The built-in layer saves what Megatron-LM with fused kernels saves: a BF16 residual stream,
norms that keep only their input, Q/K/V and the attention output once, and SwiGLU's two inputs.
These tests hold it to ``costmodel.memory``'s bytes, and check the hand-written norm and SwiGLU
backward passes against autograd in float64.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from autoparallel.costmodel import memory
from autoparallel.model.transformer import (TINY, Norm, Recompute, TransformerLayer, _SwiGLU,
                                            rotary_tables)
from autoparallel.model.recipes import Fp8Policy
from autoparallel.profiling.memory import SavedTensors

NO_DROPOUT = dataclasses.replace(TINY, hidden_dropout=0.0, attention_dropout=0.0)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_norm_matches_torch_in_float64(kind):
    torch.manual_seed(0)
    norm = Norm(16, kind).double()
    with torch.no_grad():
        norm.weight.normal_()
        if norm.bias is not None:
            norm.bias.normal_()
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    expected = (F.rms_norm(x, (16,), norm.weight, 1e-5) if kind == "rmsnorm"
                else F.layer_norm(x, (16,), norm.weight, norm.bias, 1e-5))
    torch.testing.assert_close(norm(x), expected)
    params = [norm.weight] + ([norm.bias] if norm.bias is not None else [])
    assert torch.autograd.gradcheck(lambda x, *p: norm(x), (x, *params))


def test_norm_keeps_the_input_dtype_under_autocast():
    x = torch.randn(2, 4, 16, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert Norm(16, "rmsnorm")(x).dtype == torch.bfloat16


def test_swiglu_backward_matches_autograd():
    h = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SwiGLU.apply, (h,))
    gate, up = h.chunk(2, dim=-1)
    torch.testing.assert_close(_SwiGLU.apply(h), F.silu(gate) * up)


def layer_saved_bytes(spec, recompute: Recompute, b: int = 2) -> int:
    torch.manual_seed(0)
    layer = TransformerLayer(spec, Fp8Policy(), 0, recompute)
    cos, sin = rotary_tables(spec.seq_length, spec.head_dim)
    x = torch.randn(b, spec.seq_length, spec.hidden_size, dtype=torch.bfloat16,
                    requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), SavedTensors() as saved:
        out = layer(x, cos, sin)
    out.float().sum().backward()
    return saved.peak


@pytest.mark.parametrize("activation,normalization", [("swiglu", "rmsnorm"),
                                                      ("gelu", "layernorm"),
                                                      ("squared_relu", "layernorm")])
def test_a_layer_saves_what_the_cost_model_counts(activation, normalization):
    spec = dataclasses.replace(NO_DROPOUT, activation=activation, normalization=normalization)
    b = 2
    predicted = memory.layer_activation_bytes(spec, b, spec.seq_length, 1, False,
                                              keep_scores=False)
    measured = layer_saved_bytes(spec, Recompute())
    # What the formula leaves out: per-token norm statistics and the attention's log-sum-exp.
    assert measured == pytest.approx(float(predicted), rel=0.03)
    assert measured >= predicted


def test_a_fully_recomputed_layer_saves_its_input():
    b = 2
    predicted = memory.layer_input_bytes(NO_DROPOUT, b, NO_DROPOUT.seq_length, 1, False)
    # ... and the rotary tables, which every layer shares (a few KiB, once per model).
    rotary = sum(t.nbytes for t in rotary_tables(NO_DROPOUT.seq_length, NO_DROPOUT.head_dim))
    assert layer_saved_bytes(NO_DROPOUT, Recompute("full"), b) == predicted + rotary


def test_dropout_masks_are_counted_only_with_dropout():
    with_dropout = dataclasses.replace(NO_DROPOUT, hidden_dropout=0.1, attention_dropout=0.1)
    args = (2, 64, 1, False)
    sbh = 2 * 64 * NO_DROPOUT.hidden_size
    extra = (memory.layer_activation_bytes(with_dropout, *args, keep_scores=False)
             - memory.layer_activation_bytes(NO_DROPOUT, *args, keep_scores=False))
    assert extra == pytest.approx(2 * sbh)
    scores = (memory.layer_activation_bytes(with_dropout, *args, keep_scores=True)
              - memory.layer_activation_bytes(with_dropout, *args, keep_scores=False))
    assert scores == pytest.approx(5 * NO_DROPOUT.num_attention_heads * 64 * 64 * 2)
