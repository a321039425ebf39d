"""Pipeline schedules: how long the bubble is and how many micro-batches a stage holds.

1F1B: bubble (pp−1)/m of the ideal time; interleaved with vp chunks per rank (pp−1)/(vp·m).
The first stage holds activations of pp micro-batches (≈ all layers' worth), ×(1 + (pp−1)/(pp·vp))
when interleaved (Korthikanti et al. §4.2.3); with fewer micro-batches than stages, all of them.
"""

from __future__ import annotations

import numpy as np


def bubble_microbatches(pp, vp):
    """Idle time of a stage per step, in units of one micro-batch's forward+backward on it."""
    return (pp - 1) / vp


def inflight_layer_fraction(pp, vp, m):
    """Activations held by the first stage, as a multiple of one micro-batch through ALL layers."""
    interleave = np.where(vp > 1, 1.0 + (pp - 1) / (pp * vp), 1.0)
    return np.where(m >= pp, interleave, m / pp)
