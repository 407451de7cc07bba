"""Context parallelism (CP): the sequence of every micro-batch is split over ``cp`` ranks; attention, the only
operator that mixes tokens, exchanges keys and values (ring) or heads (Ulysses). Everything else is local.

Two kinds, chosen by ``RunConfig.cp_kind``:

* ``ring`` -- ring attention as in Liu, Zaharia & Abbeel 2023 ("Ring Attention with Blockwise Transformers",
  Sec. 3) and Megatron-Core context parallelism (``--cp-comm-type p2p``). The sequence is cut into 2 cp chunks and
  rank i keeps chunks i and 2 cp - 1 - i, so that each rank holds the same share of a causal mask (the
  load-balanced split of Megatron-Core's CP; :func:`balanced_causal_work` checks it). In each of cp steps a rank
  computes its queries against one key/value block while sending that block on to the next rank and receiving the
  next one; cp - 1 transfers in forward. The transfer is hidden (but for the SMs its kernels hold: the profile's
  ``comm_overlap_interference``, as for every overlapped collective) when one block's compute takes at least as long
  as one block's transfer (Liu et al. Sec. 3: with c tokens per block and hidden size d, 4 d c^2 FLOPs against
  4 c d bytes of bf16 K and V, i.e. c >= F / B; :func:`ring_min_tokens_per_rank`).
  Backward sends the K/V block and its gradient dK/dV (both bf16 here): twice the bytes against the attention
  backward's compute (2.5 x forward with a flash kernel).
* ``ulysses`` -- DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses", Sec. 3.1-3.2; Megatron
  ``--cp-comm-type a2a``). An all-to-all turns sequence-sharded Q, K, V into head-sharded ones over the full
  sequence, attention runs locally per head, and a second all-to-all returns the output. Each rank sends
  (P - 1)/P of its Q, K, V and output: for multi-head attention with hidden h, sequence N and P = cp that is
  4 N h / P elements per layer in forward (the paper's per-link volume, :func:`ulysses_volume_elements`), the same
  again in backward. Needs the heads (after TP) divisible by cp; K/V heads fewer than that are replicated.

Causal masking: with a flash kernel (the default, ``flash_attention``) the masked half of the score matrix is
skipped, so attention costs half the full s^2 work; without it the full square is computed. This module uses the
same assumption as :func:`planner.cost.compute.layer_ops`.

The group's link: NVLink when all cp ranks of a ring sit in one node, else each GPU's NIC (the slowest hop of the
ring bounds every step); Ulysses' all-to-all is costed by :func:`planner.cost.comm.all_to_all_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import comm
from planner.cost.compute import ACT_BYTES, Config
from planner.cost.data_parallel import exposed_s
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec

#: bytes per element of the K/V blocks and of their gradients passed around the ring (bf16)
KV_BYTES = ACT_BYTES
#: K and V travel in forward; K, V, dK and dV in backward (Megatron-Core / Transformer Engine ring attention)
RING_BWD_BYTES_RATIO = 2.0
#: K/V blocks a ring rank holds beyond its own: the block being received while the current one is used (fwd);
#: in backward the same for K/V and for dK/dV
RING_FWD_BUFFERS = 2
RING_BWD_BUFFERS = 4


# ---------------------------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------------------------
def kv_heads_per_tp_rank(model: ModelSpec, tp):
    """K/V heads one TP rank holds: a share of them, or one replicated head when TP exceeds the K/V heads (GQA)."""
    return np.maximum(model.attn_kv_heads / np.asarray(tp), 1.0)


def kv_bytes_per_token(model: ModelSpec, tp):
    """Bytes of K and V of one token on one TP rank (MLA: per-head keys of nope + rope, values of v_head_dim)."""
    heads = model.attn_kv_heads
    k_head, v_head = model.attn_k_dim / heads, model.attn_v_dim / heads
    return kv_heads_per_tp_rank(model, tp) * (k_head + v_head) * KV_BYTES


# ---------------------------------------------------------------------------------------------------------------
# Ring attention
# ---------------------------------------------------------------------------------------------------------------
def balanced_causal_work(cp: int) -> list[list[float]]:
    """Work of each rank at each ring step under the 2-chunk load-balanced split, in units of one full
    (T x T) block, T = s / cp tokens per rank, for a causal mask whose masked blocks are skipped.

    The sequence has 2 cp chunks of s / (2 cp) tokens; rank i keeps chunks i and 2 cp - 1 - i. At step j rank i
    holds the K/V of rank (i - j) mod cp. A query chunk attends a key chunk fully if the key chunk is earlier, half
    (the diagonal triangle) if it is the same chunk, not at all if it is later. Each of the 4 chunk pairs is a
    quarter of the block. (Megatron-Core CP: every step is half a block, so all ranks finish together.)
    """
    out = []
    for i in range(cp):
        q_chunks = (i, 2 * cp - 1 - i)
        row = []
        for j in range(cp):
            src = (i - j) % cp
            kv_chunks = (src, 2 * cp - 1 - src)
            work = 0.0
            for qc in q_chunks:
                for kc in kv_chunks:
                    work += 0.25 if kc < qc else (0.125 if kc == qc else 0.0)
            row.append(work)
        out.append(row)
    return out


def ring_kv_block_bytes(model: ModelSpec, cfg: Config):
    """Bytes sent per ring step per GPU in forward: the K and V of the T = b s / cp local tokens (after TP)."""
    return cfg.tokens_per_rank * kv_bytes_per_token(model, cfg.tp)


def ring_comm_bytes_per_layer(model: ModelSpec, cfg: Config):
    """(forward, backward) bytes one GPU sends per layer: cp - 1 K/V blocks forward, twice that backward."""
    fwd = np.where(np.asarray(cfg.cp) > 1, (cfg.cp - 1) * ring_kv_block_bytes(model, cfg), 0.0)
    return fwd, RING_BWD_BYTES_RATIO * fwd


def ring_block_flops(model: ModelSpec, cfg: Config):
    """Forward attention FLOPs of one ring step on one GPU: Q of T tokens against K/V of T tokens,
    2 T^2 (q + out widths) / tp (QK^T and scores x V), halved by a kernel that skips masked blocks
    (each step is half a block under the balanced split, :func:`balanced_causal_work`)."""
    T = cfg.tokens_per_rank
    full = 2.0 * T * T * (model.attn_q_dim + model.attn_out_dim) / cfg.tp
    return full * np.where(cfg.flash_attention, 0.5, 1.0)


def ring_min_tokens_per_rank(peak_flops: float, link_bytes_per_s: float, causal_skip: bool = False) -> float:
    """Liu et al. 2023, Sec. 3: the smallest block (tokens per device) whose attention compute hides the K/V
    transfer, c >= F / B for full blocks (4 d c^2 FLOPs vs 4 c d bytes in bf16); a causal step doing half a block
    needs twice that. Their Table: A100 with NVLink (312 TFLOP/s, 300 GB/s) needs about 1K tokens."""
    return (2.0 if causal_skip else 1.0) * peak_flops / link_bytes_per_s


def ring_overlap_holds(step_compute_s, step_comm_s):
    """Liu et al. 2023 Sec. 3: the ring is free when one block's compute covers one block's transfer."""
    return step_compute_s >= step_comm_s


# ---------------------------------------------------------------------------------------------------------------
# Ulysses
# ---------------------------------------------------------------------------------------------------------------
def ulysses_volume_elements(seq_len: int, hidden: int, p: int) -> float:
    """Jacobs et al. 2023 (DeepSpeed Ulysses) Sec. 3.2: per-link communication volume of one multi-head attention
    layer's forward, 4 N h / P elements (Q, K, V in, output back, each N h / P)."""
    return 4.0 * seq_len * hidden / p


def ulysses_bytes(model: ModelSpec, cfg: Config):
    """(Q/K/V, output) bytes one GPU holds going into the two all-to-alls (the all-to-all moves (cp-1)/cp of them).

    K/V heads per TP rank fewer than cp are replicated so every rank gets one: max(kv heads / tp, cp) heads.
    """
    T = cfg.tokens_per_rank
    heads = model.attn_kv_heads
    kv_heads = np.maximum(kv_heads_per_tp_rank(model, cfg.tp), np.asarray(cfg.cp, dtype=float))
    kv = kv_heads * (model.attn_k_dim + model.attn_v_dim) / heads
    qkv = T * (model.attn_q_dim / cfg.tp + kv) * ACT_BYTES
    out = T * model.attn_out_dim / cfg.tp * ACT_BYTES
    return qkv, out


# ---------------------------------------------------------------------------------------------------------------
# One layer's CP cost
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CPCost:
    """Context-parallel cost of one layer, one micro-batch, on one GPU (numbers, or arrays over a batch)."""

    fwd_exposed_s: float | np.ndarray  # communication left on the critical path in forward
    bwd_exposed_s: float | np.ndarray  # ... in backward
    fwd_bytes: float | np.ndarray  # bytes sent in forward
    bwd_bytes: float | np.ndarray
    buffer_bytes: float | np.ndarray  # transient receive buffers (workspace)
    step_compute_s: float | np.ndarray = 0.0  # ring: forward attention time of one step
    step_comm_s: float | np.ndarray = 0.0  # ring: forward transfer time of one K/V block

    @property
    def overlapped(self):
        return ring_overlap_holds(self.step_compute_s, self.step_comm_s)


def cp_layer_cost(model: ModelSpec, cluster: Cluster, cfg: Config, cp_group: comm.GroupPlacement,
                  attn_fwd_s, attn_bwd_ratio) -> CPCost:
    """CP communication of one layer given the attention core's forward time on this GPU (``attn_fwd_s``, already
    divided by cp and halved for causal skipping) and its backward / forward ratio.

    Ring: cp - 1 steps, each exposing max(0, transfer - block compute) in forward and
    max(0, 2 x transfer - bwd_ratio x block compute) in backward (the first step's local block needs no
    transfer), plus the hidden part's interference: a transfer under a block's attention still takes the compute
    stream ``gpu.comm_overlap_interference`` of its duration, as every overlapped collective does
    (:func:`planner.cost.data_parallel.exposed_s`; NCCL's send/receive kernels hold SMs while they run).
    Ulysses: two all-to-alls (Q/K/V, output) in forward and two in backward, not overlapped.
    Without CP (cp = 1) every field is 0.
    """
    cp = np.asarray(cfg.cp)
    has_cp = cp > 1
    ulysses = np.asarray(cfg.cp_kind) == "ulysses"
    # Ulysses
    qkv, out = ulysses_bytes(model, cfg)
    uly_s = comm.all_to_all_s(cluster, cp_group, qkv) + comm.all_to_all_s(cluster, cp_group, out)
    uly_sent = (cp - 1) / cp * (qkv + out)
    # ring
    block = ring_kv_block_bytes(model, cfg)
    step_comm = comm.p2p_s(cluster, cp_group.spans_nodes, block)
    step_compute = attn_fwd_s / cp
    steps = cp - 1
    intf = cluster.gpu.comm_overlap_interference
    ring_fwd = steps * exposed_s(step_comm, step_compute, intf)
    ring_bwd = steps * exposed_s(comm.p2p_s(cluster, cp_group.spans_nodes, RING_BWD_BYTES_RATIO * block),
                                 attn_bwd_ratio * step_compute, intf)
    ring_fwd_b, ring_bwd_b = ring_comm_bytes_per_layer(model, cfg)

    def pick(uly, ring):
        return np.where(has_cp, np.where(ulysses, uly, ring), 0.0)

    return CPCost(fwd_exposed_s=pick(uly_s, ring_fwd), bwd_exposed_s=pick(uly_s, ring_bwd),
                  fwd_bytes=pick(uly_sent, ring_fwd_b), bwd_bytes=pick(uly_sent, ring_bwd_b),
                  buffer_bytes=pick(qkv + out, max(RING_FWD_BUFFERS, RING_BWD_BUFFERS) * block),
                  step_compute_s=pick(0.0, step_compute), step_comm_s=pick(0.0, step_comm))


def mamba_cp_cost(model: ModelSpec, cluster: Cluster, cfg: Config, cp_group: comm.GroupPlacement) -> CPCost:
    """CP communication of one Mamba-2 layer (Megatron-Core ``MambaContextParallel``,
    megatron/core/ssm/mamba_context_parallel.py): the scan runs along the whole sequence, so before the convolution
    an all-to-all turns the sequence-sharded in-projection output (z, x, B, C, dt: 2d + 2GN + H per token after
    TP) into head-sharded full sequences, and after the scan another returns the d-wide output; the same two in
    backward, none overlapped (as Ulysses, whose :func:`comm.all_to_all_s` prices them). Needs the heads and groups
    (after TP) divisible by cp (``validity``). Without CP every field is 0."""
    cp = np.asarray(cfg.cp)
    T = cfg.tokens_per_rank
    d, GN = model.mamba_inner, model.mamba_groups * model.mamba_state_dim
    into = T * (2 * d + 2 * GN + model.mamba_heads) / cfg.tp * ACT_BYTES
    out = T * d / cfg.tp * ACT_BYTES
    a2a = comm.all_to_all_s(cluster, cp_group, into) + comm.all_to_all_s(cluster, cp_group, out)
    has_cp = cp > 1
    sent = np.where(has_cp, (cp - 1) / cp * (into + out), 0.0)
    return CPCost(fwd_exposed_s=np.where(has_cp, a2a, 0.0), bwd_exposed_s=np.where(has_cp, a2a, 0.0),
                  fwd_bytes=sent, bwd_bytes=sent, buffer_bytes=np.where(has_cp, into + out, 0.0))


#: a layer without a token mixer (a hybrid model's MLP and MoE layers) exchanges nothing over CP
NO_CP = CPCost(fwd_exposed_s=0.0, bwd_exposed_s=0.0, fwd_bytes=0.0, bwd_bytes=0.0, buffer_bytes=0.0)
