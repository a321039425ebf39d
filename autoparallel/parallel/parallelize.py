"""Build one rank's share of a Plan and run training steps on it.

``parallelize(spec, plan)`` builds the single-device model on the meta device (nothing
allocated), applies the techniques in the order of ``autoparallel.parallel``'s docstring, and only
then materialises the rank's own share: the parameters of its pipeline chunks, each TP-sharded
(``tensor.shard_region``), written straight into one flat buffer with exactly the values the
single-process model with the same seed has (``transformer.write_init``). A rank never holds
the whole model, and a job starts in seconds.

Model states are kept as Megatron-LM keeps them with ``--bf16``: weights in BF16 (no autocast,
so no per-step BF16 copies of FP32 weights), gradients accumulated in an FP32 buffer, FP32 master
weights and Adam moments in the (distributed) optimizer. ``StepConfig(bf16=False)`` keeps every
tensor in FP32 instead (the exact equivalence tests). ``ParallelModel.step`` runs one global
batch through the pipeline schedule, reduces gradients, steps the optimizer and updates FP8
scales, and returns the global mean loss (the same on every rank). The residual stream, and so
every pipeline message, is in the training dtype. Under context parallel each CP rank runs the
pipeline on its load-balanced share of every sequence (``context.local_indices``: tokens,
targets and rotary rows), and sequence parallel splits that local sequence over TP.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from autoparallel.model.fp8 import weight_cache_bytes
from autoparallel.model.recipes import Fp8Policy, recipe_from_name
from autoparallel.model.moe import is_routed_expert
from autoparallel.model.transformer import (Recompute, Transformer, check_spec, reset_buffers,
                                            rotary_tables, write_init)
from autoparallel.parallel import comm, context, expert, fp8, pipeline, tensor
from autoparallel.parallel.buffers import ParamBuffers
from autoparallel.parallel.dims import ParallelDims
from autoparallel.parallel.optimizer import DistributedOptimizer, Optimizers
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

SUPPORTED_PRECISIONS = ("bf16", "fp8-delayed", "fp8-current", "fp8-blockwise")


@dataclass(frozen=True)
class StepConfig:
    """What a step does besides the layout: optimizer, clipping, training dtype."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    clip: float | None = 1.0
    bf16: bool = True  # BF16 weights and activations (FP32 main grads / master / moments)
    seed: int = 0

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32


def policy_for(plan: Plan) -> Fp8Policy:
    if plan.precision not in SUPPORTED_PRECISIONS:
        raise NotImplementedError(f"precision {plan.precision!r} is not supported by the built-in "
                                  f"transformer (choose one of {', '.join(SUPPORTED_PRECISIONS)})")
    recipe = recipe_from_name(plan.precision)
    edge = plan.fp8_bf16_edge_layers if recipe is not None else 0
    return Fp8Policy(recipe, bf16_first_layers=edge, bf16_last_layers=edge)


def check_plan(spec: ModelSpec, plan: Plan, world_size: int) -> None:
    """The rules this implementation needs, as ValueError / NotImplementedError with the reason."""
    check_spec(spec)
    if plan.ep > 1 and not spec.is_moe:
        raise NotImplementedError(f"expert parallel (ep={plan.ep}) needs an MoE model; "
                                  f"{spec.name} is dense")
    if plan.etp > 1:
        raise NotImplementedError(f"expert tensor parallel (etp={plan.etp}) is not implemented "
                                  "in the built-in transformer; use etp=1")
    if spec.is_moe and spec.num_experts % plan.ep:
        raise ValueError(f"ep={plan.ep} does not divide num_experts={spec.num_experts}")
    ParallelDims(plan.tp, plan.pp, plan.dp, plan.cp, plan.vp, plan.num_gpus, plan.ep)  # degrees
    if spec.is_moe and plan.tp > 1 and not plan.sp:
        raise ValueError("MoE with tensor parallel needs sequence parallel (each TP rank routes "
                         "its own tokens, as in Megatron-LM)")
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
    _check_even_split_and_core_attn(plan)


def _check_even_split_and_core_attn(plan: Plan) -> None:
    """The plan fields this implementation would ignore, refused: it splits the layers evenly
    (``pipeline.chunk_layers``) and selective recompute reruns the attention core only, so a plan
    with a layout string, uneven stages or other recompute modules was measured as another one."""
    uneven = {"pipeline_model_parallel_layout": plan.pipeline_model_parallel_layout,
              "num_layers_in_first_pipeline_stage": plan.num_layers_in_first_pipeline_stage,
              "num_layers_in_last_pipeline_stage": plan.num_layers_in_last_pipeline_stage,
              "account_for_embedding_in_pipeline_split": plan.account_for_embedding_in_pipeline_split,
              "account_for_loss_in_pipeline_split": plan.account_for_loss_in_pipeline_split}
    if given := [f"{name}={value!r}" for name, value in uneven.items() if value]:
        raise NotImplementedError(f"{', '.join(given)}: the built-in transformer splits the layers evenly over "
                                  "pp*vp stages (use --trainer megatron for an uneven split)")
    if plan.recompute == "selective" and plan.recompute_modules != "core_attn":
        raise NotImplementedError(f"selective recompute of {plan.recompute_modules!r}: the built-in transformer "
                                  "recomputes the attention core only (recompute_modules core_attn)")


class ParallelModel:
    def __init__(self, spec: ModelSpec, plan: Plan, config: StepConfig = StepConfig(),
                 device: torch.device | str = "cpu") -> None:
        """This rank's share of ``plan``, built in the order of ``autoparallel.parallel``'s
        docstring: the process groups, the whole model on the meta device with every technique
        applied, this rank's pipeline chunks, and only then this rank's parameters materialised
        (so a rank never holds the whole model), and the optimizer over them."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        check_plan(spec, plan, world)
        self.spec, self.plan, self.config = spec, plan, config
        self.device = torch.device(device)
        self._join_groups(world)
        self.model, full_shapes, chunks = self._meta_model()
        self.chunks = self._pipeline_chunks(chunks)
        self._materialise_parameters(full_shapes)
        self._materialise_buffers()
        self.optimizer = self._optimizer()

    def _join_groups(self, world: int) -> None:
        """The TP / PP / DP / CP (and, for MoE, expert) groups and this rank's coordinates in
        them; without torch.distributed every group is None and one process runs the plan."""
        plan = self.plan
        self.dims = ParallelDims(plan.tp, plan.pp, plan.dp, plan.cp, plan.vp, world, plan.ep)
        if dist.is_initialized():
            self.dims.build_groups()
            if self.spec.is_moe:
                self.dims.build_expert_groups()
        else:
            self.dims.groups.update(tp=None, cp=None, dp=None, dp_cp=None, stage=None, ep=None,
                                    edp=None)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.coords = self.dims.coords(self.rank)

    def _meta_model(self) -> tuple[Transformer, dict[str, tuple[int, ...]], list[list[int]]]:
        """The single-device model on the meta device (nothing allocated) with recompute, tensor
        + sequence, expert and context parallel applied; with its unsharded parameter shapes
        (each shard is initialised from its region of them) and this rank's chunks' layers."""
        spec, plan = self.spec, self.plan
        mode = plan.recompute
        model = Transformer(spec, policy_for(plan), Recompute(mode), device="meta")
        full_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        # recompute: full covers the first recompute_num_layers layers of each chunk (0: all)
        chunks = pipeline.chunk_layers(spec.num_layers, plan.pp, plan.vp, self.coords["pp"])
        for layers in chunks:
            for k, i in enumerate(layers):
                n = plan.recompute_num_layers or len(layers)
                model.layers[i].full_recompute = mode == "full" and k < n
        tp_group = self.dims.group("tp")
        tensor.apply_tensor_parallel(model, self.coords["tp"], plan.tp, tp_group, plan.sp)
        self.vocab_start = self.coords["tp"] * (spec.vocab_size // plan.tp)
        # expert parallel: each EP rank keeps its experts, all-to-alls to the others
        if plan.ep > 1:
            expert.apply_expert_parallel(model, self.dims.expert_coords(self.rank)["ep"],
                                         plan.ep, self.dims.group("ep"))
        # context parallel: ring attention over the CP group in every layer
        if plan.cp > 1:
            context.apply_context_parallel(model, context.Ring(
                self.dims.group("cp"), self.dims.groups["cp_ranks"], self.coords["cp"]))
        return model, full_shapes, chunks

    def _pipeline_chunks(self, chunks: list[list[int]]) -> list[pipeline.Chunk]:
        """This rank's pipeline chunks (virtual stage v = chunk * pp + pp_rank), the first and
        last virtual stages holding the embedding and the loss."""
        plan, stages = self.plan, self.plan.pp * self.plan.vp
        return [pipeline.Chunk(self.model, layers, c * plan.pp + self.coords["pp"] == 0,
                               c * plan.pp + self.coords["pp"] == stages - 1)
                for c, layers in enumerate(chunks)]

    def _materialise_parameters(self, full_shapes: dict[str, tuple[int, ...]]) -> None:
        """This rank's parameters, as views of one flat buffer in the training dtype (routed
        experts in a second one, reduced over their expert-data-parallel group), each filled
        with its region of the single-process model's values; padded to the shard count the
        distributed optimizer splits them into."""
        plan, config = self.plan, self.config
        owned = {id(p) for chunk in self.chunks for p in chunk.parameters()}
        named = [(tensor.original_name(n), p) for n, p in self.model.named_parameters()
                 if id(p) in owned]
        dense = [(n, p) for n, p in named if not is_routed_expert(n)]
        experts = [(n, p) for n, p in named if is_routed_expert(n)]
        shards = plan.dp * plan.cp if plan.distributed_optimizer else 1
        self.buffers = ParamBuffers(self.model, dense, config.dtype, self.device, pad_to=shards)
        self.expert_buffers = ParamBuffers(
            self.model, experts, config.dtype, self.device,
            pad_to=plan.expert_data_parallel if plan.distributed_optimizer else 1) if experts else None
        self.named_params = self.buffers.named + (self.expert_buffers.named if experts else [])
        for name, p in self.named_params:
            rows, cols = tensor.shard_region(name, full_shapes[name], self.coords["tp"],
                                             plan.tp, self.spec.gated_mlp)
            write_init(p, name, full_shapes[name], self.spec, config.seed, rows, cols)

    def _materialise_buffers(self) -> None:
        """The chunks' module buffers still on the meta device (FP8 scales, amax histories),
        reset on this device, and the rotary tables of the whole sequence."""
        for chunk in self.chunks:
            for m in chunk.modules():
                for key, b in list(m._buffers.items()):
                    if b is not None and b.is_meta:
                        m._buffers[key] = torch.empty_like(b, device=self.device)
            reset_buffers(chunk)
        cos, sin = rotary_tables(self.spec.seq_length, self.spec.head_dim)
        self.rope_cos, self.rope_sin = cos.to(self.device), sin.to(self.device)

    def _optimizer(self) -> DistributedOptimizer | Optimizers:
        """Data (and context) parallel gradient reduction and the (distributed) optimizer; routed
        experts over their expert-data-parallel group, with one global clipping norm."""
        plan, config = self.plan, self.config
        self.sp_params = {id(p) for p in tensor.sequence_parallel_params(self.model)}

        def optimizer(buffers, group=None):
            return DistributedOptimizer(buffers, self.sp_params, self.dims, self.coords,
                                        plan.distributed_optimizer, config.lr,
                                        config.weight_decay, config.clip, group=group)
        dense = optimizer(self.buffers)
        if self.expert_buffers is None:
            return dense
        group = (self.dims.group("edp"), plan.expert_data_parallel,
                 self.dims.expert_coords(self.rank)["edp"])
        return Optimizers([dense, optimizer(self.expert_buffers, group)])

    # -- one step --------------------------------------------------------------------------------

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
        act_dtype = self.config.dtype
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
        """Under SP each TP rank's norm (and router) gradients cover its sequence slice: sum
        them."""
        if not (self.plan.sp and self.plan.tp > 1):
            return
        for _, p in self.named_params:
            if id(p) in self.sp_params:
                dist.all_reduce(p.main_grad, group=self.dims.group("tp"))

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
        self.update_fp8_scales()
        return self.global_loss(loss_sum)

    def update_fp8_scales(self) -> None:
        """New delayed scales from this step's amaxes, reduced over the ranks holding the same
        layers (``parallel.fp8``)."""
        if self.plan.is_fp8:
            experts = self.dims.group("edp") if self.plan.ep > 1 else None
            fp8.update_scales(self.model, self.dims.group("stage"), experts)

    # -- for tests and memory accounting ---------------------------------------------------------

    def full_tensors(self, which: str = "grad") -> dict[str, torch.Tensor]:
        """This rank's parameters (or DP x CP-mean gradients) in FP32, reassembled across TP, by
        single-device name. Collective over the TP, DP x CP and expert-data-parallel groups; PP
        stages and EP ranks each return their own names."""
        out = {}
        reduce = self.plan.dp * self.plan.cp
        tp, gated = self.plan.tp, self.spec.gated_mlp
        for name, p in self.named_params:
            t = (p.detach() if which == "param" else p.main_grad).float().clone()
            if which == "grad":
                group, size = ((self.dims.group("edp"), self.plan.expert_data_parallel)
                               if is_routed_expert(name) else (self.dims.group("dp_cp"), reduce))
                if size > 1:
                    dist.all_reduce(t, group=group)
                t /= reduce
            if tensor.shard_dim(name) is not None and tp > 1:
                parts = comm.all_gather_dim(t.unsqueeze(0), 0, self.dims.group("tp"))
                full = torch.empty(self.full_shape(name), dtype=t.dtype, device=t.device)
                for rank, part in enumerate(parts):
                    region = tensor.shard_region(name, full.shape, rank, tp, gated)
                    tensor.put_region(full, region, part)
                t = full
            out[name] = t.cpu()
        return out

    def full_shape(self, name: str) -> tuple[int, ...]:
        shape = dict(self.named_params)[name].shape
        dim = tensor.shard_dim(name)
        if dim is None or self.plan.tp == 1:
            return tuple(shape)
        return tuple(s * self.plan.tp if d == dim else s for d, s in enumerate(shape))

    def model_state_bytes(self) -> int:
        """Weights and FP32 gradients (the flat buffers), the optimizer slice this rank holds
        and the FP8 weight copies of the current step."""
        experts = self.expert_buffers.nbytes() if self.expert_buffers is not None else 0
        return (self.buffers.nbytes() + experts + self.optimizer.state_bytes()
                + weight_cache_bytes(self.model))


def parallelize(spec: ModelSpec, plan: Plan, config: StepConfig = StepConfig(),
                device: torch.device | str = "cpu") -> ParallelModel:
    return ParallelModel(spec, plan, config, device)
