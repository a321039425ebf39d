"""The kinds of decoder layer the cost model prices: a mixer (attention, a Mamba-2 mixer or none)
followed by an FFN (an MLP, a MoE block or none).

A standard model's layer is attention plus an MLP (``DENSE``) or a MoE block (``MOE``). A hybrid
Mamba-Transformer (Megatron-LM ``--hybrid-layer-pattern``: Nemotron-H, Nemotron 3) has one block
per layer (``HYBRID``, keyed by the pattern's symbols, ``specs.model.HYBRID_LAYER_KINDS``): M a
Mamba-2 mixer, * self-attention, - an MLP, E a MoE block, each with its own pre-norm and residual
(Megatron-LM d98e8a64dd ``megatron/core/models/hybrid/hybrid_block.py`` builds one MambaLayer,
TransformerLayer with an IdentityOp MLP, MLPLayer or MoE TransformerLayer with an IdentityOp
attention per symbol).

Layer-time functions take a ``LayerKind`` or, for the standard kinds, a bool ``is_moe``
(``as_kind``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerKind:
    """One layer's blocks: ``mixer`` "attention", "mamba" or None; ``ffn`` "mlp", "moe" or None."""

    mixer: str | None
    ffn: str | None

    @property
    def is_moe(self) -> bool:
        return self.ffn == "moe"

    @property
    def attention(self) -> bool:
        return self.mixer == "attention"

    @property
    def mamba(self) -> bool:
        return self.mixer == "mamba"

    @property
    def standard(self) -> bool:
        """Attention and an FFN: the two kinds of a standard model, priced as before hybrids."""
        return self.attention and self.ffn is not None

    @property
    def norms(self) -> int:
        """Pre-norms the layer runs: one per block."""
        return (self.mixer is not None) + (self.ffn is not None)


DENSE = LayerKind("attention", "mlp")
MOE = LayerKind("attention", "moe")
HYBRID = {"M": LayerKind("mamba", None), "*": LayerKind("attention", None), "-": LayerKind(None, "mlp"),
          "E": LayerKind(None, "moe")}

# The hybrid kinds a pipeline stage counts (``pipeline.stage_kind_counts``), in the order that picks
# the middle stage priced: most E, then *, then M layers (their cost per layer on Nemotron 3 Nano,
# GB300 MBS 4: 18.6, 10.0 and 5.7 ms; benchmarks/RESULTS.md session 48 s48h1).
# A kind's layers among the BF16 first / last layers of a quantization recipe (``gemm_precision``)
# are counted apart, as the kind's symbol and ``EDGE``.
EDGE = " bf16"
STAGE_KINDS = ("E", "*", "M", "-") + tuple(kind + EDGE for kind in "E*M-")


def as_kind(kind: LayerKind | bool) -> LayerKind:
    """``kind`` itself, or the standard MoE (True) or dense (False) layer."""
    if isinstance(kind, LayerKind):
        return kind
    return MOE if kind else DENSE
