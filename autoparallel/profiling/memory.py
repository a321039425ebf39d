"""Memory a step holds: bytes saved for backward (exact on CPU) and a forced cap.

On a GPU the CUDA caching allocator's peak is the answer. On CPU there is no allocator to ask, so
``SavedTensors`` sums what autograd keeps for backward through ``saved_tensors_hooks`` (each
storage once, while any saved tensor still refers to it): the quantity Korthikanti et al.'s
activation formulas predict. Parameters and their autocast BF16 copies are model states, not
activations, and are left out. What full recompute saves again while it rebuilds a layer in
backward is invisible here (checkpoint installs its own hooks for that), as it is in Korthikanti
et al.'s stored-activation counts. ``cap_bytes`` makes a CPU run fail like a GPU out-of-memory as
soon as saved bytes plus model states exceed it, so the failure path can be tested here.
"""

from __future__ import annotations

import weakref

import torch


class OutOfMemory(RuntimeError):
    """Raised when a forced memory cap is exceeded (message contains 'out of memory')."""


# Views and casts autograd may put between a parameter and the tensor a GEMM saves.
_WEIGHT_PATH = ("ToCopyBackward0", "TBackward0", "TransposeBackward0", "ViewBackward0",
                "UnsafeViewBackward0", "PermuteBackward0", "ExpandBackward0")


def _is_weight(t: torch.Tensor) -> bool:
    """A parameter, or a view / autocast copy of one (model state, not an activation)."""
    if isinstance(t, torch.nn.Parameter):
        return True
    fn = t.grad_fn
    for _ in range(6):
        if fn is None:
            return False
        name = type(fn).__name__
        if name == "AccumulateGrad":
            return isinstance(fn.variable, torch.nn.Parameter)
        if name not in _WEIGHT_PATH or not fn.next_functions:
            return False
        fn = fn.next_functions[0][0]
    return False


class _Holder:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedTensors:
    """Context manager counting live saved-for-backward bytes and their peak."""

    def __init__(self, states_bytes: int = 0, cap_bytes: int | None = None) -> None:
        self.live = 0
        self.peak = 0
        self.states_bytes, self.cap_bytes = states_bytes, cap_bytes
        self._storages: dict[int, list[int]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _release(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._storages[key]

    def _pack(self, t: torch.Tensor):
        if _is_weight(t):
            return t
        holder = _Holder(t)
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._storages:
            self._storages[key][0] += 1
        else:
            self._storages[key] = [1, storage.nbytes()]
            self.live += storage.nbytes()
            if self.live > self.peak:
                self.peak = self.live
                self._check_cap()
        weakref.finalize(holder, self._release, key)
        return holder

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Holder) else packed

    def _check_cap(self) -> None:
        if self.cap_bytes is not None and self.peak + self.states_bytes > self.cap_bytes:
            raise OutOfMemory(
                f"out of memory: {(self.peak + self.states_bytes) / 2**30:.3f} GiB needed "
                f"(saved activations {self.peak / 2**30:.3f} + model states "
                f"{self.states_bytes / 2**30:.3f}), cap {self.cap_bytes / 2**30:.3f} GiB")

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)
