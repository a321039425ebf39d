"""Today's figures that the tests' expected failures quote (issue 28 item 5), in one run.

Each test module that holds an unmet issue target keeps today's figure in one dict at its top
(tests/test_validate.py FIGURES and NOT_FITTING_AS_RUN, tests/serve/test_serve_validate.py FIGURES,
tests/serve/test_serve_moe.py MIXTRAL_MEAN, tests/serve/test_serve_mlperf.py P99). When the cost
model moves, run this and copy the new figures there (about 7 min on a 2-core CPU).

    PYTHONPATH=$PWD python benchmarks/bench_test_figures.py
"""

from __future__ import annotations

from autoparallel import validate
from autoparallel.serve import mlperf
from autoparallel.serve.assumptions import efficiency_for
from autoparallel.serve.measured import load_serving_runs, predict
from autoparallel.serve.validate import held_out_report


def training() -> None:
    report = validate.validate_training()
    for kind, g in report.groupby("kind"):
        print(f"{kind}: {len(g)} rows, in sample mean / max {g.error_pct.abs().mean():.2f} / "
              f"{g.error_pct.abs().max():.2f} %, held out {g.heldout_error_pct.abs().mean():.2f} / "
              f"{g.heldout_error_pct.abs().max():.2f} %, {int(g.fits.sum())} fit as run")
        for column in ("error_pct", "heldout_error_pct"):
            worst = g.loc[g[column].abs().idxmax()]
            print(f"  worst {column}: {worst.id} {worst[column]:+.1f} %")
    for _, r in report[~report.fits].iterrows():
        print(f"  not fitting as run: {r.id}: {r.peak_memory_gib:.1f} GiB | {r.variant}")
    deepseek = report[report.id.str.startswith("deepseek-v3-report")].iloc[0]
    print(f"  DeepSeek-V3 own run: {deepseek.error_pct:+.1f} %, {deepseek.peak_memory_gib:.0f} GiB")


def serving() -> None:
    held = held_out_report()
    rows = held[(held.engine == "tensorrt-llm-0.10") & held.hardware.isin(("h100-sxm", "h200"))]
    print(f"TensorRT-LLM 0.10 on H100/H200: {len(rows)} rows, in sample {rows.error_pct.abs().mean():.2f} %, "
          f"held out {rows.lomo_pct.abs().mean():.2f} %")
    m = next(x for x in load_serving_runs() if x.engine.name == "tensorrt-llm-0.10")
    mixtral = predict(m, efficiency_for("tensorrt-llm-0.10"), m.predicted_rows[m.predicted_rows.model == "Mixtral-8x7B"])
    print(f"Mixtral-8x7B, all {len(mixtral)} rows of 0.10: in sample {mixtral.error_pct.abs().mean():.2f} %")
    means = mlperf.scenario_means(mlperf.predict_rows(mlperf.load_rows()[0], cross=False))
    print(f"MLPerf Inference p99 TTFT / TPOT: {means['ttft_p99_pct']:.2f} / {means['tpot_p99_pct']:.2f} %")


if __name__ == "__main__":
    training()
    serving()
