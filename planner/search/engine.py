"""Best-first branch and bound over the search space, with exact evaluation by the cost model.

Method (which part does what, and why):

1. :mod:`planner.search.space` enumerates every *group* of configurations (degrees, micro-batch, schedule, virtual
   stages, SP) over the divisor lattice; a group's members differ only in ZeRO stage (over all of DP or HSDP's
   shard groups) and recomputation.
2. :mod:`planner.search.bounds` computes, vectorized with numpy over all groups at once, a cheap lower bound on
   the step time of every member of each group (the pipeline's work over its ranks), and the groups are taken in
   that order, ``SCREEN_BATCH`` at a time.
3. A batch of groups is screened, vectorized: groups whose memory bound exceeds the limit are dropped whole; the
   others get a refined bound (the schedule over their exact per-rank pipeline times, raised by the data-parallel
   and optimizer floors of each (ZeRO stage, HSDP variant) column, the least of them) and a memory floor per column,
   and go onto a heap; when one comes off it is expanded (numpy) into its rows; rows of a column whose floors
   already exceed the memory limit or the K-th best are dropped, the others get their own bounds and go onto the
   heap.
4. Rows come off the heap in bound order and are evaluated exactly by ``planner.cost.step.estimate`` (the same
   function ``planner estimate`` uses). The search keeps the K best feasible plans and stops when the smallest bound
   left, among rows and unvisited groups, is larger than the K-th best exact value. Since no bound exceeds the
   exact value of its row (checked on every evaluated row and counted as ``bound_violations``), nothing pruned can
   beat what was kept: the result is the exact optimum of the space (ties broken by peak memory, then by a fixed
   order of the knobs, so the output is deterministic).
5. :mod:`planner.search.partition` (a dynamic program, run on the kept plans with a pipeline) proposes uneven
   layer splits and per-stage recomputation under each stage's memory limit; a proposal is kept only if its exact
   estimate is better.

Exhaustive enumeration is what makes optimality easy to argue; numpy makes it cheap to bound millions of rows; the
exact model is only called where a bound cannot decide.
"""

from __future__ import annotations

import heapq
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.cost.step import LAYER_COSTS, BatchCosts, Estimate, batch_costs, estimate
from planner.cost.validity import config_problems, recompute_modules_problem, reserved_sms_problem
from planner.errors import InfeasibleError, PlannerError
from planner.search.bounds import (column_floors, column_memory_floors, group_floors, group_memory_bound,
                                   group_tables, group_time_bound, layer_key_batch, refined_group_bounds,
                                   row_memory_bound, row_time_bound)
from planner.search.partition import partition
from planner.search.space import G, SearchSpace, Space, build_space, divisors, group_rows
from planner.specs.config import RunConfig
from planner.specs.hardware import GIB, Cluster
from planner.specs.model import MAX_CONFIG_INT, ModelSpec

OBJECTIVES = ("time", "memory")
#: groups expanded into rows at a time (the one with the smallest bound and the next ones still below the K-th
#: best); small enough that little work is done past the stopping point, large enough that numpy's per-call
#: overhead stays amortized
EXPANSION_BATCH = 16
#: relative slack when checking that a bound does not exceed the exact value (floating-point summation order)
BOUND_RTOL = 1e-9


def objective_key(e: Estimate, objective: str) -> tuple[float, float]:
    """How plans rank: (step time, peak memory) for the time objective, (peak memory, step time) for memory."""
    return (e.step_time_s, e.peak_memory_bytes) if objective == "time" else (e.peak_memory_bytes, e.step_time_s)


@dataclass(frozen=True)
class Candidate:
    """One evaluated configuration."""

    config: RunConfig
    estimate: Estimate

    def objective(self, objective: str) -> tuple[float, float]:
        return objective_key(self.estimate, objective)


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    alternatives: tuple[Candidate, ...]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ranked(self) -> tuple[Candidate, ...]:
        return (self.best,) + self.alternatives


def memory_limit_bytes(cluster: Cluster, max_memory_gib: float | None = None) -> float:
    """Usable memory per GPU: HBM less the profile's reserve, capped by the user's --max-memory-gib."""
    limit = cluster.gpu.usable_memory_bytes
    if max_memory_gib is not None:
        limit = min(limit, max_memory_gib * GIB)
    return limit


def _sort_key(cfg: RunConfig) -> tuple:
    """A fixed total order on configurations, for deterministic tie-breaking."""
    return (cfg.tp, cfg.pp, cfg.cp, cfg.cp_kind, cfg.ep, cfg.vpp, cfg.micro_batch_size, cfg.schedule,
            not cfg.sequence_parallel, cfg.zero_stage, cfg.dp_shard or 0, cfg.recompute, cfg.recompute_num_layers or 0,
            cfg.layers_per_stage or (), cfg.recompute_layers_per_stage or ())


#: relative slack of the pruning threshold: rows whose bound ties the K-th best value within it are evaluated
TIE_RTOL = 1e-12


class _TopK:
    """The K best feasible candidates by (objective, secondary, knob order)."""

    def __init__(self, k: int, objective: str):
        self.k, self.objective = k, objective
        self.items: list[tuple[tuple, Candidate]] = []

    def offer(self, cand: Candidate) -> None:
        key = cand.objective(self.objective) + (_sort_key(cand.config),)
        if len(self.items) == self.k and key >= self.items[-1][0]:
            return
        same = [i for i, (k, c) in enumerate(self.items) if c.config == cand.config or k[:2] == key[:2]]
        if same:  # the same plan, or one the cost model cannot tell apart: list it once, by the knob order
            i = same[0]
            if key < self.items[i][0]:
                self.items[i] = (key, cand)
                self.items.sort(key=lambda kv: kv[0])
            return
        self.items.append((key, cand))
        self.items.sort(key=lambda kv: kv[0])
        del self.items[self.k:]

    @property
    def threshold(self) -> float:
        """The K-th best objective value (inf until K are kept), widened by :data:`TIE_RTOL` so that a row tying
        it is still evaluated: its bound, computed over arrays by another sequence of floating-point operations, may
        exceed the equal exact value by an ulp, and the tie is broken by memory and the knob order."""
        return self.items[-1][0][0] * (1.0 + TIE_RTOL) if len(self.items) == self.k else math.inf

    def candidates(self) -> list[Candidate]:
        return [c for _, c in self.items]


def check_search_options(objective: str, top: int, max_memory_gib: float | None) -> None:
    """The options of a search that do not depend on the model: objective, runner-up count, memory cap."""
    if objective not in OBJECTIVES:
        raise PlannerError(f"unknown objective '{objective}'", source="--objective", fix="use time or memory")
    if top < 0:
        raise PlannerError(f"must be >= 0, got {top}", source="--top")
    if max_memory_gib is not None and not max_memory_gib > 0:
        raise PlannerError(f"must be > 0, got {max_memory_gib}", source="--max-memory-gib")


def search(model: ModelSpec, cluster: Cluster, num_gpus: int, global_batch: int, seq_len: int, *,
           objective: str = "time", top: int = 3, max_memory_gib: float | None = None,
           space: SearchSpace = SearchSpace(), refine_partition: bool = True) -> SearchResult:
    """The best plan (and the next ``top`` best) for training ``model`` on ``num_gpus`` GPUs of ``cluster``.

    Raises InfeasibleError (with the reason and the nearest change that would work) when nothing fits.
    """
    check_search_options(objective, top, max_memory_gib)
    for name, value in (("--gpus", num_gpus), ("--global-batch", global_batch), ("--seq-len", seq_len)):
        if value < 1:
            raise PlannerError(f"must be >= 1, got {value}", source=name)
        if value > MAX_CONFIG_INT:  # the walk lists divisors in O(sqrt(n)): larger values would run for hours
            raise PlannerError(f"must be <= {MAX_CONFIG_INT}, got {value}", source=name,
                               fix="no real training run is this large")
    if space.precision not in cluster.gpu.precisions():
        raise PlannerError(f"{cluster.gpu.name} has no {space.precision} tensor cores (its profile gives "
                           f"{', '.join(cluster.gpu.precisions())})", source="--precision",
                           fix="use a precision the GPU has, or another --cluster")
    problem = recompute_modules_problem(model, space.recompute_modules)
    if problem:
        raise PlannerError(problem, source="--recompute-modules")
    problem = reserved_sms_problem(cluster, space.comm_reserved_sms)
    if problem:
        raise PlannerError(problem, source="--comm-reserved-sms")
    if cluster.max_gpus and num_gpus > cluster.max_gpus:
        raise PlannerError(f"cluster {cluster.name} has at most {cluster.max_gpus} GPUs", source="--gpus",
                           fix=f"use --gpus <= {cluster.max_gpus}")
    t0, c0 = time.perf_counter(), time.process_time()
    limit = memory_limit_bytes(cluster, max_memory_gib)
    with _small_pages():
        sp = build_space(model, cluster, num_gpus, global_batch, seq_len, space)
        kept, stats = _branch_and_bound(model, cluster, sp, objective, top + 1, limit)
        if refine_partition:
            _refine_partitions(model, cluster, kept, limit, stats)
    stats["time_s"] = time.perf_counter() - t0
    stats["cpu_s"] = time.process_time() - c0  # this process's CPU time: what the wall time is on an idle machine
    stats["candidates_per_s"] = stats["candidates"] / stats["time_s"] if stats["time_s"] > 0 else 0.0
    stats["objective"] = objective
    stats["memory_limit_gib"] = limit / GIB
    if not kept.items:
        raise _infeasible(model, cluster, sp, num_gpus, global_batch, seq_len, limit, max_memory_gib, space, stats)
    ranked = kept.candidates()
    return SearchResult(best=ranked[0], alternatives=tuple(ranked[1:]), stats=stats)


@contextmanager
def _small_pages():
    """Numpy's transparent-huge-page advice off for the search, restored after. The search allocates and drops
    arrays of millions of groups; with the kernel's usual ``defrag = madvise`` each huge-page fault of an advised
    array compacts memory synchronously, which cost DeepSeek-V3's 1.5M-group search 0.7 s of kernel time against
    0.3 s with plain pages (measured here, CPU time 1.84 s -> 1.51 s). Numpy's own switch (``NUMPY_MADVISE_HUGEPAGE``
    at import, this function at run time); where numpy lacks it, nothing changes."""
    switch = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    if switch is None:
        yield
        return
    previous = switch(False)
    try:
        yield
    finally:
        switch(previous)


#: groups whose memory bound and refined time bound are computed at a time (vectorized), in the order of their
#: cheap bound: enough to amortize numpy's per-call overhead, few enough that little is computed for groups the
#: search never reaches
SCREEN_BATCH = 2048


class _AscendingOrder:
    """The indices of ``values`` in ascending order, ties by index (``np.argsort(values, kind="stable")``), sorted
    a block at a time as the search reaches them: a partition finds each block's values (all of those up to its
    largest, so ties stay whole and in index order) and only the block is sorted. The search reaches a few thousand
    of a large space's million-odd groups, so most of the full sort's time is saved; blocks grow fourfold."""

    def __init__(self, values: np.ndarray, first_block: int):
        self.values, self.block = values, max(1, first_block)
        self.sorted = np.zeros(0, dtype=np.int64)
        self.rest = np.arange(len(values))

    def __len__(self) -> int:
        return len(self.values)

    def head(self, stop: int) -> np.ndarray:
        """The first ``stop`` indices of the order (fewer at its end)."""
        while len(self.sorted) < stop and self.rest.size:
            v = self.values[self.rest]
            k = min(self.block, v.size)
            kth = np.partition(v, k - 1)[k - 1]
            take = v <= kth if not np.isnan(kth) else np.ones(v.size, dtype=bool)
            chosen = self.rest[take]
            self.sorted = np.concatenate([self.sorted, chosen[np.argsort(v[take], kind="stable")]])
            self.rest, self.block = self.rest[~take], self.block * 4
        return self.sorted[:stop]

    def __getitem__(self, i: int) -> int:
        return int(self.head(i + 1)[i])

    def slice(self, start: int, stop: int) -> np.ndarray:
        return self.head(stop)[start:]


def _branch_and_bound(model: ModelSpec, cluster: Cluster, sp: Space, objective: str, k: int,
                      limit: float, any_feasible: bool = False) -> tuple[_TopK, dict[str, Any]]:
    """Keep the k best feasible rows of the space (or, with ``any_feasible``, stop at the first one).

    Groups are taken in the order of a cheap bound on every group (the pipeline bound for the time objective, the
    memory bound for the memory objective) and screened SCREEN_BATCH at a time: the memory bound drops those that
    cannot fit; for time, the others get their refined bound (the schedule over their exact per-rank times, raised
    by the data-parallel and optimizer floors; vectorized over the batch). A group goes onto the heap with that
    bound; when it comes off it is expanded into its rows."""
    kept = _TopK(k, objective)
    stats: dict[str, Any] = {"candidates": sp.size(), "groups": len(sp.groups), "pruned_by_memory_bound": 0,
                             "pruned_by_objective_bound": 0, "exact_evaluations": 0, "invalid": 0,
                             "infeasible_evaluated": 0, "bound_violations": 0, "groups_expanded": 0,
                             "groups_refined": 0, "min_memory_bound_gib": None}
    if not len(sp.groups):
        return kept, stats
    tables = group_tables(model, cluster, sp)
    # the exact evaluations below take their layer costs from the batch evaluation of the space's layer keys the
    # bounds made (selective recomputation); under the other mode, from a one-key batch per key a row needs (the
    # cost model's batch functions are elementwise over keys, so a key's costs are the same in any batch: pinned
    # in tests/test_search_helpers.py), as a search evaluates a handful of rows of a few of its many keys
    other_costs: dict[int, BatchCosts] = {}
    per_group = sp.rows_per_group()
    by_time = objective == "time"
    if by_time:
        g_bound = group_time_bound(sp, tables)  # the memory bound only where the search gets to
    else:
        g_mem = group_memory_bound(sp, tables)
        stats["min_memory_bound_gib"] = float(g_mem.min()) / GIB
        g_bound = g_mem
    order = _AscendingOrder(g_bound, 4 * SCREEN_BATCH)
    # a heap of screened groups (by their refined bound) and one of rows (by the row's bound); unscreened groups
    # wait in `order`
    group_heap: list[tuple[float, int, int]] = []
    heap: list[tuple[float, int, tuple]] = []
    # refined pipeline floors and data-parallel floors of the groups reached (time objective)
    pipe_floor: dict[int, float] = {}
    dp_floor: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    col_floor: dict[int, np.ndarray] = {}  # per (ZeRO stage, HSDP variant) column: its rows' floor
    col_mem: dict[int, np.ndarray] = {}  # and their memory floor
    n_cols = sp.column_count
    gi, seq, skipped = 0, 0, 0
    while True:
        next_group = g_bound[order[gi]] if gi < len(order) else math.inf
        top_group = group_heap[0][0] if group_heap else math.inf
        top = heap[0][0] if heap else math.inf
        if min(next_group, top_group, top) > kept.threshold or (gi >= len(order) and not heap and not group_heap):
            break  # every bound left is above the K-th best exact value: nothing left can enter
        if gi < len(order) and next_group <= min(top_group, top):
            batch = order.slice(gi, gi + SCREEN_BATCH)
            gi += len(batch)
            if by_time:
                mem = group_memory_bound(sp, tables, batch)
                fits = mem <= limit
                stats["pruned_by_memory_bound"] += int(per_group[batch[~fits]].sum())
                batch = batch[fits]
                pipe = np.maximum(g_bound[batch], refined_group_bounds(sp, tables, batch))
                coef, const, opt = group_floors(model, cluster, sp, tables, batch)
                columns = column_floors(sp, pipe, coef, const, opt)
                bound = columns.min(axis=1)
                # the threshold only falls: the others can never enter (nor groups without rows: bound +inf)
                near = (bound <= kept.threshold) & np.isfinite(bound)
                skipped += int(per_group[batch[~near]].sum())
                stats["groups_refined"] += len(batch)
                keep = np.flatnonzero(near)
                mem_cols = column_memory_floors(sp, tables, batch[keep], n_cols)
                for i, j in enumerate(keep.tolist()):
                    g = int(batch[j])
                    pipe_floor[g], dp_floor[g] = float(pipe[j]), (coef[j], const[j])
                    col_floor[g], col_mem[g] = columns[j], mem_cols[i]
                    heapq.heappush(group_heap, (float(bound[j]), seq, g))
                    seq += 1
            else:
                fits = g_bound[batch] <= limit
                stats["pruned_by_memory_bound"] += int(per_group[batch[~fits]].sum())
                mem_cols = column_memory_floors(sp, tables, batch[fits], n_cols)
                for i, g in enumerate(batch[fits].tolist()):
                    col_mem[g] = mem_cols[i]
                    heapq.heappush(group_heap, (float(g_bound[g]), seq, g))
                    seq += 1
            continue
        if top_group <= top:
            # the group with the smallest bound, and with it the next ones that may still enter (expanded now
            # rather than one by one: their rows' bounds cost one numpy pass)
            ids = [heapq.heappop(group_heap)[2]]
            while group_heap and group_heap[0][0] <= kept.threshold and len(ids) < EXPANSION_BATCH:
                ids.append(heapq.heappop(group_heap)[2])
            stats["groups_expanded"] += len(ids)
            rows = sp.expand(np.array(ids, dtype=np.int64))
            floor = dpf = None
            # rows of a (ZeRO stage, HSDP variant) column that cannot fit, or (time) whose group-level floor is
            # above the K-th best, never enter
            at = np.repeat(np.arange(len(ids)), per_group[ids])
            col = rows.column
            fits = np.stack([col_mem[g] for g in ids])[at, col] <= limit
            stats["pruned_by_memory_bound"] += len(rows) - int(fits.sum())
            col_ok = fits
            if by_time:
                col_ok = fits & (np.stack([col_floor[g] for g in ids])[at, col] <= kept.threshold)
                skipped += int(fits.sum()) - int(col_ok.sum())
            rows = rows.take(np.flatnonzero(col_ok))
            if by_time:
                reps = np.bincount(at[col_ok], minlength=len(ids))
                floor = np.repeat(np.array([pipe_floor[g] for g in ids]), reps)
                dpf = (np.repeat(np.array([dp_floor[g][0] for g in ids]), reps, axis=0),
                       np.repeat(np.array([dp_floor[g][1] for g in ids]), reps, axis=0))
            tb = row_time_bound(sp, tables, rows, floor, dpf)
            if by_time:  # rows above the K-th best never enter (it only falls): no memory bound, no heap entry
                near = np.flatnonzero(tb <= kept.threshold)
                skipped += len(rows) - len(near)
                rows, tb = rows.take(near), tb[near]
            mem = row_memory_bound(sp, tables, rows)
            ok = mem <= limit
            stats["pruned_by_memory_bound"] += int((~ok).sum())
            rb = tb if by_time else mem
            keep = np.flatnonzero(ok & (rb <= kept.threshold))
            skipped += int(ok.sum()) - len(keep)
            for i in keep.tolist():
                heapq.heappush(heap, (float(rb[i]), seq, (int(rows.group[i]), int(rows.zero[i]), int(rows.rec[i]),
                                                          int(rows.hsdp[i]), float(tb[i]), float(mem[i]))))
                seq += 1
            continue
        g, z, r, h, tb_i, mem_i = heapq.heappop(heap)[2]
        cfg = sp.config(g, z, r, h)
        if config_problems(model, cluster, cfg):
            stats["invalid"] += 1
            continue
        key = int(tables.layer_key[g])
        if cfg.recompute == "selective":
            LAYER_COSTS.seed(model, cluster, cfg, tables.layer_costs, key)
        else:
            if key not in other_costs:
                other_costs[key] = batch_costs(model, cluster,
                                               layer_key_batch(sp, tables.layer_keys[key:key + 1], "none"))
            LAYER_COSTS.seed(model, cluster, cfg, other_costs[key], 0)
        est = estimate(model, cluster, cfg, check=False)
        stats["exact_evaluations"] += 1
        if est.step_time_s < tb_i * (1 - BOUND_RTOL) or est.peak_memory_bytes < mem_i * (1 - BOUND_RTOL):
            stats["bound_violations"] += 1
        if est.peak_memory_bytes > limit:
            stats["infeasible_evaluated"] += 1
            continue
        kept.offer(Candidate(cfg, est))
        if any_feasible:
            break
    # rows neither evaluated nor pruned by memory were pruned by the objective bound
    left = len(heap) + sum(int(per_group[g]) for _, _, g in group_heap) + skipped + \
        int(per_group.sum() - per_group[order.head(gi)].sum())
    stats["pruned_by_objective_bound"] = left
    if stats["min_memory_bound_gib"] is None and not kept.items:  # the reason an infeasible request gives
        stats["min_memory_bound_gib"] = float(group_memory_bound(sp, tables).min()) / GIB
    return kept, stats


def _refine_partitions(model: ModelSpec, cluster: Cluster, kept: "_TopK", limit: float, stats: dict) -> None:
    """Offer the uneven layer split and per-stage recomputation of ``partition`` for each kept pipelined plan."""
    stats["partitions_tried"] = stats["partitions_improved"] = 0
    for cand in kept.candidates():
        if cand.config.pp < 2:
            continue
        stats["partitions_tried"] += 1
        cfg = partition(model, cluster, cand.config, memory_limit_bytes=limit)
        if cfg == cand.config:
            continue
        est = estimate(model, cluster, cfg, check=False)
        stats["exact_evaluations"] += 1
        if est.peak_memory_bytes <= limit and est.step_time_s < cand.estimate.step_time_s:
            stats["partitions_improved"] += 1
            kept.offer(Candidate(cfg, est))


# ---------------------------------------------------------------------------------------------------------------
# Infeasible requests: say why, and what nearest change would work
# ---------------------------------------------------------------------------------------------------------------
#: how far --gpus is scaled up when looking for the nearest GPU count that fits (2x, 4x, ... up to 2**this)
MAX_GPU_DOUBLINGS = 8


def _infeasible(model: ModelSpec, cluster: Cluster, sp: Space, num_gpus: int, global_batch: int, seq_len: int,
                limit: float, max_memory_gib: float | None, space: SearchSpace, stats: dict) -> InfeasibleError:
    if not len(sp.groups) and any(v is not None for v in space.value_constraints):
        free = group_rows(model, cluster, num_gpus, global_batch, seq_len, space.without_value_constraints())
        if len(free):
            valid = "; ".join(f"{label} {','.join(map(str, np.unique(free[:, G[col]]).tolist()))}"
                              for label, col in (("TP", "tp"), ("PP", "pp"), ("CP", "cp"), ("EP", "ep"), ("VPP", "vpp"),
                                                 ("micro-batch", "mb")))
            return InfeasibleError(f"no valid configuration of {model.name} on {num_gpus} GPUs within the "
                                   f"constraints", source="plan", fix=f"widen them; valid here: {valid}")
    if len(sp.groups) and not sp.size():  # layouts exist, but none has a DP degree the asked shard sizes split
        return InfeasibleError(f"no layout of {model.name} on {num_gpus} GPUs has a data-parallel degree that the "
                               f"HSDP shard sizes {', '.join(map(str, space.dp_shard_values or ()))} divide into "
                               f"2 or more replicas", source="--dp-shard",
                               fix="use a shard size that divides the data-parallel degree, or add 'none'")
    if not len(sp.groups):
        simple = RunConfig(num_gpus=num_gpus, global_batch_size=global_batch, seq_len=seq_len)
        problems = config_problems(model, cluster, simple)
        why = problems[0][1] if problems else "no parallel layout of these GPUs divides the batch and the model"
        fix = _batch_fix(model, cluster, num_gpus, global_batch, seq_len, space)
        return InfeasibleError(f"no valid configuration of {model.name} on {num_gpus} GPUs: {why}", source="plan",
                               fix=fix)
    need = stats.get("min_memory_bound_gib")
    msg = (f"no configuration of {model.name} fits in {limit / GIB:.1f} GiB per GPU on {num_gpus} x "
           f"{cluster.gpu.name} at global batch {global_batch}, sequence {seq_len}")
    if need is not None:
        msg += f" (even with ZeRO-3, full recompute and micro-batch 1 a GPU needs at least {need:.1f} GiB)"
    fixes = []
    more = _nearest_gpu_count(model, cluster, num_gpus, global_batch, seq_len, limit, space)
    if more:
        fixes.append(f"use --gpus {more}")
    else:
        fixes.append(f"more than {num_gpus * 2 ** MAX_GPU_DOUBLINGS} GPUs or a GPU with more memory")
    if max_memory_gib is not None:
        fixes.append("raise --max-memory-gib")
    if seq_len > 2048:
        fixes.append("or a shorter --seq-len")
    return InfeasibleError(msg, source="plan", fix="; ".join(fixes))


#: how many candidate GPU counts, nearest first, are tried when none of the request's layouts divides the batch
MAX_GPU_COUNT_TRIES = 40


def _batch_fix(model: ModelSpec, cluster: Cluster, num_gpus: int, global_batch: int, seq_len: int,
               space: SearchSpace) -> str:
    """What to change when no layout of ``num_gpus`` divides the batch: the nearest GPU count (a divisor of the
    batch times a power of two, nearest in ratio) that has at least one valid layout."""
    candidates = {d * 2 ** i for d in divisors(global_batch) for i in range(0, 20) if d * 2 ** i <= 4 * num_gpus}
    candidates.discard(num_gpus)
    for n in sorted(candidates, key=lambda n: (abs(math.log(n / num_gpus)), n))[:MAX_GPU_COUNT_TRIES]:
        if cluster.max_gpus and n > cluster.max_gpus:
            continue
        if len(build_space(model, cluster, n, global_batch, seq_len, space).groups):
            return (f"the data-parallel degree must divide the global batch {global_batch}: use --gpus {n}, or a "
                    f"global batch with more factors in common with {num_gpus}")
    return (f"the data-parallel degree must divide the global batch {global_batch}: use a global batch with more "
            f"factors in common with {num_gpus}")


def _nearest_gpu_count(model: ModelSpec, cluster: Cluster, num_gpus: int, global_batch: int, seq_len: int,
                       limit: float, space: SearchSpace) -> int | None:
    """The smallest num_gpus * 2^i (i >= 1) on which some configuration fits (checked exactly)."""
    for i in range(1, MAX_GPU_DOUBLINGS + 1):
        n = num_gpus * 2 ** i
        if cluster.max_gpus and n > cluster.max_gpus:
            return None
        sp = build_space(model, cluster, n, global_batch, seq_len, space)
        if not len(sp.groups):
            continue
        t = group_tables(model, cluster, sp)
        if group_memory_bound(sp, t).min() > limit:
            continue
        kept, _ = _branch_and_bound(model, cluster, sp, "memory", 1, limit, any_feasible=True)
        if kept.items:
            return n
    return None


__all__ = ["Candidate", "SearchResult", "SearchSpace", "OBJECTIVES", "memory_limit_bytes", "search"]
