"""Build one rank's share of a Plan and run training steps on it.

``parallelize(spec, plan)`` builds the whole single-device model from the same seed on every rank
(so shards match the single-process model exactly), then applies the techniques in the order of
``autoparallel.parallel``'s docstring. ``ParallelModel.step`` runs one global batch through the
pipeline schedule, reduces gradients, steps the optimizer and updates FP8 scales, and returns the
global mean loss (the same on every rank). The model keeps fp32 weights and BF16 comes from
autocast, as in ``train``; the residual stream, and so every pipeline message, is BF16 under
autocast (fp32 without). Under context parallel each CP rank runs the pipeline on its
load-balanced share of every sequence (``context.local_indices``: tokens, targets and rotary
rows), and sequence parallel splits that local sequence over TP.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from autoparallel.model.recipes import Fp8Policy, recipe_from_name
from autoparallel.model.transformer import Recompute, Transformer
from autoparallel.parallel import comm, context, expert, fp8, pipeline, tensor
from autoparallel.parallel.dims import ParallelDims
from autoparallel.parallel.optimizer import DistributedOptimizer, Optimizers
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SUPPORTED_PRECISIONS = ("bf16", "fp8-delayed", "fp8-current", "fp8-blockwise")


@dataclass(frozen=True)
class StepConfig:
    """What a step does besides the layout: optimizer, clipping, autocast."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    clip: float | None = 1.0
    autocast_bf16: bool = True
    seed: int = 0


def policy_for(plan: Plan) -> Fp8Policy:
    if plan.precision not in SUPPORTED_PRECISIONS:
        raise NotImplementedError(f"precision {plan.precision!r} is not supported by the built-in "
                                  f"transformer (choose one of {', '.join(SUPPORTED_PRECISIONS)})")
    recipe = recipe_from_name(plan.precision)
    edge = plan.fp8_bf16_edge_layers if recipe is not None else 0
    return Fp8Policy(recipe, bf16_first_layers=edge, bf16_last_layers=edge)


def check_plan(spec: ModelSpec, plan: Plan, world_size: int) -> None:
    """The rules this implementation needs, as ValueError / NotImplementedError with the reason."""
    if plan.ep > 1 and not spec.is_moe:
        raise NotImplementedError(f"expert parallel (ep={plan.ep}) needs an MoE model; {spec.name} is dense")
    if plan.etp > 1:
        raise NotImplementedError("expert tensor parallel (etp > 1) is not implemented in the built-in model")
    if spec.is_moe and plan.tp > 1 and not plan.sp:
        raise ValueError("MoE with tensor parallel needs sequence parallel (each TP rank routes its own tokens)")
    if plan.num_gpus != world_size:
        raise ValueError(f"plan needs {plan.num_gpus} ranks, world size is {world_size}")
    if plan.sp and plan.tp == 1:
        raise ValueError("sequence parallel needs tp > 1")
    if plan.cp > 1 and spec.seq_length % (2 * plan.cp):
        raise ValueError(f"seq_length={spec.seq_length} is not divisible by 2*cp={2 * plan.cp} "
                         "(context parallel's load-balanced chunks)")
    if plan.sp and (spec.seq_length // plan.cp) % plan.tp:
        raise ValueError(f"seq_length/cp={spec.seq_length // plan.cp} is not divisible by "
                         f"tp={plan.tp} (SP)")
    if plan.gbs % (plan.mbs * plan.dp):
        raise ValueError(f"gbs={plan.gbs} is not divisible by mbs*dp={plan.mbs * plan.dp}")
    if plan.vp > 1 and plan.pp == 1:
        raise ValueError("vp > 1 needs pp > 1")


class ParallelModel:
    def __init__(self, spec: ModelSpec, plan: Plan, config: StepConfig = StepConfig(),
                 device: torch.device | str = "cpu") -> None:
        world = dist.get_world_size() if dist.is_initialized() else 1
        check_plan(spec, plan, world)
        self.spec, self.plan, self.config = spec, plan, config
        self.device = torch.device(device)
        self.dims = ParallelDims(plan.tp, plan.pp, plan.dp, plan.cp, plan.vp, world)
        if dist.is_initialized():
            self.dims.build_groups()
        else:
            self.dims.groups.update(tp=None, cp=None, dp=None, dp_cp=None, stage=None)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.coords = self.dims.coords(self.rank)
        # 1. the single-device model, identical on every rank
        torch.manual_seed(config.seed)
        mode = plan.recompute
        model = Transformer(spec, policy_for(plan), Recompute(mode)).to(self.device)
        # 2. recompute: full covers the first recompute_num_layers layers of each chunk (0: all)
        chunks = pipeline.chunk_layers(spec.num_layers, plan.pp, plan.vp, self.coords["pp"])
        for layers in chunks:
            for k, i in enumerate(layers):
                n = plan.recompute_num_layers or len(layers)
                model.layers[i].full_recompute = mode == "full" and k < n
        # 3. tensor + sequence parallel
        tp_group = self.dims.group("tp")
        tensor.apply_tensor_parallel(model, self.coords["tp"], plan.tp, tp_group, plan.sp)
        self.vocab_start = self.coords["tp"] * (spec.vocab_size // plan.tp)
        # 3b. expert parallel: each EP rank keeps its experts, all-to-alls to the others
        # (the expert-data-parallel group also when ep = 1: experts then replicated over TP too)
        self.expert_groups = expert.build_groups(self.dims, plan.ep) if spec.is_moe and dist.is_initialized() else {}
        if plan.ep > 1:
            expert.apply_expert_parallel(model, self.expert_groups["ep_rank"], plan.ep, self.expert_groups["ep"])
        # 4. context parallel: ring attention over the CP group in every layer
        if plan.cp > 1:
            context.apply_context_parallel(model, context.Ring(
                self.dims.group("cp"), self.dims.groups["cp_ranks"], self.coords["cp"]))
        # 5. pipeline chunks (virtual stage v = chunk * pp + pp_rank)
        stages = plan.pp * plan.vp
        self.chunks = [pipeline.Chunk(model, layers, c * plan.pp + self.coords["pp"] == 0,
                                      c * plan.pp + self.coords["pp"] == stages - 1)
                       for c, layers in enumerate(chunks)]
        self.model = model
        owned = {id(p) for chunk in self.chunks for p in chunk.parameters()}
        self.named_params = [(tensor.original_name(n), p) for n, p in model.named_parameters()
                             if id(p) in owned]
        self.sp_params = {id(p) for p in tensor.sequence_parallel_params(model) + expert.tp_replicated_params(model)}
        # 6. data (and context) parallel gradient reduction + (distributed) optimizer; expert
        # weights over their expert-data-parallel group
        dense = [p for n, p in self.named_params if not expert.is_expert_param(n)]
        experts = [p for n, p in self.named_params if expert.is_expert_param(n)]
        make = lambda params, group=None: DistributedOptimizer(  # noqa: E731
            params, self.sp_params, self.dims, self.coords, plan.distributed_optimizer, config.lr,
            config.weight_decay, config.clip, group=group)
        edp = (self.expert_groups["edp"], self.expert_groups["edp_size"], self.expert_groups["edp_rank"]) \
            if self.expert_groups else None
        self.optimizer = make(dense) if not experts else Optimizers([make(dense), make(experts, edp)])
        self.rope_cos, self.rope_sin = model.rope_cos, model.rope_sin

    # -- one step --------------------------------------------------------------------------------

    def _autocast(self):
        if not self.config.autocast_bf16:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def forward_backward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Run the schedule over this DP rank's share of the global batch (this CP rank's share of
        each sequence); returns the sum of the micro-batch losses / m on the last stage (0
        elsewhere), each the mean over this rank's tokens. Gradients accumulate in .grad."""
        plan, c = self.plan, self.coords
        per_dp = plan.gbs // plan.dp
        # this CP rank's positions of the sequence (all of it without CP)
        positions = context.local_indices(tokens.shape[1], plan.cp, c["cp"])
        dp_rows = slice(c["dp"] * per_dp, (c["dp"] + 1) * per_dp)
        tokens, targets = (t[dp_rows][:, positions].to(self.device) for t in (tokens, targets))
        cos, sin = (t[positions.to(t.device)] for t in (self.rope_cos, self.rope_sin))
        m = per_dp // plan.mbs
        seq = tokens.shape[1]
        shape = (plan.mbs, seq // plan.tp if plan.sp else seq, self.spec.hidden_size)
        stages = plan.pp * plan.vp
        act_dtype = torch.bfloat16 if self.config.autocast_bf16 else torch.float32
        p2p = pipeline.P2P(lambda pp_rank: self.dims.rank_of(c["tp"], c["cp"], c["dp"], pp_rank),
                           plan.pp, plan.vp, m)
        saved: dict[tuple[int, int], tuple] = {}
        loss_sum = torch.zeros((), device=self.device)
        for op in pipeline.schedule(plan.pp, plan.vp, c["pp"], m):
            v = op.chunk * plan.pp + c["pp"]
            chunk, mb = self.chunks[op.chunk], op.microbatch
            rows = slice(mb * plan.mbs, (mb + 1) * plan.mbs)
            if op.kind == "F":
                if v == 0:
                    inp = tokens[rows]
                else:
                    inp = p2p.recv(shape, act_dtype, self.device, v - 1, v, mb, False)
                    inp.requires_grad_(True)
                with self._autocast():
                    out = chunk(inp, cos, sin)
                if v == stages - 1:
                    out = tensor.vocab_parallel_cross_entropy(
                        out, targets[rows], self.vocab_start, self.dims.group("tp")) / m
                    loss_sum += out.detach()
                else:
                    p2p.send(out.detach(), v + 1, mb, False)
                saved[(op.chunk, mb)] = (inp, out)
            else:
                inp, out = saved.pop((op.chunk, mb))
                if v == stages - 1:
                    out.backward()
                else:
                    grad = p2p.recv(shape, act_dtype, self.device, v + 1, v, mb, True)
                    torch.autograd.backward(out, grad.to(out.dtype))
                if v > 0:
                    p2p.send(inp.grad, v - 1, mb, True)
        p2p.wait_all()
        return loss_sum

    def sync_sequence_parallel_grads(self) -> None:
        """Under SP each TP rank's norm gradients cover its sequence slice: sum them."""
        if not (self.plan.sp and self.plan.tp > 1):
            return
        for _, p in self.named_params:
            if id(p) in self.sp_params and p.grad is not None:
                dist.all_reduce(p.grad, group=self.dims.group("tp"))

    def global_loss(self, loss_sum: torch.Tensor) -> float:
        """Mean over DP and CP of the last stage's loss, on every rank (one all-reduce): every
        DP rank has as many sequences and every CP rank as many tokens."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return float(loss_sum)
        last = self.coords["pp"] == self.plan.pp - 1 and self.coords["tp"] == 0
        value = (loss_sum if last else torch.zeros_like(loss_sum)) / (self.plan.dp * self.plan.cp)
        dist.all_reduce(value)
        return float(value)

    def step(self, tokens: torch.Tensor, targets: torch.Tensor, lr: float | None = None
             ) -> float:
        self.optimizer.zero_grad()
        loss_sum = self.forward_backward(tokens, targets)
        self.sync_sequence_parallel_grads()
        self.optimizer.step(lr)
        if self.plan.is_fp8:
            fp8.update_scales(self.model, self.dims.group("stage"))
        return self.global_loss(loss_sum)

    # -- for tests and memory accounting ---------------------------------------------------------

    def full_tensors(self, which: str = "grad") -> dict[str, torch.Tensor]:
        """This rank's parameters (or DP x CP-mean gradients) reassembled across TP, by
        single-device name. Collective over the TP and DP x CP groups; PP stages each return
        their own names."""
        out = {}
        reduce = self.plan.dp * self.plan.cp
        for name, p in self.named_params:
            t = p.detach() if which == "param" else p.grad
            t = torch.zeros_like(p) if t is None else t.detach().clone()
            group = self.dims.group("dp_cp")
            if expert.is_expert_param(name) and self.expert_groups:
                group = self.expert_groups["edp"]  # the same experts; EP already summed its tokens
            if which == "grad" and dist.is_initialized() and dist.get_world_size() > 1:
                dist.all_reduce(t, group=group)
                t /= reduce
            dim = tensor.shard_dim(name)
            if dim is not None and self.plan.tp > 1:
                t = comm.all_gather_dim(t, dim, self.dims.group("tp"))
            out[name] = t.cpu()
        return out

    def model_state_bytes(self) -> int:
        """Weights and gradients (fp32 here) plus the optimizer slice this rank holds."""
        params = sum(p.numel() * p.element_size() for _, p in self.named_params)
        return 2 * params + self.optimizer.state_bytes()


def parallelize(spec: ModelSpec, plan: Plan, config: StepConfig = StepConfig(),
                device: torch.device | str = "cpu") -> ParallelModel:
    return ParallelModel(spec, plan, config, device)
