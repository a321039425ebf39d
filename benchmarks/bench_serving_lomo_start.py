"""Serving leave-one-model-out from a warm start (the old way) against a cold start (issue 28 item 2).

    python benchmarks/bench_serving_lomo_start.py     # markdown; 40 refits, under a minute on 2 shared cores

Warm: each refit started from the engine's fit that saw every row and stopped at a 0.1 % relative
change, as ``serve/fit.py`` did until issue 28; what the held-out model's rows taught that fit
stays in the refit. Cold: each refit starts from the uncalibrated ``InferenceEfficiency()`` with
the shipped fit's own stop (``fit.refit_without``), as training's refits do; this is what
``autoparallel validate --inference`` prints. The figure is the mean |error| % of the held-out
rows; "fit rows" are the rows the engine's fit uses (FT: all; TensorRT-LLM: H100 and H200).
"""

from __future__ import annotations

import pandas as pd

from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.fit import all_measured, fit_rows, leave_one_model_out


def held_out(warm: bool) -> pd.DataFrame:
    """Every predicted row of every engine with its held-out error (``lomo_pct``) and whether the
    engine's fit uses it."""
    parts = []
    for measured in all_measured():
        start = efficiency_for(measured.engine.name) if warm else None
        lomo = leave_one_model_out(measured, start=start, tol=1e-3 if warm else 1e-4)
        rows = measured.predicted_rows
        parts.append(pd.DataFrame({"engine": measured.engine.name, "model": rows["model"], "lomo_pct": lomo,
                                   "fit_row": rows.index.isin(fit_rows(measured).index)}))
    return pd.concat(parts, ignore_index=True)


def main() -> None:
    warm, cold = held_out(warm=True), held_out(warm=False)
    cases = [(f"{engine}, {'fit rows' if fit else 'other GPUs'}", (warm["engine"] == engine) & (warm["fit_row"] == fit))
             for (engine, fit), _ in warm.groupby(["engine", "fit_row"], sort=False)]
    llama = warm["fit_row"] & (warm["model"] == "Llama-3-8B")
    cases += [(f"{engine}, Llama-3-8B, fit rows", llama & (warm["engine"] == engine))
              for engine in warm.loc[llama, "engine"].unique()]
    cases += [("every engine, fit rows", warm["fit_row"]), ("every engine, every row", warm["engine"] != "")]
    print("| held-out rows | n | warm start % | cold start % |\n|---|---|---|---|")
    for label, mask in cases:
        print(f"| {label} | {int(mask.sum())} | {warm.loc[mask, 'lomo_pct'].abs().mean():.1f} | "
              f"{cold.loc[mask, 'lomo_pct'].abs().mean():.1f} |")


if __name__ == "__main__":
    main()
