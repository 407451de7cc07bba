"""Plans over several GPU pools (``planner.specs.pools``, costed by ``planner.cost.pooled``): which TP, DP and
micro-batch, how many pipeline stages each pool holds (all of its GPUs, in whole stages), and how many layers each
stage gets for its GPU's speed and memory.

The space: TP dividing every pool's node and the model's heads, with sequence parallelism; DP such that a stage of
TP x DP GPUs divides every pool, so the pipeline has one stage per TP x DP GPUs of each pool (at least two stages);
micro-batches dividing the per-replica batch; 1F1B, and interleaved 1F1B with two virtual stages; selective
recomputation, and per-stage full recomputation where the partition finds it pays; ZeRO-1 (the distributed
optimizer); CP and EP 1. A plan's layers per stage come from the partition's dynamic program (``partition``'s
min-max / min-plus DP over ranks) with each rank's linear cost model read off its own pool's profile and each
rank's own memory limit, so a pool of faster GPUs gets more layers and a pool of smaller ones fewer.

Branch and bound, exact within the space: every candidate's pipeline time is at least m x max_r t_r (the
partition's own bound), and max_r t_r at least the water level T at which the ranks' linear times, filled
continuously (t_r = c_r + n_r s_r, n_r >= 0, sum n_r = L), place every layer; candidates are evaluated in order of
that bound and the walk stops once the bound reaches the k-th best time found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from planner.cost.pooled import (PooledEstimate, ReplicaEstimate, pool_replica_step, pooled_estimate, pooled_problems,
                                  rank_pools, replica_counts, replica_estimate, replicas_problems)
from planner.cost.validity import config_problems, tp_splits_heads
from planner.errors import PlannerError
from planner.search.partition import _Rates, _TypeRates, _candidate, _rates
from planner.search.space import divisors
from planner.specs.config import RunConfig, even_layer_split
from planner.specs.model import ModelSpec
from planner.specs.pools import PooledCluster

#: schedules and virtual stages the space holds (a stage and its mirror on one rank cannot span two pools)
POOLED_SCHEDULES = (("1f1b", 1), ("interleaved-1f1b", 2))
#: bisection steps of the water-filling bound (relative precision 2^-60: below any time difference that matters)
_BISECTION_STEPS = 60


def pooled_rates(model: ModelSpec, pooled: PooledCluster, cfg: RunConfig, per_stage_recompute: bool) -> _Rates:
    """The partition's per-rank linear model with rank r's rows read off its own pool's profile."""
    pools = rank_pools(pooled, cfg)
    per = {q: _rates(model, pooled.pools[q].cluster, cfg, per_stage_recompute) for q in sorted(set(pools))}

    def pick(get) -> np.ndarray:
        return np.array([float(np.broadcast_to(get(per[q]), (cfg.pp,))[r]) for r, q in enumerate(pools)])

    kinds = tuple(_TypeRates(**{f.name: pick(lambda x, k=k, n=f.name: getattr(x.kinds[k], n))
                                for f in fields(_TypeRates)})
                  for k in range(len(per[pools[0]].kinds)))
    return _Rates(f0=pick(lambda x: x.f0), b0=pick(lambda x: x.b0), w0=pick(lambda x: x.w0),
                  mem0=pick(lambda x: x.mem0), mem_jump=pick(lambda x: x.mem_jump), kinds=kinds)


def balance_bound_s(rates: _Rates, layers: int) -> float:
    """The least max_r t_r of any split, relaxed: ranks filled continuously with layers at their cheapest kind's
    per-layer time s_r above their fixed time c_r, up to the water level T where sum_r (T - c_r)^+ / s_r = L."""
    c = rates.f0 + rates.b0 + rates.w0
    s = np.min([k.fn + k.bn + k.wn for k in rates.kinds], axis=0)
    if np.any(s <= 0):  # a rank whose time does not grow with its layers takes them all: only c_r of the others
        return float(np.max(c[s > 0])) if np.any(s > 0) else 0.0
    lo, hi = float(np.min(c)), float(np.max(c) + layers * np.max(s))
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2
        if np.sum(np.maximum(mid - c, 0.0) / s) >= layers:
            hi = mid
        else:
            lo = mid
    return lo


def partition_pooled(model: ModelSpec, pooled: PooledCluster, cfg: RunConfig) -> "PooledPlan":
    """The layer split (and per-stage recomputation) of least estimated step time that fits every rank's memory,
    from the even split and the partition DP with and without per-stage recomputation, with the even split's own
    time; raises where none fits."""
    start = cfg if cfg.layers_per_stage is not None else \
        cfg.with_(layers_per_stage=even_layer_split(model.num_layers, cfg.num_stages))
    best: tuple[RunConfig, PooledEstimate] | None = None
    even_s = None
    try:
        est = pooled_estimate(model, pooled, start)
        if est.estimate.fits:
            best, even_s = (start, est), est.estimate.step_time_s
    except PlannerError:
        pass
    limits = np.array([pooled.pools[q].cluster.gpu.usable_memory_bytes for q in rank_pools(pooled, cfg)])
    for per_stage in (False, True):
        cand = _candidate(model, start, pooled_rates(model, pooled, start, per_stage), per_stage, limits)
        if cand is None or any(config_problems(model, pool.cluster, cand) for pool in pooled.pools):
            continue
        est = pooled_estimate(model, pooled, cand)
        if est.estimate.fits and (best is None or est.estimate.step_time_s < best[1].estimate.step_time_s):
            best = (cand, est)
    if best is None:
        raise PlannerError(f"no layer split of {cfg.pp} stages fits the pools' memory", source="--cluster")
    return PooledPlan(best[0], best[1], even_s)


@dataclass(frozen=True)
class PooledPlan:
    config: RunConfig
    estimate: PooledEstimate
    even_split_step_s: float | None  # the same layout with layers split evenly (None: it does not fit)


@dataclass(frozen=True)
class PooledSearch:
    ranked: tuple[PooledPlan, ...]
    candidates: int
    evaluated: int


def _layout(pooled: PooledCluster, model: ModelSpec, tp: int, pp: int, schedule: str, vpp: int, global_batch: int,
            mb: int, seq_len: int, precision: str, recompute: str = "selective") -> RunConfig:
    """A configuration of the pools' spaces: SP with TP, ZeRO-1, the layers split evenly over the model chunks."""
    return RunConfig(num_gpus=pooled.num_gpus, tp=tp, pp=pp, vpp=vpp, schedule=schedule,
                     global_batch_size=global_batch, micro_batch_size=mb, seq_len=seq_len, sequence_parallel=tp > 1,
                     zero_stage=1, recompute=recompute, precision=precision,
                     layers_per_stage=even_layer_split(model.num_layers, pp * vpp) if pp > 1 else None)


def pooled_candidates(model: ModelSpec, pooled: PooledCluster, global_batch: int, seq_len: int,
                      precision: str = "bf16") -> list[RunConfig]:
    """Every configuration of the space (module docstring) that runs over the pools as whole stages."""
    n, L = pooled.num_gpus, model.num_layers
    node = min(p.cluster.gpus_per_node for p in pooled.pools)
    out: list[RunConfig] = []
    for tp in divisors(node):
        if not tp_splits_heads(model, tp):
            continue
        for dp in divisors(n // tp):
            per = tp * dp
            if any(p.num_gpus % per for p in pooled.pools) or global_batch % dp:
                continue
            pp = n // per
            if pp < 2 or pp > L:
                continue
            for mb in divisors(global_batch // dp):
                for schedule, vpp in POOLED_SCHEDULES:
                    if vpp > 1 and (pp * vpp > L or (global_batch // (dp * mb)) % pp):
                        continue
                    cfg = _layout(pooled, model, tp, pp, schedule, vpp, global_batch, mb, seq_len, precision)
                    if pooled_problems(pooled, cfg) or any(config_problems(model, p.cluster, cfg)
                                                           for p in pooled.pools):
                        continue
                    out.append(cfg)
    return out


def search_pooled(model: ModelSpec, pooled: PooledCluster, global_batch: int, seq_len: int, *,
                  precision: str = "bf16", top: int = 3) -> PooledSearch:
    """The ``top`` + 1 fastest plans of the space that fit (branch and bound on :func:`balance_bound_s`)."""
    cands = pooled_candidates(model, pooled, global_batch, seq_len, precision)
    if not cands:
        raise PlannerError(f"no layout runs over the pools of {pooled.name} as whole pipeline stages (at least two, "
                           f"each TP x DP GPUs dividing every pool, DP dividing the global batch {global_batch})",
                           source="--cluster", fix="use pools whose GPU counts share a divisor, or another batch")
    bounds = []
    for cfg in cands:
        rates = pooled_rates(model, pooled, cfg, False)
        bounds.append(cfg.num_microbatches * balance_bound_s(rates, model.num_layers))
    order = np.argsort(bounds, kind="stable")
    found: list[PooledPlan] = []
    evaluated = 0
    for i in order:
        kth = sorted(x.estimate.estimate.step_time_s for x in found)[top] if len(found) > top else math.inf
        if bounds[i] >= kth:
            break
        cfg = cands[i]
        evaluated += 1
        try:
            found.append(partition_pooled(model, pooled, cfg))
        except PlannerError:
            continue
    if not found:
        raise PlannerError(f"no layout fits the memory of the pools of {pooled.name}", source="--cluster",
                           fix="add GPUs, shorten --seq-len or lower --global-batch")
    ranked = tuple(sorted(found, key=lambda x: x.estimate.estimate.step_time_s)[:top + 1])
    return PooledSearch(ranked, len(cands), evaluated)


# ---------------------------------------------------------------------------------------------------------------
# Uneven data parallelism over pools (Metis): one pipeline layout replicated inside every pool, micro-batches per
# replica by pool speed
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaPlan:
    config: RunConfig  # the common layout (num_gpus, global batch and DP as one pool's view; see ``estimate``)
    estimate: ReplicaEstimate


def allocate_microbatches(model: ModelSpec, pooled: PooledCluster, cfg: RunConfig) -> ReplicaEstimate | None:
    """Micro-batches per replica of each pool (at least one) summing, over the replicas, to the global batch's, of
    least step (the slowest pool's): a dynamic program over the pools, states = micro-batches placed so far; each
    pool's step grows with its count, so its counts are tried upwards until they overflow. None where no count
    fits (memory) or none sums up."""
    reps = replica_counts(pooled, cfg)
    total = cfg.global_batch_size // cfg.micro_batch_size
    cache: dict[tuple[int, int], tuple[float, bool]] = {}

    def step(i: int, m: int) -> tuple[float, bool]:
        if (i, m) not in cache:
            t, est = pool_replica_step(model, pooled, cfg, i, m)
            cache[(i, m)] = (t, est.fits)
        return cache[(i, m)]

    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for i, r in enumerate(reps):
        rest = sum(reps[i + 1:])  # each later replica needs one micro-batch at least
        new: dict[int, tuple[float, tuple[int, ...]]] = {}
        for used, (t, choice) in best.items():
            m = 1
            while used + r * m + rest <= total:
                t_i, fits = step(i, m)
                if fits:
                    u, cand = used + r * m, (max(t, t_i), choice + (m,))
                    if u not in new or cand[0] < new[u][0]:
                        new[u] = cand
                m += 1
        best = new
    if total not in best:
        return None
    return replica_estimate(model, pooled, cfg, best[total][1])


def replica_candidates(model: ModelSpec, pooled: PooledCluster, global_batch: int, seq_len: int,
                       precision: str = "bf16") -> list[RunConfig]:
    """Layouts a pipeline replica of every pool can take: TP dividing every pool's node, TP x PP dividing every
    pool, every micro-batch size leaving one micro-batch per replica at least, 1F1B and interleaved 1F1B (2 virtual
    stages), selective or full recomputation, ZeRO-1; layers split evenly (replicas must hold the same layers)."""
    L = model.num_layers
    node = min(p.cluster.gpus_per_node for p in pooled.pools)
    smallest = min(p.num_gpus for p in pooled.pools)
    out = []
    for tp in divisors(node):
        if not tp_splits_heads(model, tp):
            continue
        for pp in divisors(smallest // tp):
            if pp > L or any(p.num_gpus % (tp * pp) for p in pooled.pools):
                continue
            n_dp = sum(p.num_gpus // (tp * pp) for p in pooled.pools)
            for mb in divisors(global_batch):
                if global_batch // mb < n_dp:
                    continue
                for schedule, vpp in POOLED_SCHEDULES if pp > 1 else POOLED_SCHEDULES[:1]:
                    if pp * vpp > L:
                        continue
                    for recompute in ("selective", "full"):
                        cfg = _layout(pooled, model, tp, pp, schedule, vpp, global_batch, mb, seq_len, precision,
                                      recompute)
                        probe = cfg.with_(num_gpus=tp * pp * n_dp, global_batch_size=n_dp * mb)
                        if replicas_problems(pooled, cfg) or any(config_problems(model, p.cluster, probe)
                                                                 for p in pooled.pools):
                            continue
                        out.append(cfg)
    return out


def search_replicas(model: ModelSpec, pooled: PooledCluster, global_batch: int, seq_len: int, *,
                    precision: str = "bf16") -> ReplicaPlan | None:
    """The fastest uneven-data-parallel plan that fits, or None. Branch and bound: a pool's step with m
    micro-batches per replica is at least m times its bottleneck rank's time per micro-batch a_i, so any
    allocation's step is at least M / sum_i (replicas_i / a_i) (M micro-batches in all, filled continuously)."""
    cands = replica_candidates(model, pooled, global_batch, seq_len, precision)
    bounds = []
    for cfg in cands:
        reps = replica_counts(pooled, cfg)
        rate = 0.0
        for i, r in enumerate(reps):
            _, est = pool_replica_step(model, pooled, cfg, i, 1)
            rate += r / max(s.time_per_microbatch_s for s in est.stages)
        bounds.append((global_batch // cfg.micro_batch_size) / rate)
    best: ReplicaPlan | None = None
    for i in np.argsort(bounds, kind="stable"):
        if best is not None and bounds[i] >= best.estimate.estimate.step_time_s:
            break
        got = allocate_microbatches(model, pooled, cands[i])
        if got is not None and (best is None or got.estimate.step_time_s < best.estimate.estimate.step_time_s):
            best = ReplicaPlan(cands[i], got)
    return best
