"""Search only what a launcher can run: the best plan among those an exporter accepts.

The unrestricted search is free to pick a schedule or a ZeRO stage a launcher lacks (looped BFS for Megatron-LM,
ZeRO-3 with pipeline stages for DeepSpeed); its plan then cannot be exported. ``plan_for_launcher`` searches the
launcher's own space instead. Rules that couple two knobs (Megatron FSDP and DeepSpeed's ZeRO-2/3 only without
pipeline parallelism) are covered by searching two spaces, with and without pipeline stages, and keeping the better
plan; what no search space expresses (per-stage recompute counts, an uneven split NeMo cannot spell) is checked by
exporting the result, falling back to the search without the partition refinement when the launcher refuses it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.errors import InfeasibleError, PlannerError
from planner.export import TARGETS, export
from planner.export import megatron, torchtitan


def launcher_spaces(target: str, option: str = "--launcher", precision: str = "bf16") -> list[Any]:
    """Search spaces whose union is (a safe subset of) what ``target`` can run, for a run at ``precision``."""
    from planner.search.space import SearchSpace

    if target not in TARGETS:
        raise PlannerError(f"unknown launcher '{target}'", source=option, fix=f"use one of: {', '.join(TARGETS)}")
    refused = {"deepspeed": ("fp8", "mxfp8"), "torchtitan": ("fp16",)}.get(target, ())
    if precision in refused:
        raise PlannerError(f"{target} cannot train with {precision} GEMMs", source="--precision",
                           fix="use another --precision or launcher (megatron and nemo run bf16, fp16, fp8, mxfp8)")
    base = SearchSpace(precision=precision)
    if target in ("megatron", "nemo"):
        schedules = tuple(s for s in base.schedules if megatron.SCHEDULE_SUPPORT.get(s))
        spaces = [replace(base, schedules=schedules, zero_stages=tuple(z for z in base.zero_stages if z <= 1))]
        if target == "megatron":  # ZeRO-2/3 through Megatron FSDP, which needs a model without pipeline stages
            spaces.append(replace(base, max_pp=1))
        return spaces
    if target == "torchtitan":
        schedules = tuple(s for s in base.schedules if torchtitan.SCHEDULE_NAMES.get(s))
        return [replace(base, schedules=schedules, cp_kinds=tuple(k for k in base.cp_kinds if k in
                                                                  torchtitan.CP_ROTATE))]
    # deepspeed: the pipeline engine runs 1F1B with ZeRO-0/1; ZeRO-2/3 without pipeline stages; Ulysses CP; no TP
    # communication overlap
    cp_kinds = tuple(k for k in base.cp_kinds if k == "ulysses")
    base = replace(base, tp_comm_overlap=(False,))
    return [replace(base, schedules=("1f1b",), zero_stages=tuple(z for z in base.zero_stages if z <= 1),
                    cp_kinds=cp_kinds),
            replace(base, max_pp=1, cp_kinds=cp_kinds)]


def plan_for_launcher(model: Any, cluster: Any, num_gpus: int, global_batch_size: int, seq_len: int, target: str, *,
                      top_k: int = 1, objective: str = "time", max_memory_gib: float | None = None,
                      refine_partition: bool = True, option: str = "--launcher", precision: str = "bf16") -> Any:
    """The best plan ``target`` can run (a ``planner.plan.Plan``) at GEMM ``precision``; InfeasibleError when none
    fits. ``refine_partition=False`` keeps the even layer split (``planner plan --even-split``)."""
    from planner.plan import search_plans
    from planner.search.engine import objective_key

    spaces = launcher_spaces(target, option, precision)
    found = []
    reasons = []
    for space in spaces:
        for refine in ((True, False) if refine_partition else (False,)):
            try:
                plan = search_plans(model, cluster, num_gpus, global_batch_size, seq_len, top_k=top_k,
                                    objective=objective, max_memory_gib=max_memory_gib, space=space,
                                    refine_partition=refine)
            except InfeasibleError as e:
                reasons.append(e.reason)
                break  # the refinement only changes a found plan; nothing fits this space
            try:
                export(plan, target)
            except PlannerError as e:
                reasons.append(e.reason)
                continue  # refused (per-stage recompute, an uneven split): retry with the even split
            found.append(plan)
            break
    if not found:
        raise InfeasibleError(f"no plan that {target} can run fits: {reasons[0] if reasons else 'empty space'}",
                              source=f"{option} {target}",
                              fix="try another launcher (torchtitan runs the most schedules) or more GPUs")
    return min(found, key=lambda p: objective_key(p.estimate, objective))
