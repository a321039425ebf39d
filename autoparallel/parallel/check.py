"""Layout equivalence: a plan run in parallel against the single-process model, same seed and data.

``run_cases`` runs on every rank of one process group and trains each plan of a list for two
steps, returning the losses, the global gradient norms the optimizer clipped by, the DP x
CP-mean gradients of step 1 reassembled across TP (each rank the parameters of its pipeline
stage) and, for FP8, the delayed scales after step 1; ``run_layouts`` runs the plans of each
world size in one spawned process group.
``reference`` is the plain single-device loop (full batch, ``clip_grad_norm_``, AdamW) that the
parallel result must match; ``mismatches`` compares the two. Tests and ``benchmarks/``
share it; it has no pytest dependency.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autoparallel.model.fp8 import update_fp8_scales
from autoparallel.model.transformer import Transformer
from autoparallel.parallel.parallelize import ParallelModel, StepConfig, policy_for
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan


# Relative tolerances of ``mismatches`` (why each: tests/parallel/test_equivalence.py).
TOLERANCES = {"ranks_loss": 1e-6, "loss": 1e-5, "grad": 1e-4, "fp8_loss": 2e-2,
              "fp8_weight_scale": 1e-3, "fp8_activation_scale": 0.15}


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
        losses, norms, grads, scales = [], [], {}, {}
        for i, (tokens, targets) in enumerate(data):
            pm.optimizer.zero_grad()
            loss_sum = pm.forward_backward(tokens, targets)
            pm.sync_sequence_parallel_grads()
            if i == 0:
                grads = pm.full_tensors("grad")
            norms.append(float(pm.optimizer.step()))
            pm.update_fp8_scales()
            if plan.is_fp8 and i == 0:
                scales = _scales(pm.model)
            losses.append(pm.global_loss(loss_sum))
        results.append({"losses": losses, "norms": norms, "grads": grads, "scales": scales})
    return results


def run_layouts(spec: ModelSpec, layouts: dict[int, list[Plan]], config: StepConfig,
                timeout: float = 240.0) -> dict[int, list[list[dict]]]:
    """``run_cases`` of each world size's plans: per world size, per rank, per plan."""
    from autoparallel.parallel import spawn
    out = {}
    for world, plans in layouts.items():
        result = spawn.run(run_cases, world, (spec, plans, config), timeout=timeout)
        if not result.ok:
            raise RuntimeError(f"layouts on {world} ranks: {result.reason}")
        out[world] = result.values
    return out


def layout_name(plan: Plan) -> str:
    """A short id of the knobs the equivalence tests vary."""
    text = f"tp{plan.tp}-pp{plan.pp}-vp{plan.vp}-cp{plan.cp}-dp{plan.dp}"
    text += (f"-ep{plan.ep}" if plan.ep > 1 else "") + f"-mbs{plan.mbs}"
    text += "-sp" if plan.sp else ""
    text += f"-{plan.recompute}" if plan.recompute != "none" else ""
    text += "" if plan.distributed_optimizer else "-allreduce"
    return text + (f"-{plan.precision}" if plan.is_fp8 else "")


def gradient_errors(values: list[dict], ref: dict) -> dict[str, float]:
    """Per parameter, the largest difference between the ranks' step-1 gradient (merged over
    pipeline stages and EP ranks) and the single-process one, relative to the latter's largest
    entry; inf for a parameter only one side has."""
    merged = {}
    for v in values:
        merged.update(v["grads"])
    grads = ref["grads"]
    return {name: float((merged[name] - grads[name]).abs().max() / grads[name].abs().max())
            if name in merged and name in grads else float("inf")
            for name in set(merged) | set(grads)}


def _rel(got, want) -> float:
    """Largest |got - want| / |want| over the entries."""
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    return float(((got - want).abs() / want.abs()).max())


def mismatches(plan: Plan, values: list[dict], ref: dict) -> list[str]:
    """What differs beyond ``TOLERANCES`` between the ranks' ``run_cases`` results of ``plan``
    and the single-process ``reference``; empty when the layout trains like one process."""
    t, out = TOLERANCES, []
    losses = values[0]["losses"]
    if any(_rel(v["losses"], losses) > t["ranks_loss"] for v in values):
        out.append(f"ranks report different losses: {[v['losses'] for v in values]}")
    if plan.is_fp8:
        if _rel(losses, ref["losses"]) > t["fp8_loss"]:
            out.append(f"losses {losses} vs {ref['losses']}")
        if not ref["scales"]:
            out.append("the reference has no FP8 scales")
        for v in values:
            for name, scale in v["scales"].items():
                want = ref["scales"][name]
                # weight scales: the same tensor's amax; input and grad_output scales differ by
                # the FP8 rounding upstream in step 1 (shard-wise first casts): looser bound
                if _rel(scale[1], want[1]) > t["fp8_weight_scale"]:
                    out.append(f"{name}: weight scale {float(scale[1])} vs {float(want[1])}")
                # each DP (and CP) rank's loss is the mean over its own tokens (DP x CP
                # averages the gradients afterwards), so its output gradients, and their amax,
                # are dp*cp times the single-process ones
                scale = scale * torch.tensor([1.0, 1.0, plan.dp * plan.cp])
                if _rel(scale, want) > t["fp8_activation_scale"]:
                    out.append(f"{name}: scales {scale.tolist()} vs {want.tolist()}")
        return out
    if _rel(losses, ref["losses"]) > t["loss"]:
        out.append(f"losses {losses} vs {ref['losses']}")
    if _rel(values[0]["norms"], ref["norms"]) > t["loss"]:  # the norm clipping used
        out.append(f"gradient norms {values[0]['norms']} vs {ref['norms']}")
    out += [f"{name}: gradient error {err:.2e}"
            for name, err in sorted(gradient_errors(values, ref).items()) if err > t["grad"]]
    return out


def reference(spec: ModelSpec, plan: Plan, config: StepConfig) -> dict:
    """The single-process model on the same batches (no parallelism, no recompute; BF16 by
    autocast over FP32 weights when ``config.bf16``)."""
    model = Transformer(spec, policy_for(plan), seed=config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95),
                            weight_decay=config.weight_decay)
    losses, norms, grads, scales = [], [], {}, {}
    for i, (tokens, targets) in enumerate(batch(spec, plan.gbs)):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
            logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, spec.vocab_size), targets.reshape(-1))
        loss.backward()
        if i == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        norms.append(float(torch.nn.utils.clip_grad_norm_(
            model.parameters(), config.clip if config.clip is not None else float("inf"))))
        opt.step()
        update_fp8_scales(model)
        if i == 0 and plan.is_fp8:
            scales = _scales(model)
        losses.append(float(loss.detach()))
    return {"losses": losses, "norms": norms, "grads": grads, "scales": scales}
