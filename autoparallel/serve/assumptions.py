"""The inference assumptions YAML: fitted ``InferenceEfficiency`` per GPU and validation settings.

``search_spaces/inference_assumptions.yaml`` holds an ``efficiency`` mapping (hardware preset
name -> constants, ``default`` for any other GPU) below the marker line that
``python -m autoparallel.serve.validate --fit`` rewrites, and the ``validation`` block that says
how the published rows are read. Unknown keys are errors naming the file and the key.
"""

from __future__ import annotations


from autoparallel import io
from autoparallel.costmodel.inference import InferenceEfficiency
from autoparallel.errors import SpecError

ASSUMPTIONS = io.SEARCH_SPACES / "inference_assumptions.yaml"
FIT_MARKER = "# --- fitted by `python -m autoparallel.serve.validate --fit`"
TOP_KEYS = ("validation", "efficiency")


def load_assumptions() -> dict:
    data = io.read_yaml(ASSUMPTIONS)
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise SpecError(f"{ASSUMPTIONS}: unknown key {unknown[0]!r}; valid keys: {', '.join(TOP_KEYS)}")
    return data


def efficiency_for(hardware_name: str) -> InferenceEfficiency:
    """The fitted constants for one hardware preset: its own block over ``default``."""
    blocks = load_assumptions().get("efficiency") or {}
    merged = {**(blocks.get("default") or {}), **(blocks.get(hardware_name) or {})}
    return io.from_dict(InferenceEfficiency, merged, f"{ASSUMPTIONS}: efficiency[{hardware_name!r}]")


__all__ = ["ASSUMPTIONS", "FIT_MARKER", "load_assumptions", "efficiency_for"]
