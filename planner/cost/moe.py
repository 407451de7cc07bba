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

Assumed: balanced routing (auxiliary-loss or bias balancing) and no dropped tokens (Megatron's dropless MoE); the
all-to-alls are not overlapped with compute (DeepSeek's DualPipe hides them; that is a schedule, not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import comm
from planner.cost.compute import ACT_BYTES
from planner.cost.memory import dense_mlp_params
from planner.specs.config import RunConfig
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec


def local_experts(model: ModelSpec, ep: int) -> float:
    """Routed experts one EP rank holds: E / ep."""
    return model.num_experts / ep


def tokens_per_local_expert(model: ModelSpec, cfg: RunConfig) -> float:
    """Token copies each local expert processes per micro-batch with balanced routing: T k ep / E, T = b s / cp
    (the T k copies of the ep ranks' tokens spread evenly over E experts, E / ep of them here)."""
    T = cfg.micro_batch_size * cfg.seq_len / cfg.cp
    return T * model.experts_per_token / local_experts(model, cfg.ep)


def dispatch_bytes(model: ModelSpec, cfg: RunConfig) -> float:
    """Bytes one GPU feeds into one dispatch (or combine) all-to-all: its T k token copies of h bf16 values, T the
    tokens of its SP shard (b s / (cp tp) with SP)."""
    T = cfg.micro_batch_size * cfg.seq_len / cfg.cp
    sp = cfg.tp if cfg.sequence_parallel else 1
    return T / sp * model.experts_per_token * model.hidden_size * ACT_BYTES


def ep_all_to_all_bytes_per_layer(model: ModelSpec, cfg: RunConfig) -> float:
    """Bytes one GPU sends over the network per MoE layer, forward + backward: 4 all-to-alls (dispatch and combine
    each way), of which (ep - 1)/ep of each buffer leaves the GPU."""
    if cfg.ep <= 1:
        return 0.0
    return 4 * (cfg.ep - 1) / cfg.ep * dispatch_bytes(model, cfg)


def expert_params_per_gpu(model: ModelSpec, cfg: RunConfig) -> float:
    """Routed expert weights of one MoE layer on one GPU: E f-wide MLPs split over ep x TP."""
    return model.num_experts * dense_mlp_params(model, model.moe_ffn_hidden_size) / (cfg.ep * cfg.tp)


@dataclass(frozen=True)
class EPCost:
    """Expert communication of one MoE layer, one micro-batch, one GPU (all on the critical path)."""

    fwd_s: float
    bwd_s: float
    all_to_all_s: float  # one dispatch (or combine) all-to-all
    expert_tp_s: float  # all-gather + reduce-scatter of the dispatched tokens over TP, one direction


NO_EP = EPCost(0.0, 0.0, 0.0, 0.0)


def ep_layer_cost(model: ModelSpec, cluster: Cluster, cfg: RunConfig, ep_group: comm.GroupPlacement,
                  tp_group: comm.GroupPlacement) -> EPCost:
    """Dispatch + combine all-to-alls over the EP group (forward, and again in backward), plus, with TP, the
    all-gather and reduce-scatter of the T k dispatched token copies over the TP group (expert TP).

    Without EP (ep = 1) the experts see the TP group's tokens through the same all-gather / reduce-scatter of T h
    that a dense MLP does (Megatron's all-gather dispatcher), already counted as TP communication: zero here.
    """
    if cfg.ep <= 1:
        return NO_EP
    a2a = comm.all_to_all_s(cluster, ep_group, dispatch_bytes(model, cfg))
    etp = 0.0
    if cfg.tp > 1:
        T = cfg.micro_batch_size * cfg.seq_len / cfg.cp
        gathered = T * model.experts_per_token * model.hidden_size * ACT_BYTES
        etp = comm.all_gather_s(cluster, tp_group, gathered) + comm.reduce_scatter_s(cluster, tp_group, gathered)
    one_way = 2 * a2a + etp
    return EPCost(one_way, one_way, a2a, etp)
