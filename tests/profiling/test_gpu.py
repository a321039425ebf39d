"""The CUDA / NCCL paths of profiling jobs. Skipped, with the reason, on machines without GPUs
(this project's CI has none); run them on a GPU node with ``pytest -m gpu tests/profiling``."""

import pytest
import torch

from autoparallel.profiling.job import JobSpec
from autoparallel.profiling.launcher import run_local
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (NCCL backend, CUDA allocator peak)")]

SMALL = ModelSpec(name="prof-small", num_layers=2, hidden_size=64, ffn_hidden_size=128,
                  num_attention_heads=4, num_query_groups=2, vocab_size=128, seq_length=32,
                  activation="swiglu", normalization="rmsnorm", global_batch_size=8)


def test_one_gpu_job_uses_the_cuda_allocator_peak():
    m = run_local(JobSpec(SMALL, Plan(tp=1, pp=1, dp=1, gbs=8, mbs=4), steps=3, warmup=1))
    assert m.ok, m.reason
    assert m.device == torch.cuda.get_device_name()
    assert m.peak_memory_gib * 2**30 > m.activation_bytes > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for an NCCL job")
def test_two_gpu_tensor_parallel_job_over_nccl():
    m = run_local(JobSpec(SMALL, Plan(tp=2, pp=1, dp=1, gbs=8, mbs=4, sp=True), steps=3,
                          warmup=1))
    assert m.ok, m.reason
    assert m.world_size == 2 and m.device == torch.cuda.get_device_name()


def test_layer_profile_on_gpu():
    from autoparallel.profiling.layer import layer_shape, profile_layer
    shape = layer_shape(SMALL, Plan(tp=1, pp=1, dp=1, gbs=8, mbs=4, precision="fp8-delayed"))
    out = profile_layer(shape, steps=2, warmup=1, device="cuda")
    assert out["fwd_bwd_s"] > 0
