"""Variable-length data: a step's cost over a distribution of sample lengths, and dynamic context parallelism.

The cost model times one configuration at one sequence length (``step.estimate``); real data is a long-tailed mix of
document lengths (``specs.lengths.SeqLenDist``). Three ways a stack trains on it, each priced from ``estimate`` (no
formula written twice):

- **packed** (:func:`packed_estimate`): documents packed whole into ``seq_len``-token sequences with per-document
  attention masking; every micro-batch holds the same tokens (memory and linear layers as fixed-length), attention
  shrinks to each document's square (``RunConfig.packed_doc_len``), and the data-parallel ranks wait for the one
  whose packed sequences hold the most attention work (``RunConfig.packed_attention_cv``, priced in the step by
  ``data_parallel.packed_wait_s``).
- **unpacked** (:func:`unpacked_estimate`): one sample per sequence, each micro-batch padded to its longest sample;
  the step is the mixture of the per-length steps, the longest length must fit.
- **dynamic CP** (:func:`dynamic_cp`): Megatron-Core's hybrid context parallelism (``--hybrid-context-parallel``,
  megatron/core/pipeline_parallel/hybrid_cp_schedule.py): each document runs on its own with the smallest
  power-of-two CP degree whose shard fits ``max_seqlen_per_dp_cp_rank`` tokens, balanced over the DP x CP ranks, a
  barrier over them between groups of sub-samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from planner.cost import comm
from planner.cost.compute import model_flops_per_step
from planner.cost.step import Estimate, estimate
from planner.errors import PlannerError
from planner.specs.config import RunConfig
from planner.specs.hardware import Cluster
from planner.specs.lengths import SeqLenDist
from planner.specs.model import ModelSpec

#: bytes a barrier exchanges (NCCL runs torch.distributed.barrier as an all-reduce of one element)
BARRIER_BYTES = 4


@dataclass(frozen=True)
class LengthAwareEstimate:
    """A configuration over a length distribution: ``estimate`` (distribution-aware, what the run does) beside
    ``fixed`` (every sequence one ``seq_len``-token document, what the planner assumes without a distribution)."""

    estimate: Estimate
    fixed: Estimate
    packing: bool
    mean_len: float  # mean sample (piece) length, tokens
    packed_doc_len: float  # token-weighted mean document length (packing), else 0
    imbalance_s: float  # per step: the slowest data-parallel rank's extra attention work (packing)
    useful_token_share: float  # tokens that are data, not padding (unpacked with micro-batches > 1)

    def to_dict(self) -> dict:
        e, f = self.estimate, self.fixed
        return {"packing": self.packing, "mean_len": self.mean_len, "packed_doc_len": self.packed_doc_len,
                "imbalance_s": self.imbalance_s, "useful_token_share": self.useful_token_share,
                "step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu, "fits": e.fits,
                "peak_memory_gib": e.peak_memory_gib, "breakdown": dict(e.breakdown),
                "fixed_length": {"step_time_s": f.step_time_s, "tokens_per_s": f.tokens_per_s, "mfu": f.mfu,
                                 "breakdown": dict(f.breakdown)}}


def _restated(est: Estimate, model: ModelSpec, cluster: Cluster, cfg: RunConfig, step_s: float, tokens: float,
              model_flops: float, extra: dict[str, float]) -> Estimate:
    """``est`` with a new step time, tokens and model FLOPs per step, and breakdown entries added."""
    peak = cluster.gpu.peak_flops * cfg.num_gpus
    hflops_extra = (est.hfu - est.mfu) * est.step_time_s * peak  # recomputation FLOPs, unchanged per step
    return replace(est, step_time_s=step_s, tokens_per_s=tokens / step_s,
                   tflops_per_gpu=model_flops / step_s / cfg.num_gpus / 1e12, mfu=model_flops / step_s / peak,
                   hfu=(model_flops + hflops_extra) / step_s / peak, breakdown={**est.breakdown, **extra})


def packed_attention_cv(dist: SeqLenDist, seq_len: int) -> float:
    """Coefficient of variation of one packed sequence's attention work (the sum of its documents' squared lengths)
    over sequences of ``seq_len`` tokens: the renewal-reward central limit theorem with reward L^2 per document of
    length L (Ross, "Stochastic Processes", Thm. 3.6.2 / its CLT corollary): Var = (s / E[L]) Var(L^2 - r L), r =
    E[L^2] / E[L], over the pieces ``dist.split_at(seq_len)``; mean = s r."""
    d = dist.split_at(seq_len)
    L = d.lengths.astype(float)
    mu, m2 = float(d.weights @ L), float(d.weights @ L ** 2)
    r = m2 / mu
    var = (seq_len / mu) * float(d.weights @ (L ** 2 - r * L - (m2 - r * mu)) ** 2)
    return math.sqrt(var) / (seq_len * r)


def _microbatch_s(est: Estimate) -> float:
    """Per-micro-batch time of the slowest pipeline rank."""
    return max(s.time_per_microbatch_s for s in est.stages)


def packed_estimate(model: ModelSpec, cluster: Cluster, cfg: RunConfig, dist: SeqLenDist,
                    check: bool = True) -> LengthAwareEstimate:
    """``cfg`` over packed documents of ``dist``: ``estimate`` with attention per document (``packed_doc_len``)
    and the data-parallel wait for the rank whose packed sequences hold the most attention work
    (``packed_attention_cv`` -> ``data_parallel.packed_wait_s``, in the step's breakdown as ``dp_imbalance_s``)."""
    fixed = estimate(model, cluster, cfg.with_(packed_doc_len=0.0, packed_attention_cv=0.0), check=check)
    packed = packed_config(cfg, dist)
    est = estimate(model, cluster, packed, check=False)
    return LengthAwareEstimate(estimate=est, fixed=fixed, packing=True, mean_len=dist.split_at(cfg.seq_len).mean_len,
                               packed_doc_len=packed.packed_doc_len,
                               imbalance_s=est.breakdown.get("dp_imbalance_s", 0.0),
                               useful_token_share=1.0)


def packed_config(cfg: RunConfig, dist: SeqLenDist) -> RunConfig:
    """``cfg`` training on ``dist``'s documents packed into its sequences."""
    return cfg.with_(packed_doc_len=dist.packed_doc_len(cfg.seq_len),
                     packed_attention_cv=packed_attention_cv(dist, cfg.seq_len))


def padded_lengths(dist: SeqLenDist, seq_len: int, micro_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, shares) of a micro-batch's padded length when ``micro_batch`` samples of ``dist`` (cut at
    ``seq_len``) are padded to the longest of them: P(max <= L) = F(L)^b."""
    d = dist.split_at(seq_len)
    cdf = np.cumsum(d.weights)
    cdf[-1] = 1.0
    below = np.concatenate([[0.0], cdf[:-1]])
    return d.lengths, cdf ** micro_batch - below ** micro_batch


def unpacked_estimate(model: ModelSpec, cluster: Cluster, cfg: RunConfig, dist: SeqLenDist,
                      check: bool = True) -> LengthAwareEstimate:
    """``cfg`` over samples of ``dist`` one per sequence, each micro-batch padded to its longest sample
    (:func:`padded_lengths`): the step time is the mixture of the steps at each padded length (every pipeline
    schedule's time is homogeneous of degree one in the per-micro-batch times, so mixing steps mixes micro-batch
    times for a step of equal micro-batches), memory the longest length's, tokens the samples' own (padding is
    not throughput). CP shards need lengths divisible by 2 cp: each length is padded up to it."""
    fixed = estimate(model, cluster, cfg, check=check)
    lengths, shares = padded_lengths(dist, cfg.seq_len, cfg.micro_batch_size)
    align = 2 * cfg.cp if cfg.cp > 1 else 1
    step = 0.0
    breakdown: dict[str, float] = {}
    peak_est = None
    for L, w in zip(lengths.tolist(), shares.tolist()):
        if w <= 0:
            continue
        Lp = int(math.ceil(L / align) * align)
        e = estimate(model, cluster, cfg.with_(seq_len=Lp, packed_doc_len=0.0), check=False)
        step += w * e.step_time_s
        for k, v in e.breakdown.items():
            breakdown[k] = breakdown.get(k, 0.0) + w * v
        peak_est = e if peak_est is None or e.peak_memory_bytes > peak_est.peak_memory_bytes else peak_est
    d = dist.split_at(cfg.seq_len)
    tokens = cfg.global_batch_size * d.mean_len
    mflops = cfg.global_batch_size * float(sum(w * model_flops_per_step(model, 1, int(L))
                                               for L, w in zip(d.lengths.tolist(), d.weights.tolist())))
    padded_mean = float(shares @ lengths)
    out = _restated(replace(peak_est, breakdown={}), model, cluster, cfg, step, tokens, mflops, breakdown)
    return LengthAwareEstimate(estimate=out, fixed=fixed, packing=False, mean_len=d.mean_len, packed_doc_len=0.0,
                               imbalance_s=0.0, useful_token_share=d.mean_len / padded_mean)


def length_aware_estimate(model: ModelSpec, cluster: Cluster, cfg: RunConfig, dist: SeqLenDist, packing: bool = True,
                          check: bool = True) -> LengthAwareEstimate:
    return (packed_estimate if packing else unpacked_estimate)(model, cluster, cfg, dist, check=check)


# ---------------------------------------------------------------------------------------------------------------
# Dynamic context parallelism (Megatron-Core hybrid CP)
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CPClass:
    """The documents one CP degree runs."""

    cp: int
    sample_share: float  # of documents
    token_share: float
    mean_len: float
    time_per_sample_s: float  # mean forward + backward time of one of its documents on its cp GPUs
    gpu_time_share: float  # of the step's GPU-seconds


@dataclass(frozen=True)
class DynamicCPEstimate:
    static: LengthAwareEstimate  # the same configuration with its static CP over packed documents
    step_time_s: float
    tokens_per_s: float
    mfu: float
    max_seqlen_per_rank: int
    classes: tuple[CPClass, ...]
    groups_per_step: float
    barrier_s: float  # per step: the barriers between groups
    peak_memory_bytes: float
    fits: bool

    @property
    def gain(self) -> float:
        """Static step time / dynamic step time."""
        return self.static.estimate.step_time_s / self.step_time_s

    def to_dict(self) -> dict:
        return {"step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
                "gain_over_static": self.gain, "max_seqlen_per_dp_cp_rank": self.max_seqlen_per_rank,
                "groups_per_step": self.groups_per_step, "barrier_s": self.barrier_s,
                "peak_memory_gib": self.peak_memory_bytes / 2 ** 30, "fits": self.fits,
                "classes": [c.__dict__ for c in self.classes],
                "static": self.static.to_dict()}


def dynamic_cp_problems(cfg: RunConfig) -> list[str]:
    """Why Megatron-Core cannot run ``cfg`` with hybrid context parallelism (megatron/training/arguments.py,
    validate_args: no pipeline parallelism, no Megatron-FSDP), empty when it can."""
    out = []
    if cfg.pp > 1:
        out.append("Megatron-Core's hybrid context parallelism runs without pipeline parallelism (validate_args "
                   "asserts pipeline_model_parallel_size == 1); use --pp 1")
    if cfg.zero_stage >= 2:
        out.append("Megatron-Core's hybrid context parallelism refuses Megatron-FSDP (ZeRO-2/3); use --zero 0 or 1")
    return out


def cp_degree_for(length, max_per_rank: int):
    """Megatron's ``BalancedCPScheduler.gpus_needed``: the smallest power of two c with length / c <=
    max_per_rank (at least 1)."""
    length = np.asarray(length, dtype=float)
    return np.maximum(1, 2 ** np.ceil(np.log2(np.maximum(length / max_per_rank, 1.0)))).astype(np.int64)


def dynamic_cp(model: ModelSpec, cluster: Cluster, cfg: RunConfig, dist: SeqLenDist,
               max_seqlen_per_rank: int | None = None) -> DynamicCPEstimate:
    """``cfg``'s TP and DP x CP GPUs running Megatron-Core's hybrid CP over the documents of ``dist`` (pieces of at
    most ``seq_len``), against the same configuration with its static CP over packed documents
    (:func:`packed_estimate`).

    Each document runs as its own micro-batch (hybrid_context_parallel_forward_backward: one forward and backward
    per sub-sample) on c = :func:`cp_degree_for` GPUs, its length padded to a multiple of 2c; its time is
    ``estimate``'s at that length and CP degree. The scheduler balances the documents' GPU-seconds over the dp x cp
    ranks (assumed perfect: its slack of 5-10% is not modelled), so the compute part of a step is the GPU-seconds of
    its documents over dp x cp; between groups of sub-samples every rank meets at a barrier over the DP x CP group,
    one group lasting about one longest document. Gradient reduction and the optimizer step are the static
    configuration's."""
    problems = dynamic_cp_problems(cfg)
    if problems:
        raise PlannerError(problems[0], source="--dynamic-cp")
    static = packed_estimate(model, cluster, cfg, dist, check=False)
    M = int(max_seqlen_per_rank or cfg.seq_len // cfg.cp)
    d = dist.split_at(cfg.seq_len)
    ranks = cfg.dp * cfg.cp
    degrees = cp_degree_for(d.lengths, M)
    if int(degrees.max()) > ranks:
        raise PlannerError(f"a {d.max_len}-token document needs CP {int(degrees.max())} at "
                           f"{M} tokens per rank, more than the {ranks} DP x CP ranks", source="--dynamic-cp",
                           fix="raise --max-seqlen-per-rank or use more GPUs")
    times = np.zeros(len(d.lengths))
    peak = 0.0
    for i, (L, c) in enumerate(zip(d.lengths.tolist(), degrees.tolist())):
        align = 2 * c if c > 1 else 1
        Lp = int(math.ceil(L / align) * align)
        one = cfg.with_(cp=c, seq_len=Lp, micro_batch_size=1, packed_doc_len=0.0,
                        global_batch_size=cfg.num_gpus // (cfg.tp * c))
        e = estimate(model, cluster, one, check=False)
        times[i] = _microbatch_s(e)
        peak = max(peak, e.peak_memory_bytes)
    docs_per_step = cfg.tokens_per_step / d.mean_len
    gpu_s = d.weights * degrees * times  # per document drawn
    compute_s = docs_per_step * float(gpu_s.sum()) / ranks
    longest = float(times[-1])
    groups = max(1.0, compute_s / longest) if longest > 0 else 1.0
    barrier = groups * float(comm.all_reduce_s(cluster, comm.place_group(ranks, cfg.tp, cluster.gpus_per_node),
                                               BARRIER_BYTES))
    b = static.estimate.breakdown
    step = compute_s + barrier + b["dp_comm_s"] + b["optimizer_s"]
    classes = []
    tok = d.weights * d.lengths
    for c in sorted(set(degrees.tolist())):
        sel = degrees == c
        classes.append(CPClass(cp=int(c), sample_share=float(d.weights[sel].sum()),
                               token_share=float(tok[sel].sum() / tok.sum()),
                               mean_len=float(tok[sel].sum() / d.weights[sel].sum()),
                               time_per_sample_s=float(d.weights[sel] @ times[sel] / d.weights[sel].sum()),
                               gpu_time_share=float(gpu_s[sel].sum() / gpu_s.sum())))
    mflops = model_flops_per_step(model, cfg.global_batch_size, cfg.seq_len, keys=static.packed_doc_len)
    n = cfg.num_gpus
    return DynamicCPEstimate(static=static, step_time_s=step, tokens_per_s=cfg.tokens_per_step / step,
                             mfu=mflops / step / (n * cluster.gpu.peak_flops), max_seqlen_per_rank=M,
                             classes=tuple(classes), groups_per_step=groups, barrier_s=barrier,
                             peak_memory_bytes=peak, fits=peak <= cluster.gpu.usable_memory_bytes)
