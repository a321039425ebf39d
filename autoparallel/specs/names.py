"""Preset names are names, not paths (issue 25).

A model's and a GPU's ``name`` become parts of file and folder names: the run folder
``<date>_<model>_<gpus>x<gpu>/`` under ``--results``, the user preset ``<name>.yaml`` that
``calibrate --as`` writes. A name with a path separator or ``..`` would put those outside their
folder (or lose them), a control character would garble the terminal and the file listing, and
an empty or dot-led name would make a hidden folder that looks like a staging one. Such a name is
refused where the preset is read, with the file and the key, rather than slugged silently.

"Control character" is meant as Unicode does: besides ASCII's, NEL (U+0085) breaks a line in some
tools, and the bidirectional overrides (U+202E) and other format characters show a name other
than the one on disk. A name is at most ``MAX_NAME_BYTES`` bytes: two of them and a GPU count make
a run folder's name, and a file name is at most 255 bytes (a longer one failed late with OSError).
"""

from __future__ import annotations

import os
import unicodedata

SEPARATORS = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
MAX_NAME_BYTES = 100
# Unicode categories no name holds: controls, formats (bidi overrides, zero-width), line and
# paragraph separators, surrogates.
HIDDEN_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")


def name_problem(name: str, limit: int = MAX_NAME_BYTES) -> str:
    """Why ``name`` cannot name a file or folder ("" if it can); ``limit``: its most bytes."""
    if not name.strip():
        return "is empty"
    if any(c in name for c in SEPARATORS):
        return "contains a path separator"
    if ".." in name or name.startswith("."):
        return "starts with '.' or contains '..'"
    hidden = [c for c in name if unicodedata.category(c) in HIDDEN_CATEGORIES]
    if hidden:
        return f"contains a control character (U+{ord(hidden[0]):04X})"
    if name != name.strip():
        return "starts or ends with white space"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > limit:
        return f"is {size} bytes long; a name is at most {limit}"
    return ""


def check_name(name: str, what: str = "name") -> None:
    """A ValueError (which spec loading turns into a one-line error naming the file) if
    ``name`` is no file name."""
    problem = name_problem(name)
    if problem:
        raise ValueError(f"{what} {name!r} {problem}: a name becomes a file or folder name; use letters, "
                         "digits, '-', '_', '.' and '+'")
