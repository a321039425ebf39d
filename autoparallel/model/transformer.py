"""A GPT-style decoder built from a ModelSpec, free of parallel code.

Pre-norm layers (RMSNorm or LayerNorm), GQA attention through ``scaled_dot_product_attention``
with rotary positions, a gelu / swiglu / squared_relu MLP, tied or untied embeddings. Module
names follow torchtitan (``layers.{i}.attention.wq``, ``layers.{i}.mlp.w1``...) and every
projection is a plain ``nn.Linear`` or an ``Fp8Linear`` with the same ``weight`` shape, so the
later tensor / pipeline / data parallel wrappers can replace or shard them from outside. The FP8
policy and the recompute choice are constructor arguments, never global state.

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
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autoparallel.model.fp8 import Fp8Linear
from autoparallel.model.moe import MoeMlp
from autoparallel.model.recipes import Fp8Policy
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
    at least FP32 and returns the input's dtype."""

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
        return _NormFunction.apply(x, self.weight, self.bias, self.eps, self.rms)


def _norm(spec: ModelSpec) -> Norm:
    return Norm(spec.hidden_size, spec.normalization)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up, saving only gate and up (the SiLU is recomputed in backward)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        dtype = torch.promote_types(gate.dtype, torch.float32)
        g, gate_f, up_f = grad.to(dtype), gate.to(dtype), up.to(dtype)
        sig = torch.sigmoid(gate_f)
        dgate = g * up_f * sig * (1 + gate_f * (1 - sig))
        return dgate.to(gate.dtype), (g * gate_f * sig).to(up.dtype)


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
            return Fp8Linear(in_features, out_features, self.policy.recipe, bias=False)
        return nn.Linear(in_features, out_features, bias=False)


def rotary_tables(seq_length: int, head_dim: int, base: float = 10000.0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_length, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, seq, heads, head_dim], cos / sin: [seq, head_dim / 2]; rotates pairs (even,
    odd) of the head dim."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, linear: _LinearFactory, selective_recompute: bool) -> None:
        super().__init__()
        self.heads, self.groups, self.head_dim = (spec.num_attention_heads, spec.query_groups,
                                                  spec.head_dim)
        self.selective_recompute = selective_recompute
        q_out, kv_out = self.heads * self.head_dim, self.groups * self.head_dim
        self.wq = linear("wq", spec.hidden_size, q_out)
        self.wk = linear("wk", spec.hidden_size, kv_out)
        self.wv = linear("wv", spec.hidden_size, kv_out)
        self.wo = linear("wo", q_out, spec.hidden_size)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The part selective recompute drops: causal softmax(QK^T)V, in high precision.
        Context parallel replaces it per instance with ring attention over the local tokens
        (``autoparallel.parallel.context``), with the same arguments and result."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=self.groups != self.heads)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = apply_rotary(self.wq(x).view(b, s, self.heads, self.head_dim), cos, sin)
        k = apply_rotary(self.wk(x).view(b, s, self.groups, self.head_dim), cos, sin)
        v = self.wv(x).view(b, s, self.groups, self.head_dim)
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
        super().__init__()
        if spec.activation not in ("gelu", "swiglu", "squared_relu"):
            raise ValueError(f"activation={spec.activation!r} is not valid; "
                             "choose one of gelu, swiglu, squared_relu")
        self.activation = spec.activation
        ffn = ffn or spec.ffn_hidden_size
        self.w1 = linear("w1", spec.hidden_size, ffn)
        self.w2 = linear("w2", ffn, spec.hidden_size)
        self.w3 = linear("w3", spec.hidden_size, ffn) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w1(x)
        if self.activation == "swiglu":
            h = _SwiGLU.apply(h, self.w3(x))
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
        if spec.moe_layer_pattern[index]:  # a mixture-of-experts layer (``autoparallel.model.moe``)
            def make_mlp(name: str, ffn: int) -> Mlp:
                return Mlp(spec, _LinearFactory(policy, index, spec.num_layers, f"{prefix}.mlp.{name}"), ffn)
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


class Transformer(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab] (fp32)."""

    def __init__(self, spec: ModelSpec, fp8: Fp8Policy | None = None,
                 recompute: Recompute | None = None) -> None:
        super().__init__()
        if spec.multi_latent_attention:
            raise ValueError(f"model {spec.name!r} uses multi-latent attention, which the built-in "
                             "transformer does not implement")
        if spec.head_dim % 2:
            raise ValueError(f"head_dim={spec.head_dim} must be even for rotary embeddings")
        self.spec, self.policy = spec, fp8 or Fp8Policy()
        self.recompute = recompute or Recompute()
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(spec, self.policy, i, self.recompute)
                                    for i in range(spec.num_layers))
        self.norm = _norm(spec)
        self.output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rotary_tables(spec.seq_length, spec.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """GPT-2 init: N(0, 0.02), output projections of residual branches scaled by 1/sqrt(2L)."""
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scaled = name.endswith(("wo.weight", "w2.weight"))
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.spec.num_layers) if scaled
                                else std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        if seq > self.spec.seq_length:
            raise ValueError(f"sequence of {seq} tokens exceeds seq_length={self.spec.seq_length}")
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        h = to_activation_dtype(self.tok_embeddings(tokens))
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h)).float()


TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=128, ffn_hidden_size=384,
                 num_attention_heads=4, num_query_groups=2, vocab_size=256, seq_length=64,
                 activation="swiglu", normalization="rmsnorm", tie_embeddings=False,
                 source="autoparallel built-in: trains on a CPU in seconds")
