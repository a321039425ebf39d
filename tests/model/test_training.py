"""The generated corpus, the training loop, and the 200-step FP8-vs-BF16 loss comparison."""

import pytest
import torch

from autoparallel.model.data import BatchSampler, encode, generate_corpus
from autoparallel.model.recipes import BlockwiseScaling, CurrentScaling, DelayedScaling, Fp8Policy
from autoparallel.model.train import TrainConfig, lr_at, train


def test_corpus_is_deterministic_and_has_exact_sums():
    a, b = generate_corpus(5000, seed=1), generate_corpus(5000, seed=1)
    assert a == b and a != generate_corpus(5000, seed=2) and len(a) == 5000
    sums = [s for s in a.split(".") if "+" in s and "=" in s][:20]
    for s in sums:
        lhs, rhs = s.split("=")
        x, y = lhs.split("+")
        assert int(x) + int(y) == int(rhs)


def test_batches_are_next_token_pairs():
    tokens = encode(generate_corpus(2000))
    inputs, targets = BatchSampler(tokens, 4, 16, seed=0).next()
    assert inputs.shape == targets.shape == (4, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    again, _ = BatchSampler(tokens, 4, 16, seed=0).next()
    assert torch.equal(inputs, again)
    with pytest.raises(ValueError, match="too short"):
        BatchSampler(tokens[:10], 4, 16)


def test_schedule_and_config_validation():
    config = TrainConfig(steps=100, warmup=10, lr=1.0)
    assert lr_at(0, config) == pytest.approx(0.1) and lr_at(9, config) == pytest.approx(1.0)
    assert lr_at(99, config) == pytest.approx(0.1, abs=0.01)
    with pytest.raises(ValueError, match="steps=0 must be >= 1"):
        TrainConfig(steps=0)


def test_short_fp8_run_learns():
    result = train(Fp8Policy(DelayedScaling()), TrainConfig(steps=15, batch_size=4,
                                                            seq_length=32))
    assert len(result.losses) == 15
    assert sum(result.losses[-3:]) / 3 < result.losses[0] - 1.0


@pytest.mark.slow
def test_200_steps_delayed_and_current_within_2_percent_of_bf16():
    """The issue's figure: FP8 delayed and current scaling end within 2 % of the BF16 loss, as
    the mean over seeds 0-2 of each seed's gap (same initialisation and batches for all three
    policies of a seed; "end" is the mean of the last 20 steps).

    One seed's gap is mostly trajectory noise, and that noise depends on the CPU's BF16 GEMM
    kernels: seed 0 passed 2 % on one machine and gave +2.28 % (current) on a Xeon without
    avx512_bf16, where seeds 0 / 1 / 2 are +2.28 / -2.07 / +2.35 % but their mean is +0.85 %
    (delayed: -0.03 %; benchmarks/RESULTS.md, session 39). Each seed must stay within the
    fp8-check's healthy-recipe limit (5 %, fp8_check.yaml), which catches a broken recipe.
    """
    recipes = (DelayedScaling(), CurrentScaling())
    gaps: dict[str, list[float]] = {recipe.name: [] for recipe in recipes}
    for seed in (0, 1, 2):
        config = TrainConfig(steps=200, seed=seed)  # batch 8 x 32, as bench_fp8_training.py
        bf16 = train(Fp8Policy(), config).final_loss()
        assert bf16 < 1.5  # it learned the corpus (starts at ln 256 = 5.5)
        for recipe in recipes:
            gap = (train(Fp8Policy(recipe), config).final_loss() - bf16) / bf16
            assert abs(gap) < 0.05, (recipe.name, seed, gap)
            gaps[recipe.name].append(gap)
    for name, values in gaps.items():
        assert abs(sum(values) / len(values)) < 0.02, (name, values)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe", [None, DelayedScaling(), CurrentScaling(),
                                    BlockwiseScaling()], ids=lambda r: getattr(r, "name", "bf16"))
def test_tiny_model_trains_on_gpu_with_kernels(recipe):
    from autoparallel.model import kernels
    from autoparallel.model.train import build_model

    status = kernels.status()
    assert status.available, status.reason  # on a CUDA machine the kernels must build
    policy = Fp8Policy(recipe)
    model = build_model(policy).cuda()
    result = train(policy, TrainConfig(steps=30, num_threads=None), model=model)
    assert result.losses[-1] < result.losses[0] - 1.0
