"""The cost model against published measurements (the dense rows of both runs files).

Tolerances from issue 11: in-sample mean |error| <= 6 %, no row worse than 15 %; leave-one-model-out
(each model's rows predicted by constants refitted without them) mean <= 10 %, max <= 25 %; every
published layout predicted to fit.
"""

import pytest

from autoparallel import validate


@pytest.fixture(scope="module")
def report():
    return validate.validate_training()


def test_every_dense_row_of_both_files_is_predicted(report):
    assert len(report) == 51
    assert {"narayanan21", "korthikanti22", "nemo 24.07", "nemo 25.11"} <= set(report.source)
    assert {"a100-sxm-80g", "h100-sxm", "b200", "gb200", "gb300"} == set(report.gpu)


def test_in_sample_error(report):
    assert report.error_pct.abs().mean() <= 6.0
    worst = report.loc[report.error_pct.abs().idxmax()]
    assert abs(worst.error_pct) <= 15.0, f"{worst.id}: {worst.error_pct:+.1f} %"


def test_leave_one_model_out_error(report):
    assert report.heldout_error_pct.abs().mean() <= 10.0
    worst = report.loc[report.heldout_error_pct.abs().idxmax()]
    assert abs(worst.heldout_error_pct) <= 25.0, f"{worst.id}: {worst.heldout_error_pct:+.1f} %"


def test_every_published_layout_fits(report):
    assert report.fits.all(), list(report.id[~report.fits])


def test_summary_reports_sources_and_gpus_with_held_out_errors(report):
    s = validate.summary(report)
    assert list(s.by.unique()) == ["all", "source", "gpu"]
    assert {"heldout_mean_abs_error_pct", "heldout_max_abs_error_pct"} <= set(s.columns)
    assert (s.heldout_mean_abs_error_pct >= 0).all()


def test_held_out_rows_do_not_see_their_own_model(report):
    """A refit without the model changes its prediction: the held-out figure is not in-sample."""
    nemo = report[report.source.str.startswith("nemo")]
    assert (nemo.heldout_predicted != nemo.predicted).all()
