"""The cost model: memory and step time of many plans at once, from shapes and hardware alone.

Pure numpy on purpose (no torch, Optuna or Ray): it must evaluate a whole search space in
seconds and import anywhere. Every function takes plan knobs as numpy arrays (one element per
candidate) so that one call prices every candidate.
"""

from autoparallel.costmodel.estimate import estimate_columns, estimate_plan

__all__ = ["estimate_columns", "estimate_plan"]
