"""Lower bounds on the step time and the peak memory of every candidate, vectorized with numpy.

The search only prunes with these, so none may exceed what ``planner.cost.step.estimate`` computes for the same
configuration. Tests check this on every candidate of small and medium spaces, and the search re-checks it on every
configuration it evaluates exactly (``bound_violations`` in its statistics).

Nothing here computes a kernel time, a collective or a byte count of its own: per-layer costs come from the cost
model's batch functions (``step.layer_costs``, ``step.end_costs``, ``step.pipeline_send_s``), called once over all
distinct layer keys of the space (TP, CP, CP kind, micro-batch, SP, EP, TP overlap, flash attention); the
data-parallel floors from ``planner.cost.data_parallel``; the pipeline from ``planner.cost.schedule``'s closed
forms over arrays of pipelines; memory from ``planner.cost.memory``. This module only composes them into bounds.

Time. Every pipeline rank runs forward and backward of its layers for each of the m micro-batches, plus any
recomputation; point-to-point, data-parallel and optimizer time only add to this. With W the per-micro-batch work
of the whole model, the ranks' times sum to at least W and a pipeline of p equal ranks is never slower than one
with the same total split unevenly (1F1B: (m - 1) max t + sum t, Narayanan et al. 2021 Sec. 2.2). Two bounds:

* cheap, for all rows at once: ``schedule.time`` of p equal unit ranks, at the corner split of F / B / W that
  gives the smallest time (the closed forms are linear in the split for 1F1B and interleaved, and the zero-bubble
  forms only shrink as W grows), times W / p;
* refined, per group when the search reaches it: ``schedule.time`` over the group's exact per-rank F / B / W
  (``rank_times``), the pipeline time of its rows without recomputation.

Plus the optimizer step, which reads and writes each local parameter's states once
(``data_parallel.ADAM_BYTES_PER_PARAM`` bytes over HBM).

Memory. Each checked pipeline rank (rank 0, rank p-1, the ones with the most layers and, for MoE models, the most
MoE layers) holds its model states (Rajbhandari et al. 2020: 2 + 2 + 12 bytes per parameter, sharded by ZeRO stage
over DP x CP, plus ZeRO-3's two gathered layers), its in-flight activations (the schedule's ``inflight``
micro-batches times the per-layer bytes of ``memory.activation_bytes_per_layer``, Korthikanti et al. 2022 Table 2)
and a floor of its workspace (CP buffers; the layer being recomputed under full recomputation; the LM head's
logits on the rank holding it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from planner.cost import comm
from planner.cost.data_parallel import (dp_collectives, dp_exposed_s, dp_groups, expert_dp_degree,
                                       expert_shard_degree, exposed_s, gathered_linear_weight_bytes, hsdp_groups,
                                       optimizer_step_s)
from planner.cost.memory import (StageParams, end_params_on_gpu, gathered_layer_params, gathered_weight_bytes,
                                 held_grad_bytes, held_linear_weight_bytes, layer_params_on_gpu, model_state_bytes,
                                 optimizer_state_bytes, zero_sharded_params)
from planner.cost.schedule import SCHEDULES
from planner.cost.step import BatchCosts, LayerCost, batch_costs, pipeline_send_s
from planner.search.space import (REC_FULL_ALL, REC_FULL_K, REC_SELECTIVE, ZERO_COLUMNS, Rows, Space, column_of,
                                  recompute_k)
from planner.specs.config import CP_KINDS, EP_DISPATCHERS, LAYER_FIELDS, ZERO_STAGES, ConfigBatch, even_layer_split
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec


#: pipeline ranks whose memory the bounds check (see GroupTables.rank_layers)
RANK_PICKS = 4
#: further ranks checked for MoE models: the most MoE layers times in-flight micro-batches, and the most MoE layers
#: (with leading dense layers, rank 0 holds fewer experts than the others)
MOE_RANK_PICKS = 2


#: a presence table (``np.bincount``) ranks keys of up to this many possible values (or 4 per row) in O(rows +
#: values); wider keys are sorted
_PRESENCE_KEYS = 1 << 22
#: a non-negative integer column spanning up to this many values joins a row key as it is; a wider one is ranked
_RAW_SPAN = 16


def _compact(key: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """``key`` (integers in [0, size)) replaced by its rank among the distinct values, order kept; and how many
    distinct values there are."""
    if size <= max(_PRESENCE_KEYS, 4 * key.size):
        present = np.bincount(key, minlength=size) > 0
        rank = np.cumsum(present) - 1
        return rank[key], int(rank[-1]) + 1
    uniq, inv = np.unique(key, return_inverse=True)
    return inv.reshape(-1), len(uniq)


def _unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the given columns, in lexicographic order, and per input row the index of its distinct row
    (``np.unique(axis=0, return_inverse=True)``, but through one integer key per row built column by column and
    ranked by presence tables whenever it grows wide, which is several times faster on the search's millions of
    groups)."""
    cols = [np.asarray(c).reshape(-1) for c in cols]
    n = cols[0].size
    if n == 0:
        return np.zeros((0, len(cols)), dtype=np.int64), np.zeros(0, dtype=np.int64)
    key, size = np.zeros(n, dtype=np.int64), 1
    for c in cols:
        if c.dtype.kind in "iub":
            lo = int(c.min())
            code, span = c.astype(np.int64) - lo, int(c.max()) - lo + 1
            if span > _RAW_SPAN:
                code, span = _compact(code, span)
        else:
            values, code = np.unique(c, return_inverse=True)
            code, span = code.reshape(-1), len(values)
        if size * span > max(_PRESENCE_KEYS, 4 * n):
            key, size = _compact(key, size)
        key, size = key * span + code, size * span
    inv, count = _compact(key, size)
    first = np.empty(count, dtype=np.int64)  # each distinct row's first input row
    first[inv[::-1]] = np.arange(n - 1, -1, -1)
    uniq = np.stack([c[first] for c in cols], axis=1)
    return (uniq.astype(np.int64) if uniq.dtype.kind in "iub" else uniq), inv


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
    cp_buffer_bytes: np.ndarray  # a layer's transient buffers: CP and host-offload transfers (a floor of the workspace)
    dense_params_per_layer: PerKey  # per dense layer on one GPU, after TP (ZeRO shards it over DP x CP)
    expert_params_per_layer: PerKey  # experts of an MoE layer on one GPU, after TP and EP
    moe_params_per_layer: PerKey  # the rest of an MoE layer on one GPU (attention, router, shared experts)
    largest_layer_params: PerKey  # (groups, 2): a dense and an MoE layer on one GPU (ZeRO-3 gathers them)
    embedding_params: PerKey  # on one GPU (rank 0)
    head_params: PerKey  # on one GPU (rank p-1)
    dp_shard: PerKey  # these per distinct degrees and schedule
    expert_dp_shard: PerKey
    kind_index: tuple[int, ...]  # per layer, its kind (ModelSpec.kind_index)
    memory_class: tuple[int, ...]  # per kind, 0 or 1: the class its memory counts in (``memory_classes``)
    optimizer_s_per_param: float  # optimizer step time per local parameter
    #: bytes per element of the decoder layers' weights as a GPU holds them, per ZeRO stage 0-3
    #: (``memory.held_linear_weight_bytes``), and while ZeRO-3 holds a layer gathered (``gathered_weight_bytes``)
    linear_weight_bytes: np.ndarray
    gathered_weight_bytes: float
    grad_bytes: np.ndarray  # per group, bytes per element of the gradients held (``memory.held_grad_bytes``)
    optimizer_bytes: float  # bytes per parameter of the optimizer's states (``memory.optimizer_state_bytes``)
    layer_s: np.ndarray  # (groups, 3 kinds): one layer of each kind's F, B, W (incl. exposed comm)
    ends_s: np.ndarray  # (groups, 5): embedding F, embedding W (its backward), LM head F, B, W
    p2p_s: np.ndarray  # one pipeline send (0 without PP)
    p2p_overlap: np.ndarray  # per group, whether its sends overlap compute (``p2p_overlapped``)
    comm_interference: float  # GPU.comm_overlap_interference
    layer_keys: np.ndarray  # the distinct layer keys (columns LAYER_KEY) the per-key tables are indexed by
    layer_key: np.ndarray  # per group, its row of layer_keys
    layer_costs: BatchCosts  # the cost model's costs of the layer keys (selective recompute), one batch


#: the group columns one layer's costs depend on (``config.LAYER_FIELDS`` as the space varies them; the recompute
#: mode is fixed to "selective", whose activation bytes the tables keep beside those of "none" and "full")
LAYER_KEY = ("tp", "cp", "cp_kind", "mb", "sp", "ep", "etp", "tpo", "fa", "epo", "epd")


def group_tables(model: ModelSpec, cluster: Cluster, space: Space) -> GroupTables:
    tp, cp = space.col("tp"), space.col("cp")
    pp, vpp, ep, etp = space.col("pp"), space.col("vpp"), space.col("ep"), space.col("etp")
    kind_index, mem_class = model.kind_index, memory_classes(model)
    n_moe = sum(mem_class[k] for k in kind_index)  # layers of the second memory class (MoE, or sliding window)
    # ---- per-layer costs per distinct layer key, through the cost model's batch functions --------------------------
    uniq_layers, layer_key = _unique_rows(*(space.col(k) for k in LAYER_KEY))
    keys = layer_key_batch(space, uniq_layers)
    costs = batch_costs(model, cluster, keys)
    tab, sends = _layer_tables(model, cluster, keys, costs)
    t_ = {k: PerKey(v, layer_key) for k, v in tab.items()}
    # ---- pipeline sends: each chunk of each rank sends its boundary activation forward and its gradient back, one
    # send each per micro-batch (step.estimate folds them into F and B), over the NIC once the pipeline spans nodes
    across = comm.pipeline_spans_nodes(cluster, tp, cp, space.dp, pp)
    p2p = np.where(pp > 1, np.where(across, sends[1][layer_key], sends[0][layer_key]), 0.0)
    all_sends = pp * vpp * p2p  # whole pipeline, one direction, one micro-batch
    # overlapped sends (step.estimate: what sticks out of each rank's compute, plus the interference of what
    # hides): summed over ranks, at least what sticks out of the whole pipeline's compute (min is subadditive)
    p2p_overlap = p2p_overlapped(space)
    interference = cluster.gpu.comm_overlap_interference
    fwd, bwd = tab["fwd"][layer_key], tab["bwd_in"][layer_key]
    t_["fwd"] = fwd + np.where(p2p_overlap, exposed_s(all_sends, fwd, interference), all_sends)
    t_["bwd_in"] = bwd + np.where(p2p_overlap, exposed_s(all_sends, bwd + tab["bwd_w"][layer_key], interference),
                                  all_sends)
    # ---- schedule: equal-rank time factor, in-flight micro-batches and layers of ranks 0 and p-1 ---------------
    L = model.num_layers
    uniq, inv = _unique_rows(space.col("sched"), pp, space.num_microbatches, vpp)
    factor = np.empty(len(uniq))
    for si, name in enumerate(space.schedules):  # p equal ranks of unit time, each corner split of F / B / W
        mine = uniq[:, 0] == si
        if not mine.any():
            continue
        p_u, m_u, v_u = uniq[mine, 1], uniq[mine, 2], uniq[mine, 3]
        unit = (np.arange(p_u.max())[None, :] < p_u[:, None]).astype(float)
        none = np.zeros_like(unit)
        time = SCHEDULES[name].time
        factor[mine] = np.minimum(np.minimum(time(unit, none, none, m_u, v_u).total_s,
                                             time(none, unit, none, m_u, v_u).total_s),
                                  time(none, none, unit, m_u, v_u).total_s)
    n_picks = RANK_PICKS + (MOE_RANK_PICKS if n_moe else 0)
    picks = {k: np.zeros((len(uniq), n_picks)) for k in ("n", "nm", "emb", "head", "infl")}
    for u, (si, p, m, v) in enumerate(uniq.tolist()):
        sched = SCHEDULES[space.schedules[si]]
        counts, _, emb, head = _rank_layout(space.schedules[si], L, p, v, kind_index, len(mem_class))
        infl = [sched.inflight(p, m, v, r) for r in range(p)]
        n = [sum(c) for c in zip(*counts)]
        nm = [sum(c for c, cls in zip(cs, mem_class) if cls) for cs in zip(*counts)]
        ranks = (0, p - 1, max(range(p), key=lambda r: (n[r] * infl[r], -r)), max(range(p), key=lambda r: (n[r], -r)))
        if n_moe:  # the ranks with the most MoE layers (in flight), whose experts dominate their memory
            ranks += (max(range(p), key=lambda r: (nm[r] * infl[r], n[r] * infl[r], -r)),
                      max(range(p), key=lambda r: (nm[r], n[r], -r)))
        for col, r in enumerate(ranks):
            picks["n"][u, col], picks["nm"][u, col], picks["infl"][u, col] = n[r], nm[r], infl[r]
            picks["emb"][u, col], picks["head"][u, col] = emb[r], head[r]
    # ---- parameters on one GPU (memory.layer_params_on_gpu / gathered_layer_params, as step.estimate) -------------
    # They depend on the degrees and the schedule only: computed once per distinct (TP, CP, PP, VPP, EP, expert TP,
    # schedule), a few hundred keys for a search's million-odd groups, and read per group through the key.
    # Per memory class, the least of its kinds' (a floor); a class no kind is in stands for the other's
    deg, deg_key = _unique_rows(tp, cp, pp, vpp, ep, etp, space.col("sched"))
    d_tp, d_cp, d_pp, d_vpp, d_ep, d_etp, d_sched = deg.T
    n_deg = len(deg)
    on_gpu = [layer_params_on_gpu(model, d_tp, d_ep, kind, d_etp) for kind in model.layer_kinds]
    gathered = [gathered_layer_params(model, d_tp, d_ep, kind, d_etp) for kind in model.layer_kinds]
    (dense_pl, _), (moe_dense, expert_pl) = _per_class(mem_class, on_gpu, n_deg)
    largest_d, largest_m = _per_class(mem_class, [(g,) for g in gathered], n_deg)
    largest_d, largest_m = largest_d[0], largest_m[0]
    emb_p, head_p = end_params_on_gpu(model, space.seq_len, d_tp, d_pp * d_vpp, d_ep, d_etp)
    # DualPipe: each stage's two copies join its ZeRO shards
    copies = _schedule_values(space, lambda sched: sched.stage_copies)[d_sched]
    d_dp = space.dp_of(d_tp, d_cp, d_pp)

    def per_degrees(values) -> PerKey:
        return PerKey(np.zeros(n_deg) + values, deg_key)
    fixed, tn_only = space.fixed, cluster.gpu.fp8_gemm_tn_only
    return GroupTables(
        fwd_s=t_["fwd"], bwd_input_s=t_["bwd_in"], bwd_weight_s=t_["bwd_w"], selective_s=t_["sel"],
        full_s=t_["full"], layer_full_min_s=t_["full_min"],
        factor=PerKey(factor, inv), rank_layers=PerKey(picks["n"], inv), rank_moe=PerKey(picks["nm"], inv),
        rank_emb=PerKey(picks["emb"], inv), rank_head=PerKey(picks["head"], inv),
        rank_inflight=PerKey(picks["infl"], inv),
        act_none_bytes=t_["act_none"], act_selective_bytes=t_["act_sel"], act_full_bytes=t_["act_full"],
        act_kept_bytes=PerKey(np.stack([tab[k] for k in ("act_none_d", "act_none_m", "act_sel_d", "act_sel_m")],
                                       axis=1), layer_key),
        moe_params_per_layer=per_degrees(moe_dense),
        largest_layer_params=PerKey(np.stack(np.broadcast_arrays(np.zeros(n_deg) + largest_d, largest_m), axis=1),
                                    deg_key),
        act_embedding_bytes=t_["act_emb"], head_act_bytes=t_["head_act"], cp_buffer_bytes=t_["cp_buf"],
        dense_params_per_layer=per_degrees(dense_pl), expert_params_per_layer=per_degrees(expert_pl),
        embedding_params=per_degrees(emb_p), head_params=per_degrees(head_p),
        dp_shard=per_degrees(d_dp * d_cp * copies),
        expert_dp_shard=per_degrees(expert_dp_degree(d_dp, d_cp, d_ep, d_tp, d_etp) * copies),
        kind_index=kind_index, memory_class=mem_class,
        optimizer_s_per_param=float(optimizer_step_s(1.0, cluster.gpu, fixed.adam_moment_bytes)),
        optimizer_bytes=float(optimizer_state_bytes(fixed.adam_moment_bytes)),
        linear_weight_bytes=held_linear_weight_bytes(fixed.precision, fixed.fp8_param_gather, tn_only,
                                                     fixed.te_quantized_weights, np.arange(4)),
        gathered_weight_bytes=float(gathered_weight_bytes(fixed.precision, fixed.fp8_param_gather, tn_only,
                                                          fixed.te_quantized_weights)),
        grad_bytes=held_grad_bytes(space.col("grb"), fixed.grads_in_reduce_dtype),
        layer_s=PerKey(np.stack([tab[f"{x}{k}"] for k in range(len(model.layer_kinds)) for x in "fbw"], axis=1),
                       layer_key),
        ends_s=PerKey(np.stack([tab[k] for k in ("emb_f", "emb_w", "head_f", "head_b", "head_w")], axis=1),
                      layer_key), p2p_s=p2p, p2p_overlap=p2p_overlap, comm_interference=interference,
        layer_keys=uniq_layers, layer_key=layer_key, layer_costs=costs)


def p2p_overlapped(space: Space) -> np.ndarray:
    """Per group, whether its pipeline sends overlap compute: the space's stack posts them asynchronously
    (``config.RunConfig.overlap_p2p_comm``) and the group's schedule runs that (``Schedule.overlaps_p2p``)."""
    overlaps = np.array([SCHEDULES[name].sends_overlap(space.fixed.overlap_p2p_comm) for name in space.schedules])
    return overlaps[space.col("sched")]


#: per-key quantities of ``_layer_tables`` (besides each kind k's F, B, W: "f{k}", "b{k}", "w{k}")
_TABLE_NAMES = ("fwd", "bwd_in", "bwd_w", "sel", "full", "full_min", "act_none", "act_sel", "act_full", "act_emb",
                "cp_buf", "emb_f", "emb_w", "head_f", "head_b", "head_w", "head_act")


def memory_classes(model: ModelSpec) -> tuple[int, ...]:
    """Per kind of layer (``ModelSpec.layer_kinds``), the class the memory bounds count it in: in a MoE model 1 for
    the MoE kinds (whose experts the expert-parallel tables shard), 0 for the others (dense, a hybrid model's Mamba,
    attention and MLP layers); otherwise 0 the first kind, 1 the others (sliding-window layers). The bounds keep one
    parameter and activation size per class, the least of its kinds' (a floor)."""
    if model.is_moe:
        return tuple(int(kind.moe) for kind in model.layer_kinds)
    return tuple(min(k, 1) for k in range(len(model.layer_kinds)))


def _per_class(mem_class: tuple[int, ...], per_kind: list[tuple], n: int) -> list[tuple[np.ndarray, ...]]:
    """For memory classes 0 and 1, the element-wise least of ``per_kind``'s tuples (one per kind of layer, arrays
    over the groups) over the kinds of that class; a class without kinds takes the other's."""
    out = []
    for c in (0, 1):
        rows = [values for values, cls in zip(per_kind, mem_class) if cls == c]
        out.append(tuple(np.min(np.broadcast_arrays(*(np.zeros(n) + v for v in column)), axis=0)
                         for column in zip(*rows)) if rows else None)
    return [x if x is not None else out[1 - c] for c, x in enumerate(out)]


def layer_key_batch(space: Space, uniq: np.ndarray, recompute: str = "selective") -> ConfigBatch:
    """The configurations of distinct layer keys (rows of ``uniq``, columns ``LAYER_KEY``) of a space, under one
    recompute mode."""
    t, c, k, b, s, e, x, tpo, fa, epo, epd = uniq.T
    return ConfigBatch.from_columns(tp=t, cp=c, cp_kind=np.asarray(CP_KINDS)[k], ep=e, micro_batch_size=b,
                                    seq_len=space.seq_len, sequence_parallel=s.astype(bool), recompute=recompute,
                                    flash_attention=fa.astype(bool), tp_comm_overlap=tpo.astype(bool),
                                    expert_tp=x, ep_comm_overlap=epo.astype(bool), fused_cross_entropy=True,
                                    ep_dispatcher=np.asarray(EP_DISPATCHERS)[epd],
                                    **{f: v for f, v in space.fixed.as_dict().items() if f in LAYER_FIELDS})


def _layer_tables(model: ModelSpec, cluster: Cluster, batch: ConfigBatch,
                  costs: BatchCosts) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Per distinct layer key (the configurations of ``batch``, their costs ``costs`` from ``step.batch_costs``)
    the whole model's per-micro-batch forward / backward / weight-gradient time and recomputation extras, one dense
    and one MoE layer's F / B / W, the embedding and LM head times and the per-layer activation bytes, composed as
    ``step.estimate`` composes them; and one pipeline send (``step.pipeline_send_s``) inside a node and across
    nodes."""
    placed = (replace(costs.groups, pp_spans_nodes=spans) for spans in (False, True))
    sends = tuple(np.broadcast_to(pipeline_send_s(model, cluster, batch, groups, 2), (len(batch),))
                  for groups in placed)
    return _compose_tables(model, costs.kinds, costs.ends, len(batch)), sends


def _compose_tables(model: ModelSpec, kinds: tuple[LayerCost, ...], ends, n: int) -> dict[str, np.ndarray]:
    """``_layer_tables`` from each kind of layer's costs and the end costs, per key."""
    index, mem_class = model.kind_index, memory_classes(model)
    tab = {name: np.zeros(n) for name in _TABLE_NAMES}
    full_min = np.full(n, np.inf)
    act = {"act_none": np.full(n, np.inf), "act_sel": np.full(n, np.inf), "act_full": np.full(n, np.inf)}
    kept = {f"act_{x}_{c}": np.full(n, np.inf) for x in ("none", "sel") for c in "dm"}
    for k, lc in enumerate(kinds):
        count = index.count(k)
        f, b = lc.fwd_total_s, lc.bwd_input_total_s  # the composition of step.estimate
        tab[f"f{k}"], tab[f"b{k}"], tab[f"w{k}"] = f + np.zeros(n), b + np.zeros(n), lc.bwd_weight_s + np.zeros(n)
        if not count:
            continue
        tab["fwd"] = tab["fwd"] + count * f
        tab["bwd_in"] = tab["bwd_in"] + count * b
        tab["bwd_w"] = tab["bwd_w"] + count * lc.bwd_weight_s
        tab["sel"] = tab["sel"] + count * (lc.selective_recompute_s + lc.recompute_comm_s)
        tab["full"] = tab["full"] + count * f
        full_min = np.minimum(full_min, f)
        act["act_none"] = np.minimum(act["act_none"], lc.act_none_bytes)
        act["act_sel"] = np.minimum(act["act_sel"], lc.act_bytes)
        act["act_full"] = np.minimum(act["act_full"], lc.act_full_bytes)
        c = "dm"[mem_class[k]]
        kept["act_none_" + c] = np.minimum(kept["act_none_" + c], lc.act_none_bytes)
        kept["act_sel_" + c] = np.minimum(kept["act_sel_" + c], lc.act_bytes)
        tab["cp_buf"] = np.maximum(tab["cp_buf"], lc.buffer_bytes)
    tab["full_min"] = full_min
    tab.update(act)
    for x in ("none", "sel"):  # a class no layer is in stands for the other's
        d, m = kept[f"act_{x}_d"], kept[f"act_{x}_m"]
        tab[f"act_{x}_d"], tab[f"act_{x}_m"] = np.where(np.isinf(d), m, d), np.where(np.isinf(m), d, m)
    zeros = np.zeros(n)
    tab["emb_f"], tab["emb_w"] = ends.emb_fwd_s + zeros, ends.emb_bwd_s + zeros
    tab["head_f"] = ends.head_fwd_s + ends.head_tp_s + zeros
    tab["head_b"] = ends.head_bwd_input_s + ends.head_tp_s + zeros
    tab["head_w"] = ends.head_bwd_weight_s + zeros
    tab["fwd"] = tab["fwd"] + (tab["emb_f"] + tab["head_f"])
    tab["bwd_in"] = tab["bwd_in"] + tab["head_b"]
    tab["bwd_w"] = tab["bwd_w"] + (tab["emb_w"] + tab["head_w"])
    tab["act_emb"] = ends.act_emb_bytes + zeros
    tab["head_act"] = ends.head_act_bytes + zeros
    return tab


def _work_s(t: GroupTables, g: np.ndarray) -> np.ndarray:
    return t.fwd_s[g] + t.bwd_input_s[g] + t.bwd_weight_s[g]


def _schedule_values(space: Space, value) -> np.ndarray:
    """``value(schedule)`` per schedule code of the space (what the ``sched`` column indexes)."""
    return np.array([value(SCHEDULES[name]) for name in space.schedules])


def _per_schedule(space: Space, g, value) -> np.ndarray:
    """``value(schedule)`` of each group's schedule (the ``sched`` column), for groups ``g``."""
    return _schedule_values(space, value)[space.col("sched")[g]]


def _stage_copies(space: Space, g) -> np.ndarray:
    """Ranks of one pipeline holding each stage (the schedule's ``stage_copies``; DualPipe: 2)."""
    return _per_schedule(space, g, lambda s: s.stage_copies)


def _per_pass(space: Space, g) -> np.ndarray:
    """Micro-batches one pass of a rank's work runs (the schedule's ``microbatches_per_pass``; DualPipe: 2)."""
    return _per_schedule(space, g, lambda s: s.microbatches_per_pass)


def group_time_bound(space: Space, t: GroupTables) -> np.ndarray:
    """Cheap lower bound on the step time of every row of each group (its no-recomputation rows' bound): a rank's
    share of a micro-batch's work per pass, times the schedule's time of p equal unit ranks."""
    g = np.arange(len(space.groups))
    return _work_s(t, g) / space.col("pp") * _per_pass(space, g) * t.factor[g]


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
def _rank_layout(schedule: str, num_layers: int, p: int, v: int, kind_index: tuple[int, ...], n_kinds: int):
    """Per rank, under the even split and the schedule's placement of model chunks on ranks: its layers of each
    kind (``ModelSpec.kind_index``; a tuple of per-rank counts per kind), chunks, whether it holds the first chunk
    (embedding) and whether it holds the last (LM head)."""
    sched = SCHEDULES[schedule]
    counts = even_layer_split(num_layers, p * v)
    starts = [sum(counts[:j]) for j in range(len(counts))]
    per_kind = [[0] * p for _ in range(n_kinds)]
    emb, head = [0] * p, [0] * p
    for r in range(p):
        for j in sched.stages_of(p, v, r):
            for k in kind_index[starts[j]:starts[j] + counts[j]]:
                per_kind[k][r] += 1
            emb[r] |= j == 0
            head[r] |= j == p * v - 1
    return tuple(map(tuple, per_kind)), (sched.chunks_per_rank(p, v),) * p, tuple(emb), tuple(head)


def rank_times(space: Space, t: GroupTables, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-rank F, B, W of one micro-batch under the even split, with no recomputation, for groups ``g``: arrays of
    shape (groups, ranks), ranks past a group's p zero.

    Each rank's times add up what ``step.estimate`` puts on it from the same per-layer and end costs: its chunks'
    layers (dense or MoE, with exposed TP / CP / EP comm), one pipeline send each way per chunk, the embedding on
    the first chunk and the LM head (with its SP gather) on the last. So they are exact for every rank of a row
    without recomputation, and recomputation only adds to them."""
    g = np.asarray(g, dtype=np.int64)
    p, v = space.col("pp")[g], space.col("vpp")[g]
    p_max = int(p.max()) if len(g) else 1
    combos, inv = np.unique(np.stack([space.col("sched")[g], p, v], axis=1), axis=0, return_inverse=True)
    n_kinds = len(t.memory_class)
    layout = np.zeros((n_kinds + 3, len(combos), p_max))
    for c, (si, pc, vc) in enumerate(combos.tolist()):
        counts, *rest = _rank_layout(space.schedules[si], space.num_layers, pc, vc, t.kind_index,
                                     n_kinds)
        layout[:, c, :pc] = (*counts, *rest)
    *n_k, chunks, emb, head = layout[:, inv.reshape(-1)]
    per_kind = t.layer_s[g]  # columns F, B, W of kind 0, then kind 1, ...
    emb_f, emb_w, head_f, head_b, head_w = (col[:, None] for col in t.ends_s[g].T)
    send = t.p2p_s[g][:, None]
    F, B, W = (sum(n * per_kind[:, 3 * k + x, None] for k, n in enumerate(n_k)) for x in range(3))
    # pipeline sends, blocking, or overlapped under the rank's chunks as step.estimate prices them (its window per
    # chunk is the mean of the rank's chunks, so the rank's sum is one exposure against all its layers)
    sends = chunks * send
    overlap = t.p2p_overlap[g][:, None]
    send_f = np.where(overlap, exposed_s(sends, F, t.comm_interference), sends)
    send_b = np.where(overlap, exposed_s(sends, B + W, t.comm_interference), sends)
    F = F + send_f + emb * emb_f + head * head_f
    B = B + send_b + head * head_b
    W = W + emb * emb_w + head * head_w
    return F, B, W


def refined_group_bounds(space: Space, t: GroupTables, g: np.ndarray, times=None) -> np.ndarray:
    """Per group, its schedule's step time (``planner.cost.schedule``, over arrays of pipelines) of its
    ``rank_times``: the exact pipeline time of its rows without recomputation, a floor for all its rows."""
    g = np.asarray(g, dtype=np.int64)
    F, B, W = times if times is not None else rank_times(space, t, g)
    sched = space.col("sched")[g]
    m, v = space.num_microbatches[g], space.col("vpp")[g]
    out = np.empty(len(g))
    for si, name in enumerate(space.schedules):
        mine = sched == si
        if mine.any():
            out[mine] = SCHEDULES[name].time(F[mine], B[mine], W[mine], m[mine], v[mine]).total_s
    return out


def shard_degrees(space: Space, t: GroupTables, g, hsdp=0) -> tuple[np.ndarray, np.ndarray]:
    """Ranks ZeRO shards a stage's dense and expert states over, as ``step.estimate`` counts them (DualPipe's copies
    included), for groups ``g`` and HSDP variants ``hsdp`` (``Rows.hsdp``: 0 over all of DP, else a shard size)."""
    g = np.asarray(g, dtype=np.int64)
    hsdp = np.broadcast_to(np.asarray(hsdp, dtype=np.int64), g.shape)
    if not hsdp.any():
        return t.dp_shard[g], t.expert_dp_shard[g]
    copies, dp, cp = _stage_copies(space, g), space.dp[g], space.col("cp")[g]
    shard = space.shard_of(g, hsdp)
    edp = expert_shard_degree(dp, cp, space.col("ep")[g], space.col("tp")[g], space.col("etp")[g], dp // shard)
    return shard * cp * copies, edp * copies


def _variant_floors(model: ModelSpec, cluster: Cluster, space: Space, t: GroupTables, g: np.ndarray, hsdp: int,
                    F, B, W) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``group_floors`` of groups ``g`` for one HSDP variant (``Rows.hsdp``; 0: ZeRO over all of DP): (a, C) of
    shape (groups, 2, 4) and the optimizer step (groups, 4)."""
    n = len(g)
    m = space.num_microbatches[g] / _per_pass(space, g)  # passes of each rank's work (DualPipe: m / 2 pairs)
    once = _per_schedule(space, g, lambda s: s.zero3_gathers_once_per_step)
    i = cluster.gpu.comm_overlap_interference
    dp_shard, edp_shard = shard_degrees(space, t, g, hsdp)
    tp, cp, ep, etp = (space.col(c)[g] for c in ("tp", "cp", "ep", "etp"))
    dp = space.dp[g]
    shard = space.shard_of(g, np.full(n, hsdp)) if hsdp else None
    dense_group, expert_group = dp_groups(cluster, tp, cp, dp, ep, etp, _stage_copies(space, g), space.col("pp")[g],
                                          shard)
    replicas = hsdp_groups(cluster, tp, cp, dp, ep, etp, shard)
    grad_bytes = space.col("grb")[g]
    # every weight at the linear layers' gathered bytes: a floor of the cost model's (which keeps the embedding and
    # the LM head in bf16)
    wb = float(gathered_linear_weight_bytes(space.fixed.precision, space.fixed.fp8_param_gather))
    coll = np.zeros((n, 4))
    updated = np.zeros((n, 4))  # parameters whose optimizer states the rank updates, per ZeRO stage
    rank0 = None
    for n_l, nm, extra, _, _, _ in _end_ranks(space, t, g):  # n_l: the rank's layers, its ZeRO-3 units
        dense, expert = _local_params(t, g, n_l, nm, extra)
        per_stage = [zero_sharded_params(dense, expert, z, dp_shard, edp_shard, "optimizer") for z in range(4)]
        updated = np.maximum(updated, np.stack(per_stage, axis=1))
        c = dp_collectives(cluster, dense_group, expert_group, dense, expert, grad_bytes, n_l, replicas,
                           weight_bytes=(wb, wb))
        z3 = np.where(once, c.zero3_per_gather_s, m * c.zero3_per_gather_s)
        coll = np.maximum(coll, np.stack([c.all_reduce_s, c.reduce_scatter_s + c.all_gather_s,
                                          c.reduce_scatter_s + c.all_gather_s, z3], axis=1))
        rank0 = rank0 or c
    a = 1 - (1 - i) / m
    coef = np.empty((n, 2, 4))
    coef[:, 0, :3], coef[:, 0, 3], coef[:, 1, :] = a[:, None], i, 1.0
    const = np.zeros((n, 2, 4))
    const[:, 0] = coll
    fwd, bwd = F[:, 0], B[:, 0] + W[:, 0]
    ogr, opg = space.col("ogr")[g].astype(bool), space.col("opg")[g].astype(bool)
    const[:, 1] = np.stack([dp_exposed_s(rank0, z, fwd, bwd, fwd, m, once, ogr, opg, i) for z in range(4)], axis=1)
    return coef, const, updated * t.optimizer_s_per_param


def group_floors(model: ModelSpec, cluster: Cluster, space: Space, t: GroupTables, g: np.ndarray,
                 times=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group, ZeRO stage 0..3 and HSDP variant (``Rows.hsdp``: 0 over all of DP, j the group's j-th HSDP shard
    size), the data-parallel floors (a, C), shape (groups, 2, ``space.column_count``) at ``column_of(stage, j)``,
    such that step >= max_k (a[k] P + C[k]) for a pipeline time P, and the optimizer step (groups, columns) of the
    larger of the checked ranks; from ``planner.cost.data_parallel`` (collectives, exposure, optimizer) over the
    checked ranks' parameters. Variants a group does not have, and HSDP with a ZeRO stage it does not run with,
    are +inf.

    ``step.estimate`` adds each collective's exposed part, ``exposed_s(c, window) = c - h + i h`` with h = min(c,
    window) hidden under a window of the rank's compute and i = ``gpu.comm_overlap_interference``, to the pipeline
    time P, which is at least m x the rank's per-micro-batch time t (so every window is at most t <= P / m; m counts
    the schedule's passes of a rank's work, m / 2 for DualPipe's pairs):

    * ZeRO-0 (all-reduce of the gradients) and ZeRO-1/2 (reduce-scatter of the gradients + all-gather of the
      weights), windows within one micro-batch: step >= P + c - (1 - i) t >= (1 - (1 - i)/m) P + c (and more
      where the overlap is off);
    * ZeRO-3 (c its unit-by-unit traffic, ``DPCollectives.zero3_per_gather_s``; every unit's exposure is at least
      its traffic less (1 - i) x its window), per micro-batch: step >= P + m (c - (1 - i) t) >= i P + m c;
      gathered once per step (breadth-first schedules): step >= P + c - (1 - i) m t >= i P + c.

    HSDP's all-reduce of each gradient shard across the replicas is part of its reduce-scatter (``dp_collectives``),
    so the same floors hold. Rank 0's own windows (its exact ``rank_times``) give a second floor,
    ``data_parallel.dp_exposed_s`` with its forward and backward and, for ZeRO-3, a micro-batch's time with
    recomputation bounded by one more forward.
    """
    g = np.asarray(g, dtype=np.int64)
    n = len(g)
    F, B, W = times if times is not None else rank_times(space, t, g)
    n_hsdp = space.hsdp_count()[g] if len(g) else np.zeros(0, dtype=np.int64)
    width = space.column_count
    coef, const, opt = np.ones((n, 2, width)), np.full((n, 2, width), np.inf), np.full((n, width), np.inf)
    for j in range(1 + space.hsdp_columns):
        has = np.flatnonzero(n_hsdp >= j) if j else np.arange(n)  # groups with a j-th HSDP shard size
        if not len(has):
            continue
        a, c, o = _variant_floors(model, cluster, space, t, g[has], j, F[has], B[has], W[has])
        stages = list(ZERO_STAGES) if j == 0 else list(space.hsdp_zero_stages)
        cols = [column_of(z, j) for z in stages]
        coef[np.ix_(has, [0, 1], cols)] = a[:, :, stages]
        const[np.ix_(has, [0, 1], cols)] = c[:, :, stages]
        opt[np.ix_(has, cols)] = o[:, stages]
    return coef, const, opt


def column_floors(space: Space, pipe_s: np.ndarray, coef: np.ndarray, const: np.ndarray,
                  opt_s: np.ndarray) -> np.ndarray:
    """(groups, columns): per group and column of ``group_floors`` (ZeRO stage and HSDP variant), a pipeline floor
    raised by that column's data-parallel floor, plus its optimizer step; +inf where the space has no such rows.
    A floor for every row of the column, since the floors only grow with the pipeline time."""
    floor = np.maximum(pipe_s[:, None], (coef * pipe_s[:, None, None] + const).max(axis=1)) + opt_s
    allowed = np.zeros(coef.shape[2], dtype=bool)
    allowed[space.columns()] = True
    return np.where(allowed, floor, np.inf)


def with_data_parallel_floor(pipe_s: np.ndarray | float, coef: np.ndarray, coll_s: np.ndarray) -> np.ndarray:
    """The larger of a pipeline floor and the data-parallel floors a[k] x pipeline + C[k] (k along axis 0)."""
    return np.maximum(pipe_s, (coef * pipe_s + coll_s).max(axis=0))


def row_time_bound(space: Space, t: GroupTables, rows: Rows, pipe_floor: np.ndarray | None = None,
                   dp_floor: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Lower bound on each row's step time: the cheap pipeline bound (or ``pipe_floor``, the group's refined one, if
    larger), raised by the data-parallel floor of the row's ZeRO stage, plus the optimizer step of the larger of
    ranks 0 and p-1. ``pipe_floor`` is per row; ``dp_floor`` the (a, C) arrays of ``group_floors`` per row
    (shape rows x k x 4)."""
    g = rows.group
    pipe = (_work_s(t, g) + _recompute_s(space, t, g, rows.rec)) / space.col("pp")[g] * _per_pass(space, g) * \
        t.factor[g]
    if pipe_floor is not None:
        pipe = np.maximum(pipe, pipe_floor)
    if dp_floor is not None:
        idx, col = np.arange(len(g)), rows.column  # group_floors' column of the row's variant
        pipe = with_data_parallel_floor(pipe, dp_floor[0][idx, :, col].T, dp_floor[1][idx, :, col].T)
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


def _optimizer_s(space: Space, t: GroupTables, rows: Rows) -> np.ndarray:
    """The optimizer step reads and writes the states of the parameters a GPU updates (sharded from ZeRO-1 on)."""
    g, z = rows.group, rows.zero
    out = np.zeros(len(g))
    dp_shard, edp_shard = shard_degrees(space, t, g, rows.hsdp)
    for n, nm, extra, _, _, _ in _end_ranks(space, t, g):
        dense, expert = _local_params(t, g, n, nm, extra)
        local = zero_sharded_params(dense, expert, z, dp_shard, edp_shard, "optimizer")
        out = np.maximum(out, local * t.optimizer_s_per_param)
    return out


def _states_bytes(space: Space, t: GroupTables, g: np.ndarray, zero: np.ndarray, n_layers: np.ndarray,
                  n_moe: np.ndarray, extra_dense: np.ndarray,
                  shards: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Weights, gradients and optimizer states of one GPU (``memory.model_state_bytes``: ZeRO stage sharding, the
    two gathered layers ZeRO-3 holds, the unsharded gradients of ZeRO-2 / 3 under pipeline stages), for the largest
    layer kind the rank holds. ``shards``: the (dense, expert) shard degrees (``shard_degrees``; default ZeRO over
    all of DP, the fewest bytes)."""
    dense, expert = _local_params(t, g, n_layers, n_moe, extra_dense)
    largest = np.where(n_moe > 0, t.largest_layer_params[g, 1], 0.0)
    largest = np.maximum(largest, np.where(n_layers > n_moe, t.largest_layer_params[g, 0], 0.0))
    dp_shard, edp_shard = shards if shards is not None else (t.dp_shard[g], t.expert_dp_shard[g])
    states = model_state_bytes(StageParams(dense, expert, largest, extra_dense), zero, dp_shard, edp_shard,
                               t.linear_weight_bytes[zero], t.gathered_weight_bytes, t.grad_bytes[g],
                               t.optimizer_bytes, pipelined=space.col("pp")[g] > 1,
                               accumulated_grad_bytes=space.col("grb")[g])
    return states["weights"] + states["gradients"] + states["optimizer"]


def _activation_bytes(t: GroupTables, g: np.ndarray, rec: np.ndarray, n_layers: np.ndarray, n_moe: np.ndarray,
                      vpp: np.ndarray) -> np.ndarray:
    """Activations of one micro-batch through n_layers (n_moe of them MoE) in vpp chunks under a recomputation
    code: fully recomputed layers keep their input only; the others keep what their kind keeps (which of them are
    recomputed is not tracked, so the recomputed ones are charged the larger kind's share). Chunks may differ by a
    layer (``SearchSpace.uneven_chunks``): the k layers a chunk recomputes are counted for chunks of the larger
    size, at most n_layers, so the bound never keeps more than a rank does."""
    per_chunk = -(-n_layers // vpp)
    full = np.select([rec == REC_FULL_ALL, rec >= REC_FULL_K],
                     [n_layers, np.minimum(n_layers, vpp * np.minimum(per_chunk, recompute_k(rec)))], 0)
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


def _rank_chunks(space: Space, g) -> np.ndarray:
    """Model chunks each group's ranks hold: vpp, or two for DualPipe (a stage and its mirror, vpp 1)."""
    mirrored = _per_schedule(space, g, lambda s: s.placement is not None)
    return np.where(mirrored, 2, space.col("vpp")[g])


def _held_activations(t: GroupTables, g, rec, rank: tuple, vpp) -> np.ndarray:
    """A checked rank's (``_end_ranks`` tuple) activations at its peak under recomputation ``rec``: its in-flight
    micro-batches' activations (the embedding's on the first rank) plus the workspace floor."""
    n, nm, _, has_emb, inflight, has_head = rank
    acts = _activation_bytes(t, g, rec, n, nm, vpp) + np.where(has_emb, t.act_embedding_bytes[g], 0.0)
    return acts * inflight + _workspace_bytes(t, g, rec, has_head)


def _least_peak(states: list[np.ndarray], acts: list[list[np.ndarray]]) -> np.ndarray:
    """The least over recomputation modes (``acts[rank][mode]``) of the largest checked rank's states plus
    activations (``states[rank]``)."""
    best = np.inf
    for mode in range(len(acts[0])):
        peak = 0.0
        for st, a in zip(states, acts):
            peak = np.maximum(peak, st + a[mode])
        best = np.minimum(best, peak)
    return best


def row_memory_bound(space: Space, t: GroupTables, rows: Rows) -> np.ndarray:
    """Lower bound on the peak memory: the largest over the checked ranks of model states, activations and the
    workspace floor."""
    g, z, rec = rows.group, rows.zero, rows.rec
    vpp = _rank_chunks(space, g)
    shards = shard_degrees(space, t, g, rows.hsdp)
    out = np.zeros(len(g))
    for rank in _end_ranks(space, t, g):
        n, nm, extra = rank[:3]
        out = np.maximum(out, _states_bytes(space, t, g, z, n, nm, extra, shards)
                         + _held_activations(t, g, rec, rank, vpp))
    return out


def group_memory_bound(space: Space, t: GroupTables, groups: np.ndarray | None = None) -> np.ndarray:
    """Lower bound on the peak memory of every row of each group: the least row bound over the recomputation modes
    (partial recomputation lies between none and full) and the ZeRO stages that can be smallest (the largest
    stage up to 2, which shards more with each stage, the largest up to 1, whose gradients under pipeline stages
    ZeRO-2 holds unsharded in the reduce dtype, and 3, which shards the weights but holds gathered layers).
    Each rank's states (per ZeRO stage) and activations (per recomputation mode) are computed once and combined.
    ``groups``: only these groups (default: all)."""
    g = slice(None) if groups is None else np.asarray(groups, dtype=np.int64)
    n_groups = len(space.groups) if groups is None else len(g)
    vpp = _rank_chunks(space, g)
    zeros = {max([z for z in space.zero_stages if z <= 2], default=None),
             max([z for z in space.zero_stages if z <= 1], default=None), 3 if 3 in space.zero_stages else None}
    zeros = sorted(x for x in zeros if x is not None)
    ranks = list(_end_ranks(space, t, g))
    acts = [[_held_activations(t, g, np.int64(code), rank, vpp) for code in space.rec_codes] for rank in ranks]
    best = np.full(n_groups, np.inf)
    for z in zeros:
        states = [_states_bytes(space, t, g, np.int64(z), *rank[:3]) for rank in ranks]
        best = np.minimum(best, _least_peak(states, acts))
    return np.where(np.isfinite(best), best, 0.0)


def column_memory_floors(space: Space, t: GroupTables, groups: np.ndarray, columns: int) -> np.ndarray:
    """(groups, columns): per group and column of ``group_floors`` (``space.column_of`` a ZeRO stage and an HSDP
    variant), a lower bound on the peak memory of its rows: ``_least_peak`` of the checked ranks' states under that
    column's sharding; +inf for columns the space or a group lacks. Computed for the groups the search screens,
    whose HSDP rows hold more than the plain ones."""
    g = np.asarray(groups, dtype=np.int64)
    vpp = _rank_chunks(space, g)
    out = np.full((len(g), columns), np.inf)
    n_hsdp = space.hsdp_count()[g]
    ranks = list(_end_ranks(space, t, g))
    acts = [[_held_activations(t, g, np.int64(code), rank, vpp) for code in space.rec_codes] for rank in ranks]
    for col in space.columns():
        j, z = divmod(col, ZERO_COLUMNS)
        has = n_hsdp >= j
        if not has.any():
            continue
        shards = shard_degrees(space, t, g, np.full(len(g), j) * has)
        states = [_states_bytes(space, t, g, np.int64(z), *rank[:3], shards) for rank in ranks]
        out[:, col] = np.where(has, _least_peak(states, acts), np.inf)
    return out
