"""Request-length workloads (issue 29 item 1): the named distributions keep their published
numbers, samples are deterministic, user files are read or refused in one line."""

import dataclasses
import json

import numpy as np
import pytest

from autoparallel import cli, io
from autoparallel.errors import UserError
from autoparallel.serve.search import Request
from autoparallel.serve.workload import WORKLOADS, Workload, load_workload, workload_names

MLPERF = ("mlperf-llama2-70b", "mlperf-mixtral-8x7b", "mlperf-llama3.1-405b", "mlperf-llama3.1-8b",
          "mlperf-deepseek-r1")


def test_the_issue_names_are_shipped():
    assert set(MLPERF) | {"sharegpt"} <= set(workload_names())


@pytest.mark.parametrize("name", [*MLPERF, "sharegpt"])
def test_sample_keeps_the_stated_means_and_bounds(name):
    w = load_workload(name)
    inp, out = w.sample(20_000, seed=3)
    assert inp.min() >= w.input.min and inp.max() <= w.max_input
    assert out.min() >= w.output.min and out.max() <= w.max_output
    assert inp.mean() == pytest.approx(w.mean_input, rel=0.01)
    assert out.mean() == pytest.approx(w.mean_output, rel=0.01)
    assert np.std(inp) > 0.1 * inp.mean()  # a distribution, not one length


def test_published_mlperf_figures_are_the_data_readme_ones():
    """The data README: llama2-70b mean output 294.45, max input and output 1024; mixtral 144.84, max input 2048."""
    llama = load_workload("mlperf-llama2-70b")
    assert (llama.mean_output, llama.max_output, llama.max_input) == (294.45, 1024, 1024)
    mixtral = load_workload("mlperf-mixtral-8x7b")
    assert (mixtral.mean_output, mixtral.max_input) == (144.84, 2048)


#: Output-length percentiles (p50, p90, p99) read off LoadGen's Server summaries
#: (mlcommons/inference_results_v4.1 closed/NVIDIA/results/.../Server/performance/run_1/
#: mlperf_log_summary.txt): (latency percentile - TTFT percentile) / mean TPOT + 1, in tokens.
#: DGX-H100 llama2-70b-99.9: latency p50 / p90 / p99 39.05 / 81.39 / 144.81 s, TTFT 0.27 / 0.37 /
#: 0.46 s, mean TPOT 155.0 ms; H200-SXM-141GBx8 llama2-70b-99: 31.11 / 65.05 / 118.86 s, TTFT 0.18 /
#: 0.31 / 0.45 s, TPOT 123.3 ms; HPE Cray XD670 (H100) llama2-70b-99: 32.01 / 66.66 / 122.16 s, TTFT
#: 0.23 / 0.31 / 0.38 s, TPOT 127.0 ms; DGX-H100 mixtral-8x7b: 11.75 / 29.10 / 61.04 s, TTFT 0.15 /
#: 0.29 / 0.63 s, TPOT 102.6 ms; H200-SXM-141GBx8 mixtral-8x7b: 15.82 / 39.22 / 82.26 s, TTFT 0.22 /
#: 0.33 / 0.54 s, TPOT 138.4 ms; Supermicro SYS_821GE (H100) mixtral-8x7b: 12.50 / 30.86 / 64.75 s,
#: TTFT 0.17 / 0.40 / 1.82 s, TPOT 108.5 ms. MLPerf Inference v5.1, NVIDIA's B200-SXM-180GBx8_TRT
#: deepseek-r1 (mlcommons/inference_results_v5.1@965182b0): 139.01 / 622.57 / 1,334.33 s, TTFT 0.69 /
#: 1.10 / 1.70 s, TPOT 66.46 ms (its p99, 20,053 tokens, is the 20,000-token cap).
LOADGEN_OUTPUT_PERCENTILES = {
    "mlperf-deepseek-r1": [((139.01 - 0.69) / 0.06646 + 1, (622.57 - 1.10) / 0.06646 + 1,
                            (1334.33 - 1.70) / 0.06646 + 1)],
    "mlperf-llama2-70b": [((39.05 - 0.27) / 0.1550 + 1, (81.39 - 0.37) / 0.1550 + 1, (144.81 - 0.46) / 0.1550 + 1),
                          ((31.11 - 0.18) / 0.1233 + 1, (65.05 - 0.31) / 0.1233 + 1, (118.86 - 0.45) / 0.1233 + 1),
                          ((32.01 - 0.23) / 0.1270 + 1, (66.66 - 0.31) / 0.1270 + 1, (122.16 - 0.38) / 0.1270 + 1)],
    "mlperf-mixtral-8x7b": [((11.75 - 0.15) / 0.1026 + 1, (29.10 - 0.29) / 0.1026 + 1, (61.04 - 0.63) / 0.1026 + 1),
                            ((15.82 - 0.22) / 0.1384 + 1, (39.22 - 0.33) / 0.1384 + 1, (82.26 - 0.54) / 0.1384 + 1),
                            ((12.50 - 0.17) / 0.1085 + 1, (30.86 - 0.40) / 0.1085 + 1, (64.75 - 1.82) / 0.1085 + 1)],
}


@pytest.mark.parametrize("name", sorted(LOADGEN_OUTPUT_PERCENTILES))
def test_mlperf_output_spread_is_the_one_loadgen_measured(name):
    """The output sigma (0.57 llama2-70b, 0.70 mixtral-8x7b) is derived from LoadGen's latency
    percentiles: the sampled p50 / p90 / p99 output lengths are within 6 % of those measured on
    every run listed; the assumed 0.8 the sigmas replace misses one of them by more than 10 %
    (llama2-70b p50 / p90 223 / 620 tokens against ~251 / 524; mixtral-8x7b p99 681 against 590)."""
    w = load_workload(name)
    out = w.sample(50_000, seed=1)[1]
    sampled = np.percentile(out, [50, 90, 99])
    for measured in LOADGEN_OUTPUT_PERCENTILES[name]:
        assert sampled == pytest.approx(measured, rel=0.06), (sampled, measured)
    wide = dataclasses.replace(w, output=dataclasses.replace(w.output, sigma=0.8)).sample(50_000, seed=1)[1]
    first = np.asarray(LOADGEN_OUTPUT_PERCENTILES[name][0])
    assert np.max(np.abs(np.percentile(wide, [50, 90, 99]) / first - 1)) > 0.1  # the check can fail
    assert "output.sigma" in io.read_yaml(WORKLOADS)[name]["derived"]

#: A full 13,368-sample Offline run of MLCommons' reference vLLM harness for llama3.1-8b on the
#: MLCommons cnn_eval.json (ssaketh-ch/llama31b-benchmark@72703baa results/throughput/Combination
#: results/exp_00_BASELINE/run.log): per batch (prompts sorted by input length, SUT_VLLM.py), the
#: prompts and vLLM's final "est. speed input: X toks/s, output: Y toks/s" (one elapsed time for both,
#: so X / Y = the batch's prompt / output tokens); every answer is 128 tokens (its LoadGen summary:
#: 3,023.34 tokens/s / 23.6199 samples/s = 128.0).
CNNDM_VLLM_BATCHES = [(1024, 18416.34, 7906.41), (1024, 20362.56, 6392.26), (1024, 20729.71, 5432.82),
                      (1024, 20902.35, 4763.59), (1024, 21050.68, 4239.61), (1024, 21230.77, 3843.60),
                      (1024, 19912.80, 3261.52), (1024, 19822.40, 2928.47), (1024, 19825.17, 2641.82),
                      (1024, 20515.95, 2451.72), (1024, 20294.23, 2136.08), (1024, 20837.81, 1874.57),
                      (1024, 21987.59, 1543.00), (56, 20648.86, 1146.33)]


def test_llama31_8b_input_lengths_are_the_reference_runs():
    """The 8B's mean input is the 13,368 prompts' tokens in the reference run's log (870.7; 778 as
    first assumed, 10.6 % short), and sigma 0.50 gives its 13 sorted 1,024-prompt batches' mean
    lengths within 5 % (the 56 longest, 0.4 %, within 11 %: the log-normal piles its tail on the max
    2,540); the assumed 0.8 misses the shortest batch by over 40 %."""
    measured = np.array([128 * x / y for _, x, y in CNNDM_VLLM_BATCHES])
    sizes = [n for n, _, _ in CNNDM_VLLM_BATCHES]
    assert sum(sizes) == 13_368
    w = load_workload("mlperf-llama3.1-8b")
    assert w.mean_input == pytest.approx(np.dot(sizes, measured) / sum(sizes), rel=1e-3)
    assert w.max_input == 2540
    assert {"input.mean", "input.sigma"} <= set(io.read_yaml(WORKLOADS)["mlperf-llama3.1-8b"]["derived"])

    def batch_means(workload):
        lengths = np.sort(workload.sample(sum(sizes), seed=1)[0])
        return np.array([chunk.mean() for chunk in np.split(lengths, np.cumsum(sizes)[:-1])])

    error = batch_means(w) / measured - 1
    assert np.abs(error[:-1]).max() < 0.05 and abs(error[-1]) < 0.11, error
    wide = dataclasses.replace(w, input=dataclasses.replace(w.input, sigma=0.8))
    assert batch_means(wide)[0] / measured[0] - 1 < -0.4  # the check can fail


def _yaml_block(text: str, specs: dict, name: str) -> str:
    """The lines of workloads.yaml from ``name:`` to the next workload."""
    block = text.split(f"\n{name}:\n")[1]
    return block[:min((block.find(f"\n{n}:\n") for n in specs if f"\n{n}:\n" in block), default=len(block))]


def test_every_unpublished_number_is_marked_as_an_assumption():
    """Each workload lists what its source publishes; the YAML says 'Assumed' for the rest."""
    specs = io.read_yaml(WORKLOADS)
    text = WORKLOADS.read_text()
    for name, spec in specs.items():
        assert spec["source"]
        if {"input.mean", "output.mean"} - set(spec["published"]):
            assert "Assumed" in _yaml_block(text, specs, name), name
    assert "input.mean" not in specs["mlperf-llama2-70b"]["published"]  # no source states it


def test_unsourced_mlperf_input_means_say_what_was_searched():
    """s52h6: the MLPerf workloads whose mean input no source states (llama2-70b, mixtral-8x7b,
    llama3.1-405b, deepseek-r1) say so and name the repositories searched at their commits; none calls its figure
    recalled (the 405B's 9,400 was "as recalled from the MLCommons blog"). The 405B's max input is the
    rules' max_seq_len (mlcommons/inference_policies@ac93e89 inference_rules.adoc: 20,000)."""
    specs = io.read_yaml(WORKLOADS)
    text = WORKLOADS.read_text()
    unsourced = [n for n in MLPERF if "input.mean" not in {*specs[n]["published"], *specs[n].get("derived", [])}]
    assert unsourced == ["mlperf-llama2-70b", "mlperf-mixtral-8x7b", "mlperf-llama3.1-405b", "mlperf-deepseek-r1"]
    for name in unsourced:
        block = _yaml_block(text, specs, name)
        assert "No source states the mean input length" in block, name
        assert "mlcommons/inference@b66003e1" in block and "inference_policies@ac93e89" in block, name
        assert "recalled" not in block, name
    big = load_workload("mlperf-llama3.1-405b")
    assert big.max_input == 20_000 and "input.max" in specs["mlperf-llama3.1-405b"]["published"]


def test_sampling_is_seeded():
    w = load_workload("sharegpt")
    a, b = w.sample(100, seed=7), w.sample(100, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(w.sample(100, seed=8)[0], a[0])


def test_fixed_lengths_are_the_degenerate_workload():
    inp, out = Workload.fixed(512, 64).sample(10, seed=1)
    assert set(inp) == {512} and set(out) == {64}


def test_user_csv_and_jsonl(tmp_path):
    csv = tmp_path / "pairs.csv"
    csv.write_text("input_len,output_len\n100,10\n300,30\n")
    w = load_workload(str(csv))
    assert (w.mean_input, w.mean_output, w.max_input, w.max_output) == (200, 20, 300, 30)
    inp, out = w.sample(2, seed=0)  # as many as the file holds: the file's rows in order
    assert inp.tolist() == [100, 300] and out.tolist() == [10, 30]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"prompt_tokens": 5, "completion_tokens": 7}\n\n{"input_len": 9, "output_len": 1}\n')
    assert load_workload(str(jsonl)).sample(2)[0].tolist() == [5, 9]
    array = tmp_path / "pairs.json"  # one JSON document holding an array of the same objects
    array.write_text('[\n {"input_len": 4, "output_len": 2},\n {"input_tokens": 6, "output_tokens": 3}\n]\n')
    assert [x.tolist() for x in load_workload(str(array)).sample(2)] == [[4, 6], [2, 3]]


@pytest.mark.parametrize("content, suffix, message", [
    ("input_len,output_len\n100,x\n", ".csv", "output_len 'x' is not a number"),
    ("input_len,output_len\n100,0\n", ".csv", "output_len '0' is not a whole number of tokens in 1..2147483647"),
    ("input_len\n100\n", ".csv", "no output_len / output_tokens"),
    ("input_len,output_len\n", ".csv", "no requests"),
    ("[1, 2]\n", ".jsonl", "line 1 is not a JSON object"),
    ("[1, 2]\n", ".json", "element 1 of the array is not a JSON object"),
    ('[{"input_len": 1, "output_len": 1},]', ".json", "not a JSON array of objects"),
    ("[]", ".json", "no requests"),
    # a YAML workload is no format the loader knows: read as a CSV, it says which formats are
    ("a: [1, 2\n", ".yaml", "no requests .*a CSV with that header, JSON lines or a JSON array of such objects"),
])
def test_bad_user_files(tmp_path, content, suffix, message):
    path = tmp_path / f"w{suffix}"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_workload(str(path))


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(UserError, match="'chat' is neither a file nor a known workload; valid: mlperf-llama2-70b"):
        load_workload("chat")


def test_request_of_a_workload_prices_the_means_and_accepts_the_longest():
    r = Request.of_workload(load_workload("mlperf-llama2-70b"))
    assert (r.input_len, r.output_len, r.max_model_len, r.workload) == (261, 294, 2048, "mlperf-llama2-70b")


def test_cli_workload_search(capsys):
    """--workload turns the traffic simulation on (offline without a rate or scenario)."""
    rc = cli.main(["infer", "--model", "llama3-70b", "--gpus", "8", "--gpu", "h100-sxm", "--workload",
                   "mlperf-llama2-70b", "--no-save", "--top", "1", "--requests", "500"])
    out = capsys.readouterr().out
    assert rc == 0 and "mlperf-llama2-70b, offline: 500 simulated requests" in " ".join(out.split())
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize("argv, message", [
    (["--workload", "chat"], "--workload 'chat' is neither a file nor a known workload"),
    (["--workload", "sharegpt", "--input-len", "100"], "--workload sharegpt gives the request lengths"),
    (["--workload", "missing.csv"], "--workload missing.csv: no such file"),
])
def test_cli_errors_are_one_line(capsys, argv, message):
    rc = cli.main(["infer", "--model", "llama3-70b", "--gpus", "8", "--no-save", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


def test_cli_json_point_with_a_workload_file(tmp_path, capsys):
    """A pinned layout over a file's pairs: that one layout, simulated over the file's lengths."""
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps({"input_len": i, "output_len": 100}) for i in (1000, 3000)) + "\n")
    argv = ["infer", "--model", "llama3-70b", "--gpus", "8", "--tp", "8", "--pp", "1", "--max-batch", "16",
            "--requests", "200", "--json", "--no-save"]
    assert cli.main([*argv, "--workload", str(path)]) == 0
    spread = json.loads(capsys.readouterr().out)
    assert spread["workload"] == "w.jsonl" and len(spread["ranked"]) == 1
    assert spread["ranked"][0]["config"]["tp"] == 8 and spread["ranked"][0]["config"]["max_batch"] == 16
    assert cli.main([*argv, "--input-len", "2000", "--output-len", "100", "--scenario", "offline"]) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert fixed["workload"] == "fixed 2000/100"
    assert fixed["ranked"][0]["ttft_ms"]["p50"] != spread["ranked"][0]["ttft_ms"]["p50"]


@pytest.mark.parametrize("content, suffix", [
    ("\ufeffinput_len,output_len\n100,20\n300,40\n", ".csv"),  # Excel's "CSV UTF-8" starts with a byte-order mark
    ("input_len, output_len\n100, 20\n300, 40\n", ".csv"),  # a space after each comma
    ("Input_Len,Output_Len\n100,20\n300,40\n", ".csv"),  # the names capitalised
    ('{\n  "input_len": 100,\n  "output_len": 20\n}\n', ".json"),  # one request, pretty-printed
    ('\ufeff[{"input_len": 100, "output_len": 20}, {"input_len": 300, "output_len": 40}]', ".json"),
], ids=["csv-bom", "csv-spaces", "csv-capitals", "json-object", "json-bom"])
def test_user_files_as_spreadsheets_and_editors_write_them(tmp_path, content, suffix):
    """Session 56: each of these said "row 1: no input_len / ... value" or "line 1 is not a JSON
    object" of a file that holds the pairs."""
    path = tmp_path / f"w{suffix}"
    path.write_text(content, encoding="utf-8")
    w = load_workload(str(path))
    assert w.max_input in (100, 300) and w.mean_output in (20, 30)


@pytest.mark.parametrize("content, suffix, message", [
    # the columns found are named (session 56: "row 1: no input_len / input_tokens / input / prompt_tokens value")
    ("input_len\toutput_len\n100\t20\n", ".csv", r"row 1: no input_len / input_tokens / input / prompt_tokens value "
                                                 r"\(its columns: 'input_len\\toutput_len'\)"),
    ("100,20\n200,40\n", ".csv", r"no input_len .* value \(its columns: '100', '20'\)"),
    ('[{"conversations": []}]', ".json", r"no input_len .* value \(its columns: 'conversations'\)"),
    # the JSON error is said (session 56: "line 1 is not a JSON object" of an object with a trailing comma)
    ('{"input_len": 100, "output_len": 20,}\n', ".jsonl", "line 1 is not valid JSON .*Expecting property name"),
    ("5\n", ".json", "line 1 is not a JSON object"),
    # a JSON document nested past Python's recursion limit (session 56: a RecursionError traceback)
    ("[" * 100_000 + "]" * 100_000, ".json", "not a JSON array of objects .*nested too deeply"),
    ("[" * 100_000 + "]" * 100_000, ".jsonl", "line 1 is not valid JSON .*nested too deeply"),
], ids=["tsv", "no-header", "sharegpt", "trailing-comma", "number", "deep-json", "deep-jsonl"])
def test_bad_user_files_say_what_the_file_holds(tmp_path, content, suffix, message):
    path = tmp_path / f"w{suffix}"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_workload(str(path))


def test_a_file_in_another_encoding_is_named_as_not_utf8(tmp_path):
    path = tmp_path / "w.csv"
    path.write_bytes("input_len,output_len\n100,20\n# café\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"not UTF-8 text \(invalid continuation byte at byte 33\); save it as UTF-8"):
        load_workload(str(path))
