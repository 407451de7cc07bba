"""A pipeline over several GPU pools (``planner.specs.pools``): each pipeline stage, with its tensor- and
data-parallel replicas, on one pool; consecutive pools hold consecutive stages (pool 0 the first ones, as the
launcher's rank order puts them when pool 0's nodes come first).

This is the heterogeneous layout Metis (Um et al., USENIX ATC'24, Sec. 4) and HetPipe build on: a stage is
homogeneous, so its tensor-parallel collectives and its data-parallel gradient reduction stay inside one pool and
are costed by that pool's profile (``step.estimate``, rank by rank); only the pipeline sends between the last
stage of one pool and the first of the next cross the link between pools (``PooledCluster.link``: the file's, or
the slower network of the two). Per-rank forward, backward and weight-gradient times of different GPUs then go
through the schedule's own closed form, as uneven stages of one GPU type do; the step waits for the slowest rank's
exposed data-parallel communication and optimizer step. Nothing here re-derives a layer's cost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.cost import comm
from planner.cost.compute import model_flops_per_step
from planner.cost.schedule import get_schedule
from planner.cost.step import Estimate, StageEstimate, estimate, pipeline_message_bytes, step_breakdown
from planner.errors import PlannerError
from planner.specs.config import RunConfig
from planner.specs.model import ModelSpec
from planner.specs.pools import PooledCluster


def stage_gpus(cfg: RunConfig) -> int:
    """GPUs of one pipeline stage: TP x CP x DP."""
    return cfg.tp * cfg.cp * cfg.dp


def rank_pools(pooled: PooledCluster, cfg: RunConfig) -> tuple[int, ...]:
    """The pool of each pipeline rank: pool i holds (its GPUs / stage GPUs) consecutive ranks."""
    per = stage_gpus(cfg)
    out: list[int] = []
    for i, pool in enumerate(pooled.pools):
        out += [i] * (pool.num_gpus // per)
    return tuple(out)


def pooled_problems(pooled: PooledCluster, cfg: RunConfig) -> list[tuple[str, str]]:
    """Why ``cfg`` cannot run over the pools as whole stages, as (option, message)."""
    out: list[tuple[str, str]] = []
    if cfg.num_gpus != pooled.num_gpus:
        out.append(("gpus", f"the pools hold {pooled.num_gpus} GPUs; plan for all of them (--gpus "
                            f"{pooled.num_gpus})"))
        return out
    per = stage_gpus(cfg)
    for pool in pooled.pools:
        if pool.num_gpus % per:
            out.append(("tp", f"pool {pool.name} ({pool.num_gpus} GPUs) does not hold whole stages of tp*cp*dp = "
                              f"{per} GPUs; use a stage size that divides every pool"))
    return out + _runtime_problems(cfg)


def _runtime_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """What neither a pipeline over pools nor replicas in every pool model: a schedule placing a stage and its
    mirror on one rank, activation offloading."""
    out = []
    if get_schedule(cfg.schedule).placement is not None:
        out.append(("schedule", f"{cfg.schedule} places a stage and its mirror on one rank, which is not modelled "
                                f"over pools; use 1f1b or interleaved-1f1b"))
    if cfg.offload_layers or cfg.offload_modules:
        out.append(("offload_layers", "activation offloading over pools is not modelled; drop it"))
    return out


def rank_times(stages) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank, per micro-batch: F, B with recomputation, and W, as ``step.estimate`` composes them."""
    return (np.array([s.fwd_s for s in stages]),
            np.array([s.bwd_s - s.bwd_weight_s + s.recompute_s for s in stages]),
            np.array([s.bwd_weight_s for s in stages]))


@dataclass(frozen=True)
class PooledEstimate:
    """The estimate of a pipeline over pools, with each rank's pool and the pipeline sends between pools."""

    estimate: Estimate
    rank_pools: tuple[int, ...]
    boundary_send_s: tuple[float, ...]  # per rank: the send to the next rank when it is in another pool (else 0)
    memory_limits_bytes: tuple[float, ...]  # per rank: its pool's usable memory
    stage_gpus: int = 1  # GPUs of one stage (TP x CP x DP): rank r's GPUs are [r x stage_gpus, (r + 1) x ...)
    #: per rank, per micro-batch: (F, B with recomputation, W) as the schedule composes them, the sends between
    #: pools included (what ``simulate.simulate_schedule`` takes to play the same pipeline)
    rank_times_s: tuple[tuple[float, float, float], ...] = ()
    pipeline_s: float = 0.0  # the schedule's closed form over ``rank_times_s``

    def to_dict(self, pooled: PooledCluster) -> dict:
        return {"stage_gpus": self.stage_gpus,
                "pools": [{"name": p.name, "profile": p.cluster.name, "gpu": p.cluster.gpu.name, "nodes": p.nodes,
                           "gpus": p.num_gpus, "stage_gpus": self.stage_gpus,
                           "ranks": [r for r, q in enumerate(self.rank_pools) if q == i]}
                          for i, p in enumerate(pooled.pools)],
                "rank_pools": [pooled.pools[q].name for q in self.rank_pools],
                "boundary_send_s": list(self.boundary_send_s),
                "memory_limit_gib": [x / 2**30 for x in self.memory_limits_bytes]}


def pooled_estimate(model: ModelSpec, pooled: PooledCluster, cfg: RunConfig) -> PooledEstimate:
    """Step time, throughput and per-rank memory of ``cfg`` over the pools (see the module docstring).

    Per rank r on pool q(r): F, B and W as ``step.estimate`` gives them with pool q(r)'s profile; where ranks r and
    r + 1 (with virtual stages also p - 1 and 0, whose chunks hand over) sit in different pools, the send of the
    boundary activation (forward, charged to r) and of its gradient (backward, charged to r + 1) takes the link
    between them instead of the pool's own network (alpha-beta, ``comm.link_send_s``). The schedule's closed
    form (``Schedule.time``) composes the ranks; data-parallel exposure and the optimizer step are per rank."""
    problems = pooled_problems(pooled, cfg)
    if problems:
        option, message = problems[0]
        raise PlannerError(message, source=f"--{option.replace('_', '-')}")
    pools = rank_pools(pooled, cfg)
    p, v, m = cfg.pp, cfg.vpp, cfg.num_microbatches
    per_pool = {q: estimate(model, pooled.pools[q].cluster, cfg) for q in sorted(set(pools))}
    rows: list[StageEstimate] = [per_pool[q].stages[r] for r, q in enumerate(pools)]
    F, B, W = rank_times(rows)
    msg = float(pipeline_message_bytes(model, cfg))
    boundary = [0.0] * p
    for r in range(p):
        nxt = r + 1 if r + 1 < p else (0 if v > 1 else None)
        if nxt is None or pools[nxt] == pools[r]:
            continue
        link_s = float(comm.link_send_s(pooled.link(pools[r], pools[nxt]), msg))
        boundary[r] = link_s
        # the send the pool's own estimate charged (its network; a TP re-gather after it stays as it was)
        for rank in (r, nxt):
            own = pooled.pools[pools[rank]].cluster
            spans = comm.pipeline_spans_nodes(own, cfg.tp, cfg.cp, cfg.dp, cfg.pp)
            delta = link_s - float(comm.p2p_s(own, spans, msg))
            if rank == r:
                F[rank] += delta
            else:
                B[rank] += delta
    sched = get_schedule(cfg.schedule)
    pipe = sched.time(F, B, W, m, v)
    pipe_s, bubble_s = float(pipe.total_s), float(pipe.bubble_s)
    dp_exposed = max(s.dp_exposed_s for s in rows)
    opt_s = max(s.optimizer_s for s in rows)
    step = pipe_s + dp_exposed + opt_s
    limits = tuple(pooled.pools[q].cluster.gpu.usable_memory_bytes for q in pools)
    ratios = [s.peak_memory_bytes / lim for s, lim in zip(rows, limits)]
    worst = int(np.argmax(ratios))
    passes = sched.passes(m)
    bott = int(np.argmax(F + B + W))
    b = rows[bott]
    send_extra = (F[bott] - b.fwd_s) + (B[bott] - (b.bwd_s - b.bwd_weight_s + b.recompute_s))
    mflops = model_flops_per_step(model, cfg.global_batch_size, cfg.seq_len)
    peak_flops = sum(pool.num_gpus * pool.cluster.gpu.peak_flops for pool in pooled.pools)
    # hardware FLOPs (model + recomputation) do not depend on the GPU: read them off any pool's estimate
    any_q = pools[0]
    hflops = per_pool[any_q].hfu * per_pool[any_q].step_time_s * cfg.num_gpus * \
        pooled.pools[any_q].cluster.gpu.peak_flops
    breakdown = step_breakdown(b, passes, bubble_s, dp_exposed, opt_s, extra_pp_s=send_extra)
    est = Estimate(step_time_s=step, tokens_per_s=cfg.tokens_per_step / step,
                   tflops_per_gpu=mflops / step / cfg.num_gpus / 1e12, mfu=mflops / step / peak_flops,
                   hfu=hflops / step / peak_flops, peak_memory_bytes=rows[worst].peak_memory_bytes,
                   memory_limit_bytes=limits[worst], fits=all(r <= 1.0 for r in ratios), breakdown=breakdown,
                   stages=tuple(replace(s, rank=r) for r, s in enumerate(rows)))
    return PooledEstimate(est, pools, tuple(boundary), limits, stage_gpus(cfg),
                          tuple(zip(F.tolist(), B.tolist(), W.tolist())), pipe_s)


# ---------------------------------------------------------------------------------------------------------------
# Data-parallel replicas over pools (Metis' uneven data parallelism): each pool runs whole pipeline replicas of one
# common layout, with its own number of micro-batches per replica
# ---------------------------------------------------------------------------------------------------------------
def slowest_link(pooled: PooledCluster):
    """The slowest hop a ring over every pool crosses: each pool's own network and the links between pools (the
    slowest-link rule for a group that spans pools)."""
    links = [p.cluster.inter_node for p in pooled.pools]
    links += [pooled.link(i, j) for i in range(len(pooled.pools)) for j in range(i + 1, len(pooled.pools))]
    return min(links, key=lambda x: x.bus_bandwidth_bytes_per_s)


def replica_counts(pooled: PooledCluster, cfg: RunConfig) -> tuple[int, ...]:
    """Pipeline replicas (TP x CP x PP GPUs each) of each pool."""
    per = cfg.tp * cfg.cp * cfg.pp
    return tuple(p.num_gpus // per for p in pooled.pools)


def replicas_problems(pooled: PooledCluster, cfg: RunConfig) -> list[tuple[str, str]]:
    """Why ``cfg``'s pipeline cannot be replicated inside every pool, as (option, message)."""
    per = cfg.tp * cfg.cp * cfg.pp
    out = [("pp", f"pool {p.name} ({p.num_gpus} GPUs) does not hold whole replicas of tp*cp*pp = {per} GPUs")
           for p in pooled.pools if p.num_gpus % per]
    return out + _runtime_problems(cfg)


@dataclass(frozen=True)
class ReplicaEstimate:
    """Uneven data parallelism over pools: the step (the slowest pool's), each pool's replicas, micro-batches per
    replica, step and estimate."""

    estimate: Estimate
    replicas: tuple[int, ...]
    microbatches: tuple[int, ...]  # per replica of each pool
    pool_steps_s: tuple[float, ...]
    pool_estimates: tuple[Estimate, ...]

    def to_dict(self, pooled: PooledCluster) -> dict:
        return {"pools": [{"name": p.name, "gpu": p.cluster.gpu.name, "replicas": r, "microbatches_per_replica": m,
                           "step_time_s": t, "peak_memory_gib": e.peak_memory_gib, "fits": e.fits}
                          for p, r, m, t, e in zip(pooled.pools, self.replicas, self.microbatches, self.pool_steps_s,
                                                   self.pool_estimates)],
                "step_time_s": self.estimate.step_time_s, "tokens_per_s": self.estimate.tokens_per_s,
                "mfu": self.estimate.mfu}


def pool_replica_step(model: ModelSpec, pooled: PooledCluster, cfg: RunConfig, pool: int,
                      microbatches: int) -> tuple[float, Estimate]:
    """Pool ``pool``'s step with ``microbatches`` per replica, and its estimate. Its replicas' pipelines run on the
    pool's own profile; their gradients are reduced (and, from ZeRO-1 on, their states sharded) over the replicas
    of every pool, a data-parallel group whose ring runs at :func:`slowest_link`; the pool's overlap window is its
    own backward (``step.estimate`` with that link as the network)."""
    n_dp = sum(replica_counts(pooled, cfg))
    c = pooled.pools[pool].cluster
    cfg_all = cfg.with_(num_gpus=cfg.tp * cfg.cp * cfg.pp * n_dp,
                        global_batch_size=n_dp * microbatches * cfg.micro_batch_size)
    ring = estimate(model, replace(c, inter_node=slowest_link(pooled)), cfg_all)
    own = estimate(model, c, cfg_all)  # pipeline sends on the pool's own network
    st = own.stages
    F, B, W = rank_times(st)
    pipe = float(get_schedule(cfg.schedule).time(F, B, W, microbatches, cfg.vpp).total_s)
    step = pipe + max(s.dp_exposed_s for s in ring.stages) + max(s.optimizer_s for s in ring.stages)
    return step, ring


def replica_estimate(model: ModelSpec, pooled: PooledCluster, cfg: RunConfig,
                     microbatches: tuple[int, ...]) -> ReplicaEstimate:
    """The step of uneven data parallelism with ``microbatches`` per replica of each pool: every replica waits for
    the gradients of all, so the step is the slowest pool's; throughput is the global batch over it (the breakdown
    and per-rank rows are the slowest pool's)."""
    problems = replicas_problems(pooled, cfg)
    if problems:
        option, message = problems[0]
        raise PlannerError(message, source=f"--{option.replace('_', '-')}")
    reps = replica_counts(pooled, cfg)
    steps, ests = zip(*(pool_replica_step(model, pooled, cfg, i, m) for i, m in enumerate(microbatches)))
    step = max(steps)
    gbs = sum(r * m for r, m in zip(reps, microbatches)) * cfg.micro_batch_size
    tokens = gbs * cfg.seq_len
    mflops = model_flops_per_step(model, gbs, cfg.seq_len)
    peak_flops = sum(pool.num_gpus * pool.cluster.gpu.peak_flops for pool in pooled.pools)
    worst = int(np.argmax([e.peak_memory_bytes / e.memory_limit_bytes for e in ests]))
    slow = int(np.argmax(steps))
    e = ests[slow]
    est = Estimate(step_time_s=step, tokens_per_s=tokens / step, tflops_per_gpu=mflops / step / pooled.num_gpus / 1e12,
                   mfu=mflops / step / peak_flops, hfu=mflops / step / peak_flops * (e.hfu / e.mfu if e.mfu else 1.0),
                   peak_memory_bytes=ests[worst].peak_memory_bytes, memory_limit_bytes=ests[worst].memory_limit_bytes,
                   fits=all(x.fits for x in ests), breakdown=dict(e.breakdown),
                   stages=e.stages)
    return ReplicaEstimate(est, reps, tuple(microbatches), tuple(steps), tuple(ests))
