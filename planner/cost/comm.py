"""Communication cost: NCCL's collectives over a two-level network (NVLink domain inside a node, NIC across nodes).

Each collective is priced the way NCCL's own tuner prices it (NVIDIA/nccl v2.30, src/graph/tuning.cc,
``ncclTopoTuneModel``), with its constants as data (``collectives/*.json``, :class:`CollectiveLibrary`): for every
algorithm and protocol (LL, LL128, Simple) a latency (a base latency plus one per hop, NVLink hops and network hops
apart) and a bandwidth (the link's bus bandwidth times the protocol's share); the call takes the fastest. For n
ranks on `nodes` nodes, message M bytes, bus bandwidth beta:

    ring reduce-scatter / all-gather   base + (n - nodes) h_nvl + (nodes - 1) h_net + (n-1)/n M / (share beta)
    ring all-reduce                    base + 2 (n - nodes) h_nvl + 2 (nodes - 1) h_net + 2 (n-1)/n M / (share beta)
    tree all-reduce (across nodes)     base + 2 ((k - 1) h_nvl + floor(log2 nodes) h_net) + 2 M / (share beta)
    NVLS all-reduce (inside a node)    h_nvls + max(2 (n-1)/n M / beta_nvls, M / beta)
    NVLS tree all-reduce (nodes)       h_nvls + 2 floor(log2 nodes) h_net,nvls + 2 (n-1)/n M / min(beta_nvls, x k B_nic)
    all-to-all                         (n-1)/n M / beta + (n-1) alpha       (point-to-point based)
    point-to-point                     M / beta + alpha

(k members per node; a ring with one member per node takes the tree's network hop latency, as NCCL's tuner does.)
The NVLS rate ``beta_nvls`` is the profile's measured NVLink SHARP bus bandwidth; the second term is the wire: every
rank still sends and receives M over its own NVLink. The NVLS tree (NCCL's NVLS_TREE: NVLink SHARP inside each node,
a tree of nodes over the NICs) runs at the slower of that rate and the node's k NICs, whose rate counts twice on two
nodes (x = 2 for nodes <= 2, else 1: ncclTopoTuneModel's "2 node case of NVLSTree"), so on two nodes it goes past the
NICs' ring rate and at scale its latency grows with log2 of the nodes, not with the ranks as the ring's.
Point-to-point transfers (pipeline sends, CP ring steps, the all-to-all's pairwise exchanges) take the link's own
message latency ``alpha``.

Placement: ranks are laid out Megatron's way, TP fastest, then CP, then DP (with EP inside DP x CP), then PP
("tp-cp-ep-dp-pp"). A group whose members sit inside one node uses the intra-node link. A group spanning nodes
with k members per node runs NCCL rings with one channel per NIC, so its ring bandwidth is k NICs' worth, capped by
the intra-node link: min(B_intra, k * B_nic). This reduces to "limited by the inter-node bandwidth per GPU" when
each node holds one member (k = 1), as the reference states. Where a profile measures fewer NICs' worth leaving a
node than its members have (``max_nics_per_collective``: a 72-GPU NVL72 domain), k is capped there
(:func:`node_nics`), for the rings, the tree and the NVLS tree alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.specs.collectives import CollectiveLibrary
from planner.specs.hardware import Cluster, Link


@dataclass(frozen=True, eq=False)
class GroupPlacement:
    """Where the n members of one process group sit: members per node, and whether the group spans nodes (numbers
    for one group, or arrays over a batch of configurations)."""

    size: int | np.ndarray
    members_per_node: int | np.ndarray
    spans_nodes: bool | np.ndarray

    @property
    def nodes(self):
        """Nodes the group's members sit on (1 inside a node)."""
        return np.where(self.spans_nodes, np.asarray(self.size) // np.maximum(1, self.members_per_node), 1)


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


def node_nics(cluster: Cluster, members_per_node):
    """NICs' worth of bandwidth a ring or tree crossing nodes draws from one node: one per member, at most the
    profile's ``max_nics_per_collective`` (NCCL's channels; a GB200 NVL72 domain of 72 leaves through ~8.6,
    measured)."""
    k = np.asarray(members_per_node, dtype=float)
    cap = cluster.inter_node.max_nics_per_collective
    return np.minimum(k, cap) if cap > 0 else k


def ring_bandwidth(cluster: Cluster, g: GroupPlacement) -> np.ndarray:
    """Bus bandwidth (bytes/s) a ring (or tree) over this group reaches: the intra-node link inside a node; across
    nodes k NICs' worth (one NCCL channel per NIC, :func:`node_nics`), capped by the intra-node link."""
    intra = cluster.intra_node.bus_bandwidth_bytes_per_s
    inter = cluster.inter_node.bus_bandwidth_bytes_per_s * node_nics(cluster, g.members_per_node)
    return np.where(g.spans_nodes, np.minimum(intra, inter), intra)


def _fastest_protocol(base_s, hop_s, share, wire_bytes, bandwidth):
    """min over NCCL's protocols of latency + bytes / (share x bandwidth): ``base_s`` and ``share`` are per-protocol
    tuples, ``hop_s(p)`` the hop latencies of protocol p (arrays); a protocol with share 0 is off."""
    best = None
    for p, (b, sh) in enumerate(zip(base_s, share)):
        if sh <= 0:
            continue
        t = b + hop_s(p) + wire_bytes / (sh * bandwidth)
        best = t if best is None else np.minimum(best, t)
    return best


def _ring_s(lib: CollectiveLibrary, g: GroupPlacement, wire_bytes, passes: int, bandwidth):
    """A ring of ``passes`` passes (1: reduce-scatter or all-gather; 2: all-reduce), each n - 1 steps of which
    nodes - 1 cross the network; a ring with one member per node takes the tree's network hop latency (NCCL's
    tuner: with one rank per node every hop's latency is exposed)."""
    n, nodes, one_per_node = np.asarray(g.size), g.nodes, np.asarray(g.members_per_node) <= 1
    nvl_steps, net_steps = passes * (n - nodes), passes * (nodes - 1)

    def hops(p):
        net_hop = np.where(one_per_node, lib.tree_net_hop_s[p], lib.ring_net_hop_s[p])
        return nvl_steps * lib.ring_nvlink_hop_s[p] + net_steps * net_hop
    return _fastest_protocol(lib.ring_base_s, hops, lib.ring_bandwidth_share, wire_bytes, bandwidth)


def reduce_scatter_s(cluster: Cluster, g: GroupPlacement, msg_bytes):
    """Reduce-scatter (or all-gather) of a full M-byte buffer, NCCL's ring at its fastest protocol (module
    docstring); 0 for one member or an empty message."""
    n = g.size
    msg = np.asarray(msg_bytes, dtype=float)
    t = _ring_s(cluster.collectives, g, (n - 1) / n * msg, 1, ring_bandwidth(cluster, g))
    return np.where((n <= 1) | (msg <= 0), 0.0, t)


all_gather_s = reduce_scatter_s


def all_reduce_s(cluster: Cluster, g: GroupPlacement, msg_bytes, algorithm: str | None = None):
    """All-reduce of an M-byte buffer: the fastest of NCCL's ring, its tree (groups spanning nodes), NVLink SHARP
    (groups inside a node whose switch has it) and the NVLS tree (groups spanning such nodes with two or more members
    on each), each at its fastest protocol (module docstring; Thakur et al. 2005 for the ring's 2 (n-1)/n M).
    ``algorithm`` ("ring", "tree", "nvls", "nvls_tree") pins one, as NCCL_ALGO does; one that cannot run on the group
    costs infinity."""
    lib, n, k = cluster.collectives, g.size, g.members_per_node
    msg = np.asarray(msg_bytes, dtype=float)
    bw = ring_bandwidth(cluster, g)
    ring = _ring_s(lib, g, 2 * (n - 1) / n * msg, 2, bw)
    spans = np.asarray(g.spans_nodes)
    tree = nvls = nvls_tree = np.inf  # an algorithm that cannot run on the group
    nvls_bw = cluster.intra_node.nvls_bus_bandwidth_bytes_per_s
    if spans.any():  # the trees run across nodes only
        nodes = np.maximum(1, g.nodes)
        log_nodes = np.floor(np.log2(nodes))
        tree = _fastest_protocol(
            lib.tree_base_s, lambda p: 2 * ((k - 1) * lib.tree_nvlink_hop_s[p] + log_nodes * lib.tree_net_hop_s[p]),
            lib.tree_bandwidth_share, 2 * msg, bw)
        tree = np.inf if tree is None else np.where(spans, tree, np.inf)
        if nvls_bw > 0 and lib.nvls_tree_net_hop_s is not None:
            # NVLink SHARP inside each node, a tree of nodes over the NICs (ncclTopoTuneModel, NVLS_TREE): the
            # node's NICs' rate (node_nics), doubled on two nodes, capped by the NVLS rate; NVLS needs two or more
            # members in the node
            net_bw = cluster.inter_node.bus_bandwidth_bytes_per_s * node_nics(cluster, k) * np.where(nodes <= 2, 2, 1)
            latency = lib.nvls_nvlink_hop_s + 2 * log_nodes * lib.nvls_tree_net_hop_s
            nvls_tree = np.where(spans & (k >= 2), latency + 2 * (n - 1) / n * msg / np.minimum(nvls_bw, net_bw),
                                 np.inf)
    if nvls_bw > 0 and not spans.all():  # NVLink SHARP inside a node whose switch has it
        nvls = np.where(spans, np.inf, lib.nvls_nvlink_hop_s + np.maximum(
            2 * (n - 1) / n * msg / nvls_bw, msg / cluster.intra_node.bus_bandwidth_bytes_per_s))
    options = {"ring": ring, "tree": tree, "nvls": nvls, "nvls_tree": nvls_tree}
    if algorithm is not None and algorithm not in options:
        raise ValueError(f"algorithm must be one of {sorted(options)}, got {algorithm!r}")
    t = options[algorithm] if algorithm else np.minimum(np.minimum(ring, tree), np.minimum(nvls, nvls_tree))
    return np.where((n <= 1) | (msg <= 0), 0.0, t)


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


def host_copy_s(cluster: Cluster, msg_bytes):
    """Copy of M bytes between one GPU and host memory, one direction: M / the profile's host link bandwidth (PCIe,
    NVLink-C2C; ``host_link.bandwidth_gb_s``, nominal). Copy engines move it, so compute runs beside it."""
    return np.asarray(msg_bytes, dtype=float) / cluster.host_link_bytes_per_s


def p2p_s(cluster: Cluster, spans_nodes, msg_bytes):
    """Point-to-point send of M bytes over the NIC (``spans_nodes``) or the intra-node link: M / beta + alpha."""
    bw, lat = link_of(cluster, spans_nodes)
    return _send_s(bw, lat, msg_bytes)


def link_send_s(link: Link, msg_bytes):
    """Point-to-point send of M bytes over ``link`` (between two pools of GPUs): M / beta + alpha."""
    return _send_s(link.bus_bandwidth_bytes_per_s, link.latency_s, msg_bytes)


def _send_s(bw, lat, msg_bytes):
    """The alpha-beta time of one message (Hockney): M / beta + alpha, 0 for no message."""
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
