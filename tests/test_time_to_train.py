"""Time to train (issue 24): --tokens / --train-days / --gpu-hour-cost on search and estimate
turn the predicted throughput into days, GPU-hours and cost, for the winner, beside each ranked
layout and in --json; bad values get one line and exit 2."""

import argparse
import json

import pytest

from autoparallel.cli import main
from autoparallel.report import time_to_train as ttt

SEARCH = ["search", "--model", "llama3-70b", "--gpus", "64", "--no-save", "--top", "5"]
ESTIMATE = ["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "4", "--pp", "4"]


@pytest.mark.parametrize("text, value", [("15T", 15e12), ("300b", 300e9), ("2.5e12", 2.5e12), ("500K", 5e5),
                                         ("7M", 7e6), (" 1T", 1e12), ("1000", 1000.0)])
def test_token_counts_take_suffixes(text, value):
    assert ttt.tokens(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["15X", "T", "", "0", "-3T", "nan", "inf", "1e30", "0.5", "1.5.2T"])
def test_bad_token_counts_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a positive token count"):
        ttt.tokens(text)


def test_days_gpu_hours_and_cost_follow_from_the_throughput():
    train = ttt.TimeToTrain(gpus=64, tokens=1e12, gpu_hour_cost=2.0)
    r = train.record(1000.0)  # 64,000 tokens/s for the whole run
    assert r["days"] == pytest.approx(1e12 / 64_000 / 86_400)
    assert r["gpu_hours"] == pytest.approx(1e12 / 1000 / 3600) and r["cost_usd"] == pytest.approx(2 * r["gpu_hours"])
    cols = train.columns([1000.0, 500.0])
    assert cols["train_days"][1] == pytest.approx(2 * cols["train_days"][0])
    assert "1e+12" not in train.summary(1000.0) and "1T tokens in 180.8 days on 64 GPUs" in train.summary(1000.0)
    fixed = ttt.TimeToTrain(gpus=8, days=10.0).record(1000.0)
    assert fixed["tokens"] == pytest.approx(1000 * 8 * 10 * 86_400) and fixed["gpu_hours"] == 8 * 240
    assert set(ttt.TimeToTrain(gpus=8, days=10.0).columns([1.0])) == {"train_tokens"}  # the rest is every layout's


def test_search_json_and_table_carry_the_time_to_train(capsys, monkeypatch):
    assert main([*SEARCH, "--tokens", "15T", "--gpu-hour-cost", "2.5", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    for r in records:
        t = r["time_to_train"]
        assert t["days"] == pytest.approx(15e12 / (r["tokens_per_s_per_gpu"] * 64) / 86_400)
        assert t["cost_usd"] == pytest.approx(2.5 * t["gpu_hours"]) and t["gpus"] == 64
    monkeypatch.setenv("COLUMNS", "200")
    assert main([*SEARCH, "--tokens", "15T", "--gpu-hour-cost", "2.5"]) == 0
    out = capsys.readouterr().out.splitlines()
    best = records[0]["time_to_train"]
    assert f"rank 1: 15T tokens in {best['days']:,.1f} days on 64 GPUs" in "\n".join(out)
    header = next(line for line in out if line.split()[:2] == ["#", "TP"]).split()
    assert header[-3:] == ["days", "GPU-h", "cost"]
    first = next(line for line in out if line.split()[:1] == ["1"]).split()
    assert first[-3] == f"{best['days']:,.1f}" and first[-1].startswith("$")


def test_search_without_the_flags_is_unchanged(capsys):
    assert main([*SEARCH, "--json", "--top", "1"]) == 0
    assert "time_to_train" not in json.loads(capsys.readouterr().out)[0]


def test_estimate_prints_and_returns_the_time_to_train(capsys):
    assert main([*ESTIMATE, "--train-days", "30", "--gpu-hour-cost", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    t = result["time_to_train"]
    assert t["tokens"] == pytest.approx(result["tokens_per_s_per_gpu"] * 64 * 30 * 86_400)
    assert t["gpu_hours"] == pytest.approx(64 * 30 * 24) and t["cost_usd"] == pytest.approx(2 * 64 * 30 * 24)
    assert main([*ESTIMATE, "--tokens", "1T"]) == 0
    assert "1T tokens in" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--tokens", "15X"], "--tokens: expected a positive token count up to 1e18 such as 15T, 300B or 2.5e12 "
                          "(suffixes K, M, B, T), got '15X'"),
    (["--tokens", "0"], "got '0'"),
    (["--tokens=-3T"], "got '-3T'"),
    (["--train-days", "0"], "--train-days: expected a positive number of days, at most 36525, got 0"),
    (["--train-days", "1e9"], "got 1e9"),
    (["--tokens", "1T", "--train-days", "3"], "argument --train-days: not allowed with argument --tokens"),
    (["--gpu-hour-cost", "2"], "--gpu-hour-cost 2 needs --tokens N or --train-days D"),
    (["--tokens", "1T", "--gpu-hour-cost", "nan"], "--gpu-hour-cost: expected a positive price in USD per GPU-hour"),
])
@pytest.mark.parametrize("command", [SEARCH, ESTIMATE], ids=["search", "estimate"])
def test_bad_values_get_one_line_and_exit_2(command, extra, message, capsys):
    try:
        code = main([*command, *extra])
    except SystemExit as exc:  # argparse
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_run_folder_keeps_the_time_to_train(tmp_path, capsys):
    import yaml
    assert main(["search", "--model", "llama3-8b", "--gpus", "16", "--results", str(tmp_path), "--top", "3",
                 "--tokens", "2T", "--gpu-hour-cost", "3"]) == 0
    (folder,) = tmp_path.iterdir()
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())["inputs"]
    assert manifest["time_to_train"] == {"tokens": 2e12, "days": None, "gpu_hour_cost": 3.0}
    for _ in range(2):  # as searched, then as `report` renders it again
        header = next(line for line in (folder / "ranked.md").read_text().splitlines() if line.startswith("| #"))
        assert header.endswith("| days | GPU-h | cost |")
        assert main(["report", str(folder)]) == 0
