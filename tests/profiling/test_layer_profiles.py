"""Layer profiles: measured once per (device, torch, shape, recipe), then read from the store."""

import math

import pytest

from autoparallel import io
from autoparallel.profiling.layer import (LayerProfileEvaluator, context_parallel_core,
                                          layer_shape, profile_layer)
from autoparallel.profiling.store import ProfileStore, make_key
from autoparallel.specs.plan import Plan


def test_shape_is_per_rank(small):
    shape = layer_shape(small, Plan(tp=2, pp=1, dp=1, cp=1, gbs=8, mbs=4, recompute="full"))
    assert (shape["heads"], shape["groups"], shape["ffn"], shape["mbs"]) == (2, 1, 64, 4)
    key = make_key(shape, "dev")
    assert key.startswith("dev|torch") and "recompute=full" in key and "precision=bf16" in key


def test_context_parallel_layer_does_the_ranks_share_of_attention(small, monkeypatch):
    import torch
    import torch.nn.functional as F
    assert layer_shape(small, Plan(tp=1, pp=1, dp=1, cp=4, gbs=8))["cp"] == 4
    seen, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[2], k.shape[2], kw["is_causal"]))
        return real(q, k, v, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q, kv = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    assert context_parallel_core(4, gqa=True)(q, kv, kv).shape == q.shape
    # s = 32 over cp = 4: 8 local queries see s/2 = 16 keys, s^2/(2 cp) scores as in the ring
    assert seen == [(8, 16, False)]


def test_recompute_trades_saved_bytes_for_time(small):
    base = layer_shape(small, Plan(tp=1, pp=1, dp=1, gbs=8, mbs=4))
    none = profile_layer(base, steps=2, warmup=1)
    full = profile_layer({**base, "recompute": "full"}, steps=2, warmup=1)
    assert none["fwd_bwd_s"] > 0 and full["fwd_bwd_s"] > 0
    # full recompute keeps only the layer input (b*s*h BF16) and the rotary tables
    from autoparallel.model.transformer import rotary_tables
    layer_input = 2 * 4 * 32 * 64
    rotary = sum(t.nbytes for t in rotary_tables(base["seq"], base["head_dim"]))
    assert full["saved_bytes"] == layer_input + rotary
    assert none["saved_bytes"] > 5 * full["saved_bytes"]


def test_store_caches_and_evaluator_replaces_compute(small, tmp_path):
    from autoparallel.search import run
    from autoparallel.space import load_space
    hw = io.load_hardware("cpu-local")
    space = load_space("cpu-profiling").pinned(recompute="none", mbs=4)
    result = run.search(small, hw, 2, 8, space)
    store = ProfileStore(tmp_path / "profiles.json")
    evaluator = LayerProfileEvaluator(small, hw, store=store, top_k=2, steps=2, warmup=1)
    out = evaluator.evaluate(result.ranked.drop(columns=["rank"]))
    measured = out[out["measured_layer_s"].notna()]
    assert len(measured) == 2 and len(store.entries) >= 1  # --top-k 2: two layouts, no more
    from autoparallel.profiling.device import device_name
    assert set(measured["measured_device"]) == {device_name("cpu")}  # auto: no GPU here
    predicted = result.ranked.set_index(list(Plan.field_names()))["step_time_s"]
    for _, row in measured.iterrows():
        before = predicted.loc[tuple(row[n] for n in Plan.field_names())]
        assert row["step_time_s"] != pytest.approx(before)  # the estimate really changed
        assert math.isclose(row["tokens_per_s_per_gpu"],
                            8 * small.seq_length / (row["step_time_s"] * 2))
    again = ProfileStore(tmp_path / "profiles.json")  # persisted, reused without measuring
    assert again.entries == store.entries
    evaluator2 = LayerProfileEvaluator(small, hw, store=again, top_k=2)
    evaluator2.steps = 0  # would fail (median of nothing) if it measured again
    out2 = evaluator2.evaluate(result.ranked.drop(columns=["rank"]))
    assert list(out2["measured_layer_s"].dropna()) == list(measured["measured_layer_s"])


def test_two_stores_of_one_file_keep_each_others_profiles(tmp_path):
    """Two searches profiling at once: each write re-reads the file under its lock."""
    path = tmp_path / "layer_profiles.json"
    first, second = ProfileStore(path), ProfileStore(path)  # both opened before either writes
    first.put("a", {"fwd_bwd_s": 1.0})
    second.put("b", {"fwd_bwd_s": 2.0})
    assert set(ProfileStore(path).entries) == {"a", "b"}
