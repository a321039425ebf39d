"""Preset names are names, not paths (issue 25).

A model's and a GPU's ``name`` become parts of file and folder names: the run folder
``<date>_<model>_<gpus>x<gpu>/`` under ``--results``, the user preset ``<name>.yaml`` that
``calibrate --as`` writes. A name with a path separator or ``..`` would put those outside their
folder (or lose them), a control character would garble the terminal and the file listing, and
an empty or dot-led name would make a hidden folder that looks like a staging one. Such a name is
refused where the preset is read, with the file and the key, rather than slugged silently.
"""

from __future__ import annotations

import os

SEPARATORS = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())


def name_problem(name: str) -> str:
    """Why ``name`` cannot name a file or folder ("" if it can)."""
    if not name.strip():
        return "is empty"
    if any(c in name for c in SEPARATORS):
        return "contains a path separator"
    if ".." in name or name.startswith("."):
        return "starts with '.' or contains '..'"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character"
    if name != name.strip():
        return "starts or ends with white space"
    return ""


def check_name(name: str, what: str = "name") -> None:
    """A ValueError (which spec loading turns into a one-line error naming the file) if
    ``name`` is no file name."""
    problem = name_problem(name)
    if problem:
        raise ValueError(f"{what} {name!r} {problem}: a name becomes a file or folder name; use letters, "
                         "digits, '-', '_', '.' and '+'")
