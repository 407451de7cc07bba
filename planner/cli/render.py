"""Rich renderings shared by the commands: time breakdown, per-stage table, plan summary."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from planner.cost.step import Estimate
from planner.specs.config import RunConfig
from planner.specs.hardware import GIB

TIME_LABELS = {
    "compute_s": "compute (fwd + bwd)",
    "recompute_s": "recompute",
    "bubble_s": "pipeline bubble",
    "tp_comm_s": "TP comm (exposed)",
    "cp_comm_s": "CP comm (exposed)",
    "ep_comm_s": "EP comm (exposed)",
    "pp_comm_s": "PP comm (exposed)",
    "dp_comm_s": "DP comm (exposed)",
    "optimizer_s": "optimizer step",
}


def config_line(cfg: RunConfig) -> str:
    parts = [f"TP {cfg.tp}", f"PP {cfg.pp}", f"DP {cfg.dp}"]
    if cfg.cp > 1:
        parts.append(f"CP {cfg.cp} ({cfg.cp_kind})")
    if cfg.ep > 1:
        parts.append(f"EP {cfg.ep}")
    if cfg.expert_tp != cfg.tp:
        parts.append(f"expert TP {cfg.expert_tp}")
    if cfg.vpp > 1:
        parts.append(f"VPP {cfg.vpp}")
    parts += [f"mb {cfg.micro_batch_size} x {cfg.num_microbatches}", cfg.schedule,
              f"recompute {cfg.recompute}" + (f"({cfg.recompute_num_layers})" if cfg.recompute_num_layers else ""),
              f"ZeRO-{cfg.zero_stage}", "SP" if cfg.sequence_parallel and cfg.tp > 1 else "no SP"]
    if cfg.tp_comm_overlap and cfg.tp > 1:
        parts.append("TP overlap")
    if cfg.precision != "bf16":
        parts.append(cfg.precision)
    return ", ".join(parts)


def summary_table(est: dict[str, Any], title: str = "Estimate") -> Table:
    """The headline figures of an estimate, from its JSON form (``Estimate.to_dict`` or a plan file's)."""
    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("step time", f"{est['step_time_s']:.3f} s")
    t.add_row("throughput", f"{est['tokens_per_s']:,.0f} tokens/s")
    t.add_row("model TFLOP/s per GPU", f"{est['tflops_per_gpu']:.1f}")
    t.add_row("MFU / HFU", f"{100 * est['mfu']:.1f}% / {100 * est['hfu']:.1f}%")
    t.add_row("peak memory", f"{est['peak_memory_gib']:.1f} GiB of {est['memory_limit_gib']:.1f} GiB usable")
    t.add_row("fits", "[green]yes[/]" if est["fits"] else "[red]NO[/]")
    return t


def time_table(est: Estimate) -> Table:
    t = Table(title="Step time breakdown (busiest pipeline rank)")
    t.add_column("component")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for key, label in TIME_LABELS.items():
        v = est.breakdown.get(key, 0.0)
        if v <= 0 and key not in ("compute_s",):
            continue
        t.add_row(label, f"{v:.3f}", f"{100 * v / est.step_time_s:.1f}%")
    t.add_row("[bold]step[/]", f"[bold]{est.step_time_s:.3f}[/]", "100%")
    return t


def stage_table(est: Estimate) -> Table:
    t = Table(title="Per pipeline rank: time per micro-batch and peak memory (GiB)")
    for col in ("rank", "layers", "fwd ms", "bwd ms", "recomp ms", "in-flight", "weights", "grads", "optim",
                "activ.", "workspace", "peak"):
        t.add_column(col, justify="right")
    limit = est.memory_limit_bytes
    for s in est.stages:
        m = s.memory_bytes
        peak = s.peak_memory_bytes
        style = "red" if peak > limit else ""
        t.add_row(str(s.rank), "+".join(map(str, s.layers)), f"{1e3 * s.fwd_s:.1f}", f"{1e3 * s.bwd_s:.1f}",
                  f"{1e3 * s.recompute_s:.1f}", f"{s.inflight_microbatches:g}",
                  *(f"{m.get(k, 0) / GIB:.1f}" for k in ("weights", "gradients", "optimizer", "activations",
                                                          "workspace")),
                  f"[{style}]{peak / GIB:.1f}[/]" if style else f"{peak / GIB:.1f}")
    return t


def accuracy_line(accuracy: dict | None) -> str:
    """How sure the estimate is, from the validation residuals of runs like it (``validation.bands``)."""
    if not accuracy:
        return ""
    how = "runs like this one" if accuracy["same_kind_of_run"] else "the nearest validated runs"
    return (f"model accuracy on published {how} ({accuracy['group']}, {accuracy['rows']} rows): "
            f"±{100 * accuracy['mean_abs_error']:.1f}% mean error in throughput")


def print_estimate(console: Console, est: Estimate, cfg: RunConfig, header: str,
                   accuracy: dict | None = None) -> None:
    console.print(f"[bold]{header}[/]")
    console.print(config_line(cfg))
    console.print(summary_table(est.to_dict(with_stages=False)))
    if accuracy:
        console.print(accuracy_line(accuracy))
    console.print(time_table(est))
    console.print(stage_table(est))
