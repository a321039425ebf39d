"""`search --strategy optuna --profile job|layer`: the study's top-k profiled like the grid's,
kept through `--resume` and `report`, replaced by a resume that profiles again."""

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("optuna", reason="the optuna extra is not installed")

from autoparallel.cli import main  # noqa: E402
from autoparallel.report.plots import pareto_front  # noqa: E402
from autoparallel.search import run  # noqa: E402
from autoparallel.search.measured import choose, merge  # noqa: E402


@pytest.fixture
def search(tmp_path, small_yaml, monkeypatch):
    """argv of a tiny optuna search: 1 CPU rank, 3 valid layouts (mbs 1, 2, 4), all seen in 6
    trials; the run folder and the layer-profile store land in ``argv.results``."""
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "runs"

    def argv(*extra):
        return ["search", "--model", str(small_yaml), "--gpus", "1", "--gpu", "cpu-local",
                "--space", "cpu-profiling", "--recompute", "none", "--results", str(results),
                "--strategy", "optuna", "--trials", "6", "--profile-steps", "2",
                "--profile-warmup", "1", *extra]
    argv.results = results
    return argv


def _run_dir(results):
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]  # beside it: layer_profiles.json
    return run_dir


def _frames(run_dir):
    return pd.read_csv(run_dir / "candidates.csv"), pd.read_csv(run_dir / "profiled.csv")


def test_optuna_profiles_its_top_k_and_calibrates_from_the_run(search, capsys):
    assert main(search("--profile", "job", "--top-k", "2")) == 0
    run_dir = _run_dir(search.results)
    frame, profiled = _frames(run_dir)
    feasible = frame[frame["fits"]]
    best_predicted = feasible.sort_values("tokens_per_s_per_gpu", ascending=False)["trial"].head(2)
    measured = frame[frame["measured_step_time_s"].notna()]
    assert set(measured["trial"]) == set(best_predicted) == set(profiled["trial"])
    assert (measured["measured_tokens_per_s_per_gpu"] > 0).all()
    assert frame["measurement_error"].isna().all()  # '' in the CSV: every job ran
    # ranked by measurement: the measured rows lead, best measured first
    assert list(frame["rank"].head(2)) == [1, 2] and frame.index[:2].equals(measured.index)
    assert measured["measured_tokens_per_s_per_gpu"].is_monotonic_decreasing
    assert "meas. step s" in (run_dir / "ranked.md").read_text()
    before = (run_dir / "candidates.csv").read_text()
    # the tables are rebuilt from the study on resume and report; the measurements stay
    assert main(["search", "--resume", str(run_dir), "--json"]) == 0
    assert (run_dir / "candidates.csv").read_text() == before
    capsys.readouterr()
    assert main(["calibrate", "--from", str(run_dir), "--dry-run"]) == 0
    assert "on 2 measured layouts" in capsys.readouterr().out


def test_failed_job_is_recorded_and_resume_with_profile_replaces_it(search, capsys):
    assert main(search("--profile", "job", "--top-k", "1", "--memory-cap-gib", "1e-5")) == 0
    run_dir = _run_dir(search.results)
    frame, profiled = _frames(run_dir)
    failed = frame[frame["measurement_error"].notna()]
    assert len(failed) == 1 and len(profiled) == 1
    assert "out of memory" in failed["measurement_error"].iloc[0]
    assert failed.index[0] == frame["fits"].sum() - 1  # ranked after the unprofiled layouts
    assert frame["measured_step_time_s"].isna().all()
    capsys.readouterr()
    assert main(["calibrate", "--from", str(run_dir), "--dry-run"]) == 2
    assert "0 measured layouts" in capsys.readouterr().err
    # profiling again on resume replaces the earlier measurements (layer profiles: cheap)
    assert main(["search", "--resume", str(run_dir), "--profile", "layer", "--top-k", "2",
                 "--json"]) == 0
    frame, profiled = _frames(run_dir)
    assert "measurement_error" not in frame and "measurement_error" not in profiled
    assert frame["measured_layer_s"].notna().sum() == 2 == len(profiled)


def test_two_objective_study_profiles_the_pareto_front(search):
    argv = search("--profile", "layer", "--top-k", "2", "--objectives", "throughput,memory",
                  "--sampler", "nsga2", "--trials", "12", "--json")
    argv[argv.index("--gpus") + 1] = "2"  # more layouts, so the front is not all of them
    del argv[argv.index("--recompute"):argv.index("--recompute") + 2]
    assert main(argv) == 0
    run_dir = _run_dir(search.results)
    assert (search.results / "layer_profiles.json").exists()  # under --results, not ./results
    assert not (search.results.parent / "results").exists()
    profiled = pd.read_csv(run_dir / "profiled.csv")
    study = run.open_study(run_dir)
    front = sorted(study.best_trials, key=lambda t: -t.values[0])  # feasible, non-dominated
    assert len(front) > 2
    frame = pd.read_csv(run_dir / "candidates.csv")
    by_trial = frame.set_index("trial")
    # the front by throughput, the best variant of each distinct layout first (issue 26)
    numbers, seen, distinct = [t.number for t in front], set(), []
    for n in numbers:
        layout = tuple(by_trial.loc[n, ["tp", "pp", "cp", "dp", "ep"]])
        if layout not in seen:
            seen.add(layout)
            distinct.append(n)
    expected = (distinct + [n for n in numbers if n not in distinct])[:2]
    assert list(profiled["trial"]) == expected
    skipped = frame[frame["fits"] & ~frame["trial"].isin(profiled["trial"])]
    assert skipped["tokens_per_s_per_gpu"].max() > by_trial.loc[expected[1], "tokens_per_s_per_gpu"]  # not the top 2
    assert profiled["measured_layer_s"].notna().all()


def _toy():
    return pd.DataFrame({"tp": [1, 1, 2, 2, 4], "fits": [True, True, True, True, False],
                         "tokens_per_s_per_gpu": [100.0, 90.0, 80.0, 70.0, 500.0],
                         "peak_memory_gib": [50.0, 60.0, 30.0, 40.0, 10.0], "reason": ""})


def test_choose_takes_the_best_feasible_or_the_best_of_the_pareto_front():
    frame = _toy()
    assert list(choose(frame, 3)) == [0, 2, 1]  # the infeasible 500 is never chosen
    # distinct layouts first (tp 1, tp 2), then the other variants, by predicted throughput
    assert list(choose(frame, 2)) == [0, 2] and list(choose(frame, 4)) == [0, 2, 1, 3]
    # front (memory down, throughput up): 30 GiB/80 and 50 GiB/100; 60/90 and 40/70 are beaten
    assert list(choose(frame, 3, pareto=True)) == [0, 2]
    feasible = frame[frame["fits"]]
    front = feasible.index[pareto_front(feasible["peak_memory_gib"].to_numpy(),
                                        feasible["tokens_per_s_per_gpu"].to_numpy())]
    assert set(choose(frame, 9, pareto=True)) == set(front)
    assert list(choose(frame, 0)) == []


def test_merge_writes_measurements_by_label_and_never_the_layout():
    frame = _toy()
    profiled = frame.loc[[1]].assign(tp=8, fits=False, measured_tokens_per_s_per_gpu=120.0,
                                     measurement_error="")
    out = merge(frame, profiled)
    assert out.loc[0, "tp"] == 1 and out.loc[0, "measured_tokens_per_s_per_gpu"] == 120.0
    assert bool(out.loc[0, "fits"]) and out.loc[0, "rank"] == 1
    assert list(out["measurement_error"]) == [""] * 5
    assert np.isnan(out.loc[1:, "measured_tokens_per_s_per_gpu"]).all()
