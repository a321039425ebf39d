"""Collective times under nccl-tests conventions, on the network tier a group actually spans.

All-reduce moves 2(n−1)/n·S bytes per rank, reduce-scatter and all-gather (n−1)/n·S
(S: the full buffer). A group of n ranks with ``per_node`` of them inside one NVLink domain is
priced hierarchically (DESIGN.md §5): the intra-domain step on NVLink, the inter-domain step on
the per-GPU network link carrying S / per_node. Vectorised over every argument.
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
    intra_share: np.ndarray  # (g-1)/g of the buffer crosses NVLink
    inter_share: np.ndarray  # (nodes-1)/nodes of each rank's S/g crosses the network
    latency_s: np.ndarray  # a hop on each tier the group spans
    nvlink: float | np.ndarray  # achievable bytes/s (per group size on a mesh: ``scale_up_bandwidth``)
    network: float

    def reduce_scatter_time(self, nbytes):
        """Reduce-scatter (or all-gather: the same traffic) of ``nbytes`` over the group."""
        intra = self.intra_share * nbytes / self.nvlink
        inter = self.inter_share * (nbytes / self.per_node) / self.network
        return np.where(self.size > 1, intra + inter + self.latency_s, 0.0)

    def all_reduce_time(self, nbytes):
        """All-reduce = reduce-scatter + all-gather of the same buffer."""
        return 2.0 * self.reduce_scatter_time(nbytes)


def group(hw: HardwareSpec, group_size, per_node) -> Group:
    """``Group`` of ``group_size`` ranks with ``per_node`` of them in one NVLink domain."""
    n = np.asarray(group_size, dtype=float)
    g = np.minimum(per_node, n)
    nodes = n / g
    nvlink, network = _bandwidths(hw, g)
    latency = np.where(g > 1, hw.nvlink_latency_us, 0.0) + np.where(nodes > 1, hw.internode_latency_us, 0.0)
    return Group(n, g, (g - 1) / g, (nodes - 1) / np.maximum(nodes, 1), latency * 1e-6, nvlink, network)


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
