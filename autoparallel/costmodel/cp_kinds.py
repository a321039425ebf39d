"""Which context-parallel kinds (``Plan.cp_comm_type``) Megatron-LM and TransformerEngine run for a model.

What each refusal cites (TransformerEngine d0067d0d, ``attention/dot_product_attention/context_parallel.py``
``attn_forward_func_with_cp`` and the ``AttnFuncWithCP*`` classes; Megatron-LM d98e8a64dd):

- a softmax with sinks (GPT-OSS): "Context parallelism only supports softmax_type=... with cp_comm_type =
  'a2a'"; DeepSeek Sparse Attention (GLM-5): "DSAttention context parallelism currently supports
  cp_comm_type=allgather only" (``transformer_config.py``);
- sliding-window attention: "Context parallelism does not support sliding window attention with
  cp_comm_type=..." unless a2a or all_gather;
- a2a: "cp_comm_type='a2a' requires num_heads % cp_size == 0 for Q, K, V" (the heads of one TP rank; the
  a2a+p2p kind's a2a group alike);
- a TE release: the kind reaches TE from 1.10 (Megatron passes ``cp_comm_type`` only then; p2p before),
  but v1.10's ``attn_forward_func_with_cp`` runs all_gather and p2p only (anything else: "Unsupported
  communication type", v1.10 ``pytorch/attention.py`` L3354-3405), so a2a from 1.11 (40dda924a, "Add a
  context parallelism implementation with QKVO all-to-all (#1160)"), a2a+p2p from 1.12 (Megatron asserts it); MLA (K and V head sizes differ) only through p2p and a2a+p2p
  before 2.15 ("Context parallelism does not support MLA with cp_comm_type=..." in v2.14, gone in v2.15);
  FP8 attention through all_gather from 2.15 (v2.14's AttnFuncWithCPAndKVAllGather takes no fp8
  argument: it runs BF16); packed sequences (THD) through all_gather from 2.18 (701011849, "Add THD
  format support for AllGather-based Context Parallelism") and through a2a+p2p after it (8ff60f8de,
  "Enable THD with hierarchical context parallelism", in no tagged release of the mirror: a current TE
  only, which is an assumption about the next release's number).

DeepSeek-V4's compressed attention is priced as the p2p ring only, as before this knob (its CP kinds
are not researched here)."""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel.candidates import release_at_least
from autoparallel.specs.plan import CP_COMM_TYPE_CHOICES

A2A_KINDS = ("a2a", "a2a+p2p")


def default_kind(model) -> str:
    """The kind a model runs where none is asked for: the one it can only run (sinks: a2a; DSA:
    allgather), else Megatron-LM's default p2p."""
    if model.softmax_sinks:
        return "a2a"
    return "allgather" if model.is_dsa else "p2p"


def model_refusal(model, kind: str, release: str = "", packed: bool = False) -> str:
    """Why Megatron-LM / TransformerEngine (``release``; "": a current one) refuse ``kind`` for
    ``model`` at cp > 1 whatever the layout, naming the kinds it runs ('' if they run it);
    ``packed``: THD sequences."""
    why = _why(model, kind, release, packed)
    if not why:
        return ""
    valid = ", ".join(model_kinds(model, release, packed)) or "none"
    return f"--cp-comm-type {kind}: {why} (valid for {model.name}: {valid})"


def model_kinds(model, release: str = "", packed: bool = False) -> tuple[str, ...]:
    """The kinds ``model_refusal`` lets ``model`` run."""
    return tuple(k for k in CP_COMM_TYPE_CHOICES if not _why(model, k, release, packed))


def _why(model, kind: str, release: str, packed: bool) -> str:
    older = lambda major, minor: bool(release) and not release_at_least(release, major, minor)  # noqa: E731
    if kind not in CP_COMM_TYPE_CHOICES:
        return f"not one of {', '.join(CP_COMM_TYPE_CHOICES)}"
    if model.softmax_sinks and kind != "a2a":
        return "a softmax with sinks runs context parallelism only as a2a (TransformerEngine)"
    if model.is_dsa and kind != "allgather":
        return "DeepSeek Sparse Attention runs context parallelism only as allgather (Megatron-LM DSAttention)"
    if model.is_dsv4 and kind != "p2p":
        return "DeepSeek-V4's compressed attention is priced as the p2p ring only"
    if model.window_size is not None and kind not in ("a2a", "allgather"):
        return "TransformerEngine runs sliding-window attention under CP only as a2a or allgather"
    if kind != "p2p" and older(1, 10):
        return f"TransformerEngine {release} takes no cp_comm_type (Megatron-LM passes it from 1.10): p2p only"
    if kind == "a2a" and older(1, 11):
        return f"a2a needs TransformerEngine >= 1.11 (v1.10 runs p2p and all_gather only), not {release}"
    if kind == "a2a+p2p" and older(1, 12):
        return f"a2a+p2p needs TransformerEngine >= 1.12 (Megatron-LM), not {release}"
    if model.multi_latent_attention and kind in ("a2a", "allgather") and older(2, 15):
        return f"TransformerEngine {release} runs MLA under CP only as p2p or a2a+p2p (2.15 lifts it)"
    if packed and kind == "allgather" and older(2, 18):
        return f"packed (THD) sequences through allgather need TransformerEngine >= 2.18, not {release}"
    if packed and kind == "a2a+p2p" and older(2, 19):
        return f"packed (THD) sequences through a2a+p2p need a TransformerEngine after 2.18, not {release}"
    return ""


def fp8_attention_refusal(kind: str, release: str) -> str:
    """Why FP8 attention cannot run through ``kind`` under CP on TE ``release`` ('' if it can)."""
    if kind == "allgather" and release and not release_at_least(release, 2, 15):
        return (f"FP8 attention through --cp-comm-type allgather needs TransformerEngine >= 2.15 "
                f"(transformer_engine_version {release} runs it in BF16)")
    return ""


def a2a_group(model, tp, cp, kind: str) -> np.ndarray:
    """The ranks of each all-to-all (``tp``, ``cp``: arrays or numbers): cp for a2a; for a2a+p2p the
    largest divisor of cp below it that divides a TP rank's heads and query groups (Megatron's
    --hierarchical-context-parallel-sizes A cp/A: a2a inside A consecutive CP ranks, the p2p ring over
    cp/A of them); 1 for p2p and allgather. 0 where the heads forbid it (TE: num_heads % a2a size)."""
    tp, cp = np.asarray(tp, dtype=int), np.asarray(cp, dtype=int)
    heads, groups = model.num_attention_heads // tp, model.query_groups // tp
    if kind == "a2a":
        return np.where((heads % cp == 0) & (groups % cp == 0), cp, 0)
    if kind != "a2a+p2p":
        return np.ones_like(cp)
    size = np.zeros_like(cp)
    for d in range(2, int(cp.max(initial=1))):
        size = np.where((cp % d == 0) & (d < cp) & (heads % d == 0) & (groups % d == 0), d, size)
    return size


def heads_refusal(model, tp: int, cp: int, kind: str) -> str:
    """Why a TP rank's heads forbid ``kind`` at (tp, cp) ('' where they do not)."""
    if kind not in A2A_KINDS or cp <= 1 or a2a_group(model, tp, cp, kind):
        return ""
    heads, groups = model.num_attention_heads // tp, model.query_groups // tp
    if kind == "a2a":
        return (f"--cp-comm-type a2a at cp={cp}: the {heads} heads and {groups} query groups of a TP rank (tp={tp}) "
                f"are not divisible by cp (TransformerEngine: num_heads % cp_size == 0); p2p and allgather are not "
                f"bound by the heads")
    return (f"--cp-comm-type a2a+p2p at cp={cp}: no a2a group of 2 to {cp // 2} ranks divides cp and the {heads} heads "
            f"and {groups} query groups of a TP rank (tp={tp}); p2p and allgather are not bound by the heads")
