"""The kernel loader reports why kernels are unavailable and falls back to the references."""

import torch

from autoparallel.model import kernels, reference


def test_status_is_a_reason_not_an_exception():
    status = kernels.status()
    assert isinstance(status.available, bool) and status.reason
    if not torch.cuda.is_available():
        assert not status.available and "cuda" in status.reason.lower()


def test_cpu_tensors_use_the_references():
    assert kernels.ops_for("cpu") is reference
    assert kernels.ops_for(torch.device("cpu")) is reference


def test_gencode_flags_pick_sm90a_on_hopper():
    assert kernels.nvcc_gencode_flags((9, 0)) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert kernels.nvcc_gencode_flags((8, 9)) == ["-gencode=arch=compute_89,code=sm_89"]


def test_disable_switch(monkeypatch):
    monkeypatch.setenv(kernels.DISABLE_ENV, "1")
    kernels.load.cache_clear()
    try:
        module, status = kernels.load()
        assert module is None and not status.available and kernels.DISABLE_ENV in status.reason
    finally:
        kernels.load.cache_clear()


def test_reference_and_cuda_ops_share_signatures():
    import inspect
    for name in ("amax", "cast_amax", "current_scale_cast", "cast_transpose",
                 "current_scale_cast_transpose", "blockwise_cast_1d",
                 "blockwise_cast_transpose_1d", "blockwise_cast_2d", "delayed_scaling_update"):
        ref = list(inspect.signature(getattr(reference, name)).parameters)
        cuda = list(inspect.signature(getattr(kernels.CudaOps, name)).parameters)[1:]
        assert len(ref) == len(cuda), name
