"""Mixture of experts (MoE) and expert parallelism (EP): parameter split, token routing volumes and their time.

A MoE layer replaces the MLP by E routed experts of width f (each token uses k of them, chosen by a router) and,
DeepSeekMoE-style (Dai et al. 2024, Sec. 3), n_s shared experts every token uses. Model specs give E
(``num_local_experts`` / ``n_routed_experts``), k (``num_experts_per_tok``), f (``moe_intermediate_size``),
n_s (``n_shared_experts``) and the leading dense layers (``first_k_dense_replace``).

Expert parallelism (Lepikhin et al. 2020, "GShard", Sec. 2-3; Megatron-Core MoE with the all-to-all token
dispatcher): the E experts of a layer are split over ``ep`` ranks, E / ep each, taken from the DP x CP ranks
(Megatron's rule: ep divides dp x cp). Each MoE layer sends every token copy to its expert's rank with an
all-to-all (dispatch) and brings the outputs back with another (combine): two all-to-alls in forward, two in
backward, each rank sending its T k h bf16 token copies, of which 1/ep stay local.
Expert tensor parallelism: each expert's matrices are split over the TP group (Megatron's default,
``--expert-tensor-parallel-size`` = TP); with SP the dispatched tokens are all-gathered over TP before the experts
and reduce-scattered after, on T k tokens instead of the dense MLP's T.
Expert weights and their optimizer states are sharded over ep x TP; ZeRO shards them further over the expert-data-
parallel group of dp x cp / ep ranks (:func:`planner.cost.memory.model_state_bytes`).

Per-node deduplication (DeepSeek-V3 report, Sec. 3.2.2; DeepEP's normal kernels and HybridEP, Megatron-Core's flex
dispatcher, ``RunConfig.ep_dispatcher``): when the EP group spans nodes, such a dispatcher sends each token across
the network once per remote node holding one of its experts and forwards it inside the node over NVLink, so its
all-to-all moves E[distinct remote nodes] x h bytes per token over the NIC instead of k (n - k_node)/n x h
(:func:`node_dedup_all_to_all_s`). Group-limited routing (spec fields ``n_group`` / ``topk_group``; expert groups one
or a whole number per node) bounds the distinct nodes at ``topk_group``. Megatron's all-to-all dispatcher sends
every copy: the plain all-to-all of :func:`planner.cost.comm.all_to_all_s`, whatever the routing.

Assumed: balanced routing (auxiliary-loss or bias balancing) and no dropped tokens (Megatron's dropless MoE). The
all-to-alls are on the critical path unless ``ep_comm_overlap`` pairs micro-batches (Megatron-Core's batch-level
overlap, DualPipe's F&B): then ``planner.cost.step.layer_costs`` keeps only what sticks out of the layer's kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import comm
from planner.cost.compute import ACT_BYTES, Config, expert_tp_token_share, moe_load, sp_degree
from planner.cost.memory import dense_mlp_params
from planner.specs.config import NODE_DEDUP_DISPATCHERS, RunConfig
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec


def local_experts(model: ModelSpec, ep):
    """Routed experts one EP rank holds: E / ep."""
    return model.num_experts / ep


def tokens_per_local_expert(model: ModelSpec, cfg: Config):
    """Token copies each local expert processes per micro-batch with balanced routing: T k ep / E, T = b s / cp
    (the T k copies of the ep ranks' tokens spread evenly over E experts, E / ep of them here)."""
    return cfg.tokens_per_rank * model.experts_per_token / local_experts(model, cfg.ep)


def dispatch_bytes(model: ModelSpec, cfg: Config):
    """Bytes one GPU feeds into one dispatch (or combine) all-to-all: its T k token copies of h bf16 values, T the
    tokens of its SP shard (b s / (cp tp) with SP)."""
    return cfg.tokens_per_rank / sp_degree(cfg) * model.experts_per_token * model.hidden_size * ACT_BYTES


def ep_all_to_all_bytes_per_layer(model: ModelSpec, cfg: Config):
    """Bytes one GPU sends over the network per MoE layer, forward + backward: 4 all-to-alls (dispatch and combine
    each way), of which (ep - 1)/ep of each buffer leaves the GPU."""
    ep = np.asarray(cfg.ep)
    return np.where(ep > 1, 4 * (ep - 1) / ep * dispatch_bytes(model, cfg), 0.0)


def expert_params_per_gpu(model: ModelSpec, cfg: Config):
    """Routed expert weights of one MoE layer on one GPU: E f-wide MLPs split over ep x TP."""
    return model.num_experts * dense_mlp_params(model, model.moe_ffn_hidden_size) / (cfg.ep * cfg.expert_tp)


def expected_nodes_per_token(k: int, nodes, max_nodes=0):
    """Expected distinct nodes a token's k expert copies land on, experts spread evenly over ``nodes`` nodes and
    picked uniformly (balanced routing): n (1 - (1 - 1/n)^k), n = nodes, or n = max_nodes when routing is limited
    to that many nodes (DeepSeek-V3: k = 8 within 4 nodes gives 3.60)."""
    nodes, max_nodes = np.asarray(nodes, dtype=float), np.asarray(max_nodes, dtype=float)
    n = np.where(max_nodes > 0, np.minimum(nodes, max_nodes), nodes)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 0, n * (1.0 - (1.0 - 1.0 / n) ** k), 0.0)


def expected_ranks_per_token(model: ModelSpec, ranks):
    """Expected distinct EP ranks a token's k expert copies land on (balanced routing, experts spread evenly over
    the ``ranks``): R (1 - (1 - 1/R)^k), R the ranks it may reach, all of them, or with group-limited routing the
    share ``topk_group`` / ``n_group`` of them (DeepSeek-V3 over EP 64: 4 of 8 groups, 32 ranks, 7.14 of its 8
    copies; Qwen3-30B-A3B over EP 8: 5.25 of 8)."""
    ranks = np.asarray(ranks, dtype=float)
    share = model.expert_groups_per_token / model.expert_groups if model.expert_groups else 1.0
    return expected_nodes_per_token(model.experts_per_token, np.maximum(1.0, ranks * min(1.0, share)))


def node_dedup_all_to_all_s(model: ModelSpec, cluster: Cluster, cfg: Config, ep_group: comm.GroupPlacement):
    """One dispatch (or combine) with DeepEP's / HybridEP's deduplication (DeepSeek-V3 report Sec. 3.2.2; DeepEP
    deep_ep/buffer.py get_dispatch_layout: ``is_token_in_rank``, a token sent once to each rank holding one of its
    experts, which expands it over its local experts itself): over the NIC each token goes once to each remote node
    it needs, E[distinct nodes] x (N - 1)/N of them, N the nodes of the EP group (at most ``topk_group`` with
    group-limited routing); over NVLink it goes once to each of its distinct ranks (:func:`expected_ranks_per_token`),
    (g - 1)/g of them leaving the GPU (g EP members per node): forwarded from the receiving GPU across nodes, sent
    directly inside one. The slower side bounds the time, plus one latency per peer."""
    g = ep_group.members_per_node
    nodes = -(-ep_group.size // g)  # a last, partly filled node counts
    limit = np.where(model.expert_groups % nodes == 0, model.expert_groups_per_token, 0)
    per_token = model.hidden_size * ACT_BYTES
    T = cfg.tokens_per_rank / sp_degree(cfg) * moe_load(cfg)  # the busiest rank receives the most
    remote = expected_nodes_per_token(model.experts_per_token, nodes, limit) * (nodes - 1) / nodes
    t_inter = T * remote * per_token / cluster.inter_node.bus_bandwidth_bytes_per_s
    ranks = expected_ranks_per_token(model, ep_group.size)
    t_intra = T * ranks * (g - 1) / g * per_token / cluster.intra_node.bus_bandwidth_bytes_per_s
    return np.maximum(t_inter, t_intra) + (nodes - 1) * cluster.inter_node.latency_s + \
        (g - 1) * cluster.intra_node.latency_s


@dataclass(frozen=True)
class EPCost:
    """Expert communication of one MoE layer, one micro-batch, one GPU (all on the critical path; numbers, or
    arrays over a batch)."""

    fwd_s: float | np.ndarray
    bwd_s: float | np.ndarray
    all_to_all_s: float | np.ndarray  # one dispatch (or combine) all-to-all
    expert_tp_s: float | np.ndarray  # all-gather + reduce-scatter of the dispatched tokens over TP, one direction


def ep_layer_cost(model: ModelSpec, cluster: Cluster, cfg: Config, ep_group: comm.GroupPlacement,
                  etp_group: comm.GroupPlacement) -> EPCost:
    """Dispatch + combine all-to-alls over the EP group (forward, and again in backward), plus, with expert TP, the
    all-gather and reduce-scatter of the dispatched token copies over the expert-TP group: the etp ranks' sequence
    shards, T k etp / tp copies with SP (T k when expert TP = TP).

    Without EP (ep = 1) the experts see the TP group's tokens through the same all-gather / reduce-scatter of T h
    that a dense MLP does (Megatron's all-gather dispatcher), already counted as TP communication: zero here.
    """
    has_ep = np.asarray(cfg.ep) > 1
    # the busiest rank (moe_load: RunConfig.moe_load_factor) receives and returns the most copies and sets the pace
    load = moe_load(cfg)
    a2a = comm.all_to_all_s(cluster, ep_group, dispatch_bytes(model, cfg) * load)
    dedup = np.isin(np.asarray(cfg.ep_dispatcher), NODE_DEDUP_DISPATCHERS)
    if np.any(dedup):
        with np.errstate(divide="ignore", invalid="ignore"):
            once_per_node = node_dedup_all_to_all_s(model, cluster, cfg, ep_group)
        a2a = np.where(dedup, once_per_node, a2a)
    a2a = np.where(has_ep, a2a, 0.0)
    per_token_bytes = model.experts_per_token * model.hidden_size * ACT_BYTES
    gathered = cfg.tokens_per_rank * expert_tp_token_share(cfg) * per_token_bytes * load
    etp = comm.all_gather_s(cluster, etp_group, gathered) + comm.reduce_scatter_s(cluster, etp_group, gathered)
    etp = np.where(has_ep, etp, 0.0)  # all_gather_s is 0 for tp = 1
    one_way = 2 * a2a + etp
    return EPCost(one_way, one_way, a2a, etp)


def undominated_dispatchers(model: ModelSpec, cluster: Cluster, ep_group: comm.GroupPlacement,
                            dispatchers: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``dispatchers`` (in order) that no other of them beats on this EP group at any token count: a
    dispatch's time (:func:`ep_layer_cost`'s ``all_to_all_s``) is affine in the tokens T of a GPU's shard, a per-token
    slope over the links plus per-peer latencies, so one that is no faster at one token and no faster per token than
    another never is there. Measured here at T = 1 and 2 (the search's rows hold every T >= 1); equal ones keep the
    first. The rest of a layer depends on the dispatcher only through Megatron-Core's all-to-all one, whose host sync
    adds its time to the expert GEMMs' issue and keeps the paired micro-batch from filling the issue gaps
    (``compute.Op.expert_alltoall``, ``GPU.expert_alltoall_sync_s``, ``step.layer_costs``): a flex dispatcher (DeepEP,
    HybridEP) never computes slower, so it may drop the all-to-all one but never the reverse. What the search holds
    where an EP group spans nodes (``planner.search.space``)."""
    one = RunConfig(num_gpus=ep_group.size, ep=ep_group.size, global_batch_size=ep_group.size, seq_len=1)
    at = {d: np.array([float(ep_layer_cost(model, cluster, one.with_(seq_len=t, ep_dispatcher=d), ep_group,
                                           ep_group).all_to_all_s) for t in (1, 2)]) for d in dispatchers}
    fixed = {d: 2 * v[0] - v[1] for d, v in at.items()}  # the intercept of each affine time
    slope = {d: v[1] - v[0] for d, v in at.items()}

    def no_slower_compute(o, d):  # a flex dispatcher computes no slower than any: the all-to-all one's sync only adds
        return o != "alltoall" or d == "alltoall"  # (GPU.expert_issue_s)
    out = []
    for i, d in enumerate(dispatchers):
        beaten = any(fixed[o] <= fixed[d] and slope[o] <= slope[d] and no_slower_compute(o, d) and
                     (j < i or fixed[o] < fixed[d] or slope[o] < slope[d])
                     for j, o in enumerate(dispatchers) if o != d)
        if not beaten:
            out.append(d)
    return tuple(out)
