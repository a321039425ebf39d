"""The proxy of a model that the FP8 check trains on a CPU: same structure, far smaller.

FP8 numerics depend on what each Linear sees (the activation function feeding FC2, the norm in
front of QKV, how many KV heads share a projection, residual growth over depth), not on the
width of 8192, so the proxy keeps the structure and shrinks the sizes (DESIGN.md §6).

The rule (every number comes from ``ProxyRule``, set in search_spaces/fp8_check.yaml):

* kept from the model: activation (gelu / swiglu / squared_relu), normalization (layernorm /
  rmsnorm), tied or untied embeddings, the GQA ratio heads / query groups, the FFN expansion
  ffn_hidden_size / hidden_size;
* hidden_size = ``hidden_size`` (128); ffn = hidden x the model's expansion, rounded to a
  multiple of 16;
* head_dim = ``head_dim`` (16); query groups = max(1, ``heads // ratio``), heads = groups x
  ratio (so 8 heads for MHA and GQA-8, 16 heads / 1 group for GQA-16);
* num_layers = min(model layers, ``num_layers``) (4: a first, a last and two middle layers, so
  that keeping edge layers in BF16 is distinguishable from keeping a middle one);
* vocab = 256 (the byte-level generated corpus of ``autoparallel.model.data``);
  seq_length = min(model seq_length, ``seq_length``);
* a MoE model becomes its dense equivalent with one expert's FFN (the check is about the
  Linear GEMMs' numerics; routing is not modelled).

Proxy layer i stands for the block of real layers [i L / l, (i + 1) L / l) (L real, l proxy
layers); the first and last proxy layers stand for the real model's first and last layers,
which is what Megatron-LM's ``--num-layers-at-start/end-in-bf16`` keep in BF16.

Pure Python: the search imports it without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoparallel.specs.model import ModelSpec


@dataclass(frozen=True)
class ProxyRule:
    hidden_size: int = 128
    num_layers: int = 4
    heads: int = 8
    head_dim: int = 16
    vocab_size: int = 256
    seq_length: int = 64

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"proxy {f.name}={value!r} must be a positive integer")
        if self.head_dim % 2:
            raise ValueError(f"proxy head_dim={self.head_dim} must be even (rotary embeddings)")


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, int(round(value / multiple)) * multiple)


def proxy_spec(model: ModelSpec, rule: ProxyRule = ProxyRule()) -> ModelSpec:
    """The scaled-down ModelSpec that stands for ``model`` in the FP8 check."""
    ratio = model.num_attention_heads // model.query_groups
    groups = max(1, rule.heads // ratio)
    ffn = model.expert_ffn_hidden_size if model.is_moe else model.ffn_hidden_size
    expansion = ffn / model.hidden_size
    return ModelSpec(
        name=f"{model.name}-proxy",
        num_layers=min(model.num_layers, rule.num_layers),
        hidden_size=rule.hidden_size,
        ffn_hidden_size=_round_to(rule.hidden_size * expansion, 16),
        num_attention_heads=groups * ratio,
        num_query_groups=groups,
        kv_channels=rule.head_dim,
        vocab_size=rule.vocab_size,
        seq_length=min(model.seq_length, rule.seq_length),
        activation=model.activation,
        normalization=model.normalization,
        tie_embeddings=model.tie_embeddings,
        source=(f"fp8-check proxy of {model.name}: {model.num_layers} -> "
                f"{min(model.num_layers, rule.num_layers)} layers, hidden {model.hidden_size} -> "
                f"{rule.hidden_size}, GQA ratio {ratio}, FFN x{expansion:.2f}, {model.activation}, "
                f"{model.normalization}" + ("; MoE as one dense expert" if model.is_moe else "")),
    )


def real_layers(proxy_layer: int, proxy_layers: int, model_layers: int) -> range:
    """The real layers proxy layer ``proxy_layer`` stands for (0-based, half-open)."""
    start = proxy_layer * model_layers // proxy_layers
    stop = (proxy_layer + 1) * model_layers // proxy_layers
    return range(start, stop)


def edge_count(layers: tuple[int, ...], proxy_layers: int) -> int | None:
    """The smallest n such that every layer of ``layers`` is among the first n or the last n
    proxy layers (what Megatron's BF16 edge flags express with one n; 0 for no layer), or None
    when that would cover the whole proxy (a middle layer: only a layer list expresses it)."""
    if not layers:
        return 0
    n = max(min(i + 1, proxy_layers - i) for i in layers)
    return n if 2 * n < proxy_layers else None
