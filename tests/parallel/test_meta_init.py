"""A rank allocates only its share of the model, and that share has the single-process values.

Each rank builds its ``ParallelModel`` under torch's profiler with memory recording: the live
bytes at their peak during the build are the rank's persistent states (flat BF16 weights, FP32
gradients, FP32 master weights) plus at most one initialisation tile, never a whole model (the
old build held the full FP32 model on every rank, 4 bytes per parameter of the whole model).
"""

import pytest
import torch

from autoparallel.parallel import spawn
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SPEC = ModelSpec(name="meta", num_layers=4, hidden_size=256, ffn_hidden_size=1024,
                 num_attention_heads=8, num_query_groups=4, vocab_size=4096, seq_length=32,
                 activation="swiglu", normalization="rmsnorm")
PLANS = [Plan(tp=2, pp=1, dp=1, gbs=4, sp=True, precision="fp8-delayed"),
         Plan(tp=1, pp=2, dp=1, gbs=4), Plan(tp=1, pp=1, dp=2, gbs=4)]


def _peak_live_bytes(prof) -> int:
    """Peak of live CPU bytes from the profiler's allocation (op) and free ([memory]) records."""
    events = sorted(prof.profiler.function_events, key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage if e.name != "[memory]" else e.cpu_memory_usage
        peak = max(peak, live)
    return peak


def _build(rank: int, world: int, spec: ModelSpec, plans: list[Plan]) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from autoparallel.parallel.parallelize import ParallelModel, StepConfig
    out = []
    for plan in plans:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            pm = ParallelModel(spec, plan, StepConfig(bf16=True, seed=3))
        out.append({
            "peak": _peak_live_bytes(prof),
            # what the build keeps: flat weights and gradients, FP32 master and, sharded, the
            # reduce-scatter output (the Adam moments come with the first step)
            "states": pm.buffers.nbytes() + pm.optimizer.master.nbytes
            + (pm.optimizer.grad.nbytes if pm.optimizer.sharded else 0),
            "owned": sum(p.numel() for _, p in pm.named_params),
            "meta": sum(p.numel() for p in pm.model.parameters() if p.is_meta),
            "params": pm.full_tensors("param"),
        })
    return out


@pytest.fixture(scope="module")
def built():
    result = spawn.run(_build, 2, (SPEC, PLANS), timeout=240)
    assert result.ok, result.reason
    return result.values


@pytest.mark.parametrize("k", range(len(PLANS)), ids=["tp2-sp-fp8", "pp2", "dp2"])
def test_a_rank_allocates_only_its_share(built, k):
    from autoparallel.model.transformer import INIT_TILE, Transformer
    full = sum(p.numel() for p in Transformer(SPEC, device="meta").parameters())
    tile = INIT_TILE * min(INIT_TILE, SPEC.vocab_size) * 4  # the largest tile drawn here
    for rank in built:
        r = rank[k]
        if PLANS[k].dp == 1:  # TP and PP split the parameters
            assert r["owned"] < 0.6 * full
        assert r["states"] <= r["peak"] <= r["states"] + tile + 2**20, (r["peak"], r["states"])
    if PLANS[k].pp > 1:  # the other stage's layers were never materialised
        assert all(rank[k]["meta"] > 0 for rank in built)


@pytest.mark.parametrize("k", range(len(PLANS)), ids=["tp2-sp-fp8", "pp2", "dp2"])
def test_shards_hold_the_single_process_values(built, k):
    from autoparallel.model.transformer import Transformer
    from autoparallel.parallel.parallelize import policy_for
    ref = dict(Transformer(SPEC, policy_for(PLANS[k]), seed=3).named_parameters())
    merged = {}
    for rank in built:
        merged.update(rank[k]["params"])
    assert set(merged) == set(ref)
    for name, value in merged.items():
        assert torch.equal(value, ref[name].detach().to(torch.bfloat16).float()), name


def test_seeded_initial_values_are_pinned():
    """The values themselves, not only their agreement across layouts: a 2 x 4 region across a
    tile boundary of a residual output projection (std 0.02/sqrt(2L)), seed 3, written in BF16 as
    a job writes its flat buffer. A faster build must not change them."""
    from autoparallel.model.transformer import write_init
    dest = torch.empty(2, 4, dtype=torch.bfloat16)
    write_init(dest, "layers.1.w2.weight", (2048, 2048), SPEC, 3, rows=(range(1022, 1024),),
               cols=range(1022, 1026))
    assert dest.float().flatten().tolist() == [
        0.00848388671875, -0.01470947265625, -0.00848388671875, 0.005828857421875,
        0.005615234375, 0.0031280517578125, -0.001678466796875, -1.0788440704345703e-05]
