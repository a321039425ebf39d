"""A GPT-style decoder built from a ModelSpec, free of parallel code.

Pre-norm layers (RMSNorm or LayerNorm), GQA attention through ``scaled_dot_product_attention``
with rotary positions, a gelu / swiglu / squared_relu MLP or, in the layers ``moe_layer_freq``
names, a mixture-of-experts MLP (``autoparallel.model.moe``), tied or untied embeddings. Module
names follow torchtitan (``layers.{i}.attention.wo``, ``layers.{i}.mlp.w2``...), with the
projections that read the same input fused as Megatron-LM fuses them: ``attention.wqkv`` (Q, K
and V, laid out group by group: the query heads of a KV group, then its K, then its V, so a
tensor-parallel shard is a contiguous block of rows) and, for SwiGLU, ``mlp.w1`` holding the
gate and the up projection ([gate; up]). One GEMM and, in FP8, one cast of the input instead of
three or two. Every projection is a plain ``nn.Linear`` or an ``Fp8Linear`` with the same
``weight`` shape, so the later tensor / pipeline / data parallel wrappers can replace or shard
them from outside. The FP8 policy and the recompute choice are constructor arguments, never
global state.

The model is built on the meta device and then materialised (``Transformer(..., device=...)``,
or ``device="meta"`` to shard first and materialise only a rank's share). Initial values come
from ``write_init``: each 1024 x 1024 tile of each parameter from its own generator seeded by
(seed, name, tile), so any rank can produce exactly its shard of the single-device model without
ever holding the whole tensor, and a job starts in seconds.

Recompute (Korthikanti et al., arXiv 2205.05198): ``selective`` recomputes the attention core
(QK^T, softmax, AV) in backward; ``full`` recomputes whole layers, the first ``full_layers`` of
them (Megatron's "block" method), keeping only each layer's input.

What a layer saves for backward is what Megatron-LM with TransformerEngine saves, so the cost
model's activation bytes (``costmodel.memory``) can be checked against it tensor by tensor: the
residual stream is in the training dtype (BF16 under autocast, not FP32), the norms save only
their input and per-token statistics, Q / K / V / the attention output are each saved once (the
attention output doubles as the projection's input), and SwiGLU saves its two inputs and
recomputes the SiLU. The model has no dropout: ``ModelSpec.hidden_dropout`` and
``attention_dropout`` only change the cost model's count of dropout masks.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autoparallel.model import ops
from autoparallel.model.fp8 import Fp8Linear
from autoparallel.model.mx_linear import MxLinear
from autoparallel.model.moe import MoeMlp
from autoparallel.model.recipes import MICROSCALED, Fp8Policy
from autoparallel.specs.model import ModelSpec

RecomputeMode = Literal["none", "selective", "full"]


@dataclass(frozen=True)
class Recompute:
    mode: RecomputeMode = "none"
    full_layers: int | None = None  # for "full": how many layers, from the first; None = all

    def __post_init__(self) -> None:
        if self.mode not in ("none", "selective", "full"):
            raise ValueError(f"recompute mode={self.mode!r} is not valid; "
                             "choose one of none, selective, full")
        if self.full_layers is not None:
            if self.mode != "full":
                raise ValueError(f"full_layers={self.full_layers} only applies to mode='full'")
            if isinstance(self.full_layers, bool) or not isinstance(self.full_layers, int) \
                    or self.full_layers < 0:
                raise ValueError(f"full_layers={self.full_layers!r} must be an integer >= 0")

    def layer_is_full(self, index: int) -> bool:
        return self.mode == "full" and (self.full_layers is None or index < self.full_layers)


class _NormFunction(torch.autograd.Function):
    """LayerNorm / RMSNorm over the last dim that saves only its input and per-token statistics
    (as fused norm kernels do) and recomputes the normalised input in backward. It computes in
    at least FP32 and returns the input's dtype: the CPU path and the GPU path's oracle."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, rms: bool):
        with torch.autocast(x.device.type, enabled=False):
            xf = x.to(torch.promote_types(x.dtype, torch.float32))
            mean = None if rms else xf.mean(-1, keepdim=True)
            centered = xf if rms else xf - mean
            rstd = torch.rsqrt(centered.square().mean(-1, keepdim=True) + eps)
            y = centered * rstd * weight.to(xf.dtype)
            if bias is not None:
                y = y + bias.to(xf.dtype)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, rstd = ctx.saved_tensors
        xf = x.to(rstd.dtype)
        xhat = (xf if mean is None else xf - mean) * rstd
        g = grad.to(rstd.dtype)
        dims = tuple(range(g.dim() - 1))
        dweight = (g * xhat).sum(dims).to(weight.dtype)
        dbias = g.sum(dims).to(weight.dtype) if ctx.has_bias else None
        gxhat = g * weight.to(rstd.dtype)
        dx = gxhat - xhat * (gxhat * xhat).mean(-1, keepdim=True)
        if mean is not None:
            dx = dx - gxhat.mean(-1, keepdim=True)
        return (dx * rstd).to(x.dtype), dweight, dbias, None, None


class Norm(nn.Module):
    """RMSNorm or LayerNorm (with bias) with the parameter names of ``nn.RMSNorm`` /
    ``nn.LayerNorm``."""

    def __init__(self, hidden_size: int, kind: str, eps: float = 1e-5) -> None:
        super().__init__()
        if kind not in ("layernorm", "rmsnorm"):
            raise ValueError(f"normalization={kind!r} is not valid; "
                             "choose one of layernorm, rmsnorm")
        self.rms, self.eps = kind == "rmsnorm", eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = None if self.rms else nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return _NormFunction.apply(x, self.weight, self.bias, self.eps, self.rms)
        # torch's fused kernels: one pass over the activation each way where the FP32 twin
        # makes about ten, saving the same input and per-token statistics. Out of autocast,
        # which would run them in FP32.
        with torch.autocast("cuda", enabled=False):
            weight = self.weight.to(x.dtype)
            if self.rms:
                return F.rms_norm(x, x.shape[-1:], weight, self.eps)
            return F.layer_norm(x, x.shape[-1:], weight, self.bias.to(x.dtype), self.eps)


def _norm(spec: ModelSpec) -> Norm:
    return Norm(spec.hidden_size, spec.normalization)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up of h = [gate | up] (the first Linear's output), saving only h (the SiLU is
    recomputed in backward). One kernel each way on a GPU (kernels/swiglu.cu), where eager
    PyTorch spent two forward and about a dozen backward kernels; the FP32 reference
    (``reference.swiglu_backward``) is the CPU path and the kernel's oracle."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return ops.swiglu(h)

    @staticmethod
    def backward(ctx, grad):
        h, = ctx.saved_tensors
        return ops.swiglu_backward(h, grad)


def to_activation_dtype(h: torch.Tensor) -> torch.Tensor:
    """The residual stream is kept in the training dtype, as Megatron-LM keeps it: under autocast
    the embedding's output is cast once, so every residual add, norm input and pipeline message
    is BF16."""
    device = h.device.type
    if torch.is_autocast_enabled(device):
        return h.to(torch.get_autocast_dtype(device))
    return h


class _LinearFactory:
    """Makes each projection BF16 or FP8 as the policy says, knowing the module's full name."""

    def __init__(self, policy: Fp8Policy, layer: int, num_layers: int, prefix: str) -> None:
        self.policy, self.layer, self.num_layers, self.prefix = policy, layer, num_layers, prefix

    def __call__(self, name: str, in_features: int, out_features: int) -> nn.Module:
        full_name = f"{self.prefix}.{name}"
        if self.policy.uses_fp8(full_name, self.layer, self.num_layers):
            return low_precision_linear(in_features, out_features, self.policy.recipe)
        return nn.Linear(in_features, out_features, bias=False)


def low_precision_linear(in_features: int, out_features: int, recipe, bias: bool = False
                         ) -> nn.Module:
    """The Linear that runs ``recipe``: MxLinear for MXFP8 / NVFP4, else Fp8Linear."""
    cls = MxLinear if isinstance(recipe, MICROSCALED) else Fp8Linear
    return cls(in_features, out_features, recipe, bias=bias)


def rotary_tables(seq_length: int, head_dim: int, base: float = 10000.0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, seq, heads..., head_dim] (one or more head dims), cos / sin: [seq, head_dim /
    2]; rotates pairs (even, odd) of the head dim. The result is a new contiguous tensor."""
    return _Rotary.apply(x, cos, sin)


class _Rotary(torch.autograd.Function):
    """The rotation's backward is the rotation by the opposite angles (a rotation's transpose is
    its inverse): one pass each way, where autograd through the even / odd slices would build a
    zero-filled gradient per slice and add them."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin), None, None


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each (even, odd) pair of the head dim as a complex number times cos + i sin, in FP32: one
    product, not six elementwise passes. Under torch.compile the pairs are written out instead:
    Inductor fuses them into one kernel but generates no code for complex operators."""
    if torch.compiler.is_compiling():
        shape = (cos.shape[0], *[1] * (x.dim() - 3), -1)
        cos, sin = cos.view(shape), sin.view(shape)
        x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
        return out.to(x.dtype)
    turn = torch.complex(cos, sin).view(cos.shape[0], *[1] * (x.dim() - 3), -1)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, linear: _LinearFactory, selective_recompute: bool) -> None:
        super().__init__()
        self.heads, self.groups, self.head_dim = (spec.num_attention_heads, spec.query_groups,
                                                  spec.head_dim)
        self.selective_recompute = selective_recompute
        q_out = self.heads * self.head_dim
        self.wqkv = linear("wqkv", spec.hidden_size, q_out + 2 * self.groups * self.head_dim)
        self.wo = linear("wo", q_out, spec.hidden_size)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The part selective recompute drops: causal softmax(QK^T)V, in high precision.
        Context parallel replaces it per instance with ring attention over the local tokens
        (``autoparallel.parallel.context``), with the same arguments and result."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=self.groups != self.heads)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        per_group = self.heads // self.groups
        # split, not three slices: its backward is one concatenation, where each slice's would
        # be a zero-filled gradient of the whole output, added to the others'
        q, k, v = self.wqkv(x).view(b, s, self.groups, per_group + 2, self.head_dim).split(
            (per_group, 1, 1), dim=3)
        q = apply_rotary(q, cos, sin).view(b, s, self.heads, self.head_dim)
        k = apply_rotary(k.squeeze(3), cos, sin)
        v = v.squeeze(3).contiguous()  # so the fused output is not kept alive
        # [batch, heads, seq, dim] views of [batch, seq, heads, dim] memory: the attention output
        # then has that memory too, so the projection's input below is a view of it, not a copy.
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.selective_recompute and torch.is_grad_enabled():
            out = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            out = self.core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self, spec: ModelSpec, linear: _LinearFactory, ffn: int | None = None) -> None:
        """``ffn``: the width (default ``spec.ffn_hidden_size``; an expert's in a MoE layer)."""
        super().__init__()
        if spec.activation not in ("gelu", "swiglu", "squared_relu"):
            raise ValueError(f"activation={spec.activation!r} is not valid; "
                             "choose one of gelu, swiglu, squared_relu")
        self.activation = spec.activation
        ffn = ffn or spec.ffn_hidden_size
        gated = 2 if spec.gated_mlp else 1
        self.w1 = linear("w1", spec.hidden_size, gated * ffn)
        self.w2 = linear("w2", ffn, spec.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w1(x)
        if self.activation == "swiglu":
            h = _SwiGLU.apply(h)
        elif self.activation == "squared_relu":
            h = F.relu(h).square()
        else:
            h = F.gelu(h, approximate="tanh")
        return self.w2(h)


class TransformerLayer(nn.Module):
    def __init__(self, spec: ModelSpec, policy: Fp8Policy, index: int,
                 recompute: Recompute) -> None:
        super().__init__()
        prefix = f"layers.{index}"
        self.full_recompute = recompute.layer_is_full(index)
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec, _LinearFactory(policy, index, spec.num_layers,
                                                        f"{prefix}.attention"),
                                   selective_recompute=recompute.mode == "selective")
        self.mlp_norm = _norm(spec)
        if spec.moe_layer_pattern[index]:  # a mixture-of-experts layer (``model.moe``)
            def make_mlp(name: str, ffn: int) -> Mlp:
                return Mlp(spec, _LinearFactory(policy, index, spec.num_layers,
                                                f"{prefix}.mlp.{name}"), ffn)
            self.mlp = MoeMlp(spec, make_mlp)
        else:
            self.mlp = Mlp(spec, _LinearFactory(policy, index, spec.num_layers, f"{prefix}.mlp"))

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.full_recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        return self._forward(x, cos, sin)


INIT_STD = 0.02
INIT_TILE = 1024  # rows and columns of one independently seeded block of initial values


def init_std(name: str, spec: ModelSpec) -> float:
    """GPT-2 init: N(0, 0.02) for every matrix, the residual branches' output projections (wo,
    w2) scaled by 1/sqrt(2L). (The vectors are the norms': weight 1, bias 0.)"""
    if name.endswith(("wo.weight", "w2.weight")):
        return INIT_STD / math.sqrt(2 * spec.num_layers)
    return INIT_STD


def _tile_seed(seed: int, name: str, i: int, j: int) -> int:
    return (seed * 1_000_003 + zlib.crc32(f"{name}:{i}:{j}".encode())) % 2**63


def write_init(dest: torch.Tensor, name: str, full_shape: Sequence[int], spec: ModelSpec,
               seed: int, rows: Sequence[range] | None = None, cols: range | None = None) -> None:
    """Fill ``dest`` with the initial values of parameter ``name`` (single-device name, shape
    ``full_shape``) at rows ``rows`` (ranges, concatenated in order; all by default) and columns
    ``cols``. Each INIT_TILE x INIT_TILE tile is drawn on ``dest``'s device from its own
    generator, so a shard costs only the tiles it overlaps, never the whole tensor."""
    with torch.no_grad():
        if len(full_shape) == 1:
            dest.fill_(0.0 if name.endswith("bias") else 1.0)
            return
        std, (n_rows, n_cols) = init_std(name, spec), full_shape
        rows = rows if rows is not None else (range(n_rows),)
        cols = cols if cols is not None else range(n_cols)
        at = 0
        for rr in rows:
            for ti in range(rr.start // INIT_TILE, -(-rr.stop // INIT_TILE)):
                r0, r1 = max(rr.start, ti * INIT_TILE), min(rr.stop, (ti + 1) * INIT_TILE)
                for tj in range(cols.start // INIT_TILE, -(-cols.stop // INIT_TILE)):
                    c0, c1 = max(cols.start, tj * INIT_TILE), min(cols.stop, (tj + 1) * INIT_TILE)
                    shape = (min(INIT_TILE, n_rows - ti * INIT_TILE),
                             min(INIT_TILE, n_cols - tj * INIT_TILE))
                    g = torch.Generator(dest.device).manual_seed(_tile_seed(seed, name, ti, tj))
                    tile = torch.empty(shape, device=dest.device).normal_(0.0, std, generator=g)
                    dest[at + r0 - rr.start:at + r1 - rr.start, c0 - cols.start:c1 - cols.start] \
                        .copy_(tile[r0 - ti * INIT_TILE:r1 - ti * INIT_TILE,
                                    c0 - tj * INIT_TILE:c1 - tj * INIT_TILE])
            at += len(rr)


def reset_buffers(module: nn.Module) -> None:
    """Fresh FP8 state in every FP8 Linear of ``module`` (after ``to_empty``)."""
    for m in module.modules():
        if isinstance(m, Fp8Linear):
            m.reset_fp8_state()


def check_spec(spec: ModelSpec) -> None:
    """Refuse a model this implementation cannot build, with the reason."""
    if spec.is_hybrid:
        raise NotImplementedError(
            f"model {spec.name!r} is a hybrid Mamba-Transformer (hybrid_layer_pattern); the built-in "
            "transformer has no Mamba-2 layers: profile it with --trainer megatron (Megatron-LM's "
            "pretrain_hybrid.py)")
    if spec.is_dsv4:
        raise NotImplementedError(
            f"model {spec.name!r} is DeepSeek-V4 (csa_compress_ratios): the built-in transformer has no "
            "compressed sparse attention, DSA indexer, Hyper-Connections or hash routing")
    if spec.multi_latent_attention:
        raise NotImplementedError(f"model {spec.name!r} uses multi-latent attention, which the "
                                  "built-in transformer does not implement")
    if spec.is_moe and spec.moe_expert_capacity_factor is not None:
        raise NotImplementedError(
            f"model {spec.name!r} sets moe_expert_capacity_factor="
            f"{spec.moe_expert_capacity_factor}; the built-in MoE layer is dropless only "
            "(leave the capacity factor out)")
    if spec.head_dim % 2:
        raise ValueError(f"head_dim={spec.head_dim} must be even for rotary embeddings")


class Transformer(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab] (fp32).

    ``device="meta"`` leaves it unallocated (for ``autoparallel.parallel`` to shard first);
    any other device (default CPU) materialises it there. ``seed`` (default: the seed of
    torch's global generator, ``torch.initial_seed()``) fixes the initial values.
    """

    def __init__(self, spec: ModelSpec, fp8: Fp8Policy | None = None,
                 recompute: Recompute | None = None, device: torch.device | str | None = None,
                 seed: int | None = None) -> None:
        super().__init__()
        check_spec(spec)
        self.spec, self.policy = spec, fp8 or Fp8Policy()
        self.recompute = recompute or Recompute()
        with torch.device("meta"):
            # (given its weight, Embedding skips its own init: normal_ on the meta device
            # would import torch._dynamo, two seconds of every job's start)
            self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size, _weight=(
                torch.empty(spec.vocab_size, spec.hidden_size)))
            self.layers = nn.ModuleList(TransformerLayer(spec, self.policy, i, self.recompute)
                                        for i in range(spec.num_layers))
            self.norm = _norm(spec)
            self.output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
            half = spec.head_dim // 2
            self.register_buffer("rope_cos", torch.empty(spec.seq_length, half), persistent=False)
            self.register_buffer("rope_sin", torch.empty(spec.seq_length, half), persistent=False)
        if spec.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if torch.device(device or "cpu").type != "meta":
            self.materialize(device or "cpu", seed)

    def materialize(self, device: torch.device | str, seed: int | None = None) -> "Transformer":
        """Allocate every parameter and buffer on ``device`` and set their initial values."""
        seed = torch.initial_seed() if seed is None else seed
        self.to_empty(device=device)
        if self.spec.tie_embeddings:  # to_empty gives every module its own tensor
            self.output.weight = self.tok_embeddings.weight
        for name, p in self.named_parameters():
            write_init(p, name, p.shape, self.spec, seed)
        reset_buffers(self)
        cos, sin = rotary_tables(self.spec.seq_length, self.spec.head_dim)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        return self

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        if seq > self.spec.seq_length:
            raise ValueError(f"sequence of {seq} tokens exceeds seq_length={self.spec.seq_length}")
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        h = to_activation_dtype(self.tok_embeddings(tokens))
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h)).float()


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Parameters to ``dtype`` (BF16 training keeps its weights in BF16, as Megatron-LM does),
    leaving buffers alone: FP8 scaling state stays fp32."""
    for p in module.parameters():
        p.data = p.data.to(dtype)
    return module


TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=128, ffn_hidden_size=384,
                 num_attention_heads=4, num_query_groups=2, vocab_size=256, seq_length=64,
                 activation="swiglu", normalization="rmsnorm", tie_embeddings=False,
                 source="autoparallel built-in: trains on a CPU in seconds")
