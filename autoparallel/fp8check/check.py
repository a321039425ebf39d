"""The FP8 check of one model: BF16 and every recipe on the proxy, then the BF16-layer search.

``run_check`` trains the proxy once in BF16 and once per recipe with the same data and seed,
judges each recipe with ``verdict``, and for a recipe that fails re-runs it with candidate sets
of layers kept in BF16 (at most ``layer_search.max_reruns`` re-runs per recipe) until one passes.
NVFP4 is judged by its own thresholds and tries only the last n layers (Megatron's
``--num-layers-at-end-in-bf16``, the layers NVIDIA's NVFP4 recipe keeps in BF16).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from autoparallel.fp8check import verdict as V
from autoparallel.fp8check.proxy import proxy_spec, real_layers
from autoparallel.fp8check.runner import RunRecord, run_policy
from autoparallel.fp8check.settings import Fp8CheckSettings, load_settings, thresholds_for
from autoparallel.model.recipes import Nvfp4BlockScaling, Recipe, recipe_from_name
from autoparallel.specs.model import ModelSpec

Progress = Callable[[str], None]


@dataclass
class CheckResult:
    model: ModelSpec
    proxy: ModelSpec
    settings: Fp8CheckSettings
    bf16: RunRecord
    verdicts: dict[str, V.Verdict] = field(default_factory=dict)
    runs: dict[str, list[RunRecord]] = field(default_factory=dict)  # recipe -> full run, re-runs
    seconds: float = 0.0

    def summary(self, recipe: str) -> pd.DataFrame:
        """Per-layer, per-tensor statistics of the recipe's full-FP8 run."""
        return V.summarize(self.runs[recipe][0].stats)

    def stats_table(self) -> pd.DataFrame:
        """Every run's per-layer, per-tensor statistics in one table (the CSV)."""
        parts = []
        for recipe, runs in self.runs.items():
            for run in runs:
                s = V.summarize(run.stats)
                s.insert(0, "recipe", recipe)
                s.insert(1, "bf16_layers", str(list(run.bf16_layers)))
                s.insert(2, "final_loss", run.final_loss(self.settings.run.final_window))
                parts.append(s)
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _recipes(recipes: Sequence[str] | Mapping[str, Recipe] | None,
             settings: Fp8CheckSettings) -> dict[str, Recipe]:
    if isinstance(recipes, Mapping):
        return dict(recipes)
    names = list(recipes) if recipes else list(settings.recipes)
    out = {}
    for name in names:
        recipe = recipe_from_name(name)
        if recipe is None:
            raise ValueError("bf16 is the baseline of the check, not a recipe to check")
        out[name] = recipe
    return out


def run_check(model: ModelSpec, settings: Fp8CheckSettings | None = None,
              recipes: Sequence[str] | Mapping[str, Recipe] | None = None,
              module_recipes: Mapping[str, Recipe] | None = None,
              progress: Progress | None = None) -> CheckResult:
    """Check every recipe (names, or labels -> Recipe objects) on the proxy of ``model``.

    ``module_recipes`` (module pattern -> recipe) replaces the recipe of matching layers in
    every FP8 run: a deliberate fault for tests and benchmarks.
    """
    settings = settings or load_settings()
    say = progress or (lambda _msg: None)
    chosen = _recipes(recipes, settings)
    spec = proxy_spec(model, settings.proxy)
    start = time.perf_counter()
    say(f"bf16 baseline on {spec.name} ({settings.run.steps} steps)")
    bf16 = run_policy(spec, None, settings.run)
    result = CheckResult(model, spec, settings, bf16)
    for label, recipe in chosen.items():
        verdict, runs = check_recipe(spec, label, recipe, bf16, settings, module_recipes, say,
                                     model.num_layers)
        result.verdicts[label], result.runs[label] = verdict, runs
        say(f"{label}: {verdict.text}")
    result.seconds = time.perf_counter() - start
    return result


def end_layers_flag(layers: tuple[int, ...], proxy_layers: int, model_layers: int) -> str:
    """Megatron's flag for proxy end layers ``layers`` kept in BF16, in the real model's layers
    (the last proxy layer of 4 stands for the last quarter of the real ones)."""
    first = real_layers(min(layers), proxy_layers, model_layers).start
    return f"--num-layers-at-end-in-bf16 {model_layers - first}"


def check_recipe(spec: ModelSpec, label: str, recipe: Recipe, bf16: RunRecord,
                 settings: Fp8CheckSettings, module_recipes: Mapping[str, Recipe] | None,
                 say: Progress, model_layers: int | None = None
                 ) -> tuple[V.Verdict, list[RunRecord]]:
    model_layers = model_layers or spec.num_layers
    th, window = thresholds_for(settings, recipe.name), settings.run.final_window
    base = bf16.final_loss(window)
    faults = dict(module_recipes or {})

    def judged(run: RunRecord) -> tuple[float, pd.DataFrame, list[str]]:
        summary = V.summarize(run.stats)
        gap = V.loss_gap_pct(run.final_loss(window), base)
        bad = V.damaged(summary, th) if not summary.empty else summary.assign(problem=[])
        return gap, bad, V.failures(gap, bad, th)

    say(f"{label}: every layer in FP8")
    full = run_policy(spec, recipe, settings.run, module_recipes=faults)
    summary = V.summarize(full.stats)
    gap, bad, why = judged(full)
    worst = V.describe_damage(bad) if not bad.empty else ""
    if not why:
        return V.Verdict(label, V.OK, gap, worst=worst), [full]
    runs = [full]
    if isinstance(recipe, Nvfp4BlockScaling):  # Megatron keeps NVFP4's end layers in BF16
        candidates = V.end_sets(bad, spec.num_layers, settings.layer_search.max_bf16_layers)
    else:
        candidates = V.candidate_sets(summary, bad, spec.num_layers, th,
                                      settings.layer_search.max_bf16_layers)
    if not candidates:
        reason = "; ".join(why) + (f" (more than {settings.layer_search.max_bf16_layers} layers "
                                   "would have to stay in BF16)" if not bad.empty else "")
        return V.Verdict(label, V.REJECT, gap, reason=reason, worst=worst), runs
    tried = []
    for layers in candidates[:settings.layer_search.max_reruns]:
        say(f"{label}: re-run with layers {list(layers)} in BF16")
        run = run_policy(spec, recipe, settings.run, bf16_layers=layers, module_recipes=faults)
        runs.append(run)
        rerun_gap, _, rerun_why = judged(run)
        tried.append(f"{list(layers)}: {rerun_gap:+.2f} %")
        if not rerun_why:
            flags = (end_layers_flag(layers, spec.num_layers, model_layers)
                     if isinstance(recipe, Nvfp4BlockScaling) else "")
            return V.Verdict(label, V.OK_BF16, gap, layers, rerun_gap, worst=worst,
                             reruns=len(runs) - 1, flags=flags), runs
    reason = "; ".join(why) + "; BF16 layers tried: " + ", ".join(tried)
    return V.Verdict(label, V.REJECT, gap, reason=reason, worst=worst, reruns=len(runs) - 1), runs
