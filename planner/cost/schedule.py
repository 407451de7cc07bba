"""Pipeline schedules: step time from per-rank micro-batch times, in-flight activations, and each schedule's rules.

Each schedule gives (a) a closed-form step time from per-rank F (forward), B (input gradient, incl. recompute) and
W (weight gradient) times per micro-batch, P2P folded into F and B by the caller; (b) the activations a rank holds
at its peak; (c) the constraints it needs; (d) each rank's op order, which :mod:`planner.cost.simulate` plays to
check (a) and (b) and to time unequal stages exactly.

Notation: p ranks r = 0..p-1, m micro-batches, v model chunks per rank, t_r = F_r + B_r + W_r (all chunks).
Closed forms (exact for equal stages, checked against the simulator in ``tests/test_schedule.py``):
* GPipe and 1F1B (Narayanan et al. 2021, Sec. 2.2): T = (m - 1) max_r t_r + sum_r t_r; equal stages:
  (m + p - 1) t, a bubble fraction (p - 1)/m.
* Interleaved 1F1B and breadth-first (Narayanan et al. 2021 Sec. 2.2; Lamy-Poirier 2022 Sec. 3): the fill and
  drain walk one chunk (t_r / v) per rank: T = m max_r t_r + (sum_r t_r - max)/v, a bubble fraction
  (p - 1)/(v m).
* ZB-H1 (Qi et al. 2023, Sec. 3.1): B's travel back without their W's, which fill the drain:
  T = m t + (p - 1)(F + B - W), the paper's bubble (p - 1)(T_F + T_B - T_W).
* ZB-H2 (Qi et al. 2023, Sec. 3.1): 2p - 1 warm-up forwards fill the first rank's wait, deferred W's the drain:
  T = m t + (p - 1)(F + max(0, B - 2W)). The paper's zero bubble also needs its post-validation of the optimizer
  step (iterations overlap, hiding the last rank's (p - 1) F wait); with a synchronous optimizer step that wait
  stays, so with F = B = W ZB-H2 times like ZB-H1 and only gains where B > 2W - F.
* ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", Sec. 6): two chunks per rank in a V
  (rank r holds stages r and 2p - 1 - r), W's placed by its static order: T = m t + (p - 1) max(B - W, B/2),
  half of ZB-H1's bubble for F = B = W, at 1F1B's peak memory.
* Breadth-first (Lamy-Poirier 2022): looped placement like interleaved, but every micro-batch runs a chunk before
  the next chunk starts, so it holds all m micro-batches (GPipe's memory) and, with ZeRO-3 / FSDP, gathers each
  chunk's weights once per step rather than once per micro-batch (``zero3_gathers_once_per_step``, used by
  ``planner.cost.step``): the sharded-DP traffic drops by m and overlaps the whole step.
* DualPipe (DeepSeek-V3 report Sec. 3.2.1; github deepseek-ai/DualPipe): m / 2 micro-batches enter at each end;
  rank r holds stage r and its mirror p - 1 - r (two copies of the stage weights per rank), runs DeepSeek's
  eight-step order, whose F&B pairs overlap one micro-batch's all-to-alls with the other's compute (the cost model's
  ``RunConfig.ep_comm_overlap``; here a pair waits for both inputs and costs F + B of compute). Per chunk, the
  fill / drain chain of p / 2 - 1 steps costs F + B + max(F, B) - 2W each (the simulator on DeepSeek's order; the
  report's bound (PP/2 - 1)(F&B + B_full - 3W) is W more per step); every rank holds PP + 1 stage-micro-batches.
  DualPipeV ("cut in half", torch's ScheduleDualPipeV) is the same order on ZB-V's V placement: a chain of p - 1
  steps, 2p + 1 chunk-micro-batches held.
The zero-bubble forms are exact (against the simulator's W placement) when W <= min(F, B), which every real layer
satisfies (W is half of the GEMM backward; B the other half plus attention backward and recomputation); for
unequal stages all forms are within about 10% of the simulator (``tests/test_schedule.py`` measures it).
In-flight micro-batches (activations held), in units of one micro-batch through all of a rank's layers:
* GPipe and breadth-first hold all m; 1F1B's rank r holds min(p - r, m) (Narayanan et al. 2021); counting a
  micro-batch until its W, ZB-H1 holds min(p, m) on every rank (Qi et al.: 1F1B's peak), ZB-H2 min(2p - 1, m);
* interleaved rank r warms up (p - r - 1) * 2 + (v - 1) * p + 1 chunk-micro-batches (Megatron's schedule),
  i.e. rank 0 holds p (1 + (p - 1)/(p v)) micro-batches' worth, Korthikanti et al. 2022 Sec. 4.2.3 (where the
  paper's "m" is the number of interleaved chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

#: (kind, micro-batch, chunk); kind "F", "B", "W", or "b": a B overlapped with the F before it (DualPipe's F&B pair,
#: which starts when the inputs of both are there)
Op = tuple[str, int, int]


@dataclass(frozen=True)
class PipelineTime:
    """Step time of a pipeline (numbers for one pipeline, arrays over a batch of them)."""

    total_s: float | np.ndarray  # from the first forward to the last backward of the step
    bubble_s: float | np.ndarray  # total - m x (busiest rank's per-micro-batch time)


def _default_stage_index(p: int, v: int, rank: int, chunk: int) -> int:
    """Megatron's placement: model stage j = chunk * p + rank."""
    return chunk * p + rank


@dataclass(frozen=True)
class Schedule:
    name: str
    description: str
    #: (per-rank F, B, W per micro-batch, m, v) -> PipelineTime; ranks along the last axis of F, B, W, which may
    #: hold many pipelines as rows (m and v then per row; ranks past a row's p are zeros, which add nothing)
    time: Callable[..., PipelineTime]
    #: (p, m, v, rank) -> micro-batches of activations the rank holds at its peak
    inflight: Callable[[int, int, int, int], float]
    #: (p, m, v) -> reason the schedule cannot run, or None
    check: Callable[[int, int, int], str | None]
    supports_vpp: bool = False
    #: (p, m, v, rank) -> the rank's F / B op order (played by planner.cost.simulate)
    order: Callable[[int, int, int, int], list[Op]] | None = None
    #: (p, v, rank, chunk) -> model-order stage index of that chunk
    stage_index: Callable[[int, int, int, int], int] = _default_stage_index
    #: weight gradients deferred (zero-bubble) rather than run with B
    defer_w: bool = False
    #: (p, m, v, rank) -> chunk-micro-batches a rank may hold before it must run a deferred W
    w_cap: Callable[[int, int, int, int], int] | None = None
    #: ZeRO-3 / FSDP gathers each chunk's weights once per step (all micro-batches run a chunk back to back)
    zero3_gathers_once_per_step: bool = False
    #: the schedule's name in torch.distributed.pipelining (torchtitan ``pipeline_parallel_schedule``), if any
    torch_name: str | None = None
    #: (p, v, rank) -> the model stages the rank holds, in its chunk order, where that is not one stage per chunk
    #: of ``stage_index`` (DualPipe: every rank holds two of the p stages, so each stage sits on two ranks)
    placement: Callable[[int, int, int], tuple[int, ...]] | None = None
    #: (p, v, m, micro-batch) -> the (rank, chunk) of each model stage the micro-batch passes, in model order,
    #: where micro-batches do not all take the one path ``stage_index`` lays out (DualPipe's two directions)
    route: Callable[[int, int, int, int], tuple[tuple[int, int], ...]] | None = None
    #: micro-batches one pass of a rank's per-micro-batch times stands for: 1, or 2 for DualPipe, whose rank times
    #: are one micro-batch of each direction through the rank's stage and its mirror
    microbatches_per_pass: int = 1
    #: its order pairs one micro-batch's forward with another's backward (DualPipe's F&B), so the batch-level MoE
    #: all-to-all overlap runs without virtual stages
    pairs_microbatches: bool = False
    #: a send's transfer may run under the next chunk's compute when the stack posts sends asynchronously
    #: (``RunConfig.overlap_p2p_comm``): Megatron-Core's interleaved schedule (schedules.py
    #: forward_backward_pipelining_with_interleaving with ``overlap_p2p_comm``; its 1F1B batches blocking sends)
    overlaps_p2p: bool = False
    #: ranks of one pipeline that hold each stage: 1, or 2 for DualPipe (stage r on rank r and on rank p - 1 - r);
    #: the copies join the stage's data-parallel group (gradients summed, ZeRO shards over them too)
    stage_copies: int = 1

    def stages_of(self, p: int, v: int, rank: int) -> tuple[int, ...]:
        """The model stages rank ``rank`` holds (its chunks, in order): ``placement``, else one per chunk."""
        if self.placement is not None:
            return self.placement(p, v, rank)
        return tuple(self.stage_index(p, v, rank, c) for c in range(v))

    def sends_overlap(self, overlap_p2p_comm: bool) -> bool:
        """Whether a pipeline send runs under the next chunk's compute: the stack posts sends asynchronously
        (``RunConfig.overlap_p2p_comm``) and this schedule runs that (:attr:`overlaps_p2p`)."""
        return bool(overlap_p2p_comm) and self.overlaps_p2p

    def passes(self, m):
        """How many times a step runs each rank's per-micro-batch F + B + W: m, or m / 2 for DualPipe's pairs."""
        return m / self.microbatches_per_pass if self.microbatches_per_pass != 1 else m

    def chunks_per_rank(self, p: int, v: int) -> int:
        """Model chunks a rank holds (the simulator's v): v, or two for DualPipe's mirrored stages."""
        return len(self.stages_of(p, v, 0))


# ---------------------------------------------------------------------------------------------------------------
# Closed-form step times
# ---------------------------------------------------------------------------------------------------------------
def _arrays(f, b, w, m) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """F, B, W as float arrays (ranks along the last axis), their per-rank totals t, and m broadcast to t's rows."""
    f, b, w = (np.asarray(x, dtype=float) for x in (f, b, w))
    t = f + b + w
    return f, b, w, t, np.asarray(m)


def _bottleneck_edge(t: np.ndarray, edge_terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(t of the first busiest rank, sum of ``edge_terms`` over the other ranks), per row."""
    k = np.argmax(t, axis=-1)
    others = np.arange(t.shape[-1]) != k[..., None]
    return np.take_along_axis(t, k[..., None], axis=-1)[..., 0], np.where(others, edge_terms, 0.0).sum(axis=-1)


def _time(total, m, tmax) -> PipelineTime:
    return PipelineTime(total, total - m * tmax)


def _flush_time(f, b, w, m, v) -> PipelineTime:
    """GPipe / 1F1B, Narayanan et al. 2021 Sec. 2.2: (m - 1) max t + sum t; (m + p - 1) t for equal stages."""
    f, b, w, t, m = _arrays(f, b, w, m)
    tmax = t.max(axis=-1)
    return _time((m - 1) * tmax + t.sum(axis=-1), m, tmax)


def _interleaved_time(f, b, w, m, v) -> PipelineTime:
    """Interleaved 1F1B / breadth-first, Narayanan et al. 2021 Sec. 2.2: bubble (p - 1)/(v m) of m t."""
    f, b, w, t, m = _arrays(f, b, w, m)
    tmax = t.max(axis=-1)
    return _time(m * tmax + (t.sum(axis=-1) - tmax) / np.asarray(v), m, tmax)


def _zb_h1_time(f, b, w, m, v) -> PipelineTime:
    """ZB-H1, Qi et al. 2023 Sec. 3.1: bubble (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W).

    Per-rank form: the fill walks the other ranks' F, the drain their B, each less the W that fills its slot:
    T = m max t + sum_{r != bottleneck} (F_r + B_r - W_r).
    """
    f, b, w, t, m = _arrays(f, b, w, m)
    tk, edge = _bottleneck_edge(t, f + b - np.minimum(np.minimum(w, f), b))
    return _time(m * tk + edge, m, tk)


def _zbv_time(f, b, w, m, v) -> PipelineTime:
    """ZB-V (Qi et al. 2024 Sec. 6) as its static order plays out: each fill / drain hop is one chunk (half a
    rank's layers), and where W is short the drain's B's outrun the W's placed between them:
    T = m max t + sum_{r != bottleneck} max(B_r - W_r, B_r / 2, F_r / 2) (per-rank F, B, W of both chunks);
    (p - 1) F / 2 for F = B = W, which Qi et al.'s post-validation of the optimizer step would also hide. Exact
    against the simulator when W <= F <= B (real layers: B adds attention backward and recomputation to the
    input-gradient GEMMs)."""
    f, b, w, t, m = _arrays(f, b, w, m)
    tk, edge = _bottleneck_edge(t, np.maximum(np.maximum(b - w, b / 2), f / 2))
    return _time(m * tk + edge, m, tk)


def _zb_h2_time(f, b, w, m, v) -> PipelineTime:
    """ZB-H2, Qi et al. 2023 Sec. 3.1: 2p - 1 warm-up forwards fill the start and deferred W's the end, which
    leaves the last rank's wait for its first input, (p - 1) F, plus (p - 1) max(0, B - 2W) where W's are too
    short to cover the drain. Per-rank form: T = m max t + sum_{r != bottleneck} (F_r + max(0, B_r - 2 W_r)).
    Without Qi et al.'s post-validation of the optimizer step (which lets iterations overlap) the (p - 1) F fill
    stays: this is the step time a synchronous optimizer step sees.
    """
    f, b, w, t, m = _arrays(f, b, w, m)
    tk, edge = _bottleneck_edge(t, f + np.maximum(0.0, b - 2 * np.minimum(np.minimum(w, f), b)))
    return _time(m * tk + edge, m, tk)


def _dualpipe_family_time(f, b, w, passes, chain) -> PipelineTime:
    """DualPipe / DualPipeV as DeepSeek's order plays out (``tests/test_schedule.py`` against the simulator):
    every step of the fill and drain chain costs S = F + B + max(F, B) - 2W of one chunk (each rank's F, B, W
    halved over its two chunks), the W's queued by the zero-bubble steps filling part of it; the published bound
    (PP/2 - 1)(F&B + B_full - 3W) (DeepSeek-V3 report Table 2, with F&B = F + B_full when the pair's compute adds
    up and only its all-to-alls overlap) is W more per step where B >= F. Per-rank form:
    T = M max t + (chain / (p - 1)) sum_{r != bottleneck} S_r, M the ``passes`` of a rank's t per step."""
    f, b, w, t, count = _arrays(f, b, w, passes)
    step = np.maximum(0.0, (f + b + np.maximum(f, b) - 2 * w) / 2)
    p = _ranks(t)
    tk, edge = _bottleneck_edge(t, step)
    scale = chain(p) / np.maximum(1, p - 1)
    return _time(count * tk + scale * edge, count, tk)


def _ranks(t: np.ndarray) -> np.ndarray:
    """Each row's pipeline degree: its ranks with work (rows of a batch are zero-padded past their p)."""
    return np.count_nonzero(t > 0, axis=-1)


def _dualpipe_time(f, b, w, m, v) -> PipelineTime:
    """DualPipe over p ranks: per-rank F, B, W are one micro-batch of each direction through the rank's two
    stages, m / 2 such pairs; the fill / drain chain is p / 2 - 1 steps (each half of the ranks)."""
    return _dualpipe_family_time(f, b, w, np.asarray(m) / 2, lambda p: np.maximum(0, p // 2 - 1))


def _dualpipev_time(f, b, w, m, v) -> PipelineTime:
    """DualPipeV over p ranks (2p stages in a V): m micro-batches through both chunks, a chain of p - 1 steps."""
    return _dualpipe_family_time(f, b, w, m, lambda p: np.maximum(0, p - 1))


# ---------------------------------------------------------------------------------------------------------------
# In-flight activations
# ---------------------------------------------------------------------------------------------------------------
def _gpipe_inflight(p: int, m: int, v: int, rank: int) -> float:
    return float(m)


def _1f1b_inflight(p: int, m: int, v: int, rank: int) -> float:
    return float(min(p - rank, m))


def _zb_h1_inflight(p: int, m: int, v: int, rank: int) -> float:
    """Deferred W's keep a micro-batch's activations until its W: every rank may reach 1F1B's first-rank peak p
    (Qi et al. 2023 Sec. 3.1 cap ZB-H1 at "the same peak memory as 1F1B"; the simulator reaches it on ranks
    1..p-1 too, since their W's wait for the drain)."""
    return float(min(p, m))


def _zb_h2_inflight(p: int, m: int, v: int, rank: int) -> float:
    """ZB-H2 holds up to 2p - 1 micro-batches (Qi et al. 2023 Sec. 3.1), on every rank for the same reason."""
    return float(min(2 * p - 1, m))


def _dualpipe_inflight(p: int, m: int, v: int, rank: int) -> float:
    """DualPipe holds PP + 1 stage-micro-batches on every rank (DeepSeek-V3 report Table 2; the simulator agrees),
    in units of one micro-batch of each direction through the rank's two stages: (p + 1) / 2."""
    return min(p + 1, m) / 2


def _dualpipev_inflight(p: int, m: int, v: int, rank: int) -> float:
    """DualPipeV holds PP + 1 = 2p + 1 chunk-micro-batches on every rank (DualPipe README's table, PP stages on
    PP / 2 devices), in units of one micro-batch through both chunks: p + 1/2."""
    return min(2 * p + 1, 2 * m) / 2


def _interleaved_inflight(p: int, m: int, v: int, rank: int) -> float:
    chunks = min((p - rank - 1) * 2 + (v - 1) * p + 1, m * v)
    return chunks / v


# ---------------------------------------------------------------------------------------------------------------
# Op orders (what each rank runs, in order)
# ---------------------------------------------------------------------------------------------------------------
def _one_f_one_b(m: int, warmup: int) -> list[Op]:
    """``warmup`` forwards, then alternate one forward and one backward, then the remaining backwards."""
    w = min(warmup, m)
    ops: list[Op] = [("F", i, 0) for i in range(w)]
    for i in range(m - w):
        ops += [("F", w + i, 0), ("B", i, 0)]
    ops += [("B", i, 0) for i in range(m - w, m)]
    return ops


def _gpipe_order(p: int, m: int, v: int, rank: int) -> list[Op]:
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


def _1f1b_order(p: int, m: int, v: int, rank: int) -> list[Op]:
    return _one_f_one_b(m, p - rank - 1)


def _zb_h2_order(p: int, m: int, v: int, rank: int) -> list[Op]:
    return _one_f_one_b(m, 2 * (p - rank) - 2)


def _interleaved_order(p: int, m: int, v: int, rank: int) -> list[Op]:
    """Megatron's interleaved schedule: micro-batches in groups of p, each group through chunk 0, 1, ... forward
    and v-1, ..., 0 backward; (p - r - 1) * 2 + (v - 1) * p warm-up forwards."""
    total = m * v

    def op(kind: str, k: int) -> Op:
        group, within = divmod(k, p * v)
        c = within // p
        return (kind, group * p + within % p, c if kind == "F" else v - 1 - c)

    warm = min((p - rank - 1) * 2 + (v - 1) * p, total)
    ops = [op("F", k) for k in range(warm)]
    for i in range(total - warm):
        ops += [op("F", warm + i), op("B", i)]
    ops += [op("B", k) for k in range(total - warm, total)]
    return ops


def _bfs_order(p: int, m: int, v: int, rank: int) -> list[Op]:
    """Breadth-first (looped) schedule, Lamy-Poirier 2022: every micro-batch through chunk 0, then chunk 1, ...;
    backward the same in reverse chunk order."""
    ops: list[Op] = [("F", i, c) for c in range(v) for i in range(m)]
    ops += [("B", i, c) for c in reversed(range(v)) for i in range(m)]
    return ops


def _v_stage_index(p: int, v: int, rank: int, chunk: int) -> int:
    """V placement (Qi et al. 2024, ZB-V): rank r holds stage r and stage 2p - 1 - r, so the first and the last
    stage (embedding and LM head) share rank 0 and the turn of the V stays on rank p - 1."""
    return rank if chunk == 0 else 2 * p - 1 - rank


def _zbv_order(p: int, m: int, v: int, rank: int) -> list[Op]:
    """ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", Sec. 6; torch's ZBVZeroBubble):
    chunk-0 forwards warm up the V's down stroke, chunk-1 F-B-W triples start its up stroke, then the steady
    state alternates F, B, W of chunk 0 and chunk 1; the drain runs B's first and leaves W's to fill its gaps.
    Played with at least 2p - 1 micro-batches' worth of slots; slots past m are dropped."""
    n = max(2 * p - 1, m)
    ops: list[Op] = []
    cnt = {"F0": 0, "F1": 0, "B0": 0, "B1": 0, "W0": 0, "W1": 0}

    def add(kind: str, chunk: int) -> None:
        key = f"{kind}{chunk}"
        ops.append((kind, cnt[key], chunk))
        cnt[key] += 1

    for _ in range(2 * (p - rank) - 1):
        add("F", 0)
    for _ in range(rank):
        add("F", 1)
        add("F", 0)
    for _ in range(p - rank):
        add("F", 1)
        add("B", 1)
        add("W", 1)
    while cnt["F1"] < cnt["F0"] or cnt["F0"] < n:
        if cnt["F0"] < n:
            add("F", 0)
        add("B", 0)
        add("W", 0)
        add("F", 1)
        add("B", 1)
        add("W", 1)
    for _ in range(rank):
        add("B", 0)
        add("B", 1)
    for _ in range(p - rank):
        add("B", 0)
        add("W", 0)
    while cnt["W1"] < cnt["B1"]:
        add("W", 1)
    while cnt["W0"] < cnt["B0"]:
        add("W", 0)
    return [op for op in ops if op[1] < m]


def _dualpipe_template(n: int, r: int, per_phase: int) -> list[tuple[str, int, bool]]:
    """DeepSeek's DualPipe step (github deepseek-ai/DualPipe, ``DualPipe.step`` / ``DualPipeV.step``, eight
    steps) for rank r of n, ``per_phase`` micro-batches through each of the rank's two phases, as
    (kind, phase, split) items: "F" / "B" of phase 0 or 1 (``split``: a zero-bubble backward whose weight
    gradient waits in a queue), "W" (the queue's oldest weight gradient). A pair the library runs overlapped
    (``_forward_backward_chunk``: the F of one phase with the B of the other, each hiding the other's all-to-all)
    is an "F" followed by a "b": it starts when both inputs are there and takes F + B of compute."""
    ops: list[tuple[str, int, bool]] = []

    def add(kind: str, phase: int = 0, split: bool = False) -> None:
        ops.append((kind, phase, split))

    rest = n - r - 1
    for _ in range(2 * rest):                       # 1: forwards of phase 0 fill the way down
        add("F", 0)
    for _ in range(r + 1):                          # 2: F0 F1 pairs
        add("F", 0)
        add("F", 1)
    for _ in range(rest):                           # 3: B1 W F1, zero-bubble
        add("B", 1, True)
        add("W")
        add("F", 1)
    for i in range(per_phase - 2 * n + r + 1):      # 4: steady state, F0&B1 then F1&B0
        add("F", 0)
        add("B" if i == 0 and r == n - 1 else "b", 1)  # the middle rank's first pair runs apart
        add("F", 1)
        add("b", 0)
    for _ in range(rest):                           # 5: B1, F1&B0
        add("B", 1)
        add("F", 1)
        add("b", 0)
    split = False                                   # 6: B1 B0, zero-bubble from the middle on
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        add("B", 1, split)
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        add("B", 0, split)
    for _ in range(rest):                           # 7: W B0
        add("W")
        add("B", 0, True)
    for _ in range(r + 1):                          # 8: the queue's last weight gradients
        add("W")
    return ops


def _dualpipe_ops(template: list[tuple[str, int, bool]], chunk_of, mb_offset) -> list[Op]:
    """Number a DualPipe template's items: each chunk's F's and B's take its micro-batches in order; a split B's
    W joins a queue the template's "W" items pop, an unsplit B runs its W right after it (one fused backward)."""
    count: dict[tuple[str, int], int] = {}
    queue: list[tuple[int, int]] = []
    ops: list[Op] = []
    for kind, phase, split in template:
        if kind == "W":
            mb, c = queue.pop(0)
            ops.append(("W", mb, c))
            continue
        c = chunk_of(phase)
        k = count.get((kind.upper(), c), 0)
        count[(kind.upper(), c)] = k + 1
        mb = mb_offset(c) + k
        ops.append((kind, mb, c))
        if kind in ("B", "b"):
            if split:
                queue.append((mb, c))
            else:
                ops.append(("W", mb, c))
    return ops


def _dualpipe_order(p: int, m: int, v: int, rank: int) -> list[Op]:
    """DualPipe (DeepSeek-V3 report Sec. 3.2.1): m / 2 micro-batches enter at rank 0 and run down the p stages
    (chunk 0 of rank r is stage r), m / 2 enter at rank p - 1 and run the mirrored way (chunk 1 of rank r is stage
    p - 1 - r); each half of the ranks runs the template with its distance from the edge, its phase 0 being the
    direction that enters on its side."""
    half = p // 2
    second = rank >= half
    template = _dualpipe_template(half, min(rank, p - 1 - rank), m // 2)
    return _dualpipe_ops(template, lambda phase: phase ^ second, lambda c: c * (m // 2))


def _dualpipev_order(p: int, m: int, v: int, rank: int) -> list[Op]:
    """DualPipeV (DualPipe "cut in half", github deepseek-ai/DualPipe ``DualPipeV``; torch's ScheduleDualPipeV):
    ZB-V's V placement, every micro-batch down chunk 0 and back up chunk 1, run by DualPipe's template."""
    return _dualpipe_ops(_dualpipe_template(p, rank, m), lambda phase: phase, lambda c: 0)


def _dualpipe_placement(p: int, v: int, rank: int) -> tuple[int, ...]:
    """Rank r holds stage r (the first direction's) and stage p - 1 - r (the mirrored direction's)."""
    return (rank, p - 1 - rank)


def _dualpipe_route(p: int, v: int, m: int, mb: int) -> tuple[tuple[int, int], ...]:
    """The first m / 2 micro-batches pass stage j on rank j (chunk 0), the rest on rank p - 1 - j (chunk 1)."""
    if mb < m // 2:
        return tuple((j, 0) for j in range(p))
    return tuple((p - 1 - j, 1) for j in range(p))


def _1f1b_cap(p: int, m: int, v: int, rank: int) -> int:
    return p


def _zb_h2_cap(p: int, m: int, v: int, rank: int) -> int:
    return 2 * p - 1


# ---------------------------------------------------------------------------------------------------------------
# Constraints
# ---------------------------------------------------------------------------------------------------------------
def _no_vpp(name: str) -> Callable[[int, int, int], str | None]:
    def check(p: int, m: int, v: int) -> str | None:
        return f"{name} needs --vpp 1 (use interleaved-1f1b or bfs for virtual stages)" if v != 1 else None
    return check


def _dualpipe_check(p: int, m: int, v: int) -> str | None:
    if p < 2 or p % 2:
        return f"dualpipe needs an even pipeline degree >= 2 (its two directions meet in the middle), got pp={p}"
    if v != 1:
        return "dualpipe needs --vpp 1 (every rank holds stage r and its mirror p - 1 - r; use dualpipev for a V)"
    if m % 2 or m < 2 * p:
        return (f"dualpipe needs an even number of micro-batches per step, at least 2*pp = {2 * p} (half enter at "
                f"each end), got {m}")
    return None


def _interleaved_check(p: int, m: int, v: int) -> str | None:
    if p < 2:
        return "interleaved-1f1b needs pipeline parallelism (pp >= 2)"
    if v < 2:
        return "interleaved-1f1b needs --vpp >= 2 model chunks per rank"
    if m % p:
        return f"interleaved-1f1b needs the number of micro-batches ({m}) to be a multiple of pp ({p})"
    return None


def _bfs_check(p: int, m: int, v: int) -> str | None:
    if p < 2:
        return "bfs needs pipeline parallelism (pp >= 2)"
    if m < p:
        return f"bfs needs at least pp ({p}) micro-batches per step, got {m} (fewer leave ranks idle between chunks)"
    return None


def _v_check(name: str, min_microbatches: Callable[[int], int], rule: str) -> Callable[[int, int, int], str | None]:
    """Requirements of a schedule placing two chunks per rank in a V (ZB-V, DualPipeV): pp >= 2, vpp 2, and at
    least ``min_microbatches(p)`` micro-batches (``rule``, as the message spells it)."""
    def check(p: int, m: int, v: int) -> str | None:
        if p < 2:
            return f"{name} needs pipeline parallelism (pp >= 2)"
        if v != 2:
            return f"{name} needs --vpp 2 (two model chunks per rank, placed in a V)"
        if m < min_microbatches(p):
            return f"{name} needs at least {rule} = {min_microbatches(p)} micro-batches per step, got {m}"
        return None
    return check


def _zb_check(name: str, min_microbatches: Callable[[int], int]) -> Callable[[int, int, int], str | None]:
    def check(p: int, m: int, v: int) -> str | None:
        if v != 1:
            return f"{name} needs --vpp 1"
        if p < 2:
            return f"{name} needs pipeline parallelism (pp >= 2)"
        if m < min_microbatches(p):
            return (f"{name} needs at least {min_microbatches(p)} micro-batches per step with pp={p} to fill its "
                    f"warm-up, got {m}")
        return None
    return check


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule("gpipe", "all forwards, then all backwards (Huang et al. 2019)", _flush_time,
                      _gpipe_inflight, _no_vpp("gpipe"), order=_gpipe_order, torch_name="GPipe"),
    "1f1b": Schedule("1f1b", "one-forward-one-backward, PipeDream-Flush (Narayanan et al. 2021)", _flush_time,
                     _1f1b_inflight, _no_vpp("1f1b"), order=_1f1b_order, torch_name="1F1B"),
    "interleaved-1f1b": Schedule("interleaved-1f1b", "1F1B over v model chunks per rank (Narayanan et al. 2021)",
                                 _interleaved_time, _interleaved_inflight, _interleaved_check, supports_vpp=True,
                                 order=_interleaved_order, torch_name="Interleaved1F1B", overlaps_p2p=True),
    "zb-h1": Schedule("zb-h1", "zero-bubble H1: W deferred into the drain, 1F1B memory (Qi et al. 2023)",
                      _zb_h1_time, _zb_h1_inflight, _zb_check("zb-h1", lambda p: p), order=_1f1b_order, defer_w=True,
                      w_cap=_1f1b_cap),
    "zb-h2": Schedule("zb-h2", "zero-bubble H2: extra warm-up forwards, about twice 1F1B's memory (Qi et al. 2023)",
                      _zb_h2_time, _zb_h2_inflight, _zb_check("zb-h2", lambda p: 2 * p - 1), order=_zb_h2_order,
                      defer_w=True, w_cap=_zb_h2_cap),
    "zbv": Schedule("zbv", "zero-bubble V: two chunks per rank in a V, 1F1B memory (Qi et al. 2024)", _zbv_time,
                    _zb_h1_inflight, _v_check("zbv", lambda p: 2 * p - 1, "2*pp - 1"), supports_vpp=True,
                    order=_zbv_order, stage_index=_v_stage_index, defer_w=True, torch_name="ZBVZeroBubble"),
    "dualpipe": Schedule("dualpipe", "DualPipe: two directions of micro-batches, each rank holds a stage and its "
                         "mirror, F&B pairs overlap their all-to-alls (DeepSeek-AI 2024)", _dualpipe_time,
                         _dualpipe_inflight, _dualpipe_check, order=_dualpipe_order, defer_w=True,
                         placement=_dualpipe_placement, route=_dualpipe_route, microbatches_per_pass=2,
                         stage_copies=2, pairs_microbatches=True),
    "dualpipev": Schedule("dualpipev", "DualPipeV: DualPipe cut in half, one direction down and up a V of two "
                          "chunks per rank (DeepSeek-AI 2025; Sea AI Lab)", _dualpipev_time, _dualpipev_inflight,
                          _v_check("dualpipev", lambda p: 2 * p, "2*pp"), supports_vpp=True, order=_dualpipev_order,
                          stage_index=_v_stage_index, defer_w=True, torch_name="DualPipeV", pairs_microbatches=True),
    "bfs": Schedule("bfs", "breadth-first looped schedule for sharded data parallelism (Lamy-Poirier 2022)",
                    _interleaved_time, _gpipe_inflight, _bfs_check, supports_vpp=True, order=_bfs_order,
                    zero3_gathers_once_per_step=True, torch_name="LoopedBFS"),
}


def get_schedule(name: str) -> Schedule:
    return SCHEDULES[name]
