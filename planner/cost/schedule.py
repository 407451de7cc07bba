"""Pipeline schedules: step time from per-rank micro-batch times, in-flight activations, and each schedule's rules.

Closed forms (stage ranks r = 0..p-1, per-micro-batch time of rank r t_r = F_r + B_r + W_r, m micro-batches,
v model chunks per rank):
* GPipe and 1F1B (Narayanan et al. 2021, Sec. 2.2): T = (m - 1) max_r t_r + sum_r t_r; with equal stages this is
  (m + p - 1) t, a bubble fraction (p - 1)/m of the ideal m t.
* Interleaved 1F1B: the fill and drain walk one chunk (t_r / v) per rank: T = m max_r t_r + (sum_r t_r - max)/v,
  a bubble fraction (p - 1)/(v m) for equal stages.
In-flight micro-batches (activations held), in units of one micro-batch through all of a rank's layers:
* GPipe holds all m; 1F1B's rank r holds min(p - r, m) (Narayanan et al. 2021);
* interleaved rank r warms up (p - r - 1) * 2 + (v - 1) * p + 1 chunk-micro-batches (Megatron's schedule),
  i.e. rank 0 holds p (1 + (p - 1)/(p v)) micro-batches' worth, Korthikanti et al. 2022 Sec. 4.2.3 (where the
  paper's "m" is the number of interleaved chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class PipelineTime:
    total_s: float  # from the first forward to the last backward of the step
    bubble_s: float  # total - m x (busiest rank's per-micro-batch time)


@dataclass(frozen=True)
class Schedule:
    name: str
    description: str
    #: (per-rank F, B, W per micro-batch, m, v) -> PipelineTime
    time: Callable[[Sequence[float], Sequence[float], Sequence[float], int, int], PipelineTime]
    #: (p, m, v, rank) -> micro-batches of activations the rank holds at its peak
    inflight: Callable[[int, int, int, int], float]
    #: (p, m, v) -> reason the schedule cannot run, or None
    check: Callable[[int, int, int], str | None]
    supports_vpp: bool = False


def _flush_time(f: Sequence[float], b: Sequence[float], w: Sequence[float], m: int, v: int) -> PipelineTime:
    t = [fi + bi + wi for fi, bi, wi in zip(f, b, w)]
    tmax = max(t)
    total = (m - 1) * tmax + sum(t)
    return PipelineTime(total, total - m * tmax)


def _interleaved_time(f: Sequence[float], b: Sequence[float], w: Sequence[float], m: int, v: int) -> PipelineTime:
    t = [fi + bi + wi for fi, bi, wi in zip(f, b, w)]
    tmax = max(t)
    total = m * tmax + (sum(t) - tmax) / v
    return PipelineTime(total, total - m * tmax)


def _gpipe_inflight(p: int, m: int, v: int, rank: int) -> float:
    return float(m)


def _1f1b_inflight(p: int, m: int, v: int, rank: int) -> float:
    return float(min(p - rank, m))


def _interleaved_inflight(p: int, m: int, v: int, rank: int) -> float:
    chunks = min((p - rank - 1) * 2 + (v - 1) * p + 1, m * v)
    return chunks / v


def _no_vpp(p: int, m: int, v: int) -> str | None:
    return "needs --vpp 1 (use interleaved-1f1b for virtual stages)" if v != 1 else None


def _interleaved_check(p: int, m: int, v: int) -> str | None:
    if p < 2:
        return "interleaved-1f1b needs pipeline parallelism (pp >= 2)"
    if v < 2:
        return "interleaved-1f1b needs --vpp >= 2 model chunks per rank"
    if m % p:
        return f"interleaved-1f1b needs the number of micro-batches ({m}) to be a multiple of pp ({p})"
    return None


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule("gpipe", "all forwards, then all backwards (Huang et al. 2019)", _flush_time,
                      _gpipe_inflight, _no_vpp),
    "1f1b": Schedule("1f1b", "one-forward-one-backward, PipeDream-Flush (Narayanan et al. 2021)", _flush_time,
                     _1f1b_inflight, _no_vpp),
    "interleaved-1f1b": Schedule("interleaved-1f1b", "1F1B over v model chunks per rank (Narayanan et al. 2021)",
                                 _interleaved_time, _interleaved_inflight, _interleaved_check, supports_vpp=True),
}


def get_schedule(name: str) -> Schedule:
    return SCHEDULES[name]
