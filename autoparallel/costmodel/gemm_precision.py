"""Each GEMM class's precision under a per-module quantization recipe of a hybrid model.

Megatron-Bridge's Nemotron 3 Super NVFP4 perf recipes (067f987df0
``src/megatron/bridge/perf_recipes/nemotronh/common.py`` ``_nemotron_3_super_nvfp4_precision``: the
mixed precision ``nemotron_3_super_bf16_with_nvfp4_mixed`` of ``training/mixed_precision.py``,
first_last_layers_bf16 with num_layers_at_end_in_bf16 14, at start 0; the same since v0.4.0's
``scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py``) load ``te_quant.cfg``
(``cfg.model.quant_recipe = load_quantization_recipe(...)``): attention's linear_qkv and linear_proj,
LatentMoE's fc1 / fc2 latent projections and every MTP module in BF16, the Mamba mixer's out_proj in
MXFP8, every other Linear (Mamba in_proj, shared and routed experts) NVFP4.

Megatron-LM d98e8a64dd ``megatron/core/models/hybrid/hybrid_block.py`` wraps each layer in
``get_fp4_context(config, layer_number - 1)``, which (``fp4_utils.py``) leaves the first
``num_layers_at_start_in_bf16`` and the last ``num_layers_at_end_in_bf16`` of the pattern's
``num_layers`` layers in BF16. A matcher's recipe overrides a quantized layer's autocast but not a BF16
one's (``extensions/transformer_engine.py`` ``TEQuantizationRecipe``: override_quantized_autocast True,
override_nonquantized_autocast False): in the BF16 end layers out_proj stays BF16.

The settings are run-level (``SearchSpace`` ``quant_recipe``, ``num_layers_at_start_in_bf16``,
``num_layers_at_end_in_bf16``, passed as ``SearchSpace.cost_settings`` columns to search and
estimate), a published row's from its recipe (``data/recipe_settings.yaml``): absent, every term
prices as before.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import gemm
from autoparallel.costmodel.layer_kinds import EDGE

# The recipe's matchers: GEMM class -> the precision it runs in a quantized layer (else the plan's).
QUANT_RECIPES = {
    "nemotronh-te-quant": {"attention": "bf16", "latent_projection": "bf16", "mtp": "bf16",
                           "mamba_out_proj": "mxfp8"},
}
RECIPE_COLUMN = "quant_recipe"
END_COLUMNS = ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16")
COLUMNS = (RECIPE_COLUMN, *END_COLUMNS)


def _setting(x, column):
    """The row's one value of ``column`` (constant over a row's candidates), or None."""
    return _setting_of(x.knobs, column)


def _setting_of(cols, column):
    """``_setting`` of the columns ``cols``."""
    values = cols.get(column)
    if values is None:
        return None
    values = np.atleast_1d(values)  # a run-level setting may be one value (``SearchSpace.cost_settings``)
    if len(values) == 0:
        return None
    value = values[0]
    return None if value is None or value == "" or (isinstance(value, float) and np.isnan(value)) else value


def recipe(x) -> dict:
    """The GEMM classes ``x``'s quantization recipe runs in a precision of their own ({} if none)."""
    name = _setting(x, RECIPE_COLUMN)
    return QUANT_RECIPES[str(name)] if name is not None else {}


def end_layers(x) -> tuple[int, int]:
    """(first, last) layers of the pattern kept in BF16 by the row's recipe."""
    return end_layers_of(x.knobs)


def end_layers_of(cols) -> tuple[int, int]:
    """``end_layers`` of the columns ``cols``."""
    return tuple(int(_setting_of(cols, c) or 0) for c in END_COLUMNS)


def layer_labels(pattern: str, start: int, end: int) -> list[str]:
    """Each layer's kind as a pipeline stage counts it (``layer_kinds.STAGE_KINDS``): its symbol, and
    ``EDGE`` after it in the first ``start`` and last ``end`` layers, which ``fp4_utils`` keeps in
    BF16, so that the stage holding them prices them (Megatron-LM's first / last stage)."""
    return [symbol + EDGE if i < start or i >= len(pattern) - end else symbol for i, symbol in enumerate(pattern)]


def applies(x) -> bool:
    """Whether the row states any per-class setting (a hybrid model only)."""
    return x.model.is_hybrid and (bool(recipe(x)) or any(end_layers(x)))


def quantized_share(pattern: str, kind: str, start: int, end: int) -> float:
    """Share of the pattern's ``kind`` layers outside its first ``start`` and last ``end`` layers."""
    total = pattern.count(kind)
    if not total:
        return 0.0
    kept = pattern[:start].count(kind) + (pattern[len(pattern) - end:].count(kind) if end else 0)
    return 1.0 - kept / total


def kind_fraction(x, kind: str, start: int | None = None, end: int | None = None):
    """The plan's quantized share times the share of ``kind``'s layers the end layers (the row's,
    or ``start`` and ``end``) leave quantized; 0 for a kind whose GEMMs the recipe keeps all in
    BF16 (attention's)."""
    if kind == "*" and recipe(x).get("attention") == "bf16":
        return np.zeros_like(x.quantized_fraction)
    if start is None:
        start, end = end_layers(x)
    return x.quantized_fraction * quantized_share(x.model.hybrid_layer_pattern, kind, start, end)


def class_peak(x, gemm_class: str):
    """Peak FLOP/s of ``gemm_class``'s GEMMs in ``x`` (a kind's candidates, ``quantized_fraction``
    already that kind's): BF16, MXFP8 on the quantized share, or ``x``'s own peak."""
    precision = recipe(x).get(gemm_class)
    if precision == "bf16":
        return gemm.bf16_peak(x.hw) + np.zeros_like(x.gemm_peak)
    if precision == "mxfp8":
        return gemm.peak(x.hw, x.quantized_fraction, False)
    return x.gemm_peak
