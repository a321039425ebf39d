"""Layer profiles: one transformer layer at a plan's per-rank shape, forward + backward, timed.

The shape one rank computes: micro-batch ``mbs``, sequence ``seq/cp``, hidden ``h``, attention
heads and query groups divided by ``tp``, FFN width divided by ``tp``, and under context parallel
the rank's share of the attention (``context_parallel_core``). The TP and CP communication is
not in it; the cost model keeps predicting that. Recompute and precision are applied as the
job would (selective: attention core recomputed; full: the whole layer), with BF16 weights and
activations as a Megatron-LM layer runs (no autocast). FP8 layers are timed in their steady
state: scales initialised, and the weight's FP8 copies cast once per optimizer step, so not in
the per-micro-batch time. On a GPU (``device`` "auto" picks one when torch sees it) the layer is
timed with CUDA synchronisation around each step. Results live in a ``ProfileStore`` keyed by
the measuring device's name, torch version, shape and recipe, and say which device measured.

``LayerProfileEvaluator`` is the cost model with the per-layer compute replaced by measured
numbers (``search --profile layer``): the predicted layer part of the step (compute, recompute
and FP8 casts of the transformer layers, in the pipeline stages and the bubble) is scaled to the
measured one; the logits layer, communication and optimizer stay predicted.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pandas as pd

from autoparallel.costmodel import flops
from autoparallel.profiling.store import ProfileStore, make_key
from autoparallel.search.evaluators import CostModelEvaluator
from autoparallel.space import row_to_plan
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan


def layer_shape(model: ModelSpec, plan: Plan) -> dict:
    return {"hidden": model.hidden_size, "ffn": model.ffn_hidden_size // plan.tp,
            "heads": model.num_attention_heads // plan.tp,
            "groups": max(model.query_groups // plan.tp, 1), "head_dim": model.head_dim,
            "seq": model.seq_length // plan.cp, "cp": plan.cp, "mbs": plan.mbs, "activation": model.activation,
            "norm": model.normalization, "recompute": plan.recompute,
            "precision": plan.precision}


def context_parallel_core(cp: int, gqa: bool):
    """One CP rank's attention work, without the ring: its ``s/cp`` local queries against
    ``s/2`` keys, non-causal. That is the rank's share of the load-balanced causal triangle
    (s²/(2·cp) scores; plain causal attention over the local tokens would be cp times less).
    The ring's K/V traffic is communication, which the cost model keeps predicting."""
    import math

    import torch
    import torch.nn.functional as F

    def core(q, k, v):
        keys = k.shape[2] * cp // 2
        repeats = math.ceil(cp / 2)
        k, v = (torch.cat([t] * repeats, dim=2)[:, :, :keys] for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=gqa)
    return core


def make_layer(shape: dict, device: str = "cpu", compile: bool = False):
    """One layer of ``shape`` on ``device`` with BF16 weights, its inputs and an output
    gradient, past its first step (FP8 scales initialised, weights cast for the step).

    Returns (run, layer, x, dy, cos, sin): ``run(x, cos, sin)`` is the layer, or
    ``torch.compile`` of it with ``compile`` on a GPU (on CPU the eager layer).
    """
    import torch

    from autoparallel.model.fp8 import update_fp8_scales
    from autoparallel.model.transformer import (Recompute, TransformerLayer, cast_parameters,
                                                rotary_tables)
    from autoparallel.parallel.parallelize import policy_for
    spec = ModelSpec(name="layer", num_layers=1, hidden_size=shape["hidden"],
                     ffn_hidden_size=shape["ffn"], num_attention_heads=shape["heads"],
                     num_query_groups=shape["groups"], kv_channels=shape["head_dim"],
                     vocab_size=8, seq_length=shape["seq"], activation=shape["activation"],
                     normalization=shape["norm"])
    plan = Plan(tp=1, pp=1, dp=1, gbs=1, precision=shape["precision"])
    torch.manual_seed(0)
    with torch.device(device):
        layer = TransformerLayer(spec, policy_for(plan), 0, Recompute(shape["recompute"]))
    cast_parameters(layer, torch.bfloat16)
    if shape.get("cp", 1) > 1:
        gqa = spec.query_groups != spec.num_attention_heads
        layer.attention.core = context_parallel_core(shape["cp"], gqa)
    cos, sin = (t.to(device) for t in rotary_tables(shape["seq"], shape["head_dim"]))
    size = (shape["mbs"], shape["seq"], shape["hidden"])
    x = torch.randn(*size, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(*size, device=device, dtype=torch.bfloat16)
    run = torch.compile(layer) if compile and str(device).startswith("cuda") else layer
    torch.autograd.backward(run(x, cos, sin), dy)  # FP8: first step scales from the tensors
    update_fp8_scales(layer)                        # ... then runs on delayed scales
    return run, layer, x, dy, cos, sin


def profile_layer(shape: dict, steps: int = 10, warmup: int = 3, device: str = "cpu",
                  threads: int | None = 1, compile: bool = False) -> dict:
    """Median fwd+bwd seconds and saved-for-backward bytes of one layer of ``shape``.

    On CPU ``threads`` intra-op threads (one, like a profiling rank); None leaves torch's.
    ``compile``: time ``torch.compile`` of the layer (GPU only; on CPU the eager layer runs).
    """
    import torch
    if threads is not None and not device.startswith("cuda"):
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return profile_layer(shape, steps, warmup, device, None, compile)
        finally:
            torch.set_num_threads(previous)

    from autoparallel.profiling.device import device_name
    from autoparallel.profiling.memory import SavedTensors
    run, _, x, dy, cos, sin = make_layer(shape, device, compile)
    cuda = device.startswith("cuda")
    times, saved = [], 0
    for i in range(warmup + steps):
        tracker = SavedTensors()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with tracker:
            y = run(x, cos, sin)
        torch.autograd.backward(y, dy)
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        saved = max(saved, tracker.peak)
    out = {"fwd_bwd_s": statistics.median(times), "saved_bytes": saved,
           "device": device_name(device)}
    if cuda:
        out["steady_s"] = back_to_back_s(lambda: torch.autograd.backward(run(x, cos, sin), dy),
                                          steps)
    return out


def back_to_back_s(step, steps: int) -> float:
    """Seconds per step of ``steps`` steps issued back to back, timed with CUDA events: the
    layer as it runs inside a training step, where the host launches ahead of the GPU and only
    the step's first layer waits for launches. ``fwd_bwd_s`` times each step alone (synchronised
    before and after), so it adds the host's launch latency at its start to every layer."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / steps


def predicted_layer_s(model: ModelSpec, plan: Plan, row) -> tuple[float, float, float]:
    """The cost model's time for one layer's forward + backward of one micro-batch, from a
    predicted row: (one layer, all the stage's layers of the step, the layers' share of the
    compute). The layer part is the compute, recompute and FP8 casts of the transformer layers;
    the logits layer's share of the compute is left out."""
    m, lps = row["num_microbatches"], model.num_layers / plan.pp
    layer_flops = flops.linear_flops_per_token(model)
    logit_flops = model.hidden_size * model.vocab_size * 2.0 / lps
    share = layer_flops / (layer_flops + logit_flops)
    layers = row["compute_s"] * share + row["recompute_s"] + row["fp8_cast_s"]
    return layers / (m * lps), layers, share


def layer_seconds(entry: dict) -> float:
    """A profile's layer time as it runs inside a step: back to back on a GPU (``steady_s``),
    else (CPU, or a store written before ``steady_s`` existed) each step alone."""
    return entry.get("steady_s", entry["fwd_bwd_s"])


class LayerProfileEvaluator:
    """The cost model with measured layer compute (profiles cached in ``store``)."""

    def __init__(self, model: ModelSpec, hw, memory_fraction: float = 1.0,
                 store: ProfileStore | None = None, top_k: int | None = None,
                 steps: int = 10, warmup: int = 3, device: str = "auto") -> None:
        from autoparallel.profiling.device import device_name, resolve_device
        self.model, self.hw, self.memory_fraction = model, hw, memory_fraction
        self.store = store or ProfileStore()
        self.top_k, self.steps, self.warmup = top_k, steps, warmup
        self.device = resolve_device(device)
        self.device_name = device_name(self.device)

    def measure(self, plan: Plan) -> dict:
        """The layer profile of ``plan``'s per-rank shape, from the store or measured now."""
        shape = layer_shape(self.model, plan)
        key = make_key(shape, self.device_name)
        entry = self.store.get(key)
        if entry is None:
            entry = profile_layer(shape, self.steps, self.warmup, self.device)
            self.store.put(key, entry)
        return entry

    def measured_layer_s(self, plan: Plan) -> float:
        return layer_seconds(self.measure(plan))

    def evaluate(self, candidates: pd.DataFrame) -> pd.DataFrame:
        out = CostModelEvaluator(self.model, self.hw, self.memory_fraction).evaluate(candidates)
        out["measured_layer_s"] = np.nan
        out["measured_device"] = ""
        rows = out.index[out["fits"].to_numpy(dtype=bool)]
        if self.top_k is not None:
            rows = out.loc[rows].sort_values("tokens_per_s_per_gpu", ascending=False).index[
                :self.top_k]
        for i in rows:
            row = out.loc[i]
            plan = row_to_plan(row)
            try:
                entry = self.measure(plan)
            except Exception as exc:  # noqa: BLE001 - an OOM or unsupported recipe is a reason
                if "measurement_error" not in out:
                    out["measurement_error"] = ""
                out.at[i, "measurement_error"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            measured = layer_seconds(entry)
            out.at[i, "measured_device"] = entry.get("device", self.device_name)
            predicted_one, predicted_layers, share = predicted_layer_s(self.model, plan, row)
            ratio = measured / predicted_one
            step = (row["step_time_s"] + (ratio - 1.0) * predicted_layers
                    + (ratio - 1.0) * row["bubble_s"] * share)
            out.at[i, "measured_layer_s"] = measured
            out.at[i, "step_time_s"] = step
            out.at[i, "tokens_per_s_per_gpu"] = plan.gbs * self.model.seq_length / (
                step * plan.num_gpus)
        return out

