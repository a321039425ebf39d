"""Session 53 s53h1's two DeepSeek-V4 terms, each pinned to a hand computation from the source it reads:
the compressor / indexer GEMMs as Megatron-LM's dev branch runs them (BF16 under MXFP8, the indexer's
detached input: no input gradient), and the key slots FlashMLA's SM100 sparse forward computes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoparallel import io
from autoparallel.costmodel import flops, gemm
from autoparallel.costmodel import layer_time as lt


@pytest.fixture(scope="module")
def flash():
    return io.load_model("deepseek-v4-flash")


def _row_candidates(gpu="gb200"):
    from autoparallel import measured_runs, resources
    rows = measured_runs.load_runs([resources.data_file("training_runs_dsv4.csv")], moe=True)
    return next(r for r in rows if f"-{gpu}-" in r.id).built


def test_compressor_gemms_as_csa_builds_them(flash):
    """Ratio 4: the attention compressor's wkv and wgate (4096 -> 2 x 512 each, BF16, three passes), the
    indexer compressor's (4096 -> 2 x 128 each, BF16, weight gradient only), weights_proj (4096 -> 64,
    BF16, weight gradient only), the indexer's wq_b (1024 -> 64 x 128, the recipe's precision, weight
    gradient only); ratio 128: the compressor's wkv and wgate (4096 -> 512 each); ratio 0: none."""
    assert lt.dsv4_compressor_gemms(flash, 4) == ((2 * 4096 * 1024, True, 3.0), (2 * 4096 * 256, True, 2.0),
                                                  (4096 * 64, True, 2.0), (1024 * 8192, False, 2.0))
    assert lt.dsv4_compressor_gemms(flash, 128) == ((2 * 4096 * 512, True, 3.0),)
    assert lt.dsv4_compressor_gemms(flash, 0) == ()
    # the same weights the parameter count holds for them
    for ratio in (4, 128):
        assert sum(p for p, _, _ in lt.dsv4_compressor_gemms(flash, ratio)) == flash.csa_extra_params(ratio)


def test_compressor_gemms_time_by_hand():
    """Each GEMM on the micro-batch's 4,096 tokens at its own size: BF16 ones at the BF16 peak, the
    forward their BF16 less the FP8 time the Linear GEMMs price, the backward (passes - 1) runs less the
    two priced; the mean over the 43 decoder layers (21 ratio-4, 20 ratio-128, 2 window-only)."""
    x = _row_candidates()
    hw, tokens = x.hw, 4096.0

    def at(params, peak):
        f = 2.0 * tokens * params
        return f / (peak * gemm.efficiency(hw, f))

    fp8 = np.ravel(x.gemm_peak)[0]
    forward = backward = 0.0
    for ratio, layers in ((4, 21), (128, 20)):
        for params, bf16, passes in lt.dsv4_compressor_gemms(x.model, ratio):
            priced = at(params, fp8)
            run = at(params, gemm.bf16_peak(hw)) if bf16 else priced
            forward += layers * (run - priced)
            backward += layers * ((passes - 1) * run - 2 * priced)
    got_forward, got_backward = lt.dsv4_compressor_gemms_time(x)
    assert np.ravel(got_forward)[0] == pytest.approx(forward / 43)
    assert np.ravel(got_backward)[0] == pytest.approx(backward / 43)
    assert np.ravel(got_forward)[0] > 0 and np.ravel(got_forward + got_backward)[0] > 0


def test_compressor_gemms_without_fp8_are_the_indexer_missing_input_gradient():
    """In a BF16 recipe nothing runs slower than priced: what is left is the indexer's five GEMMs without
    their input gradient (one pass fewer than the three priced)."""
    x = _row_candidates()
    bf16 = dataclasses.replace(x, gemm_peak=np.full_like(np.asarray(x.gemm_peak, dtype=float), gemm.bf16_peak(x.hw)))
    forward, backward = lt.dsv4_compressor_gemms_time(bf16)
    indexer = sum(lt.linear_time(bf16, p, gemms=1.0) for p, _, passes in lt.dsv4_compressor_gemms(x.model, 4)
                  if passes == 2.0)
    assert np.allclose(forward, 0.0, atol=1e-15)
    assert np.allclose(backward, -indexer * 21 / 43)


def test_flashmla_key_slots_by_hand(flash):
    """Ratio 128 at 4,096 tokens: the window's 128 and all 32 compressed slots, padded to FlashMLA's
    64-key blocks: 192. Window-only: 128. Ratio 4: each query's valid keys (min(512, p // 4) + min(128, p)
    for p = 1..4096) compacted, then whole 64-key blocks: mean 525.265625 (counted by a plain loop)."""
    total = 0
    for p in range(1, 4097):
        valid = min(512, p // 4) + min(128, p)
        total += -(-valid // 64) * 64
    assert total / 4096 == 525.265625
    assert lt.dsv4_forward_key_slots(flash, 4, 4096) == pytest.approx(525.265625)
    assert lt.dsv4_forward_key_slots(flash, 128, 4096) == 192
    assert lt.dsv4_forward_key_slots(flash, 0, 4096) == 128


def test_padded_key_slots_time_by_hand():
    """The forward's extra slots over the priced keys (ratio 4: 525.27 - 512; ratio 128: 192 - 144), mean
    over the 43 decoder layers, at the attention core's priced time per FLOP; no backward."""
    x = _row_candidates()
    model = x.model
    extra = (21 * (525.265625 - 512.0) + 20 * (192 - 144)) / 43
    extra_flops = 4096 * 2.0 * 64 * extra * (512 + 512)
    core = flops.attention_core_flops(model, 1, 4096)
    forward, backward = lt.dsv4_padded_key_slots_time(x)
    assert np.ravel(forward)[0] == pytest.approx(np.ravel(lt.attention_time(x))[0] * extra_flops / core)
    assert np.all(backward == 0)
