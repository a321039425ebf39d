"""Apply a Plan to the built-in transformer from outside (torchtitan style).

The model code (``autoparallel.model.transformer``) stays single-device. ``parallelize`` turns a
built model into one rank's share of a layout, in this order:

1. ``dims``: one ``ParallelDims`` validates tp*pp*dp*cp == world size and makes the groups
   (rank order tp fastest, then cp, dp, pp: Megatron-LM's order, so TP stays inside a node).
2. recompute: which layers of each pipeline chunk recompute in full, or selective (attention core).
3. ``tensor``: tensor parallel (column/row-parallel linear shards, vocab-parallel embedding,
   output layer and cross-entropy), with sequence parallel at the block boundaries when sp.
4. ``pipeline``: the layers split into pp*vp chunks; 1F1B (vp=1) or interleaved 1F1B (vp>1)
   schedules exchanging activations point-to-point.
5. ``optimizer``: data parallel gradient reduce-scatter into a sharded (distributed) AdamW, or an
   all-reduce with a replicated AdamW; global gradient-norm clipping across every group.
6. ``fp8``: the delayed-scaling amax of every FP8 Linear reduced (max) across the TP and DP
   groups before the scale update, so every rank scales as the single-process model would.

Context parallel (cp > 1) is validated by ``ParallelDims`` but not implemented: a plan with
cp > 1 raises ``NotImplementedError`` naming it.
"""

from autoparallel.parallel.dims import ParallelDims
from autoparallel.parallel.parallelize import ParallelModel, parallelize

__all__ = ["ParallelDims", "ParallelModel", "parallelize"]
