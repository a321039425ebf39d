"""Frozen descriptions of what is being laid out (model), on what (hardware), and how (plan)."""

from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec
from autoparallel.specs.plan import Plan

__all__ = ["HardwareSpec", "ModelSpec", "Plan"]
