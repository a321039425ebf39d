"""The vocab-parallel cross-entropy on one rank equals torch's, and saves only the softmax."""

import torch
import torch.nn.functional as F

from autoparallel.parallel.tensor import vocab_parallel_cross_entropy
from autoparallel.profiling.memory import SavedTensors


def test_matches_torch_and_its_gradient_is_exact():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    ours = vocab_parallel_cross_entropy(logits, targets, 0, None)
    torch.testing.assert_close(ours, F.cross_entropy(logits.flatten(0, 1), targets.flatten()))
    assert torch.autograd.gradcheck(
        lambda x: vocab_parallel_cross_entropy(x, targets, 0, None), (logits,))


def test_saves_the_fp32_softmax_and_nothing_else_of_vocab_size():
    logits = torch.randn(4, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 64, (4, 8))
    with SavedTensors() as saved:
        loss = vocab_parallel_cross_entropy(logits, targets, 0, None)
    loss.backward()
    softmax = 4 * 8 * 64 * 4
    assert softmax <= saved.peak < softmax * 1.1
    assert logits.grad.dtype == torch.bfloat16
