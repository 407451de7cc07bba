"""Communication cost: ring collectives over a two-level network (NVLink domain inside a node, NIC across nodes).

Collective formulas (Thakur et al. 2005; NCCL's bus-bandwidth convention), n ranks, message M bytes, bus
bandwidth beta, per-step latency alpha:
    all-reduce       2 (n-1)/n M / beta + 2 (n-1) alpha
    reduce-scatter   (n-1)/n M / beta + (n-1) alpha        (all-gather the same)
    all-to-all       (n-1)/n M / beta + (n-1) alpha
    point-to-point   M / beta + alpha

Placement: ranks are laid out Megatron's way, TP fastest, then CP, then DP (with EP inside DP x CP), then PP
("tp-cp-ep-dp-pp"). A group whose members sit inside one node uses the intra-node link. A group spanning nodes
with k members per node runs NCCL rings with one channel per NIC, so its ring bandwidth is k NICs' worth, capped by
the intra-node link: min(B_intra, k * B_nic). This reduces to "limited by the inter-node bandwidth per GPU" when
each node holds one member (k = 1), as the reference states.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.specs.hardware import Cluster


@dataclass(frozen=True, eq=False)
class GroupPlacement:
    """Where the n members of one process group sit: members per node, and whether the group spans nodes (numbers
    for one group, or arrays over a batch of configurations)."""

    size: int | np.ndarray
    members_per_node: int | np.ndarray
    spans_nodes: bool | np.ndarray


def place_group(size, stride, gpus_per_node: int) -> GroupPlacement:
    """Members of a group of ``size`` ranks spaced ``stride`` apart (stride = product of faster-varying degrees):
    one member when size is 1; one per node when the stride is a node or more; all in one node when they fit in
    the gpus_per_node / stride slots a node has; else that many per node, spanning nodes."""
    size, stride = np.asarray(size, dtype=np.int64), np.asarray(stride, dtype=np.int64)
    per_node = np.maximum(1, gpus_per_node // stride)
    single = size <= 1
    wide = ~single & (stride >= gpus_per_node)
    inside = ~single & ~wide & (size <= per_node)
    return GroupPlacement(size=np.where(single, 1, size),
                          members_per_node=np.where(single | wide, 1, np.where(inside, size, per_node)),
                          spans_nodes=~single & ~inside)


def link_of(cluster: Cluster, spans_nodes) -> tuple[np.ndarray, np.ndarray]:
    """(bus bandwidth bytes/s, latency s) of the link a transfer crosses: the NIC once it leaves the node, else
    the intra-node link."""
    bw = np.where(spans_nodes, cluster.inter_node.bus_bandwidth_bytes_per_s,
                  cluster.intra_node.bus_bandwidth_bytes_per_s)
    return bw, np.where(spans_nodes, cluster.inter_node.latency_s, cluster.intra_node.latency_s)


def ring_link(cluster: Cluster, g: GroupPlacement) -> tuple[np.ndarray, np.ndarray]:
    """(bus bandwidth bytes/s, per-step latency s) that a ring collective over this group reaches: the intra-node
    link inside a node; across nodes k NICs' worth (one NCCL channel per NIC), capped by the intra-node link."""
    intra = cluster.intra_node.bus_bandwidth_bytes_per_s
    inter = cluster.inter_node.bus_bandwidth_bytes_per_s * g.members_per_node
    bw = np.where(g.spans_nodes, np.minimum(intra, inter), intra)
    return bw, np.where(g.spans_nodes, cluster.inter_node.latency_s, cluster.intra_node.latency_s)


def reduce_scatter_s(cluster: Cluster, g: GroupPlacement, msg_bytes):
    """Ring reduce-scatter (or all-gather) of a full M-byte buffer: (n-1)/n M / beta + (n-1) alpha; 0 for one
    member or an empty message."""
    n = g.size
    bw, lat = ring_link(cluster, g)
    t = (n - 1) / n * msg_bytes / bw + (n - 1) * lat
    return np.where((n <= 1) | (np.asarray(msg_bytes) <= 0), 0.0, t)


all_gather_s = reduce_scatter_s


def all_reduce_s(cluster: Cluster, g: GroupPlacement, msg_bytes):
    """Ring all-reduce, a reduce-scatter then an all-gather of the same buffer: 2 (n-1)/n M / beta + 2 (n-1) alpha
    (Thakur et al. 2005; formulas.md)."""
    return 2 * reduce_scatter_s(cluster, g, msg_bytes)


def all_to_all_s(cluster: Cluster, g: GroupPlacement, msg_bytes):
    """All-to-all where each rank holds M bytes and keeps 1/n of them: (n-1)/n M / beta + (n-1) alpha.

    Across nodes the (n-k)/n share bound for other nodes goes through the GPU's own NIC (no ring trick helps an
    all-to-all), the (k-1)/n share for peers in the node over NVLink; the slower of the two bounds the time.
    """
    n, k = g.size, g.members_per_node
    intra, inter = cluster.intra_node, cluster.inter_node
    inside = (n - 1) / n * msg_bytes / intra.bus_bandwidth_bytes_per_s + (n - 1) * intra.latency_s
    t_inter = (n - k) / n * msg_bytes / inter.bus_bandwidth_bytes_per_s
    t_intra = (k - 1) / n * msg_bytes / intra.bus_bandwidth_bytes_per_s
    across = np.maximum(t_inter, t_intra) + (n - 1) * inter.latency_s
    return np.where((n <= 1) | (np.asarray(msg_bytes) <= 0), 0.0, np.where(g.spans_nodes, across, inside))


def p2p_s(cluster: Cluster, spans_nodes, msg_bytes):
    """Point-to-point send of M bytes over the NIC (``spans_nodes``) or the intra-node link: M / beta + alpha."""
    bw, lat = link_of(cluster, spans_nodes)
    return np.where(np.asarray(msg_bytes) <= 0, 0.0, msg_bytes / bw + lat)


# ---------------------------------------------------------------------------------------------------------------
# Groups of a configuration
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Groups:
    tp: GroupPlacement
    cp: GroupPlacement
    ep: GroupPlacement
    pp_spans_nodes: bool | np.ndarray  # a pipeline send crosses the NIC (else the intra-node link)
    etp: GroupPlacement | None = None  # expert TP (None: the TP group)


def groups_for(cluster: Cluster, tp, cp, dp, pp, ep=1, etp=None) -> Groups:
    """Placement of each group under Megatron's default rank order tp-cp-ep-dp-pp (numbers, or arrays over a
    batch); the MoE layers' own grid (Megatron-Core's parallel folding) is etp-ep-edp, so the EP group is spaced
    expert-TP apart (TP when ``etp`` is None, the default). The data-parallel groups, DP x CP for dense and the
    expert-data-parallel group for expert weights, are placed by :func:`planner.cost.data_parallel.dp_groups`."""
    gpn = cluster.gpus_per_node
    tp, cp = np.asarray(tp), np.asarray(cp)
    etp = tp if etp is None else np.asarray(etp)
    return Groups(tp=place_group(tp, 1, gpn), cp=place_group(cp, tp, gpn), ep=place_group(ep, etp, gpn),
                  pp_spans_nodes=pipeline_spans_nodes(cluster, tp, cp, dp, pp), etp=place_group(etp, 1, gpn))


def pipeline_spans_nodes(cluster: Cluster, tp, cp, dp, pp):
    """Whether a pipeline send crosses the NIC. Every rank's send is costed alike, so the slowest hop sets the link
    (as for the CP ring): NVLink only when the whole pipeline (pp > 1 stages of tp x cp x dp ranks, pp outermost
    in Megatron's rank order) sits in one node."""
    return (np.asarray(pp) > 1) & (np.asarray(tp) * cp * np.asarray(dp) * np.asarray(pp) > cluster.gpus_per_node)
