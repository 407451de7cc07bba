"""What every exporter shares: reading a plan (a ``Plan`` or its JSON dict) and refusing what a launcher lacks.

Exporters never guess: when a launcher has no knob for something the plan relies on (a pipeline schedule, ZeRO-3
together with pipeline parallelism, ...), they raise a ``PlannerError`` naming the launcher, the feature and what
would work instead, rather than emit a configuration that would run differently from the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError
from planner.plan import Plan, config_from_dict, model_from_plan_dict
from planner.specs.config import RunConfig, even_layer_split
from planner.specs.model import ModelSpec


@dataclass(frozen=True)
class PlanView:
    """The parts of a plan an exporter reads: the configuration, the model (when the plan carries its spec), the
    layers of every pipeline stage in model order and the stored estimate (a dict, possibly empty)."""

    cfg: RunConfig
    model: ModelSpec | None
    model_name: str
    cluster_name: str
    layers_per_stage: tuple[int, ...]
    estimate: dict[str, Any]
    #: Megatron-Core hybrid (dynamic) context parallelism chosen by ``planner plan --dynamic-cp``: the tokens one
    #: DP x CP rank holds (``--max-seqlen-per-dp-cp-rank``); None: static CP
    hybrid_cp_max_per_rank: int | None = None
    hybrid_cp_step_s: float | None = None  # its step time over the plan's length distribution

    @property
    def num_layers(self) -> int:
        return sum(self.layers_per_stage)

    @property
    def even_split(self) -> bool:
        return len(set(self.layers_per_stage)) == 1

    @property
    def is_moe(self) -> bool:
        return self.model is not None and self.model.is_moe or self.cfg.ep > 1


def read_plan(plan: Plan | dict[str, Any], source: str = "<plan>") -> PlanView:
    """Normalize a ``Plan`` or a plan dict (as written by ``planner plan --json``) into a PlanView."""
    d = plan.to_dict() if isinstance(plan, Plan) else plan
    if not isinstance(d, dict):
        raise PlannerError("a plan must be a JSON object", source=source,
                           fix="pass a file written by `planner plan --json`")
    cfg = config_from_dict(d, source)
    model = model_from_plan_dict(d, source) if isinstance(d.get("model_spec"), dict) else None
    if cfg.layers_per_stage is not None:
        layers = tuple(int(n) for n in cfg.layers_per_stage)
    elif model is not None:
        layers = even_layer_split(model.num_layers, cfg.num_stages)
    else:
        raise PlannerError("the plan has neither layers_per_stage nor model_spec", source=source,
                           field="layers_per_stage", fix="pass a file written by `planner plan --json`")
    if len(layers) != cfg.num_stages:
        raise PlannerError(f"lists {len(layers)} stages, but pp*vpp = {cfg.num_stages}", source=source,
                           field="layers_per_stage")
    est = d.get("estimate") if isinstance(d.get("estimate"), dict) else {}
    dyn = (d.get("data") or {}).get("dynamic_cp") if isinstance(d.get("data"), dict) else None
    hybrid = hybrid_step = None
    if isinstance(dyn, dict) and dyn.get("exported") is True:
        try:
            hybrid = int(dyn["max_seqlen_per_dp_cp_rank"])
            hybrid_step = float(dyn["step_time_s"])
        except (KeyError, TypeError, ValueError):
            raise PlannerError("data.dynamic_cp lacks max_seqlen_per_dp_cp_rank or step_time_s", source=source,
                               field="data.dynamic_cp", fix="pass a file written by `planner plan --dynamic-cp`")
    return PlanView(cfg=cfg, model=model, model_name=str(d.get("model", model.name if model else "model")),
                    cluster_name=str(d.get("cluster", "")), layers_per_stage=layers, estimate=est,
                    hybrid_cp_max_per_rank=hybrid, hybrid_cp_step_s=hybrid_step)


def unsupported(launcher: str, feature: str, fix: str) -> PlannerError:
    """The error an exporter raises when the launcher cannot run what the plan uses; the fix always mentions the
    search restricted to the launcher (``planner plan ... --emit <launcher>``)."""
    return PlannerError(f"{launcher} cannot run this plan: {feature}", source=f"--to {launcher}",
                        fix=f"{fix}; `planner plan ... --emit {launcher}` searches only what {launcher} runs")


#: the recompute modules each launcher's selective recomputation can run, by the precision of its linear layers
#: ("16-bit" or "fp8", config.PRECISIONS): Megatron-Core's modules (Megatron-LM, Megatron-Bridge), torchtitan's
#: per-op policy of its release (0.2.x: op_sac_v02; 0.3: op_sac, torchtitan/distributed/activation_checkpoint.py),
#: the other release's where the two save the same ops (16-bit linear layers: both alternate their matmuls), or
#: Megatron-Core's default modules, in whose place it runs its own policy (a plan priced so says it in its notes),
#: and Megatron-DeepSpeed's core attention only
#: the recompute modules a launcher's own selective recomputation redoes, where they are not Megatron-Core's default:
#: torchtitan's per-op policy of each release
LAUNCHER_RECOMPUTE_MODULES = {"torchtitan": "op_sac_v02", "torchtitan-0.3": "op_sac"}


def launcher_recompute_problem(launcher: str, modules: str, precision: str) -> tuple[str, str] | None:
    """(what, fix) where ``launcher``'s selective recomputation cannot redo what ``modules`` priced, else None."""
    from planner.specs.config import DEFAULT_RECOMPUTE_MODULES, OP_SAC_MODULES

    low = precision in ("fp8", "mxfp8")
    own = LAUNCHER_RECOMPUTE_MODULES.get(launcher)
    if own is not None:
        other = next(m for m in OP_SAC_MODULES if m != own)
        # Megatron-Core's default modules: torchtitan runs its own policy instead (the exporters' notes say so)
        if modules in (own, DEFAULT_RECOMPUTE_MODULES) or (modules == other and not low):
            return None
        if modules == other:
            return (f"selective recomputation priced with {other} (the other torchtitan release's per-op policy, "
                    f"which treats {precision} linear layers differently)",
                    f"plan with --recompute-modules {own}, or export to "
                    f"{'torchtitan-0.3' if launcher == 'torchtitan' else 'torchtitan'}")
        return (f"selective recomputation of {modules} (torchtitan's selective activation checkpointing picks ops by "
                "its own per-op policy, not Megatron-Core's modules)",
                f"plan with --recompute-modules {own} (or --stack torchtitan), or export to megatron / nemo")
    if modules in OP_SAC_MODULES:
        return (f"selective recomputation priced with {modules} (torchtitan's per-op checkpointing)",
                "plan with Megatron-Core --recompute-modules (e.g. core_attn), or export to torchtitan")
    if launcher == "deepspeed" and modules != DEFAULT_RECOMPUTE_MODULES:
        return (f"selective recomputation of {modules} (Megatron-DeepSpeed's selective granularity recomputes the "
                "attention core only)", "plan with the default --recompute-modules, or export to megatron / nemo")
    return None


def op_sac_note(cfg: RunConfig, own: str) -> str:
    """The exporters' note on selective recomputation for torchtitan, whose release runs policy ``own``: priced as
    it runs, or priced with Megatron-Core's modules while torchtitan re-runs more."""
    from planner.specs.config import OP_SAC_MODULES

    if cfg.recompute_modules in OP_SAC_MODULES:
        return "selective recomputation is torchtitan's per-op policy (mode \"selective\"), as the plan priced it"
    return (f"selective recomputation runs torchtitan's per-op policy, which re-runs every second matmul and the "
            f"norms, where the plan priced Megatron-Core's {cfg.recompute_modules}: step time will be longer and "
            f"activation memory lower than estimated (plan with --recompute-modules {own} to price it)")


def refuse_recompute_modules(launcher: str, cfg: RunConfig) -> None:
    """Refuse a plan whose selective recomputation ``launcher`` does not run (:func:`launcher_recompute_problem`)."""
    if cfg.recompute == "selective":
        problem = launcher_recompute_problem(launcher, cfg.recompute_modules, cfg.precision)
        if problem is not None:
            raise unsupported(launcher, *problem)


def refuse_pipeline_flushes(launcher: str, cfg: RunConfig) -> None:
    """Refuse gradient accumulation over separate runs of the pipeline schedule (``pipeline_flushes`` > 1,
    torchtitan's way) for a launcher that runs every micro-batch of a step in one schedule."""
    if cfg.pipeline_flushes > 1:
        raise unsupported(launcher, f"{cfg.pipeline_flushes} pipeline flushes per step (gradient accumulation over "
                                    f"separate runs of the schedule; {launcher} runs every micro-batch of a step in "
                                    "one schedule)", "estimate with --pipeline-flushes 1, or export to torchtitan")


def refuse_megatron_core_only(launcher: str, cfg: RunConfig, *, ep_comm_overlap_runs: bool = False) -> None:
    """Refuse what only Megatron Core runs (for the launchers that are not Megatron Core): CPU activation
    offloading, the batch-level overlap of the MoE all-to-alls (unless the caller runs it its own way:
    ``ep_comm_overlap_runs``, torchtitan's DualPipeV), bf16 Adam moments, the SwiGLU fp8 input store and the
    flex dispatcher's DeepEP / HybridEP backends."""
    if cfg.offload_layers:
        raise unsupported(launcher, f"activation offloading of {cfg.offload_layers} layers (Megatron-Core's "
                                    "cpu_offloading_num_layers)", "export to megatron / nemo")
    if cfg.offload_modules:
        raise unsupported(launcher, f"fine-grained activation offloading of {cfg.offload_modules} (Megatron-Core's "
                                    "offload_modules)", "export to megatron / nemo")
    if cfg.ep_comm_overlap and not ep_comm_overlap_runs:
        raise unsupported(launcher, "batch-level overlap of the MoE all-to-alls (Megatron-Core's "
                                    "--overlap-moe-expert-parallel-comm)", "export to megatron / nemo")
    if cfg.adam_moment_bytes != 4:
        raise unsupported(launcher, "Adam moments in bf16 (Megatron-Core's precision-aware optimizer, "
                                    "--exp-avg-dtype / --exp-avg-sq-dtype bf16)",
                          "plan with --adam-moments fp32, or export to megatron / nemo")
    if cfg.activation_fp8_input_store:
        raise unsupported(launcher, "the SwiGLU inputs kept in fp8 (Megatron-Core's "
                                    "activation_func_fp8_input_store)",
                          "plan without --activation-fp8-input-store, or export to nemo")
    if cfg.ep_dispatcher != "alltoall" and cfg.ep > 1:
        raise unsupported(launcher, f"the {cfg.ep_dispatcher} token dispatcher (Megatron-Core's flex dispatcher; "
                                    f"the {launcher} config this exporter writes dispatches with all-to-all)",
                          "plan with --ep-dispatcher alltoall, or export to megatron / nemo")


def summary_comment(view: PlanView) -> list[str]:
    """One or two human lines naming the plan and its estimate, for the header of an exported file."""
    cfg = view.cfg
    lines = [f"plan: {view.model_name} on {cfg.num_gpus} GPUs ({view.cluster_name}): TP {cfg.tp}, PP {cfg.pp}, "
             f"DP {cfg.dp}, CP {cfg.cp}, EP {cfg.ep}, VPP {cfg.vpp}, micro-batch {cfg.micro_batch_size} x "
             f"{cfg.num_microbatches}, schedule {cfg.schedule}, recompute {cfg.recompute}, ZeRO-{cfg.zero_stage}"]
    est = view.estimate
    if "step_time_s" in est:
        lines.append(f"estimate: step {est['step_time_s']:.3f} s, {est.get('tflops_per_gpu', 0):.1f} model "
                     f"TFLOP/s per GPU, MFU {100 * est.get('mfu', 0):.1f}%, peak memory "
                     f"{est.get('peak_memory_gib', 0):.1f} of {est.get('memory_limit_gib', 0):.1f} GiB")
    if view.hybrid_cp_step_s is not None:
        lines.append(f"with hybrid context parallelism over the plan's length distribution: step "
                     f"{view.hybrid_cp_step_s:.3f} s (the estimate above is static CP over the same data)")
    return lines


def first_last_split(layers: tuple[int, ...]) -> tuple[int, int] | None:
    """(first, last) when every stage but the first and the last has the same number of layers, else None."""
    if len(layers) < 2:
        return None
    middle = layers[1:-1]
    if len(set(middle)) > 1:
        return None
    return layers[0], layers[-1]


def recompute_counts(view: PlanView) -> tuple[int, ...]:
    """Fully recomputed layers of every pipeline stage (model order) under ``recompute == "full"``: the plan's
    per-stage counts when it has them, else ``recompute_num_layers`` (None: all) clipped to each stage."""
    cfg = view.cfg
    per_stage = getattr(cfg, "recompute_layers_per_stage", None)
    if per_stage is not None:
        return tuple(min(int(k), n) for k, n in zip(per_stage, view.layers_per_stage))
    k = cfg.recompute_num_layers
    return tuple(n if k is None else min(k, n) for n in view.layers_per_stage)


def uniform_recompute_count(view: PlanView) -> int | None | bool:
    """One count ``k`` such that every stage fully recomputes min(k, its layers) (what Megatron's block method
    does): None when that is every layer, 0 when no layer is recomputed (the cost model's "none": exporters emit
    no recompute setting), False when no single count describes the plan."""
    counts, layers = recompute_counts(view), view.layers_per_stage
    if counts == layers:
        return None
    k = max(counts)
    return k if all(c == min(k, n) for c, n in zip(counts, layers)) else False
