"""Memory-aware layer-to-stage partition with per-stage recomputation depth (AdaPipe-style).

``partition(model, cluster, cfg)`` returns ``cfg`` with ``layers_per_stage`` (pp * vpp entries, model order) and,
where recomputation helps, ``recompute="full"`` with ``recompute_layers_per_stage`` (how many layers of each stage
are fully recomputed; the others keep all their activations), chosen to minimise ``estimate(...).step_time_s``
under each GPU's memory limit (``hbm_bytes - memory_reserve_bytes``). Sources: the balanced partition of
Narayanan et al. 2021 Sec. 3 (first and last stages carry the embedding and the LM head); per-stage recomputation
as in AdaPipe (Sun et al. 2024, "AdaPipe: Optimizing Pipeline Parallelism with Adaptive Recomputation and
Partitioning", Sec. 4: recomputation chosen per stage, then stages re-balanced).

Method: a dynamic program, not an ILP. Per pipeline rank r, the cost model is linear in the rank's layers of each
type (dense, MoE) and in its recomputed layers: F_r, B_r, W_r and memory_r = a_r + sum_type (b_r n + c_r k) (+ one
layer's recompute workspace when k > 0). The coefficients are read off :func:`planner.cost.step.estimate` itself
(four probe configurations per layer type), so the partitioner never re-implements the cost model. A stage's
layer types follow from where it starts (a MoE model's first ``first_k_dense_layers`` are dense), so costs are
tabled per (rank, start, count). For a given memory, the cheapest recomputation of a stage is the least that
fits (recomputation only adds time), so each (rank, start, count) has one time t. Every schedule's time is
m max_r t_r + (a term that grows with the other ranks' t), so for each candidate bottleneck time ``cap`` (the
finitely many t values, in increasing order) a min-plus DP over ranks (state: layers placed so far) finds the
split with t_r <= cap and the least total time, starting from the least feasible cap (a min-max DP over the same
states); candidates stop once m * cap exceeds the best schedule time found (or after ``MAX_CAPS``).
The DP is O(p L^2) per cap with numpy (L layers): tenths of a second for 126 layers on 16 ranks. An ILP would
need CBC's branch and bound over the same integer grid for no better answer, since the problem is separable by
rank along the layer order. Each rank's layers go to its v chunks as evenly as possible. The best split (and its
recomputation) is checked with ``estimate`` (adding recomputation where the linear model was optimistic) and kept
only if it fits and beats the input; ties keep the input. Deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.cost.schedule import get_schedule
from planner.cost.step import estimate, kinds_before
from planner.cost.validity import config_problems
from planner.specs.config import RunConfig, even_layer_split
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec

#: fewest layers a stage may hold (launchers do not accept empty pipeline stages)
MIN_LAYERS_PER_STAGE = 1
#: how many rounds of "add one recomputed layer to the ranks still over memory" the final check may take
REPAIR_ROUNDS = 8
#: most bottleneck-time candidates the DP walks through above the least feasible one (bounds the run time; the
#: walk usually stops far earlier, once m x cap exceeds the best schedule time found)
MAX_CAPS = 64


@dataclass(frozen=True)
class _TypeRates:
    """Per-rank slopes of one layer type (dense or MoE): per layer held (n) and per layer recomputed (k)."""

    fn: np.ndarray
    bn: np.ndarray
    wn: np.ndarray
    memn: np.ndarray
    fk: np.ndarray
    bk: np.ndarray
    memk: np.ndarray  # negative: memory saved per recomputed layer


@dataclass(frozen=True)
class _Rates:
    """Per-rank linear cost model: value = base + sum over layer types of (n * per-layer + k * per-recomputed),
    plus the recompute workspace when any layer of the rank is recomputed."""

    f0: np.ndarray
    b0: np.ndarray
    w0: np.ndarray
    mem0: np.ndarray
    mem_jump: np.ndarray
    kinds: tuple[_TypeRates, ...]  # per ModelSpec.layer_kinds


def _probe(model: ModelSpec, cluster: Cluster, cfg: RunConfig, n: int, k: int | None):
    s = cfg.num_stages
    changes = dict(layers_per_stage=(n,) * s)
    if k is not None:
        changes.update(recompute="full", recompute_num_layers=None, recompute_layers_per_stage=(k,) * s)
    est = estimate(model, cluster, cfg.with_(**changes), check=False)
    st = est.stages
    f = np.array([x.fwd_s for x in st])
    b = np.array([x.bwd_s - x.bwd_weight_s + x.recompute_s for x in st])
    w = np.array([x.bwd_weight_s for x in st])
    mem = np.array([x.peak_memory_bytes for x in st])
    return f, b, w, mem


def _type_rates(model: ModelSpec, cluster: Cluster, cfg: RunConfig, per_stage_recompute: bool):
    """Probes with every stage holding 1 and 2 layers of one type (so a per-layer constant such as ZeRO-3's
    gathered layer lands in the base, not the slope), and with 2 layers of which 1 or 2 are recomputed."""
    v = cfg.vpp
    k0 = 0 if per_stage_recompute else None
    f1, b1, w1, m1 = _probe(model, cluster, cfg, 1, k0)
    f2, b2, w2, m2 = _probe(model, cluster, cfg, 2, k0)
    fn, bn, wn, memn = (f2 - f1) / v, (b2 - b1) / v, (w2 - w1) / v, (m2 - m1) / v
    base = (f1 - fn * v, b1 - bn * v, w1 - wn * v, m1 - memn * v)
    zero = np.zeros_like(f1)
    if per_stage_recompute:
        fa, ba, _, ma = _probe(model, cluster, cfg, 2, 1)
        fb, bb, _, mb = _probe(model, cluster, cfg, 2, 2)
        fk, bk, memk = (fb - fa) / v, (bb - ba) / v, (mb - ma) / v
        jump = np.maximum(0.0, ma - memk * v - m2)
    else:
        fk = bk = memk = jump = zero
    return base, jump, _TypeRates(fn, bn, wn, memn, fk, bk, memk)


def _rates(model: ModelSpec, cluster: Cluster, cfg: RunConfig, per_stage_recompute: bool) -> _Rates:
    """Read the per-rank linear model off the cost model, for each of the model's kinds of layer separately (dense
    and MoE, or global and sliding-window attention): the probes use the model with every layer of one kind
    (``ModelSpec.uniform``), then of the next."""
    variants = [model.uniform(k) for k in range(len(model.layer_kinds))] if len(model.layer_kinds) > 1 else [model]
    probed = [_type_rates(x, cluster, cfg, per_stage_recompute) for x in variants]
    (f0, b0, w0, mem0), jump, _ = probed[0]
    for (_, _, _, mem0_k), jump_k, _ in probed[1:]:  # ZeRO-3's largest layer, the workspace: the largest kind's
        mem0, jump = np.maximum(mem0, mem0_k), np.maximum(jump, jump_k)
    return _Rates(f0, b0, w0, mem0, jump, tuple(r for _, _, r in probed))


def _rank_costs(model: ModelSpec, cfg: RunConfig, rates: _Rates, limit: float, recompute: bool,
                counts: np.ndarray | None = None):
    """Per rank r, stage start a (layers before it) and layer count n (those of ``counts``, default 0..L): the least
    recomputation K that fits in memory and the rank's time t = F + B + W per micro-batch (an array [r, a, n], inf
    where nothing fits), and a function giving (F, B, W, K) at one (r, a, n). The kinds of a stage's layers follow
    from their positions (``ModelSpec.kind_index``: dense below ``first_k_dense_layers``, MoE above; or the
    attention pattern); step.py recomputes a stage's first layers. With virtual stages a rank's chunks are not
    contiguous, so its layers count as a MoE model's majority type, or in proportion to the attention pattern."""
    p, L = cfg.pp, model.num_layers
    a = np.arange(L + 1, dtype=float)[:, None]
    n = (np.arange(L + 1) if counts is None else np.asarray(counts)).astype(float)[None, :]
    n_kinds = len(model.layer_kinds)
    # layers of each kind in a stage of n layers starting at a: independent of a (one row, broadcast over a) unless
    # the model has kinds by position
    if n_kinds == 1:
        per_kind = [n]
    elif cfg.vpp == 1:  # by position: each kind's layers in [a, a + n)
        before = kinds_before(model, L).astype(float)
        ai = a.astype(np.int64)
        end = np.minimum(ai + n.astype(np.int64), L)
        inside = ai + n <= L
        per_kind = [np.where(inside, before[k][end] - before[k][ai], 0.0) for k in range(n_kinds)]
        per_kind[0] = n - sum(per_kind[1:])
    elif model.is_moe and not model.layer_pattern and not model.moe_layer_pattern:  # leading dense layers: the
        # layers count as the model's majority kind
        per_kind = [n, 0 * n] if model.first_k_dense_layers * 2 > L else [0 * n, n]
    else:  # interleaved kinds: in proportion
        share = [model.kind_index.count(k) / L for k in range(n_kinds)]
        per_kind = [n * x for x in share[1:]]
        per_kind = [n - sum(per_kind)] + per_kind
    # all ranks at once: per-rank rates along a leading axis
    kinds = rates.kinds

    def per_rank(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=float)[:, None, None]

    per_kind = [x[None] for x in per_kind]
    mem_none = per_rank(rates.mem0)
    for nk, r in zip(per_kind, kinds):
        mem_none = mem_none + nk * per_rank(r.memn)
    rec = [np.zeros((1, 1, 1)) for _ in kinds]
    if recompute:  # the least recomputation that fits: the kinds' layers in order, the last kind's beyond its count
        need = mem_none + per_rank(rates.mem_jump) - limit
        fits = mem_none <= limit
        with np.errstate(divide="ignore", invalid="ignore"):
            for k, (nk, r) in enumerate(zip(per_kind, kinds)):
                saves = -per_rank(r.memk)
                if k < len(kinds) - 1:
                    rec[k] = np.where(saves > 0, np.minimum(nk, np.ceil(np.maximum(need, 0.0) / saves - 1e-9)), nk)
                    need = need - rec[k] * np.maximum(saves, 0.0)
                else:
                    rec[k] = np.where(saves > 0, np.ceil(np.maximum(need, 0.0) / saves - 1e-9),
                                      np.where(need > 0, nk + 1, 0.0))
                rec[k] = np.where(fits, 0.0, rec[k])
    k_all = sum(rec)
    mem = mem_none
    for kk, r in zip(rec, kinds):
        mem = mem + kk * per_rank(r.memk)
    mem = mem + np.where(k_all > 0, per_rank(rates.mem_jump), 0.0)
    ok = (mem <= limit * (1 + 1e-12)) & (rec[-1] <= per_kind[-1]) & (n <= L - a)[None]

    def f_b_w(r, ns, ks):
        """F, B, W of rank(s) r holding ns[k] layers of kind k, ks[k] of them recomputed."""
        f, b, w = rates.f0[r], rates.b0[r], rates.w0[r]
        for nk, x in zip(ns, kinds):
            f, b, w = f + nk * x.fn[r], b + nk * x.bn[r], w + nk * x.wn[r]
        for kk, x in zip(ks, kinds):
            f, b = f + kk * x.fk[r], b + kk * x.bk[r]
        return f, b, w

    f, b, w = f_b_w(np.arange(p)[:, None, None], per_kind, rec)
    t = np.where(ok, f + b + w, math.inf)
    shape = t.shape
    n_full = [np.broadcast_to(x, shape) for x in per_kind]
    k_full = [np.broadcast_to(x, shape) for x in rec]

    def at(r: int, start: int, count: int) -> tuple[float, float, float, int]:
        """(F, B, W, recomputed layers) of rank r holding ``count`` layers from ``start`` (count indexes counts)."""
        x = (r, start, count)
        fx, bx, wx = f_b_w(r, [y[x] for y in n_full], [y[x] for y in k_full])
        return float(fx), float(bx), float(wx), int(sum(y[x] for y in k_full))

    return t, at


@lru_cache(maxsize=64)
def _shift_tables(layers: int) -> tuple[np.ndarray, np.ndarray]:
    """For the DP's min-plus step: index l - n of every (l, n) pair, and which pairs have n <= l."""
    idx = np.arange(layers + 1)
    diff = idx[:, None] - idx[None, :]
    return np.clip(diff, 0, layers), diff >= 0


def _by_end(t: np.ndarray, layers: int, min_per_rank: int) -> np.ndarray:
    """Re-index rank costs [r, start a, count n] (counts 0..N) as [r, end l = a + n, n] for the DP (inf where
    n > l or n is below the minimum)."""
    gather, valid = _shift_tables(layers)
    counts = t.shape[2]
    out = t[:, gather[:, :counts], np.arange(counts)[None, :]]
    out[:, ~valid[:, :counts]] = math.inf
    out[:, :, :min_per_rank] = math.inf
    return out


@lru_cache(maxsize=64)
def _prev_index(layers: int) -> np.ndarray:
    """For every (end l, count n): l - n, or the index just past the DP's states (an inf sentinel) where n > l."""
    gather, valid = _shift_tables(layers)
    return np.where(valid, gather, layers + 1)


def _gather_prev(best: np.ndarray, layers: int, counts: int) -> np.ndarray:
    """best[l - n] for every end l and count n < ``counts``, inf where n > l (through an inf sentinel)."""
    return np.append(best, math.inf)[_prev_index(layers)[:, :counts]]


def _max_count(te: np.ndarray, cap: float) -> int:
    """The most layers any rank can hold within ``cap`` (costs grow with the count, so longer stages are out)."""
    within = np.flatnonzero(np.any(te <= cap, axis=(0, 1)))
    return int(within.max()) if len(within) else 0


def _min_max_time(te: np.ndarray, layers: int) -> float:
    """Min-max DP over ranks: the least bottleneck time max_r t_r of any split placing all ``layers``."""
    best = np.full(layers + 1, math.inf)
    best[0] = 0.0
    for r in range(te.shape[0]):
        best = np.min(np.maximum(_gather_prev(best, layers, te.shape[2]), te[r]), axis=1)
    return float(best[layers])


def _min_sum_split(te: np.ndarray, cap: float, layers: int) -> list[int] | None:
    """Min-plus DP over ranks: layer counts N_r (sum = layers, every t_r <= cap) with the least sum of t. Only
    counts up to the most any rank can hold within the cap are tried."""
    p = te.shape[0]
    counts = _max_count(te, cap) + 1
    best = np.full(layers + 1, math.inf)
    best[0] = 0.0
    choice = np.zeros((p, layers + 1), dtype=int)
    rows = np.arange(layers + 1)
    capped = np.where(te[:, :, :counts] <= cap, te[:, :, :counts], math.inf)
    for r in range(p):
        # new[l] = min over n <= l of best[l - n] + cost of n layers ending at l
        total = _gather_prev(best, layers, counts) + capped[r]
        choice[r] = np.argmin(total, axis=1)  # first minimum: deterministic
        best = total[rows, choice[r]]
    if not math.isfinite(best[layers]):
        return None
    out, rem = [], layers
    for r in reversed(range(p)):
        n = int(choice[r][rem])
        out.append(n)
        rem -= n
    return out[::-1]


def _spread(cfg: RunConfig, per_rank_n: list[int], per_rank_k: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rank totals -> per-stage counts (model order): each rank's layers over its v chunks as evenly as possible
    (the embedding's chunk 0 of the first stage and the head's last chunk get the smaller shares), recomputed
    layers filled chunk by chunk."""
    p, v = cfg.pp, cfg.vpp
    sched = get_schedule(cfg.schedule)
    layers = [0] * (p * v)
    recomp = [0] * (p * v)
    for r in range(p):
        base, extra = divmod(per_rank_n[r], v)
        chunks = [base + (1 if c < extra else 0) for c in range(v)]
        if r == 0:
            chunks.reverse()
        k_left = per_rank_k[r]
        for c in range(v):
            j = sched.stage_index(p, v, r, c)
            layers[j] = chunks[c]
            recomp[j] = min(chunks[c], k_left)
            k_left -= recomp[j]
    return tuple(layers), tuple(recomp)


def _walk_caps(te: np.ndarray, at, sched, m: int, v: int, layers: int):
    """The split of least schedule time: from the least feasible bottleneck time (min-max DP) up through the
    candidate caps while m * cap can still beat the best time found. Returns the best (split, recomputed layers)
    or None, and the largest cap the walk looked at (inf where it ran out of caps, so a longer list could have
    changed it)."""
    caps = np.unique(te[np.isfinite(te)])
    lowest = _min_max_time(te, layers)
    if not math.isfinite(lowest):
        return None, math.inf
    best_cfg, best_time = None, math.inf
    first = int(np.searchsorted(caps, lowest))
    reached = math.inf
    for i in range(first, min(len(caps), first + MAX_CAPS)):
        reached = caps[i]
        if m * caps[i] >= best_time:
            break
        split = _min_sum_split(te, caps[i], layers)
        if split is None:
            continue
        starts = [sum(split[:r]) for r in range(len(split))]
        costs = [at(r, a, n) for r, (a, n) in enumerate(zip(starts, split))]
        total = float(sched.time([c[0] for c in costs], [c[1] for c in costs], [c[2] for c in costs], m,
                                 v).total_s)
        if total < best_time:
            best_time, best_cfg = total, (split, [c[3] for c in costs])
    else:
        if first + MAX_CAPS > len(caps):  # ran out of caps: a longer list could have continued the walk
            reached = math.inf
    return best_cfg, reached


def _candidate(model: ModelSpec, cfg: RunConfig, rates: _Rates, per_stage_recompute: bool,
               limit) -> RunConfig | None:
    """The DP's split (and per-stage recomputation) for ``cfg``'s pipeline under the per-rank linear model
    ``rates`` and memory ``limit`` (one number, or one per rank). Stage lengths are first limited to a few times
    the even share (a rank's time grows with its layers, so long stages only matter to caps above the shortest
    excluded stage's time); where the walk reached such a cap, the limit doubles, up to all layers, so the result
    is the unrestricted DP's."""
    m, L = cfg.num_microbatches, model.num_layers
    limit = np.asarray(limit, dtype=float).reshape(-1, 1, 1) if np.ndim(limit) else limit
    min_per_rank = MIN_LAYERS_PER_STAGE * cfg.vpp
    sched = get_schedule(cfg.schedule)
    increasing = all(np.all(np.asarray(x) >= 0) for r in rates.kinds
                     for x in (r.fn, r.bn, r.wn, r.fk, r.bk, r.memn))
    max_count = min(L, 2 * -(-L // cfg.pp) + 2) if increasing else L
    while True:
        t, at = _rank_costs(model, cfg, rates, limit, per_stage_recompute, np.arange(max_count + 1))
        best_cfg, reached = _walk_caps(_by_end(t, L, min_per_rank), at, sched, m, cfg.vpp, L)
        if max_count >= L:
            break
        longer, _ = _rank_costs(model, cfg, rates, limit, per_stage_recompute, np.array([max_count + 1]))
        if reached < longer.min():  # no cap the walk looked at admits a longer stage: the restriction was exact
            break
        max_count = min(L, 2 * max_count)
    if best_cfg is None:
        return None
    split, ks = best_cfg
    layers, recomp = _spread(cfg, split, ks)
    if per_stage_recompute and any(recomp):
        return cfg.with_(layers_per_stage=layers, recompute="full", recompute_num_layers=None,
                         recompute_layers_per_stage=recomp)
    if per_stage_recompute:  # no layer recomputed anywhere: that is no recomputation, and says so
        return cfg.with_(layers_per_stage=layers, recompute="none", recompute_num_layers=None,
                         recompute_layers_per_stage=None)
    return cfg.with_(layers_per_stage=layers)


def _repair(model: ModelSpec, cluster: Cluster, cfg: RunConfig, limit: float) -> RunConfig | None:
    """The linear model is exact for dense layers; where it is not (MoE layer types, max() terms), add one
    recomputed layer to each stage of a rank still over memory, a few rounds at most."""
    for _ in range(REPAIR_ROUNDS):
        est = estimate(model, cluster, cfg)
        if est.peak_memory_bytes <= limit:
            return cfg
        if cfg.recompute_layers_per_stage is None:
            return None
        sched = get_schedule(cfg.schedule)
        rec = list(cfg.recompute_layers_per_stage)
        changed = False
        for st in est.stages:
            if st.peak_memory_bytes > limit:
                for j in sched.stages_of(cfg.pp, cfg.vpp, st.rank):
                    if rec[j] < cfg.layers_per_stage[j]:
                        rec[j] += 1
                        changed = True
        if not changed:
            return None
        cfg = cfg.with_(recompute_layers_per_stage=tuple(rec))
    return cfg if estimate(model, cluster, cfg).peak_memory_bytes <= limit else None


def partition(model: ModelSpec, cluster: Cluster, cfg: RunConfig, *,
              memory_limit_bytes: float | None = None) -> RunConfig:
    """The layer partition and per-stage recomputation that minimise the estimated step time within memory, or
    ``cfg`` unchanged when it is invalid, nothing fits, or nothing beats it. (Virtual stages whose layers do not
    divide evenly, invalid without an explicit split, start from :func:`even_layer_split`.) ``memory_limit_bytes``:
    a tighter per-GPU budget than the GPU's own ``hbm_bytes - memory_reserve_bytes`` (``--max-memory-gib``)."""
    gpu_limit = cluster.gpu.usable_memory_bytes
    limit = gpu_limit if memory_limit_bytes is None else min(gpu_limit, memory_limit_bytes)
    if cfg.pp < 2 or get_schedule(cfg.schedule).placement is not None:
        return cfg  # DualPipe's mirrored stages: each stage's layers load two ranks, which the min-max DP does not
    start = cfg
    if config_problems(model, cluster, cfg) and cfg.layers_per_stage is None:
        # virtual stages need an explicit split when the layers do not divide evenly: start from the even one
        start = cfg.with_(layers_per_stage=even_layer_split(model.num_layers, cfg.num_stages))
    if config_problems(model, cluster, start):
        return cfg
    base = estimate(model, cluster, start)
    best, best_time = (start, base.step_time_s) if base.peak_memory_bytes <= limit else (cfg, math.inf)
    cfg = start
    # per-stage recomputation is expressed in "full" mode (unrecomputed layers keep everything), which is the
    # same memory as "none" and, with a fused attention kernel, as "selective"; keep the input's own mode too
    modes = [True] if cfg.recompute_layers_per_stage is not None else [False, True]
    for per_stage in modes:
        cand = _candidate(model, cfg, _rates(model, cluster, cfg, per_stage), per_stage, limit)
        if cand is None or config_problems(model, cluster, cand):
            continue
        cand = _repair(model, cluster, cand, limit)
        if cand is None:
            continue
        t = estimate(model, cluster, cand).step_time_s
        if t < best_time * (1 - 1e-9):
            best, best_time = cand, t
    return best


# ---------------------------------------------------------------------------------------------------------------
# Report: the partition against the even split
# ---------------------------------------------------------------------------------------------------------------
def best_uniform_recompute(model: ModelSpec, cluster: Cluster, cfg: RunConfig) -> RunConfig | None:
    """The even split's best single global recomputation setting that fits (none, selective, or full on the same
    number of layers of every stage), i.e. what one can do without a per-stage partition; None if none fits."""
    even = cfg.with_(layers_per_stage=None, recompute_layers_per_stage=None)
    choices = [even.with_(recompute="none", recompute_num_layers=None),
               even.with_(recompute="selective", recompute_num_layers=None)]
    most = -(-model.num_layers // cfg.num_stages)
    choices += [even.with_(recompute="full", recompute_num_layers=k) for k in range(1, most + 1)]
    best, best_time = None, math.inf
    for c in choices:
        if config_problems(model, cluster, c):
            continue
        e = estimate(model, cluster, c)
        if e.fits and e.step_time_s < best_time:
            best, best_time = c, e.step_time_s
    return best


def simulated_pipeline_s(model: ModelSpec, cluster: Cluster, cfg: RunConfig) -> tuple[float, float]:
    """(closed-form, simulated) pipeline time of a configuration's per-rank F, B, W: a check that a partition's
    gain is not an artefact of the closed form's equal-stage assumption."""
    from planner.cost.simulate import simulate_schedule

    e = estimate(model, cluster, cfg)
    f = [s.fwd_s for s in e.stages]
    b = [s.bwd_s - s.bwd_weight_s + s.recompute_s for s in e.stages]
    w = [s.bwd_weight_s for s in e.stages]
    m = cfg.num_microbatches
    closed = get_schedule(cfg.schedule).time(f, b, w, m, cfg.vpp).total_s
    return closed, simulate_schedule(cfg.schedule, f, b, w, m, cfg.vpp).total_s


def partition_report(model: ModelSpec, cluster: Cluster, cfg: RunConfig) -> str:
    """A markdown comparison (step time, then per pipeline rank: layers, recomputed layers, time per micro-batch,
    peak memory) of the even split with its best uniform recomputation against :func:`partition`'s result."""
    from planner.specs.hardware import GIB

    even = best_uniform_recompute(model, cluster, cfg)
    if even is None:
        return "The even split does not fit with any uniform recomputation setting."
    planned = partition(model, cluster, even)
    e0, e1 = estimate(model, cluster, even), estimate(model, cluster, planned)

    def rec(c: RunConfig, st) -> str:
        if c.recompute != "full":
            return c.recompute
        js = get_schedule(c.schedule).stages_of(c.pp, c.vpp, st.rank)
        if c.recompute_layers_per_stage is not None:
            return "+".join(str(c.recompute_layers_per_stage[j]) for j in js)
        return "+".join(str(n if c.recompute_num_layers is None else min(n, c.recompute_num_layers))
                        for n in st.layers)

    lim = e0.memory_limit_bytes / GIB
    lines = [
        f"{model.name} on {cfg.num_gpus} x {cluster.gpu.name}: tp {cfg.tp}, pp {cfg.pp}, vpp {cfg.vpp}, "
        f"dp {cfg.dp}, {cfg.schedule}, global batch {cfg.global_batch_size} x {cfg.seq_len} tokens, micro-batch "
        f"{cfg.micro_batch_size} ({cfg.num_microbatches} per step); memory limit {lim:.1f} GiB per GPU",
        "",
        f"- even split, best uniform recomputation ({even.recompute}"
        f"{'' if even.recompute_num_layers is None else f', {even.recompute_num_layers} layers per stage'}): "
        f"step {e0.step_time_s:.2f} s, MFU {e0.mfu:.1%}, bubble {e0.breakdown['bubble_s']:.2f} s",
        f"- planned partition + per-stage recomputation: step {e1.step_time_s:.2f} s, MFU {e1.mfu:.1%}, "
        f"bubble {e1.breakdown['bubble_s']:.2f} s ({(e0.step_time_s / e1.step_time_s - 1):+.1%} throughput)",
        "- pipeline time, closed form / discrete-event simulation of the same per-rank times: even "
        "{:.2f} / {:.2f} s, planned {:.2f} / {:.2f} s".format(*simulated_pipeline_s(model, cluster, even),
                                                             *simulated_pipeline_s(model, cluster, planned)),
        "",
        "| rank | even: layers | recomputed | ms / micro-batch | peak GiB | planned: layers | recomputed | "
        "ms / micro-batch | peak GiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a, b in zip(e0.stages, e1.stages):
        lines.append(
            f"| {a.rank} | {'+'.join(map(str, a.layers))} | {rec(even, a)} | {a.time_per_microbatch_s * 1e3:.1f} | "
            f"{a.peak_memory_bytes / GIB:.1f} | {'+'.join(map(str, b.layers))} | {rec(planned, b)} | "
            f"{b.time_per_microbatch_s * 1e3:.1f} | {b.peak_memory_bytes / GIB:.1f} |")
    lines += [
        "",
        "Why: under 1F1B rank r holds p - r micro-batches in flight, so a uniform recomputation setting sized for "
        "the fullest early rank wastes time on every later rank. The partition gives the early ranks fewer "
        "layers and more recomputation and the late ranks more layers and none, so no rank is over memory and "
        "the busiest rank's time per micro-batch drops; the LM head's 128K-vocabulary GEMM and loss keep the last "
        "rank lighter in layers.",
    ]
    return "\n".join(lines)
