"""Layout equivalence: a plan run in parallel against the single-process model, same seed and data.

``run_cases`` runs on every rank of one process group and trains each plan of a list for two
steps, returning the losses, the DP x CP-mean gradients of step 1 reassembled across TP (each
rank the parameters of its pipeline stage) and, for FP8, the delayed scales after step 1.
``reference`` is the plain single-device loop (full batch, ``clip_grad_norm_``, AdamW) that the
parallel result must match. Tests and ``benchmarks/`` share it; it has no pytest dependency.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autoparallel.model.fp8 import update_fp8_scales
from autoparallel.model.transformer import Transformer
from autoparallel.parallel.parallelize import ParallelModel, StepConfig, policy_for
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan


def batch(spec: ModelSpec, gbs: int, steps: int = 2, seed: int = 1) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, spec.vocab_size, (gbs, spec.seq_length + 1), generator=g)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def _scales(model) -> dict[str, torch.Tensor]:
    from autoparallel.model.fp8 import Fp8Linear
    return {n.replace(".block.", "."): m.scale.clone() for n, m in model.named_modules()
            if isinstance(m, Fp8Linear) and hasattr(m, "scale")}


def run_cases(rank: int, world: int, spec: ModelSpec, plans: list[Plan], config: StepConfig
              ) -> list[dict]:
    results = []
    for plan in plans:
        pm = ParallelModel(spec, plan, config)
        data = batch(spec, plan.gbs)
        losses, grads, scales = [], {}, {}
        for i, (tokens, targets) in enumerate(data):
            pm.optimizer.zero_grad()
            loss_sum = pm.forward_backward(tokens, targets)
            pm.sync_sequence_parallel_grads()
            if i == 0:
                grads = pm.full_tensors("grad")
            pm.optimizer.step()
            if plan.is_fp8:
                from autoparallel.parallel import fp8
                fp8.update_scales(pm.model, pm.dims.group("stage"))
                if i == 0:
                    scales = _scales(pm.model)
            losses.append(pm.global_loss(loss_sum))
        results.append({"losses": losses, "grads": grads, "scales": scales})
    return results


def reference(spec: ModelSpec, plan: Plan, config: StepConfig) -> dict:
    """The single-process model on the same batches (no parallelism, no recompute; BF16 by
    autocast over FP32 weights when ``config.bf16``)."""
    model = Transformer(spec, policy_for(plan), seed=config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95),
                            weight_decay=config.weight_decay)
    losses, grads, scales = [], {}, {}
    for i, (tokens, targets) in enumerate(batch(spec, plan.gbs)):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
            logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, spec.vocab_size), targets.reshape(-1))
        loss.backward()
        if i == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        if config.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        opt.step()
        update_fp8_scales(model)
        if i == 0 and plan.is_fp8:
            scales = _scales(model)
        losses.append(float(loss.detach()))
    return {"losses": losses, "grads": grads, "scales": scales}
