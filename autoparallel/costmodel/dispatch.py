"""Moving tokens to their experts and back: Megatron-Core's three token dispatchers, priced.

One dispatch (or combine: the same traffic the other way) on the GPU that holds T tokens, each
routed to k experts spread over an EP group of ep ranks (etp GPUs apart) that spans ``nodes``
NVLink domains of ``inside`` ranks each:

- ``alltoall`` (``MoEAlltoAllTokenDispatcher``): one NCCL all-to-all; every token *copy* is sent
  on its own, T*k*h BF16 values of which (ep-inside)/ep cross the network, then the ETP
  all-gather. It reaches a fitted share (``alltoall``) of the links.
- ``allgather`` (``MoEAllGatherTokenDispatcher``): every GPU of the EP x ETP group gathers the
  whole group's tokens (T*ep*etp*h) and keeps those of its experts; combine reduce-scatters.
  Independent of k, so it only pays inside one NVLink domain with large k.
- ``flex`` (DeepEP, HybridEP): hierarchical, as DeepEP's normal kernels run it. A token crosses
  the network once per *remote node* that hosts one of its experts (to the GPU of the same local
  rank there), then is forwarded over NVLink once per *GPU* that hosts its experts: the copies of
  a token for several experts on one node or one GPU are sent once. Node-limited routing
  (``moe_router_group_topk`` of ``moe_router_num_groups`` groups, DeepSeek-V3: 4 of 8) caps the
  nodes a token reaches. The links run at the GPU's fitted NCCL efficiencies (``nvlink``,
  ``internode``): DeepEP's published normal-kernel figures on H800 (153-158 GB/s NVLink of
  ~160, 43-58 GB/s RDMA of 50 "bottleneck bandwidth") are at or above them. The kernels occupy
  ``FLEX_DISPATCHER_SMS`` SMs (DeepEP; HybridEP ``HYBRIDEP_SMS``), which the computation they
  overlap loses.

The busiest EP rank receives ``imbalance`` times the even share (``moe.load_imbalance``). Without
``--overlap-moe-expert-parallel-comm`` a dispatch waits for the compute around it and the compute
for it; with it (1F1B all-to-all overlap), one micro-batch's dispatches run behind another's
computation, hiding at most ``ep_overlap`` of them and never more than that computation.
"""

from __future__ import annotations

import numpy as np

from autoparallel.costmodel import comm, moe
from autoparallel.specs.hardware import HardwareSpec
from autoparallel.specs.model import ModelSpec

DISPATCH_BYTES = 2.0  # Megatron dispatches and combines BF16 tokens (FP8 dispatch: ncclep only)
# DeepSeek-V3's own kernels (report §3.3.2) dispatch E4M3 values with one FP32 scale per 128 (as
# DeepEP's FP8 dispatch takes them) and combine in BF16; the activation gradient before the
# down-projection (the combine's backward, a dispatch) is FP8 too. Half the passes each way: the
# mean bytes per value over a layer's dispatches and combines.
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128
FP8_DISPATCH_MEAN_BYTES = (FP8_DISPATCH_BYTES + DISPATCH_BYTES) / 2
# Megatron's flex dispatcher: moe_flex_dispatcher_num_sms None -> 20, DeepEP's historical default
# (Megatron-LM d98e8a64dd token_dispatcher.py). Every Megatron-Bridge performance recipe that runs
# HybridEP sets moe_hybridep_num_sms = 32 (Megatron-Bridge/scripts/performance/utils/overrides.py
# _set_common_perf_overrides, v0.3.0 through v0.6.0; v0.6.0 src/megatron/bridge/perf_recipes/_common.py
# too), which Megatron-Core routes to moe_flex_dispatcher_num_sms: one value for every published
# HybridEP row, so a constant of the backend, not a recipe fact.
FLEX_DISPATCHER_SMS = 20
HYBRIDEP_SMS = 32


def _ep_domains(hw: HardwareSpec, ep, etp):
    """(EP ranks per NVLink domain, domains the EP group spans)."""
    ep = np.asarray(ep, dtype=float)
    inside = comm.ranks_per_domain(hw, ep, etp)
    return inside, ep / inside


def alltoall_time(hw: HardwareSpec, nbytes, ep, etp):
    """One all-to-all in which every GPU of an EP group sends ``nbytes`` split evenly over the
    group. EP ranks are etp GPUs apart, so ``ranks_per_domain`` of them share an NVLink domain;
    NVLink and network carry their shares at once.

    Megatron's alltoall dispatcher calls ``torch.distributed.all_to_all_single``, which NCCL runs
    as one group of a send and a receive per peer (the linear schedule of NCCL's documentation
    and nccl-tests' alltoall). The GPU's channels walk the NVLink peers in turn, so each of the
    inside - 1 NVLink peers pays the link latency; the network sends are posted by NCCL's proxy
    thread and progress together (one network latency). At EP64 in one NVL72 domain that is 63
    latencies per all-to-all, where a collective over the same GPUs pays one."""
    ep = np.asarray(ep, dtype=float)
    eff = hw.efficiency
    inside, _ = _ep_domains(hw, ep, etp)
    nvlink = comm.scale_up_bandwidth(hw, inside) * eff.alltoall
    network = hw.internode_gbps * 1e9 * eff.alltoall
    intra = nbytes * (inside - 1) / ep / nvlink
    inter = nbytes * (ep - inside) / ep / network
    latency = ((inside - 1) * hw.nvlink_latency_us + np.where(ep > inside, hw.internode_latency_us, 0.0)) * 1e-6
    return np.where(ep > 1, np.maximum(intra, inter) + latency, 0.0)


def distinct_share(picks: int, places) -> np.ndarray:
    """Expected distinct places among ``picks`` uniform picks of ``places`` equally likely ones,
    as a number of places: places * (1 - (1 - 1/places)^picks)."""
    places = np.maximum(np.asarray(places, dtype=float), 1.0)
    return places * (1.0 - (1.0 - 1.0 / places) ** picks)


def nodes_per_token(model: ModelSpec, nodes) -> np.ndarray:
    """Expected NVLink domains one token's top-k experts are on, the experts spread evenly over
    ``nodes`` domains. Group-limited routing picks the experts inside g of G groups: with G >= nodes
    (whole groups per node) the token reaches the nodes of g distinct groups, else the g*nodes/G
    nodes its groups span, k picks over them."""
    nodes = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    k = model.moe_router_topk
    groups, chosen = model.moe_router_num_groups, model.moe_router_group_topk
    if not groups:
        return distinct_share(k, nodes)
    # P(a node holds none of the g chosen groups) = C(G - G/nodes, g) / C(G, g).
    per_node = groups / nodes
    missed = np.ones_like(nodes)
    for i in range(chosen):
        missed = missed * np.maximum(groups - per_node - i, 0.0) / (groups - i)
    whole_groups = nodes * (1.0 - missed)
    spread = distinct_share(k, chosen * nodes / groups)
    return np.where(nodes <= groups, whole_groups, spread)


def flex_time(hw: HardwareSpec, model: ModelSpec, tokens, ep, etp, imbalance, value_bytes=DISPATCH_BYTES):
    """One DeepEP / HybridEP dispatch: the RDMA sends to remote nodes and the NVLink forwarding
    run at once; the slower sets the time."""
    ep = np.asarray(ep, dtype=float)
    eff = hw.efficiency
    inside, nodes = _ep_domains(hw, ep, etp)
    per_copy = moe.routed_width(model) * value_bytes * imbalance
    remote_nodes = nodes_per_token(model, nodes) * (nodes - 1) / nodes
    gpus = distinct_share(model.moe_router_topk, ep)
    # Token-GPU pairs crossing NVLink: to the other GPUs of the own node, and from the relay GPU to
    # the others of a remote node.
    nvlink_pairs = gpus * ((inside - 1) / ep + (ep - inside) / ep * (inside - 1) / inside)
    rdma = tokens * remote_nodes * per_copy / (hw.internode_gbps * 1e9 * eff.internode)
    nvlink = tokens * nvlink_pairs * per_copy / (comm.scale_up_bandwidth(hw, inside) * eff.nvlink)
    latency = np.where(nodes > 1, hw.internode_latency_us, hw.nvlink_latency_us) * 1e-6
    return np.where(ep > 1, np.maximum(rdma, nvlink) + latency, 0.0)


def allgather_time(hw: HardwareSpec, model: ModelSpec, tokens, ep, etp):
    """One all-gather of the EP x ETP group's tokens (every GPU receives all of them)."""
    group = np.asarray(ep, dtype=float) * etp
    nbytes = tokens * moe.routed_width(model) * DISPATCH_BYTES * group
    return comm.reduce_scatter_time(hw, nbytes, group, comm.ranks_per_domain(hw, group, 1))


def is_named(names, name: str, shape=None) -> np.ndarray:
    """Whether each row's dispatcher (or flex backend) is ``name``. ``names``: the rows' names, or a
    function of a name that gives that mask (``Candidates.knob_is`` on the knob: the cost model's
    chunks compare each distinct name once, not their 65,536 strings); broadcast to ``shape``."""
    rows = names(name) if callable(names) else np.asarray(names) == name
    return rows if shape is None else np.broadcast_to(rows, shape)


DISPATCHERS = ("alltoall", "flex", "allgather")


def dispatcher_time(hw: HardwareSpec, model: ModelSpec, tokens, ep, etp, imbalance, name: str,
                    value_bytes=DISPATCH_BYTES):
    """One dispatch (or combine) with the dispatcher ``name`` (``DISPATCHERS``), ``value_bytes`` per
    token value (BF16, or ``FP8_DISPATCH_MEAN_BYTES`` averaged over a dispatch and a combine);
    alltoall and flex add the ETP all-gather (or the reduce-scatter before a combine)."""
    if name == "allgather":
        return allgather_time(hw, model, tokens, ep, etp)
    nbytes = tokens * model.moe_router_topk * moe.routed_width(model) * value_bytes * imbalance
    expert_tp = comm.reduce_scatter_time(hw, nbytes * etp, etp, comm.ranks_per_domain(hw, etp, 1))
    if name == "alltoall":
        return alltoall_time(hw, nbytes, ep, etp) + expert_tp
    return flex_time(hw, model, tokens, ep, etp, imbalance, value_bytes) + expert_tp


def by_dispatcher(dispatcher, shape, time_of) -> np.ndarray:
    """Each candidate's ``time_of(name)`` for its ``dispatcher`` (names, or a mask function:
    ``is_named``), 0 for a dispatcher ``time_of`` has no time for: only the dispatchers present
    are priced."""
    out = np.zeros(shape)
    for name in DISPATCHERS:
        if (rows := is_named(dispatcher, name, shape)).any() and (time := time_of(name)) is not None:
            out = np.where(rows, time, out)
    return out


def dispatch_time(hw: HardwareSpec, model: ModelSpec, tokens, ep, etp, imbalance, dispatcher,
                  value_bytes=DISPATCH_BYTES):
    """One dispatch (or combine) with each candidate's ``dispatcher`` (``dispatcher_time``,
    ``by_dispatcher``)."""
    return by_dispatcher(dispatcher, np.shape(ep),
                         lambda name: dispatcher_time(hw, model, tokens, ep, etp, imbalance, name, value_bytes))


PROBS_BYTES = 4.0  # the routing probabilities, FP32, one per token copy


def probs_alltoall_time(hw: HardwareSpec, model: ModelSpec, tokens, ep, etp, imbalance):
    """The alltoall dispatcher's second all-to-all of a dispatch: each token copy's routing
    probability, which Megatron-Core multiplies in the experts' activation (``dispatch_all_to_all``
    sends ``permuted_probs`` after the tokens, Megatron-LM d98e8a6 token_dispatcher.py); few bytes,
    so mostly its per-peer latency. flex's kernels carry the probabilities with the tokens; the
    combine sends none (``probs_time``)."""
    return alltoall_time(hw, tokens * model.moe_router_topk * PROBS_BYTES * imbalance, ep, etp)


def probs_time(hw: HardwareSpec, model: ModelSpec, tokens, ep, etp, imbalance, dispatcher):
    """``probs_alltoall_time`` where the dispatcher is alltoall, else 0. ``dispatcher``: as
    ``dispatch_time``'s."""
    return by_dispatcher(dispatcher, np.shape(ep), lambda name: probs_alltoall_time(hw, model, tokens, ep, etp,
                                                                                    imbalance)
                         if name == "alltoall" else None)


def dispatcher_sms(backend=None):
    """SMs the flex dispatcher's kernels hold: ``HYBRIDEP_SMS`` under HybridEP, else DeepEP's
    ``FLEX_DISPATCHER_SMS`` (also where the backend is not known). ``backend``: names, or a mask
    function (``is_named``)."""
    if backend is None:
        return FLEX_DISPATCHER_SMS
    return np.where(is_named(backend, "hybridep"), HYBRIDEP_SMS, FLEX_DISPATCHER_SMS)


def exposed_dispatch(hw: HardwareSpec, total, overlap, window, dispatcher=None, hidden_share=None, backend=None):
    """What the step waits for of ``total`` seconds of dispatches: all of it, or with the 1F1B
    overlap what ``window`` (another micro-batch's computation) cannot hide, at most
    ``hidden_share`` of it (the fitted ``ep_overlap`` unless given); a flex dispatcher's kernels
    also slow the computation they hide behind by the share of SMs they hold. ``dispatcher`` and
    ``backend``: names, or mask functions (``is_named``)."""
    share = hw.efficiency.ep_overlap if hidden_share is None else hidden_share
    overlapped = comm.exposed_behind(total, window, share)
    exposed = np.where(overlap, overlapped, total)
    if dispatcher is None:
        return exposed
    sm_share = np.where(is_named(dispatcher, "flex"), dispatcher_sms(backend) / hw.sm_count, 0.0)
    return exposed + (total - exposed) * sm_share
