"""The cost model against published measurements (../shared/data/training_runs.csv).

Tolerances from issue 2: mean absolute error <= 10 %, no row worse than 25 %, every published
layout predicted to fit.
"""

import pytest

from autoparallel import validate

pytestmark = pytest.mark.skipif(not validate.DEFAULT_RUNS.exists(),
                                reason="shared/data/training_runs.csv is not beside this checkout")


@pytest.fixture(scope="module")
def report():
    return validate.validate_training()


def test_every_row_is_predicted(report):
    assert len(report) == 30
    assert set(report.source) == {"narayanan21", "korthikanti22", "nemo"}


def test_mean_absolute_error_within_10_percent(report):
    assert report.error_pct.abs().mean() <= 10.0


def test_no_row_worse_than_25_percent(report):
    worst = report.loc[report.error_pct.abs().idxmax()]
    assert abs(worst.error_pct) <= 25.0, f"{worst.id}: {worst.error_pct:+.1f} %"


def test_every_published_layout_fits(report):
    assert report.fits.all(), list(report.id[~report.fits])


def test_summary_has_a_row_per_source(report):
    s = validate.summary(report)
    assert list(s.source) == ["all", "korthikanti22", "narayanan21", "nemo"]
