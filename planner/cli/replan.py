"""``planner replan``: the best plan after nodes are lost or added, with the cost of moving the training state."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from planner.cli.app import app, console, handle_errors
from planner.cli.render import add_columns, layout_label, recipe_label
from planner.errors import PlannerError
from planner.schema import validate_plan_json
from planner.specs.hardware import GB, load_cluster
from planner.specs.model import read_json_file
from planner.specs.stack import ANY_STACK, DEFAULT_STACK, load_stack


def _finder(model, cluster, old, stack_name: str, global_batch: int):
    """find(num_gpus, constraints, top_k) under the stack (what it runs, exported to its launcher)."""
    from planner.export import plan_for_launcher

    stack = load_stack(stack_name)

    def find(num_gpus, constraints, top_k):
        return plan_for_launcher(model, cluster, num_gpus, global_batch, old.seq_len, stack.launcher,
                                 top_k=top_k, option="--stack", precision=old.precision, stack=stack,
                                 recompute_modules=old.recompute_modules, constraints=constraints,
                                 attention_kernel=old.attention_kernel or None)  # the plan's kernel, if it named one
    return find


def _table(r) -> Table:
    from planner.replan import replan_dict

    d = replan_dict(r)
    hours = r.horizon_s / 3600
    from planner.replan import _nodes

    lost = f"{_nodes(len(r.lost_nodes))} lost" if r.lost_nodes else ""
    added = f"{_nodes(r.added_nodes)} added" if r.added_nodes else ""
    t = Table(title=f"Re-plan: {r.old.num_gpus} -> {r.num_gpus} GPUs ({', '.join(x for x in (lost, added) if x)}), "
                    f"ranked by tokens in the next {hours:g} h")
    add_columns(t, ("option", "GPUs", "layout", "schedule, recompute, ZeRO", "tokens/s", "transition s",
                    "moved GB", "busiest GPU GB", "from checkpoint GB", "tokens in horizon (B)", "break-even h"),
                text=("option", "layout", "schedule, recompute, ZeRO"))
    for o, row in zip(r.options, d["options"]):
        tr = row["transition"]
        be = row["break_even_s"]
        t.add_row(o.label, str(o.plan.config.num_gpus), layout_label(o.plan.config), recipe_label(o.plan.config),
                  f"{o.tokens_per_s:,.0f}", f"{tr['seconds']:,.1f}", f"{tr['moved_bytes'] / GB:,.0f}",
                  f"{tr['max_gpu_bytes'] / GB:,.1f}", f"{tr['lost_bytes'] / GB:,.0f}",
                  f"{row['tokens_in_horizon'] / 1e9:,.1f}", "" if be is None else f"{be / 3600:,.2f}")
    return t


@app.command()
@handle_errors
def replan(
    plan_file: Path = typer.Argument(..., help="The running job's plan (`planner plan --json`)", show_default=False),
    lose_nodes: int = typer.Option(0, "--lose-nodes", help="Nodes lost (the job's last ones)"),
    lost_nodes: str = typer.Option(None, "--lost-nodes", help="Which nodes were lost: comma list of node indices "
                                                              "(node i holds ranks i x GPUs-per-node ..)"),
    add_nodes: int = typer.Option(0, "--add-nodes", help="Nodes added"),
    gpus: int = typer.Option(None, "--gpus", help="The new GPU count (whole nodes: fewer loses the last nodes, "
                                                  "more adds nodes)"),
    horizon_hours: float = typer.Option(24.0, "--horizon-hours", help="Time the job has left: plans rank by the "
                                                                      "tokens they process in it"),
    restart_s: float = typer.Option(0.0, "--restart-s", help="The job's restart time in seconds (process start, "
                                                             "NCCL set-up, checkpoint load; not modelled)"),
    checkpoint_gb_s: float = typer.Option(None, "--checkpoint-gb-s", help="Storage read bandwidth (GB/s, all "
                                          "readers) for optimizer state lost with the nodes; without it only the "
                                          "NICs are counted"),
    top: int = typer.Option(2, "--top", help="Runner-up plans on all GPUs to compare"),
    global_batch: int = typer.Option(None, "--global-batch", help="Search the new GPUs at this global batch "
                                                                  "(default: the plan's; a different batch changes "
                                                                  "the optimization, as a batch ramp does)"),
    stack: str = typer.Option(None, "--stack", help="Training stack (default: the plan's, else "
                                                    f"{DEFAULT_STACK}; '{ANY_STACK}': everything the model knows)"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table"),
) -> None:
    """Re-plan a running job for the GPUs it has now: the best plans, the old layout with only DP changed, and
    fewer nodes where the batch splits better; for each the bytes of optimizer state and weights that must move
    (placed on the nodes that already hold the most), the state lost with the nodes, the transition time and the
    tokens it processes over the remaining horizon."""
    from planner.plan import config_from_dict, model_from_plan_dict
    from planner.replan import replan as run_replan, replan_dict

    d = read_json_file(plan_file, "plan JSON")
    source = str(plan_file)
    validate_plan_json(d, source)
    old = config_from_dict(d, source)
    model = model_from_plan_dict(d, source)
    cluster = load_cluster(str(d.get("cluster", "")))
    gpn = cluster.gpus_per_node
    given = [name for name, v in (("--lose-nodes", lose_nodes), ("--lost-nodes", lost_nodes),
                                  ("--add-nodes", add_nodes), ("--gpus", gpus)) if v]
    if not given:
        raise PlannerError("say what changed", source="replan",
                           fix="give --lose-nodes K, --lost-nodes i,j, --add-nodes K or --gpus N")
    if gpus is not None and len(given) > 1:
        raise PlannerError(f"--gpus sets the new count; drop {given[0] if given[0] != '--gpus' else given[1]}",
                           source="--gpus")
    if lose_nodes and lost_nodes:
        raise PlannerError("give the count or the nodes, not both", source="--lost-nodes")
    nodes = None
    if lost_nodes:
        try:
            nodes = tuple(int(x) for x in lost_nodes.split(","))
        except ValueError:
            raise PlannerError(f"not a comma list of node indices: {lost_nodes!r}", source="--lost-nodes") from None
    if gpus is not None:
        if gpus < 1 or gpus % gpn:
            raise PlannerError(f"must be a positive multiple of {gpn} GPUs per node, got {gpus}", source="--gpus")
        change = (gpus - old.num_gpus) // gpn
        lose_nodes, add_nodes = max(0, -change), max(0, change)
    stack_name = stack or d.get("stack") or DEFAULT_STACK
    batch = old.global_batch_size if global_batch is None else global_batch
    find = None if stack_name == ANY_STACK else _finder(model, cluster, old, stack_name, batch)
    result = run_replan(model, cluster, old, lose_nodes=lose_nodes, lost_nodes=nodes, add_nodes=add_nodes,
                        horizon_s=horizon_hours * 3600, restart_s=restart_s,
                        checkpoint_bytes_per_s=checkpoint_gb_s * GB if checkpoint_gb_s is not None else None,
                        top_k=top, find=find, global_batch=batch)
    if json_out:
        typer.echo(json.dumps({**replan_dict(result), "stack": stack_name}, indent=2, sort_keys=True))
        return
    con = console()
    con.print(_table(result))
    for note in result.notes:
        con.print(f"note: {note}")
    con.print("transition: each GPU receives the optimizer states and weights its new place needs over its NIC "
              "(nodes placed where they already hold the most); state lost with the nodes comes from a checkpoint"
              + ("" if checkpoint_gb_s else " (give --checkpoint-gb-s to time the storage read)")
              + (f"; plus the restart time {restart_s:g} s" if restart_s else "; restart time not counted "
                                                                             "(--restart-s)"))
