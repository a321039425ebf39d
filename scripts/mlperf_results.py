"""The MLCommons Training results repositories as the MLPerf row extractors read them.

``mlperf_lora_rows.py`` (Llama-2-70B LoRA on Blackwell), ``mlperf_lora_amd_rows.py`` (the same on AMD
Instinct) and ``mlperf_pretrain_rows.py`` (Llama 3.1 405B / 8B) each parse their benchmark's configs
their own way; what they share is here: where the mirrors are, a mirror's files and their text at
HEAD (git directories without a work tree, as the ``fetch`` tool leaves them), the ``:::MLLOG``
records of a result log, and how a config's shell variable reads as on / off.
"""

from __future__ import annotations

import json
import subprocess

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
