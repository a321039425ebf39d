"""One training run of the proxy under one FP8 policy, with numerics recorded every K steps.

Every run of one check starts from the same initial weights (``build_model`` seeds before
constructing, and a BF16 Linear and an FP8 Linear draw the same numbers) and sees the same
batches (the sampler is seeded by the run's seed), so two runs differ by the policy alone and
the loss gap measures the recipe, not the data order.

``module_recipes`` replaces the recipe of matching modules after construction: the way tests
and the benchmark make one layer unhealthy on purpose (a negative margin that overflows, a large
one that underflows) without touching the others.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn

from autoparallel.fp8check.settings import CheckRun
from autoparallel.model.fp8 import Fp8Linear, attach_observer
from autoparallel.model.mx_linear import MxLinear
from autoparallel.model.numerics import train_recorded
from autoparallel.model.recipes import Fp8Policy, Recipe
from autoparallel.model.train import TrainConfig, build_model, train
from autoparallel.model.transformer import low_precision_linear
from autoparallel.specs.model import ModelSpec

_LAYER = re.compile(r"layers\.(\d+)\.")


def layer_index(module_name: str) -> int:
    """Transformer layer of a module name such as ``layers.3.mlp.w2``."""
    match = _LAYER.match(module_name)
    if not match:
        raise ValueError(f"{module_name!r} is not inside a transformer layer")
    return int(match.group(1))


@dataclass
class RunRecord:
    """Losses and per-step numerics of one run (``stats`` is empty for BF16)."""

    recipe: str
    bf16_layers: tuple[int, ...] = ()
    losses: list[float] = field(default_factory=list)
    stats: pd.DataFrame = field(default_factory=pd.DataFrame)
    seconds: float = 0.0

    def final_loss(self, window: int) -> float:
        tail = self.losses[-window:]
        return sum(tail) / len(tail)


def policy_for(recipe: Recipe | None, bf16_layers: tuple[int, ...]) -> Fp8Policy:
    """The recipe with whole transformer layers kept in BF16 (as module patterns, which any
    recipe accepts; Megatron's edge-layer rule is applied where the verdict is exported)."""
    return Fp8Policy(recipe, bf16_modules=tuple(f"layers.{i}.*" for i in sorted(bf16_layers)))


def _override(model: nn.Module, module_recipes: dict[str, Recipe]) -> int:
    """Swap the recipe of every FP8 / FP4 Linear whose name matches a pattern (an FP8 fault
    inside an NVFP4 run too); returns how many."""
    swapped = 0
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if not isinstance(child, (Fp8Linear, MxLinear)):
                continue
            for pattern, recipe in module_recipes.items():
                if fnmatch.fnmatchcase(name, pattern):
                    new = low_precision_linear(child.in_features, child.out_features, recipe,
                                               bias=child.bias is not None)
                    new.gemm_backend = child.gemm_backend
                    new.load_state_dict({"weight": child.weight.detach(),
                                         **({"bias": child.bias.detach()} if child.bias is not None
                                            else {})}, strict=False)
                    setattr(parent, child_name, new)
                    swapped += 1
                    break
    return swapped


def _train_config(run: CheckRun) -> TrainConfig:
    """The training loop's settings of a check run: the same for BF16 and every recipe."""
    return TrainConfig(steps=run.steps, batch_size=run.batch_size, seq_length=run.seq_length, seed=run.seed)


def run_policy(spec: ModelSpec, recipe: Recipe | None, run: CheckRun,
               bf16_layers: tuple[int, ...] = (),
               module_recipes: dict[str, Recipe] | None = None) -> RunRecord:
    """Train the proxy ``spec`` for ``run.steps`` steps; record numerics every ``stats_every``."""
    policy = policy_for(recipe, bf16_layers)
    model = build_model(policy, spec, run.seed)
    if module_recipes and recipe is not None:
        _override(model, module_recipes)
    recorder, result = train_recorded(policy, _train_config(run), spec, model, run.stats_every)
    stats = recorder.dataframe()
    if not stats.empty:
        stats.insert(2, "layer_index", stats["layer"].map(layer_index))
    name = "bf16" if recipe is None else recipe.name
    return RunRecord(name, tuple(sorted(bf16_layers)), result.losses, stats, result.seconds)


def last_step_casts(spec: ModelSpec, recipe: Recipe, run: CheckRun,
                    role: str = "grad_output_t") -> dict[str, torch.Tensor]:
    """Train the proxy under ``recipe`` for ``run.steps`` steps and return, per Linear, the
    high-precision tensor its last step cast in ``role`` (after the RHT where the recipe applies
    one): the gradients a recipe's rounding acts on, from its own trajectory."""
    policy = policy_for(recipe, ())
    model = build_model(policy, spec, run.seed)
    seen: dict[str, torch.Tensor] = {}

    def observe(name: str, tensor_role: str, high_precision: torch.Tensor, *_) -> None:
        if tensor_role == role:
            seen[name] = high_precision.detach()

    attach_observer(model, observe)
    train(policy, _train_config(run), spec, model=model)
    return seen
