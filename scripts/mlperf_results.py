"""The MLCommons results repositories (Training and Inference) as the MLPerf row extractors read them.

``mlperf_lora_rows.py`` (Llama-2-70B LoRA on Blackwell), ``mlperf_lora_amd_rows.py`` (the same on AMD
Instinct) and ``mlperf_pretrain_rows.py`` (Llama 3.1 405B / 8B) each parse their benchmark's configs
their own way; what they share is here: where the mirrors are, a mirror's files and their text at
HEAD (git directories without a work tree, as the ``fetch`` tool leaves them), the ``:::MLLOG``
records of a result log, how a config's shell variable reads as on / off, and the CSV written in the
columns of the file it sits beside (``write_rows``).
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

MIRRORS = {"v5.0": "/work/.mirror/mlcommons+training_results_v5.0/repo",
           "v5.1": "/work/.mirror/mlcommons+training_results_v5.1/repo"}


class Mirror:
    """One results repository (a git directory) at its HEAD: its commit, its files, their text."""

    def __init__(self, git_dir: str):
        self.dir = git_dir
        self.commit = self.git("rev-parse", "HEAD").strip()
        self.files = self.git("ls-tree", "-r", "--name-only", "HEAD").splitlines()
        self.file_set = set(self.files)
        self._text: dict[str, str | None] = {}

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", self.dir, *args], check=True, capture_output=True,
                              text=True, errors="replace").stdout

    def show(self, path: str) -> str | None:
        """The file's text at HEAD; None if the repository does not hold it."""
        if path not in self._text:
            try:
                self._text[path] = self.git("show", f"HEAD:{path}")
            except subprocess.CalledProcessError:
                self._text[path] = None
        return self._text[path]


def mllog(text: str) -> list[dict]:
    """The ``:::MLLOG {json}`` records of a result log, in order (a line that does not parse is left out)."""
    records = []
    for line in text.splitlines():
        if ":::MLLOG" not in line:
            continue
        try:
            records.append(json.loads(line.split(":::MLLOG", 1)[1]))
        except json.JSONDecodeError:
            continue
    return records


def truthy(value) -> bool:
    """A config's shell value read as on: 1 / True / t / yes, quotes and case aside."""
    return str(value).strip().strip("'\"").lower() in ("1", "true", "t", "yes")


# --- MLPerf Inference (scripts/mlperf_inference_rows.py; the AMD rows' extractor reads the same) ---

INFERENCE_MIRRORS = {"v5.1": "/work/.mirror/mlcommons+inference_results_v5.1/repo"}
SUMMARY = "performance/run_1/mlperf_log_summary.txt"


def inference_results(mirror: Mirror, benchmarks: tuple[str, ...], division: str = "closed") -> list[tuple]:
    """(submitter, system, benchmark, scenario) of every performance run of ``benchmarks`` in the
    division, in the repository's order: ``<division>/<submitter>/results/<system>/<benchmark>/
    <scenario>/performance/run_1/mlperf_log_summary.txt``."""
    out = []
    for path in mirror.files:
        parts = path.split("/")
        if (len(parts) == 9 and parts[0] == division and parts[2] == "results" and parts[4] in benchmarks
                and "/".join(parts[6:]) == SUMMARY):
            out.append((parts[1], parts[3], parts[4], parts[5]))
    return out


def loadgen_summary(text: str) -> dict[str, str]:
    """The ``name : value`` lines of a LoadGen ``mlperf_log_summary.txt`` (results, additional stats,
    test parameters), names as printed (``Tokens per second``, ``ttft_latency (ns)``, ...); the
    first occurrence of a name wins."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if ":" not in line or line.startswith(("=", " *")):
            continue
        name, value = (s.strip() for s in line.split(":", 1))
        if name and value:
            out.setdefault(name, value)
    return out


def loadgen_detail(text: str) -> dict[str, object]:
    """The ``:::MLLOG`` records of a LoadGen ``mlperf_log_detail.txt`` by key (its value; the first
    record of a key wins), e.g. ``requested_offline_expected_qps``, ``effective_samples_per_query``."""
    out: dict[str, object] = {}
    for record in mllog(text):
        out.setdefault(record.get("key"), record.get("value"))
    return out


def write_rows(out: Path, columns_from: Path, rows: list[dict]) -> None:
    """``rows`` to ``out`` under the header of ``columns_from`` (the shipped CSV whose columns the new
    file keeps), with "\\n" line ends, as the shipped files are written."""
    with columns_from.open() as f:
        columns = next(csv.reader(f))
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
