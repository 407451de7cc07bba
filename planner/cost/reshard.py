"""Moving a run's training state from one layout to another: the bytes each GPU must receive when a job re-plans
onto other GPUs (elastic re-planning: lost or added nodes), and the state no surviving GPU holds any more.

What survives a step and must move (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1: 2 + 2 + 12 bytes per parameter;
gradients are rebuilt by the next step, so they do not move): the optimizer states, fp32 master weight and Adam's
two moments (``memory.optimizer_state_bytes``: 12 bytes, 8 with bf16 moments), on the GPUs ZeRO gives them to (every data-parallel replica at ZeRO-0,
one shard of the DP x CP group, or of HSDP's shard group, from ZeRO-1), and the bf16 weights
(``memory.WEIGHT_BYTES``) on every GPU that computes with them (the TP shard; its ZeRO shard at ZeRO-3). A GPU
rebuilds the bf16 weights its own master shard covers, so it receives only the weights neither its old holding nor
its new master shard give it.

Layout, as Megatron-Core numbers ranks (``parallel_state``: TP fastest, then CP, DP, PP; inside a pipeline stage
the MoE grid expert-TP, EP, expert-DP): each decoder layer's non-expert parameters are one interval [0, 1), split
into TP pieces and each piece into ZeRO shards; each expert of an MoE layer likewise, its expert-TP pieces split
into expert-DP shards; the embedding and the LM head are units of the first and last stage (vocab-parallel over
TP). The norms Megatron replicates across TP are counted inside the TP shards (they are < 0.01% of a layer).
DualPipe's second copy of each stage is counted as its own holder, not as a further ZeRO shard.

New ranks keep the order of the surviving GPUs (launchers number ranks node by node); GPUs of added nodes come
last and hold nothing. Every function here is numpy over the GPUs of a job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost.data_parallel import expert_shard_degree
from planner.cost.memory import (OPTIMIZER_BYTES, WEIGHT_BYTES, embedding_params, end_params_on_gpu,
                                 expert_params_per_layer, layer_params, mtp_params, optimizer_state_bytes)
from planner.cost.schedule import get_schedule
from planner.cost.step import stage_layers
from planner.specs.config import RunConfig
from planner.specs.model import ModelSpec


@dataclass(frozen=True)
class StateLayout:
    """Where one configuration keeps its state, per GPU (arrays over its ranks): the parameters of the units it
    holds (dense: layers' non-expert parts, embedding, head; expert: routed experts, all of a layer's E experts
    counted as one unit per expert) and, in each unit's [0, 1) coordinate, its weight and optimizer intervals."""

    dense_held: np.ndarray  # (N, U) bool: GPU holds dense unit u (layers 0..L-1, then embedding, head)
    dense_params: np.ndarray  # (U,) parameters of each dense unit
    w_lo: np.ndarray  # (N,) bf16 weight interval of each dense unit the GPU holds
    w_hi: np.ndarray
    o_lo: np.ndarray  # (N,) optimizer-state interval
    o_hi: np.ndarray
    dense_piece: np.ndarray  # (N,) which piece of the optimizer state (TP piece x ZeRO shard) the GPU holds
    moe_held: np.ndarray  # (N, L + 1) bool: GPU holds experts of MoE layer l (the last column: MTP experts)
    moe_weight: np.ndarray  # (L + 1,) MoE layers each column stands for (1; the MTP column: the MTP modules)
    expert_params: float  # parameters of one routed expert of one layer
    e_first: np.ndarray  # (N,) first expert of its EP rank
    e_count: int  # experts per EP rank
    ew_lo: np.ndarray  # (N,) expert weight / optimizer intervals inside each expert it holds
    ew_hi: np.ndarray
    eo_lo: np.ndarray
    eo_hi: np.ndarray
    expert_piece: np.ndarray  # (N,) (EP rank, expert-TP piece, expert-ZeRO shard) piece of the optimizer state
    stage_of_unit: np.ndarray  # (U,) pipeline stage (model chunk) of each dense unit
    stage_of_moe: np.ndarray  # (L + 1,) stage of each MoE layer's experts (-1: not an MoE layer)
    #: bytes per parameter of the optimizer's states (``memory.optimizer_state_bytes``: 12, 8 with bf16 moments)
    optimizer_bytes: float = float(OPTIMIZER_BYTES)


def state_layout(model: ModelSpec, cfg: RunConfig) -> StateLayout:
    """Where ``cfg`` keeps each unit of ``model``'s training state (the module docstring's layout)."""
    n, tp, cp, pp, dp = cfg.num_gpus, cfg.tp, cfg.cp, cfg.pp, cfg.dp
    g = np.arange(n)
    tp_r, cp_r = g % tp, (g // tp) % cp
    dp_r, pp_r = (g // (tp * cp)) % dp, g // (tp * cp * dp)
    # ---- which model chunks (stages) each pipeline rank holds, and which stage each layer / unit is in
    sched = get_schedule(cfg.schedule)
    layers = stage_layers(model, cfg)
    n_stages = len(layers)
    holds_stage = np.zeros((pp, n_stages), dtype=bool)
    for r in range(pp):
        holds_stage[r, list(sched.stages_of(pp, cfg.vpp, r))] = True
    stage_of_layer = np.repeat(np.arange(n_stages), layers)
    L = model.num_layers
    stage_of_unit = np.concatenate([stage_of_layer, [0, n_stages - 1]])
    kinds = [model.layer_kinds[k] for k in model.kind_index]
    moe_layer = np.array([kind.moe for kind in kinds], dtype=bool)
    experts_all = expert_params_per_layer(model)
    # the head's parameters as end_params_on_gpu counts them (the tied embedding's copy with pipeline stages), less
    # the MTP modules' experts, which are expert units here
    _, head = end_params_on_gpu(model, cfg.seq_len, 1, n_stages, 1, 1)
    dense_params = np.array([layer_params(model, kind) - (experts_all if kind.moe else 0) for kind in kinds] +
                            [embedding_params(model, cfg.seq_len), float(head) - mtp_params(model)[1]], dtype=float)
    dense_held = holds_stage[pp_r][:, stage_of_unit]
    # ---- dense intervals: TP piece, then the ZeRO shard of the DP x CP (HSDP: shard) group
    shard_dp = cfg.zero_shard_dp
    w_lo, w_hi, o_lo, o_hi, piece = _intervals(tp_r, tp, (dp_r % shard_dp) * cp + cp_r, shard_dp * cp,
                                               cfg.zero_stage)
    # ---- experts: the MoE grid inside a stage's ranks (etp fastest, ep, expert-DP)
    etp, ep = cfg.expert_tp, cfg.ep
    local = g % (tp * cp * dp)
    etp_r, ep_r, edp_r = local % etp, (local // etp) % ep, local // (etp * ep)
    e_count = model.num_experts // ep if model.is_moe else 0
    e_shards = int(expert_shard_degree(dp, cp, ep, tp, etp, cfg.dp_replicas)) if model.is_moe else 1
    ew_lo, ew_hi, eo_lo, eo_hi, e_piece = _intervals(etp_r, etp, edp_r % e_shards, e_shards, cfg.zero_stage)
    e_piece = ep_r * etp * (e_shards if cfg.zero_stage >= 1 else 1) + e_piece  # and the EP rank's experts
    stage_of_moe = np.where(np.append(moe_layer, bool(model.is_moe and model.mtp_layers)),
                            np.append(stage_of_layer, n_stages - 1), -1)
    moe_held = (stage_of_moe[None, :] >= 0) & holds_stage[pp_r][:, np.maximum(stage_of_moe, 0)]
    moe_weight = np.append(np.ones(L), model.mtp_layers)  # the MTP modules: one MoE layer each (mtp_params)
    return StateLayout(
        dense_held=dense_held, dense_params=dense_params, w_lo=w_lo, w_hi=w_hi, o_lo=o_lo, o_hi=o_hi,
        dense_piece=piece, moe_held=moe_held, moe_weight=moe_weight,
        expert_params=experts_all / model.num_experts if model.is_moe else 0.0, e_first=ep_r * e_count,
        e_count=e_count, ew_lo=ew_lo, ew_hi=ew_hi, eo_lo=eo_lo, eo_hi=eo_hi, expert_piece=e_piece,
        stage_of_unit=stage_of_unit, stage_of_moe=stage_of_moe,
        optimizer_bytes=float(optimizer_state_bytes(cfg.adam_moment_bytes)))


def _intervals(tp_rank, tp, shard_rank, shards, zero_stage):
    """A GPU's (weight lo, hi, optimizer lo, hi, optimizer piece) in a unit's [0, 1): its TP piece, split into
    ZeRO shards from ZeRO-1 on (the optimizer states), the weights too at ZeRO-3; the piece numbers the distinct
    optimizer-state holdings (TP piece x shard)."""
    w_lo, w_hi = tp_rank / tp, (tp_rank + 1) / tp
    if zero_stage >= 1:
        o_lo, o_hi = w_lo + shard_rank / (tp * shards), w_lo + (shard_rank + 1) / (tp * shards)
        piece = tp_rank * shards + shard_rank
    else:
        o_lo, o_hi, piece = w_lo, w_hi, tp_rank
    if zero_stage >= 3:
        w_lo, w_hi = o_lo, o_hi
    return w_lo, w_hi, o_lo, o_hi, piece


def _overlap(a_lo, a_hi, b_lo, b_hi):
    return np.maximum(0.0, np.minimum(a_hi, b_hi) - np.maximum(a_lo, b_lo))


@dataclass(frozen=True)
class Reshard:
    """Bytes a re-plan moves (per new GPU, and in all) and the optimizer state no surviving GPU holds."""

    received_bytes: np.ndarray  # (N_new,) what each GPU of the new layout receives (optimizer states + weights)
    optimizer_bytes: float  # of which optimizer states, all GPUs
    weight_bytes: float  # of which bf16 weights, all GPUs
    lost_bytes: float  # optimizer states whose every holder is gone: read back from a checkpoint
    #: the old rank (or -1: a GPU of an added node) that becomes each new rank
    placement: np.ndarray

    @property
    def total_bytes(self) -> float:
        return float(self.received_bytes.sum())

    @property
    def max_gpu_bytes(self) -> float:
        return float(self.received_bytes.max()) if len(self.received_bytes) else 0.0


def _missing(area_new, area_both, new, old):
    """Parameters of (optimizer states, bf16 weights) a GPU lacks: ``area_new`` parameters of units it holds in the
    new layout, ``area_both`` of those it held in the old one too, at the (weight lo, hi, optimizer lo, hi)
    intervals ``new`` and ``old`` (the same for all those units). Optimizer states: the new shard less the old
    one's overlap; weights: the new ones less those held as bf16 and those its new master shard rebuilds
    (|w_new| - |w_new & w_old| - |o_new| + |o_new & w_old|, as o_new lies inside w_new)."""
    w_lo, w_hi, o_lo, o_hi = new
    ow_lo, ow_hi, oo_lo, oo_hi = old
    o_new = o_hi - o_lo
    opt = area_new * o_new - area_both * _overlap(o_lo, o_hi, oo_lo, oo_hi)
    w = area_new * (w_hi - w_lo) - area_both * _overlap(w_lo, w_hi, ow_lo, ow_hi) - area_new * o_new + \
        area_both * _overlap(o_lo, o_hi, ow_lo, ow_hi)
    return opt, w


def received_bytes(model: ModelSpec, a: StateLayout, b: StateLayout, old_gpus: np.ndarray) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """(optimizer, weight) bytes, each of shape (len(old_gpus), N_new): what new rank j receives if it runs on old
    GPU ``old_gpus[i]`` (-1: a GPU of an added node, which holds nothing). Optimizer states: the new shard less what
    the GPU held of it; bf16 weights: those it computes with less what it held as bf16 or rebuilds from its new
    master shard."""
    old_gpus = np.asarray(old_gpus, dtype=np.int64)
    fresh = old_gpus < 0
    src = np.maximum(old_gpus, 0)

    def col(x):  # old per-GPU values as a column (added GPUs: an empty interval)
        return np.where(fresh, 0.0, x[src])[:, None]

    sizes = np.minimum(a.dense_params, b.dense_params)  # the tied LM-head copy exists only with pipeline stages
    held_old = a.dense_held[src] & ~fresh[:, None]
    area_new = (b.dense_held @ b.dense_params)[None, :]
    area_both = held_old.astype(float) @ (b.dense_held * sizes).T
    opt, w = _missing(area_new, area_both, (b.w_lo, b.w_hi, b.o_lo, b.o_hi),
                      tuple(col(x) for x in (a.w_lo, a.w_hi, a.o_lo, a.o_hi)))
    if model.is_moe:  # per pair, the MoE layers held in both layouts times the experts in both EP ranges
        moe_old = a.moe_held[src] & ~fresh[:, None]
        layers_new = (b.moe_held @ b.moe_weight)[None, :]
        layers_both = (moe_old * a.moe_weight).astype(float) @ b.moe_held.T.astype(float)
        first_old = col(a.e_first.astype(float))
        common = np.maximum(0.0, np.minimum(b.e_first + b.e_count, first_old + a.e_count) -
                            np.maximum(b.e_first, first_old))
        e_opt, e_w = _missing(layers_new * b.e_count * b.expert_params, layers_both * common * b.expert_params,
                              (b.ew_lo, b.ew_hi, b.eo_lo, b.eo_hi),
                              tuple(col(x) for x in (a.ew_lo, a.ew_hi, a.eo_lo, a.eo_hi)))
        opt, w = opt + e_opt, w + e_w
    return b.optimizer_bytes * np.maximum(opt, 0.0), WEIGHT_BYTES * np.maximum(w, 0.0)


def reshard(model: ModelSpec, old: RunConfig, new: RunConfig, survivors: np.ndarray, gpus_per_node: int,
            place: bool = True) -> Reshard:
    """The state ``new`` needs on each of its GPUs that ``old`` did not leave there. ``survivors``: the old ranks
    that remain (whole nodes of ``gpus_per_node``), in rank order; where the new job is larger, added nodes make up
    the rest, and where it is smaller, some surviving nodes stay idle (they still serve their state).

    With ``place`` the new job's node positions are given to surviving or added nodes so that the fewest bytes move
    (a launcher's host list sets this order; GPUs keep their slot inside a node): an assignment problem on the
    node-by-node byte matrix (``_assign``). Without it survivors keep their order and added nodes come last."""
    a, b = state_layout(model, old), state_layout(model, new)
    survivors = np.asarray(survivors, dtype=np.int64)
    n_new, gpn = new.num_gpus, gpus_per_node
    if n_new % gpn or len(survivors) % gpn:
        raise ValueError(f"{len(survivors)} surviving GPUs and a layout of {n_new} are not whole nodes of {gpn}")
    sources = np.concatenate([survivors, np.full(max(0, n_new - len(survivors)), -1)])  # old GPU per source slot
    opt, w = received_bytes(model, a, b, sources)
    total = opt + w
    n_src, n_pos = len(sources) // gpn, n_new // gpn
    if place and n_src > 1:
        # cost of source node i in position j: its GPU k becomes new rank j * gpn + k
        cost = np.einsum("ikjk->ij", total.reshape(n_src, gpn, n_pos, gpn))
        order = _assign(cost)
    else:
        order = np.arange(n_pos)  # position j runs source node j
    rows = (order[:, None] * gpn + np.arange(gpn)[None, :]).reshape(-1)  # source slot of each new rank
    cols = np.arange(n_new)
    o, ww = opt[rows, cols], w[rows, cols]
    return Reshard(received_bytes=o + ww, optimizer_bytes=float(o.sum()), weight_bytes=float(ww.sum()),
                   lost_bytes=lost_optimizer_bytes(model, a, survivors), placement=sources[rows])


def _assign(cost: np.ndarray) -> np.ndarray:
    """For cost (sources x positions, sources >= positions): the source node p[j] of each position j, each source
    used at most once, of least total cost[p[j], j]. The Hungarian method with potentials (Kuhn 1955; Munkres
    1957), O(positions^2 x sources), one position added per round, its inner scan over sources vectorized."""
    a = np.asarray(cost, dtype=float).T / (float(np.max(cost)) or 1.0)  # rows: positions, columns: sources
    n, m = a.shape
    u, v = np.zeros(n + 1), np.zeros(m + 1)
    match = np.zeros(m + 1, dtype=np.int64)  # match[j]: the row (1-based) holding column j; 0 = free
    for i in range(1, n + 1):
        match[0], j0 = i, 0
        minv, way, used = np.full(m + 1, np.inf), np.zeros(m + 1, dtype=np.int64), np.zeros(m + 1, dtype=bool)
        while True:
            used[j0] = True
            i0 = match[j0]
            free = ~used[1:]
            cur = a[i0 - 1] - u[i0] - v[1:]
            better = free & (cur < minv[1:])
            minv[1:][better], way[1:][better] = cur[better], j0
            cand = np.where(free, minv[1:], np.inf)
            j1 = int(np.argmin(cand)) + 1
            delta = cand[j1 - 1]
            u[match[used]] += delta
            v[used] -= delta
            minv[1:][free] -= delta
            j0 = j1
            if match[j0] == 0:
                break
        while j0:  # flip the augmenting path
            j1 = way[j0]
            match[j0] = match[j1]
            j0 = j1
    out = np.zeros(n, dtype=np.int64)
    for j in range(1, m + 1):
        if match[j]:
            out[match[j] - 1] = j - 1
    return out


def lost_optimizer_bytes(model: ModelSpec, a: StateLayout, survivors: np.ndarray) -> float:
    """Optimizer-state bytes of layout ``a`` whose every holder is outside ``survivors``: per model chunk, the
    pieces (TP piece x ZeRO shard; for experts, EP rank x expert-TP piece x expert shard) no surviving GPU of the
    chunk's pipeline ranks holds."""
    alive = np.zeros(len(a.w_lo), dtype=bool)
    alive[np.asarray(survivors, dtype=np.int64)] = True

    def lost_share(holders, piece):  # the share of a chunk's (equal) pieces no surviving holder keeps
        pieces = np.unique(piece[holders])
        return 1 - np.isin(pieces, piece[holders & alive]).mean()

    lost = 0.0
    for s in np.unique(a.stage_of_unit):
        units = a.stage_of_unit == s
        lost += lost_share(a.dense_held[:, np.flatnonzero(units)[0]], a.dense_piece) * a.dense_params[units].sum()
    if model.is_moe:
        for s in np.unique(a.stage_of_moe[a.stage_of_moe >= 0]):
            cols = np.flatnonzero(a.stage_of_moe == s)
            lost += lost_share(a.moe_held[:, cols[0]], a.expert_piece) * a.moe_weight[cols].sum() * \
                model.num_experts * a.expert_params
    return a.optimizer_bytes * lost
