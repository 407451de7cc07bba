"""The cost model's per-layer costs for many (TP, CP, CP kind, micro-batch, SP, EP) keys at once, with numpy.

The bounds need one decoder layer's costs (``planner.cost.step._layer_cost``) for every distinct key of a search
space: tens of thousands of keys for a large MoE model, where one scalar evaluation builds ~15 ``Op`` objects and
costs ~0.3 ms. This module computes the same numbers as arrays over all keys. It is a replica, formula by formula
and in the same order of floating-point operations, of:

* ``planner.cost.compute.layer_ops`` / ``op_time_s`` / ``pass_times`` (the layer's kernels: roofline GEMMs with the
  GPU's efficiency curve, the fused attention kernel, memory-bound kernels), and ``embedding_ops`` / ``head_ops``;
* ``planner.cost.comm`` (group placement, ring collectives, all-to-all, point-to-point);
* ``planner.cost.context_parallel.cp_layer_cost`` (ring and Ulysses) and ``planner.cost.moe.ep_layer_cost``;
* ``planner.cost.memory.activation_bytes_per_layer`` and ``embedding_activation_bytes``;
* the TP part and the composition of ``planner.cost.step._layer_cost``.

It covers the configurations the search builds: RunConfig's defaults for everything but the key (in particular the
fused attention kernel and selective recomputation). :func:`supported` says when the defaults differ; the caller
then falls back to the scalar cost model. ``tests/test_search.py`` checks that the two agree (relative 1e-12) on
random keys of dense, GQA, MoE and MLA models, so they cannot drift apart unnoticed.
"""

from __future__ import annotations

import numpy as np

from planner.cost.compute import ACT_BYTES, FLASH_ATTN_BWD_RATIO, GEMM_BWD_RATIO, LOGIT_BYTES
from planner.cost.context_parallel import KV_BYTES, RING_BWD_BUFFERS, RING_BWD_BYTES_RATIO, RING_FWD_BUFFERS
from planner.cost.moe import expected_nodes_per_token
from planner.specs.config import CP_KINDS, RunConfig
from planner.specs.hardware import GPU, Cluster
from planner.specs.model import ModelSpec

#: the RunConfig the search evaluates layers under (only the key's knobs differ from it)
_DEFAULTS = RunConfig(num_gpus=1)
ULYSSES = CP_KINDS.index("ulysses")


def supported() -> bool:
    """Whether the replica covers the search's configurations: fused attention, no TP comm overlap, selective or no
    recomputation as RunConfig's defaults (else the caller uses the scalar ``_layer_cost``)."""
    return _DEFAULTS.flash_attention and not _DEFAULTS.tp_comm_overlap and _DEFAULTS.recompute in ("selective",
                                                                                                   "none")


# ---------------------------------------------------------------------------------------------------------------
# Kernels (planner.cost.compute)
# ---------------------------------------------------------------------------------------------------------------
def matmul_efficiency(gpu: GPU, flops: np.ndarray) -> np.ndarray:
    """``EfficiencyCurve.__call__`` over an array: piecewise linear in log10(flops), flat outside the points."""
    curve = gpu.matmul_efficiency
    xs, es = np.array(curve.log10_flops, dtype=float), np.array(curve.efficiency, dtype=float)
    flops = np.asarray(flops, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log10(np.where(flops > 0, flops, 1.0))
    i = np.clip(np.searchsorted(xs, x, side="right"), 1, len(xs) - 1)
    x0, x1, e0, e1 = xs[i - 1], xs[i], es[i - 1], es[i]
    with np.errstate(divide="ignore", invalid="ignore"):
        inner = e0 + (e1 - e0) * (x - x0) / (x1 - x0)
    return np.where((flops <= 0) | (x <= xs[0]), es[0], np.where(x >= xs[-1], es[-1], inner))


class _Ops:
    """Forward times of a list of operators (one array per op, over keys) summed as ``pass_times`` sums them."""

    def __init__(self, gpu: GPU, n: int):
        self.gpu = gpu
        self.fwd = np.zeros(n)
        self.bwd_in = np.zeros(n)
        self.bwd_w = np.zeros(n)
        self.sel = np.zeros(n)
        self.gemm_fwd = np.zeros(n)

    def _add(self, tf: np.ndarray, bwd_ratio: float, weight_grad_fraction: float) -> np.ndarray:
        tb = tf * bwd_ratio
        self.fwd = self.fwd + tf
        self.bwd_w = self.bwd_w + tb * weight_grad_fraction
        self.bwd_in = self.bwd_in + tb * (1.0 - weight_grad_fraction)
        return tf

    def gemm(self, m, k, n, batch=1.0, weight_grad_fraction: float = 0.5) -> np.ndarray:
        """``compute._gemm`` timed by ``op_time_s`` (roofline) and added (GEMM backward ratio)."""
        gemm_flops = 2.0 * m * k * n
        flops = 2.0 * m * k * n * batch
        hbm = ACT_BYTES * (m * k + k * n + m * n) * batch
        gpu = self.gpu
        compute = flops / (gpu.peak_flops * matmul_efficiency(gpu, np.where(gemm_flops != 0, gemm_flops, flops)))
        tf = np.maximum(compute, hbm / gpu.hbm_bandwidth_bytes_per_s)
        self.gemm_fwd = self.gemm_fwd + tf
        return self._add(tf, GEMM_BWD_RATIO, weight_grad_fraction)

    def attention(self, flops, bwd_ratio: float) -> np.ndarray:
        tf = flops / (self.gpu.peak_flops * self.gpu.attention_efficiency)
        return self._add(tf, bwd_ratio, 0.0)

    def memory(self, hbm_bytes, bwd_ratio: float, weight_grad_fraction: float) -> np.ndarray:
        gpu = self.gpu
        tf = hbm_bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_bound_efficiency)
        return self._add(tf, bwd_ratio, weight_grad_fraction)


# ---------------------------------------------------------------------------------------------------------------
# Communication (planner.cost.comm)
# ---------------------------------------------------------------------------------------------------------------
def place_group(size: np.ndarray, stride: np.ndarray, gpus_per_node: int) -> tuple[np.ndarray, np.ndarray,
                                                                                    np.ndarray]:
    """``comm.place_group`` over arrays: (size, members per node, spans nodes)."""
    size, stride = np.broadcast_arrays(np.asarray(size, dtype=np.int64), np.asarray(stride, dtype=np.int64))
    per_node = np.maximum(1, gpus_per_node // stride)
    single = size <= 1
    wide = ~single & (stride >= gpus_per_node)
    inside = ~single & ~wide & (size <= per_node)
    spans = wide | (~single & ~wide & ~inside)
    out_size = np.where(single, 1, size)
    members = np.where(single | wide, 1, np.where(inside, size, per_node))
    return out_size, members, spans


def _ring_link(cluster: Cluster, members: np.ndarray, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    intra = cluster.intra_node.bus_bandwidth_bytes_per_s
    inter = cluster.inter_node.bus_bandwidth_bytes_per_s * members
    bw = np.where(spans, np.minimum(intra, inter), intra)
    lat = np.where(spans, cluster.inter_node.latency_s, cluster.intra_node.latency_s)
    return bw, lat


def reduce_scatter_s(cluster: Cluster, group, msg_bytes: np.ndarray) -> np.ndarray:
    """``comm.reduce_scatter_s`` (= ``all_gather_s``): (n-1)/n M / beta + (n-1) alpha."""
    n, members, spans = group
    bw, lat = _ring_link(cluster, members, spans)
    t = (n - 1) / n * msg_bytes / bw + (n - 1) * lat
    return np.where((n <= 1) | (msg_bytes <= 0), 0.0, t)


all_gather_s = reduce_scatter_s


def all_reduce_s(cluster: Cluster, group, msg_bytes: np.ndarray) -> np.ndarray:
    """``comm.all_reduce_s``: 2 (n-1)/n M / beta + 2 (n-1) alpha."""
    n, members, spans = group
    bw, lat = _ring_link(cluster, members, spans)
    t = 2 * (n - 1) / n * msg_bytes / bw + 2 * (n - 1) * lat
    return np.where((n <= 1) | (msg_bytes <= 0), 0.0, t)


def all_to_all_s(cluster: Cluster, group, msg_bytes: np.ndarray) -> np.ndarray:
    """``comm.all_to_all_s``: inside a node over NVLink; across nodes the slower of the NIC and NVLink shares."""
    n, k, spans = group
    intra = cluster.intra_node
    inside = (n - 1) / n * msg_bytes / intra.bus_bandwidth_bytes_per_s + (n - 1) * intra.latency_s
    t_inter = (n - k) / n * msg_bytes / cluster.inter_node.bus_bandwidth_bytes_per_s
    t_intra = (k - 1) / n * msg_bytes / intra.bus_bandwidth_bytes_per_s
    across = np.maximum(t_inter, t_intra) + (n - 1) * cluster.inter_node.latency_s
    return np.where((n <= 1) | (msg_bytes <= 0), 0.0, np.where(spans, across, inside))


def _p2p_s(bandwidth: np.ndarray, latency: np.ndarray, msg_bytes: np.ndarray) -> np.ndarray:
    """``comm.p2p_s``: M / beta + alpha."""
    return np.where(msg_bytes <= 0, 0.0, msg_bytes / bandwidth + latency)


# ---------------------------------------------------------------------------------------------------------------
# One layer
# ---------------------------------------------------------------------------------------------------------------
def layer_costs(model: ModelSpec, cluster: Cluster, seq_len: int, tp: np.ndarray, cp: np.ndarray,
                cp_kind: np.ndarray, mb: np.ndarray, sp: np.ndarray, ep: np.ndarray,
                moe: bool) -> dict[str, np.ndarray]:
    """The fields of ``step._layer_cost`` the bounds use, one array entry per key, for a dense (``moe`` False) or
    an MoE layer: ``fwd_s``, ``bwd_input_s``, ``bwd_weight_s``, ``selective_recompute_s`` (its ``pt``),
    ``tp_fwd_s``, ``tp_bwd_s``, ``cp_fwd_s``, ``cp_bwd_s``, ``ep_fwd_s``, ``act_bytes`` (selective),
    ``act_full_bytes``, ``act_none_bytes`` and ``cp_buffer_bytes``. Keys: TP, CP, CP kind (index into CP_KINDS),
    micro-batch, SP (0/1) and EP, as integer arrays of one length; the layer's process groups are placed as
    ``comm.groups_for`` places them."""
    gpu, gpn = cluster.gpu, cluster.gpus_per_node
    t = np.asarray(tp, dtype=np.int64)
    c = np.asarray(cp, dtype=np.int64)
    b = np.asarray(mb, dtype=np.int64)
    e = np.asarray(ep, dtype=np.int64)
    seq_par = np.asarray(sp, dtype=bool)
    ulysses = np.asarray(cp_kind) == ULYSSES
    n = len(t)
    T = b * seq_len / c  # tokens on this GPU (layer_ops)
    h = model.hidden_size
    sp_t = np.where(seq_par, t, 1)
    ops = _Ops(gpu, n)
    # ---- layer_ops: attention ---------------------------------------------------------------------------------
    if model.is_mla:  # mla_projection_ops
        heads = model.num_heads
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        if model.q_lora_rank:
            ops.gemm(T, h, model.q_lora_rank)
            ops.gemm(T, model.q_lora_rank, heads * qk_head / t)
        else:
            ops.gemm(T, h, heads * qk_head / t)
        ops.gemm(T, h, model.kv_lora_rank + model.qk_rope_head_dim)
        ops.gemm(T, model.kv_lora_rank, heads * (model.qk_nope_head_dim + model.v_head_dim) / t)
    else:
        ops.gemm(T, h, (model.q_dim + 2 * model.kv_dim) / t)
    core_flops = 2.0 * T * seq_len * (model.attn_q_dim + model.attn_out_dim) / t
    attn_fwd_s = ops.attention(core_flops * 0.5, FLASH_ATTN_BWD_RATIO)  # fused kernel (RunConfig default)
    ops.gemm(T, model.attn_out_dim / t, h)
    # ---- MLP / MoE --------------------------------------------------------------------------------------------
    n_mats = 3 if model.gated_mlp else 2
    if moe:
        k = model.experts_per_token
        f = model.moe_ffn_hidden_size
        ops.gemm(T / sp_t, h, model.num_experts)
        local = model.num_experts / e
        m_e = T * k / local
        ops.gemm(m_e, h, (n_mats - 1) * f / t, batch=local)
        ops.gemm(m_e, f / t, h, batch=local)
        if model.num_shared_experts:
            f_sh = f * model.num_shared_experts
            ops.gemm(T, h, (n_mats - 1) * f_sh / t)
            ops.gemm(T, f_sh / t, h)
        ops.memory(ACT_BYTES * 4 * T * k * h / sp_t, 1.0, 0.0)
        k += model.num_shared_experts
    else:
        f = model.ffn_hidden_size
        ops.gemm(T, h, (n_mats - 1) * f / t)
        ops.gemm(T, f / t, h)
        k = 1
    # ---- memory-bound kernels ---------------------------------------------------------------------------------
    norm_elems = 2
    resid_elems = 3 + (0.5 if model.dropout else 0)
    per_token_h = (2 * norm_elems + 2 * resid_elems) / sp_t
    ffn_width = (model.moe_ffn_hidden_size * k if moe else model.ffn_hidden_size) / t
    act_elems = (3 * ffn_width) if model.gated_mlp else (2 * ffn_width)
    rope_elems = 0 if model.learned_positions else 2 * (model.q_dim + model.kv_dim) / t
    ops.memory(ACT_BYTES * T * (per_token_h * h + act_elems + rope_elems), 2.0, 0.0)
    # ---- TP (step._layer_cost) --------------------------------------------------------------------------------
    tp_group = place_group(t, 1, gpn)
    msg = T * h * ACT_BYTES
    ag = all_gather_s(cluster, tp_group, msg)
    rs = reduce_scatter_s(cluster, tp_group, msg)
    ar2 = 2 * all_reduce_s(cluster, tp_group, msg)
    tp_fwd = np.where(seq_par, 2 * (ag + rs), ar2)
    exposed_bwd = np.where(seq_par, 2 * ag, 0.0)
    overlapped_bwd = np.where(seq_par, 2 * ag + 2 * rs, tp_fwd)
    tp_bwd = exposed_bwd + overlapped_bwd * gpu.comm_overlap_interference
    has_tp = t > 1
    tp_fwd, tp_bwd = np.where(has_tp, tp_fwd, 0.0), np.where(has_tp, tp_bwd, 0.0)
    # ---- CP (context_parallel.cp_layer_cost) ------------------------------------------------------------------
    cp_group = place_group(c, t, gpn)
    kv_heads_tp = np.maximum(model.attn_kv_heads / t, 1.0)
    kvh = model.attn_kv_heads
    uly_kv = np.maximum(kv_heads_tp, c.astype(float)) * (model.attn_k_dim + model.attn_v_dim) / kvh
    qkv = T * (model.attn_q_dim / t + uly_kv) * ACT_BYTES
    out = T * model.attn_out_dim / t * ACT_BYTES
    uly_s = all_to_all_s(cluster, cp_group, qkv) + all_to_all_s(cluster, cp_group, out)
    block = T * (kv_heads_tp * (model.attn_k_dim / kvh + model.attn_v_dim / kvh) * KV_BYTES)
    spans = cp_group[2]
    link_bw = np.where(spans, cluster.inter_node.bus_bandwidth_bytes_per_s,
                       cluster.intra_node.bus_bandwidth_bytes_per_s)  # context_parallel.ring_link
    link_lat = np.where(spans, cluster.inter_node.latency_s, cluster.intra_node.latency_s)
    step_compute = attn_fwd_s / c
    steps = c - 1
    ring_fwd = steps * np.maximum(0.0, _p2p_s(link_bw, link_lat, block) - step_compute)
    ring_bwd = steps * np.maximum(0.0, _p2p_s(link_bw, link_lat, RING_BWD_BYTES_RATIO * block)
                                  - FLASH_ATTN_BWD_RATIO * step_compute)
    has_cp = c > 1
    cp_fwd = np.where(has_cp, np.where(ulysses, uly_s, ring_fwd), 0.0)
    cp_bwd = np.where(has_cp, np.where(ulysses, uly_s, ring_bwd), 0.0)
    cp_buf = np.where(has_cp, np.where(ulysses, qkv + out, max(RING_FWD_BUFFERS, RING_BWD_BUFFERS) * block), 0.0)
    # ---- EP (moe.ep_layer_cost) -------------------------------------------------------------------------------
    ep_fwd = np.zeros(n)
    if moe:
        ep_group = place_group(e, t, gpn)
        kk = model.experts_per_token
        a2a = all_to_all_s(cluster, ep_group, T / sp_t * kk * h * ACT_BYTES)
        if model.expert_groups_per_token:
            a2a = np.where(ep_group[2], _node_limited_all_to_all_s(model, cluster, seq_len, t, c, b, sp_t, ep_group),
                           a2a)
        gathered = T * kk * h * ACT_BYTES
        etp = np.where(has_tp, all_gather_s(cluster, tp_group, gathered) + reduce_scatter_s(cluster, tp_group,
                                                                                             gathered), 0.0)
        has_ep = e > 1
        ep_fwd = np.where(has_ep, 2 * a2a + etp, 0.0)
        if not model.num_shared_experts:
            halve = has_ep & has_tp
            tp_fwd, tp_bwd = np.where(halve, tp_fwd / 2, tp_fwd), np.where(halve, tp_bwd / 2, tp_bwd)
    # ---- activations (memory.activation_bytes_per_layer) ------------------------------------------------------
    act_none = _activation_bytes(model, T, t, sp_t, moe)
    return {
        "fwd_s": ops.fwd, "bwd_input_s": ops.bwd_in, "bwd_weight_s": ops.bwd_w, "selective_recompute_s": ops.sel,
        "tp_fwd_s": tp_fwd, "tp_bwd_s": tp_bwd, "cp_fwd_s": cp_fwd, "cp_bwd_s": cp_bwd, "ep_fwd_s": ep_fwd,
        # with the fused kernel selective recomputation keeps what no recomputation keeps
        "act_bytes": act_none, "act_none_bytes": act_none, "act_full_bytes": T * 2 * h / sp_t,
        "cp_buffer_bytes": cp_buf,
    }


def _node_limited_all_to_all_s(model: ModelSpec, cluster: Cluster, seq_len: int, t, c, b, sp_t,
                               ep_group) -> np.ndarray:
    """``moe.node_limited_all_to_all_s`` over arrays (the expected node count per distinct node count, by the
    scalar ``expected_nodes_per_token``)."""
    size, g, _ = ep_group
    nodes = -(-size // g)
    limit = np.where(model.expert_groups % nodes == 0, model.expert_groups_per_token, 0)
    pairs, inv = np.unique(np.stack([nodes, limit], axis=1), axis=0, return_inverse=True)
    expected = np.array([expected_nodes_per_token(model.experts_per_token, int(nd), int(lim)) for nd, lim in pairs])
    per_token = model.hidden_size * ACT_BYTES
    T = b * seq_len / c / sp_t
    remote = expected[inv.reshape(-1)] * (nodes - 1) / nodes
    t_inter = T * remote * per_token / cluster.inter_node.bus_bandwidth_bytes_per_s
    t_intra = T * model.experts_per_token * (g - 1) / g * per_token / cluster.intra_node.bus_bandwidth_bytes_per_s
    return np.maximum(t_inter, t_intra) + (nodes - 1) * cluster.inter_node.latency_s + \
        (g - 1) * cluster.intra_node.latency_s


def _activation_bytes(model: ModelSpec, tokens: np.ndarray, t: np.ndarray, sp_t: np.ndarray, moe: bool) -> np.ndarray:
    """``memory.activation_bytes_per_layer`` with no recomputation and the fused attention kernel."""
    h = model.hidden_size
    replicated = 4 * h + 2 * h + 2 * h + (2 * h if model.dropout else 0)
    if moe:
        f_total = model.moe_ffn_hidden_size * (model.experts_per_token + model.num_shared_experts)
    else:
        f_total = model.ffn_hidden_size
    mlp = (6 if model.gated_mlp else 4) * f_total
    split = 2 * (model.attn_q_dim + model.attn_k_dim + model.attn_v_dim + model.attn_out_dim) + mlp
    if moe:
        split += 4 * model.num_experts / 1
    per_token = replicated / sp_t + split / t
    if model.is_mla:
        per_token = per_token + 2 * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
    if moe:
        per_token = per_token + 2 * model.experts_per_token * h * (1 + 1 / sp_t)
    per_token = per_token + 4 * model.num_heads / t
    return tokens * per_token


# ---------------------------------------------------------------------------------------------------------------
# Embedding and LM head
# ---------------------------------------------------------------------------------------------------------------
def end_costs(model: ModelSpec, cluster: Cluster, seq_len: int, tp: np.ndarray, cp: np.ndarray, mb: np.ndarray,
              sp: np.ndarray) -> dict[str, np.ndarray]:
    """``pass_times`` of ``embedding_ops`` and ``head_ops`` and ``embedding_activation_bytes``, per key:
    ``emb_fwd_s``, ``emb_bwd_s``, ``head_fwd_s``, ``head_bwd_input_s``, ``head_bwd_weight_s``, ``act_emb_bytes``
    and ``head_act_bytes`` (``memory.head_activation_bytes``)."""
    t = np.asarray(tp, dtype=np.int64)
    c = np.asarray(cp, dtype=np.int64)
    b = np.asarray(mb, dtype=np.int64)
    sp_t = np.where(np.asarray(sp, dtype=bool), t, 1)
    T = b * seq_len / c
    h, V = model.hidden_size, model.vocab_size
    emb = _Ops(cluster.gpu, len(t))
    emb.memory(ACT_BYTES * (T / sp_t) * h * 2, 1.0, 1.0)
    head = _Ops(cluster.gpu, len(t))
    head.gemm(T, h, V / t)
    head.memory(LOGIT_BYTES * (T * V / t) * 3, 1.0, 0.0)
    return {"emb_fwd_s": emb.fwd, "emb_bwd_s": emb.bwd_in + emb.bwd_w, "head_fwd_s": head.fwd,
            "head_bwd_input_s": head.bwd_in, "head_bwd_weight_s": head.bwd_w,
            "act_emb_bytes": T * h * (3 if model.dropout else 2) / sp_t,
            "head_act_bytes": T * (2 * h / sp_t + (2 + LOGIT_BYTES) * V / t)}
