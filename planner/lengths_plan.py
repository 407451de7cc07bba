"""Plans over a sequence-length distribution (``--seq-len-dist``): the length-aware estimate of a searched plan and
its runners-up, and dynamic context parallelism's gain over the best static plan.

The search itself prices packed data exactly as the cost model does (``SearchSpace.packed_doc_len`` and
``packed_attention_cv``: attention per document, the data-parallel wait for the heaviest packed sequences); what it
cannot see -- the mixture of padded lengths without packing, and Megatron-Core's hybrid CP -- is added here to the
best plan and the ``top`` runners-up, which are then re-ranked (exact within them, not over the whole space).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from planner.cost.variable_length import (DynamicCPEstimate, LengthAwareEstimate, dynamic_cp, dynamic_cp_problems,
                                          length_aware_estimate)
from planner.errors import PlannerError
from planner.plan import Plan
from planner.specs.hardware import Cluster
from planner.specs.lengths import SeqLenDist
from planner.specs.model import ModelSpec


def rerank(model: ModelSpec, cluster: Cluster, plan: Plan, dist: SeqLenDist,
           packing: bool) -> tuple[Plan, dict[int, LengthAwareEstimate]]:
    """``plan`` and its alternatives with their length-aware estimates (:func:`length_aware_estimate`), fastest
    first; the estimates by position in the new order (0 = best)."""
    entries = [(p, length_aware_estimate(model, cluster, p.config, dist, packing, check=False))
               for p in (plan,) + plan.alternatives]
    fitting = [e for e in entries if e[1].estimate.fits] or entries
    fitting.sort(key=lambda e: e[1].estimate.step_time_s)
    best, rest = fitting[0], fitting[1:]
    alternatives = tuple(replace(p, estimate=le.estimate) for p, le in rest)
    new = replace(best[0], estimate=best[1].estimate, alternatives=alternatives, search=plan.search)
    return new, {i: le for i, (_, le) in enumerate(fitting)}


def dynamic_constraints(constraints: Any):
    """The user's search constraints narrowed to what Megatron-Core's hybrid CP runs: PP 1, ZeRO 0-1
    (:func:`dynamic_cp_problems`); PlannerError when the user's leave nothing."""
    from planner.search.space import Constraints

    c = constraints or Constraints()
    pp = tuple(x for x in (c.pp or (1,)) if x == 1)
    zero = tuple(z for z in (c.zero or (0, 1)) if z <= 1)
    if not pp or not zero:
        raise PlannerError("dynamic CP (Megatron-Core hybrid CP) runs with PP 1 and ZeRO 0-1, which the given "
                           "--pp / --zero exclude", source="--dynamic-cp", fix="allow --pp 1 and --zero 1")
    return replace(c, pp=pp, zero=zero)


def best_dynamic(model: ModelSpec, cluster: Cluster, candidates: Plan, dist: SeqLenDist,
                 max_seqlen_per_rank: int | None = None) -> tuple[Any, DynamicCPEstimate]:
    """The fastest (config, :func:`dynamic_cp` estimate) among ``candidates`` and its alternatives that
    Megatron-Core's hybrid CP runs and that fit; PlannerError when none does."""
    out = []
    why = []
    for p in (candidates,) + candidates.alternatives:
        problems = dynamic_cp_problems(p.config)
        if problems:
            why.append(problems[0])
            continue
        try:
            d = dynamic_cp(model, cluster, p.config, dist, max_seqlen_per_rank)
        except PlannerError as e:
            why.append(e.reason)
            continue
        if d.fits:
            out.append((p.config, d))
    if not out:
        raise PlannerError("no candidate plan runs with dynamic CP" + (f": {why[0]}" if why else ""),
                           source="--dynamic-cp", fix="widen --pp / --zero constraints or use more GPUs")
    return min(out, key=lambda e: e[1].step_time_s)


def data_section(dist: SeqLenDist, packing: bool, aware: LengthAwareEstimate,
                 dynamic: tuple[Any, DynamicCPEstimate] | None = None, label: Callable | None = None) -> dict:
    """The plan JSON's ``data`` object."""
    d = {"seq_len_dist": dist.describe(), **aware.to_dict()}
    if dynamic is not None:
        cfg, dyn = dynamic
        d["dynamic_cp"] = {**{k: v for k, v in dyn.to_dict().items() if k != "static"},
                           "layout": label(cfg) if label else None,
                           "config": {"tp": cfg.tp, "cp": cfg.cp, "dp": cfg.dp, "pp": cfg.pp,
                                      "zero_stage": cfg.zero_stage, "micro_batch_size": cfg.micro_batch_size,
                                      "recompute": cfg.recompute},
                           "gain_over_best_static": aware.estimate.step_time_s / dyn.step_time_s,
                           "launcher": "Megatron-Core --hybrid-context-parallel --max-seqlen-per-dp-cp-rank "
                                       f"{dyn.max_seqlen_per_rank} --calculate-per-token-loss --dataloader-type "
                                       "single (no pipeline parallelism, no Megatron-FSDP)"}
    return d
