"""Lower bounds on the step time and the peak memory of every candidate, vectorized with numpy.

The search only prunes with these, so none may exceed what ``planner.cost.step.estimate`` computes for the same
configuration. Tests check this on every candidate of small and medium spaces, and the search re-checks it on every
configuration it evaluates exactly (``bound_violations`` in its statistics).

Per-layer costs come from the cost model itself (``step._layer_cost``: kernel times of ``compute.layer_ops`` plus
the exposed TP / CP / EP communication of one layer), evaluated once per distinct (TP, CP, CP kind, micro-batch,
SP, EP); the embedding and LM head kernels from ``compute.embedding_ops`` / ``head_ops``.

Time. Every pipeline rank runs forward and backward of its layers for each of the m micro-batches, plus any
recomputation; point-to-point, data-parallel and optimizer time only add to this. With W the per-micro-batch work
of the whole model, the ranks' times sum to at least W and a pipeline of p equal ranks is never slower than one
with the same total split unevenly (1F1B: (m - 1) max t + sum t, Narayanan et al. 2021 Sec. 2.2). Two bounds:

* cheap, for all rows at once: ``schedule.time`` of p equal unit ranks, at the corner split of F / B / W that
  gives the smallest time (the closed forms are linear in the split for 1F1B and interleaved, and the zero-bubble
  forms only shrink as W grows), times W / p;
* refined, per group when the search reaches it: ``schedule.time`` of p equal ranks at the group's own F / B / W
  split (exact for equal stages; ``planner.cost.schedule`` shows the zero-bubble forms are exact when every rank
  has W <= min(F, B), which real layers have).

Plus the optimizer step, which reads and writes each local parameter's states once
(``step.ADAM_BYTES_PER_PARAM`` bytes over HBM).

Memory. Each checked pipeline rank (rank 0, rank p-1, the ones with the most layers and, for MoE models, the most
MoE layers) holds its model states (Rajbhandari et al. 2020: 2 + 2 + 12 bytes per parameter, sharded by ZeRO stage
over DP x CP, plus ZeRO-3's two gathered layers), its in-flight activations (the schedule's ``inflight``
micro-batches times the per-layer bytes of ``memory.activation_bytes_per_layer``, Korthikanti et al. 2022 Table 2)
and a floor of its workspace (CP buffers; the layer being recomputed under full recomputation; the LM head's
logits on the rank holding it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.cost import comm
from planner.cost.compute import ACT_BYTES, embedding_ops, head_ops, pass_times
from planner.cost.memory import (GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, embedding_activation_bytes,
                                 embedding_params, expert_params_per_layer, head_activation_bytes, head_params,
                                 layer_params, norm_params)
from planner.cost import schedule
from planner.cost.schedule import SCHEDULES
from planner.cost.step import ADAM_BYTES_PER_PARAM, _layer_cost
from planner.search import layer_table
from planner.search.space import G, REC_FULL_ALL, REC_FULL_K, REC_SELECTIVE, Rows, Space, recompute_k
from planner.specs.config import CP_KINDS, RunConfig, even_layer_split
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec


#: bytes per element of the DP gradient reduction the search assumes (RunConfig's default, bf16)
GRAD_REDUCE_BYTES = RunConfig(num_gpus=1).grad_reduce_bytes


#: pipeline ranks whose memory the bounds check (see GroupTables.rank_layers)
RANK_PICKS = 4
#: further ranks checked for MoE models: the most MoE layers times in-flight micro-batches, and the most MoE layers
#: (with leading dense layers, rank 0 holds fewer experts than the others)
MOE_RANK_PICKS = 2


def _unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the given columns and, per input row, the index of its distinct row (like
    ``np.unique(axis=0)``, but through one integer key per row, which is much faster)."""
    codes, sizes, values = [], [], []
    for c in cols:
        c = np.asarray(c).reshape(-1)
        if c.size and c.dtype.kind in "iu" and c.min() >= 0 and c.max() < max(1 << 16, 4 * c.size):
            # small non-negative integers (every column here): rank the values through a presence table, O(n)
            present = np.bincount(c) > 0
            v = np.flatnonzero(present)
            inv = (np.cumsum(present) - 1)[c]
        else:
            v, inv = np.unique(c, return_inverse=True)
        values.append(v)
        codes.append(inv.reshape(-1))
        sizes.append(len(v))
    key = np.ravel_multi_index(codes, sizes) if cols[0].size else np.zeros(0, dtype=np.int64)
    n_keys = int(np.prod(sizes, dtype=np.float64))
    if key.size and n_keys <= max(1 << 22, 4 * key.size):  # few possible keys: the presence table again, O(n)
        present = np.bincount(key, minlength=n_keys) > 0
        ukey, inv = np.flatnonzero(present), (np.cumsum(present) - 1)[key]
    else:
        ukey, inv = np.unique(key, return_inverse=True)
    parts = np.unravel_index(ukey, sizes)
    uniq = np.stack([values[j][parts[j]] for j in range(len(cols))], axis=1)
    return uniq, inv.reshape(-1)


class PerKey:
    """A per-group array stored once per distinct key (``values[key[g]]``): most of the bounds' per-group quantities
    depend on a few columns only (the layer costs on TP, CP, micro-batch, SP and EP; the schedule's on the schedule,
    PP, micro-batches and VPP), so each is gathered only for the groups a bound asks about. Indexing as an array:
    ``x[g]``, ``x[g, col]``."""

    __slots__ = ("values", "key")

    def __init__(self, values: np.ndarray, key: np.ndarray):
        self.values, self.key = values, key

    def __getitem__(self, idx):
        if isinstance(idx, tuple):
            return self.values[(self.key[idx[0]],) + idx[1:]]
        return self.values[self.key[idx]]

    def __len__(self) -> int:
        return len(self.key)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.key),) + self.values.shape[1:]


@dataclass(frozen=True)
class GroupTables:
    """Per-group quantities the bounds need (indexed by group: arrays, or ``PerKey`` tables), computed once per
    request."""

    fwd_s: np.ndarray  # whole model, one micro-batch: forward incl. exposed TP / CP / EP comm, embedding, head, and
    #: the pipeline sends of all ranks
    bwd_input_s: np.ndarray  # input-gradient backward incl. exposed comm and pipeline sends
    bwd_weight_s: np.ndarray  # weight-gradient backward
    selective_s: np.ndarray  # extra time of selective recomputation, whole model
    full_s: np.ndarray  # extra time of full recomputation of every layer (its forward again, with comm)
    layer_full_min_s: np.ndarray  # that extra time for the cheapest single layer (dense or MoE)
    factor: np.ndarray  # schedule time with p equal ranks of unit time, smallest over the F / B / W corner splits
    #: pipeline ranks whose memory the bound checks (columns): rank 0, rank p-1, the rank with the most layers x
    #: in-flight micro-batches, the rank with the most layers and, for MoE models, the same two by MoE layers;
    #: for each, under the even split:
    rank_layers: np.ndarray  # layers on the rank (all its chunks)
    rank_moe: np.ndarray  # of which MoE layers
    rank_emb: np.ndarray  # 1 where the rank holds the first chunk (embedding)
    rank_head: np.ndarray  # 1 where the rank holds the last chunk (LM head)
    rank_inflight: np.ndarray  # micro-batches of activations it holds at its peak
    act_none_bytes: np.ndarray  # per layer, one micro-batch, cheapest of dense / MoE
    act_selective_bytes: np.ndarray
    act_full_bytes: np.ndarray
    act_kept_bytes: np.ndarray  # (groups, 4): per dense / MoE layer without recomputation, then with selective
    act_embedding_bytes: np.ndarray
    head_act_bytes: np.ndarray  # LM head logits of one micro-batch (memory.head_activation_bytes)
    cp_buffer_bytes: np.ndarray  # CP communication buffers (a floor of the workspace)
    dense_params_per_layer: np.ndarray  # per dense layer on one GPU, after TP (ZeRO shards it over DP x CP)
    expert_params_per_layer: np.ndarray  # experts of an MoE layer on one GPU, after TP and EP
    moe_params_per_layer: np.ndarray  # the rest of an MoE layer on one GPU (attention, router, shared experts)
    largest_layer_params: np.ndarray  # (groups, 2): a dense and an MoE layer on one GPU (ZeRO-3 gathers them)
    embedding_params: np.ndarray  # on one GPU (rank 0)
    head_params: np.ndarray  # on one GPU (rank p-1)
    dp_shard: np.ndarray
    expert_dp_shard: np.ndarray
    dense_layers: int  # layers before the first MoE layer (all of them for a dense model)
    optimizer_s_per_param: float  # optimizer step time per local parameter
    layer_s: np.ndarray  # (groups, 6): one dense layer's F, B, W and one MoE layer's F, B, W (incl. exposed comm)
    ends_s: np.ndarray  # (groups, 5): embedding F, embedding W (its backward), LM head F, B, W
    p2p_s: np.ndarray  # one pipeline send (0 without PP)


def group_tables(model: ModelSpec, cluster: Cluster, space: Space) -> GroupTables:
    tp, cp, mb, sp = space.col("tp"), space.col("cp"), space.col("mb"), space.col("sp")
    pp, vpp, ep, kind = space.col("pp"), space.col("vpp"), space.col("ep"), space.col("cp_kind")
    gpu = cluster.gpu
    n_dense, n_moe = model.num_layers - model.num_moe_layers, model.num_moe_layers
    # ---- per-layer costs per distinct (tp, cp, cp_kind, mb, sp, ep) --------------------------------------------
    uniq, inv = _unique_rows(tp, cp, kind, mb, sp, ep)
    tab = _layer_tables(model, cluster, space.seq_len, uniq)
    layer_key = inv
    t_ = {k: PerKey(v, layer_key) for k, v in tab.items()}
    # ---- pipeline sends: each chunk of each rank sends its boundary activation forward and its gradient back, one
    # point-to-point each per micro-batch (step.estimate folds them into F and B); Megatron's scatter/gather sends
    # 1/tp of it (Narayanan et al. 2021 Sec. 4.1), the smallest message step.estimate uses
    # (the link as comm.groups_for picks it: NVLink while the whole pipeline sits in one node, else the NIC; the
    # time as comm.p2p_s: M / beta + alpha)
    across = space.dp * tp * cp * pp > cluster.gpus_per_node
    link_bw = np.where(across, cluster.inter_node.bus_bandwidth_bytes_per_s,
                       cluster.intra_node.bus_bandwidth_bytes_per_s)
    link_lat = np.where(across, cluster.inter_node.latency_s, cluster.intra_node.latency_s)
    p2p = np.where(pp > 1, mb * space.seq_len / cp * model.hidden_size * ACT_BYTES / tp / link_bw + link_lat, 0.0)
    sends = pp * vpp * p2p  # whole pipeline, one direction, one micro-batch
    t_["fwd"] = tab["fwd"][inv] + sends
    t_["bwd_in"] = tab["bwd_in"][inv] + sends
    # ---- schedule: equal-rank time factor, in-flight micro-batches and layers of ranks 0 and p-1 ---------------
    L = model.num_layers
    uniq, inv = _unique_rows(space.col("sched"), pp, space.num_microbatches, vpp)
    factor = np.empty(len(uniq))
    n_picks = RANK_PICKS + (MOE_RANK_PICKS if n_moe else 0)
    picks = {k: np.zeros((len(uniq), n_picks)) for k in ("n", "nm", "emb", "head", "infl")}
    for u, (si, p, m, v) in enumerate(uniq.tolist()):
        sched = SCHEDULES[space.schedules[si]]
        ones, zeros = [1.0] * p, [0.0] * p
        factor[u] = min(sched.time(ones, zeros, zeros, m, v).total_s, sched.time(zeros, ones, zeros, m, v).total_s,
                        sched.time(zeros, zeros, ones, m, v).total_s)
        nd, nm, _, emb, head = _rank_layout(space.schedules[si], L, p, v, n_dense)
        infl = [sched.inflight(p, m, v, r) for r in range(p)]
        n = [a + b for a, b in zip(nd, nm)]
        ranks = (0, p - 1, max(range(p), key=lambda r: (n[r] * infl[r], -r)), max(range(p), key=lambda r: (n[r], -r)))
        if n_moe:  # the ranks with the most MoE layers (in flight), whose experts dominate their memory
            ranks += (max(range(p), key=lambda r: (nm[r] * infl[r], n[r] * infl[r], -r)),
                      max(range(p), key=lambda r: (nm[r], n[r], -r)))
        for col, r in enumerate(ranks):
            picks["n"][u, col], picks["nm"][u, col], picks["infl"][u, col] = n[r], nm[r], infl[r]
            picks["emb"][u, col], picks["head"][u, col] = emb[r], head[r]
    # ---- parameters on one GPU ------------------------------------------------------------------------------------
    # (as step.estimate: a layer's non-expert parameters split by TP except its norms; experts by EP x TP)
    norms = 2 * norm_params(model)
    dense_pl = (layer_params(model) - norms) / tp + norms
    moe_dense, expert_pl = dense_pl, np.zeros(len(tp))
    largest_d = largest_m = layer_params(model) / tp
    if model.is_moe:
        ep_part = expert_params_per_layer(model)
        moe_dense = (layer_params(model, moe=True) - ep_part - norms) / tp + norms
        expert_pl = ep_part / (ep * tp)
        largest_m = (layer_params(model, moe=True) - ep_part) / tp + expert_pl
    stages = pp * vpp
    tied_copy = model.vocab_size * model.hidden_size if model.tied_embeddings else 0
    head_p = (head_params(model) + np.where(stages > 1, tied_copy, 0)) / tp
    dp_shard = space.dp * cp
    return GroupTables(
        fwd_s=t_["fwd"], bwd_input_s=t_["bwd_in"], bwd_weight_s=t_["bwd_w"], selective_s=t_["sel"],
        full_s=t_["full"], layer_full_min_s=t_["full_min"],
        factor=PerKey(factor, inv), rank_layers=PerKey(picks["n"], inv), rank_moe=PerKey(picks["nm"], inv),
        rank_emb=PerKey(picks["emb"], inv), rank_head=PerKey(picks["head"], inv),
        rank_inflight=PerKey(picks["infl"], inv),
        act_none_bytes=t_["act_none"], act_selective_bytes=t_["act_sel"], act_full_bytes=t_["act_full"],
        act_kept_bytes=PerKey(np.stack([tab[k] for k in ("act_none_d", "act_none_m", "act_sel_d", "act_sel_m")],
                                       axis=1), layer_key),
        moe_params_per_layer=moe_dense, largest_layer_params=np.stack(np.broadcast_arrays(largest_d, largest_m),
                                                                      axis=1),
        act_embedding_bytes=t_["act_emb"], head_act_bytes=t_["head_act"], cp_buffer_bytes=t_["cp_buf"],
        dense_params_per_layer=dense_pl, expert_params_per_layer=expert_pl,
        embedding_params=embedding_params(model, space.seq_len) / tp, head_params=head_p,
        dp_shard=dp_shard, expert_dp_shard=np.maximum(1, dp_shard // ep), dense_layers=n_dense,
        optimizer_s_per_param=ADAM_BYTES_PER_PARAM / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_bound_efficiency),
        layer_s=PerKey(np.stack([tab[k] for k in ("fd", "bd", "wd", "fm", "bm", "wm")], axis=1), layer_key),
        ends_s=PerKey(np.stack([tab[k] for k in ("emb_f", "emb_w", "head_f", "head_b", "head_w")], axis=1),
                      layer_key), p2p_s=p2p)


#: per-key quantities of ``_layer_tables``
_TABLE_NAMES = ("fwd", "bwd_in", "bwd_w", "sel", "full", "full_min", "act_none", "act_sel", "act_full", "act_emb",
                "cp_buf", "fd", "bd", "wd", "fm", "bm", "wm", "emb_f", "emb_w", "head_f", "head_b", "head_w",
                "act_none_d", "act_none_m", "act_sel_d", "act_sel_m", "head_act")


def _layer_tables(model: ModelSpec, cluster: Cluster, seq_len: int, uniq: np.ndarray) -> dict[str, np.ndarray]:
    """Per distinct key (rows of ``uniq``: TP, CP, CP kind, micro-batch, SP, EP) the whole model's per-micro-batch
    forward / backward / weight-gradient time and recomputation extras, one dense and one MoE layer's F / B / W,
    the embedding and LM head times and the per-layer activation bytes, composed as ``step.estimate`` composes
    ``step._layer_cost``. The layer costs come from :mod:`planner.search.layer_table` (the cost model's formulas
    over arrays, tested equal to ``_layer_cost``), or from ``_layer_cost`` itself where that replica does not
    apply."""
    if not layer_table.supported():
        return _layer_tables_scalar(model, cluster, seq_len, uniq)
    n_moe = model.num_moe_layers
    t, c, k, b, s, e = uniq.T
    dense = layer_table.layer_costs(model, cluster, seq_len, t, c, k, b, s, e, moe=False)
    moe = layer_table.layer_costs(model, cluster, seq_len, t, c, k, b, s, e, moe=True) if n_moe else None
    return _compose_tables(model, dense, moe, layer_table.end_costs(model, cluster, seq_len, t, c, b, s))


#: fields of ``layer_table.layer_costs`` (as ``step._LayerCost`` / ``PassTimes`` name them) and of ``end_costs``
_LAYER_FIELDS = ("fwd_s", "bwd_input_s", "bwd_weight_s", "selective_recompute_s", "tp_fwd_s", "tp_bwd_s",
                 "cp_fwd_s", "cp_bwd_s", "ep_fwd_s", "act_bytes", "act_none_bytes", "act_full_bytes",
                 "cp_buffer_bytes")
_END_FIELDS = ("emb_fwd_s", "emb_bwd_s", "head_fwd_s", "head_bwd_input_s", "head_bwd_weight_s", "act_emb_bytes",
               "head_act_bytes")


def _compose_tables(model: ModelSpec, dense: dict[str, np.ndarray], moe: dict[str, np.ndarray] | None,
                    ends: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``_layer_tables`` from one dense and (MoE models) one MoE layer's costs and the end costs, per key."""
    n_dense, n_moe = model.num_layers - model.num_moe_layers, model.num_moe_layers
    costs = [(n_dense, dense)] + ([(n_moe, moe)] if n_moe else [])
    n = len(ends["emb_fwd_s"])
    tab = {name: np.zeros(n) for name in _TABLE_NAMES}
    full_min = np.full(n, np.inf)
    act = {"act_none": np.full(n, np.inf), "act_sel": np.full(n, np.inf), "act_full": np.full(n, np.inf)}
    for (count, lc), kind_ in zip(costs, "dm"):
        # the composition of step.estimate: forward comm = TP + CP + EP forward, backward likewise
        comm_f = lc["tp_fwd_s"] + lc["cp_fwd_s"] + lc["ep_fwd_s"]
        comm_b = lc["tp_bwd_s"] + lc["cp_bwd_s"] + lc["ep_fwd_s"]
        tab["f" + kind_] = lc["fwd_s"] + comm_f
        tab["b" + kind_] = lc["bwd_input_s"] + comm_b
        tab["w" + kind_] = lc["bwd_weight_s"]
        tab["fwd"] = tab["fwd"] + count * (lc["fwd_s"] + comm_f)
        tab["bwd_in"] = tab["bwd_in"] + count * (lc["bwd_input_s"] + comm_b)
        tab["bwd_w"] = tab["bwd_w"] + count * lc["bwd_weight_s"]
        tab["sel"] = tab["sel"] + count * lc["selective_recompute_s"]
        tab["full"] = tab["full"] + count * (lc["fwd_s"] + comm_f)
        full_min = np.minimum(full_min, lc["fwd_s"] + comm_f)
        act["act_none"] = np.minimum(act["act_none"], lc["act_none_bytes"])
        act["act_sel"] = np.minimum(act["act_sel"], lc["act_bytes"])
        act["act_full"] = np.minimum(act["act_full"], lc["act_full_bytes"])
        tab["act_none_" + kind_], tab["act_sel_" + kind_] = lc["act_none_bytes"], lc["act_bytes"]
        tab["cp_buf"] = np.maximum(tab["cp_buf"], lc["cp_buffer_bytes"])
    tab["full_min"] = full_min
    tab.update(act)
    if not n_moe:
        tab["fm"], tab["bm"], tab["wm"] = tab["fd"], tab["bd"], tab["wd"]
        tab["act_none_m"], tab["act_sel_m"] = tab["act_none_d"], tab["act_sel_d"]
    if not n_dense:
        tab["act_none_d"], tab["act_sel_d"] = tab["act_none_m"], tab["act_sel_m"]
    tab["emb_f"], tab["emb_w"] = ends["emb_fwd_s"], ends["emb_bwd_s"]
    tab["head_f"], tab["head_b"] = ends["head_fwd_s"], ends["head_bwd_input_s"]
    tab["head_w"] = ends["head_bwd_weight_s"]
    tab["fwd"] = tab["fwd"] + (ends["emb_fwd_s"] + ends["head_fwd_s"])
    tab["bwd_in"] = tab["bwd_in"] + ends["head_bwd_input_s"]
    tab["bwd_w"] = tab["bwd_w"] + (ends["emb_bwd_s"] + ends["head_bwd_weight_s"])
    tab["act_emb"] = ends["act_emb_bytes"]
    tab["head_act"] = ends["head_act_bytes"]
    return tab


def _layer_tables_scalar(model: ModelSpec, cluster: Cluster, seq_len: int,
                         uniq: np.ndarray) -> dict[str, np.ndarray]:
    """``_layer_tables`` through the scalar cost model, one ``step._layer_cost`` call per key and layer kind (the
    reference the vectorized replica is tested against, and the fallback where it does not apply), composed by the
    same ``_compose_tables``."""
    gpu = cluster.gpu
    n = len(uniq)
    kinds = (False, True) if model.num_moe_layers else (False,)
    layers = {moe: {f: np.zeros(n) for f in _LAYER_FIELDS} for moe in kinds}
    ends = {f: np.zeros(n) for f in _END_FIELDS}
    for u, (t, c, k, b, s, e) in enumerate(uniq.tolist()):
        cfg = RunConfig(num_gpus=t * c * e, tp=t, cp=c, ep=e, cp_kind=CP_KINDS[k], micro_batch_size=b,
                        seq_len=seq_len, sequence_parallel=bool(s), recompute="selective")
        groups = comm.groups_for(cluster, t, c, e, 1, e)
        for moe in kinds:
            lc = _layer_cost(model, cluster, cfg, groups, moe=moe)
            row = {"fwd_s": lc.pt.fwd_s, "bwd_input_s": lc.pt.bwd_input_s, "bwd_weight_s": lc.pt.bwd_weight_s,
                   "selective_recompute_s": lc.pt.selective_recompute_s, "tp_fwd_s": lc.tp_fwd_s,
                   "tp_bwd_s": lc.tp_bwd_s, "cp_fwd_s": lc.cp_fwd_s, "cp_bwd_s": lc.cp_bwd_s,
                   "ep_fwd_s": lc.ep_fwd_s, "act_bytes": lc.act_bytes, "act_none_bytes": lc.act_none_bytes,
                   "act_full_bytes": lc.act_full_bytes, "cp_buffer_bytes": lc.cp_buffer_bytes}
            for f, val in row.items():
                layers[moe][f][u] = val
        emb = pass_times(embedding_ops(model, cfg), gpu)
        head = pass_times(head_ops(model, cfg), gpu)
        row = {"emb_fwd_s": emb.fwd_s, "emb_bwd_s": emb.bwd_s, "head_fwd_s": head.fwd_s,
               "head_bwd_input_s": head.bwd_input_s, "head_bwd_weight_s": head.bwd_weight_s,
               "act_emb_bytes": embedding_activation_bytes(model, cfg),
               "head_act_bytes": head_activation_bytes(model, cfg)}
        for f, val in row.items():
            ends[f][u] = val
    return _compose_tables(model, layers[False], layers.get(True), ends)


def _work_s(t: GroupTables, g: np.ndarray) -> np.ndarray:
    return t.fwd_s[g] + t.bwd_input_s[g] + t.bwd_weight_s[g]


def group_time_bound(space: Space, t: GroupTables) -> np.ndarray:
    """Cheap lower bound on the step time of every row of each group (its no-recomputation rows' bound)."""
    g = np.arange(len(space.groups))
    return _work_s(t, g) / space.col("pp") * t.factor[g]


def _recompute_s(space: Space, t: GroupTables, g: np.ndarray, rec: np.ndarray) -> np.ndarray:
    """Extra time of a recomputation code over the whole model (a floor for "full on k layers per stage")."""
    pp, vpp = space.col("pp")[g], space.col("vpp")[g]
    stages = pp * vpp
    L = space.num_layers
    base, extra = L // stages, L % stages
    k = recompute_k(rec)
    full_k_layers = extra * np.minimum(base + 1, k) + (stages - extra) * np.minimum(base, k)
    return np.select([rec == REC_SELECTIVE, rec == REC_FULL_ALL, rec >= REC_FULL_K],
                     [t.selective_s[g], t.full_s[g], full_k_layers * t.layer_full_min_s[g]], 0.0)


@lru_cache(maxsize=4096)
def _rank_layout(schedule: str, num_layers: int, p: int, v: int, dense_until: int) -> tuple[tuple[int, ...], ...]:
    """Per rank, under the even split and the schedule's placement of model chunks on ranks: dense layers, MoE
    layers, chunks, whether it holds the first chunk (embedding) and whether it holds the last (LM head)."""
    sched = SCHEDULES[schedule]
    counts = even_layer_split(num_layers, p * v)
    starts = [sum(counts[:j]) for j in range(len(counts))]
    nd, nm, emb, head = [0] * p, [0] * p, [0] * p, [0] * p
    for r in range(p):
        for c in range(v):
            j = sched.stage_index(p, v, r, c)
            dense = max(0, min(starts[j] + counts[j], dense_until) - starts[j])
            nd[r] += dense
            nm[r] += counts[j] - dense
            emb[r] |= j == 0
            head[r] |= j == p * v - 1
    return tuple(nd), tuple(nm), (v,) * p, tuple(emb), tuple(head)


def rank_times(space: Space, t: GroupTables, g: int) -> tuple[list[float], list[float], list[float]]:
    """Per-rank F, B, W of one micro-batch under the even split, with no recomputation.

    Each rank's times add up what ``step.estimate`` puts on it, leaving out only terms that add (the LM head's
    sequence-parallel gather, the TP gather of a pipeline send without SP): its chunks' layers (dense or MoE, with
    exposed TP / CP / EP comm), one pipeline send each way per chunk, the embedding on the first chunk and the LM
    head on the last. So they are exact on a rank without the LM head whenever TP = 1 or SP is on."""
    row = space.groups[g]
    p, v = int(row[G["pp"]]), int(row[G["vpp"]])
    fd, bd, wd, fm, bm, wm = t.layer_s[g].tolist()
    emb_f, emb_w, head_f, head_b, head_w = t.ends_s[g].tolist()
    send = float(t.p2p_s[g]) if p > 1 else 0.0
    nd, nm, chunks, emb, head = _rank_layout(space.schedules[int(row[G["sched"]])], space.num_layers, p, v,
                                             t.dense_layers)
    F = [nd[r] * fd + nm[r] * fm + chunks[r] * send + emb[r] * emb_f + head[r] * head_f for r in range(p)]
    B = [nd[r] * bd + nm[r] * bm + chunks[r] * send + head[r] * head_b for r in range(p)]
    W = [nd[r] * wd + nm[r] * wm + emb[r] * emb_w + head[r] * head_w for r in range(p)]
    return F, B, W


def refined_group_bound(space: Space, t: GroupTables, g: int, times=None) -> float:
    """The schedule's time over the group's per-rank ``rank_times`` (no recomputation: a floor for every row)."""
    row = space.groups[g]
    sched = SCHEDULES[space.schedules[int(row[G["sched"]])]]
    F, B, W = times or rank_times(space, t, g)
    return sched.time(F, B, W, int(space.num_microbatches[g]), int(row[G["vpp"]])).total_s


def data_parallel_floor_s(model: ModelSpec, cluster: Cluster, space: Space, t: GroupTables,
                          g: int, times=None) -> tuple[np.ndarray, np.ndarray]:
    """Per ZeRO stage 0..3, (a, C) such that step >= a x pipeline + C, from the data-parallel collectives of ranks
    0 and p-1 (ring costs from ``planner.cost.comm``; their parameters from the per-rank floors above).

    ``step.estimate`` adds each collective's exposed part, ``_exposed(c, window) = c - h + i h`` with h = min(c,
    window) hidden under a window of the rank's compute and i = ``gpu.comm_overlap_interference``, to the pipeline
    time P, which is at least m x the rank's per-micro-batch time t (so every window is at most t <= P / m):

    * ZeRO-0 (all-reduce of the gradients) and ZeRO-1/2 (reduce-scatter of the gradients + all-gather of the
      weights), windows within one micro-batch: step >= P + c - (1 - i) t >= (1 - (1 - i)/m) P + c;
    * ZeRO-3, gathers and reduce-scatter per micro-batch: step >= P + m (c - (1 - i) t) >= i P + m c;
      gathered once per step (breadth-first schedules): step >= P + c - (1 - i) m t >= i P + c.

    Where ``rank_times`` are exact for rank 0 (see there), its own windows give a second floor:
    step >= P + _exposed(gradient collective, backward) + _exposed(weight gather, forward) for ZeRO-0/1/2, and
    step >= P + m _exposed(ZeRO-3 traffic, 2 F + B + W) for ZeRO-3 (recomputation adds at most one forward of the
    layers to a micro-batch, so 2 F + B + W bounds its window). Returned as arrays a, C of shape (2, 4):
    step >= max_k (a[k] P + C[k]) per ZeRO stage.
    """
    row = space.groups[g]
    tp, ep, pp = int(row[G["tp"]]), int(row[G["ep"]]), int(row[G["pp"]])
    m = int(space.num_microbatches[g])
    sched = SCHEDULES[space.schedules[int(row[G["sched"]])]]
    i = float(getattr(cluster.gpu, "comm_overlap_interference", 0.0))
    gpn = cluster.gpus_per_node
    dp_group = comm.place_group(int(t.dp_shard[g]), tp, gpn)
    edp_group = comm.place_group(int(t.expert_dp_shard[g]), tp * ep, gpn)
    grad_bytes = GRAD_REDUCE_BYTES
    coll = [0.0] * 4
    rank0: tuple[float, ...] = ()
    for n, nm, extra in _end_ranks_of(t, g):
        dense, expert = (float(x) for x in _local_params(t, g, n, nm, extra))
        pairs = ((dp_group, dense), (edp_group, expert))
        ar = sum(comm.all_reduce_s(cluster, grp, k * grad_bytes) for grp, k in pairs)
        rs = sum(comm.reduce_scatter_s(cluster, grp, k * grad_bytes) for grp, k in pairs)
        ag = sum(comm.all_gather_s(cluster, grp, k * WEIGHT_BYTES) for grp, k in pairs)
        per_mb = 2 * ag + rs
        z3 = per_mb if sched.zero3_gathers_once_per_step else m * per_mb
        coll = [max(x, y) for x, y in zip(coll, (ar, rs + ag, rs + ag, z3))]
        rank0 = rank0 or (ar, rs, ag, per_mb)
    a = 1 - (1 - i) / m
    coef, const = [[a, a, a, i]], [coll]
    holds_head = _rank_layout(space.schedules[int(row[G["sched"]])], space.num_layers, pp, int(row[G["vpp"]]),
                              t.dense_layers)[4][0]
    if tp == 1 or (int(row[G["sp"]]) and not holds_head):
        F, B, W = times or rank_times(space, t, g)
        fwd, bwd = F[0], B[0] + W[0]
        # a micro-batch's time on rank 0 with any recomputation: recomputing redoes at most the layers' forward
        t_mb = 2 * fwd + bwd
        ar, rs, ag, per_mb = rank0

        def exposed(c: float, window: float) -> float:  # step._exposed
            hidden = min(c, window)
            return c - hidden + hidden * i

        z12 = exposed(rs, bwd) + exposed(ag, fwd)
        z3 = exposed(per_mb, m * t_mb) if sched.zero3_gathers_once_per_step else m * exposed(per_mb, t_mb)
        coef.append([1.0, 1.0, 1.0, 1.0])
        const.append([exposed(ar, bwd), z12, z12, z3])
    else:  # no second floor: step >= P, which the caller takes anyway
        coef.append([1.0, 1.0, 1.0, 1.0])
        const.append([0.0, 0.0, 0.0, 0.0])
    return np.array(coef), np.array(const)


def refine_group(model: ModelSpec, cluster: Cluster, space: Space, t: GroupTables, g: int, cheap_bound: float,
                 threshold: float = np.inf, floors: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                 ) -> tuple[float, float, tuple[np.ndarray, np.ndarray]]:
    """(bound on every row of group g, its pipeline floor, its data-parallel floor (a, C)): the refined pipeline
    time, raised per ZeRO stage by the data-parallel floor and the optimizer step, least over the stages the space
    allows. When the pipeline floor alone already exceeds ``threshold`` the rest is not computed (the group is
    pruned whatever it would add). ``floors``: the group's (a, C, optimizer seconds per ZeRO stage) from
    :func:`group_floors`, if already computed."""
    times = rank_times(space, t, g)
    pipe = max(cheap_bound, refined_group_bound(space, t, g, times))
    if pipe > threshold:
        return pipe, pipe, (np.ones((2, 4)), np.zeros((2, 4)))
    if floors is None:
        dp, opt = data_parallel_floor_s(model, cluster, space, t, g, times), _optimizer_floats(space, t, g)
    else:
        dp, opt = floors[:2], floors[2]
    zeros = np.array(space.zero_stages, dtype=np.int64)
    per_zero = with_data_parallel_floor(pipe, dp[0][:, zeros], dp[1][:, zeros]) + opt[zeros]
    return float(per_zero.min()), pipe, dp


def group_floors(model: ModelSpec, cluster: Cluster, space: Space, t: GroupTables,
                 g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``data_parallel_floor_s`` (a, C, each of shape (len(g), 2, 4)) and ``_optimizer_floats`` (shape (len(g), 4))
    of many groups at once, with the same formulas (ring collectives as in ``planner.cost.comm``, through
    :mod:`planner.search.layer_table`'s array versions; tests check equality with the per-group functions)."""
    g = np.asarray(g, dtype=np.int64)
    n = len(g)
    tp, ep, sp = space.col("tp")[g], space.col("ep")[g], space.col("sp")[g]
    m = space.num_microbatches[g]
    once = np.array([SCHEDULES[name].zero3_gathers_once_per_step for name in space.schedules])[space.col("sched")[g]]
    i = float(getattr(cluster.gpu, "comm_overlap_interference", 0.0))
    gpn = cluster.gpus_per_node
    dp_shard, edp_shard = t.dp_shard[g], t.expert_dp_shard[g]
    dp_group = layer_table.place_group(dp_shard, tp, gpn)
    edp_group = layer_table.place_group(edp_shard, tp * ep, gpn)
    coll = np.zeros((n, 4))
    full = sharded = np.zeros(n)
    rank0 = None
    for n_l, nm, extra, _, _, _ in _end_ranks(space, t, g):
        dense, expert = _local_params(t, g, n_l, nm, extra)
        full = np.maximum(full, dense + expert)
        sharded = np.maximum(sharded, dense / dp_shard + expert / edp_shard)
        ar = layer_table.all_reduce_s(cluster, dp_group, dense * GRAD_REDUCE_BYTES) + \
            layer_table.all_reduce_s(cluster, edp_group, expert * GRAD_REDUCE_BYTES)
        rs = layer_table.reduce_scatter_s(cluster, dp_group, dense * GRAD_REDUCE_BYTES) + \
            layer_table.reduce_scatter_s(cluster, edp_group, expert * GRAD_REDUCE_BYTES)
        ag = layer_table.all_gather_s(cluster, dp_group, dense * WEIGHT_BYTES) + \
            layer_table.all_gather_s(cluster, edp_group, expert * WEIGHT_BYTES)
        per_mb = 2 * ag + rs
        z3 = np.where(once, per_mb, m * per_mb)
        coll = np.maximum(coll, np.stack([ar, rs + ag, rs + ag, z3], axis=1))
        if rank0 is None:
            rank0 = (ar, rs, ag, per_mb)
    a = 1 - (1 - i) / m
    coef = np.empty((n, 2, 4))
    coef[:, 0, :3], coef[:, 0, 3], coef[:, 1, :] = a[:, None], i, 1.0
    const = np.zeros((n, 2, 4))
    const[:, 0] = coll
    # the second floor, where rank_times are exact for rank 0 (pick 0): TP 1, or SP on and rank 0 without the head
    exact0 = (tp == 1) | ((sp != 0) & (t.rank_head[g, 0] == 0))
    nd0, nm0 = t.rank_layers[g, 0] - t.rank_moe[g, 0], t.rank_moe[g, 0]
    emb0, head0 = t.rank_emb[g, 0], t.rank_head[g, 0]
    fd, bd, wd, fm, bm, wm = t.layer_s[g].T
    emb_f, emb_w, head_f, head_b, head_w = t.ends_s[g].T
    send = np.where(space.col("pp")[g] > 1, t.p2p_s[g], 0.0)
    chunks = space.col("vpp")[g]
    fwd = nd0 * fd + nm0 * fm + chunks * send + emb0 * emb_f + head0 * head_f
    bwd = (nd0 * bd + nm0 * bm + chunks * send + head0 * head_b) + (nd0 * wd + nm0 * wm + emb0 * emb_w +
                                                                     head0 * head_w)
    t_mb = 2 * fwd + bwd
    ar, rs, ag, per_mb = rank0

    def exposed(c: np.ndarray, window: np.ndarray) -> np.ndarray:  # step._exposed
        hidden = np.minimum(c, window)
        return c - hidden + hidden * i

    z12 = exposed(rs, bwd) + exposed(ag, fwd)
    z3 = np.where(once, exposed(per_mb, m * t_mb), m * exposed(per_mb, t_mb))
    second = np.stack([exposed(ar, bwd), z12, z12, z3], axis=1)
    const[:, 1] = np.where(exact0[:, None], second, 0.0)
    opt = np.stack([full, sharded, sharded, sharded], axis=1) * t.optimizer_s_per_param
    return coef, const, opt


def refined_group_bounds(space: Space, t: GroupTables, g: np.ndarray) -> np.ndarray:
    """``refined_group_bound`` of many groups at once: each schedule's closed form (``planner.cost.schedule``) over
    the groups' per-rank ``rank_times``, as arrays of shape (groups, ranks) with ranks past a group's p zero (they
    add nothing to any form), summed rank by rank in the scalar forms' order. Schedules whose time function has no
    array form here are timed by the scalar function."""
    g = np.asarray(g, dtype=np.int64)
    n = len(g)
    sched = space.col("sched")[g]
    p, v, m = space.col("pp")[g], space.col("vpp")[g], space.num_microbatches[g]
    p_max = int(p.max()) if n else 1
    combos, inv = np.unique(np.stack([sched, p, v], axis=1), axis=0, return_inverse=True)
    layout = np.zeros((5, len(combos), p_max))
    for c, (si, pc, vc) in enumerate(combos.tolist()):
        layout[:, c, :pc] = _rank_layout(space.schedules[si], space.num_layers, pc, vc, t.dense_layers)
    nd, nm, chunks, emb, head = layout[:, inv.reshape(-1)]
    fd, bd, wd, fm, bm, wm = (col[:, None] for col in t.layer_s[g].T)
    emb_f, emb_w, head_f, head_b, head_w = (col[:, None] for col in t.ends_s[g].T)
    send = np.where(p > 1, t.p2p_s[g], 0.0)[:, None]
    F = nd * fd + nm * fm + chunks * send + emb * emb_f + head * head_f
    B = nd * bd + nm * bm + chunks * send + head * head_b
    W = nd * wd + nm * wm + emb * emb_w + head * head_w
    T = F + B + W
    t_max = T.max(axis=1)
    k = T.argmax(axis=1)  # the first busiest rank, as list.index(max) finds it
    w_min = np.minimum(np.minimum(W, F), B)
    edge_terms = {"zb-h1": F + B - w_min, "zbv": np.maximum(np.maximum(B - W, B / 2), F / 2),
                  "zb-h2": F + np.maximum(0.0, B - 2 * w_min)}
    t_sum = np.zeros(n)
    edges = {name: np.zeros(n) for name in edge_terms}
    for r in range(p_max):
        t_sum = t_sum + T[:, r]
        for name, term in edge_terms.items():
            edges[name] = edges[name] + np.where(k == r, 0.0, term[:, r])
    forms = {schedule._flush_time: (m - 1) * t_max + t_sum,
             schedule._interleaved_time: m * t_max + (t_sum - t_max) / v,
             schedule._zb_h1_time: m * t_max + edges["zb-h1"],
             schedule._zbv_time: m * t_max + edges["zbv"],
             schedule._zb_h2_time: m * t_max + edges["zb-h2"]}
    out = np.empty(n)
    for si, name in enumerate(space.schedules):
        mine = sched == si
        if not mine.any():
            continue
        form = forms.get(SCHEDULES[name].time)
        if form is not None:
            out[mine] = form[mine]
        else:
            out[mine] = [refined_group_bound(space, t, int(x)) for x in g[mine]]
    return out


def floored_group_bound(space: Space, pipe_s: np.ndarray, coef: np.ndarray, const: np.ndarray,
                        opt_s: np.ndarray) -> np.ndarray:
    """Per group, the least over the space's ZeRO stages of a pipeline floor raised by the data-parallel floor,
    plus the optimizer step (what ``refine_group`` computes, over arrays of groups)."""
    best = np.full(len(pipe_s), np.inf)
    for z in space.zero_stages:
        floor = np.maximum(pipe_s, (coef[:, :, z] * pipe_s[:, None] + const[:, :, z]).max(axis=1))
        best = np.minimum(best, floor + opt_s[:, z])
    return best


def with_data_parallel_floor(pipe_s: np.ndarray | float, coef: np.ndarray, coll_s: np.ndarray) -> np.ndarray:
    """The larger of a pipeline floor and the data-parallel floors a[k] x pipeline + C[k] (k along axis 0)."""
    return np.maximum(pipe_s, (coef * pipe_s + coll_s).max(axis=0))


def row_time_bound(space: Space, t: GroupTables, rows: Rows, pipe_floor: np.ndarray | None = None,
                   dp_floor: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Lower bound on each row's step time: the cheap pipeline bound (or ``pipe_floor``, the group's refined one, if
    larger), raised by the data-parallel floor of the row's ZeRO stage, plus the optimizer step of the larger of
    ranks 0 and p-1. ``pipe_floor`` is per row; ``dp_floor`` the (a, C) arrays of ``data_parallel_floor_s`` per row
    (shape rows x k x 4)."""
    g = rows.group
    pipe = (_work_s(t, g) + _recompute_s(space, t, g, rows.rec)) / space.col("pp")[g] * t.factor[g]
    if pipe_floor is not None:
        pipe = np.maximum(pipe, pipe_floor)
    if dp_floor is not None:
        idx = np.arange(len(g))
        pipe = with_data_parallel_floor(pipe, dp_floor[0][idx, :, rows.zero].T, dp_floor[1][idx, :, rows.zero].T)
    return pipe + _optimizer_s(space, t, rows)


def _local_params(t: GroupTables, g, n_layers, n_moe, extra_dense):
    """Dense (ZeRO-sharded over DP x CP) and expert (over the expert-DP group) parameters on one GPU holding
    n_layers of which n_moe MoE layers, plus embedding / head parameters (arrays or plain floats)."""
    dense = (n_layers - n_moe) * t.dense_params_per_layer[g] + n_moe * t.moe_params_per_layer[g] + extra_dense
    return dense, n_moe * t.expert_params_per_layer[g]


def _end_ranks(space: Space, t: GroupTables, g):
    """(layers, MoE layers, extra dense parameters, holds the embedding, in-flight micro-batches, holds the LM head)
    of the ranks the bounds check (``GroupTables.rank_*``), rank 0 first."""
    for col in range(t.rank_layers.shape[1]):
        emb, head = t.rank_emb[g, col], t.rank_head[g, col]
        yield (t.rank_layers[g, col], t.rank_moe[g, col], emb * t.embedding_params[g] + head * t.head_params[g],
               emb > 0, t.rank_inflight[g, col], head > 0)


def _end_ranks_of(t: GroupTables, g: int) -> list[tuple[float, float, float]]:
    """``_end_ranks`` of one group as plain floats: (layers, MoE layers, extra dense parameters) per checked rank."""
    emb, head = float(t.embedding_params[g]), float(t.head_params[g])
    out: list[tuple[float, float, float]] = []
    for n, nm, e, h in zip(t.rank_layers[g].tolist(), t.rank_moe[g].tolist(), t.rank_emb[g].tolist(),
                           t.rank_head[g].tolist()):
        if (n, nm, e * emb + h * head) not in out:  # the same rank picked twice (rank 0 first, as it was)
            out.append((n, nm, e * emb + h * head))
    return out


def _optimizer_floats(space: Space, t: GroupTables, g: int) -> np.ndarray:
    """``_optimizer_s`` of group g for ZeRO stages 0..3 (it runs once per group reached)."""
    full = sharded = 0.0
    dp_shard, edp_shard = float(t.dp_shard[g]), float(t.expert_dp_shard[g])
    for n, nm, extra in _end_ranks_of(t, g):
        dense, expert = (float(x) for x in _local_params(t, g, n, nm, extra))
        full = max(full, dense + expert)
        sharded = max(sharded, dense / dp_shard + expert / edp_shard)
    return np.array([full, sharded, sharded, sharded]) * t.optimizer_s_per_param


def _optimizer_s(space: Space, t: GroupTables, rows: Rows) -> np.ndarray:
    """The optimizer step reads and writes the states of the parameters a GPU updates (sharded from ZeRO-1 on)."""
    g, z = rows.group, rows.zero
    out = np.zeros(len(g))
    for n, nm, extra, _, _, _ in _end_ranks(space, t, g):
        dense, expert = _local_params(t, g, n, nm, extra)
        local = np.where(z >= 1, dense / t.dp_shard[g] + expert / t.expert_dp_shard[g], dense + expert)
        out = np.maximum(out, local * t.optimizer_s_per_param)
    return out


def _states_bytes(t: GroupTables, g: np.ndarray, zero: np.ndarray, n_layers: np.ndarray, n_moe: np.ndarray,
                  extra_dense: np.ndarray) -> np.ndarray:
    """Weights, gradients and optimizer states of one GPU (ZeRO stage sharding, Rajbhandari et al. 2020), plus the
    two gathered layers ZeRO-3 holds (the one in use and the one prefetched), as ``memory.model_state_bytes``."""
    dense, expert = _local_params(t, g, n_layers, n_moe, extra_dense)

    def sharded(on: np.ndarray) -> np.ndarray:
        return np.where(on, dense / t.dp_shard[g], dense) + np.where(on, expert / t.expert_dp_shard[g], expert)

    largest = np.where(n_moe > 0, t.largest_layer_params[g, 1], 0.0)
    largest = np.maximum(largest, np.where(n_layers > n_moe, t.largest_layer_params[g, 0], 0.0))
    gathered = np.where((zero >= 3) & (t.dp_shard[g] > 1), 2 * largest * WEIGHT_BYTES, 0.0)
    return WEIGHT_BYTES * sharded(zero >= 3) + GRAD_BYTES * sharded(zero >= 2) + \
        OPTIMIZER_BYTES * sharded(zero >= 1) + gathered


def _activation_bytes(t: GroupTables, g: np.ndarray, rec: np.ndarray, n_layers: np.ndarray, n_moe: np.ndarray,
                      vpp: np.ndarray) -> np.ndarray:
    """Activations of one micro-batch through n_layers (n_moe of them MoE; vpp equal chunks) under a recomputation
    code: fully recomputed layers keep their input only; the others keep what their kind keeps (which of them are
    recomputed is not tracked, so the recomputed ones are charged the larger kind's share)."""
    full = np.select([rec == REC_FULL_ALL, rec >= REC_FULL_K], [n_layers, vpp * np.minimum(n_layers // vpp,
                                                                                           recompute_k(rec))], 0)
    sel = rec == REC_SELECTIVE
    kept_d = np.where(sel, t.act_kept_bytes[g, 2], t.act_kept_bytes[g, 0])
    kept_m = np.where(sel, t.act_kept_bytes[g, 3], t.act_kept_bytes[g, 1])
    kept = (n_layers - n_moe) * kept_d + n_moe * kept_m - full * np.maximum(kept_d, kept_m)
    kept = np.maximum(kept, (n_layers - full) * np.minimum(kept_d, kept_m))
    return full * t.act_full_bytes[g] + kept


def _workspace_bytes(t: GroupTables, g, rec, holds_head) -> np.ndarray:
    """Floor of a rank's workspace, the largest of the transient buffers ``step.estimate`` charges it: the CP
    buffers; with full recomputation (on all or on the first k >= 1 layers of each chunk, so on some layer of
    every chunk) the activations of the layer being recomputed (the cheaper layer kind's); on the rank holding the
    LM head its logits (``memory.head_activation_bytes``)."""
    full = (rec == REC_FULL_ALL) | (rec >= REC_FULL_K)
    ws = np.maximum(t.cp_buffer_bytes[g], np.where(full, t.act_none_bytes[g], 0.0))
    return np.maximum(ws, np.where(holds_head, t.head_act_bytes[g], 0.0))


def row_memory_bound(space: Space, t: GroupTables, rows: Rows) -> np.ndarray:
    """Lower bound on the peak memory: the largest over the checked ranks of model states, activations and the
    workspace floor."""
    g, z, rec = rows.group, rows.zero, rows.rec
    vpp = space.col("vpp")[g]
    out = np.zeros(len(g))
    for n, nm, extra, has_emb, inflight, has_head in _end_ranks(space, t, g):
        acts = _activation_bytes(t, g, rec, n, nm, vpp) + np.where(has_emb, t.act_embedding_bytes[g], 0.0)
        out = np.maximum(out, _states_bytes(t, g, z, n, nm, extra) + acts * inflight +
                         _workspace_bytes(t, g, rec, has_head))
    return out


def group_memory_bound(space: Space, t: GroupTables, groups: np.ndarray | None = None) -> np.ndarray:
    """Lower bound on the peak memory of every row of each group: the least row bound over the recomputation modes
    (partial recomputation lies between none and full) and the ZeRO stages that can be smallest (the largest
    stage up to 2, which shards more with each stage, and 3, which shards the weights but holds gathered layers).
    Each rank's states (per ZeRO stage) and activations (per recomputation mode) are computed once and combined.
    ``groups``: only these groups (default: all)."""
    g = slice(None) if groups is None else np.asarray(groups, dtype=np.int64)
    n_groups = len(space.groups) if groups is None else len(g)
    vpp = space.col("vpp")[g]
    zeros = {max([z for z in space.zero_stages if z <= 2], default=None), 3 if 3 in space.zero_stages else None}
    zeros = sorted(x for x in zeros if x is not None)
    states, acts = [], []
    for n, nm, extra, has_emb, inflight, has_head in _end_ranks(space, t, g):
        states.append([_states_bytes(t, g, np.int64(z), n, nm, extra) for z in zeros])
        emb = np.where(has_emb, t.act_embedding_bytes[g], 0.0)
        acts.append([(_activation_bytes(t, g, np.int64(code), n, nm, vpp) + emb) * inflight +
                     _workspace_bytes(t, g, np.int64(code), has_head) for code in space.rec_codes])
    best = np.full(n_groups, np.inf)
    for zi in range(len(zeros)):
        for ci in range(len(space.rec_codes)):
            out = np.zeros(n_groups)
            for s_rank, a_rank in zip(states, acts):
                out = np.maximum(out, s_rank[zi] + a_rank[ci])
            best = np.minimum(best, out)
    return np.where(np.isfinite(best), best, 0.0)
