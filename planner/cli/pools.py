"""``planner plan --cluster POOLS.json``: the best pipeline over several GPU pools, which pool runs which stages,
and how it compares with the even layer split and with each pool on its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from planner.cli.app import console, err
from planner.cli.render import add_columns, layout_label, model_label, recipe_label
from planner.errors import PlannerError
from planner.plan import dumps, plan_dict
from planner.specs.model import ModelSpec
from planner.specs.pools import PooledCluster


def pools_alone(model: ModelSpec, pooled: PooledCluster, global_batch: int, seq_len: int, precision: str) -> list[dict]:
    """Each pool on its own: the best homogeneous plan of the same request (the ordinary search), or why none."""
    from planner.plan import search_plans
    from planner.search.space import SearchSpace

    out = []
    for pool in pooled.pools:
        row: dict[str, Any] = {"pool": pool.name, "gpus": pool.num_gpus, "gpu": pool.cluster.gpu.name}
        try:
            best = search_plans(model, pool.cluster, pool.num_gpus, global_batch, seq_len, top_k=0,
                                space=SearchSpace(precision=precision))
            row.update(layout=layout_label(best.config), step_time_s=best.estimate.step_time_s,
                       tokens_per_s=best.estimate.tokens_per_s)
        except PlannerError as e:
            row.update(infeasible=e.message)
        out.append(row)
    return out


def plan_over_pools(model: ModelSpec, pooled: PooledCluster, gpus: int, global_batch: int, seq_len: int, *,
                    precision: str, top: int, json_out: bool, emit: str | None, out: Path | None) -> None:
    from planner.search.pooled import search_pooled

    if gpus != pooled.num_gpus:
        raise PlannerError(f"the pools of {pooled.name} hold {pooled.num_gpus} GPUs, not {gpus}", source="--gpus",
                           fix=f"use --gpus {pooled.num_gpus}")
    res = search_pooled(model, pooled, global_batch, seq_len, precision=precision, top=top)
    plans = []
    for p in res.ranked:
        d = plan_dict(model, pooled.name, p.config, p.estimate.estimate)
        d["pools"] = p.estimate.to_dict(pooled)
        d["pools"]["even_split_step_s"] = p.even_split_step_s
        plans.append(d)
    best = plans[0]
    alone = pools_alone(model, pooled, global_batch, seq_len, precision)
    best["pools"]["each_pool_alone"] = alone
    from planner.search.pooled import search_replicas

    uneven = search_replicas(model, pooled, global_batch, seq_len, precision=precision)
    best["pools"]["uneven_data_parallel"] = None if uneven is None else {
        "layout": layout_label(uneven.config.with_(num_gpus=uneven.config.tp * uneven.config.pp *
                                                   sum(uneven.estimate.replicas))).split(" mb")[0],
        "tp": uneven.config.tp, "pp": uneven.config.pp, "vpp": uneven.config.vpp,
        "micro_batch_size": uneven.config.micro_batch_size, "schedule": uneven.config.schedule,
        "recompute": uneven.config.recompute, **uneven.estimate.to_dict(pooled),
        "launchable": False}
    best["alternatives"] = plans[1:]
    best["search"] = {"candidates": res.candidates, "exact_evaluations": res.evaluated,
                      "pruned_by_objective_bound": res.candidates - res.evaluated}
    if emit is not None:
        from planner.cli.export import write_export

        write_export(best, emit, out, source="plan", option="--emit")
    if json_out:
        typer.echo(dumps(best), nl=False)
        return
    if emit is not None and out is None:
        return
    _print(model, pooled, res, best, alone, global_batch, seq_len)


def _uneven_line(u: dict | None, step_s: float) -> str:
    if u is None:
        return "uneven data parallelism (one layout replicated in every pool): nothing fits"
    per = ", ".join(f"{p['replicas']} {p['name']} replicas x {p['microbatches_per_replica']} micro-batches"
                    for p in u["pools"])
    ratio = step_s / u["step_time_s"]
    verdict = (f"{ratio:.2f}x faster than the pipeline over the pools, but no launcher the planner writes runs "
               f"different micro-batch counts per data-parallel rank: the plan above is the one to launch"
               if ratio > 1 else f"{1 / ratio:.2f}x slower than the pipeline over the pools")
    return (f"uneven data parallelism (Metis): {u['layout']} mb{u['micro_batch_size']} {u['schedule']}, {per}: "
            f"{u['step_time_s']:.3f} s per step ({verdict})")


def _print(model, pooled, res, best: dict, alone: list[dict], global_batch: int, seq_len: int) -> None:
    con = console()
    top = res.ranked[0]
    cfg, pe = top.config, top.estimate
    e = pe.estimate
    gpus = " + ".join(f"{p.num_gpus} x {p.cluster.gpu.name} ({p.name})" for p in pooled.pools)
    con.print(f"[bold]Best plan over pools:[/] {model_label(model, seq_len)} on {gpus}, global batch "
              f"{global_batch}, sequence {seq_len}")
    con.print(f"{layout_label(cfg)}  {recipe_label(cfg)}: step {e.step_time_s:.3f} s, {e.tokens_per_s:,.0f} tokens/s, "
              f"MFU {100 * e.mfu:.1f}% of the pools' bf16 peak, fits: {'yes' if e.fits else 'NO'}")
    t = Table(title="Pipeline ranks by pool")
    add_columns(t, ("rank", "pool", "GPU", "layers", "recomputed", "F+B ms / mb", "GiB", "of GiB"),
                text=("pool", "GPU", "layers"))
    from planner.cost.schedule import get_schedule

    rec, sched = cfg.recompute_layers_per_stage, get_schedule(cfg.schedule)
    for s, q, lim in zip(e.stages, pe.rank_pools, pe.memory_limits_bytes):
        pool = pooled.pools[q]
        chunks = sched.stages_of(cfg.pp, cfg.vpp, s.rank)
        k = sum(rec[j] for j in chunks) if rec is not None else 0
        t.add_row(str(s.rank), pool.name, pool.cluster.gpu.name, "+".join(map(str, s.layers)), str(k),
                  f"{1e3 * s.time_per_microbatch_s:.1f}", f"{s.peak_memory_bytes / 2**30:.1f}", f"{lim / 2**30:.1f}")
    con.print(t)
    if top.even_split_step_s is not None:
        con.print(f"even split of the same layout: {top.even_split_step_s:.3f} s per step "
                  f"(the split by pool speed is {top.even_split_step_s / e.step_time_s:.2f}x faster)")
    else:
        con.print("even split of the same layout: does not fit")
    for a in alone:
        if "infeasible" in a:
            con.print(f"pool {a['pool']} alone ({a['gpus']} x {a['gpu']}): {a['infeasible']}")
        else:
            con.print(f"pool {a['pool']} alone ({a['gpus']} x {a['gpu']}): {a['layout']}, {a['step_time_s']:.3f} s "
                      f"per step ({e.tokens_per_s / a['tokens_per_s']:.2f}x slower than the pools together)")
    con.print(_uneven_line(best["pools"]["uneven_data_parallel"], e.step_time_s))
    if res.ranked[1:]:
        t2 = Table(title="Runners-up")
        add_columns(t2, ("#", "layout", "schedule, recompute, ZeRO", "layers per stage", "step s"),
                    text=("layout", "schedule, recompute, ZeRO", "layers per stage"))
        for i, p in enumerate(res.ranked[1:], start=2):
            t2.add_row(str(i), layout_label(p.config), recipe_label(p.config),
                       ",".join(map(str, p.config.layers_per_stage)), f"{p.estimate.estimate.step_time_s:.3f}")
        con.print(t2)
    con.print(f"searched {res.candidates} layouts over the pools, {res.evaluated} partitioned and estimated exactly, "
              f"the rest ruled out by the balance bound")
    err("note: a pipeline stage never spans two pools; only the sends between pools cross their link")


__all__ = ["plan_over_pools", "pools_alone"]
