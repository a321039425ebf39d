"""Pipeline stages as Megatron-LM builds and schedules them.

**Which layers a stage holds** (``megatron/core/transformer/transformer_block.py``,
``get_num_layers_to_build``): an even split gives every stage L/pp layers in vp chunks. When L
is not divisible by pp*vp Megatron offers two uneven splits:

- explicit first / last stage sizes (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``): the middle stages share the rest evenly; every stage's
  count must be divisible by vp;
- ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the
  embedding (the loss) takes the place of one layer in the first (last) virtual stage, so
  L + 1 or L + 2 "slots" are split evenly and the first (last) stage holds one layer fewer.

**The schedule** (``megatron/core/pipeline_parallel/schedules.py``): 1F1B, interleaved when
vp > 1. Stage i warms up with ``pp - i - 1`` micro-batches (1F1B) or ``2(pp - i - 1) +
(vp - 1)pp`` chunk-micro-batches (interleaved) before its first backward, so at its peak it holds
the activations of one more than that, capped by what the step has (m micro-batches, m*vp
chunk-micro-batches). The first stage therefore holds about pp micro-batches of all its layers
(×(1 + (pp-1)/(pp*vp)) interleaved, Korthikanti et al. §4.2.3); the last stage (vp-1)*pp + 1
chunks, one micro-batch when not interleaved.

A step of m micro-batches whose stages take T_i each (forward + backward of one micro-batch)
runs for about m * max(T_i) at the bottleneck plus the fill and drain of the others,
(sum(T_i) - max(T_i)) / vp: with equal stages the familiar bubble (pp-1)/vp of a stage time.
"""

from __future__ import annotations

import math

import numpy as np

#: One uneven split: (first stage layers, last stage layers, embedding counted, loss counted);
#: (0, 0, False, False) is the even split.
Split = tuple[int, int, bool, bool]
EVEN: Split = (0, 0, False, False)


def splits(num_layers: int, pp: int, vp: int, uneven: bool = True) -> list[Split]:
    """Every way Megatron-LM accepts to put ``num_layers`` layers on ``pp`` stages of ``vp``
    chunks: the even split when it exists, else (``uneven``) the accounted and explicit splits.

    Explicit first/last sizes are taken lighter than the middle stages (the first stage holds
    the most activations, the last one the logits): the middle share is the smallest multiple
    of vp not below L/pp, or one vp more.
    """
    if pp == 1:
        return [EVEN] if vp == 1 else []
    chunks = pp * vp
    if num_layers % chunks == 0:
        return [EVEN]
    if not uneven:
        return []
    out: list[Split] = []
    for embedding, loss in ((True, True), (False, True), (True, False)):
        slots = num_layers + embedding + loss
        if slots % chunks == 0 and slots // chunks >= 2:  # every chunk keeps a decoder layer
            out.append((0, 0, embedding, loss))
    if num_layers % vp == 0:
        share = math.ceil(num_layers / pp / vp) * vp
        for middle in (share, share + vp):
            edges = num_layers - (pp - 2) * middle
            first = math.ceil(edges / 2 / vp) * vp
            last = edges - first
            if last >= vp and (first, last, False, False) not in out:
                out.append((first, last, False, False))
    return out


def stage_layers(num_layers: int, pp, vp, first, last, embedding, loss):
    """Decoder layers on the first, each middle, and the last stage (arrays, one per plan)."""
    pp, first, last = (np.asarray(a, dtype=float) for a in (pp, first, last))
    embedding, loss = (np.asarray(a, dtype=float) for a in (embedding, loss))
    even = num_layers / pp
    explicit = (first > 0) | (last > 0)
    middle_stages = np.maximum(pp - (first > 0) - (last > 0), 1.0)
    explicit_middle = (num_layers - first - last) / middle_stages
    accounted = (embedding + loss) > 0
    slots = (num_layers + embedding + loss) / pp
    middle = np.where(explicit, explicit_middle, np.where(accounted, slots, even))
    first_layers = np.where(explicit & (first > 0), first, np.where(accounted, slots - embedding, middle))
    last_layers = np.where(explicit & (last > 0), last, np.where(accounted, slots - loss, middle))
    single = pp == 1
    return (np.where(single, num_layers, first_layers), np.where(single, num_layers, middle),
            np.where(single, num_layers, last_layers))


def inflight_chunks(pp, vp, m, stage):
    """Chunk-micro-batches whose activations stage ``stage`` holds at its peak (micro-batches
    when vp = 1): warm-up plus the one in flight, capped by what the step has."""
    pp, vp, m, stage = (np.asarray(a, dtype=float) for a in (pp, vp, m, stage))
    interleaved = (vp - 1) * pp + 2 * (pp - 1 - stage) + 1
    plain = pp - stage
    return np.minimum(np.where(vp > 1, interleaved, plain), m * vp)


def schedule_time(m, vp, stage_times_max, stage_times_sum):
    """One step of m micro-batches: the bottleneck stage m times, plus fill and drain."""
    return m * stage_times_max + (stage_times_sum - stage_times_max) / vp


def bubble_microbatches(pp, vp):
    """Idle time of a stage per step, in units of one micro-batch's forward+backward on it
    (equal stages)."""
    return (pp - 1) / vp


def inflight_layer_fraction(pp, vp, m):
    """Activations held by the first stage, as a multiple of one micro-batch through ALL layers
    (even split)."""
    pp, vp = np.asarray(pp, dtype=float), np.asarray(vp, dtype=float)
    return inflight_chunks(pp, vp, m, 0) / (pp * vp)
