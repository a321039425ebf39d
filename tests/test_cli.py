"""The command line end to end: outputs other tools read, run folders, and user errors."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from autoparallel.cli import main

ROOT = Path(__file__).resolve().parents[1]

RECORD_KEYS = {"config", "fits", "peak_memory_gib", "step_time_s", "tokens_per_s_per_gpu",
               "model_tflops_per_gpu", "mfu", "breakdown"}
CONFIG_KEYS = {"tp", "pp", "dp", "cp", "ep", "vp", "sp", "mbs", "gbs", "recompute", "precision"}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "autoparallel.cli", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    assert main(["search", "--model", "llama3-70b", "--gpus", "64", "--results", str(root), "--top", "3"]) == 0
    (folder,) = root.iterdir()
    return folder


def test_run_folder_holds_every_file(run_dir):
    assert {p.name for p in run_dir.iterdir()} >= {"manifest.yaml", "candidates.csv", "ranked.md", "best.yaml",
                                                   "train.sh"}
    best = yaml.safe_load((run_dir / "best.yaml").read_text())
    assert f"--tensor-model-parallel-size {best['plan']['tp']}" in best["megatron_args"]
    assert best["nemo"]["model"]["tensor_model_parallel_size"] == best["plan"]["tp"]
    manifest = yaml.safe_load((run_dir / "manifest.yaml").read_text())
    assert manifest["inputs"]["gpus"] == 64 and manifest["inputs"]["gbs"] == 128


def test_candidates_keep_feasible_rows_and_rejections_per_rule(run_dir):
    """By default (issue 24) candidates.csv holds the feasible candidates and rejections.csv one
    row per rejecting rule: its count and one example with its reason."""
    frame = pd.read_csv(run_dir / "candidates.csv", low_memory=False)
    assert frame.fits.all() and list(frame["rank"]) == list(range(1, len(frame) + 1))
    rejected = pd.read_csv(run_dir / "rejections.csv", low_memory=False)
    manifest = yaml.safe_load((run_dir / "manifest.yaml").read_text())["inputs"]
    from autoparallel.search.run import KEEP_FEASIBLE
    assert manifest["candidates_file"] == "feasible" and len(frame) == min(manifest["feasible"], KEEP_FEASIBLE)
    assert rejected["count"].sum() == manifest["candidates"] - manifest["feasible"]
    assert not rejected.fits.any() and rejected.reason.notna().all() and rejected["rule"].is_unique
    assert (rejected["rule"] == "out of memory").any() and rejected["count"].is_monotonic_decreasing


def test_all_candidates_keeps_every_row_as_before(tmp_path):

    assert main(["search", "--model", "llama3-8b", "--gpus", "16", "--results", str(tmp_path), "--top", "3",
                 "--all-candidates"]) == 0
    (folder,) = tmp_path.iterdir()
    frame = pd.read_csv(folder / "candidates.csv", low_memory=False)
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())["inputs"]
    assert len(frame) == manifest["candidates"] and (~frame.fits).sum() > 0 and frame[~frame.fits].reason.notna().all()
    assert not (folder / "rejections.csv").exists()
    # a folder of the previous version: every row, no candidates_file in its manifest
    manifest_path = folder / "manifest.yaml"
    manifest = yaml.safe_load(manifest_path.read_text())
    del manifest["inputs"]["candidates_file"]
    manifest_path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    assert main(["export", str(folder), "--rank", "2", "--format", "nemo2"]) == 0
    assert main(["report", str(folder)]) == 0
    assert f"{manifest['inputs']['candidates']:,} candidates" in (folder / "report.html").read_text()


def test_summarised_folder_reports_exports_and_names_the_cap(tmp_path, monkeypatch, capsys):
    from autoparallel.search import run as runs
    monkeypatch.setattr(runs, "KEEP_FEASIBLE", 5)
    assert main(["search", "--model", "llama3-8b", "--gpus", "16", "--results", str(tmp_path), "--top", "3"]) == 0
    (folder,) = tmp_path.iterdir()
    capsys.readouterr()
    assert main(["export", str(folder), "--rank", "5", "--format", "megatron"]) == 0
    assert main(["export", str(folder), "--rank", "6", "--format", "megatron"]) == 2
    assert "keeps the best 5 of" in capsys.readouterr().err
    assert main(["report", str(folder)]) == 0
    page = (folder / "report.html").read_text()
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())["inputs"]
    assert f"{manifest['candidates']:,} candidates, {manifest['feasible']:,} feasible" in page
    assert f"of {manifest['feasible']:,} feasible candidates" in (folder / "ranked.md").read_text()


@pytest.mark.parametrize("fmt, expect", [("megatron", "--pipeline-model-parallel-size"),
                                         ("nemo", "pipeline_model_parallel_size:"),
                                         ("nemo2", "recipe = llm.llama3_70b.pretrain_recipe("),
                                         ("nemo2-yaml", "MegatronCommOverlapCallback:"),
                                         ("launch", "pretrain_gpt.py"),
                                         ("yaml", "megatron_args:")])
def test_export_formats(run_dir, fmt, expect, capsys):
    assert main(["export", str(run_dir), "--rank", "2", "--format", fmt]) == 0
    assert expect in capsys.readouterr().out


def _document(run_dir, rank, capsys):
    assert main(["export", str(run_dir), "--rank", str(rank), "--format", "yaml"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_megatron_export_is_flags_only_and_notes_the_environment(run_dir, capsys):
    """Megatron-LM demands CUDA_DEVICE_MAX_CONNECTIONS=1 with TP (Megatron-FSDP the opposite): the
    export of the first such ranked layout notes it, on stderr and in train.sh, outside the flags."""
    ranked = pd.read_csv(run_dir / "candidates.csv")
    rank = int(ranked[(ranked.tp > 1) & ~ranked.fsdp.astype(bool)]["rank"].min())
    assert main(["export", str(run_dir), "--rank", str(rank), "--format", "megatron"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert all(line.startswith("--") for line in lines), lines[:3]
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    assert _document(run_dir, rank, capsys)["environment"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in err and "export" not in out
    best = yaml.safe_load((run_dir / "best.yaml").read_text())
    noted = "export CUDA_DEVICE_MAX_CONNECTIONS=1" in (run_dir / "train.sh").read_text()
    assert noted == (best["plan"]["tp"] > 1 and not best["plan"]["fsdp"])  # train.sh launches rank 1


def test_export_rank_1_matches_best_yaml(run_dir, tmp_path):
    out = tmp_path / "one.yaml"
    assert main(["export", str(run_dir), "--rank", "1", "--format", "yaml", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == yaml.safe_load((run_dir / "best.yaml").read_text())


def test_export_says_what_it_wrote_and_what_it_replaced(run_dir, tmp_path, capsys):
    """export -o over an existing file replaced it without a word (session 53); stdout stays empty."""
    out = tmp_path / "rank1.sh"
    for word in ("wrote", "replaced"):
        capsys.readouterr()
        assert main(["export", str(run_dir), "--format", "launch", "-o", str(out)]) == 0
        printed = capsys.readouterr()
        assert printed.out == "" and printed.err == f"{word} {out}\n"


def test_a_rank_out_of_range_groups_the_count_s_digits(run_dir, capsys):
    """"this run has 20715 feasible plans (1..20715)" (session 53): counts elsewhere read 20,715."""
    from autoparallel.search import run as runs
    n = len(runs.load(run_dir).feasible)
    feasible = yaml.safe_load((run_dir / "manifest.yaml").read_text())["inputs"]["feasible"]
    assert n >= 1000
    assert main(["export", str(run_dir), "--rank", str(n + 1)]) == 2
    kept = f"this run has {n:,} feasible plans (1..{n:,})" if n == feasible else \
        f"this run folder keeps the best {n:,} of {feasible:,} feasible plans"
    assert kept in capsys.readouterr().err


def test_search_json_entries_have_stable_keys():
    out = run_cli("search", "--model", "llama2-7b", "--gpus", "8", "--json", "--top", "3", "--no-save")
    assert out.returncode == 0, out.stderr
    entries = json.loads(out.stdout)
    assert len(entries) == 3
    for e in entries:
        assert RECORD_KEYS <= set(e) and CONFIG_KEYS <= set(e["config"])
    assert entries[0]["tokens_per_s_per_gpu"] >= entries[1]["tokens_per_s_per_gpu"]


def test_estimate_json_one_object():
    out = run_cli("estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "4", "--pp", "8", "--vp", "5",
                  "--mbs", "1", "--gbs", "256", "--precision", "fp8-delayed", "--json")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert RECORD_KEYS <= set(record)
    assert record["config"]["dp"] == 2 and record["config"]["precision"] == "fp8-delayed"
    assert record["fits"] and not {"fits_on_gpus", "fits_on_command", "fits_on_half_need_gib"} & set(record)


def test_estimate_pins_are_respected():
    out = run_cli("estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "8", "--recompute", "full",
                  "--recompute-num-layers", "3", "--json")
    record = json.loads(out.stdout)
    assert record["config"]["recompute"] == "full" and record["config"]["recompute_num_layers"] == 3


def test_models_and_hardware_list_presets():
    assert "llama3.1-405b" in run_cli("models").stdout
    assert "gb200" in run_cli("hardware").stdout


@pytest.mark.parametrize("kind", ["models", "hardware"])
def test_preset_lists_read_whole_at_80_columns(kind, monkeypatch):
    """At 80 columns every preset's name and alias is printed whole (a user types them; "deepseek…" and
    "llama3-7…" were what rich cut them to) and no line is wider than the terminal."""
    import io as stdio

    from rich.console import Console

    from autoparallel import io
    from autoparallel.cli import presets
    buffer = stdio.StringIO()
    monkeypatch.setattr(presets, "console", Console(file=buffer, width=80))
    presets.list_presets(kind)
    text = buffer.getvalue()
    load = io.load_model if kind == "models" else io.load_hardware
    words = {w for line in text.splitlines() for w in line.replace("│", " ").replace(",", " ").split()}
    for name in io.preset_files(kind):
        assert name in words and set(load(name).aliases) <= words, name
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    assert text.startswith("model presets: " if kind == "models" else "hardware presets: ")  # was "models presets"


def test_the_models_list_says_what_attention_caches(monkeypatch):
    """`autoparallel models` showed DeepSeek-V4 as 64/64 heads/kv: its wkv projects one key-value head
    that every query head reads (config num_key_value_heads 1). MLA models (DeepSeek-V3, Kimi K2,
    GLM-5) cache one latent per token: "MLA", not a KV head count; the line under the table says so."""
    import io as stdio

    from rich.console import Console

    from autoparallel import io
    from autoparallel.cli import presets
    buffer = stdio.StringIO()
    monkeypatch.setattr(presets, "console", Console(file=buffer, width=80))
    presets.list_presets("models")
    text = buffer.getvalue()
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line[:1].isalnum()}
    for name in io.preset_files("models"):
        m = io.load_model(name)
        kv = "1" if m.csa_compress_ratios else "MLA" if m.multi_latent_attention else str(m.query_groups)
        assert rows[name][2] == f"{m.num_attention_heads}/{kv}", name
    assert rows["deepseek-v4-flash"][2] == "64/1" and rows["deepseek-v4-pro"][2] == "128/1"
    assert rows["deepseek-v3"][2] == "128/MLA" and rows["llama3-70b"][2] == "64/8"
    assert presets.MLA_NOTE in text and max(map(len, text.splitlines())) <= 80


def test_a_gpu_without_fp8_lists_no_fp8_speed(monkeypatch):
    """`autoparallel hardware` listed the A100's FP8 tensor speed as 0 TFLOP/s; it has none: "-"."""
    import io as stdio

    from rich.console import Console

    from autoparallel import io
    from autoparallel.cli import presets
    buffer = stdio.StringIO()
    monkeypatch.setattr(presets, "console", Console(file=buffer, width=80))
    presets.list_presets("hardware")
    rows = {line.split()[0]: line.split()[1:] for line in buffer.getvalue().splitlines() if line[:1].isalnum()}
    assert not io.load_hardware("a100-sxm-80g").fp8_tflops and rows["a100-sxm-80g"][:2] == ["312", "-"]
    assert rows["h100-sxm"][:2] == ["989", "1979"]


def test_the_hardware_list_names_the_link_of_each_gpu_domain(monkeypatch, tmp_path):
    """`autoparallel hardware` said "NVLink 8" for the L40S, a PCIe card without NVLink (its 8 GPUs are
    priced as one PCIe domain): the column now names the link its YAML states (scale_up_link), and the
    cost model's figures do not read it."""
    import dataclasses
    import io as stdio

    from rich.console import Console

    from autoparallel import io
    from autoparallel.cli import presets
    from autoparallel.errors import UserError
    buffer = stdio.StringIO()
    monkeypatch.setattr(presets, "console", Console(file=buffer, width=80))
    presets.list_presets("hardware")
    lines = buffer.getvalue().splitlines()
    rows = {line.split()[0]: " ".join(line.split()[5:7]) for line in lines if line[:1].isalnum()}
    assert (rows["l40s"], rows["h100-sxm"], rows["gb200"], rows["cpu-local"], rows["mi355x"]) == (
        "PCIe 8", "NVLink 8", "NVLink 72", "host 4", "xGMI 8")
    assert re.search(r"HBM TB/s +GPU link +fitted on", buffer.getvalue()) and max(map(len, lines)) <= 80
    l40s = io.load_hardware("l40s")
    assert l40s.scale_up_link == "pcie" and l40s.nvlink_domain == 8 and l40s.nvlink_gbps == 64
    yaml_text = (io.resolve_preset("hardware", "l40s")).read_text().replace("scale_up_link: pcie", "scale_up_link: pci")
    (tmp_path / "bad.yaml").write_text(yaml_text.replace("efficiency_from: h100-sxm", "efficiency_from: "
                                                         + str(io.resolve_preset("hardware", "h100-sxm"))))
    with pytest.raises(UserError, match=r"scale_up_link must be one of nvlink, pcie, host, xgmi, got 'pci'"):
        io.load_hardware(str(tmp_path / "bad.yaml"))
    from autoparallel.costmodel.estimate import estimate_plan
    from autoparallel.specs.plan import Plan
    model, plan = io.load_model("llama3-8b"), Plan(tp=4, pp=1, dp=2, mbs=1, gbs=64, sp=True)
    assert estimate_plan(model, l40s, plan) == estimate_plan(model, dataclasses.replace(l40s, scale_up_link="nvlink"),
                                                             plan)


HELP_COMMANDS = ["", "search", "estimate", "export", "infer", "report", "validate", "runs", "runs import", "calibrate",
                 "fp8-check", "models", "hardware", "profile"]


@pytest.mark.parametrize("command", HELP_COMMANDS)
def test_help_reads_at_80_columns(command, monkeypatch, capsys):
    """No --help line is wider than an 80-column terminal: argparse cannot wrap one word, and a choice
    list ('{bf16,fp16,...,nvfp4}') or a '--x | --no-x' pair is one, so search's usage ran to 112 columns."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main([*command.split(), "--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: autoparallel") and max(map(len, text.splitlines())) <= 80, \
        [line for line in text.splitlines() if len(line) > 80]
    # A line broken at a word's hyphen cut flags in two: '(--fp8-dot-product-' / 'attention', "'--" / "exclusive'".
    assert not [line for line in text.splitlines() if re.search(r"[\w'-]-$", line)], text



def _commands(parser, prefix=()):
    """(words, help) of every subcommand, nested ones (`runs import`) too."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                words = (*prefix, choice.dest)
                yield words, choice.help
                yield from _commands(action.choices[choice.dest], words)


@pytest.mark.parametrize("command", [["profile", "--rank", "1", "RUN", "--executor", "slurm"],
                                     ["search", "--model", "175b", "--gpus", "8", "--profile", "job",
                                      "--executor", "slurm"]])
def test_sbatch_args_take_flags_as_their_help_shows(command):
    """`--sbatch-args '--exclusive'`, the help's own example, was "argument --sbatch-args: expected one
    argument" (argparse took the value for an option; session 55): every value of it is sbatch flags."""
    from autoparallel.cli import build_parser
    for value in ("--exclusive", "--exclusive --gres=gpu:8", "-N 2"):
        assert build_parser().parse_args([*command, "--sbatch-args", value]).sbatch_args == value
    args = build_parser().parse_args([*command, "--sbatch-args", "--exclusive", "--slurm-qos", "high"])
    assert (args.sbatch_args, args.slurm_qos) == ("--exclusive", "high")


def test_no_parser_takes_a_shortened_flag(monkeypatch, capsys):
    """argparse's prefix matching took `infer --max-ttft 100` as --max-ttft-ms without a word (session
    53): every command and subcommand, and the `python -m autoparallel.serve.*` tools, take a flag only
    spelled whole, and a prefix gets the did-you-mean hint."""
    import argparse

    from autoparallel.cli import build_parser
    from autoparallel.serve import fit as serve_fit
    from autoparallel.serve import validate as serve_validate

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)
    found = list(parsers(build_parser()))
    assert len(found) >= 14 and not [p.prog for p in found if p.allow_abbrev]
    with pytest.raises(SystemExit) as exit_:
        main(["infer", "--model", "llama3.1-8b", "--gpus", "1", "--max-ttft", "100", "--no-save"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --max-ttft 100; did you mean --max-ttft-ms?" in capsys.readouterr().err

    def ran(*args, **kwargs):
        raise AssertionError("the tool ran: its shortened flag was taken")
    monkeypatch.setattr(serve_validate, "run", ran)
    monkeypatch.setattr(serve_fit, "fit_all", ran)
    for tool, flag in ((serve_validate, "--no-cross"), (serve_fit, "--dry")):
        with pytest.raises(SystemExit) as exit_:
            tool.main([flag])
        assert exit_.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_every_command_s_help_says_what_it_does(monkeypatch, capsys):
    """`autoparallel calibrate --help` listed its options under the usage and never said what the
    command does (session 53: no subcommand had a description); each now opens with its line of
    the command list."""
    from autoparallel.cli import build_parser
    monkeypatch.setenv("COLUMNS", "80")
    commands = list(_commands(build_parser()))
    assert len(commands) >= 13
    for words, summary in commands:
        with pytest.raises(SystemExit):
            main([*words, "--help"])
        text = capsys.readouterr().out
        intro = " ".join(text.split("\n\n")[1].split())
        assert intro.lower().startswith(" ".join(summary.split()).lower()), (words, intro)


def test_the_rs_pipeline_knob_says_what_it_is_and_what_the_default_does(monkeypatch, capsys):
    """--tp-overlap-rs-pipeline's help listed TE internals and ended 'instead of the ring exchange
    (default)': which overlap, of which collective, and what runs without the flag."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    text = capsys.readouterr().out
    entry = " ".join(text.split("--no-tp-overlap-rs-pipeline\n", 1)[1].split("\n  --", 1)[0].split())
    assert entry.startswith("with --tp-comm-overlap, overlap the forward TP reduce-scatters")
    assert "userbuffers' pipeline method" in entry and "Default: the ring exchange" in entry


@pytest.mark.parametrize("command", [["search", "--no-save"], ["estimate", "--tp", "1", "--pp", "1"]])
@pytest.mark.parametrize("overlap", [[], ["--no-tp-comm-overlap"]])
def test_the_rs_pipeline_without_tp_comm_overlap_is_refused_by_search_and_estimate(command, overlap, capsys):
    """Megatron-LM reads the userbuffers config only under --tp-comm-overlap: search ranked TP1 rows
    with rspipe set (and searched the overlap elsewhere) while estimate refused the same pin (session 48).
    Both now refuse it before any work, naming the flag that is missing."""
    code = main([command[0], "--model", "llama3-8b", "--gpus", "8", *command[1:], "--tp-overlap-rs-pipeline",
                 *overlap])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert f"--tp-overlap-rs-pipeline has no effect with {overlap[0] if overlap else 'no --tp-comm-overlap'}" in err
    assert "add --tp-comm-overlap or drop it" in err


def test_the_rs_pipeline_goes_off_at_tp1_in_search_and_estimate_alike(capsys):
    """At TP1 sequence parallel and the TP overlap mean nothing and go off; the pipelined reduce-scatter
    stayed on in search's and estimate's TP1 rows, a row estimate's own rule refuses (session 48)."""
    flags = ["--model", "llama3-8b", "--gpus", "8", "--sp", "--tp-comm-overlap", "--tp-overlap-rs-pipeline",
             "--precision", "fp8-current", "--json"]
    assert main(["search", *flags, "--no-save", "--top", "1000"]) == 0
    rows = [r["config"] for r in json.loads(capsys.readouterr().out)]
    assert {r["tp"] for r in rows} >= {1, 2}
    assert all(r["tp_overlap_rs_pipeline"] == r["tp_comm_overlap"] == r["sp"] == (r["tp"] > 1) for r in rows)
    assert main(["estimate", *flags, "--tp", "1", "--pp", "1"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert (config["sp"], config["tp_comm_overlap"], config["tp_overlap_rs_pipeline"]) == (False, False, False)


def test_a_tp_wider_than_the_domain_names_its_link(capsys):
    """The reason a TP group leaves a server said "NVLink domain" on the L40S too (session 48)."""
    assert main(["search", "--model", "175b", "--gpus", "64", "--gpu", "l40s", "--tp", "16", "--no-save"]) == 2
    assert "tp=16 crosses the 8-GPU PCIe domain" in capsys.readouterr().err
    assert main(["search", "--model", "175b", "--gpus", "64", "--tp", "16", "--no-save"]) == 2
    assert "tp=16 crosses the 8-GPU NVLink domain" in capsys.readouterr().err


def test_every_command_s_help_starts_beside_its_name(monkeypatch, capsys):
    """argparse measures subcommand names one indent short: at 80 columns `autoparallel --help` put
    'calibrate' and 'fp8-check' on lines of their own above their help (session 48)."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for name in ("search", "calibrate", "fp8-check", "profile"):
        assert re.search(rf"^    {name} +\w", text, re.M), name


def test_every_positional_and_json_flag_says_what_it_is():
    """`export --help` listed 'run_dir' and '--rank' with no word, validate / estimate / profile a bare
    '--json' (session 46); search and estimate --recompute, --precision, --tp-comm-overlap,
    --distributed-optimizer, --grad-reduce-in-fp32 and --flash-attention (session 47). Every flag
    says what it is."""
    import argparse

    from autoparallel.cli import build_parser

    bare = []

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    walk(p, f"{name} {sub}")
            elif not action.help:
                bare.append(f"{name} {action.option_strings or action.dest}")
    walk(build_parser(), "autoparallel")
    assert bare == []


def test_estimate_says_what_a_knob_not_given_becomes(monkeypatch, capsys):
    """estimate's knob group said "the rest is searched" (search's words); estimate searches nothing."""
    from autoparallel.cli.estimate import DEFAULTS
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the rest is searched" not in text and "--tp and --pp needed" in text
    assert DEFAULTS["precision"] == "bf16" and DEFAULTS["recompute"] == "none" and "no recompute; bf16" in text
    assert DEFAULTS["distributed_optimizer"] and DEFAULTS["flash_attention"] and DEFAULTS["grad_reduce_in_fp32"]


def test_the_command_list_says_calibrate_fits_any_measured_runs(capsys):
    """The command list said calibrate fits "to published runs"; it fits your own (--runs) and a
    profiled search's (--from) too."""
    with pytest.raises(SystemExit):
        main(["--help"])
    entry = " ".join(capsys.readouterr().out.split("calibrate", 1)[1].split("fp8-check")[0].split())
    assert entry == "fit a GPU's efficiency constants to measured runs (published, yours, profiled)"
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    out = capsys.readouterr().out
    assert "--runs RUNS" in out and "--from RUN_DIR" in out


def test_a_small_model_lists_its_parameters_in_millions(monkeypatch):
    """cpu-small (4.5M parameters) was listed as '0.0B'."""
    import io as stdio

    from rich.console import Console

    from autoparallel.cli import presets
    buffer = stdio.StringIO()
    monkeypatch.setattr(presets, "console", Console(file=buffer, width=80))
    presets.list_presets("models")
    line = next(x for x in buffer.getvalue().splitlines() if x.startswith("cpu-small"))
    assert "4.5M" in line.split() and "0.0B" not in line


def test_report_prints_the_ranked_table_again(run_dir, capsys):
    """The README: `report results/<run>  # tables again, report.html with plots`. It wrote ranked.md and
    report.html and printed only their path; it now prints the run's ranked table as the search did."""
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "tok/s/GPU" in out and "llama3-70b on 64 x h100-sxm, gbs 128" in out and "report.html" in out
    # the note under the table and the legend name --wide and --explain: report takes them too
    assert "--wide adds" in out and "--explain" in out
    assert main(["report", str(run_dir), "--wide", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "--wide adds" not in out and " other" in out.splitlines()[1] and "other: " in out


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="drops root's file capabilities with setpriv, which needs root")
def test_report_of_a_run_folder_it_cannot_write_prints_the_table_and_says_why_in_one_line(run_dir, tmp_path):
    """`report` of a read-only run folder (a teammate's, a read-only mount) printed one line and no
    table (session 53), though the table needs no write: the table, then one line on why report.html
    was not written, and nothing written."""
    folder = tmp_path / "run"
    shutil.copytree(run_dir, folder)
    (folder / "report.html").unlink(missing_ok=True)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    os.chmod(folder, 0o555)
    try:  # root without the capabilities that let it write anywhere: the folder's permission bits apply
        p = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner",
                            "--inh-caps=-dac_override,-dac_read_search,-fowner",
                            sys.executable, "-m", "autoparallel", "report", str(folder)],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.chmod(folder, 0o755)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    assert p.stderr.startswith("autoparallel: error: report.html not written: ")
    assert f"cannot write in {folder} (permission denied)" in p.stderr
    assert "llama3-70b on 64 x h100-sxm, gbs 128" in p.stdout and "tok/s/GPU" in p.stdout
    assert re.search(r"^ *1 +\d", p.stdout, re.M), p.stdout  # rank 1's row
    assert {q.name: q.read_bytes() for q in folder.iterdir()} == before


@pytest.mark.parametrize("phases, count", [([], None), ([(3, 10)], " 3/10 "),
                                           ([(131072, 1529808)], " 131,072/1,529,808 ")])
def test_a_bar_without_a_total_shows_no_count(phases, count, monkeypatch):
    """A pulse (generating layouts, reading runs) showed a made-up count, "0/?"; it now shows the
    elapsed time only, and the count once the total is known (grouped: "131072/1529808" was hard
    to read)."""
    import io as stdio

    from rich.console import Console

    from autoparallel.cli import common
    buffer = stdio.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buffer, force_terminal=True, color_system=None, width=80))
    with common.pricing_progress(False) as update:
        for done, total in phases:
            update(done, total)
    shown = buffer.getvalue()
    assert "generating candidate layouts" in shown and "0:00:0" in shown and "/?" not in shown
    assert ("pricing candidate layouts" in shown) == bool(phases) and (count is None or count in shown)


def test_a_bar_off_a_terminal_writes_nothing(monkeypatch):
    """Rich's transient bar left an empty line when it stopped in a pipe: `validate > file` began
    with two blank lines, `calibrate | head` with one."""
    import io as stdio

    from rich.console import Console

    from autoparallel.cli import common
    buffer = stdio.StringIO()
    monkeypatch.setattr(common, "console", Console(file=buffer, width=80))
    with common.progress_bar("reading the measured runs", None) as (bar, task):
        bar.advance(task)
    assert buffer.getvalue() == ""


def test_counts_read_as_english():
    """Printed counts said "1 new row(s)", "2 Slurm job(s)", "1 node(s) x 1 GPUs" (session 47)."""
    from autoparallel.profiling.budget import summary
    from autoparallel.words import plural
    assert [plural(n, "Slurm job") for n in (0, 1, 2, 1024)] == ["0 Slurm jobs", "1 Slurm job", "2 Slurm jobs",
                                                                 "1,024 Slurm jobs"]
    assert summary([8], None, 10, 3600).startswith("1 Slurm job, 8 GPUs in all")
    assert summary([1, 1], None, 10, 3600).startswith("2 Slurm jobs, 2 GPUs in all")


def _after_the_table(stdout: str) -> str:
    return " ".join(stdout[stdout.rindex("┘") + 1:].split())


def test_an_estimate_that_does_not_fit_names_the_gpu_count_at_which_it_does():
    """`estimate` said "fits NO" and nothing more, where search names the GPU count at which layouts
    fit (session 52): the line under the table names the count at which this layout fits (more
    data-parallel replicas), as search's message words it, and the estimate there fits."""
    out = run_cli("estimate", "--model", "175b", "--gpus", "32", "--tp", "4", "--pp", "8")
    assert out.returncode == 0, out.stderr
    found = re.fullmatch(r"does not fit on 32 x h100-sxm: ([\d.]+) GiB against a limit of 79\.7 GiB; this layout "
                         r"fits on (\d+) GPUs \((\d+) still need ([\d.]+) GiB\): estimate --gpus \2",
                         _after_the_table(out.stdout))
    assert found, out.stdout
    at = {n: json.loads(run_cli("estimate", "--model", "175b", "--gpus", n, "--tp", "4", "--pp", "8", "--json").stdout)
          for n in (found[2], found[3])}
    assert at[found[2]]["fits"] and not at[found[3]]["fits"]
    assert f"{at[found[3]]['peak_memory_gib']:.1f}" == found[4]


def test_an_estimate_whose_layout_fits_nowhere_names_search_s_count_for_its_flags():
    """GPT-3 175B at TP8 PP1 does not fit on any count tried with estimate's defaults (no recompute,
    bf16): the line names the count at which search with the same flags finds layouts, the count
    and words search's own message has."""
    out = run_cli("estimate", "--model", "175b", "--gpus", "8", "--tp", "8", "--pp", "1")
    searched = run_cli("search", "--model", "175b", "--gpus", "8", "--tp", "8", "--pp", "1", "--no-save")
    assert out.returncode == 0 and searched.returncode == 2, (out.stderr, searched.stderr)
    note = _after_the_table(out.stdout)
    assert note.startswith("does not fit on 8 x h100-sxm: ") and "layouts with these flags fit on " in note
    tail = note.split("layouts with these flags fit on ")[1]
    assert f"; layouts fit on {tail}" in searched.stderr, (note, searched.stderr)


@pytest.mark.parametrize("flags", ["175b --gpus 32 --tp 4 --pp 8", "175b --gpus 8 --tp 8 --pp 1",
                                   "llama3-70b --gpus 32 --tp 4 --pp 2 --mbs 2"])
def test_an_estimate_s_json_that_does_not_fit_names_the_gpu_count_its_table_does(flags):
    """`estimate --json` had no GPU-count hint where the layout does not fit, while the table's line
    under it names one (session 52): the JSON's fits_on_* fields name the same count, command and
    need at half the count, for each of the line's three kinds (this layout at more GPUs, search with
    the same flags at more GPUs, and on the GPUs asked); a layout that fits has none of the fields
    (``test_estimate_json_one_object``)."""
    argv = ["estimate", "--model", *flags.split()]
    table, record = run_cli(*argv), run_cli(*argv, "--json")
    assert table.returncode == 0 and record.returncode == 0, (table.stderr, record.stderr)
    found = re.search(r"fits? on (\d+) GPUs(?: \((\d+) still need ([\d.]+) GiB\))?: (estimate|search) --gpus \1$",
                      _after_the_table(table.stdout))
    assert found, table.stdout
    record = json.loads(record.stdout)
    assert not record["fits"]
    assert (record["fits_on_gpus"], record["fits_on_command"]) == (int(found[1]), found[4])
    half = record["fits_on_half_need_gib"]
    assert (None if half is None else f"{half:.1f}") == found[3]


def test_an_estimate_that_does_not_fit_where_search_with_its_flags_does_says_so_first():
    """Llama 3 70B at TP4 PP2 MBS2 on 32 GPUs does not fit with estimate's defaults (no recompute,
    bf16), but search with the same flags finds layouts that fit on these 32 GPUs: the line says
    that, before any larger count."""
    flags = ["--model", "llama3-70b", "--gpus", "32", "--tp", "4", "--pp", "2", "--mbs", "2"]
    out = run_cli("estimate", *flags)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"does not fit on 32 x h100-sxm: [\d.]+ GiB against a limit of 79\.7 GiB; layouts with "
                        r"these flags fit on 32 GPUs: search --gpus 32", _after_the_table(out.stdout)), out.stdout
    found = run_cli("search", *flags, "--no-save", "--json", "--top", "1")
    assert found.returncode == 0 and json.loads(found.stdout)[0]["fits"], found.stderr
