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

from planner.specs.hardware import Cluster, Link


@dataclass(frozen=True)
class GroupPlacement:
    """Where the n members of one process group sit: members per node, and whether the group spans nodes."""

    size: int
    members_per_node: int
    spans_nodes: bool


def place_group(size: int, stride: int, gpus_per_node: int) -> GroupPlacement:
    """Members of a group of ``size`` ranks spaced ``stride`` apart (stride = product of faster-varying degrees)."""
    if size <= 1:
        return GroupPlacement(1, 1, False)
    if stride >= gpus_per_node:
        return GroupPlacement(size, 1, True)
    per_node = max(1, gpus_per_node // stride)
    if size <= per_node:
        return GroupPlacement(size, size, False)
    return GroupPlacement(size, per_node, True)


def ring_link(cluster: Cluster, g: GroupPlacement) -> tuple[float, float]:
    """(bus bandwidth bytes/s, per-step latency s) that a ring collective over this group reaches."""
    intra = cluster.intra_node.bus_bandwidth_bytes_per_s
    if not g.spans_nodes:
        return intra, cluster.intra_node.latency_s
    inter = cluster.inter_node.bus_bandwidth_bytes_per_s * g.members_per_node
    return min(intra, inter), cluster.inter_node.latency_s


def all_reduce_s(cluster: Cluster, g: GroupPlacement, msg_bytes: float) -> float:
    """Ring all-reduce: 2 (n-1)/n M / beta + 2 (n-1) alpha (Thakur et al. 2005; formulas.md)."""
    n = g.size
    if n <= 1 or msg_bytes <= 0:
        return 0.0
    bw, lat = ring_link(cluster, g)
    return 2 * (n - 1) / n * msg_bytes / bw + 2 * (n - 1) * lat


def reduce_scatter_s(cluster: Cluster, g: GroupPlacement, msg_bytes: float) -> float:
    """Ring reduce-scatter (or all-gather) of a full M-byte buffer: (n-1)/n M / beta + (n-1) alpha."""
    n = g.size
    if n <= 1 or msg_bytes <= 0:
        return 0.0
    bw, lat = ring_link(cluster, g)
    return (n - 1) / n * msg_bytes / bw + (n - 1) * lat


all_gather_s = reduce_scatter_s


def all_to_all_s(cluster: Cluster, g: GroupPlacement, msg_bytes: float) -> float:
    """All-to-all where each rank holds M bytes and keeps 1/n of them: (n-1)/n M / beta + (n-1) alpha.

    Across nodes the (n-k)/n share bound for other nodes goes through the GPU's own NIC (no ring trick helps an
    all-to-all), the (k-1)/n share for peers in the node over NVLink; the slower of the two bounds the time.
    """
    n = g.size
    if n <= 1 or msg_bytes <= 0:
        return 0.0
    intra = cluster.intra_node
    if not g.spans_nodes:
        return (n - 1) / n * msg_bytes / intra.bus_bandwidth_bytes_per_s + (n - 1) * intra.latency_s
    k = g.members_per_node
    t_inter = (n - k) / n * msg_bytes / cluster.inter_node.bus_bandwidth_bytes_per_s
    t_intra = (k - 1) / n * msg_bytes / intra.bus_bandwidth_bytes_per_s
    return max(t_inter, t_intra) + (n - 1) * cluster.inter_node.latency_s


def p2p_s(link: Link, msg_bytes: float) -> float:
    """Point-to-point send of M bytes: M / beta + alpha."""
    if msg_bytes <= 0:
        return 0.0
    return msg_bytes / link.bus_bandwidth_bytes_per_s + link.latency_s


# ---------------------------------------------------------------------------------------------------------------
# Groups of a configuration
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Groups:
    tp: GroupPlacement
    cp: GroupPlacement
    ep: GroupPlacement
    pp_link: Link  # the link a pipeline send crosses


def groups_for(cluster: Cluster, tp: int, cp: int, dp: int, pp: int, ep: int = 1) -> Groups:
    """Placement of each group under Megatron's default rank order tp-cp-ep-dp-pp. (The data-parallel groups,
    DP x CP for dense and DP x CP / EP for expert weights, are placed where ``planner.cost.step`` reduces them.)"""
    gpn = cluster.gpus_per_node
    # every rank's send is costed alike, so the slowest hop sets the link (as for the CP ring): NVLink only when
    # the whole pipeline sits in one node
    pp_link = cluster.intra_node if (pp == 1 or tp * cp * dp * pp <= gpn) else cluster.inter_node
    return Groups(
        tp=place_group(tp, 1, gpn),
        cp=place_group(cp, tp, gpn),
        ep=place_group(ep, tp, gpn),
        pp_link=pp_link,
    )
