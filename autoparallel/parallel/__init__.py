"""Apply a Plan to the built-in transformer from outside (torchtitan style).

The model code (``autoparallel.model.transformer``) stays single-device. ``parallelize`` builds the
model on the meta device and turns it into one rank's share of a layout, in this order:

1. ``dims``: one ``ParallelDims`` validates tp*pp*dp*cp == world size and makes the groups
   (rank order tp fastest, then cp, dp, pp: Megatron-LM's order, so TP stays inside a node).
2. recompute: which layers of each pipeline chunk recompute in full, or selective (attention core).
3. ``tensor``: tensor parallel (column/row-parallel linear shards, vocab-parallel embedding,
   output layer and cross-entropy), with sequence parallel at the block boundaries when sp.
3b. ``expert`` (MoE models): Megatron-LM's MoE parallel folding with expert tensor parallel 1:
   EP groups of ep consecutive ranks of a stage each keep num_experts/ep experts of every MoE
   layer and exchange (token, expert) rows with all-to-alls; routed-expert gradients are reduced,
   and their AdamW sharded, over the expert-data-parallel group (a second flat buffer), with one
   global clipping norm; the router stays whole on every TP rank and the shared expert is split
   like a dense MLP (MoE with TP needs SP: each TP rank routes its own sequence shard).
4. ``context``: context parallel (cp > 1): each CP rank holds chunks r and 2cp-1-r of every
   sequence (tokens, targets and rotary rows; SP then splits that local sequence over TP), and
   every layer's attention core becomes ring attention exchanging K/V around the CP group.
5. ``pipeline``: the layers split into pp*vp chunks; 1F1B (vp=1) or interleaved 1F1B (vp>1)
   schedules exchanging activations point-to-point.
6. ``buffers``: only then the rank's own parameters are allocated, as views of one flat buffer
   in the training dtype (BF16), with FP32 gradients in a second flat buffer, each filled with
   its region of the single-process model's initial values.
   ``optimizer``: gradient reduce-scatter over the dp x cp group into a sharded (distributed)
   AdamW over FP32 master weights, or an all-reduce with a replicated AdamW; global
   gradient-norm clipping across every group.
7. ``fp8``: the delayed-scaling amax of every FP8 Linear reduced (max) across the TP, CP and DP
   groups before the scale update, so every rank scales as the single-process model would.

Not implemented (``check_plan`` says so): expert tensor parallel (etp > 1), multi-latent
attention, capacity-based token dropping.
"""

from autoparallel.parallel.dims import ParallelDims
from autoparallel.parallel.parallelize import ParallelModel, parallelize

__all__ = ["ParallelDims", "ParallelModel", "parallelize"]
