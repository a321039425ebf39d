"""Every shipped fitted constant that sits on (or next to) a bound of its fit (issue 28 item 3).

    python benchmarks/bench_constants_at_bounds.py     # markdown table; a few seconds

Reads the constants as shipped (no refit): each hardware preset with constants of its own
(presets with ``efficiency_from`` share them) against the bounds of the fit that wrote them
(``calibrate.FITTED`` and the release speeds for published runs, ``MEASURED_FITTED`` for a
profiled machine; ``MOE_FITTED`` and the load imbalance for the MoE constants), and each serving
engine's block of the assumptions YAML against ``serve.fit.BOUNDS`` for the constants its fit
moves. "At a bound" is ``costmodel.bounds.at_bounds``, the test ``calibrate`` and ``serve.fit``
warn with.
"""

from __future__ import annotations

from autoparallel import io
from autoparallel.costmodel import calibrate
from autoparallel.costmodel.bounds import at_bounds
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.fit import FIT_KEYS, all_measured, fitted_at_bounds


def training_rows() -> list[tuple[str, str, object, int]]:
    """(preset, group of constants, AtBound, constants in that group) for every fitted preset."""
    out = []
    for name in sorted(io.preset_files("hardware")):
        hw = io.load_hardware(name)
        if hw.efficiency_from or not hw.calibrated_on:
            continue
        eff = hw.efficiency
        if hw.calibrated_on.startswith("profiling jobs"):
            groups = {"profiled": (calibrate.MEASURED_FITTED, {n: getattr(eff, n) for n in calibrate.MEASURED_FITTED})}
        else:
            releases = {f"release {r}": v for r, v in eff.release_speed.items()}
            groups = {"dense": ({**calibrate.FITTED, **{r: calibrate.RELEASE_SPEED_BOUNDS for r in releases}},
                                {**{n: getattr(eff, n) for n in calibrate.FITTED}, **releases}),
                      "MoE": ({**calibrate.MOE_FITTED, "moe_load_imbalance": calibrate.LOAD_IMBALANCE_BOUNDS},
                              {n: getattr(eff, n) for n in [*calibrate.MOE_FITTED, "moe_load_imbalance"]})}
        for group, (bounds, values) in groups.items():
            out += [(name, group, hit, len(values)) for hit in at_bounds(values, bounds, log=True)]
    return out


def serving_rows() -> list[tuple[str, str, object, int]]:
    """(engine, "serving", AtBound, constants its fit moves) for every fitted engine."""
    out = []
    for measured in all_measured():
        hits = fitted_at_bounds(measured, efficiency_for(measured.engine.name))
        out += [(measured.engine.name, "serving", hit, len(FIT_KEYS[measured.engine.batching])) for hit in hits]
    return out


def main() -> None:
    rows = training_rows() + serving_rows()
    print("| preset / engine | constants | constant | value | bound | side | at bounds in group |")
    print("|---|---|---|---|---|---|---|")
    counts: dict[tuple[str, str], int] = {}
    for where, group, _, _ in rows:
        counts[where, group] = counts.get((where, group), 0) + 1
    for where, group, hit, n in rows:
        print(f"| {where} | {group} | {hit.name} | {hit.value:.4g} | {hit.bound:.4g} | {hit.side} | "
              f"{counts[where, group]} of {n} |")


if __name__ == "__main__":
    main()
