"""``planner plan``: search every configuration and print the best plan, its runners-up and why the best wins."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from planner.cli.app import (CONSTRAINT_OPTIONS, RUN_OPTIONS, app, choice, console, err, handle_errors,
                             run_option_fields, search_constraints)
from planner.cli.render import (add_columns, attention_kernel_line, attention_kernel_priced, layout_label,
                                model_label, print_estimate, recipe_label)
from planner.cli.estimate import (ATTENTION_KERNEL_HELP, parse_offload_modules, parse_recompute_modules,
                                  profile_values)
from planner.cli.lengths import (DYNAMIC_CP, MAX_SEQLEN_PER_RANK, PACKING, SEQ_LEN_DIST, check_length_options,
                                 print_length_tables)
from planner.errors import PlannerError
from planner.plan import Plan, attempt, best_of, dumps, request_warnings, search_plans
from planner.specs.config import DEFAULT_RECOMPUTE_MODULES, EP_DISPATCHERS, PRECISIONS
from planner.specs.stack import ANY_STACK, DEFAULT_STACK, load_stack, stack_name_for
from planner.validation.bands import band_for
from planner.specs.hardware import check_attention_kernel, cluster_variant
from planner.specs.model import load_model

#: time components grouped the way the comparison names them
_WHY_GROUPS = {
    "pipeline bubble": ("bubble_s",),
    "communication": ("tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s"),
    "recomputation": ("recompute_s",),
    "compute": ("compute_s",),
    "optimizer step": ("optimizer_s",),
}


def plans_table(plan: Plan, objective: str) -> Table:
    t = Table(title=f"Top plans by {'step time' if objective == 'time' else 'peak memory'}",
              caption="layout: degrees > 1, CP kind r ring / u ulysses, mb size x micro-batches; recompute full k: "
                      "k layers per stage")
    add_columns(t, ("#", "layout", "schedule, recompute, ZeRO", "step s", "tok/s", "MFU", "GiB"),
                text=("layout", "schedule, recompute, ZeRO"))
    for i, p in enumerate((plan,) + plan.alternatives, start=1):
        c, e = p.config, p.estimate
        t.add_row(str(i), layout_label(c), recipe_label(c), f"{e.step_time_s:.3f}", f"{e.tokens_per_s:,.0f}",
                  f"{100 * e.mfu:.1f}%", f"{e.peak_memory_gib:.1f}")
    return t


def why_best(plan: Plan, objective: str) -> str:
    """What the runner-up loses on, against the best: the time components that differ most, and memory."""
    if not plan.alternatives:
        return "No other configuration fits: this is the only plan."
    best, other = plan.estimate, plan.alternatives[0].estimate
    if objective == "memory":
        return (f"#1 needs {best.peak_memory_gib:.2f} GiB per GPU, #2 {other.peak_memory_gib:.2f} GiB; #1 steps in "
                f"{best.step_time_s:.3f} s, #2 in {other.step_time_s:.3f} s.")
    delta = other.step_time_s - best.step_time_s
    diffs = []
    for label, keys in _WHY_GROUPS.items():
        d = sum(other.breakdown.get(k, 0.0) - best.breakdown.get(k, 0.0) for k in keys)
        if abs(d) >= 1e-4:
            diffs.append((d, label))
    diffs.sort(key=lambda x: -x[0])
    loses = [f"{d:.3f} s on {label}" for d, label in diffs if d >= 0.0005][:3]
    gains = [f"{-d:.3f} s on {label}" for d, label in reversed(diffs) if d <= -0.0005][:2]
    text = f"#2 is {delta:.3f} s ({100 * delta / best.step_time_s:.1f}%) slower per step"
    if loses:
        text += ": it loses " + ", ".join(loses)
    if gains:
        text += "; it gains " + ", ".join(gains)
    mem = other.peak_memory_gib - best.peak_memory_gib
    if abs(mem) >= 0.05:
        text += f"; it needs {abs(mem):.1f} GiB {'more' if mem > 0 else 'less'} memory per GPU"
    return text + "."


def search_line(stats: dict) -> str:
    return (f"searched {stats['candidates']:,} configurations ({stats['groups']:,} groups) in {stats['time_s']:.2f} s"
            f" ({stats['candidates_per_s']:,.0f} per second): {stats['pruned_by_memory_bound']:,} ruled out by the "
            f"memory bound, {stats['pruned_by_objective_bound']:,} by the {stats['objective']} bound, "
            f"{stats['exact_evaluations']:,} estimated exactly")


def runner_up_margin(plan: Plan) -> float | None:
    """How much slower the runner-up's step is than the winner's (relative), or None without a runner-up."""
    if not plan.alternatives:
        return None
    return plan.alternatives[0].estimate.step_time_s / plan.estimate.step_time_s - 1


def tie_note(plan: Plan, accuracy: dict) -> str:
    """Whether the winner's margin over the runner-up is inside the model's error band (a tie under the model's
    accuracy), or outside it."""
    margin = runner_up_margin(plan)
    if margin is None:
        return ""
    band = accuracy["mean_abs_error"]
    if margin < band:
        note = (f"#1 leads #2 by {100 * margin:.1f}%, inside the model's ±{100 * band:.1f}% error band on such "
                f"runs: a tie under the model's accuracy; choose between them on other grounds (or measure both)")
    else:
        note = f"#1 leads #2 by {100 * margin:.1f}%, more than the model's ±{100 * band:.1f}% error band on such runs"
    other = accuracy.get("runner_up")
    if other:  # the runner-up is a run of another kind (with or without CP): the model knows the two differently
        note += (f". The two are runs of different kinds: the model reads published runs like #1 "
                 f"({accuracy['group']}) {100 * accuracy['mean_signed_error']:+.1f}% on average, like #2 "
                 f"({other['group']}) {100 * other['mean_signed_error']:+.1f}% (±{100 * other['mean_abs_error']:.1f}%)")
    return note


def print_plan(con: Console, plan: Plan, objective: str, title: str, accuracy: dict | None = None,
               kernel_line: str = "") -> None:
    print_estimate(con, plan.estimate, plan.config, title, accuracy, kernel_line)
    con.print(plans_table(plan, objective))
    con.print(f"[bold]Why #1:[/] {why_best(plan, objective)}")
    if accuracy and objective == "time" and plan.alternatives:
        con.print(tie_note(plan, accuracy))
    stats = plan.search or {}
    if stats:
        con.print(search_line(stats))
        if stats.get("bound_violations"):
            con.print(f"[red]warning:[/] {stats['bound_violations']} evaluated configurations fell below their "
                      "lower bound; the optimum is not guaranteed (please report this)")


@app.command()
@handle_errors
def plan(
    model: str = typer.Option(..., "--model", help="Shipped model name (see `planner list models`) or a HF config.json"),
    cluster: str = typer.Option(..., "--cluster", help="Shipped hardware profile name or a profile JSON path"),
    gpus: int = typer.Option(..., "--gpus", help="Total GPUs"),
    global_batch: int = typer.Option(..., "--global-batch", help="Global batch size in sequences"),
    seq_len: int = typer.Option(2048, "--seq-len", help="Sequence length in tokens"),
    top: int = typer.Option(3, "--top", help="Runner-up plans to show after the best"),
    objective: str = typer.Option("time", "--objective", help="time (fastest step) | memory (smallest peak)"),
    max_memory_gib: float = typer.Option(None, "--max-memory-gib", help="Cap on memory per GPU, GiB"),
    no_partition: bool = typer.Option(False, "--even-split", help="Keep layers split evenly (skip the partition DP)"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables"),
    timings: bool = typer.Option(False, "--timings", help="With --json: add the search's wall and CPU time "
                                                          "(these vary from run to run; the rest is byte-identical)"),
    emit: str = typer.Option(None, "--emit", help="Also write a launcher config: megatron | torchtitan | "
                                                  "torchtitan-0.3 | deepspeed | nemo (the search then covers only "
                                                  "what it runs)"),
    out: Path = typer.Option(None, "--out", help="File for --emit (default: stdout)"),
    precision: str = typer.Option("bf16", "--precision", help="GEMM precision of the linear layers: bf16 | fp16 | "
                                                              "fp8 | mxfp8 (the run's choice, not searched)"),
    moe_load_factor: float = RUN_OPTIONS["moe_load_factor"], act_fp8_store: bool = RUN_OPTIONS["act_fp8_store"],
    adam_moments: str = RUN_OPTIONS["adam_moments"], comm_reserved_sms: int = RUN_OPTIONS["comm_reserved_sms"],
    recompute_modules: str = typer.Option(None, "--recompute-modules",
                                          help="What selective recomputation redoes (Megatron-Core "
                                               "--recompute-modules, a comma list; or torchtitan's per-op policy, "
                                               "op_sac / op_sac_v02; not searched) [default: the launcher's or "
                                               "stack's: core_attn, torchtitan op_sac_v02]"),
    stack: str = typer.Option(None, "--stack", help=f"Training stack: search exactly what it runs, with its runtime "
                                                    f"options (`planner list stacks`; default {DEFAULT_STACK}, or "
                                                    f"--emit L's stack; 'any' searches everything the model knows)"),
    attention_kernel: str = typer.Option(None, "--attention-kernel", help=ATTENTION_KERNEL_HELP),
    profile_set: list[str] = typer.Option(None, "--profile-set",
                                          help="PATH=VALUE: one numeric field of the cluster's profile replaced, "
                                               "e.g. inter_node.bandwidth_gb_s=12.5 (repeatable; as estimate)"),
    ep_dispatcher: str = typer.Option(None, "--ep-dispatcher",
                                      help="MoE token dispatcher every plan runs: alltoall | deepep | hybridep "
                                           "(default: the stack's; see `planner estimate --help`)"),
    tp: str = CONSTRAINT_OPTIONS["tp"], pp: str = CONSTRAINT_OPTIONS["pp"], cp: str = CONSTRAINT_OPTIONS["cp"],
    ep: str = CONSTRAINT_OPTIONS["ep"], vpp: str = CONSTRAINT_OPTIONS["vpp"], etp: str = CONSTRAINT_OPTIONS["etp"],
    dp_shard: str = CONSTRAINT_OPTIONS["dp_shard"],
    micro_batch: str = CONSTRAINT_OPTIONS["micro_batch"], schedules: str = CONSTRAINT_OPTIONS["schedules"],
    zero: str = CONSTRAINT_OPTIONS["zero"], recompute: str = CONSTRAINT_OPTIONS["recompute"],
    offload_modules: str = typer.Option(None, "--offload-modules",
                                        help="Also search with Megatron-Core fine-grained activation offloading of "
                                             "these module inputs (comma list, e.g. core_attn,attn_proj; such rows "
                                             "hold no full recomputation)"),
    seq_len_dist: str = SEQ_LEN_DIST, packing: bool = PACKING, dynamic_cp: bool = DYNAMIC_CP,
    max_seqlen_per_rank: int = MAX_SEQLEN_PER_RANK,
) -> None:
    """Find the fastest (or smallest) configuration: every valid TP, PP, DP, CP, EP, virtual stages, micro-batch,
    schedule, recomputation, SP and ZeRO stage, searched exhaustively with provable pruning."""
    # the sizes, --top, --objective and --max-memory-gib are checked by the search itself
    if out is not None and emit is None:
        raise PlannerError("--out needs --emit", source="--out", fix="add --emit megatron|torchtitan|deepspeed|nemo")
    if emit is not None and json_out and out is None:
        raise PlannerError("--json and --emit would both print to stdout", source="--emit",
                           fix="give --out FILE for the launcher config")
    choice(precision, PRECISIONS, "--precision")
    modules = parse_recompute_modules(recompute_modules) if recompute_modules is not None else None
    offload = parse_offload_modules(offload_modules)
    dist = check_length_options(seq_len_dist, packing, dynamic_cp, max_seqlen_per_rank)
    constraints = search_constraints(tp, pp, cp, ep, vpp, micro_batch, schedules, zero, recompute, etp,
                                     dp_shard)
    if emit is not None:
        from planner.export import TARGETS
        if emit not in TARGETS:
            raise PlannerError(f"unknown launcher '{emit}'", source="--emit", fix=f"use one of: {', '.join(TARGETS)}")
    from planner.specs.pools import is_pooled_cluster, load_pooled_cluster

    if is_pooled_cluster(cluster):  # several GPU pools: planner.search.pooled
        from planner.cli.pools import plan_over_pools

        given = [name for name, on in (("--stack", stack is not None),
                                       ("--attention-kernel", attention_kernel is not None),
                                       ("--ep-dispatcher", ep_dispatcher is not None), ("--objective", objective != "time"),
                                       ("--adam-moments", adam_moments != "fp32"),
                                       ("--activation-fp8-input-store", act_fp8_store),
                                       ("--moe-load-factor", moe_load_factor != 1.0),
                                       ("--comm-reserved-sms", comm_reserved_sms != 0),
                                       ("--max-memory-gib", max_memory_gib is not None), ("--even-split", no_partition),
                                       ("--profile-set", bool(profile_set)),
                                       ("--recompute-modules", modules not in (None, DEFAULT_RECOMPUTE_MODULES)),
                                       ("--offload-modules", bool(offload)), ("--seq-len-dist", dist is not None),
                                       ("--tp / --pp / --schedules / ...", constraints is not None)) if on]
        if given:
            raise PlannerError(f"{given[0]} is not supported over GPU pools yet", source=given[0],
                               fix="drop it (pools plan over their own space: planner/search/pooled.py)")
        plan_over_pools(load_model(model), load_pooled_cluster(cluster), gpus, global_batch, seq_len,
                        precision=precision, top=top, json_out=json_out, emit=emit, out=out)
        return
    stack_name = stack_name_for(stack, emit)  # an empty --stack is refused, as estimate and sweep refuse it
    run_stack = None if stack_name == ANY_STACK else load_stack(stack_name)
    spec = load_model(model)
    hw = cluster_variant(cluster, profile_values(profile_set), "--profile-set")
    if run_stack is not None:  # the stack release's expert GEMM issue times, where it has its own
        hw = run_stack.on_cluster(hw)
    if modules is None:  # the launcher's own policy (torchtitan's release), else the stack's
        from planner.export.spaces import default_recompute_modules
        modules = default_recompute_modules(run_stack, emit)
    if attention_kernel is not None:
        check_attention_kernel(hw.gpu, hw.name, attention_kernel)
    if ep_dispatcher is not None:
        choice(ep_dispatcher, EP_DISPATCHERS, "--ep-dispatcher")
    run_opts = run_option_fields(adam_moments, act_fp8_store, moe_load_factor, run_stack, spec.gated_mlp,
                                 comm_reserved_sms)
    packed = dist.packed_doc_len(seq_len) if dist is not None and packing else 0.0
    if packed:
        from planner.cost.variable_length import packed_attention_cv
        packed_cv = packed_attention_cv(dist, seq_len)
    else:
        packed_cv = 0.0

    launcher = emit or (run_stack.launcher if run_stack is not None else None)
    if offload and launcher not in (None, "megatron", "nemo"):
        raise PlannerError(f"{launcher} has no fine-grained activation offloading (Megatron-Core's)",
                           source="--offload-modules", fix="drop --offload-modules, or use --stack megatron-core")

    def run_search(cons, offload_modules=""):
        if emit is not None or run_stack is not None:  # search only what the stack / launcher runs
            from planner.export import plan_for_launcher, stack_target

            target = stack_target(run_stack, emit, run_opts["activation_fp8_input_store"])
            return plan_for_launcher(spec, hw, gpus, global_batch, seq_len, target, top_k=top, objective=objective,
                                     max_memory_gib=max_memory_gib, refine_partition=not no_partition,
                                     option="--emit" if emit else "--stack", precision=precision, stack=run_stack,
                                     recompute_modules=modules, constraints=cons, packed_doc_len=packed,
                                     packed_attention_cv=packed_cv, offload_modules=offload_modules,
                                     attention_kernel=attention_kernel, ep_dispatcher=ep_dispatcher, **run_opts)
        from planner.search.space import SearchSpace

        space = SearchSpace(precision=precision, recompute_modules=modules, packed_doc_len=packed,
                            packed_attention_cv=packed_cv, offload_modules=offload_modules,
                            attention_kernel=attention_kernel or "", **run_opts,
                            **({"ep_dispatchers": (ep_dispatcher,)} if ep_dispatcher else {}))
        if cons is not None:
            space = cons.narrow([space], "the search")[0]
        return search_plans(spec, hw, gpus, global_batch, seq_len, top_k=top, objective=objective,
                            max_memory_gib=max_memory_gib, refine_partition=not no_partition, space=space)

    def search_all(cons):
        """The best of the search without offloading and, with --offload-modules, with it (its rows hold no full
        recomputation); the runners-up of both, merged."""
        if not offload:
            return run_search(cons)
        return best_of([attempt(lambda: run_search(cons)), attempt(lambda: run_search(cons, offload))], top, objective)

    result = search_all(constraints)
    data = None
    emitted = None  # the plan dict --emit writes, when it is not the search's best (dynamic CP won)
    if dist is not None:
        from planner.lengths_plan import best_dynamic, data_section, dynamic_constraints, rerank

        result, aware = rerank(spec, hw, result, dist, packing)
        dyn = None
        if dynamic_cp:
            dyn = best_dynamic(spec, hw, search_all(dynamic_constraints(constraints)), dist, max_seqlen_per_rank)
        data = data_section(dist, packing, aware[0], dyn, layout_label)
        if dyn is not None and emit is not None and data["dynamic_cp"]["gain_over_best_static"] > 1:
            from planner.plan import plan_dict

            cfg_dyn, dyn_estimate = dyn  # its static estimate over the same packed data is already there
            data["dynamic_cp"]["exported"] = True
            emitted = {**plan_dict(spec, hw.name, cfg_dyn, dyn_estimate.static.estimate), "data": data}
    for warning in request_warnings(spec, result.config, hw.gpu):
        err(f"warning: {warning}")
    if emit is not None:
        from planner.cli.export import write_export

        write_export(emitted or {**result.to_dict(), **({"data": data} if data is not None else {})}, emit, out,
                     source="plan", option="--emit")
    accuracy = band_for(hw.gpu.name, precision, spec.is_moe, result.config.cp > 1,
                        result.config.cp_kind, vision=spec.vision_layers > 0, model_type=spec.model_type).to_dict()
    margin = runner_up_margin(result)
    if margin is not None:
        accuracy["runner_up_within_band"] = margin < accuracy["mean_abs_error"]
        second = result.alternatives[0].config
        other = band_for(hw.gpu.name, precision, spec.is_moe, second.cp > 1, second.cp_kind,
                         vision=spec.vision_layers > 0, model_type=spec.model_type).to_dict()
        if other["group"] != accuracy["group"]:
            accuracy["runner_up"] = other
    if json_out:
        typer.echo(dumps({**result.to_dict(timings=timings), "stack": stack_name,
                          "attention_kernel_priced": attention_kernel_priced(hw.gpu, result.config),
                          "accuracy": accuracy,
                          **({"data": data} if data is not None else {})}), nl=False)
        return
    if emit is not None and out is None:
        return  # the launcher config went to stdout
    limit = f", at most {max_memory_gib:g} GiB per GPU" if max_memory_gib is not None else ""
    print_plan(console(), result, objective,
               f"Best plan: {model_label(spec, seq_len)} on {gpus} x {hw.gpu.name} ({hw.name}), global batch {global_batch}, "
               f"sequence {seq_len}{limit}, stack {stack_name}", accuracy, attention_kernel_line(hw.gpu, result.config))
    if data is not None:
        print_length_tables(console(), data)


__all__ = ["plan", "plans_table", "why_best"]
