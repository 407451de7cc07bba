"""``planner list models|clusters|schedules|stacks|launchers|distributions``: what ships with the planner."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from planner.cli.app import app, choice, console, handle_errors
from planner.cli.render import add_columns
from planner.cost.memory import total_params
from planner.cost.schedule import SCHEDULES
from planner.errors import PlannerError
from planner.export import megatron, torchtitan
from planner.specs.hardware import GB, GIB, TFLOPS, US, load_cluster, shipped_clusters
from planner.specs.model import load_model, shipped_models

KINDS = ("models", "clusters", "schedules", "stacks", "launchers", "distributions")
BILLION = 1e9


def model_rows() -> list[dict[str, Any]]:
    rows = []
    for name in shipped_models():
        try:
            m = load_model(name)
        except PlannerError as e:
            rows.append({"name": name, "error": str(e)})
            continue
        rows.append({
            "name": name, "model_type": m.model_type, "params_b": total_params(m) / BILLION,
            "layers": m.num_layers, "hidden_size": m.hidden_size, "heads": m.num_heads, "kv_heads": m.num_kv_heads,
            "vocab_size": m.vocab_size, "max_seq_len": m.max_seq_len,
            "experts": f"{m.experts_per_token} of {m.num_experts}" if m.is_moe else "",
        })
    return rows


def cluster_rows() -> list[dict[str, Any]]:
    rows = []
    for name in shipped_clusters():
        try:
            c = load_cluster(name)
        except PlannerError as e:
            rows.append({"name": name, "error": str(e)})
            continue
        rows.append({
            "name": name, "gpu": c.gpu.name, "bf16_tflops": c.gpu.peak_flops / TFLOPS, "hbm_gib": c.gpu.hbm_bytes / GIB,
            "gpus_per_node": c.gpus_per_node, "intra_node_gb_s": c.intra_node.bandwidth_bytes_per_s / GB,
            "inter_node_gb_s": c.inter_node.bandwidth_bytes_per_s / GB, "max_gpus": c.max_gpus or None,
            # in --json only (the table is full at 80 columns): the kernels --attention-kernel can name here, and
            # the share of the datasheet tensor rate the part sustains under its power limit (bf16_tflops's), and
            # the Mamba-2 SSD kernels' fitted rate (None: priced at their roofline), and the current Megatron-Core
            # release's fitted MoE host times by precision: one expert GEMM call, and what the all-to-all
            # dispatcher's sync adds per grouped GEMM pass (microseconds; a stack release may give its own)
            "attention_kernels": list(c.gpu.attention_kernel_names()),
            "sustained_tensor_ratio": c.gpu.sustained_tensor_ratio,
            "ssd_scan_tflops": c.gpu.ssd_scan_flops / TFLOPS if c.gpu.ssd_scan_flops else None,
            "expert_gemm_call_us": {p: v / US for p, v in c.gpu.expert_gemm_call_s},
            "expert_alltoall_sync_us": {p: v / US for p, v in c.gpu.expert_alltoall_sync_s},
        })
    from planner.specs.pools import load_pooled_cluster, shipped_pooled_clusters

    for name in shipped_pooled_clusters():  # several GPU pools (planner plan --cluster NAME plans over them)
        try:
            pc = load_pooled_cluster(name)
        except PlannerError as e:
            rows.append({"name": name, "error": str(e)})
            continue
        rows.append({"name": name, "gpu": "pools: " + " + ".join(f"{p.num_gpus} x {p.cluster.gpu.name}"
                                                                 for p in pc.pools),
                     "bf16_tflops": None, "hbm_gib": None, "gpus_per_node": None, "intra_node_gb_s": None,
                     "inter_node_gb_s": None, "max_gpus": pc.num_gpus, "attention_kernels": [],
                     "pools": [{"name": p.name, "profile": p.cluster.name, "nodes": p.nodes} for p in pc.pools]})
    return rows


def _launchers_running(name: str) -> list[str]:
    """The exporters that can run schedule ``name``."""
    out = []
    if megatron.SCHEDULE_SUPPORT.get(name):
        out += ["megatron", "nemo"]
    if name == "1f1b":
        out.append("deepspeed")
    if torchtitan.SCHEDULE_NAMES.get(name):
        out += ["torchtitan", "torchtitan-0.3"]
    return out


def schedule_launchers(name: str) -> str:
    """Which exporters can run a schedule (with torchtitan's class name)."""
    text = ", ".join(_launchers_running(name)) or "none"
    torch_name = torchtitan.SCHEDULE_NAMES.get(name)
    return f"{text} ({torch_name})" if torch_name else text


def schedule_rows() -> list[dict[str, Any]]:
    return [{"name": s.name, "virtual_stages": bool(getattr(s, "supports_vpp", False)),
             "launchers": schedule_launchers(s.name), "description": s.description} for s in SCHEDULES.values()]


def launcher_rows() -> list[dict[str, Any]]:
    """The exporters: the release each targets, what it writes, what checks it, and the schedules it runs."""
    from planner.export import TARGETS, target_module
    out = []
    for name in TARGETS:
        mod = target_module(name)
        runs = [s for s in SCHEDULES if name in _launchers_running(s)]
        out.append({"name": name, "release": mod.RELEASE, "format": mod.FORMAT, "checked_by": mod.CHECKED_BY,
                    "schedules": ", ".join(runs)})
    return out


def stack_rows() -> list[dict[str, Any]]:
    from planner.specs.config import DEFAULT_RECOMPUTE_MODULES
    from planner.specs.stack import DEFAULT_STACK, load_stack, shipped_stacks

    def row(name: str, s) -> dict[str, Any]:
        opts = [k for k in ("flash_attention", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                            "overlap_p2p_comm") if getattr(s, k)] + \
            [f"grad reduce {'fp32' if s.grad_reduce_bytes == 4 else 'bf16'}"] + \
            ([f"attention {s.attention_kernel}"] if s.attention_kernel and s.flash_attention else []) + \
            (["fp8 weights as Transformer Engine holds them"] if s.te_quantized_weights else []) + \
            ([f"Adam moments {' or '.join(s.adam_moments)}"] if len(s.adam_moments) > 1 else []) + \
            ([f"selective recompute {s.recompute_modules}"]
             if s.recompute_modules != DEFAULT_RECOMPUTE_MODULES else []) + \
            ([f"biased grouped expert weight gradients x{s.biased_grouped_wgrad_factor:g} in 16-bit (fitted)"]
             if s.biased_grouped_wgrad_factor != 1.0 else [])
        return {"name": name + (" (default)" if name == DEFAULT_STACK else ""), "launcher": s.launcher,
                "options": ", ".join(opts), "schedules": ", ".join(s.schedules),
                "zero_stages": ", ".join(map(str, s.zero_stages)), "cp_kinds": ", ".join(s.cp_kinds) or "none",
                "moe_overlap": "yes" if True in s.ep_comm_overlap_choices else "no",
                "dispatchers": ", ".join(s.ep_dispatcher_choices), "description": s.description}

    return _loaded_rows(shipped_stacks(), load_stack, row)


def _loaded_rows(names, load, row) -> list[dict[str, Any]]:
    """One row per shipped file: ``row(name, load(name))``, or the name and the reason it does not load."""
    out = []
    for name in names:
        try:
            loaded = load(name)
        except PlannerError as e:
            out.append({"name": name, "error": e.reason})
            continue
        out.append(row(name, loaded))
    return out


def distribution_rows() -> list[dict[str, Any]]:
    """The shipped sample-length histograms of public data sets (``--seq-len-dist NAME``)."""
    from planner.specs.lengths import load_seq_len_dist, shipped_distributions

    return _loaded_rows(shipped_distributions(), load_seq_len_dist, lambda name, d: {
        "name": name, "mean_tokens": d.mean_len, "max_tokens": d.max_len,
        "doc_len_tokens": d.packed_doc_len(d.max_len), "source": d.source})


ROWS = {"models": model_rows, "clusters": cluster_rows, "schedules": schedule_rows, "stacks": stack_rows,
        "launchers": launcher_rows, "distributions": distribution_rows}
#: column key -> (header, format)
COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "models": [("name", "name", "{}"), ("params_b", "params (B)", "{:.1f}"), ("layers", "layers", "{}"),
               ("hidden_size", "hidden", "{}"), ("heads", "heads", "{}"), ("kv_heads", "KV heads", "{}"),
               ("vocab_size", "vocab", "{}"), ("max_seq_len", "max seq", "tokens"), ("experts", "experts", "{}")],
    "clusters": [("name", "name", "{}"), ("gpu", "GPU", "{}"), ("bf16_tflops", "bf16 TFLOP/s", "{:.0f}"),
                 ("hbm_gib", "HBM GiB", "{:.1f}"), ("gpus_per_node", "GPUs/node", "{}"),
                 ("intra_node_gb_s", "intra-node GB/s", "{:.0f}"), ("inter_node_gb_s", "inter-node GB/s per GPU",
                                                                    "{:.0f}"),
                 ("max_gpus", "max GPUs", "{}")],
    "schedules": [("name", "name", "{}"), ("virtual_stages", "virtual stages", "{}"),
                  ("launchers", "launchers", "{}"), ("description", "description", "{}")],
    "stacks": [("name", "name", "{}"), ("launcher", "launcher", "{}"), ("options", "options", "{}"),
               ("schedules", "schedules", "{}"), ("zero_stages", "ZeRO", "{}"), ("cp_kinds", "CP", "{}"),
               ("moe_overlap", "MoE all-to-all overlap", "{}"), ("dispatchers", "MoE dispatchers", "{}")],
    "distributions": [("name", "name", "{}"), ("mean_tokens", "mean tokens", "{:,.0f}"),
                      ("max_tokens", "max tokens", "{:,}"), ("doc_len_tokens", "token-weighted doc length", "{:,.0f}"),
                      ("source", "source", "{}")],
    "launchers": [("name", "name", "{}"), ("release", "targets", "{}"), ("format", "writes", "{}"),
                  ("checked_by", "checked by", "{}"), ("schedules", "schedules", "{}")],
}


def _cell(fmt: str, value: Any) -> str:
    """A table cell: ``fmt.format(value)``, or with ``fmt`` "tokens" a token count in K where it is a multiple of
    1,024 (131072 -> 128K), so million-token contexts keep the models table within 80 columns."""
    if fmt == "tokens":
        return f"{value // 1024}K" if value >= 1024 and value % 1024 == 0 else str(value)
    return fmt.format(value)


@app.command("list")
@handle_errors
def list_(
    what: str = typer.Argument(..., help="models | clusters | schedules | stacks | launchers | distributions",
                               show_default=False),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table"),
) -> None:
    """Show the shipped model specs, hardware profiles, pipeline schedules, training stacks, launchers or
    sample-length histograms of public data sets (for --seq-len-dist)."""
    choice(what, KINDS, "list")
    rows = ROWS[what]()
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    t = Table(title=f"Shipped {what}")
    cols = COLUMNS[what]
    add_columns(t, [header for _, header, _ in cols],
                text=("name", "type", "GPU", "description", "launchers", "launcher", "options", "schedules", "ZeRO",
                      "CP", "experts", "virtual stages", "MoE all-to-all overlap", "MoE dispatchers", "targets",
                      "writes", "checked by", "source"))
    for row in rows:
        if "error" in row:
            t.add_row(row["name"], f"[red]{row['error']}[/]", *([""] * (len(cols) - 2)))
            continue
        t.add_row(*("" if row[k] is None else _cell(fmt, row[k]) for k, _, fmt in cols))
    console().print(t)
