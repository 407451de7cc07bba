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
    "offload_s": "activation offload (exposed)",
    "dp_comm_s": "DP comm (exposed)",
    "dp_imbalance_s": "DP wait for heaviest packed data",
    "optimizer_s": "optimizer step",
}


#: narrowest a text column gets on a narrow terminal (it folds onto more lines instead)
TEXT_MIN_WIDTH = 6


def add_columns(t: Table, names: tuple[str, ...] | list[str], text: tuple[str, ...] = ()) -> None:
    """Columns that stay readable on a narrow terminal: numbers right-aligned and never wrapped or cut (rich
    narrows the wrappable columns first), the ``text`` ones folded onto more lines instead of cut."""
    for name in names:
        if name in text:
            t.add_column(name, overflow="fold", min_width=min(len(name), TEXT_MIN_WIDTH))
        else:  # a header of several words stacks them, so it is no wider than its longest word
            t.add_column(name.replace(" ", "\n"), justify="right", no_wrap=True)


def degrees(cfg: RunConfig) -> list[tuple[str, int, str]]:
    """The parallel degrees a layout names, (label, degree, suffix): TP, PP and DP always; CP (with its kind's
    initial), EP, expert TP and virtual stages where they are in use."""
    out = [("TP", cfg.tp, ""), ("PP", cfg.pp, ""), ("DP", cfg.dp, "")]
    for label, value, suffix, used in (("CP", cfg.cp, cfg.cp_kind[0], cfg.cp > 1), ("EP", cfg.ep, "", cfg.ep > 1),
                                       ("ETP", cfg.expert_tp, "", cfg.expert_tp != cfg.tp),
                                       ("VPP", cfg.vpp, "", cfg.vpp > 1)):
        if used:
            out.append((label, value, suffix))
    return out


def layout_label(cfg: RunConfig) -> str:
    """The parallel layout in one short string: "TP8 PP2 DP16 CP2r EP8 VPP5 mb2x16 SP" (TP and PP of 1 left
    out)."""
    parts = [f"{label}{value}{suffix}" for label, value, suffix in degrees(cfg)
             if not (label in ("TP", "PP") and value == 1)]
    parts.append(f"mb{cfg.micro_batch_size}x{cfg.num_microbatches}")
    if cfg.sequence_parallel and cfg.tp > 1:
        parts.append("SP")
    return " ".join(parts)


def recipe_label(cfg: RunConfig) -> str:
    """Schedule, recomputation and ZeRO stage (and HSDP's shard size x replicas): "interleaved-1f1b, full 7, ZeRO-1",
    "1f1b, none, ZeRO-3 HSDP 64x4"."""
    rec = cfg.recompute
    if cfg.recompute_layers_per_stage is not None:
        rec += " " + ",".join(map(str, cfg.recompute_layers_per_stage))
    elif cfg.recompute == "full" and cfg.recompute_num_layers:
        rec += f" {cfg.recompute_num_layers}"
    hsdp = f" HSDP {cfg.zero_shard_dp}x{cfg.dp_replicas}" if cfg.dp_shard is not None and cfg.dp_replicas > 1 else ""
    offload = ", offload" if cfg.offload_modules else ""
    return f"{cfg.schedule}, {rec}{offload}, ZeRO-{cfg.zero_stage}{hsdp}"


def config_line(cfg: RunConfig) -> str:
    long = {"ETP": "expert TP"}
    parts = [f"{long.get(label, label)} {value}" + (f" ({cfg.cp_kind})" if label == "CP" else "")
             for label, value, _ in degrees(cfg)]
    parts += [f"mb {cfg.micro_batch_size} x {cfg.num_microbatches}", cfg.schedule,
              f"recompute {cfg.recompute}" + (f"({cfg.recompute_num_layers})" if cfg.recompute_num_layers else ""),
              f"ZeRO-{cfg.zero_stage}" + (f" (HSDP: shards of {cfg.zero_shard_dp} DP ranks x {cfg.dp_replicas} "
                                           f"replicas)" if cfg.dp_shard is not None else ""),
              "SP" if cfg.sequence_parallel and cfg.tp > 1 else "no SP"]
    if cfg.tp_comm_overlap and cfg.tp > 1:
        parts.append("TP overlap")
    if cfg.ep > 1 and cfg.ep_comm_overlap:
        parts.append("all-to-all overlap")
    if cfg.ep > 1 and cfg.ep_dispatcher != "alltoall":  # a launch needs that library (DeepEP / HybridEP)
        parts.append(f"{cfg.ep_dispatcher} dispatch")
    if cfg.precision != "bf16":
        parts.append(cfg.precision)
    if cfg.offload_modules:
        parts.append(f"offload {cfg.offload_modules} to host")
    return ", ".join(parts)


def offload_line(est: Estimate) -> str:
    """Activation offloading's host traffic: per rank the bytes each micro-batch sends each way, what stays in host
    memory, and the transfer time compute does not hide ("" without offloading)."""
    ranks = [s for s in est.stages if s.offload_bytes > 0]
    if not ranks:
        return ""
    per = "; ".join(f"rank {s.rank} {s.offload_bytes / GIB:.2f} GiB per micro-batch each way, "
                    f"{s.host_memory_bytes / GIB:.1f} GiB held" for s in ranks[:4])
    more = f" (and {len(ranks) - 4} more ranks)" if len(ranks) > 4 else ""
    return (f"activation offload over the host link: {per}{more}; {est.breakdown.get('offload_s', 0.0):.3f} s per "
            f"step not hidden by compute")


def model_label(model, seq_len: int | None = None) -> str:
    """A model's name with its parameter count: "llama-3.1-8b (8.03B params)", "deepseek-v3 (671B params, 37.6B
    active per token)"."""
    from planner.cost.memory import active_params, total_params

    def b(n: float) -> str:
        return f"{n / 1e9:.3g}B"

    total = total_params(model, seq_len)
    text = f"{model.name} ({b(total)} params"
    if model.is_moe:
        text += f", {b(active_params(model, seq_len))} active per token"
    return text + ")"


def summary_table(est: dict[str, Any], title: str = "Estimate") -> Table:
    """The headline figures of an estimate, from its JSON form (``Estimate.to_dict`` or a plan file's)."""
    t = Table(title=title, show_header=False)
    add_columns(t, ("metric", "value"), text=("metric",))
    t.add_row("step time", f"{est['step_time_s']:.3f} s")
    t.add_row("throughput", f"{est['tokens_per_s']:,.0f} tokens/s")
    t.add_row("model TFLOP/s per GPU", f"{est['tflops_per_gpu']:.1f}")
    # both against the GPU's dense 16-bit peak (step.estimate), fp8 runs included: 8-bit GEMMs can read above 50%
    t.add_row("MFU / HFU (of the bf16 peak; attention: full s² square)",
              f"{100 * est['mfu']:.1f}% / {100 * est['hfu']:.1f}%")
    t.add_row("peak memory", f"{est['peak_memory_gib']:.1f} GiB of {est['memory_limit_gib']:.1f} GiB usable")
    t.add_row("fits", "[green]yes[/]" if est["fits"] else "[red]NO[/]")
    return t


def time_table(est: Estimate) -> Table:
    t = Table(title="Step time breakdown (busiest pipeline rank)")
    add_columns(t, ("component", "seconds", "share"), text=("component",))
    for key, label in TIME_LABELS.items():
        v = est.breakdown.get(key, 0.0)
        if v <= 0 and key not in ("compute_s",):
            continue
        t.add_row(label, f"{v:.3f}", f"{100 * v / est.step_time_s:.1f}%")
    t.add_row("[bold]step[/]", f"[bold]{est.step_time_s:.3f}[/]", "100%")
    return t


def stage_table(est: Estimate) -> Table:
    """Per pipeline rank: its layers, time per micro-batch and peak memory (the memory's parts: ``memory_table``)."""
    t = Table(title="Per pipeline rank: time per micro-batch (ms) and peak memory (GiB)")
    add_columns(t, ("rank", "layers", "fwd ms", "bwd ms", "recomp ms", "in-flight", "peak GiB"), text=("layers",))
    limit = est.memory_limit_bytes
    for s in est.stages:
        peak = s.peak_memory_bytes
        text = f"{peak / GIB:.1f}"
        t.add_row(str(s.rank), "+".join(map(str, s.layers)), f"{1e3 * s.fwd_s:.1f}", f"{1e3 * s.bwd_s:.1f}",
                  f"{1e3 * s.recompute_s:.1f}", f"{s.inflight_microbatches:g}",
                  f"[red]{text}[/]" if peak > limit else text)
    return t


def memory_table(est: Estimate) -> Table:
    """Per pipeline rank: what its peak memory holds (GiB)."""
    t = Table(title=f"Peak memory per pipeline rank (GiB of {est.memory_limit_bytes / GIB:.1f} usable)")
    add_columns(t, ("rank", "weights", "grads", "optim", "activ.", "workspace", "peak"))
    for s in est.stages:
        m = s.memory_bytes
        t.add_row(str(s.rank), *(f"{m.get(k, 0) / GIB:.1f}" for k in ("weights", "gradients", "optimizer",
                                                                       "activations", "workspace")),
                  f"{s.peak_memory_bytes / GIB:.1f}")
    return t


def accuracy_line(accuracy: dict | None) -> str:
    """How sure the estimate is, from the validation residuals of runs like it (``validation.bands``)."""
    if not accuracy:
        return ""
    how = "published runs like this one" if accuracy["same_kind_of_run"] else "the nearest published runs"
    line = (f"model accuracy on {how} ({accuracy['group']}, {accuracy['rows']} rows): "
            f"±{100 * accuracy['mean_abs_error']:.1f}% mean error in throughput")
    return line + bias_words(accuracy.get("mean_signed_error", 0.0))


def bias_words(signed: float) -> str:
    """The validation rows' mean signed error in words: which way the model errs on such runs (empty within 1%)."""
    if abs(signed) < 0.01:
        return ""
    return f", {100 * signed:+.1f}% on average (it reads such runs {'fast' if signed > 0 else 'slow'})"


def attention_kernel_priced(gpu: Any, cfg: RunConfig) -> str | None:
    """The name of the profile's table that priced ``cfg``'s fused attention (None: no fused kernel, or a profile
    with one attention efficiency): the ``attention_kernel_priced`` of estimate / plan JSON."""
    return gpu.attention_kernel_priced(cfg.attention_kernel) if cfg.flash_attention else None


def attention_kernel_line(gpu: Any, cfg: RunConfig) -> str:
    """Which attention kernel's table priced the fused attention ("" without a fused kernel or kernel tables)."""
    priced = attention_kernel_priced(gpu, cfg)
    if priced is None:
        return ""
    if cfg.attention_kernel and priced != cfg.attention_kernel:
        return (f"attention kernel: {cfg.attention_kernel} asked, but the profile has no table for it: "
                f"{priced}'s priced")
    return f"attention kernel: {priced}"


def print_estimate(console: Console, est: Estimate, cfg: RunConfig, header: str,
                   accuracy: dict | None = None, kernel_line: str = "") -> None:
    console.print(f"[bold]{header}[/]")
    console.print(config_line(cfg) + (f"; {kernel_line}" if kernel_line else ""))
    console.print(summary_table(est.to_dict(with_stages=False)))
    if accuracy:
        console.print(accuracy_line(accuracy))
    console.print(time_table(est))
    console.print(stage_table(est))
    console.print(memory_table(est))
    if offload_line(est):
        console.print(offload_line(est))
