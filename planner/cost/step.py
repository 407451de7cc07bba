"""One training step: combines compute, communication, memory and the pipeline schedule into an Estimate.

step time = pipeline schedule over per-micro-batch rank times (F, B, W incl. exposed TP / CP / EP / PP comm and
recomputation) + exposed data-parallel communication + optimizer step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache

from planner.cost import comm
from planner.cost.compute import (ACT_BYTES, PassTimes, embedding_ops, head_ops, layer_ops, model_flops_per_step,
                                  op_time_s, pass_times)
from planner.cost.context_parallel import cp_layer_cost
from planner.cost.memory import (StageParams, activation_bytes_per_layer, embedding_activation_bytes, embedding_params,
                                 expert_params_per_layer, head_activation_bytes, head_params, layer_params,
                                 model_state_bytes, norm_params)
from planner.cost.moe import ep_layer_cost
from planner.cost.schedule import get_schedule
from planner.cost.validity import config_problems
from planner.errors import PlannerError
from planner.specs.config import RunConfig, even_layer_split
from planner.specs.hardware import GIB, Cluster
from planner.specs.model import ModelSpec

#: bytes of HBM traffic per parameter in Megatron's mixed-precision optimizer step (fp32 main gradients and
#: master weights, Micikevicius et al. 2018): inf-check and gradient-norm passes read the fp32 gradient twice
#: (8 B); fused Adam reads master weight, gradient, m and v (16 B) and writes master, m and v (12 B); the copy
#: of the master weights into the bf16 model weights reads 4 B and writes 2 B.
ADAM_BYTES_PER_PARAM = 8 + 16 + 12 + 6


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

    @property
    def time_per_microbatch_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s

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
                 "peak_memory_gib": s.peak_memory_bytes / GIB}
                for s in self.stages
            ]
        return d


# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _LayerCost:
    pt: PassTimes
    tp_fwd_s: float
    tp_bwd_s: float
    cp_fwd_s: float
    cp_bwd_s: float
    ep_fwd_s: float
    act_bytes: float  # with the configured recompute (selective / none)
    act_full_bytes: float  # with full recompute (layer input only)
    act_none_bytes: float  # nothing recomputed
    recompute_flops: float  # extra forward FLOPs on this GPU under selective recompute
    fwd_flops: float
    cp_buffer_bytes: float = 0.0  # transient CP receive buffers (ring K/V blocks, Ulysses all-to-all outputs)


def _per_layer_cache(fn):
    """Memoize a layer's cost on the knobs it depends on, so the search's many configurations that differ only in
    ZeRO stage, pipeline shape, schedule, batch or recomputation depth share one evaluation.

    The key: the model, the cluster, TP, CP and its kind, EP, micro-batch, sequence, SP (with TP), selective
    recompute or not, flash attention, TP overlap, and the TP / CP / EP group placements (which depend only on those degrees). Not in it:
    GPU count, PP, VPP, global batch, ZeRO stage, schedule, layer and recompute splits, DP overlap options, the DP
    placement and the pipeline link -- none of which a single layer's kernels, activations or TP / CP / EP
    communication read. ``tests/test_cp.py`` checks cached == uncached.
    """
    cache: dict[tuple, _LayerCost] = {}

    def wrapper(model: ModelSpec, cluster: Cluster, cfg: RunConfig, groups: comm.Groups, moe: bool) -> _LayerCost:
        # a layer reads the recompute mode only as "selective or not" (the full-recompute variants are separate
        # fields), and SP only when there is TP to split over
        key = (model, cluster, cfg.tp, cfg.cp, cfg.cp_kind, cfg.ep, cfg.micro_batch_size, cfg.seq_len,
               cfg.sequence_parallel and cfg.tp > 1, cfg.recompute == "selective", cfg.flash_attention,
               cfg.tp_comm_overlap, groups.tp, groups.cp, groups.ep, moe)
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= LAYER_CACHE_SIZE:
                cache.clear()
            hit = cache[key] = fn(model, cluster, cfg, groups, moe)
        return hit

    wrapper.__wrapped__ = fn
    wrapper.cache_clear = cache.clear
    return wrapper


#: layer costs kept by :func:`_per_layer_cache` before it starts over (a few MB)
LAYER_CACHE_SIZE = 65536


@_per_layer_cache
def _layer_cost(model: ModelSpec, cluster: Cluster, cfg: RunConfig, groups: comm.Groups, moe: bool) -> _LayerCost:
    ops = layer_ops(model, cfg, moe=moe)
    gpu = cluster.gpu
    pt = pass_times(ops, gpu)
    T = cfg.tokens_per_rank
    h = model.hidden_size
    # --- TP (Megatron, Shoeybi et al. 2019 Sec. 3; Korthikanti et al. 2022 Sec. 4.2.2). Forward: 2 all-reduces
    # per layer, or 2 all-gathers + 2 reduce-scatters with SP, all on the critical path. Backward: the column-
    # parallel layers' collectives (the async input-gradient all-reduce; with SP the re-gather of the input and
    # the gradient reduce-scatter) overlap their GEMMs; with SP the row-parallel layers' output-gradient
    # all-gathers (2 per layer) stay exposed. Overlapped comm still costs the compute stream a fraction
    # (gpu.comm_overlap_interference) of its duration.
    msg = T * h * ACT_BYTES
    tp_fwd = tp_bwd = 0.0
    if cfg.tp > 1:
        ag = comm.all_gather_s(cluster, groups.tp, msg)
        if cfg.sequence_parallel:
            tp_fwd = 2 * (ag + comm.reduce_scatter_s(cluster, groups.tp, msg))
            exposed_bwd, overlapped_bwd = 2 * ag, 2 * ag + 2 * comm.reduce_scatter_s(cluster, groups.tp, msg)
        else:
            tp_fwd = 2 * comm.all_reduce_s(cluster, groups.tp, msg)
            exposed_bwd, overlapped_bwd = 0.0, tp_fwd
        tp_bwd = exposed_bwd + overlapped_bwd * gpu.comm_overlap_interference
        if cfg.tp_comm_overlap:
            gemm_fwd = sum(op_time_s(o, gpu) for o in ops if o.kind == "gemm" and o.name != "attention_core")
            hidden = min(tp_fwd, gemm_fwd)
            tp_fwd = tp_fwd - hidden + hidden * gpu.comm_overlap_interference
    # --- CP: ring attention (K/V blocks around the ring, overlapped with block attention) or Ulysses
    # (all-to-all of heads); formulas and sources in planner.cost.context_parallel
    attn = [o for o in ops if o.name == "attention_core"][0]
    cpc = cp_layer_cost(model, cluster, cfg, groups.cp, op_time_s(attn, gpu), attn.bwd_ratio)
    cp_fwd, cp_bwd = cpc.fwd_exposed_s, cpc.bwd_exposed_s
    # --- EP: token dispatch + combine all-to-all, forward and backward, and with TP the expert-TP gather /
    # scatter of the k token copies (planner.cost.moe). That gather / scatter replaces the MLP half of the layer's
    # TP collectives counted above, unless shared experts (a TP-parallel dense MLP) still need them.
    ep_fwd = 0.0
    if moe and cfg.ep > 1:
        ep_fwd = ep_layer_cost(model, cluster, cfg, groups.ep, groups.tp).fwd_s
        if cfg.tp > 1 and not model.num_shared_experts:
            tp_fwd, tp_bwd = tp_fwd / 2, tp_bwd / 2
    rec_flops = sum(o.flops for o in ops if o.recomputed_by_selective)
    return _LayerCost(
        pt=pt, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd, ep_fwd_s=ep_fwd,
        act_bytes=activation_bytes_per_layer(model, cfg, "selective" if cfg.recompute == "selective" else "none",
                                             moe),
        act_full_bytes=activation_bytes_per_layer(model, cfg, "full", moe),
        act_none_bytes=activation_bytes_per_layer(model, cfg, "none", moe),
        recompute_flops=rec_flops if cfg.recompute == "selective" else 0.0,
        fwd_flops=sum(o.flops for o in ops),
        cp_buffer_bytes=cpc.buffer_bytes,
    )


def _exposed(comm_s: float, window_s: float, interference: float) -> float:
    """Communication overlapped with ``window_s`` of compute: what sticks out of the window, plus the share of the
    hidden part that still slows the compute stream (``GPU.comm_overlap_interference``)."""
    hidden = min(comm_s, window_s)
    return comm_s - hidden + hidden * interference


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
def _estimate_cached(model: ModelSpec, cluster: Cluster, cfg: RunConfig) -> Estimate:
    gpu = cluster.gpu
    p, v, m, dp = cfg.pp, cfg.vpp, cfg.num_microbatches, cfg.dp
    groups = comm.groups_for(cluster, cfg.tp, cfg.cp, dp, p, cfg.ep)
    dense = _layer_cost(model, cluster, cfg, groups, moe=False)
    moe = _layer_cost(model, cluster, cfg, groups, moe=True) if model.is_moe else dense
    layers = stage_layers(model, cfg)
    starts = [sum(layers[:j]) for j in range(len(layers))]
    sched = get_schedule(cfg.schedule)
    T = cfg.tokens_per_rank
    # Megatron's scatter/gather optimisation (Narayanan et al. 2021 Sec. 4.1): each TP rank sends only 1/t of the
    # boundary activation across the pipeline link and the receiver all-gathers it over NVLink (none with SP, where
    # the tensor is already split along the sequence)
    p2p_bytes = T * model.hidden_size * ACT_BYTES / cfg.tp
    p2p_one = 0.0
    if p > 1:
        p2p_one = comm.p2p_s(groups.pp_link, p2p_bytes)
        if cfg.tp > 1 and not cfg.sequence_parallel:
            p2p_one += comm.all_gather_s(cluster, groups.tp, T * model.hidden_size * ACT_BYTES)
    emb_pt = pass_times(embedding_ops(model, cfg), gpu)
    head_pt = pass_times(head_ops(model, cfg), gpu)
    head_tp = 0.0
    if cfg.tp > 1 and cfg.sequence_parallel:
        head_tp = comm.all_gather_s(cluster, groups.tp, T * model.hidden_size * ACT_BYTES)
    dp_shard = dp * cfg.cp
    expert_dp_shard = max(1, dp_shard // cfg.ep)

    stages: list[StageEstimate] = []
    F, B, W = [], [], []
    recompute_flops_per_mb = []
    for r in range(p):
        fwd = bwd_in = bwd_w = rec = tpc = cpc = epc = ppc = 0.0
        comp = rec_comp = rflops = 0.0
        dense_params = expert_params = largest = act_per_mb = workspace = 0.0
        chunk_layers = []
        for c in range(v):
            j = sched.stage_index(p, v, r, c)
            n = layers[j]
            chunk_layers.append(n)
            n_moe = sum(1 for i in range(starts[j], starts[j] + n) if model.is_moe and i >= model.first_k_dense_layers)
            n_full = 0
            if cfg.recompute == "full":
                n_full = n if cfg.recompute_num_layers is None else min(n, cfg.recompute_num_layers)
                if cfg.recompute_layers_per_stage is not None:  # AdaPipe-style depth per stage
                    n_full = min(n, cfg.recompute_layers_per_stage[j])
            for count, lc, is_moe in ((n - n_moe, dense, False), (n_moe, moe, True)):
                if count == 0:
                    continue
                full_here = min(count, n_full)
                n_full -= full_here
                comm_f = lc.tp_fwd_s + lc.cp_fwd_s + lc.ep_fwd_s
                comm_b = lc.tp_bwd_s + lc.cp_bwd_s + lc.ep_fwd_s
                sel = count * lc.pt.selective_recompute_s if cfg.recompute == "selective" else 0.0
                fwd += count * (lc.pt.fwd_s + comm_f)
                bwd_in += count * (lc.pt.bwd_input_s + comm_b)
                bwd_w += count * lc.pt.bwd_weight_s
                rec += sel + full_here * (lc.pt.fwd_s + comm_f)
                comp += count * (lc.pt.fwd_s + lc.pt.bwd_s)
                rec_comp += sel + full_here * lc.pt.fwd_s
                tpc += (count + full_here) * lc.tp_fwd_s + count * lc.tp_bwd_s
                cpc += count * (lc.cp_fwd_s + lc.cp_bwd_s) + full_here * lc.cp_fwd_s
                epc += (2 * count + full_here) * lc.ep_fwd_s
                rflops += count * lc.recompute_flops + full_here * lc.fwd_flops
                kept = lc.act_bytes if cfg.recompute != "full" else lc.act_none_bytes
                act_per_mb += full_here * lc.act_full_bytes + (count - full_here) * kept
                if full_here or (cfg.recompute == "selective" and not cfg.flash_attention):
                    workspace = max(workspace, lc.act_none_bytes)  # the layer being recomputed
                workspace = max(workspace, lc.cp_buffer_bytes)
                lp = layer_params(model, moe=is_moe)
                ep_part = expert_params_per_layer(model) if is_moe else 0
                norms = 2 * norm_params(model)  # replicated across TP
                expert_params += count * ep_part / (cfg.ep * cfg.tp)
                dense_params += count * ((lp - ep_part - norms) / cfg.tp + norms)
                largest = max(largest, (lp - ep_part) / cfg.tp + ep_part / (cfg.ep * cfg.tp))
            if p > 1:
                ppc += 2 * p2p_one
                fwd += p2p_one
                bwd_in += p2p_one
            if j == 0:
                fwd += emb_pt.fwd_s
                bwd_w += emb_pt.bwd_s
                comp += emb_pt.fwd_s + emb_pt.bwd_s
                dense_params += embedding_params(model, cfg.seq_len) / cfg.tp
                act_per_mb += embedding_activation_bytes(model, cfg)
            if j == cfg.num_stages - 1:
                fwd += head_pt.fwd_s + head_tp
                bwd_in += head_pt.bwd_input_s + head_tp
                bwd_w += head_pt.bwd_weight_s
                comp += head_pt.fwd_s + head_pt.bwd_s
                tpc += 2 * head_tp
                hp = head_params(model)
                if model.tied_embeddings and cfg.num_stages > 1:
                    hp += model.vocab_size * model.hidden_size  # the tied copy lives on the last stage too
                dense_params += hp / cfg.tp
                workspace = max(workspace, head_activation_bytes(model, cfg))
        inflight = sched.inflight(p, m, v, r)
        states = model_state_bytes(StageParams(dense_params, expert_params, largest), cfg.zero_stage, dp_shard,
                                   expert_dp_shard)
        mem = {**states, "activations": act_per_mb * inflight, "workspace": workspace}
        stages.append(StageEstimate(
            rank=r, layers=tuple(chunk_layers), fwd_s=fwd, bwd_s=bwd_in + bwd_w, bwd_weight_s=bwd_w,
            recompute_s=rec, tp_comm_s=tpc, cp_comm_s=cpc, ep_comm_s=epc, pp_comm_s=ppc, compute_s=comp,
            recompute_compute_s=rec_comp, params_dense=dense_params, params_expert=expert_params,
            inflight_microbatches=inflight, memory_bytes=mem))
        F.append(fwd)
        B.append(bwd_in + rec)
        W.append(bwd_w)
        recompute_flops_per_mb.append(rflops)

    pipe = sched.time(F, B, W, m, v)

    # --- data parallel (Megatron DDP / distributed optimizer / ZeRO-3), per rank, the slowest rank counts
    dp_group = comm.place_group(dp_shard, cfg.tp, cluster.gpus_per_node)
    edp_group = comm.place_group(expert_dp_shard, cfg.tp * cfg.ep, cluster.gpus_per_node)
    dp_exposed = 0.0
    opt_s = 0.0
    for st in stages:
        dense_b, exp_b = st.params_dense, st.params_expert
        if cfg.zero_stage == 3:
            per_mb = sum(2 * comm.all_gather_s(cluster, g, n * 2) + comm.reduce_scatter_s(cluster, g,
                                                                                           n * cfg.grad_reduce_bytes)
                         for g, n in ((dp_group, dense_b), (edp_group, exp_b)))
            t_dp = m * _exposed(per_mb, st.time_per_microbatch_s, gpu.comm_overlap_interference)
            if sched.zero3_gathers_once_per_step:
                # breadth-first: each chunk's weights are gathered once for all micro-batches' forwards, once for
                # their backwards, its gradients reduce-scattered once, overlapped with the whole step's compute
                # (Lamy-Poirier 2022, Sec. 4)
                t_dp = _exposed(per_mb, m * st.time_per_microbatch_s, gpu.comm_overlap_interference)
        else:
            grads = gather = 0.0
            for g, n in ((dp_group, dense_b), (edp_group, exp_b)):
                if cfg.zero_stage == 0:
                    grads += comm.all_reduce_s(cluster, g, n * cfg.grad_reduce_bytes)
                else:
                    grads += comm.reduce_scatter_s(cluster, g, n * cfg.grad_reduce_bytes)
                    gather += comm.all_gather_s(cluster, g, n * 2)
            intf = gpu.comm_overlap_interference
            t_dp = (_exposed(grads, st.bwd_s, intf) if cfg.overlap_grad_reduce else grads) + \
                (_exposed(gather, st.fwd_s, intf) if cfg.overlap_param_gather else gather)
        dp_exposed = max(dp_exposed, t_dp)
        local = (dense_b / dp_shard + exp_b / expert_dp_shard) if cfg.zero_stage >= 1 else dense_b + exp_b
        opt_s = max(opt_s, local * ADAM_BYTES_PER_PARAM / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_bound_efficiency))

    step = pipe.total_s + dp_exposed + opt_s
    mflops = model_flops_per_step(model, cfg.global_batch_size, cfg.seq_len)
    hflops = mflops + sum(recompute_flops_per_mb) * m * dp * cfg.tp * cfg.cp
    n = cfg.num_gpus
    limit = gpu.usable_memory_bytes
    peak = max(s.peak_memory_bytes for s in stages)
    bott = max(stages, key=lambda s: s.time_per_microbatch_s)
    breakdown = {
        "compute_s": m * bott.compute_s,
        "recompute_s": m * bott.recompute_compute_s,
        "bubble_s": pipe.bubble_s,
        "tp_comm_s": m * bott.tp_comm_s,
        "cp_comm_s": m * bott.cp_comm_s,
        "ep_comm_s": m * bott.ep_comm_s,
        "pp_comm_s": m * bott.pp_comm_s,
        "dp_comm_s": dp_exposed,
        "optimizer_s": opt_s,
    }
    return Estimate(
        step_time_s=step, tokens_per_s=cfg.tokens_per_step / step, tflops_per_gpu=mflops / step / n / 1e12,
        mfu=mflops / step / (n * gpu.peak_flops), hfu=hflops / step / (n * gpu.peak_flops),
        peak_memory_bytes=peak, memory_limit_bytes=limit, fits=peak <= limit, breakdown=breakdown,
        stages=tuple(stages))

