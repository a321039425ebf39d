"""Fit a GPU's efficiency constants to published runs and store them in its hardware YAML.

The fit minimises the mean squared log error between predicted and published figures over the
rows of the runs CSV measured on that GPU (each counted as its source counts, see
``autoparallel.validate``). Candidate layouts are generated once per row; each trial only
reprices them with new constants, so a fit takes tens of seconds. The result is written to a copy
of the hardware YAML in the user's preset folder (or ``--output``), below a marker comment that
names the data, the date and the before/after error, so the provenance of every fitted number
stays next to it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
from rich.console import Console

from autoparallel import io, resources
from autoparallel.costmodel.bounds import AtBound, at_bounds, warn_at_bounds
from autoparallel.errors import UserError
from autoparallel.measured_runs import (default_runs, load_balance_pairs, load_runs, log_error, predict_balance_ratio,
                                       predict_row, software_date)
from autoparallel.report.run_folder import write_atomic
from autoparallel.specs.hardware import Efficiency, HardwareSpec

# Fitted constants and their bounds; the rest of Efficiency keeps its default or YAML value.
FITTED = {
    "gemm_max": (0.3, 0.95),
    "gemm_half_gflop": (0.1, 200.0),
    "attention": (0.15, 0.9),
    "elementwise_bytes_per_token_hidden": (10.0, 250.0),
    "tp_overlap": (0.01, 0.95),
}
MARKER = "# --- fitted by `autoparallel calibrate`"


def _with(hw: HardwareSpec, values: dict) -> HardwareSpec:
    return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **values))


def _percent(log_errors) -> float:
    return float(np.mean(np.abs(np.expm1(log_errors))) * 100)


RELEASE_SPEED_BOUNDS = (0.5, 1.5)


# A release's speed is fitted only where the rows pin it: enough rows of the release itself and
# of the newest release it is measured against (a factor fitted on one or two rows just absorbs
# their error, and what a left-out model's rows leave behind cannot pin it either).
MIN_RELEASE_ROWS = 3
MIN_NEWEST_RELEASE_ROWS = 5


def release_factors_to_fit(rows, software_date) -> list[str]:
    """The older releases among ``rows`` whose speed relative to the newest one is fitted."""
    counts = Counter(p.software for p in rows)
    ordered = sorted(counts, key=software_date)
    if len(ordered) < 2 or counts[ordered[-1]] < MIN_NEWEST_RELEASE_ROWS:
        return []
    return [r for r in ordered[:-1] if counts[r] >= MIN_RELEASE_ROWS]


GPU_SPEED_BOUNDS = (0.5, 2.0)
# A family GPU's tensor speed relative to the donor's (``Efficiency.gpu_speed``) is fitted only
# where its own rows and the donor's pin it, as a release's speed is.
MIN_GPU_ROWS = 3
MIN_DONOR_ROWS = 5


def gpu_factors_to_fit(rows, donor: str | None) -> list[str]:
    """The GPUs among ``rows`` (hardware preset names) other than ``donor``, the one whose
    constants they take, whose sustained tensor speed relative to it is fitted; none without a
    donor."""
    counts = Counter(p.hardware.name for p in rows)
    if not donor or counts[donor] < MIN_DONOR_ROWS:
        return []
    return sorted(g for g, n in counts.items() if g != donor and n >= MIN_GPU_ROWS)


def speed_donor(hw: HardwareSpec, asked: bool = False) -> str | None:
    """``fit``'s ``donor`` for a refit of ``hw``'s constants: its name where the GPU speeds of its
    family are fitted (``asked``, or the preset holds some: a refit keeps what it was fitted with),
    else None."""
    return hw.name if asked or hw.efficiency.gpu_speed else None


def uncalibrated(efficiency: Efficiency) -> Efficiency:
    """``efficiency`` with every fitted constant back at its uncalibrated default."""
    defaults = Efficiency()
    return dataclasses.replace(efficiency, release_speed={}, gpu_speed={}, **{n: getattr(defaults, n) for n in FITTED})


class Fit(NamedTuple):
    """A fit's result: ``values`` to put into ``Efficiency`` (``release_speed`` among them), the
    mean |error| % before and after, which constants were fitted or kept, and why, and which
    fitted ones landed on a bound (``bounds.at_bounds``: names as fitted, ``release <r>`` too)."""

    values: dict
    before: float
    after: float
    fitted: tuple[str, ...]
    unseen: tuple[str, ...]  # no row's prediction depends on them
    capped: tuple[str, ...]  # seen, but fewer rows than constants: the least telling ones are kept
    at_bounds: tuple[AtBound, ...] = ()


def _least_squares(names: list[str], bounds: list[tuple[float, float]], start: list[float], errors,
                   max_constants: int) -> Fit:
    """Fit the constants ``names`` so that the rows' log errors ``errors({name: value})`` are
    least squares (trust region, bounded, in log space), from ``start``. Constants no row can see
    keep their start, and so do the ones that move the errors least beyond ``max_constants``.
    ``values`` of the result holds the fitted constants only."""
    from scipy.optimize import least_squares
    low, high = np.log([b[0] for b in bounds]), np.log([b[1] for b in bounds])
    x0 = np.clip(np.log(start), low, high)

    def run(x, keep):
        return errors(dict(zip(keep, np.exp(x))))

    base = run(x0, names)
    # How far each constant, nudged alone (down from its upper bound), moves the rows' errors.
    nudged = np.where(x0 + 0.2 <= high, x0 + 0.2, x0 - 0.2)
    moves = [float(np.linalg.norm(run(np.where(np.arange(len(names)) == i, nudged, x0), names) - base))
             for i in range(len(names))]
    seen = [i for i in sorted(range(len(names)), key=lambda i: -moves[i]) if moves[i] > 0]
    visible = sorted(seen[:max_constants])
    keep = [names[i] for i in visible]
    unseen = tuple(n for n, move in zip(names, moves) if move == 0)
    capped = tuple(names[i] for i in seen[max_constants:])
    if not keep:
        return Fit({}, _percent(base), _percent(base), (), unseen, capped)
    result = least_squares(lambda x: run(x, keep), x0[visible], bounds=(low[visible], high[visible]),
                           diff_step=0.02, max_nfev=80)
    values = dict(zip(keep, (float(v) for v in np.exp(result.x))))
    return Fit(values, _percent(base), _percent(result.fun), tuple(keep), unseen, capped,
               tuple(at_bounds(values, dict(zip(names, bounds)), log=True)))


def fit(rows, efficiency: Efficiency, progress=None, donor: str | None = None) -> Fit:
    """Fit the ``FITTED`` constants to ``rows`` (prepared runs, each repriced on its own GPU with
    the trial constants), starting from ``efficiency``; with rows of several software releases,
    also each older release's speed relative to the newest (``release_speed``); with rows of
    several GPUs that take the constants of ``donor`` (the preset they belong to), each other
    GPU's sustained tensor speed relative to it (``gpu_speed``).

    Least squares on the log errors (trust region, bounded, in log space). Constants no row can
    see (FP8 GEMMs without an FP8 row, TP overlap without a TP row) keep their value, and so do
    the ones that move the rows' predictions least when there are more constants than rows:
    never more constants are fitted than there are rows.
    """
    releases = release_factors_to_fit(rows, software_date)
    gpus = gpu_factors_to_fit(rows, donor)
    efficiency = dataclasses.replace(
        efficiency, release_speed={r: v for r, v in efficiency.release_speed.items() if r in releases},
        gpu_speed={g: v for g, v in efficiency.gpu_speed.items() if g in gpus})
    names = list(FITTED) + [f"release {r}" for r in releases] + [f"gpu {g}" for g in gpus]
    bounds = [FITTED[n] for n in FITTED] + [RELEASE_SPEED_BOUNDS] * len(releases) + [GPU_SPEED_BOUNDS] * len(gpus)
    start = ([getattr(efficiency, n) for n in FITTED] + [efficiency.release_speed.get(r, 1.0) for r in releases]
             + [efficiency.gpu_speed.get(g, 1.0) for g in gpus])

    def trial(values: dict) -> Efficiency:
        def factors(prefix, current):
            return {**current, **{n[len(prefix):]: v for n, v in values.items() if n.startswith(prefix)}}
        return dataclasses.replace(efficiency, release_speed=factors("release ", efficiency.release_speed),
                                   gpu_speed=factors("gpu ", efficiency.gpu_speed),
                                   **{n: v for n, v in values.items() if n in FITTED})

    def errors(values: dict) -> np.ndarray:
        if progress:
            progress()
        eff = trial(values)
        return np.array([log_error(p, eff) for p in rows])

    result = _least_squares(names, bounds, start, errors, len(rows))
    fitted_eff = trial(result.values)
    fitted = {n: float(getattr(fitted_eff, n)) for n in result.values if n in FITTED}
    fitted["release_speed"] = {r: float(v) for r, v in fitted_eff.release_speed.items()}
    fitted["gpu_speed"] = {g: float(v) for g, v in fitted_eff.gpu_speed.items()}
    return result._replace(values=fitted)


# --- mixture of experts (issue 14) -----------------------------------------------------------------
# The MoE layer's constants (``costmodel.moe``), fitted on the MoE rows of every GPU at once (each
# row keeps its own GPU's fitted dense constants): no GPU has enough MoE rows of its own, and they
# describe Megatron's dispatcher and TransformerEngine's calls per expert more than the GPU. The dense
# fit never sees them (no dense row does), so fitting them leaves the dense figures unchanged.
MOE_FITTED = {
    "alltoall": (0.05, 1.0),
    "moe_expert_call_s": (1e-7, 1e-3),
}
LOAD_IMBALANCE_BOUNDS = (1e-3, 2.0)


def uncalibrated_moe(efficiency: Efficiency) -> Efficiency:
    """``efficiency`` with the ``MOE_FITTED`` constants back at their uncalibrated defaults (the
    load imbalance, fitted on other data, stays)."""
    defaults = Efficiency()
    return dataclasses.replace(efficiency, **{n: getattr(defaults, n) for n in MOE_FITTED})


def fit_moe(rows, start: Efficiency | None = None, progress=None, fixed: dict | None = None) -> Fit:
    """Fit ``MOE_FITTED`` to MoE ``rows`` (of any GPUs), from ``start``'s values (default: the
    uncalibrated ones); ``fixed`` values replace each row's own too."""
    start = start or Efficiency()
    fixed = fixed or {}

    def errors(values: dict) -> np.ndarray:
        if progress:
            progress()
        return np.array([log_error(p, dataclasses.replace(p.hardware.efficiency, **fixed, **values)) for p in rows])

    names = list(MOE_FITTED)
    return _least_squares(names, [MOE_FITTED[n] for n in names], [getattr(start, n) for n in names], errors,
                          len(rows))


def fit_load_imbalance(pairs, moe_values: dict | None = None) -> Fit:
    """Fit ``moe_load_imbalance`` to published pairs of the same layout run with forced-balanced
    and with dropless routing (``measured_runs.load_balance_pairs``): the predicted throughput ratio
    against the measured one, with the MoE constants ``moe_values`` (default: uncalibrated);
    before / after are the mean |error| % of the ratio."""
    start = Efficiency().moe_load_imbalance
    moe_values = {**{n: getattr(Efficiency(), n) for n in MOE_FITTED}, **(moe_values or {})}

    def errors(values: dict) -> np.ndarray:
        return np.array([np.log(predict_balance_ratio(p, {**moe_values, **values}) / p.measured_ratio)
                         for p in pairs])

    return _least_squares(["moe_load_imbalance"], [LOAD_IMBALANCE_BOUNDS], [start], errors, len(pairs))


def _yaml_float(value: float) -> str:
    """Four significant digits that YAML 1.1 still reads as a float (it needs a dot: 3.0e-05)."""
    text = f"{value:.4g}"
    return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text


def user_preset(name: str) -> Path:
    """Where a calibration of hardware preset ``name`` is written: the user's preset folder,
    never the installed package (a user preset of the same name takes the shipped one's place)."""
    return resources.user_dir() / "hardware" / f"{name}.yaml"


def write_block(path: Path, fitted: dict, efficiency: Efficiency, note: str, calibrated_on: str,
                source: Path | None = None, rename: str | None = None) -> None:
    """Write hardware YAML ``source`` (default ``path`` itself) to ``path`` with its fitted block
    at the end replaced (or appended); ``note`` (one or more lines) heads the block. With
    ``rename`` the preset becomes a new one: that ``name:``, no aliases (they belong to the
    original)."""
    text = (source or path).read_text()
    if MARKER in text:
        text = text[: text.index(MARKER)]
    # Its own constants now: it no longer inherits another preset's.
    text = "\n".join(line for line in text.splitlines() if not line.startswith("efficiency_from:"))
    if rename:
        text = re.sub(r"^name:.*$", f"name: {rename}", text, count=1, flags=re.M)
        text = re.sub(r"^aliases:[^\n]*\n(?:[ \t]*- [^\n]*\n)*", "", text + "\n", count=1, flags=re.M)
    values = {**dataclasses.asdict(efficiency), **fitted}
    lines = [MARKER, *(f"# {line}" for line in note.splitlines()), f"calibrated_on: {calibrated_on!r}", "efficiency:"]
    for key, value in values.items():
        if isinstance(value, dict):
            lines += [f"  {key}:"] + [f"    {k!r}: {_yaml_float(v)}" for k, v in value.items()] if value else []
        else:
            lines.append(f"  {key}: {_yaml_float(value)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")


PRESET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def summary(fit_result: Fit, rows: int) -> dict:
    """What ``calibrate --json`` prints of a fit: the fitted values, the mean |error| before and
    after, and the constants on a bound."""
    return {"rows": rows, "fitted": fit_result.values, "before_mean_abs_error_pct": fit_result.before,
            "after_mean_abs_error_pct": fit_result.after, "at_bounds": [h.as_dict() for h in fit_result.at_bounds]}


def fit_heading(constants: str, rows: str) -> str:
    """The line above a fit's "name: before -> after" lines, saying what they are (each calibrate
    path prints one): "h100-sxm's efficiency constants, fitted to 16 measured runs (before -> after):"."""
    return f"{constants}, fitted to {rows} (before -> after):"


def main(gpu: str, runs: Path | None, write: bool, console: Console, output: Path | None = None,
         as_name: str | None = None, with_published: bool = False, gpu_speed: bool = False) -> dict:
    """Fit ``gpu`` to the rows of ``runs`` (default: the published runs; ``with_published``: both)
    measured on it and on the GPUs that take its constants (``efficiency_from``), with those GPUs'
    speeds relative to it (``fit``'s ``donor``) if ``gpu_speed`` or the preset holds some already;
    write the preset to ``output`` (default: the user's preset folder, as ``as_name`` if given).
    Returns ``summary`` of the fit."""
    from autoparallel.progress import transient_progress

    if as_name is not None and not PRESET_NAME.match(as_name):
        raise UserError(f"--as {as_name!r}: a preset name is letters, digits, '.', '_' and '-'")
    hw = io.load_hardware(gpu)

    def measured_on_gpu(paths):
        return [p for p in load_runs(paths) if p.hardware.name == hw.name or p.hardware.efficiency_from == hw.name]

    with transient_progress(console) as bar:  # reading the rows takes seconds too
        task = bar.add_task(f"reading the runs measured on {hw.name}", total=None)
        own = measured_on_gpu([runs]) if runs else []
        published = measured_on_gpu(list(default_runs())) if with_published or not runs else []
        rows = own + published
        runs_paths = ([runs] if runs else []) + (list(default_runs()) if published else [])
        if not rows:
            names = ", ".join(p.name for p in ([runs] if runs else list(default_runs())))
            raise UserError(f"no dense rows of {names} were measured on {hw.name}; nothing to fit")
        bar.update(task, description=f"fitting {hw.name} on {len(rows)} runs")
        result = fit(rows, hw.efficiency, progress=lambda: bar.advance(task), donor=speed_donor(hw, gpu_speed))
    console.print(fit_heading(f"{hw.name}'s efficiency constants", f"{len(rows)} measured runs"), highlight=False)
    for name, value in result.values.items():
        if name == "release_speed":
            console.print("  release_speed (relative to the newest release): "
                          + (", ".join(f"{r} {v:.3f}" for r, v in value.items()) or "none fitted"))
        elif name == "gpu_speed":
            console.print(f"  gpu_speed (sustained tensor speed relative to {hw.name}): "
                          + (", ".join(f"{g} {v:.3f}" for g, v in value.items()) or "none fitted"))
        else:
            console.print(f"  {name}: {getattr(hw.efficiency, name):.4g} -> {value:.4g}")
    kept = _kept(result, len(rows))
    for line in kept:
        console.print(f"  {line}")
    warn_at_bounds(console, result.at_bounds)
    gpus = sorted({str(p.row["gpu"]) for p in rows})
    sources = sorted({p.source for p in rows})
    errors = f"mean |error| {result.before:.1f} % before, {result.after:.1f} % after"
    console.print(f"{errors} on {len(rows)} rows ({', '.join(gpus)})")
    if own and published:
        after = dataclasses.replace(hw.efficiency, **result.values)
        own_errors = (f"on the {len(own)} rows of {runs.name}: {mean_abs_error_pct(own, hw.efficiency):.1f} % "
                      f"before, {mean_abs_error_pct(own, after):.1f} % after")
        console.print(f"mean |error| {own_errors}")
        errors += f"; {own_errors}"
    if write:
        name = as_name or hw.name
        path = output or user_preset(name)
        names = " + ".join(p.name for p in runs_paths)
        note = [f"{dt.date.today().isoformat()}: {len(rows)} rows of {names} ({', '.join(gpus)}; "
                f"{', '.join(sources)}); {errors}",
                *([f"calibrated copy of {hw.name}"] if as_name else []),
                f"fitted: {', '.join(result.fitted) or 'nothing'}", *kept,
                *_wrapped("runs: " + ", ".join(p.id for p in rows))]
        existed = Path(path).exists()  # an earlier fit (or any file -o names) is replaced whole: say so
        write_block(path, result.values, hw.efficiency, "\n".join(note),
                    f"{names}: {len(rows)} rows on {', '.join(gpus)}",
                    source=io.resolve_preset("hardware", gpu), rename=as_name)
        said(console, f"{'replaced' if existed else 'wrote'} {path}"
             + (f" (use it with --gpu {as_name})" if as_name else ""))
    return summary(result, len(rows))


def said(console: Console, line: str) -> None:
    """``line`` broken between phrases on a terminal (a long preset path left "(use it" / "with
    --gpu NAME)" to the console's word wrap), one line in a pipe."""
    from autoparallel.report.fit import phrase_lines
    console.print("\n".join(phrase_lines(line, console.width)), markup=False, highlight=False)


def mean_abs_error_pct(rows, efficiency: Efficiency) -> float:
    """Mean |predicted / measured - 1| in percent over prepared rows, with ``efficiency``."""
    return float(np.mean([abs(predict_row(p, efficiency)["error_pct"]) for p in rows]))


def _kept(result: Fit, n_rows: int) -> list[str]:
    """What the fit left at its value, and why."""
    from autoparallel.words import plural
    lines = []
    if result.unseen:
        lines.append(f"kept, no row depends on them: {', '.join(result.unseen)}")
    if result.capped:
        lines.append(f"kept, {plural(n_rows, 'row')} fit at most {plural(n_rows, 'constant')}: "
                     f"{', '.join(result.capped)}")
    return lines


def _wrapped(text: str, width: int = 98) -> list[str]:
    out, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = "  " + word
        else:
            line = f"{line} {word}" if line else word
    return out + [line]


def main_moe(gpu: str, runs: Path | None, write: bool, console: Console, output: Path | None = None) -> dict:
    """Fit the MoE constants: ``moe_load_imbalance`` to the forced-balance vs dropless pairs, then
    ``MOE_FITTED`` to the MoE rows of every GPU; write them into ``gpu``'s preset (its dense
    constants and their provenance unchanged). Returns ``summary`` of the fit (the load
    imbalance's bound counted too)."""
    from autoparallel.progress import transient_progress

    hw = io.load_hardware(gpu)
    runs_paths = [runs] if runs else list(default_runs())
    with transient_progress(console) as bar:  # reading the rows takes seconds too
        task = bar.add_task("reading the mixture-of-experts runs", total=None)
        rows = load_runs(runs_paths, moe=True)
        if not rows:
            names = ", ".join(p.name for p in runs_paths)
            raise UserError(f"{names} has no mixture-of-experts rows; nothing to fit")
        pairs = load_balance_pairs()
        # The published MoE rows are mostly force-balanced and the pairs see the other MoE constants a
        # little: the imbalance from uncalibrated constants, the MoE constants with it, the imbalance
        # again with those (independent of what the presets held before).
        imbalance = fit_load_imbalance(pairs).values.get("moe_load_imbalance", hw.efficiency.moe_load_imbalance)
        bar.update(task, description=f"fitting the MoE constants on {len(rows)} runs")
        moe_fit = fit_moe(rows, progress=lambda: bar.advance(task), fixed={"moe_load_imbalance": imbalance})
    fitted, before, after = dict(moe_fit.values), moe_fit.before, moe_fit.after
    ratio = fit_load_imbalance(pairs, fitted)
    ratio_before, ratio_after = ratio.before, ratio.after
    fitted["moe_load_imbalance"] = ratio.values.get("moe_load_imbalance", imbalance)
    console.print(fit_heading(f"{hw.name}'s MoE constants", f"{len(rows)} MoE runs"), highlight=False)
    for name, value in fitted.items():
        console.print(f"  {name}: {getattr(hw.efficiency, name):.4g} -> {value:.4g}")
    hits = moe_fit.at_bounds + ratio.at_bounds
    warn_at_bounds(console, hits)
    gpus = sorted({str(p.row["gpu"]) for p in rows})
    console.print(f"load-imbalance ratio error on {len(pairs)} pairs: {ratio_before:.1f} % -> {ratio_after:.1f} %")
    console.print(f"mean |error| on {len(rows)} MoE rows ({', '.join(gpus)}): {before:.1f} % -> {after:.1f} %")
    if write:
        path = output or user_preset(hw.name)
        source = io.resolve_preset("hardware", gpu)
        text = source.read_text()
        notes = [line[2:] for line in (text[text.index(MARKER):].splitlines()[1:] if MARKER in text else [])
                 if line.startswith("# ") and not line.startswith("# MoE constants")]
        names = " + ".join(p.name for p in runs_paths)
        notes.append(f"MoE constants ({dt.date.today().isoformat()}): {len(rows)} MoE rows of {names} "
                     f"({', '.join(gpus)}), mean |error| {before:.1f} % -> {after:.1f} %; load imbalance on "
                     f"{len(pairs)} forced/dropless pairs of moe_load_balance.csv")
        write_block(path, fitted, hw.efficiency, "\n".join(notes), hw.calibrated_on, source=source)
        console.print(f"wrote {path}")
    return summary(moe_fit._replace(values=fitted, at_bounds=hits), len(rows))


# --- fitting to profiling jobs (issue 4) ----------------------------------------------------------
# What a profiled machine's own step times can pin down; bounds are wide because a CPU running
# the built-in transformer is far from a GPU (per-layer Python overhead, gloo over TCP).
MEASURED_FITTED = {
    "gemm_max": (0.05, 1.0),
    "gemm_half_gflop": (1e-4, 50.0),
    "attention": (0.01, 1.0),
    "elementwise_bytes_per_token_hidden": (5.0, 5000.0),
    "layer_overhead_s": (1e-7, 0.05),
    "nvlink": (0.01, 1.0),
}


def fit_measured(model, hw: HardwareSpec, rows, measured_step_s, names=None, slowdown=None
                 ) -> tuple[dict, float, float]:
    """Fit efficiency constants so the cost model's step time matches measured ones.

    ``rows``: a frame with the Plan columns of the measured layouts; ``measured_step_s`` their
    measured step times. Minimises the mean squared log error (Powell, in log space of the
    constants). ``slowdown`` (per row, default 1) multiplies the predicted step time: ranks that
    share a device, e.g. more processes than cores on a CPU, each get that much less of it.
    Returns (fitted constants, mean |error| % before, after).
    """
    from scipy.optimize import minimize

    from autoparallel.costmodel.estimate import estimate_columns
    from autoparallel.specs.plan import Plan
    names = list(names or MEASURED_FITTED)
    cols = {n: np.asarray(rows[n].to_numpy() if hasattr(rows[n], "to_numpy") else rows[n])
            for n in Plan.field_names()}
    measured = np.asarray(measured_step_s, dtype=float)
    factor = np.ones_like(measured) if slowdown is None else np.asarray(slowdown, dtype=float)
    low = np.log([MEASURED_FITTED[n][0] for n in names])
    high = np.log([MEASURED_FITTED[n][1] for n in names])
    start = np.clip(np.log([getattr(hw.efficiency, n) for n in names]), low, high)

    def errors(x) -> np.ndarray:
        trial = _with(hw, dict(zip(names, np.exp(np.clip(x, low, high)))))
        predicted = estimate_columns(model, trial, cols, 1.0)["step_time_s"] * factor
        return np.log(predicted / measured)

    def loss(x) -> float:
        return float(np.mean(errors(x) ** 2))

    result = minimize(loss, start, method="Powell", bounds=list(zip(low, high)),
                      options={"maxfev": 3000, "xtol": 1e-4, "ftol": 1e-8})
    fitted = dict(zip(names, (float(v) for v in np.exp(np.clip(result.x, low, high)))))
    pct = lambda e: float(np.mean(np.abs(np.expm1(e))) * 100)  # noqa: E731
    return fitted, pct(errors(start)), pct(errors(result.x))
