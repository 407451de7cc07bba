"""Elastic re-planning: the best plan for a job's new GPUs (nodes lost or added), the cost of moving its training
state there, and which plan processes the most tokens over the time the job has left.

For each candidate (the search's best plans on the new GPU count, and the old layout's degrees with only DP
changed) the transition moves what :mod:`planner.cost.reshard` counts: every GPU receives the optimizer-state and
weight bytes its new place needs and does not hold, over its NIC share (``comm.p2p_s`` across nodes; GPUs of one
node would be faster over NVLink, so this is the slower bound), while optimizer state whose every holder was lost is read
back from a checkpoint at the storage bandwidth a user gives; plus the job's restart time (an input: process
start, NCCL set-up and checkpoint loading differ by cluster). Candidates rank by tokens processed in the remaining
``horizon``: throughput x (horizon - transition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner.cost import comm
from planner.cost.reshard import Reshard, reshard
from planner.errors import InfeasibleError, PlannerError
from planner.plan import Plan, search_plans
from planner.specs.config import RunConfig
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec


@dataclass(frozen=True)
class Transition:
    """Moving the state of the old plan to a candidate: bytes, and the seconds it takes."""

    reshard: Reshard
    network_s: float  # the busiest GPU's received bytes over its NIC share
    checkpoint_s: float  # the lost optimizer state read back from storage (0 when no storage bandwidth is given)
    restart_s: float

    @property
    def seconds(self) -> float:
        return self.restart_s + max(self.network_s, self.checkpoint_s)


@dataclass(frozen=True)
class Option:
    """One candidate plan for the new GPUs and what switching to it costs."""

    label: str  # "best", "#2", ..., "same layout" (the old TP / PP / CP / EP / VPP, DP changed), "unchanged"
    plan: Plan
    transition: Transition

    @property
    def tokens_per_s(self) -> float:
        return self.plan.estimate.tokens_per_s

    def tokens_in(self, horizon_s: float) -> float:
        """Tokens processed in ``horizon_s`` seconds from now: none during the transition."""
        return self.tokens_per_s * max(0.0, horizon_s - self.transition.seconds)


@dataclass(frozen=True)
class Replan:
    old: RunConfig
    num_gpus: int
    lost_nodes: tuple[int, ...]
    added_nodes: int
    horizon_s: float
    options: tuple[Option, ...]  # ranked by tokens in the horizon
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Option:
        return self.options[0]

    def break_even_s(self, option: Option, reference: Option) -> float | None:
        """Horizon beyond which ``option`` processes more tokens than ``reference`` (None: never, or always)."""
        r1, r0 = option.tokens_per_s, reference.tokens_per_s
        t1, t0 = option.transition.seconds, reference.transition.seconds
        if r1 <= r0:
            return None
        return max(0.0, (r1 * t1 - r0 * t0) / (r1 - r0))


def survivors_of(old_gpus: int, gpus_per_node: int, lost_nodes: tuple[int, ...]) -> np.ndarray:
    """Old ranks on the nodes that remain (node i holds ranks i * gpus_per_node ..)."""
    nodes = np.arange(old_gpus) // gpus_per_node
    return np.flatnonzero(~np.isin(nodes, np.asarray(lost_nodes, dtype=np.int64)))


def replan(model: ModelSpec, cluster: Cluster, old: RunConfig, *, lose_nodes: int = 0,
           lost_nodes: tuple[int, ...] | None = None, add_nodes: int = 0, horizon_s: float,
           restart_s: float = 0.0, checkpoint_bytes_per_s: float | None = None, top_k: int = 2,
           find: Any = None, global_batch: int | None = None) -> Replan:
    """Re-plan ``old`` after losing ``lose_nodes`` nodes (the last ones, or the given ``lost_nodes`` indices) and
    adding ``add_nodes``. ``find(num_gpus, constraints, top_k)`` returns the best plan (with ``top_k``
    alternatives) for a GPU count under search constraints (default: the full search at the old plan's precision).
    Candidates: the best plans on every GPU left, the best on fewer nodes (down to ``idle_nodes`` idle) where it
    runs faster, and the old layout's degrees with only DP changed (the least state to move). ``global_batch``:
    search the new GPUs at another global batch (the old plan's by default; a different batch changes the
    optimization, as a batch-size ramp does)."""
    gpn = cluster.gpus_per_node
    if old.num_gpus % gpn:
        raise PlannerError(f"the plan's {old.num_gpus} GPUs are not whole nodes of {gpn}", source="plan",
                           field="num_gpus", fix="re-plan a job that runs on whole nodes")
    old_nodes = old.num_gpus // gpn
    if lose_nodes < 0:
        raise PlannerError(f"must be >= 0, got {lose_nodes}", source="--lose-nodes")
    if lost_nodes is None:
        lost_nodes = tuple(range(old_nodes - lose_nodes, old_nodes))
    bad = [i for i in lost_nodes if not 0 <= i < old_nodes]
    if bad:
        raise PlannerError(f"node {bad[0]} is not one of the plan's nodes 0..{old_nodes - 1}", source="--lost-nodes")
    lost_nodes = tuple(sorted(set(lost_nodes)))
    if add_nodes < 0:
        raise PlannerError(f"must be >= 0, got {add_nodes}", source="--add-nodes")
    num_gpus = (old_nodes - len(lost_nodes) + add_nodes) * gpn
    if num_gpus < 1:
        raise PlannerError(f"no GPUs left ({len(lost_nodes)} of {old_nodes} nodes lost)", source="--lose-nodes",
                           fix="lose fewer nodes or add some")
    if not horizon_s > 0:
        raise PlannerError(f"must be > 0, got {horizon_s / 3600:g}", source="--horizon-hours")
    if restart_s < 0:
        raise PlannerError(f"must be >= 0, got {restart_s:g}", source="--restart-s")
    if checkpoint_bytes_per_s is not None and not checkpoint_bytes_per_s > 0:
        raise PlannerError("must be > 0", source="--checkpoint-gb-s")
    survivors = survivors_of(old.num_gpus, gpn, lost_nodes)
    batch = old.global_batch_size if global_batch is None else global_batch
    if batch < 1:
        raise PlannerError(f"must be >= 1, got {batch}", source="--global-batch")
    if find is None:
        find = _default_finder(model, cluster, old, batch)

    def transition(cfg: RunConfig, moved: bool = True) -> Transition:
        rs = reshard(model, old, cfg, survivors, gpn) if moved else _no_move(cfg)
        net = float(comm.p2p_s(cluster, True, rs.max_gpu_bytes))  # the busiest GPU's bytes over its NIC
        ckpt = rs.lost_bytes / checkpoint_bytes_per_s if checkpoint_bytes_per_s and moved else 0.0
        return Transition(rs, net, ckpt, restart_s if moved else 0.0)

    options: list[Option] = []
    notes: list[str] = []

    def offer(label: str, plan: Plan) -> None:
        options.append(Option(label, replace(plan, alternatives=()), transition(plan.config)))

    nodes = num_gpus // gpn
    counts = [c * gpn for c in range(nodes, max(0, nodes - idle_nodes(nodes) - 1), -1)]  # 0 .. idle_nodes idle
    found: dict[int, Plan] = {}
    reasons = []
    for n in counts:  # every GPU, then up to 1/8 of the nodes left idle where the batch splits better
        try:
            found[n] = find(n, None, top_k if n == num_gpus else 0)
        except InfeasibleError as e:
            reasons.append(e)
    if not found:
        e = reasons[0]
        raise InfeasibleError(f"nothing fits on the {num_gpus} GPUs left: {e.reason}", source=e.source,
                              fix=e.fix) from None
    if num_gpus in found:
        best = found[num_gpus]
        for i, plan in enumerate((best,) + tuple(best.alternatives)):
            offer("best" if i == 0 else f"#{i + 1}", plan)
    top = max((p.estimate.tokens_per_s for n, p in found.items() if n == num_gpus), default=0.0)
    for n, plan in found.items():  # fewer GPUs only where they run faster than all of them
        if n < num_gpus and plan.estimate.tokens_per_s > top:
            top = plan.estimate.tokens_per_s
            offer(f"{n} GPUs ({_nodes((num_gpus - n) // gpn)} idle)", plan)
    from planner.search.space import Constraints

    same = Constraints(tp=(old.tp,), pp=(old.pp,), cp=(old.cp,), ep=(old.ep,), vpp=(old.vpp,),
                       etp=(old.expert_tp,))
    for n in counts:  # the old degrees with only DP changed, on as many GPUs as they divide
        try:
            kept = find(n, same, 0)
        except (InfeasibleError, PlannerError):
            continue
        if all(o.plan.config != kept.config for o in options):
            offer("same layout" + (f", {n} GPUs" if n < num_gpus else ""), kept)
        break
    else:
        notes.append(f"the old layout's degrees (TP {old.tp}, PP {old.pp}, CP {old.cp}, EP {old.ep}, VPP "
                     f"{old.vpp}) fit or divide no count of {counts[-1]}-{num_gpus} GPUs")
    if not lost_nodes and add_nodes:  # the old plan can go on as it is, the added nodes idle
        from planner.cost.step import estimate

        options.append(Option("unchanged", Plan(model, cluster.name, old, estimate(model, cluster, old)),
                              transition(old, moved=False)))
    options.sort(key=lambda o: (-o.tokens_in(horizon_s), o.transition.seconds))
    return Replan(old=old, num_gpus=num_gpus, lost_nodes=lost_nodes, added_nodes=add_nodes, horizon_s=horizon_s,
                  options=tuple(options), notes=tuple(notes))


def _no_move(cfg: RunConfig) -> Reshard:
    return Reshard(received_bytes=np.zeros(cfg.num_gpus), optimizer_bytes=0.0, weight_bytes=0.0, lost_bytes=0.0,
                   placement=np.arange(cfg.num_gpus))


def idle_nodes(nodes: int) -> int:
    """How many of ``nodes`` a re-plan may leave idle: up to an eighth (at least none, one from 8 nodes), where a
    smaller job's batch splits into a faster layout (a 504-GPU job whose batch of 512 splits only into odd
    pipelines, say)."""
    return nodes // IDLE_FRACTION_DENOMINATOR


#: a re-plan tries node counts down to 1 - 1/this of the nodes it has (more idle GPUs would rarely pay)
IDLE_FRACTION_DENOMINATOR = 8


def _default_finder(model: ModelSpec, cluster: Cluster, old: RunConfig, global_batch: int):
    from planner.search.space import SearchSpace

    def find(num_gpus: int, constraints: Any, top_k: int) -> Plan:
        space = SearchSpace().with_fixed(old.fixed)
        if constraints is not None:
            space = constraints.narrow([space], "the search")[0]
        return search_plans(model, cluster, num_gpus, global_batch, old.seq_len, top_k=top_k, space=space)
    return find


def option_dict(r: Replan, o: Option, reference: Option | None) -> dict[str, Any]:
    """One option as plain data (``planner replan --json``)."""
    t = o.transition
    be = r.break_even_s(o, reference) if reference is not None and reference is not o else None
    return {"label": o.label, "plan": o.plan.to_dict(with_stages=False, with_model=False),
            "tokens_per_s": o.tokens_per_s, "tokens_in_horizon": o.tokens_in(r.horizon_s),
            "transition": {"seconds": t.seconds, "network_s": t.network_s, "checkpoint_s": t.checkpoint_s,
                           "restart_s": t.restart_s, "moved_bytes": t.reshard.total_bytes,
                           "optimizer_bytes": t.reshard.optimizer_bytes, "weight_bytes": t.reshard.weight_bytes,
                           "max_gpu_bytes": t.reshard.max_gpu_bytes, "lost_bytes": t.reshard.lost_bytes},
            "break_even_s": be if be is None or math.isfinite(be) else None}


def replan_dict(r: Replan) -> dict[str, Any]:
    reference = next((o for o in r.options if o.label in ("same layout", "unchanged")), None)
    return {"num_gpus": r.num_gpus, "old_num_gpus": r.old.num_gpus, "lost_nodes": list(r.lost_nodes),
            "added_nodes": r.added_nodes, "horizon_s": r.horizon_s,
            "break_even_reference": reference.label if reference is not None else None,
            "options": [option_dict(r, o, reference) for o in r.options], "notes": list(r.notes)}


def _nodes(k: int) -> str:
    """The count with its noun: 1 node, 3 nodes."""
    return f"{k} node" + ("" if k == 1 else "s")
