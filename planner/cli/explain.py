"""``planner explain PLAN.json``: where a plan's step time and memory go, per pipeline stage.

The plan is re-estimated from its ``model_spec`` and cluster name (so the numbers follow the current cost model);
when the cluster is not a shipped profile, the plan carries no ``model_spec``, or ``--stored`` is given, the estimate
stored in the plan is shown instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner.cli.app import app, check_writable, console, err, handle_errors
from planner.cli.render import TIME_LABELS, add_columns, config_line, summary_table
from planner.cost.schedule import get_schedule
from planner.cost.step import estimate
from planner.errors import PlannerError
from planner.plan import config_from_dict, model_from_plan_dict
from planner.schema import validate_plan_json
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import read_json_file

#: colours of the step-time components in the bar chart
COLORS = {
    "compute_s": "green", "recompute_s": "yellow", "bubble_s": "red", "tp_comm_s": "cyan", "cp_comm_s": "blue",
    "ep_comm_s": "magenta", "pp_comm_s": "bright_cyan", "offload_s": "bright_magenta", "dp_comm_s": "bright_blue",
    "dp_imbalance_s": "bright_red", "optimizer_s": "white", "other_s": "grey50",
}
MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "workspace")
MEMORY_COLORS = {"weights": "green", "gradients": "cyan", "optimizer": "blue", "activations": "yellow",
                 "workspace": "magenta"}
#: a residual below this fraction of the step is rounding, not a component worth a bar
RESIDUAL_FRACTION = 1e-3
EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of ``fraction`` x ``width`` cells, with eighth-cell resolution."""
    cells = max(0.0, min(1.0, fraction)) * width
    full, rest = int(cells), int(round((cells - int(cells)) * 8))
    if rest == 8:
        full, rest = full + 1, 0
    return "█" * full + (EIGHTHS[rest] if rest else "")


def time_components(est: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(key, label, seconds) of every non-zero step-time component, plus the unattributed rest if it matters."""
    step = est["step_time_s"]
    out = [(k, label, float(est["breakdown"].get(k, 0.0))) for k, label in TIME_LABELS.items()]
    out = [row for row in out if row[2] > 0 or row[0] == "compute_s"]
    rest = step - sum(s for _, _, s in out)
    if abs(rest) > RESIDUAL_FRACTION * step:
        out.append(("other_s", "other (overlap credit / rounding)" if rest < 0 else "other", rest))
    return out


def time_chart(est: dict[str, Any], width: int) -> Table:
    step = est["step_time_s"]
    t = Table(title=f"Where the step time goes ({step:.3f} s per step)", show_edge=False, box=None)
    add_columns(t, ("component", "seconds", "share"), text=("component",))
    t.add_column("")
    for key, label, s in time_components(est):
        t.add_row(label, f"{s:.3f}", f"{100 * s / step:.1f}%", Text(bar(abs(s) / step, width), style=COLORS[key]))
    return t


def stage_time_table(est: dict[str, Any], cfg: RunConfig) -> Table:
    """Per pipeline rank: per-micro-batch compute times (the communication and idle time: ``stage_comm_table``)."""
    m, sched = cfg.num_microbatches, get_schedule(cfg.schedule)
    unit = "micro-batch" if sched.microbatches_per_pass == 1 else "pass: one micro-batch each way"
    t = Table(title=f"Time per pipeline rank (ms per {unit}; {m} micro-batches per step)")
    add_columns(t, ("rank", "layers", "fwd", "bwd", "bwd W", "recomp", "per mb"), text=("layers",))
    busiest = max(s["fwd_s"] + s["bwd_s"] + s["recompute_s"] for s in est["stages"])
    for s in est["stages"]:
        per_mb = s["fwd_s"] + s["bwd_s"] + s["recompute_s"]
        t.add_row(str(s["rank"]), "+".join(map(str, s["layers"])),
                  *(f"{1e3 * s[k]:.1f}" for k in ("fwd_s", "bwd_s", "bwd_weight_s", "recompute_s")),
                  f"{1e3 * per_mb:.1f}", style="bold" if per_mb == busiest else "")
    return t


def stage_comm_table(est: dict[str, Any], cfg: RunConfig) -> Table:
    """Per pipeline rank: exposed communication per micro-batch, busy time per step and idle time (bubble and
    waiting)."""
    m = get_schedule(cfg.schedule).passes(cfg.num_microbatches)  # per-micro-batch work runs per step (DualPipe: m/2)
    pipe_s = est["step_time_s"] - est["breakdown"].get("dp_comm_s", 0.0) - est["breakdown"].get("optimizer_s", 0.0)
    t = Table(title="Exposed communication per pipeline rank (ms per micro-batch) and its time per step (s)")
    add_columns(t, ("rank", "TP comm", "CP comm", "EP comm", "PP comm", "busy s/step", "idle s/step"))
    for s in est["stages"]:
        per_mb = s["fwd_s"] + s["bwd_s"] + s["recompute_s"]
        t.add_row(str(s["rank"]), *(f"{1e3 * s[k]:.1f}" for k in ("tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s")),
                  f"{m * per_mb:.3f}", f"{max(0.0, pipe_s - m * per_mb):.3f}")
    return t


def stage_memory_table(est: dict[str, Any]) -> Table:
    limit = est["memory_limit_gib"]
    t = Table(title=f"Peak memory per pipeline rank (GiB; {limit:.1f} GiB usable per GPU)")
    add_columns(t, ("rank", "in-flight mb", "weights", "grads", "optim", "activ.", "work space", "peak", "free"))
    for s in est["stages"]:
        mem = s["memory_gib"]
        peak = s["peak_memory_gib"]
        over = peak > limit
        t.add_row(str(s["rank"]), f"{s['inflight_microbatches']:g}", *(f"{mem.get(p, 0.0):.1f}" for p in MEMORY_PARTS),
                  f"[red]{peak:.1f}[/]" if over else f"{peak:.1f}",
                  f"[red]{limit - peak:.1f}[/]" if over else f"{limit - peak:.1f}")
    return t


def stacked_bar(parts: list[tuple[float, str]], total: float, width: int) -> Text:
    """Segments of one bar (value, style) to scale of ``total`` over ``width`` cells; segment ends are rounded
    from the running sum so that the bar's length is right however many segments it has."""
    text, cum, drawn = Text(), 0.0, 0
    for value, style in parts:
        cum += max(0.0, value)
        end = int(round(min(cum / total, 1.0) * width))
        if end > drawn:
            text.append("█" * (end - drawn), style=style)
            drawn = end
    return text


def memory_chart(est: dict[str, Any], width: int) -> Table:
    """One stacked bar per rank, to scale of the usable memory ('|' marks the limit)."""
    limit = est["memory_limit_gib"]
    legend = "  ".join(f"[{MEMORY_COLORS[p]}]█[/] {p}" for p in MEMORY_PARTS)
    t = Table(title=f"Memory per rank ('|' = {limit:.1f} GiB usable)", caption=legend, show_edge=False, box=None)
    add_columns(t, ("rank",))
    t.add_column("")
    add_columns(t, ("peak GiB",))
    for s in est["stages"]:
        chart = stacked_bar([(s["memory_gib"].get(p, 0.0), MEMORY_COLORS[p]) for p in MEMORY_PARTS], limit, width)
        chart.append(" " * max(0, width - chart.cell_len) + "|")
        if s["peak_memory_gib"] > limit:
            chart.append(" over", style="red")
        t.add_row(str(s["rank"]), chart, f"{s['peak_memory_gib']:.1f}")
    return t


def plan_estimate(d: dict[str, Any], source: str, stored: bool) -> tuple[dict[str, Any], str]:
    """The estimate to explain (as a dict) and where it came from."""
    stored_est = d.get("estimate") if isinstance(d.get("estimate"), dict) else None
    reason = "--stored"
    if not stored:
        cfg = config_from_dict(d, source)
        if isinstance(d.get("model_spec"), dict):
            model = model_from_plan_dict(d, source)
            from planner.specs.pools import is_pooled_cluster, load_pooled_cluster

            if is_pooled_cluster(str(d.get("cluster", ""))):  # a plan over several GPU pools
                from planner.cost.pooled import pooled_estimate

                pooled = pooled_estimate(model, load_pooled_cluster(str(d["cluster"])), cfg)
                return pooled.estimate.to_dict(with_stages=True), "re-estimated over the pools"
            try:
                cluster = load_cluster(str(d.get("cluster", "")))
            except PlannerError as e:
                reason = f"cluster not loadable ({e.reason})"
            else:
                data = d.get("data")
                if isinstance(data, dict) and "seq_len_dist" in data:  # --seq-len-dist: over the distribution
                    from planner.cost.variable_length import length_aware_estimate
                    from planner.specs.lengths import from_description

                    dist = from_description(data["seq_len_dist"], f"{source}: data.seq_len_dist")
                    aware = length_aware_estimate(model, cluster, cfg, dist, bool(data.get("packing", True)))
                    return aware.estimate.to_dict(with_stages=True), "re-estimated over the plan's length distribution"
                return estimate(model, cluster, cfg).to_dict(with_stages=True), "re-estimated with the current model"
        else:
            reason = "the plan has no model_spec"
    if not stored_est or not stored_est.get("stages"):
        raise PlannerError(f"cannot re-estimate ({reason}) and the plan stores no per-stage estimate",
                           source=source, field="estimate",
                           fix="pass a file written by `planner plan --json` with a shipped cluster name")
    return stored_est, f"stored in the plan ({reason})" if reason != "--stored" else "stored in the plan"


def print_explanation(con: Console, d: dict[str, Any], est: dict[str, Any], origin: str, width: int) -> None:
    cfg = config_from_dict(d)
    con.print(f"[bold]{d.get('model', 'model')} on {cfg.num_gpus} GPUs ({d.get('cluster', '?')})[/]  "
              f"[dim]estimate {origin}[/]")
    con.print(config_line(cfg))
    pools = d.get("pools")
    if isinstance(pools, dict) and isinstance(pools.get("pools"), list):
        con.print("pools: " + "; ".join(
            f"{p.get('name')} ({p.get('gpus')} x {p.get('gpu')}): pipeline ranks "
            f"{', '.join(map(str, p.get('ranks', [])))}" for p in pools["pools"] if isinstance(p, dict)))
    con.print(summary_table(est))
    con.print(time_chart(est, width))
    con.print(stage_time_table(est, cfg))
    con.print(stage_comm_table(est, cfg))
    con.print(stage_memory_table(est))
    con.print(memory_chart(est, width))


@app.command()
@handle_errors
def explain(
    plan_file: Path = typer.Argument(..., help="A plan JSON written by `planner plan --json` (or `estimate --json`)",
                                     show_default=False),
    stored: bool = typer.Option(False, "--stored", help="Show the estimate stored in the plan; do not re-estimate"),
    width: int = typer.Option(40, "--width", help="Width of the bar chart in characters"),
    html_file: Path = typer.Option(None, "--html", help="Write one self-contained HTML page (no network): the "
                                                        "simulated pipeline timeline, the step-time breakdown and "
                                                        "the memory per rank", show_default=False),
) -> None:
    """Explain a plan: time and memory per pipeline stage and a bar chart of where the step time goes (or, with
    --html FILE, a page with the pipeline timeline)."""
    if width < 1:
        raise PlannerError(f"must be >= 1, got {width}", source="--width")
    if html_file is not None:
        check_writable(html_file, "--html")
    d = read_json_file(plan_file, "plan JSON")
    source = str(plan_file)
    validate_plan_json(d, source)
    est, origin = plan_estimate(d, source, stored)
    old = d.get("estimate", {}).get("step_time_s") if isinstance(d.get("estimate"), dict) else None
    if old and origin.startswith("re-estimated") and abs(est["step_time_s"] - old) > RESIDUAL_FRACTION * old:
        err(f"note: the plan stored a step time of {old:.3f} s; the current cost model estimates "
            f"{est['step_time_s']:.3f} s")
    if html_file is not None:
        from planner.cli.html_report import render_html
        html_file.write_text(render_html(d, est, origin, config_from_dict(d, source)))
        console().print(f"wrote {html_file}")
        return
    print_explanation(console(), d, est, origin, width)
