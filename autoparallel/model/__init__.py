"""The built-in FP8 transformer that profiling jobs and the FP8 numerics check run.

``recipes`` (what FP8 means), ``fp8`` (the FP8 Linear), ``reference`` and ``kernels`` (the
memory-bound casts, on CPU and GPU), ``ops`` (those casts as torch operators, one per cast),
``transformer`` (a decoder built from a ModelSpec, on the meta device first),
``numerics`` (statistics per tensor and layer), ``data`` and ``train`` (a tiny training loop).
Importing it needs torch; the cost model never does.
"""

from autoparallel.model.fp8 import Fp8Linear, update_fp8_scales
from autoparallel.model.recipes import (BlockwiseScaling, CurrentScaling, DelayedScaling,
                                        Fp8Policy, recipe_from_name)
from autoparallel.model.transformer import TINY, Recompute, Transformer

__all__ = ["BlockwiseScaling", "CurrentScaling", "DelayedScaling", "Fp8Linear", "Fp8Policy",
           "Recompute", "TINY", "Transformer", "recipe_from_name", "update_fp8_scales"]
