"""FP8 / FP4 recipes and the per-layer policy, as small frozen dataclasses (DESIGN.md §6).

A recipe says how a tensor gets its scale (delayed, current or blockwise); the policy says which
Linear layers use the recipe at all. Both are plain values passed into the model: nothing here is
global, so two models with different recipes can live in one process (the numerics comparison
trains four of them side by side).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Literal, Union

import torch

Fp8Format = Literal["E4M3", "HYBRID"]
AmaxAlgo = Literal["max", "most_recent"]
TensorRole = Literal["input", "weight", "grad_output"]

FORMATS: tuple[str, ...] = ("E4M3", "HYBRID")
AMAX_ALGOS: tuple[str, ...] = ("max", "most_recent")
ROLES: tuple[TensorRole, ...] = ("input", "weight", "grad_output")


def _check_choice(name: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(valid)}")


def _check_margin(margin: object) -> None:
    """A scale margin is a power-of-two exponent: a whole number (True is not one)."""
    if isinstance(margin, bool) or not isinstance(margin, int):
        raise ValueError(f"margin={margin!r} must be an integer power-of-two exponent")


def role_dtype(fp8_format: str, role: TensorRole) -> torch.dtype:
    """E4M3 everywhere, except gradients under HYBRID, which need E5M2's range."""
    if role == "grad_output" and fp8_format == "HYBRID":
        return torch.float8_e5m2
    return torch.float8_e4m3fn


@dataclass(frozen=True)
class DelayedScaling:
    """TransformerEngine's default on Hopper: the scale comes from an amax history.

    scale = fp8_max / amax / 2**margin, amax = max over the last ``amax_history_len`` steps (or the
    most recent one). The cast then reads each tensor once. A negative margin is allowed because
    it is how one deliberately provokes overflow when testing the statistics.
    """

    fp8_format: Fp8Format = "HYBRID"
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: AmaxAlgo = "max"

    def __post_init__(self) -> None:
        _check_choice("fp8_format", self.fp8_format, FORMATS)
        _check_choice("amax_compute_algo", self.amax_compute_algo, AMAX_ALGOS)
        _check_margin(self.margin)
        if isinstance(self.amax_history_len, bool) or not isinstance(self.amax_history_len, int) \
                or self.amax_history_len < 1:
            raise ValueError(f"amax_history_len={self.amax_history_len!r} must be an integer >= 1")

    @property
    def name(self) -> str:
        return "fp8-delayed"


@dataclass(frozen=True)
class CurrentScaling:
    """Tensorwise scaling from the tensor's own amax: one extra read per tensor, no history."""

    fp8_format: Fp8Format = "HYBRID"
    margin: int = 0

    def __post_init__(self) -> None:
        _check_choice("fp8_format", self.fp8_format, FORMATS)
        _check_margin(self.margin)

    @property
    def name(self) -> str:
        return "fp8-current"


@dataclass(frozen=True)
class BlockwiseScaling:
    """DeepSeek-V3: 1x128 tiles for activations and gradients, 128x128 blocks for weights, E4M3.

    Fine-grained scales make E4M3's narrow range enough for gradients too, so there is no HYBRID.
    """

    block_size: int = 128
    fp8_format: Fp8Format = "E4M3"

    def __post_init__(self) -> None:
        _check_choice("fp8_format", self.fp8_format, ("E4M3",))
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) \
                or self.block_size < 1:
            raise ValueError(f"block_size={self.block_size!r} must be a positive integer")

    @property
    def name(self) -> str:
        return "fp8-blockwise"


@dataclass(frozen=True)
class Mxfp8BlockScaling:
    """TransformerEngine's MXFP8BlockScaling (Blackwell): E4M3 for every tensor, gradients too,
    with one power-of-two (E8M0) scale per 32 values along each GEMM's contracted dim."""

    @property
    def name(self) -> str:
        return "mxfp8"


@dataclass(frozen=True)
class Nvfp4BlockScaling:
    """TransformerEngine's NVFP4BlockScaling (Blackwell; arXiv 2509.25149): E2M1 values with
    E4M3 scales per 16 values and an FP32 scale per tensor.

    Each switch is one part of the recipe that the report ablates: ``weight_2d`` (16x16 weight
    blocks, so fprop and dgrad see the same weight), ``random_hadamard`` (16x16 RHT on the wgrad
    GEMM's inputs), ``stochastic_rounding`` (of the gradients). Defaults are the recipe's."""

    weight_2d: bool = True
    random_hadamard: bool = True
    stochastic_rounding: bool = True

    def __post_init__(self) -> None:
        for key in ("weight_2d", "random_hadamard", "stochastic_rounding"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}={getattr(self, key)!r} must be true or false")

    @property
    def name(self) -> str:
        return "nvfp4"


Recipe = Union[DelayedScaling, CurrentScaling, BlockwiseScaling, Mxfp8BlockScaling,
               Nvfp4BlockScaling]
MICROSCALED = (Mxfp8BlockScaling, Nvfp4BlockScaling)
RECIPE_NAMES: dict[str, type] = {
    "fp8-delayed": DelayedScaling, "fp8-current": CurrentScaling, "fp8-blockwise": BlockwiseScaling,
    "mxfp8": Mxfp8BlockScaling, "nvfp4": Nvfp4BlockScaling,
}


def recipe_from_name(name: str, **overrides: object) -> Recipe | None:
    """``bf16`` gives None; the plan's precision names give their recipe's defaults."""
    if name == "bf16":
        if overrides:
            raise ValueError(f"precision 'bf16' takes no recipe options, got {sorted(overrides)}")
        return None
    if name not in RECIPE_NAMES:
        raise ValueError(f"precision={name!r} is not valid; choose one of bf16, "
                         + ", ".join(RECIPE_NAMES))
    return RECIPE_NAMES[name](**overrides)


@dataclass(frozen=True)
class Fp8Policy:
    """Which Linear layers run in FP8, and with which recipe.

    ``recipe=None`` is plain BF16. ``bf16_first_layers`` / ``bf16_last_layers`` keep whole
    transformer layers in BF16; ``bf16_modules`` holds fnmatch patterns of module names (for
    example ``"layers.*.mlp.w2"``), typically computed from numerics statistics
    (``numerics.policy_from_numerics``). The output layer and embeddings never run in FP8.
    """

    recipe: Recipe | None = None
    bf16_first_layers: int = 0
    bf16_last_layers: int = 0
    bf16_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.recipe is not None and not isinstance(
                self.recipe, tuple(RECIPE_NAMES.values())):
            raise ValueError(f"recipe={self.recipe!r} is not an FP8 or FP4 recipe; use one of "
                             + ", ".join(t.__name__ for t in RECIPE_NAMES.values())
                             + " or None for BF16")
        for key in ("bf16_first_layers", "bf16_last_layers"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key}={value!r} must be an integer >= 0")
        if isinstance(self.bf16_modules, str) or not all(
                isinstance(p, str) for p in self.bf16_modules):
            raise ValueError(f"bf16_modules={self.bf16_modules!r} must be a tuple of name patterns")
        # Megatron-LM's rule (DESIGN.md §4): exported configs must stay valid there.
        if isinstance(self.recipe, DelayedScaling) and (self.bf16_first_layers
                                                        or self.bf16_last_layers):
            raise ValueError("delayed scaling cannot be combined with BF16 first/last layers "
                             "(Megatron-LM rejects it); use CurrentScaling or bf16_modules")

    @property
    def name(self) -> str:
        return "bf16" if self.recipe is None else self.recipe.name

    def uses_fp8(self, module_name: str, layer_index: int, num_layers: int) -> bool:
        if self.recipe is None:
            return False
        last_fp8 = num_layers - self.bf16_last_layers
        if layer_index < self.bf16_first_layers or layer_index >= last_fp8:
            return False
        return not any(fnmatch.fnmatchcase(module_name, p) for p in self.bf16_modules)
