"""One training step: combines compute, communication, memory and the pipeline schedule into an Estimate.

step time = pipeline schedule over per-micro-batch rank times (F, B, W incl. exposed TP / CP / EP / PP comm and
recomputation) + exposed data-parallel communication + optimizer step.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache

import numpy as np

from planner.cost import comm
from planner.cost.compute import (ACT_BYTES, Config, alltoall_dispatch, attended_keys, attention_core_s,
                                  compute_sm_share, embedding_ops, image_keys, vision_config, vision_projector_ops,
                                  head_ops, layer_ops, model_flops_per_step, mtp_projection_ops, pass_times, recomputed,
                                  tp_overlap_windows)
from planner.cost.context_parallel import NO_CP, cp_layer_cost, mamba_cp_cost
from planner.cost.data_parallel import (ADAM_BYTES_PER_PARAM, dp_collectives, dp_exposed_s, dp_groups, hsdp_groups,
                                        expert_shard_degree, exposed_s, gathered_linear_weight_bytes,
                                        optimizer_step_s, packed_wait_s)
from planner.cost.memory import (WEIGHT_BYTES, StageParams, activation_bytes_per_layer, embedding_activation_bytes,
                                 gathered_weight_bytes, held_grad_bytes, held_linear_weight_bytes,
                                 optimizer_state_bytes,
                                 offloaded_bytes_per_layer, vision_projector_activation_bytes,
                                 end_params_on_gpu, gathered_layer_params, head_activation_bytes, layer_params_on_gpu,
                                 model_state_bytes, mtp_projection_activation_bytes, zero_sharded_params)
from planner.cost.moe import ep_layer_cost
from planner.cost.schedule import get_schedule
from planner.cost.validity import config_problems
from planner.errors import PlannerError
from planner.specs.config import ConfigBatch, RunConfig, even_layer_split, op_sac_on, recompute_module_on
from planner.specs.hardware import GIB, Cluster
from planner.specs.model import DENSE_LAYER, LayerKind, ModelSpec

__all__ = ["ADAM_BYTES_PER_PARAM", "BatchCosts", "EndCost", "Estimate", "LAYER_COSTS", "LayerCost", "StageEstimate",
           "end_costs", "batch_costs", "estimate", "layer_costs", "pipeline_send_s", "stage_layers"]


#: how MFU counts the attention core's FLOPs (``compute.model_flops_per_step``): the whole s x s score square, as
#: Narayanan et al. 2021 Eq. 3 and Megatron's reports do; a causal-half count (Meta's Llama 3 report) reads lower
MFU_ATTENTION = "full s x s square (Narayanan et al. 2021, Eq. 3); causal-half counts read lower"


@dataclass(frozen=True)
class StageEstimate:
    """One pipeline rank (its v chunks together): per-micro-batch times and peak memory."""

    rank: int
    layers: tuple[int, ...]  # layers of each chunk on this rank
    fwd_s: float
    bwd_s: float  # input + weight gradients
    bwd_weight_s: float  # of which weight gradients (W of zero-bubble schedules)
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    compute_s: float  # forward + backward kernels, no communication, no recomputation
    recompute_compute_s: float  # kernels re-run by recomputation
    params_dense: float  # parameters on this GPU sharded by ZeRO over DP x CP
    params_expert: float  # expert parameters on this GPU, sharded by ZeRO over DP x CP / EP
    inflight_microbatches: float
    memory_bytes: dict[str, float]
    offload_s: float = 0.0  # activation transfers to / from host memory that compute does not hide
    #: activation bytes per micro-batch this rank sends to host memory in forward and reloads in backward
    #: (fine-grained offloading; PCIe / C2C traffic each way)
    offload_bytes: float = 0.0
    #: per step: this rank's data-parallel communication its compute does not hide, and its optimizer step (the
    #: step waits for the slowest rank of each)
    dp_exposed_s: float = 0.0
    optimizer_s: float = 0.0

    @property
    def time_per_microbatch_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s

    @property
    def host_memory_bytes(self) -> float:
        """Offloaded activations resident in host memory: those of every micro-batch in flight."""
        return self.offload_bytes * self.inflight_microbatches

    @property
    def peak_memory_bytes(self) -> float:
        return sum(self.memory_bytes.values())


@dataclass(frozen=True)
class Estimate:
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float  # model FLOPs per second per GPU, in TFLOP/s
    mfu: float
    hfu: float
    peak_memory_bytes: float
    memory_limit_bytes: float
    fits: bool
    breakdown: dict[str, float]  # seconds per step
    stages: tuple[StageEstimate, ...] = field(default=())

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_memory_bytes / GIB

    def to_dict(self, with_stages: bool = True) -> dict:
        d = {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "mfu_attention": MFU_ATTENTION,
            "peak_memory_gib": self.peak_memory_gib,
            "memory_limit_gib": self.memory_limit_bytes / GIB,
            "fits": self.fits,
            "breakdown": dict(self.breakdown),
        }
        if with_stages:
            d["stages"] = [
                {**{k: v for k, v in asdict(s).items() if k != "memory_bytes"},
                 "layers": list(s.layers),
                 "memory_gib": {k: v / GIB for k, v in s.memory_bytes.items()},
                 "host_memory_gib": s.host_memory_bytes / GIB,
                 "peak_memory_gib": s.peak_memory_bytes / GIB}
                for s in self.stages
            ]
        return d


# ---------------------------------------------------------------------------------------------------------------
# One layer, the embedding and the LM head, and a pipeline send: over one configuration or a batch of them
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerCost:
    """One decoder layer, one micro-batch, one GPU: kernel times (forward, input gradient, weight gradient, the
    extra forward of selective recomputation), exposed TP / CP / EP communication, activation bytes and FLOPs.
    Numbers for one configuration, arrays over a batch."""

    fwd_s: float | np.ndarray
    bwd_input_s: float | np.ndarray
    bwd_weight_s: float | np.ndarray
    selective_recompute_s: float | np.ndarray
    tp_fwd_s: float | np.ndarray
    tp_bwd_s: float | np.ndarray
    cp_fwd_s: float | np.ndarray
    cp_bwd_s: float | np.ndarray
    ep_fwd_s: float | np.ndarray  # dispatch + combine (+ expert TP) one way; the same again in backward
    act_bytes: float | np.ndarray  # with the configured recompute (selective / none)
    act_full_bytes: float | np.ndarray  # with full recompute (layer input only)
    act_none_bytes: float | np.ndarray  # nothing recomputed
    recompute_flops: float | np.ndarray  # extra forward FLOPs on this GPU under selective recompute
    fwd_flops: float | np.ndarray
    #: transient buffers: CP receive buffers (ring K/V blocks, Ulysses all-to-all outputs) and the offloaded
    #: activations in transit to and from host memory (one layer each way)
    buffer_bytes: float | np.ndarray
    offload_bytes: float | np.ndarray = 0.0  # activations sent to host memory in forward (and back in backward)
    offload_fwd_s: float | np.ndarray = 0.0  # their copy to host that the layer's forward does not hide
    offload_bwd_s: float | np.ndarray = 0.0  # their reload that the layer's backward does not hide
    attention_s: float | np.ndarray = 0.0  # the attention core's forward + backward kernels
    #: communication selective recomputation re-runs, one forward's worth: a recomputed MoE block's ("moe")
    #: dispatch and combine all-to-alls (and expert-TP gather), and its TP collectives
    recompute_ep_s: float | np.ndarray = 0.0
    recompute_tp_s: float | np.ndarray = 0.0

    @property
    def recompute_comm_s(self):
        """Communication selective recomputation re-runs."""
        return self.recompute_ep_s + self.recompute_tp_s

    @property
    def fwd_comm_s(self):
        """Communication on the forward critical path: TP + CP + EP, and exposed copies to host memory."""
        return self.tp_fwd_s + self.cp_fwd_s + self.ep_fwd_s + self.offload_fwd_s

    @property
    def bwd_comm_s(self):
        """Communication on the input-gradient critical path: TP + CP + EP (the all-to-alls mirror forward), and
        exposed reloads from host memory."""
        return self.tp_bwd_s + self.cp_bwd_s + self.ep_fwd_s + self.offload_bwd_s

    @property
    def fwd_total_s(self):
        """F of one layer: kernels and exposed communication (also what full recomputation re-runs)."""
        return self.fwd_s + self.fwd_comm_s

    @property
    def bwd_input_total_s(self):
        """B of one layer (input gradients and exposed communication), without recomputation."""
        return self.bwd_input_s + self.bwd_comm_s


def _floats(obj, row: int | None = None):
    """The same dataclass with every field a Python float (one configuration's costs, for the scalar step): the
    fields as they are, or entry ``row`` of a batch's (a field the batch does not vary may be a single number)."""
    def pick(x):
        return x if row is None or not np.ndim(x) else x[row]
    return type(obj)(**{f.name: float(pick(getattr(obj, f.name))) for f in fields(obj)})


def tp_layer_comm_s(model: ModelSpec, cluster: Cluster, cfg: Config, tp_group: comm.GroupPlacement,
                    windows: list[tuple]):
    """(forward, backward) TP communication of one layer on the critical path (Megatron, Shoeybi et al. 2019 Sec. 3;
    Korthikanti et al. 2022 Sec. 4.2.2), for a layer of ``len(windows)`` TP-split blocks (a transformer layer's
    attention and MLP: 2; a hybrid model's layer: 1), each a column- then a row-parallel linear layer;
    ``windows``: per block, the forward time of its column- and of its row-parallel GEMMs
    (``compute.tp_overlap_windows``).

    Forward: an all-reduce per block, or an all-gather + a reduce-scatter with SP, all on the critical path, unless
    ``tp_comm_overlap`` pipelines each with its own GEMM (Megatron ``--tp-comm-overlap``, Transformer Engine
    userbuffers: the all-gather under the column-parallel GEMM that consumes the gathered input, the reduce-scatter
    under the row-parallel GEMM that produces the scattered output), which hides each up to that GEMM's time.
    Backward: the column-parallel layers' collectives (the async input-gradient all-reduce; with SP the re-gather of
    the input and the gradient reduce-scatter) overlap their GEMMs; with SP the row-parallel layers' output-gradient
    all-gathers (1 per block) stay exposed, unless ``tp_comm_overlap`` runs them as ring exchanges inside those
    layers' dgrad GEMMs (Transformer Engine userbuffers' proj_dgrad / fc2_dgrad, RingExchangeOverlapCfg in every
    Megatron-Bridge TP-overlap config: src/megatron/bridge/training/comm_overlap.py at v0.2.0), which hides each up
    to its row-parallel GEMM's time (a dgrad GEMM has its forward's FLOPs). Overlapped communication still costs the
    compute stream a fraction (``gpu.comm_overlap_interference``) of its duration."""
    intf = cluster.gpu.comm_overlap_interference
    blocks = len(windows)
    msg = cfg.tokens_per_rank * model.hidden_size * ACT_BYTES
    sp = np.asarray(cfg.sequence_parallel, dtype=bool)
    overlap = np.asarray(cfg.tp_comm_overlap, dtype=bool)
    ag = comm.all_gather_s(cluster, tp_group, msg)
    rs = comm.reduce_scatter_s(cluster, tp_group, msg)
    ar = comm.all_reduce_s(cluster, tp_group, msg)
    plain = np.where(sp, blocks * (ag + rs), blocks * ar)
    paired = sum((np.where(sp, exposed_s(ag, col, intf) + exposed_s(rs, row, intf), exposed_s(ar, col + row, intf))
                  for col, row in windows), np.zeros_like(plain))
    fwd = np.where(overlap, paired, plain)
    exposed_bwd = np.where(sp, blocks * ag, 0.0)
    overlapped_bwd = np.where(sp, blocks * ag + blocks * rs, plain)
    hidden_bwd = np.where(overlap & sp, sum((np.minimum(ag, row) for _, row in windows), np.zeros_like(plain)), 0.0)
    bwd = exposed_bwd - hidden_bwd + (overlapped_bwd + hidden_bwd) * intf
    has_tp = np.asarray(cfg.tp) > 1
    return np.where(has_tp, fwd, 0.0), np.where(has_tp, bwd, 0.0)


def tp_regather_s(model: ModelSpec, cluster: Cluster, cfg: Config, tp_group: comm.GroupPlacement, blocks: int):
    """TP communication torchtitan's per-op selective checkpointing (recompute modules "op_sac", "op_sac_v02") runs
    again in backward: its save list keeps the reduce-scatters' outputs (``_c10d_functional.reduce_scatter_tensor``)
    but not the all-gathers' nor an all-reduce's (torchtitan/distributed/activation_checkpoint.py), so each of the
    layer's ``blocks`` TP-split blocks gathers its sequence-parallel input again (or all-reduces again without SP)
    when its recomputed linear layers need it; 0 without TP."""
    msg = cfg.tokens_per_rank * model.hidden_size * ACT_BYTES
    sp = np.asarray(cfg.sequence_parallel, dtype=bool)
    per_block = np.where(sp, comm.all_gather_s(cluster, tp_group, msg), comm.all_reduce_s(cluster, tp_group, msg))
    return np.where(np.asarray(cfg.tp) > 1, blocks * per_block, 0.0)


def layer_costs(model: ModelSpec, cluster: Cluster, cfg: Config, groups: comm.Groups,
                kind: LayerKind = DENSE_LAYER) -> LayerCost:
    """Costs of one decoder layer of kind ``kind`` (``ModelSpec.layer_kinds``: dense or MoE, global or
    sliding-window attention, a hybrid model's Mamba / attention / MLP / MoE layer) for one configuration or a batch
    of them: the kernels of ``compute.layer_ops``, TP communication (:func:`tp_layer_comm_s`), CP
    (``context_parallel.cp_layer_cost`` for attention, ``mamba_cp_cost`` for a Mamba mixer), EP
    (``moe.ep_layer_cost``) and the activations of ``memory.activation_bytes_per_layer``."""
    gpu = cluster.gpu
    ops = layer_ops(model, cfg, kind)
    # SMs the stack's communication kernels hold through the step (RunConfig.comm_reserved_sms): every kernel runs
    # on the rest (compute.compute_sm_share), and that reservation is the MoE overlap's whole cost
    reserved = np.asarray(cfg.comm_reserved_sms)
    pt = pass_times(ops, gpu, cfg.recompute_modules).on_sm_share(compute_sm_share(gpu, reserved))
    if kind.moe:  # the batch-level overlap pairs micro-batches: one's kernels fill the other's issue gaps
        # except after Megatron-Core's all-to-all dispatcher (compute.alltoall_dispatch), whose host sync on the
        # compute stream drains the paired micro-batch's queued kernels, so the expert GEMMs issued after it find the
        # GPU idle; the flex dispatcher's wait (DeepEP, HybridEP) polls a host counter its dispatch kernel writes,
        # leaving the compute stream running
        fills = np.asarray(cfg.ep_comm_overlap, dtype=bool) & (np.asarray(cfg.ep) > 1) & \
            np.asarray(cfg.moe_overlap_fills_issue_gaps, dtype=bool) & ~alltoall_dispatch(cfg)
        scale = np.where(fills, pt.paired_scale(), 1.0)
        pt = replace(pt, fwd_s=pt.fwd_s * scale, bwd_input_s=pt.bwd_input_s * scale,
                     bwd_weight_s=pt.bwd_weight_s * scale)
    windows = tp_overlap_windows(ops, gpu, kind)
    tp_fwd, tp_bwd = tp_layer_comm_s(model, cluster, cfg, groups.tp, windows)
    # CP: ring attention (K/V blocks around the ring, overlapped with block attention) or Ulysses (all-to-all of
    # heads); a Mamba mixer's all-to-alls; formulas and sources in planner.cost.context_parallel
    attn_s, attn_ratio = attention_core_s(ops, gpu, cfg)
    if kind.mixer == "attention":
        cpc = cp_layer_cost(model, cluster, cfg, groups.cp, attn_s, attn_ratio)
    elif kind.mixer == "mamba":
        cpc = mamba_cp_cost(model, cluster, cfg, groups.cp)
    else:
        cpc = NO_CP
    # EP: token dispatch + combine all-to-all, forward and backward, and with TP the expert-TP gather / scatter of
    # the k token copies (planner.cost.moe). That gather / scatter replaces the MoE block's share of the layer's TP
    # collectives counted above, unless shared experts (a TP-parallel dense MLP) still need them.
    ep_fwd = rec_ep = rec_tp = 0.0
    if kind.moe:
        ep_fwd = ep_layer_cost(model, cluster, cfg, groups.ep, groups.etp if groups.etp is not None else
                               groups.tp).fwd_s
        gathered = (np.asarray(cfg.ep) > 1) & (np.asarray(cfg.tp) > 1) & (not model.num_shared_experts)
        # "moe" re-runs the whole MoE block's forward in backward (moe_layer.py, tensor_parallel.checkpoint around
        # router, dispatch, experts, combine and shared experts): its all-to-alls, unpaired (Megatron-Core refuses
        # "moe" with the all-to-all overlap), and its TP collectives unless the expert-TP gather replaced them
        moe_rec = recompute_module_on(cfg.recompute_modules, "moe")
        rec_ep = np.where(moe_rec, ep_fwd, 0.0)
        # the layer's TP collectives without the MoE block's (its mixer's only: the windows but the last)
        mixer_fwd, mixer_bwd = tp_layer_comm_s(model, cluster, cfg, groups.tp, windows[:-1])
        rec_tp = np.where(moe_rec & ~gathered, tp_fwd - mixer_fwd, 0.0)
        # batch-level overlap (Megatron-Core's merged forward-backward of two micro-batches; DualPipe's F&B): each
        # layer's all-to-alls of one micro-batch, forward and backward, run under the other's kernels of that
        # layer; what sticks out, and the interference of what hides, stays (split evenly over the two passes)
        paired = exposed_s(2 * ep_fwd, pt.fwd_s + pt.bwd_input_s + pt.bwd_weight_s,
                           np.where(reserved > 0, 0.0, gpu.comm_overlap_interference)) / 2
        ep_fwd = np.where(np.asarray(cfg.ep_comm_overlap, dtype=bool), paired, ep_fwd)
        tp_fwd = np.where(gathered, mixer_fwd, tp_fwd)
        tp_bwd = np.where(gathered, mixer_bwd, tp_bwd)
    sac = op_sac_on(cfg.recompute_modules)
    if np.any(sac) and kind.mixer == "attention":
        rec_tp = rec_tp + np.where(sac, tp_regather_s(model, cluster, cfg, groups.tp, len(windows)), 0.0)
    selective = np.asarray(cfg.recompute) == "selective"
    rec_flops = sum(o.flops * recomputed(o, cfg.recompute_modules) for o in ops)
    # fine-grained activation offloading (Megatron-Core): the listed module inputs go to host memory as the layer's
    # forward produces them and come back ahead of its backward, on copy engines; a layer's copy hides under the
    # next layer's forward (its reload under the previous layer's backward), one layer in transit each way
    off = offloaded_bytes_per_layer(model, cfg, kind)
    copy = comm.host_copy_s(cluster, off) if cluster.host_link_bytes_per_s else np.where(off > 0, np.inf, 0.0)
    fwd_window = pt.fwd_s + tp_fwd + cpc.fwd_exposed_s + ep_fwd
    bwd_window = pt.bwd_input_s + pt.bwd_weight_s + tp_bwd + cpc.bwd_exposed_s + ep_fwd
    return LayerCost(
        fwd_s=pt.fwd_s, bwd_input_s=pt.bwd_input_s, bwd_weight_s=pt.bwd_weight_s,
        selective_recompute_s=pt.selective_recompute_s, recompute_ep_s=rec_ep, recompute_tp_s=rec_tp,
        tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd,
        cp_fwd_s=cpc.fwd_exposed_s, cp_bwd_s=cpc.bwd_exposed_s, ep_fwd_s=ep_fwd,
        act_bytes=activation_bytes_per_layer(model, cfg, np.where(selective, "selective", "none"), kind) - off,
        act_full_bytes=activation_bytes_per_layer(model, cfg, "full", kind),
        act_none_bytes=activation_bytes_per_layer(model, cfg, "none", kind) - off,
        recompute_flops=np.where(selective, rec_flops, 0.0), fwd_flops=sum(o.flops for o in ops),
        buffer_bytes=cpc.buffer_bytes + 2 * off, offload_bytes=off, attention_s=attn_s * (1 + attn_ratio),
        offload_fwd_s=exposed_s(copy, fwd_window, 0.0), offload_bwd_s=exposed_s(copy, bwd_window, 0.0))


@dataclass(frozen=True)
class OffloadCost:
    """Activation offloading of one micro-batch (numbers): device bytes it frees and the transfer time compute
    leaves exposed in forward and backward."""

    saved_bytes: float
    fwd_exposed_s: float
    bwd_exposed_s: float


def offload_costs(model: ModelSpec, cluster: Cluster, cfg: RunConfig, kinds: list[LayerCost]) -> OffloadCost:
    """Megatron-Core's CPU activation offloading (``cpu_offloading_num_layers``, activations only): the first k
    layers' saved activations are copied to host memory as each layer's forward ends and copied back ahead of its
    backward, on a side stream, one layer in flight. Device memory keeps one offloaded layer's activations (the
    one in transfer) instead of k; each transfer, bytes / host-link bandwidth, hides under the next layer's forward
    (the previous layer's backward), and what exceeds that layer's time is exposed. Offloaded layers are the first
    ones (their kinds by position, ``ModelSpec.kind_index``: dense before MoE where the model has leading dense
    layers); ``kinds``: the costs of each kind of layer."""
    first_k = model.kind_index[:cfg.offload_layers]
    saved = fwd = bwd = 0.0
    kept = 0.0
    for count, lc in ((first_k.count(k), lc) for k, lc in enumerate(kinds)):
        if count <= 0:
            continue
        act = float(lc.act_bytes)
        t = float(comm.host_copy_s(cluster, act))
        saved += count * act
        kept = max(kept, act)
        fwd += count * float(exposed_s(t, float(lc.fwd_total_s), 0.0))
        bwd += count * float(exposed_s(t, float(lc.bwd_input_total_s + lc.bwd_weight_s), 0.0))
    return OffloadCost(saved_bytes=saved - kept, fwd_exposed_s=fwd, bwd_exposed_s=bwd)


@dataclass(frozen=True)
class EndCost:
    """The embedding (first stage) and the LM head (last stage), one micro-batch, one GPU: kernel times, the head's
    TP gather with SP, and their activation bytes. Numbers for one configuration, arrays over a batch."""

    emb_fwd_s: float | np.ndarray
    emb_bwd_s: float | np.ndarray  # all of it weight gradient (W)
    head_fwd_s: float | np.ndarray
    head_bwd_input_s: float | np.ndarray
    head_bwd_weight_s: float | np.ndarray
    head_tp_s: float | np.ndarray  # with SP: all-gather of the final norm's output before the LM head, each way
    act_emb_bytes: float | np.ndarray
    head_act_bytes: float | np.ndarray


def end_costs(model: ModelSpec, cluster: Cluster, cfg: Config, groups: comm.Groups,
              block: LayerCost | None = None) -> EndCost:
    """Embedding and LM head costs (``compute.embedding_ops`` / ``head_ops``, ``memory.embedding_activation_bytes``
    / ``head_activation_bytes``), and on the last stage the multi-token-prediction modules (DeepSeek-V3 report Sec.
    2.2; Megatron-Core places them with the loss): per module its projection (``compute.mtp_projection_ops``), one
    more decoder layer (:func:`layer_costs`, with its TP / EP communication; ``block``, where the caller already
    has that layer's costs) and one more pass of the shared LM head and loss."""
    share = compute_sm_share(cluster.gpu, cfg.comm_reserved_sms)  # RunConfig.comm_reserved_sms, as in layer_costs
    emb = pass_times(embedding_ops(model, cfg), cluster.gpu).on_sm_share(share)
    emb_fwd, emb_bwd, act_emb = emb.fwd_s, emb.bwd_s, embedding_activation_bytes(model, cfg)
    if model.vision_layers:  # the vision encoder and projector ahead of the embedding (first stage; their
        # backward, none of it needed upstream of the images, is counted with the embedding's as W)
        vcfg = vision_config(model, cfg)
        enc = layer_costs(model.vision_encoder, cluster, vcfg, comm.groups_for(cluster, cfg.tp, 1, 1, 1))
        proj = pass_times(vision_projector_ops(model, vcfg), cluster.gpu).on_sm_share(share)
        n = model.vision_layers
        emb_fwd = emb_fwd + n * enc.fwd_total_s + proj.fwd_s
        emb_bwd = emb_bwd + n * (enc.bwd_input_total_s + enc.bwd_weight_s) + proj.bwd_s
        act_emb = act_emb + n * enc.act_bytes + vision_projector_activation_bytes(model, vcfg)
    head = pass_times(head_ops(model, cfg), cluster.gpu).on_sm_share(share)
    gather = comm.all_gather_s(cluster, groups.tp, cfg.tokens_per_rank * model.hidden_size * ACT_BYTES)
    head_tp = np.where((np.asarray(cfg.tp) > 1) & np.asarray(cfg.sequence_parallel, dtype=bool), gather, 0.0)
    head_fwd, head_bwd_in, head_bwd_w = head.fwd_s, head.bwd_input_s, head.bwd_weight_s
    head_act = head_activation_bytes(model, cfg)
    if model.mtp_layers:
        n = model.mtp_layers
        if block is None:
            block = layer_costs(model, cluster, cfg, groups, model.layer_kinds[mtp_kind(model)])
        proj = pass_times(mtp_projection_ops(model, cfg), cluster.gpu).on_sm_share(share)
        head_fwd = head_fwd + n * (block.fwd_total_s + proj.fwd_s + head.fwd_s)
        head_bwd_in = head_bwd_in + n * (block.bwd_input_total_s + proj.bwd_input_s + head.bwd_input_s)
        head_bwd_w = head_bwd_w + n * (block.bwd_weight_s + proj.bwd_weight_s + head.bwd_weight_s)
        head_act = head_act + n * (block.act_bytes + head_activation_bytes(model, cfg) +
                                   mtp_projection_activation_bytes(model, cfg))
    return EndCost(emb_fwd_s=emb_fwd, emb_bwd_s=emb_bwd, head_fwd_s=head_fwd,
                   head_bwd_input_s=head_bwd_in, head_bwd_weight_s=head_bwd_w, head_tp_s=head_tp,
                   act_emb_bytes=act_emb, head_act_bytes=head_act)


def pipeline_send_s(model: ModelSpec, cluster: Cluster, cfg: Config, groups: comm.Groups, pp):
    """One pipeline send of a chunk's boundary activation (or its gradient), per micro-batch; 0 without PP.

    Megatron's scatter/gather optimisation (Narayanan et al. 2021 Sec. 4.1): each TP rank sends only 1/t of the
    boundary activation across the pipeline link and the receiver all-gathers it over NVLink (none with SP, where
    the tensor is already split along the sequence)."""
    boundary = cfg.tokens_per_rank * model.hidden_size * ACT_BYTES
    send = comm.p2p_s(cluster, groups.pp_spans_nodes, pipeline_message_bytes(model, cfg))
    regather = (np.asarray(cfg.tp) > 1) & ~np.asarray(cfg.sequence_parallel, dtype=bool)
    send = send + np.where(regather, comm.all_gather_s(cluster, groups.tp, boundary), 0.0)
    return np.where(np.asarray(pp) > 1, send, 0.0)


def pipeline_message_bytes(model: ModelSpec, cfg: Config):
    """Bytes one GPU sends per pipeline send: its 1/t share of the boundary activation (Megatron's scatter / gather
    optimisation, :func:`pipeline_send_s`); with cross-attention layers (Llama 3.2 Vision) also its share of the
    micro-batch's cross-attention states (b x image tokens x h), which every later stage's cross-attention layers
    read and whose gradient they send back: a decoder stage that cross-attends receives the encoder's output beside
    its hidden state (Megatron-Core's encoder-and-decoder schedules send both tensors,
    megatron/core/pipeline_parallel/schedules.py get_tensor_shapes, core_v0.12.0)."""
    states = cfg.micro_batch_size * image_keys(model) if model.cross_attention_pattern else 0.0
    return (cfg.tokens_per_rank + states) * model.hidden_size * ACT_BYTES / cfg.tp


def _layer_key(tp, cp, cp_kind, ep, mb, seq_len, sp, selective, flash, tpo, precision, etp, modules,
               epo, fused_ce=True, packed_doc_len=0.0, offload_modules="", attention_kernel="",
               per_expert_calls=True, recompute_fused_attention=True, ep_dispatcher="alltoall",
               act_fp8_store=False, moe_load=1.0, fills_gaps=True, reserved_sms=0) -> tuple:
    """What one configuration's layer and end costs depend on besides the model and the cluster (the search's
    layer key with the recompute mode reduced to "selective or not" and SP to "SP with TP"); the TP / CP / EP
    placements follow from the degrees and the cluster. Not in it: GPU count, PP, VPP, global batch, ZeRO stage,
    schedule, layer and recompute splits, DP options, the DP placement and the pipeline link -- none of which a
    layer's kernels, activations or TP / CP / EP communication read."""
    return (tp, cp, cp_kind, ep, mb, seq_len, bool(sp and tp > 1), bool(selective), bool(flash), bool(tpo),
            precision, etp, modules if selective else "", bool(epo and ep > 1), bool(fused_ce),
            float(packed_doc_len), offload_modules, attention_kernel if flash else "", bool(per_expert_calls),
            bool(recompute_fused_attention and flash and selective), ep_dispatcher if ep > 1 else "alltoall",
            bool(act_fp8_store), float(moe_load) if ep > 1 else 1.0, bool(fills_gaps or not (epo and ep > 1)),
            int(reserved_sms))


class LayerCostCache:
    """Layer and end costs of single configurations (as floats), memoized per (model, cluster) on
    :func:`_layer_key`, so the many configurations a search evaluates that differ only in ZeRO stage, pipeline
    shape, schedule, batch or recomputation depth share one evaluation.

    Filled by ``estimate()`` (the batch of one through :func:`layer_costs` / :func:`end_costs`), or by the search
    (:meth:`seed`) from the batch of all its layer keys, computed once by the same functions over arrays.
    ``tests/test_cp.py`` checks cached == seeded == uncached."""

    #: entries kept per (model, cluster) before the cache starts over (a few MB)
    max_entries = 65536

    def __init__(self) -> None:
        self.values: dict[tuple, dict[tuple, object]] = {}

    def clear(self) -> None:
        self.values.clear()

    def _get(self, model: ModelSpec, cluster: Cluster, key: tuple, compute):
        values = self.values.setdefault((model, cluster), {})
        hit = values.get(key)
        if hit is None:
            hit = compute()
            if len(values) >= self.max_entries:
                values.clear()
            values[key] = hit
        return hit

    @staticmethod
    def _key(cfg: RunConfig) -> tuple:
        return _layer_key(cfg.tp, cfg.cp, cfg.cp_kind, cfg.ep, cfg.micro_batch_size, cfg.seq_len,
                          cfg.sequence_parallel, cfg.recompute == "selective", cfg.flash_attention, cfg.tp_comm_overlap,
                          cfg.precision, cfg.expert_tp, cfg.recompute_modules, cfg.ep_comm_overlap,
                          cfg.fused_cross_entropy, cfg.packed_doc_len, cfg.offload_modules, cfg.attention_kernel,
                          cfg.per_expert_gemm_calls, cfg.recompute_fused_attention, cfg.ep_dispatcher,
                          cfg.activation_fp8_input_store, cfg.moe_load_factor, cfg.moe_overlap_fills_issue_gaps,
                          cfg.comm_reserved_sms)

    def layer(self, model: ModelSpec, cluster: Cluster, cfg: RunConfig, groups: comm.Groups,
              kind: int) -> LayerCost:
        """The model's kind ``kind`` of layer (an index into ``ModelSpec.layer_kinds``)."""
        return self._get(model, cluster, self._key(cfg) + (int(kind),),
                         lambda: _floats(layer_costs(model, cluster, cfg, groups, model.layer_kinds[int(kind)])))

    def end(self, model: ModelSpec, cluster: Cluster, cfg: RunConfig, groups: comm.Groups) -> EndCost:
        block = self.layer(model, cluster, cfg, groups, mtp_kind(model)) if model.mtp_layers else None
        return self._get(model, cluster, self._key(cfg) + ("end",),
                         lambda: _floats(end_costs(model, cluster, cfg, groups, block)))

    def seed(self, model: ModelSpec, cluster: Cluster, cfg: RunConfig, costs: "BatchCosts", i: int) -> None:
        """Enter row ``i`` of a batch's costs (:func:`batch_costs`) as configuration ``cfg``'s, whose layer key
        must be that row's: the search computes its layer keys' costs in one batch and seeds the rows it
        evaluates exactly."""
        key = self._key(cfg)
        for tag, arrays in (*enumerate(costs.kinds), ("end", costs.ends)):
            if arrays is not None:
                self._get(model, cluster, key + (tag,), lambda arrays=arrays: _floats(arrays, i))


def mtp_kind(model: ModelSpec) -> int:
    """The kind of decoder layer a multi-token-prediction module repeats: the model's last layer's."""
    return model.kind_index[-1]


@dataclass(frozen=True)
class BatchCosts:
    """Layer costs of each of the model's kinds of layer (``ModelSpec.layer_kinds``: dense and MoE, global and
    sliding-window attention, or a hybrid model's kinds), and the end costs, of every configuration of a batch."""

    kinds: tuple[LayerCost, ...]  # per ``ModelSpec.layer_kinds``
    ends: EndCost
    groups: comm.Groups  # the process groups they were costed over (``comm.groups_for`` with dp = pp = 1)


def batch_costs(model: ModelSpec, cluster: Cluster, batch: ConfigBatch) -> BatchCosts:
    """:func:`layer_costs` and :func:`end_costs` of a batch in one pass, its groups placed by
    ``comm.groups_for``."""
    groups = comm.groups_for(cluster, batch.tp, batch.cp, 1, 1, batch.ep, batch.expert_tp)
    kinds = tuple(layer_costs(model, cluster, batch, groups, kind) for kind in model.layer_kinds)
    return BatchCosts(kinds=kinds, groups=groups, ends=end_costs(model, cluster, batch, groups, kinds[mtp_kind(model)]))


#: the cost model's memo of single configurations' layer costs (filled by estimate() and the search)
LAYER_COSTS = LayerCostCache()


def _layer_cost(model: ModelSpec, cluster: Cluster, cfg: RunConfig, groups: comm.Groups,
                kind: int) -> LayerCost:
    """:func:`layer_costs` of the model's kind ``kind`` of layer in one configuration, as floats (memoized in
    :data:`LAYER_COSTS`)."""
    return LAYER_COSTS.layer(model, cluster, cfg, groups, kind)


def stage_layers(model: ModelSpec, cfg: RunConfig) -> tuple[int, ...]:
    return cfg.layers_per_stage if cfg.layers_per_stage is not None else even_layer_split(model.num_layers,
                                                                                           cfg.num_stages)


def check_config(model: ModelSpec, cluster: Cluster, cfg: RunConfig) -> None:
    problems = config_problems(model, cluster, cfg)
    if problems:
        opt, msg = problems[0]
        raise PlannerError(msg, source=f"--{opt.replace('_', '-')}")


def estimate(model: ModelSpec, cluster: Cluster, cfg: RunConfig, *, check: bool = True) -> Estimate:
    """Estimate one configuration: step time, throughput, MFU and per-stage memory."""
    if check:
        check_config(model, cluster, cfg)
    return _estimate_cached(model, cluster, cfg)


@lru_cache(maxsize=4096)
def _param_counts(model: ModelSpec, tp: int, ep: int, etp: int, seq_len: int, num_stages: int):
    """One configuration's per-GPU parameter counts as floats (``memory.layer_params_on_gpu``,
    ``gathered_layer_params``, ``end_params_on_gpu``), memoized on what they read."""
    kinds = model.layer_kinds
    per_layer = [tuple(float(x) for x in layer_params_on_gpu(model, tp, ep, kind, etp)) for kind in kinds]
    gathered = [float(gathered_layer_params(model, tp, ep, kind, etp)) for kind in kinds]
    ends = tuple(float(x) for x in end_params_on_gpu(model, seq_len, tp, num_stages, ep, etp))
    return per_layer, gathered, ends


@lru_cache(maxsize=256)
def kinds_before(model: ModelSpec, layers: int) -> np.ndarray:
    """Layers of each kind (``ModelSpec.kind_index``) before each position 0..layers, shape (kinds, layers + 1),
    memoized per model; a layout holding more layers than the model (the partition's probes) repeats the last
    layer's kind."""
    kind = list(model.kind_index)
    kind += kind[-1:] * max(0, layers - len(kind))
    onehot = np.asarray(kind)[None, :] == np.arange(len(model.layer_kinds))[:, None]
    out = np.concatenate([np.zeros((len(onehot), 1), dtype=np.int64), np.cumsum(onehot, axis=1, dtype=np.int64)],
                         axis=1)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=4096)
def _send_s(model: ModelSpec, cluster: Cluster, tp: int, cp: int, mb: int, seq_len: int, sp: bool,
            spans_nodes: bool) -> float:
    """:func:`pipeline_send_s` of one configuration with a pipeline, memoized on what it reads."""
    cfg = RunConfig(num_gpus=tp * cp, tp=tp, cp=cp, micro_batch_size=mb, seq_len=seq_len, sequence_parallel=sp)
    groups = comm.groups_for(cluster, tp, cp, 1, 1)
    return float(pipeline_send_s(model, cluster, cfg, replace(groups, pp_spans_nodes=spans_nodes), 2))


#: one configuration's process-group placements, memoized on its degrees (many estimates share them)
_groups_for = lru_cache(maxsize=4096)(comm.groups_for)
_dp_groups = lru_cache(maxsize=4096)(dp_groups)


def step_breakdown(bott: StageEstimate, passes: float, bubble_s: float, dp_exposed_s: float, optimizer_s: float,
                   wait_s: float = 0.0, extra_pp_s: float = 0.0) -> dict[str, float]:
    """Seconds per step by component: the bottleneck rank's per-micro-batch parts over its ``passes``, the
    schedule's bubble, the exposed data-parallel communication, the optimizer step and the wait for the busiest
    data-parallel rank (packed documents); ``extra_pp_s``: pipeline sends of the bottleneck rank its stage row
    does not hold (between GPU pools), per micro-batch."""
    return {
        "compute_s": passes * bott.compute_s,
        "recompute_s": passes * bott.recompute_compute_s,
        "bubble_s": bubble_s,
        "tp_comm_s": passes * bott.tp_comm_s,
        "cp_comm_s": passes * bott.cp_comm_s,
        "ep_comm_s": passes * bott.ep_comm_s,
        "pp_comm_s": passes * (bott.pp_comm_s + extra_pp_s),
        "offload_s": passes * bott.offload_s,
        "dp_comm_s": dp_exposed_s,
        "optimizer_s": optimizer_s,
        **({"dp_imbalance_s": wait_s} if wait_s else {}),
    }


@lru_cache(maxsize=4096)
def _estimate_cached(model: ModelSpec, cluster: Cluster, cfg: RunConfig) -> Estimate:
    gpu = cluster.gpu
    p, v, m, dp = cfg.pp, cfg.vpp, cfg.num_microbatches, cfg.dp
    # gradient-accumulation passes that each run the schedule on their own (RunConfig.pipeline_flushes): the
    # schedule, its bubble and the step's data-parallel collectives are those of one pass over m / flushes
    # micro-batches, taken flushes times
    flushes = cfg.pipeline_flushes
    m = m // flushes
    groups = _groups_for(cluster, cfg.tp, cfg.cp, dp, p, cfg.ep, cfg.expert_tp)
    kind_costs = [_layer_cost(model, cluster, cfg, groups, k) for k in range(len(model.layer_kinds))]
    ends = LAYER_COSTS.end(model, cluster, cfg, groups)
    layers = stage_layers(model, cfg)
    starts = [0, *itertools.accumulate(layers)][:-1]
    sched = get_schedule(cfg.schedule)
    passes = sched.passes(m)  # times each rank runs its per-micro-batch work (DualPipe: m / 2 pairs)
    p2p_one = _send_s(model, cluster, cfg.tp, cfg.cp, cfg.micro_batch_size, cfg.seq_len, cfg.sequence_parallel,
                      bool(groups.pp_spans_nodes)) if p > 1 else 0.0
    head_tp = ends.head_tp_s
    # ZeRO shards a stage's states over every rank holding a copy: its data-parallel replicas, times DualPipe's two
    # copies of it in one pipeline (schedule.stage_copies), whose gradients are summed with the replicas'
    # and, under HSDP, only over its shard group of dp_shard DP ranks (the replicas keep the same shard)
    copies, replicas = sched.stage_copies, cfg.dp_replicas
    dp_shard = cfg.zero_shard_dp * cfg.cp * copies
    expert_dp_shard = int(expert_shard_degree(dp, cfg.cp, cfg.ep, cfg.tp, cfg.expert_tp, replicas)) * copies
    per_layer_params, gathered, (emb_params, head_params_gpu) = _param_counts(model, cfg.tp, cfg.ep, cfg.expert_tp,
                                                                              cfg.seq_len, cfg.num_stages)

    # --- each model chunk j's work per micro-batch, over all chunks at once: its layers of each kind (dense / MoE,
    # or global / sliding-window attention, by position: ModelSpec.kind_index), the layers fully recomputed (a
    # chunk's first ones), its pipeline sends, the embedding (chunk 0), the LM head (last)
    n_stages = len(layers)
    chunks = np.array([sched.stages_of(p, v, r) for r in range(p)])  # each pipeline rank's chunks (stage indices)
    n = np.asarray(layers, dtype=float)
    first = np.asarray(starts, dtype=np.int64)
    before = kinds_before(model, int(sum(layers)))

    def kind_in(k, count):  # kind-k layers among each chunk's first ``count`` layers
        return (before[k, first + np.asarray(count, dtype=np.int64)] - before[k, first]).astype(float)

    n_full = np.zeros(n_stages)
    if cfg.recompute == "full":
        n_full = n if cfg.recompute_num_layers is None else np.minimum(n, cfg.recompute_num_layers)
        if cfg.recompute_layers_per_stage is not None:  # AdaPipe-style depth per stage
            n_full = np.minimum(n, np.asarray(cfg.recompute_layers_per_stage, dtype=float))
    selective = cfg.recompute == "selective"
    # torchtitan's per-op checkpointing re-runs most of a block: its transient is the full recompute's, less what it
    # kept
    op_sac = bool(op_sac_on(cfg.recompute_modules))
    q = {k: np.zeros(n_stages) for k in ("fwd", "bwd_in", "bwd_w", "rec", "comp", "rec_comp", "tpc", "cpc", "epc",
                                         "ppc", "rflops", "act", "dense_params", "expert_params", "offc", "offb", "attn",
                                         "end_params")}
    workspace_j, largest_j = np.zeros(n_stages), np.zeros(n_stages)
    for k, lc in enumerate(kind_costs):
        count, full_here = kind_in(k, n), kind_in(k, n_full)
        sel = count * lc.selective_recompute_s if selective else 0.0
        on = float(selective)
        q["fwd"] += count * lc.fwd_total_s
        q["bwd_in"] += count * lc.bwd_input_total_s
        q["bwd_w"] += count * lc.bwd_weight_s
        q["rec"] += sel + on * count * lc.recompute_comm_s + full_here * lc.fwd_total_s
        q["comp"] += count * (lc.fwd_s + (lc.bwd_input_s + lc.bwd_weight_s))
        q["rec_comp"] += sel + full_here * lc.fwd_s
        q["tpc"] += (count + full_here) * lc.tp_fwd_s + count * lc.tp_bwd_s + on * count * lc.recompute_tp_s
        q["cpc"] += count * (lc.cp_fwd_s + lc.cp_bwd_s) + full_here * lc.cp_fwd_s
        q["epc"] += (2 * count + full_here) * lc.ep_fwd_s + on * count * lc.recompute_ep_s
        q["offc"] += count * (lc.offload_fwd_s + lc.offload_bwd_s)
        q["offb"] += count * lc.offload_bytes
        q["attn"] += count * lc.attention_s
        q["rflops"] += count * lc.recompute_flops + full_here * lc.fwd_flops
        kept = lc.act_bytes if cfg.recompute != "full" else lc.act_none_bytes
        q["act"] += full_here * lc.act_full_bytes + (count - full_here) * kept
        present = count > 0
        recomputing = (full_here > 0) | (selective and not cfg.flash_attention)  # the layer being recomputed
        workspace_j = np.maximum(workspace_j, np.where(present & recomputing, lc.act_none_bytes, 0.0))
        if selective and op_sac:  # the block being re-run holds again what its policy did not save
            workspace_j = np.maximum(workspace_j, np.where(present, lc.act_none_bytes - lc.act_bytes, 0.0))
        workspace_j = np.maximum(workspace_j, np.where(present, lc.buffer_bytes, 0.0))
        dense_pl, expert_pl = per_layer_params[k]
        q["expert_params"] += count * expert_pl
        q["dense_params"] += count * dense_pl
        largest_j = np.maximum(largest_j, np.where(present, gathered[k], 0.0))
    if cfg.offload_layers:  # pp = 1 (validity): one chunk holds every layer
        offloaded = offload_costs(model, cluster, cfg, kind_costs)
        q["act"][0] -= offloaded.saved_bytes
        q["fwd"][0] += offloaded.fwd_exposed_s
        q["bwd_in"][0] += offloaded.bwd_exposed_s
        q["offc"][0] += offloaded.fwd_exposed_s + offloaded.bwd_exposed_s
    if p > 1:
        # each chunk sends its output forward and its input gradient back once per micro-batch; where the stack
        # posts them asynchronously under the schedule's next compute (Megatron-Core's interleaved overlap_p2p_comm)
        # a send costs what sticks out of that chunk's forward / backward, plus the interference of what hides
        # (the next compute on the rank is another of its chunks: the window is its chunks' mean, so a chunk with
        # no layers of its own still hides its send)
        if sched.sends_overlap(cfg.overlap_p2p_comm):
            owner = np.empty(n_stages, dtype=np.int64)
            owner[chunks] = np.arange(p)[:, None]

            def window(x):
                return x[chunks].mean(axis=1)[owner]
            send_f = exposed_s(p2p_one, window(q["fwd"]), gpu.comm_overlap_interference)
            send_b = exposed_s(p2p_one, window(q["bwd_in"] + q["bwd_w"] + q["rec"]), gpu.comm_overlap_interference)
        else:
            send_f = send_b = p2p_one
        q["ppc"] += send_f + send_b
        q["fwd"] += send_f
        q["bwd_in"] += send_b
    q["fwd"][0] += ends.emb_fwd_s
    q["bwd_w"][0] += ends.emb_bwd_s
    q["comp"][0] += ends.emb_fwd_s + ends.emb_bwd_s
    q["dense_params"][0] += emb_params
    q["end_params"][0] += emb_params
    q["act"][0] += ends.act_emb_bytes
    last = n_stages - 1
    q["fwd"][last] += ends.head_fwd_s + head_tp
    q["bwd_in"][last] += ends.head_bwd_input_s + head_tp
    q["bwd_w"][last] += ends.head_bwd_weight_s
    q["comp"][last] += ends.head_fwd_s + (ends.head_bwd_input_s + ends.head_bwd_weight_s)
    q["tpc"][last] += 2 * head_tp
    q["dense_params"][last] += head_params_gpu
    q["end_params"][last] += head_params_gpu
    workspace_j[last] = max(workspace_j[last], ends.head_act_bytes)
    # --- per pipeline rank: its chunks (the schedule's placement; DualPipe: a stage and its mirror) added up
    rank = {k: x[chunks].sum(axis=1) for k, x in q.items()}
    workspace, largest = workspace_j[chunks].max(axis=1), largest_j[chunks].max(axis=1)
    act_per_mb = rank["act"]
    F, B, W = rank["fwd"], rank["bwd_in"] + rank["rec"], rank["bwd_w"]
    recompute_flops_per_mb = rank["rflops"]
    inflight = [sched.inflight(p, m, v, r) for r in range(p)]
    lists = {k: x.tolist() for k, x in rank.items()}
    bwd_s = (rank["bwd_in"] + rank["bwd_w"]).tolist()
    stage_rows = [dict(
        rank=r, layers=tuple(layers[j] for j in chunks[r].tolist()), fwd_s=lists["fwd"][r], bwd_s=bwd_s[r],
        bwd_weight_s=lists["bwd_w"][r], recompute_s=lists["rec"][r], tp_comm_s=lists["tpc"][r],
        cp_comm_s=lists["cpc"][r], ep_comm_s=lists["epc"][r], pp_comm_s=lists["ppc"][r],
        offload_s=lists["offc"][r], offload_bytes=lists["offb"][r], compute_s=lists["comp"][r],
        recompute_compute_s=lists["rec_comp"][r], params_dense=lists["dense_params"][r],
        params_expert=lists["expert_params"][r], inflight_microbatches=inflight[r]) for r in range(p)]

    pipe = sched.time(F, B, W, m, v)
    pipe_s, bubble_s = flushes * float(pipe.total_s), flushes * float(pipe.bubble_s)

    # --- per-rank model states, data-parallel communication and optimizer step, over the ranks at once
    dense_p, expert_p = rank["dense_params"], rank["expert_params"]
    weight_b = held_linear_weight_bytes(cfg.precision, cfg.fp8_param_gather, gpu.fp8_gemm_tn_only,
                                        cfg.te_quantized_weights, cfg.zero_stage)
    in_use_b = gathered_weight_bytes(cfg.precision, cfg.fp8_param_gather, gpu.fp8_gemm_tn_only, cfg.te_quantized_weights)
    states = model_state_bytes(StageParams(dense_p, expert_p, largest, rank["end_params"]), cfg.zero_stage, dp_shard,
                               expert_dp_shard, weight_b, in_use_b,
                               held_grad_bytes(cfg.grad_reduce_bytes, cfg.grads_in_reduce_dtype),
                               optimizer_state_bytes(cfg.adam_moment_bytes), pipelined=p > 1,
                               accumulated_grad_bytes=cfg.grad_reduce_bytes)
    # Megatron DDP / distributed optimizer / ZeRO-3: each rank's collectives, the slowest rank counts
    dp_group, edp_group = _dp_groups(cluster, cfg.tp, cfg.cp, dp, cfg.ep, cfg.expert_tp, copies, p, cfg.dp_shard)
    units = np.asarray(layers, dtype=float)[chunks].sum(axis=1)  # ZeRO-3 units: the rank's layers
    # the decoder layers' weights gather at the linear layers' bytes (their norms and biases, under 1%, with them),
    # the embedding and the LM head in bf16
    linear_b = float(gathered_linear_weight_bytes(cfg.precision, cfg.fp8_param_gather))
    end_p = rank["end_params"]
    dense_b = (linear_b * (dense_p - end_p) + WEIGHT_BYTES * end_p) / np.maximum(dense_p, 1.0)
    coll = dp_collectives(cluster, dp_group, edp_group, dense_p, expert_p, cfg.grad_reduce_bytes, units,
                          hsdp_groups(cluster, cfg.tp, cfg.cp, dp, cfg.ep, cfg.expert_tp, cfg.dp_shard),
                          weight_bytes=(dense_b, linear_b))
    t_dp = dp_exposed_s(coll, cfg.zero_stage, rank["fwd"], rank["bwd_in"] + rank["bwd_w"], rank["rec"], passes,
                        sched.zero3_gathers_once_per_step, cfg.overlap_grad_reduce, cfg.overlap_param_gather,
                        gpu.comm_overlap_interference)
    local = zero_sharded_params(dense_p, expert_p, cfg.zero_stage, dp_shard, expert_dp_shard, "optimizer")
    t_opt = np.broadcast_to(optimizer_step_s(local, gpu, cfg.adam_moment_bytes), (p,))
    t_dp = np.broadcast_to(t_dp, (p,))
    dp_exposed, opt_s = flushes * float(np.max(t_dp)), float(np.max(t_opt))
    # packed variable-length documents: the ranks wait for the one with the most attention work (the busiest
    # pipeline rank's attention per micro-batch, over its passes)
    wait = float(packed_wait_s(np.max(rank["attn"]), cfg.packed_attention_cv, dp,
                               flushes * passes * cfg.micro_batch_size, cfg.micro_batch_size)) \
        if cfg.packed_doc_len and cfg.packed_attention_cv else 0.0
    per_rank = [dict(zip(states, values)) for values in zip(*(np.broadcast_to(x, (p,)).tolist()
                                                               for x in states.values()))]
    stages = tuple(
        StageEstimate(**row, memory_bytes={**per_rank[r], "activations": act * row["inflight_microbatches"],
                                           "workspace": ws}, dp_exposed_s=flushes * float(t_dp[r]),
                      optimizer_s=float(t_opt[r]))
        for r, (row, act, ws) in enumerate(zip(stage_rows, act_per_mb.tolist(), workspace.tolist())))

    step = pipe_s + dp_exposed + opt_s + wait
    mflops = model_flops_per_step(model, cfg.global_batch_size, cfg.seq_len,
                                  keys=float(attended_keys(cfg)) if cfg.packed_doc_len else None)
    hflops = mflops + float(recompute_flops_per_mb.sum()) * flushes * passes * dp * cfg.tp * cfg.cp
    n = cfg.num_gpus
    limit = gpu.usable_memory_bytes
    peak = max(s.peak_memory_bytes for s in stages)
    bott = max(stages, key=lambda s: s.time_per_microbatch_s)
    breakdown = step_breakdown(bott, flushes * passes, bubble_s, dp_exposed, opt_s, wait)
    return Estimate(
        step_time_s=step, tokens_per_s=cfg.tokens_per_step / step, tflops_per_gpu=mflops / step / n / 1e12,
        mfu=mflops / step / (n * gpu.peak_flops), hfu=hflops / step / (n * gpu.peak_flops),
        peak_memory_bytes=peak, memory_limit_bytes=limit, fits=peak <= limit, breakdown=breakdown,
        stages=stages)
