"""The FP8 check as the CLI runs it: settings from YAML plus flags, progress lines, run folder.

Shared by ``autoparallel fp8-check`` and ``autoparallel search --fp8-check`` so that both run
exactly the same check and leave the same folder behind.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autoparallel.errors import UserError
from autoparallel.fp8check.settings import Fp8CheckSettings, load_settings
from autoparallel.progress import transient_progress
from autoparallel.specs.model import ModelSpec

CHECKABLE = ("fp8-delayed", "fp8-current", "fp8-blockwise", "mxfp8", "nvfp4")
# Short names TransformerEngine's recipes go by, accepted by --recipes.
ALIASES = {"delayed": "fp8-delayed", "current": "fp8-current", "blockwise": "fp8-blockwise"}


def settings_from_flags(path: str | None, steps: int | None, recipes: str | None,
                        seed: int | None = None, flag: str = "--settings") -> Fp8CheckSettings:
    """The settings file ``path`` (named by ``flag``) with the command line's steps, seed and recipes."""
    settings = load_settings(path, flag)
    run = settings.run
    if steps is not None:
        run = dataclasses.replace(run, steps=steps,
                                  final_window=min(run.final_window, steps))
    if seed is not None:
        run = dataclasses.replace(run, seed=seed)
    chosen = settings.recipes
    if recipes:
        valid = f"{', '.join(CHECKABLE)} (or {', '.join(ALIASES)})"
        names = [r.strip() for r in recipes.split(",")]
        if "" in names:  # a trailing or doubled comma: a typo, not a recipe list
            raise UserError(f"--recipes {recipes!r} has an empty item; give comma-separated names from {valid}")
        bad = [r for r in names if ALIASES.get(r, r) not in CHECKABLE]
        if bad:
            raise UserError(f"--recipes: {', '.join(bad)} cannot be checked; choose from {valid}")
        seen: dict[str, str] = {}
        for name in names:  # a recipe named twice (or by its alias too) would be one run: refuse, say which
            recipe = ALIASES.get(name, name)
            if recipe in seen:
                how = "" if seen[recipe] == name else f" (as {seen[recipe]} and {name})"
                raise UserError(f"--recipes {recipes!r} names {recipe} twice{how}; name each recipe once, "
                                f"from {valid}")
            seen[recipe] = name
        chosen = tuple(seen)
    return dataclasses.replace(settings, run=run, recipes=chosen)


def check_and_save(model: ModelSpec, settings: Fp8CheckSettings, results: Path | None,
                   command: list[str], console=None, plots: bool = True):
    """Run the check (torch imported here), print progress; returns (result, run_dir or None)."""
    if model.is_hybrid:  # proxy_spec would silently make it a dense transformer
        raise UserError(f"fp8-check cannot judge {model.name}: it is a hybrid Mamba-Transformer "
                        "(hybrid_layer_pattern), and the proxy model it trains is the built-in transformer, "
                        "which has no Mamba-2 layers")
    if model.is_dsv4:  # the same: its proxy would be a dense transformer without DeepSeek-V4's attention
        raise UserError(f"fp8-check cannot judge {model.name}: it is DeepSeek-V4 (csa_compress_ratios), and the "
                        "proxy model it trains is the built-in transformer, which has no compressed sparse attention, "
                        "DSA indexer or Hyper-Connections")
    try:
        from autoparallel.fp8check.check import run_check
    except ImportError as exc:  # torch missing: an optional dependency fails when used
        raise UserError(f"fp8-check needs torch: pip install 'autoparallel[model]' ({exc})") \
            from None
    if model.is_moe and console is not None:
        console.print(f"note: {model.name} is MoE; its proxy is dense (one expert's FFN)")
    if console is None:
        result = run_check(model, settings, progress=None)
    else:  # each run trains for a minute or more between two lines: a pulse with the elapsed time
        with transient_progress(console) as bar:
            bar.add_task(f"fp8-check: training the proxy ({settings.run.steps} steps a run)", total=None)
            result = run_check(model, settings,
                               progress=lambda msg: console.print(f"[dim]fp8-check: {msg}[/dim]"))
    run_dir = None
    if results is not None:
        from autoparallel.fp8check.report import write_check_folder
        from autoparallel.report.run_folder import staged
        run_dir = staged(results, lambda staging: write_check_folder(result, staging, command, plots=plots))
    return result, run_dir
