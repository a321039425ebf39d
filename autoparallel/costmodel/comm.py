"""Collective times under nccl-tests conventions, on the network tier a group actually spans.

All-reduce moves 2(n−1)/n·S bytes per rank, reduce-scatter and all-gather (n−1)/n·S
(S: the full buffer). A group of n ranks with ``per_node`` of them inside one NVLink domain runs
as NCCL's ring (``ring_bus_bandwidth``): one rate through NVLink and the network at once, the
slower link's, not the two legs one after the other; across domains each call pays the latency
NCCL's tuner prices for its ring (``nccl_ring_latency``), which grows with the ranks, so a step's
number of collectives (the DP gradient buckets) counts. Vectorised over every argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel.specs.hardware import HardwareSpec


def exposed_behind(comm_time, window, overlap):
    """What stays exposed of ``comm_time`` run beside ``window`` seconds of compute: all that
    outlasts the window, and never less than ``1 - overlap`` of it (the kernels share SMs and
    memory bandwidth); ``overlap`` is the fitted efficiency of that kind of overlap."""
    return np.maximum((1 - overlap) * comm_time, comm_time - window)


def ranks_per_domain(hw: HardwareSpec, group_size, stride):
    """How many members of a group whose consecutive ranks are ``stride`` apart share a domain."""
    group_size = np.asarray(group_size, dtype=float)
    return np.minimum(np.maximum(hw.nvlink_domain // np.maximum(stride, 1), 1), group_size)  # np.clip, 4x faster


def scale_up_bandwidth(hw: HardwareSpec, ranks=None):
    """Bytes/s one GPU sends (and receives) at once to the other ``ranks - 1`` members of its group
    inside its domain, before efficiency. Through a switch (NVSwitch) the GPU's whole link whatever
    the group; on a direct full mesh (``HardwareSpec.scale_up_mesh``: Infinity Fabric, each GPU one
    link to each peer) only the links to the group's members, ``ranks - 1`` of the
    ``nvlink_domain - 1`` that ``nvlink_gbps`` adds up (a pipeline send, ``ranks`` None, one link)."""
    whole = hw.nvlink_unidirectional_gbps * 1e9
    if not hw.scale_up_mesh:
        return whole
    peers = 1.0 if ranks is None else np.maximum(np.asarray(ranks, dtype=float) - 1, 1.0)
    return whole * peers / (hw.nvlink_domain - 1)


def _bandwidths(hw: HardwareSpec, ranks=None):
    nvlink = scale_up_bandwidth(hw, ranks) * hw.efficiency.nvlink
    network = hw.internode_gbps * 1e9 * hw.efficiency.internode
    return nvlink, network


def ring_bus_bandwidth(nvlink, network, per_node, nodes):
    """Per-GPU bus bandwidth (nccl-tests' busBw) of NCCL's ring over ``nodes`` NVLink domains of
    ``per_node`` ranks: the slower of the GPU's NVLink and the NICs of its domain's members, which
    the ring's chunks cross at the same time (pipelined), not one leg after the other.

    NCCL's tuning model (NVIDIA/nccl@5067397c src/graph/tuning.cc, ncclTopoTuneModel): the ring's
    busBw = nChannels * bw, bw the one per-channel speed its topology search found room for on every
    link a channel uses (src/graph/search.cc sets a ring's bwIntra = bwInter = speedArray[i]: each
    channel reserves it on each GPU's NVLink path and on one NIC per node), and time = nBytes /
    (busBw * nRanks / nsteps), nsteps = nRanks - 1 for a reduce-scatter or an all-gather. A channel
    enters and leaves each domain once, so the domain's per_node NICs carry (n-1)/n of the buffer
    between them while each GPU's NVLink carries as much: busBw = min(NVLink, per_node * NIC)."""
    return np.where(nodes > 1, np.minimum(nvlink, per_node * network), nvlink)


# NCCL's tuning model of a ring reduce-scatter / all-gather's latency, per protocol (NVIDIA/nccl@5067397c
# src/graph/tuning.cc, ncclTunerConstantsDefaults and ncclTopoTuneModel), microseconds: the base
# (baseLatencies, Ring), a step over NVLink (hwLatencies NVLINK, Ring), a step over the network
# (hwLatencies NET, Ring; NET Tree where each domain holds one rank, ``ppn == 1``), and the network post
# overhead every step of an inter-node ring pays at least (getNetOverhead: 1 us on Intel x86 and Arm
# hosts, x3 for Simple; 2 us on AMD hosts is not modelled). graph->latencyInter (a net plugin's
# stated latency) is taken as 0, as NCCL's IB plugin reports.
NCCL_RING_LATENCY_US = {  # protocol: (base, NVLink step, network step, network step with ppn 1, net overhead)
    "simple": (8.4, 3.4, 14.0, 14.0, 3.0),
    "ll128": (14.0, 1.9, 4.0, 8.5, 1.0),
    "ll": (6.6, 0.6, 2.7, 5.0, 1.0),
}
# LL128's and LL's bandwidth against Simple's (tuning.cc: ring LL128 busBw * 0.92, LL busBw * 0.5; their
# caps, perChMaxRingLL128Bws (36.7-40 GB/s a channel) and llMaxBws, are not modelled).
LL128_BANDWIDTH = 0.92
LL_BANDWIDTH = 0.5
# The tree all-reduce's latency per protocol, microseconds (tuning.cc: baseLatencies Tree, hwLatencies NVLINK
# and NET Tree), and its bandwidth against the ring's bus bandwidth (algBw = busBw x 0.5 x 1/3.8 for LL,
# x 120/128 for LL128 across nodes, x 0.92 for Simple; its per-channel caps are not modelled).
NCCL_TREE_LATENCY_US = {"ll": (6.8, 0.6, 5.0), "ll128": (14.0, 1.25, 8.5), "simple": (8.4, 4.0, 14.0)}
NCCL_TREE_BANDWIDTH = {"ll": 1 / 3.8, "ll128": 120 / 128, "simple": 0.92}


def nccl_tree_all_reduce_latency(protocol: str, ranks, nodes):
    """Seconds of latency NCCL's tuner prices one tree all-reduce over ``ranks`` in ``nodes`` domains:
    base + 2 x ((ranks per node - 1) x NVLink step + log2(nodes) x network step) (tuning.cc
    ncclTopoTuneModel, the tree branch; log2i rounds down). Small all-reduces across nodes take it."""
    base, nvlink, net = NCCL_TREE_LATENCY_US[protocol]
    ranks = np.asarray(ranks, dtype=float)
    nodes = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    return (base + 2 * ((ranks / nodes - 1) * nvlink + np.floor(np.log2(nodes)) * net)) * 1e-6


def nccl_ring_latency(protocol: str, ranks, nodes):
    """Seconds of latency NCCL's tuner prices one ring reduce-scatter or all-gather over ``ranks``
    spread evenly over ``nodes`` domains: base + (nsteps - nInterSteps) x max(NVLink step, net
    overhead) + nInterSteps x network step, nsteps = ranks - 1, nInterSteps = nodes - 1
    (tuning.cc ncclTopoTuneModel, the ring branch). It grows with the ranks: 0.30 ms at 64 ranks
    over 8 nodes, 1.20 ms at 256 over 32 (Simple)."""
    base, nvlink, net, net_ppn1, overhead = NCCL_RING_LATENCY_US[protocol]
    ranks = np.asarray(ranks, dtype=float)
    nodes = np.asarray(nodes, dtype=float)
    inter_steps = np.maximum(nodes - 1, 0.0)
    intra = np.maximum(nvlink, np.where(nodes > 1, overhead, 0.0))
    inter = np.where(ranks <= nodes, net_ppn1, net)
    return (base + (ranks - 1 - inter_steps) * intra + inter_steps * inter) * 1e-6


def internode_bytes(nbytes, group_size, per_node):
    """Bytes each rank sends over the network in a reduce-scatter (or all-gather) of ``nbytes``."""
    n = np.asarray(group_size, dtype=float)
    g = np.minimum(per_node, n)
    nodes = n / g
    return (nodes - 1) / np.maximum(nodes, 1) * (nbytes / g)


@dataclass(frozen=True)
class Group:
    """A group's shape on the two tiers (``group``), apart from the bytes: a term that prices
    several collectives over one group (gradients and parameters, reduce and gather) computes it
    once; what each collective adds then is a few operations, not the twenty-odd of the whole."""

    size: np.ndarray  # ranks
    per_node: np.ndarray  # of them in one NVLink domain (at most ``size``)
    nodes: np.ndarray  # NVLink domains the group spans
    share: np.ndarray  # (n-1)/n of the buffer passes each rank's links
    latency_s: np.ndarray  # a hop on each tier the group spans
    ring_latency_s: dict  # protocol: NCCL's ring latency across domains (``nccl_ring_latency``)
    tree_latency_s: dict  # protocol: NCCL's tree all-reduce latency (``nccl_tree_all_reduce_latency``)
    nvlink: float | np.ndarray  # achievable bytes/s (per group size on a mesh: ``scale_up_bandwidth``)
    network: float  # achievable bytes/s of one GPU's NIC

    def reduce_scatter_time(self, nbytes, calls=1):
        """Reduce-scatter (or all-gather: the same traffic) of ``nbytes`` over the group in ``calls``
        equal collectives (a DP step's gradient buckets), NCCL's ring at ``ring_bus_bandwidth``.
        Across domains each call pays NCCL's ring latency (``nccl_ring_latency``) at the protocol
        its tuner would pick for that size (Simple; LL128 at 0.92 of the bandwidth; LL at 0.5); inside one
        domain the model's own latency per call."""
        bus = ring_bus_bandwidth(self.nvlink, self.network, self.per_node, self.nodes)
        transfer = self.share * nbytes / calls / bus
        lat = self.ring_latency_s
        ring = np.minimum(np.minimum(transfer + lat["simple"], transfer / LL128_BANDWIDTH + lat["ll128"]),
                          transfer / LL_BANDWIDTH + lat["ll"])
        per_call = np.where(self.nodes > 1, ring, transfer + self.latency_s)
        return np.where(self.size > 1, calls * per_call, 0.0)

    def all_reduce_time(self, nbytes, calls=1):
        """All-reduce = reduce-scatter + all-gather of the same buffer (NCCL's ring: its latency taken
        as two reduce-scatters'), or across domains NCCL's tree where its tuner prices that cheaper
        (small buffers: latency in log2 of the domains), at the ring's bus bandwidth."""
        ring = 2.0 * self.reduce_scatter_time(nbytes, calls)
        bus = ring_bus_bandwidth(self.nvlink, self.network, self.per_node, self.nodes)
        tree = calls * np.minimum.reduce([2.0 * nbytes / calls / (bus * NCCL_TREE_BANDWIDTH[p]) + latency
                                          for p, latency in self.tree_latency_s.items()])
        return np.where((self.nodes > 1) & (self.size > 1), np.minimum(ring, tree), ring)


def group(hw: HardwareSpec, group_size, per_node) -> Group:
    """``Group`` of ``group_size`` ranks with ``per_node`` of them in one NVLink domain."""
    n = np.asarray(group_size, dtype=float)
    g = np.minimum(per_node, n)
    nodes = n / g
    nvlink, network = _bandwidths(hw, g)
    latency = np.where(g > 1, hw.nvlink_latency_us, 0.0) + np.where(nodes > 1, hw.internode_latency_us, 0.0)
    return Group(n, g, nodes, (n - 1) / np.maximum(n, 1), latency * 1e-6,
                 {p: nccl_ring_latency(p, n, nodes) for p in NCCL_RING_LATENCY_US},
                 {p: nccl_tree_all_reduce_latency(p, n, nodes) for p in NCCL_TREE_LATENCY_US}, nvlink, network)


def reduce_scatter_time(hw: HardwareSpec, nbytes, group_size, per_node):
    """Reduce-scatter (or all-gather: the same traffic) of ``nbytes`` over ``group_size`` ranks."""
    return group(hw, group_size, per_node).reduce_scatter_time(nbytes)


def all_reduce_time(hw: HardwareSpec, nbytes, group_size, per_node):
    """All-reduce = reduce-scatter + all-gather of the same buffer."""
    return group(hw, group_size, per_node).all_reduce_time(nbytes)


def tree_all_reduce_latency(hw: HardwareSpec, group_size, per_node):
    """A latency-bound all-reduce (a few bytes): NCCL's tree goes up and down once, one NVLink
    hop inside the domain and one network hop per level of a binary tree over the domains."""
    n = np.asarray(group_size, dtype=float)
    g = np.minimum(per_node, n)
    levels = np.ceil(np.log2(np.maximum(n / g, 1.0)))
    return np.where(n > 1, 2.0 * (np.where(g > 1, hw.nvlink_latency_us, 0.0) + levels * hw.internode_latency_us)
                    * 1e-6, 0.0)


def p2p_time(hw: HardwareSpec, nbytes, same_domain):
    """One point-to-point send between adjacent pipeline stages."""
    nvlink, network = _bandwidths(hw)
    return np.where(same_domain, nbytes / nvlink + hw.nvlink_latency_us * 1e-6,
                    nbytes / network + hw.internode_latency_us * 1e-6)
