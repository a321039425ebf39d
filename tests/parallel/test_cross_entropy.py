"""The vocab-parallel cross-entropy on one rank equals torch's, saves only the softmax, and makes
one FP32 copy of the logits, as Megatron-LM's does."""

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from autoparallel.parallel.tensor import vocab_parallel_cross_entropy
from autoparallel.profiling.memory import SavedTensors


def test_matches_torch_and_its_gradient_is_exact():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    ours = vocab_parallel_cross_entropy(logits, targets, 0, None)
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = F.cross_entropy(ref_logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(ours, ref)
    # (backward reuses the saved softmax in place, as Megatron-LM does: it runs once, so the
    # gradient is checked against torch's rather than by gradcheck's repeated backward)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-12, atol=1e-15)


def test_saves_the_fp32_softmax_and_nothing_else_of_vocab_size():
    logits = torch.randn(4, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 64, (4, 8))
    with SavedTensors() as saved:
        loss = vocab_parallel_cross_entropy(logits, targets, 0, None)
    loss.backward()
    softmax = 4 * 8 * 64 * 4
    assert softmax <= saved.peak < softmax * 1.1
    assert logits.grad.dtype == torch.bfloat16


class _NewFullTensors(TorchDispatchMode):
    """Counts operators that return a new (not in-place, not view) tensor of a given size."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.created = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inplace = func._schema.name.endswith("_") or any(
            a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        if not inplace and not func.is_view and isinstance(out, torch.Tensor) \
                and out.numel() == self.numel:
            self.created.append((str(func), out.dtype))
        return out


def test_forward_makes_one_fp32_copy_of_the_logits():
    logits = torch.randn(4, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 64, (4, 8))
    with _NewFullTensors(logits.numel()) as mode:
        loss = vocab_parallel_cross_entropy(logits, targets, 0, None)
    fp32 = [c for c in mode.created if c[1] == torch.float32]
    assert len(fp32) == 1, mode.created  # shifted, exp and softmax are made in place
    with _NewFullTensors(logits.numel()) as mode:
        loss.backward()
    assert not [c for c in mode.created if c[1] == torch.float32], mode.created
