"""A small discrete-event simulator of one pipeline-parallel training step.

It plays a schedule (each rank's ordered list of forward ``F`` and backward ``B`` passes, one per micro-batch and
model chunk) with given per-rank, per-chunk op times, and reports when the step ends, how long each rank was busy,
and how many micro-batches of activations each rank held at its peak. The closed forms of
:mod:`planner.cost.schedule` are tested against it, and it handles what they do not: unequal stage times.

Execution rules (as a pipeline runtime executes a static schedule):
* a rank runs its ops one at a time, in its list order, each as soon as the rank is free and its input is there;
* ``F(mb, j)`` needs ``F(mb, j - 1)`` (plus a P2P transfer when stage j - 1 sits on another rank); ``B(mb, j)``
  needs ``B(mb, j + 1)`` (plus P2P), the last stage's ``B`` needs its own ``F``;
* weight gradients ``W``: schedules without a W split run W right after B (one fused backward). A schedule may
  list its ``W(mb, chunk)`` ops itself (ZB-V does); otherwise zero-bubble schedules (Qi et al. 2023, Sec. 3)
  defer each ``W(mb, j)`` after its ``B``: it runs in an idle gap of the rank
  that it fits in without delaying the next listed op, or earlier when the rank's activation budget (``cap``,
  chunk-micro-batches still waiting for their W) would otherwise be exceeded by the next F, and all leftovers run
  at the end of the rank's list (Qi et al.'s ZB-H1 / ZB-H2 placement).
Activation accounting (Qi et al.'s convention): a chunk-micro-batch holds its activations from the start of its F
until its W ends (its fused B when there is no split).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

#: tolerance for "fits in the gap" comparisons of float times (seconds, or unit-less in tests)
_EPS = 1e-12


@dataclass(frozen=True)
class OpRecord:
    kind: str  # "F", "B" or "W"
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimResult:
    total_s: float  # from the first forward to the last op of any rank
    busy_s: tuple[float, ...]  # per rank: time spent running ops
    peak_inflight: tuple[float, ...]  # per rank: chunk-micro-batches held at the peak, divided by v
    timeline: tuple[tuple[OpRecord, ...], ...]  # per rank, in execution order

    @property
    def bubble_s(self) -> float:
        """Idle time of the busiest rank: total - max busy (the closed forms' bubble for per-rank loads)."""
        return self.total_s - max(self.busy_s)

    def bubble_fraction(self) -> float:
        """Bubble over the ideal (busiest rank's busy) time, Narayanan et al.'s (p - 1)/m convention."""
        return self.bubble_s / max(self.busy_s)


def per_chunk(times: Sequence[float] | Sequence[Sequence[float]], p: int, v: int) -> list[list[float]]:
    """Per-rank times (split evenly over the rank's v chunks) or an explicit p x v table -> a p x v table."""
    if len(times) != p:
        raise ValueError(f"need {p} per-rank entries, got {len(times)}")
    out = []
    for t in times:
        if isinstance(t, (int, float)):
            out.append([float(t) / v] * v)
        else:
            if len(t) != v:
                raise ValueError(f"need {v} per-chunk entries, got {len(t)}")
            out.append([float(x) for x in t])
    return out


def microbatch_paths(p: int, m: int, v: int, stage_index: Callable[[int, int, int, int], int],
                     route: Callable[[int, int, int, int], Sequence[tuple[int, int]]] | None = None
                     ) -> list[tuple[tuple[int, int], ...]]:
    """Per micro-batch, the (rank, chunk) of each stage it passes, in model order: ``route``'s where micro-batches
    take different paths (DualPipe), else the one path ``stage_index`` lays out over p ranks of v chunks."""
    if route is not None:
        return [tuple(route(p, v, m, mb)) for mb in range(m)]
    where = {stage_index(p, v, r, c): (r, c) for r in range(p) for c in range(v)}
    if sorted(where) != list(range(p * v)):
        raise ValueError("stage_index must place each of the p*v stages exactly once")
    return [tuple(where[j] for j in range(p * v))] * m


def simulate(
    p: int, m: int, v: int,
    f_s, b_s, w_s,
    order: Sequence[Sequence[tuple[str, int, int]]],
    stage_index: Callable[[int, int, int, int], int],
    *, defer_w: bool = False, cap: Sequence[int] | None = None, p2p_s: float = 0.0,
    route: Callable[[int, int, int, int], Sequence[tuple[int, int]]] | None = None,
) -> SimResult:
    """Play a schedule. ``f_s``, ``b_s``, ``w_s``: per-rank times per micro-batch (all chunks together) or p x v
    tables; ``order[r]``: rank r's (kind, micro-batch, chunk) list with kind "F" or "B";
    ``stage_index(p, v, rank, chunk)``: the model-order stage a chunk is; ``cap[r]``: activation budget of rank r
    in chunk-micro-batches (deferred W only); ``p2p_s``: transfer time between stages on different ranks;
    ``route(p, v, m, mb)``: the (rank, chunk) of each stage micro-batch ``mb`` passes, in order, where
    micro-batches take different paths (DualPipe's two directions; default: the one path of ``stage_index``)."""
    F, B, W = per_chunk(f_s, p, v), per_chunk(b_s, p, v), per_chunk(w_s, p, v)
    paths = microbatch_paths(p, m, v, stage_index, route)
    # stage_of[(mb, rank, chunk)]: the position of that chunk on the micro-batch's path
    stage_of = {(mb, r, c): j for mb, path in enumerate(paths) for j, (r, c) in enumerate(path)}
    done_f: dict[tuple[int, int], float] = {}
    done_b: dict[tuple[int, int], float] = {}
    ptr = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    held = [0] * p
    peak = [0] * p
    pending: list[deque] = [deque() for _ in range(p)]
    records: list[list[OpRecord]] = [[] for _ in range(p)]
    caps = list(cap) if cap is not None else [len(paths[0]) * m] * p

    def run(r: int, kind: str, mb: int, c: int, ready: float, dur: float) -> float:
        start = max(free[r], ready)
        end = start + dur
        records[r].append(OpRecord(kind, mb, c, start, end))
        free[r] = end
        busy[r] += dur
        return end

    def run_w(r: int) -> None:
        mb, c = pending[r].popleft()
        run(r, "W", mb, c, 0.0, W[r][c])
        held[r] -= 1

    def ready_time(r: int, kind: str, mb: int, c: int) -> float | None:
        j = stage_of[(mb, r, c)]
        path = paths[mb]
        if kind == "W":
            return done_b.get((mb, j))
        if kind == "F":
            if j == 0:
                return 0.0
            prev = done_f.get((mb, j - 1))
            if prev is None:
                return None
            return prev + (p2p_s if path[j - 1][0] != r else 0.0)
        if j == len(path) - 1:
            return done_f.get((mb, j))
        nxt = done_b.get((mb, j + 1))
        if nxt is None:
            return None
        return nxt + (p2p_s if path[j + 1][0] != r else 0.0)

    explicit_w = [any(op[0] == "W" for op in o) for o in order]  # the schedule places its W's itself
    greedy_w = [defer_w and not e for e in explicit_w]
    remaining = sum(len(o) for o in order)
    while remaining:
        progressed = False
        for r in range(p):
            while ptr[r] < len(order[r]):
                kind, mb, c = order[r][ptr[r]]
                kind = "B" if kind == "b" else kind
                ready = ready_time(r, kind, mb, c)
                if ready is None:
                    break
                if kind == "F" and ptr[r] + 1 < len(order[r]) and order[r][ptr[r] + 1][0] == "b":
                    # an overlapped F&B pair starts when the input of its backward is there too
                    _, mb_b, c_b = order[r][ptr[r] + 1]
                    ready_b = ready_time(r, "B", mb_b, c_b)
                    if ready_b is None:
                        break
                    ready = max(ready, ready_b)
                if greedy_w[r]:
                    if kind == "F":
                        while held[r] >= caps[r] and pending[r]:
                            run_w(r)
                    while pending[r] and free[r] + W[r][pending[r][0][1]] <= ready + _EPS:
                        run_w(r)
                j = stage_of[(mb, r, c)]
                if kind == "F":
                    done_f[(mb, j)] = run(r, "F", mb, c, ready, F[r][c])
                    held[r] += 1
                    peak[r] = max(peak[r], held[r])
                elif kind == "W":
                    run(r, "W", mb, c, ready, W[r][c])
                    held[r] -= 1
                elif explicit_w[r]:
                    done_b[(mb, j)] = run(r, "B", mb, c, ready, B[r][c])
                elif defer_w:
                    done_b[(mb, j)] = run(r, "B", mb, c, ready, B[r][c])
                    pending[r].append((mb, c))
                else:
                    done_b[(mb, j)] = run(r, "B", mb, c, ready, B[r][c] + W[r][c])
                    held[r] -= 1
                ptr[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: order[r][ptr[r]] for r in range(p) if ptr[r] < len(order[r])}
            raise ValueError(f"schedule deadlocks: ranks wait on each other at {stuck}")
    for r in range(p):
        while pending[r]:
            run_w(r)
    total = max(free)
    return SimResult(total_s=total, busy_s=tuple(busy), peak_inflight=tuple(x / v for x in peak),
                     timeline=tuple(tuple(x) for x in records))


def simulate_schedule(name: str, f_s, b_s, w_s, m: int, v: int = 1, *, p2p_s: float = 0.0) -> SimResult:
    """Simulate a registered schedule (see :data:`planner.cost.schedule.SCHEDULES`) with per-rank times."""
    from planner.cost.schedule import get_schedule  # same layer; imported here to keep the modules independent

    sched = get_schedule(name)
    p = len(f_s)
    order = [sched.order(p, m, v, r) for r in range(p)]
    cap = [sched.w_cap(p, m, v, r) for r in range(p)] if sched.w_cap is not None else None
    return simulate(p, m, sched.chunks_per_rank(p, v), f_s, b_s, w_s, order, sched.stage_index,
                    defer_w=sched.defer_w, cap=cap, p2p_s=p2p_s, route=sched.route)
