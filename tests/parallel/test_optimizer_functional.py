"""The profiling job's AdamW (``optimizer.AdamW``: torch's functional AdamW) updates exactly as
``torch.optim.AdamW`` does, and never imports torch._dynamo (the class does, seconds of every
job's build: benchmarks/RESULTS.md, session 39)."""

import subprocess
import sys

import pytest
import torch

from autoparallel.parallel.optimizer import AdamW


def _devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
def test_same_values_as_torch_adamw_bit_for_bit(device):
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(1000, generator=gen).to(device)
    grads = [torch.randn(1000, generator=gen).to(device) for _ in range(3)]
    ours, theirs = (nn_param(start) for _ in range(2))
    mine = AdamW(ours, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ref = torch.optim.AdamW([theirs], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True if theirs.is_cuda else None)
    for k, g in enumerate(grads):
        if k == 2:  # a new learning rate, as ParallelModel.step(lr=...) sets it
            mine.lr = ref.param_groups[0]["lr"] = 3e-4
        mine.step(g)
        theirs.grad = g
        ref.step()
        assert torch.equal(ours, theirs), k
    state = ref.state[theirs]
    assert torch.equal(mine.moments[0], state["exp_avg"])
    assert torch.equal(mine.moments[1], state["exp_avg_sq"])
    assert float(mine.steps) == float(state["step"]) == 3


def nn_param(values: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(values.clone())


def test_a_parallel_model_step_never_imports_dynamo():
    code = """
import sys, torch
from autoparallel.parallel.parallelize import ParallelModel, StepConfig
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan
spec = ModelSpec(name="t", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                 num_attention_heads=4, num_query_groups=2, vocab_size=128, seq_length=16,
                 activation="swiglu", normalization="rmsnorm")
pm = ParallelModel(spec, Plan(tp=1, pp=1, dp=1, gbs=2), StepConfig())
tokens = torch.randint(0, 128, (2, 17))
pm.step(tokens[:, :-1], tokens[:, 1:])
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.strip() == "False"
