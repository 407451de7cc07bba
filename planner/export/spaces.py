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
from planner.export._common import LAUNCHER_RECOMPUTE_MODULES, launcher_recompute_problem
from planner.specs.config import DEFAULT_RECOMPUTE_MODULES, EP_DISPATCHERS


def default_recompute_modules(stack: Any = None, launcher: str | None = None) -> str:
    """What selective recomputation redoes when ``--recompute-modules`` is not given: the policy of the launcher
    the plan is emitted to (torchtitan's release), else the stack's (``options.recompute_modules``), else
    Megatron-Core's default."""
    if launcher in LAUNCHER_RECOMPUTE_MODULES:
        return LAUNCHER_RECOMPUTE_MODULES[launcher]
    return stack.recompute_modules if stack is not None else DEFAULT_RECOMPUTE_MODULES


#: the MoE token dispatchers each launcher's configs can name (Megatron-LM and Megatron-Bridge: the all-to-all and
#: the flex dispatcher's backends; the others' exporters write all-to-all dispatch: planner.export._common)
LAUNCHER_DISPATCHERS = {"megatron": EP_DISPATCHERS, "nemo": EP_DISPATCHERS}


def launcher_spaces(target: str, option: str = "--launcher", precision: str = "bf16",
                    recompute_modules: str | None = None) -> list[Any]:
    """Search spaces whose union is (a safe subset of) what ``target`` can run, for a run at ``precision`` whose
    selective recomputation redoes ``recompute_modules`` (None: the launcher's own,
    :func:`default_recompute_modules`)."""
    from planner.search.space import SearchSpace

    if target not in TARGETS:
        raise PlannerError(f"unknown launcher '{target}'", source=option, fix=f"use one of: {', '.join(TARGETS)}")
    if recompute_modules is None:
        recompute_modules = default_recompute_modules(None, target)
    refused = {"deepspeed": ("fp8", "mxfp8"), "torchtitan": ("fp16",), "torchtitan-0.3": ("fp16",)}.get(target, ())
    if precision in refused:
        raise PlannerError(f"{target} cannot train with {precision} GEMMs", source="--precision",
                           fix="use another --precision or launcher (megatron and nemo run bf16, fp16, fp8, mxfp8)")
    problem = launcher_recompute_problem(target, recompute_modules, precision)
    if problem is not None:
        raise PlannerError(f"{target} cannot run {problem[0]}", source="--recompute-modules", fix=problem[1])
    base = SearchSpace(precision=precision, recompute_modules=recompute_modules,
                       ep_dispatchers=tuple(d for d in SearchSpace.ep_dispatchers
                                            if d in LAUNCHER_DISPATCHERS.get(target, ("alltoall",))))
    if target in ("megatron", "nemo"):  # Megatron-LM, and Megatron-Bridge (NeMo's LLM pre-training): Megatron Core
        schedules = tuple(s for s in base.schedules if megatron.SCHEDULE_SUPPORT.get(s))
        # ZeRO-2/3 through Megatron FSDP, which needs a model without pipeline stages
        # HSDP through the distributed optimizer's instances (ZeRO-1) only
        base = replace(base, hsdp_zero_stages=(1,))
        return [replace(base, schedules=schedules, zero_stages=tuple(z for z in base.zero_stages if z <= 1)),
                replace(base, max_pp=1)]
    # torchtitan checkpoints every N-th layer (selective_ac_option = N): full recomputation of k layers per chunk
    # only where k divides equal chunks
    if target in ("torchtitan", "torchtitan-0.3"):
        base = replace(base, recompute_count_divides=True)
    if target == "torchtitan-0.3":  # no expert TP (experts whole on their EP rank), no MoE all-to-all overlap
        base = replace(base, ep_comm_overlap=(False,), etp_values=(1,))
        schedules = tuple(s for s in base.schedules if torchtitan.SCHEDULE_NAMES.get(s))
        return [replace(base, schedules=schedules, cp_kinds=tuple(k for k in base.cp_kinds if k in
                                                                  torchtitan.CP_ROTATE))]
    if target == "torchtitan":  # no batch-level MoE all-to-all overlap in either of the two below
        base = replace(base, ep_comm_overlap=(False,))
        schedules = tuple(s for s in base.schedules if torchtitan.SCHEDULE_NAMES.get(s))
        return [replace(base, schedules=schedules, cp_kinds=tuple(k for k in base.cp_kinds if k in
                                                                  torchtitan.CP_ROTATE))]
    # deepspeed: the pipeline engine runs 1F1B with ZeRO-0/1; ZeRO-2/3 without pipeline stages; Ulysses CP; no TP
    # communication overlap
    cp_kinds = tuple(k for k in base.cp_kinds if k == "ulysses")
    base = replace(base, tp_comm_overlap=(False,), ep_comm_overlap=(False,), hsdp_zero_stages=())  # no MiCS
    return [replace(base, schedules=("1f1b",), zero_stages=tuple(z for z in base.zero_stages if z <= 1),
                    cp_kinds=cp_kinds),
            replace(base, max_pp=1, cp_kinds=cp_kinds)]


def stack_spaces(stack: Any, target: str | None = None, precision: str = "bf16",
                 recompute_modules: str | None = None) -> list[Any]:
    """The search spaces of what ``stack`` (a ``planner.specs.stack.Stack``) runs, exported to ``target`` (default:
    the stack's own launcher): the launcher's spaces narrowed to the stack's schedules, ZeRO stages, CP kinds and TP
    overlap choices, with the stack's runtime options. Names the stack file gives that are unknown here are refused
    naming its field."""
    from planner.cost.schedule import SCHEDULES

    target = target or stack.launcher
    if recompute_modules is None:
        recompute_modules = default_recompute_modules(stack, target)
    if stack.launcher not in TARGETS:
        raise PlannerError(f"unknown launcher '{stack.launcher}'", source=f"stack {stack.name}", field="launcher",
                           fix=f"use one of: {', '.join(TARGETS)}")
    unknown = [x for x in stack.schedules if x not in SCHEDULES]
    if unknown:
        raise PlannerError(f"unknown schedule '{unknown[0]}'", source=f"stack {stack.name}", field="runs.schedules",
                           fix=f"use schedules of `planner list schedules`: {', '.join(SCHEDULES)}")
    out = []
    for space in launcher_spaces(target, "--stack", precision, recompute_modules):
        narrowed = replace(
            space, schedules=tuple(x for x in space.schedules if x in stack.schedules),
            zero_stages=tuple(z for z in space.zero_stages if z in stack.zero_stages),
            cp_kinds=tuple(k for k in space.cp_kinds if k in stack.cp_kinds) or space.cp_kinds[:1],
            max_cp=space.max_cp if stack.cp_kinds else 1,
            tp_comm_overlap=tuple(v for v in space.tp_comm_overlap if v in stack.tp_comm_overlap_choices) or (False,),
            ep_comm_overlap=tuple(v for v in space.ep_comm_overlap if v in stack.ep_comm_overlap_choices) or (False,),
            hsdp_zero_stages=tuple(z for z in space.hsdp_zero_stages if z in stack.hsdp_zero_stages),
            flash_attention=(stack.flash_attention,), overlap_grad_reduce=(stack.overlap_grad_reduce,),
            overlap_param_gather=(stack.overlap_param_gather,), grad_reduce_bytes=(stack.grad_reduce_bytes,),
            # the stack's dispatchers the launcher runs, its default first (what an EP group inside a node runs)
            ep_dispatchers=tuple(d for d in dict.fromkeys((stack.ep_dispatcher,) + stack.ep_dispatcher_choices)
                                 if d in LAUNCHER_DISPATCHERS.get(target, ("alltoall",))) or ("alltoall",),
            **stack.fixed_options())
        if narrowed.schedules and narrowed.zero_stages and narrowed.cp_kinds:
            out.append(narrowed)
    if not out:
        raise PlannerError(f"stack {stack.name} runs nothing {target} can run", source="--stack",
                           fix=f"use the stack's own launcher ({stack.launcher}) or another stack")
    return out


def stack_layout_problem(stack: Any, cfg: Any) -> str | None:
    """Why ``stack`` cannot launch the layout ``cfg`` (a RunConfig), in words, or None where one of its search
    spaces (:func:`stack_spaces`: what the stack runs, as its launcher runs it) holds the layout's schedule, its ZeRO
    stage with its pipeline depth and its CP kind (the MoE dispatchers a stack lists are its search's choices, not
    all it can run, so they are not checked). ``planner estimate`` prices any layout the cost model knows and says
    so when the stack named could not run it."""
    try:
        spaces = stack_spaces(stack, precision=cfg.precision, recompute_modules=cfg.recompute_modules)
    except PlannerError as e:
        return e.reason
    checks = ((lambda s: cfg.pp == 1 or cfg.schedule in s.schedules, f"the {cfg.schedule} schedule"),
              (lambda s: cfg.zero_stage in s.zero_stages and (s.max_pp is None or cfg.pp <= s.max_pp),
               f"ZeRO-{cfg.zero_stage}" + (f" with pipeline parallelism (pp={cfg.pp})" if cfg.pp > 1 else "")),
              (lambda s: cfg.cp == 1 or (cfg.cp_kind in s.cp_kinds and (s.max_cp is None or cfg.cp <= s.max_cp)),
               f"{cfg.cp_kind} context parallelism"))
    if any(all(holds(s) for holds, _ in checks) for s in spaces):
        return None
    missing = [what for holds, what in checks if not any(holds(s) for s in spaces)]
    return ", ".join(missing) if missing else "this combination of " + ", ".join(what for _, what in checks)


def stack_target(stack: Any, launcher: str | None, activation_fp8_input_store: bool = False) -> str:
    """The launcher a search under ``stack`` writes its plan for: ``launcher`` if the user named one, else the
    stack's; a Megatron-Core plan that keeps the SwiGLU inputs in fp8 goes to Megatron-Bridge, which sets
    activation_func_fp8_input_store in its model config, where Megatron-LM has no flag for it
    (megatron/training/arguments.py)."""
    if launcher is not None:
        return launcher
    if activation_fp8_input_store and stack.launcher == "megatron":
        return "nemo"
    return stack.launcher


def plan_for_launcher(model: Any, cluster: Any, num_gpus: int, global_batch_size: int, seq_len: int, target: str, *,
                      top_k: int = 1, objective: str = "time", max_memory_gib: float | None = None,
                      refine_partition: bool = True, option: str = "--launcher", precision: str = "bf16",
                      stack: Any = None, recompute_modules: str | None = None,
                      constraints: Any = None, packed_doc_len: float = 0.0, offload_modules: str = "",
                      packed_attention_cv: float = 0.0, attention_kernel: str | None = None,
                      ep_dispatcher: str | None = None, adam_moment_bytes: int = 4,
                      activation_fp8_input_store: bool = False, moe_load_factor: float = 1.0,
                      comm_reserved_sms: int = 0) -> Any:
    """The best plan ``target`` can run (a ``planner.plan.Plan``) at GEMM ``precision``, within what ``stack``
    runs if one is given and what ``constraints`` (a ``planner.search.space.Constraints``) allow; InfeasibleError
    when none fits. ``refine_partition=False`` keeps the even layer split (``planner plan --even-split``);
    ``attention_kernel`` overrides the stack's kernel (``--attention-kernel``), ``ep_dispatcher`` its MoE token
    dispatcher (``--ep-dispatcher``); ``adam_moment_bytes`` the request's Adam moments (``--adam-moments``),
    ``activation_fp8_input_store`` its SwiGLU fp8 input store (``--activation-fp8-input-store``),
    ``moe_load_factor`` its MoE routing's load on the busiest EP rank (``--moe-load-factor``),
    ``comm_reserved_sms`` the SMs its communication kernels hold through the step (``--comm-reserved-sms``)."""
    from planner.export import target_module
    from planner.plan import search_plans
    from planner.search.engine import objective_key

    if stack is not None:  # the stack release's expert GEMM issue times, where it has its own (idempotent)
        cluster = stack.on_cluster(cluster)

    vision = bool(getattr(model, "vision_layers", 0))
    if vision and option == "--emit":  # no exporter writes a vision-language model: say so before searching
        raise PlannerError(f"{target} configs cannot be written for a vision encoder in front of the language model "
                           "(Megatron-LM trains such models through examples/multimodal, Megatron-Bridge through its "
                           "VLM recipes)", source=f"--emit {target}",
                           fix="plan without --emit and carry the degrees and layer split into the multimodal launcher")
    from planner.export import HYBRID_FIX, HYBRID_REFUSAL, HYBRID_TARGETS

    if getattr(model, "layer_pattern", "") and target not in HYBRID_TARGETS and option == "--emit":
        raise PlannerError(f"{target} configs cannot be written for {HYBRID_REFUSAL}", source=f"--emit {target}",
                           fix=HYBRID_FIX)
    check_model = getattr(target_module(target, option), "check_model", None)
    if check_model is not None:  # a launcher that runs only the models it ships: refuse before searching
        check_model(model.name, option)
    spaces = (stack_spaces(stack, target, precision, recompute_modules) if stack is not None
              else launcher_spaces(target, option, precision, recompute_modules))
    if constraints is not None:
        spaces = constraints.narrow(spaces, f"stack {stack.name}" if stack is not None else target)
    if packed_doc_len or offload_modules:
        spaces = [replace(s, packed_doc_len=packed_doc_len, packed_attention_cv=packed_attention_cv,
                          offload_modules=offload_modules) for s in spaces]
    if attention_kernel is not None:
        spaces = [replace(s, attention_kernel=attention_kernel) for s in spaces]
    if ep_dispatcher is not None:
        spaces = [replace(s, ep_dispatchers=(ep_dispatcher,)) for s in spaces]
    if adam_moment_bytes != 4:  # Megatron-Core's precision-aware optimizer needs the distributed optimizer (ZeRO >= 1)
        spaces = [replace(s, adam_moment_bytes=adam_moment_bytes,
                          zero_stages=tuple(z for z in s.zero_stages if z >= 1 or target not in ("megatron", "nemo")))
                  for s in spaces]
    if activation_fp8_input_store or moe_load_factor != 1.0 or comm_reserved_sms:
        spaces = [replace(s, activation_fp8_input_store=activation_fp8_input_store, moe_load_factor=moe_load_factor,
                          comm_reserved_sms=comm_reserved_sms) for s in spaces]
    found = []
    reasons = []
    fixes = []
    refused = []  # plans that fit but the exporter cannot express
    for space in spaces:
        for refine in ((True, False) if refine_partition else (False,)):
            try:
                plan = search_plans(model, cluster, num_gpus, global_batch_size, seq_len, top_k=top_k,
                                    objective=objective, max_memory_gib=max_memory_gib, space=space,
                                    refine_partition=refine)
            except InfeasibleError as e:
                reasons.append(e.reason)
                fixes.append(e.fix)
                break  # the refinement only changes a found plan; nothing fits this space
            try:
                if not vision:  # the stack runs VLMs (its multimodal path); only the exporters do not write them
                    export(plan, target)
            except PlannerError as e:
                refused.append((e.reason, e.fix))
                continue  # refused (per-stage recompute, an uneven split): retry with the even split
            found.append(plan)
            break
    if not found:
        runner = f"stack {stack.name}" if stack is not None else target
        fix = "; ".join(f for f in fixes[:1] if f)
        other = "another stack (--stack any: everything the model knows)" if stack is not None else \
            "another launcher (torchtitan runs the most schedules)"
        why = (f"the best plans that fit cannot be written for {target}: {refused[0][0]}" if refused and not reasons
               else f"no plan that {runner} can run fits: {reasons[0] if reasons else 'empty space'}")
        if refused and not reasons and refused[0][1]:  # the exporter's own fix for what it refused
            fix = refused[0][1]
        raise InfeasibleError(why,
                              source=f"{option} {stack.name if stack is not None else target}",
                              fix=f"{fix}; or {other}" if fix else f"{other}, or more GPUs")
    return min(found, key=lambda p: objective_key(p.estimate, objective))
