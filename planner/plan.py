"""Plan: a configuration with its estimate, and its JSON form (what launchers, ``export`` and ``explain`` read).

The JSON layout is described by ``planner/schema/plan.schema.json`` and versioned by ``schema_version``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable

from planner.cost.compute import biased_grouped_wgrad
from planner.cost.step import Estimate, stage_layers
from planner.errors import InfeasibleError, PlannerError
from planner.specs.config import DEFAULT_RECOMPUTE_MODULES, RunConfig, canonical_recompute_modules
from planner.specs.hardware import GPU, Cluster
from planner.specs.model import ModelSpec, validate_model

SCHEMA_VERSION = "1.0"


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    cluster_name: str
    config: RunConfig
    estimate: Estimate
    alternatives: tuple["Plan", ...] = field(default=())
    search: dict[str, Any] | None = None

    def to_dict(self, *, with_stages: bool = True, with_model: bool = True, timings: bool = False) -> dict[str, Any]:
        return plan_dict(self.model, self.cluster_name, self.config, self.estimate, alternatives=self.alternatives,
                         search=self.search, with_stages=with_stages, with_model=with_model, timings=timings)

    def to_json(self, *, timings: bool = False) -> str:
        return dumps(self.to_dict(timings=timings))


def config_fields(model: ModelSpec, cfg: RunConfig) -> dict[str, Any]:
    """The configuration part of a plan's JSON (shared by ``estimate --json`` and ``plan --json``)."""
    return {
        "num_gpus": cfg.num_gpus,
        "parallelism": {
            "tp": cfg.tp, "pp": cfg.pp, "dp": cfg.dp, "cp": cfg.cp, "ep": cfg.ep, "vpp": cfg.vpp,
            "sequence_parallel": cfg.sequence_parallel, "zero_stage": cfg.zero_stage, "cp_kind": cfg.cp_kind,
            "etp": cfg.expert_tp, "dp_shard": cfg.dp_shard,
        },
        "batch": {
            "global_batch_size": cfg.global_batch_size, "micro_batch_size": cfg.micro_batch_size,
            "num_microbatches": cfg.num_microbatches, "seq_len": cfg.seq_len,
        },
        "schedule": cfg.schedule,
        "recompute": {"mode": cfg.recompute, "num_layers": cfg.recompute_num_layers,
                      "layers_per_stage": (list(cfg.recompute_layers_per_stage)
                                           if cfg.recompute_layers_per_stage is not None else None),
                      "modules": cfg.recompute_modules.split(",") if cfg.recompute_modules else []},
        "layers_per_stage": list(stage_layers(model, cfg)),
        "options": {
            "flash_attention": cfg.flash_attention, "overlap_grad_reduce": cfg.overlap_grad_reduce,
            "overlap_param_gather": cfg.overlap_param_gather, "tp_comm_overlap": cfg.tp_comm_overlap,
            "grad_reduce_bytes": cfg.grad_reduce_bytes, "precision": cfg.precision,
            "ep_comm_overlap": cfg.ep_comm_overlap,
            **({"offload_layers": cfg.offload_layers} if cfg.offload_layers else {}),
            **({} if cfg.fused_cross_entropy else {"fused_cross_entropy": False}),
            **({"packed_doc_len": cfg.packed_doc_len} if cfg.packed_doc_len else {}),
            **({"packed_attention_cv": cfg.packed_attention_cv} if cfg.packed_attention_cv else {}),
            **({"offload_modules": cfg.offload_modules} if cfg.offload_modules else {}),
            **({"attention_kernel": cfg.attention_kernel} if cfg.attention_kernel else {}),
            **({} if cfg.per_expert_gemm_calls else {"per_expert_gemm_calls": False}),
            **({} if cfg.moe_overlap_fills_issue_gaps else {"moe_overlap_fills_issue_gaps": False}),
            **({"fp8_param_gather": True} if cfg.fp8_param_gather else {}),
            **({} if cfg.te_quantized_weights else {"te_quantized_weights": False}),
            **({} if cfg.grads_in_reduce_dtype else {"grads_in_reduce_dtype": False}),
            **({"adam_moment_bytes": cfg.adam_moment_bytes} if cfg.adam_moment_bytes != 4 else {}),
            **({"activation_fp8_input_store": True} if cfg.activation_fp8_input_store else {}),
            **({"moe_load_factor": cfg.moe_load_factor} if cfg.moe_load_factor != 1.0 else {}),
            **({"comm_reserved_sms": cfg.comm_reserved_sms} if cfg.comm_reserved_sms else {}),
            **({} if cfg.recompute_fused_attention else {"recompute_fused_attention": False}),
            **({} if cfg.overlap_p2p_comm else {"overlap_p2p_comm": False}),
            **({"ep_dispatcher": cfg.ep_dispatcher} if cfg.ep_dispatcher != "alltoall" else {}),
            **({"pipeline_flushes": cfg.pipeline_flushes} if cfg.pipeline_flushes != 1 else {}),
        },
    }


#: search statistics that measure this machine, not the search: left out of the JSON unless asked for, so that the
#: same request always gives byte-identical output
TIMING_KEYS = ("time_s", "cpu_s", "candidates_per_s")


def plan_dict(model: ModelSpec, cluster_name: str, cfg: RunConfig, est: Estimate, *, alternatives=(),
              search: dict | None = None, with_stages: bool = True, with_model: bool = True,
              timings: bool = False) -> dict[str, Any]:
    from planner import __version__
    from planner.cost.memory import active_params, total_params

    d: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "planner_version": __version__, "model": model.name,
                         "cluster": cluster_name,
                         "model_params": {"total": total_params(model, cfg.seq_len),
                                          "active": active_params(model, cfg.seq_len)}}
    d.update(config_fields(model, cfg))
    warnings = request_warnings(model, cfg)
    if warnings:
        d["warnings"] = warnings
    d["estimate"] = est.to_dict(with_stages=with_stages)
    if with_model:
        d["model_spec"] = asdict(model)
    if alternatives:
        d["alternatives"] = [a.to_dict(with_stages=False, with_model=False) for a in alternatives]
    if search is not None:
        d["search"] = {k: v for k, v in search.items() if timings or k not in TIMING_KEYS}
    return d


def request_warnings(model: ModelSpec, cfg: RunConfig, gpu: GPU | None = None) -> list[str]:
    """What a user should know about a request the planner still answers: a sequence longer than the model's
    trained context (its positions must be extended, e.g. RoPE scaling, which the cost model does not price); on a
    ``gpu`` as a stack runs it, biased experts priced through that stack's fitted grouped weight-gradient factor
    (``compute.biased_grouped_wgrad``), with what avoids the path."""
    out = []
    if cfg.seq_len > model.max_seq_len:
        out.append(f"sequence length {cfg.seq_len} exceeds the model's maximum of {model.max_seq_len} positions "
                   f"(max_position_embeddings): the estimate assumes they are extended (e.g. RoPE scaling)")
    if gpu is not None and gpu.biased_grouped_wgrad_factor != 1.0 and bool(biased_grouped_wgrad(model, cfg)):
        out.append(f"the experts' biased GroupedLinear weight gradients in {cfg.precision} take "
                   f"{gpu.biased_grouped_wgrad_factor:g}x the time the GEMM curve gives them (the stack's fitted "
                   f"biased_grouped_wgrad_factor, from Megatron-Bridge's GPT-OSS runs); --precision fp8 / mxfp8 or one "
                   f"grouped expert kernel (--grouped-expert-gemm, a stack such as torchtitan) avoid that path")
    return out


def dumps(d: dict[str, Any]) -> str:
    """Deterministic JSON: sorted keys, fixed float formatting by json's repr, trailing newline."""
    return json.dumps(d, indent=2, sort_keys=True, allow_nan=False) + "\n"


def _modules(names: Any, source: str) -> str:
    """A plan's ``recompute.modules`` list in canonical form (``config.canonical_recompute_modules``)."""
    try:
        return canonical_recompute_modules(names)
    except (ValueError, AttributeError) as e:
        raise PlannerError(str(e), source=source, field="recompute.modules",
                           fix="use the names of `planner estimate --help` (--recompute-modules)") from None


def config_from_dict(d: dict[str, Any], source: str = "<plan>") -> RunConfig:
    """Rebuild the RunConfig of a plan JSON (as written by ``plan_dict``)."""
    try:
        par, batch, rec, opt = d["parallelism"], d["batch"], d["recompute"], d.get("options", {})
        layers = d.get("layers_per_stage")
        return RunConfig(
            num_gpus=int(d["num_gpus"]), tp=par["tp"], pp=par["pp"], cp=par.get("cp", 1), ep=par.get("ep", 1),
            vpp=par.get("vpp", 1), sequence_parallel=par["sequence_parallel"], zero_stage=par["zero_stage"],
            etp=par["etp"] if par.get("etp", par["tp"]) != par["tp"] else None, dp_shard=par.get("dp_shard"),
            cp_kind=par.get("cp_kind", "ring"), global_batch_size=batch["global_batch_size"],
            micro_batch_size=batch["micro_batch_size"], seq_len=batch["seq_len"], schedule=d["schedule"],
            recompute=rec["mode"], recompute_num_layers=rec.get("num_layers"),
            recompute_modules=_modules(rec.get("modules", [DEFAULT_RECOMPUTE_MODULES]), source),
            recompute_layers_per_stage=(tuple(rec["layers_per_stage"]) if rec.get("layers_per_stage") is not None
                                        else None),
            layers_per_stage=tuple(layers) if layers else None,
            **{f.name: opt[f.name] for f in fields(RunConfig) if f.name in opt},
        )
    except (KeyError, TypeError) as e:
        raise PlannerError(f"not a planner plan: missing or malformed field {e}", source=source,
                           fix="pass a file written by `planner plan --json` or `planner estimate --json`")


def model_from_plan_dict(d: dict[str, Any], source: str = "<plan>") -> ModelSpec:
    spec = d.get("model_spec")
    if not isinstance(spec, dict):
        raise PlannerError("missing model_spec", source=source, field="model_spec",
                           fix="pass a file written by `planner plan --json`")
    try:
        model = ModelSpec(**spec)
    except TypeError as e:
        raise PlannerError(f"malformed model_spec: {e}", source=source, field="model_spec")
    try:  # the cross-field checks a config.json passes
        validate_model(model, source)
    except PlannerError as e:
        raise PlannerError(f"inconsistent model_spec: {e.reason}", source=source, field="model_spec")
    return model


def search_plans(model: ModelSpec, cluster: Cluster, num_gpus: int, global_batch_size: int, seq_len: int, *,
                 top_k: int = 3, objective: str = "time", max_memory_gib: float | None = None,
                 **options: Any) -> Plan:
    """``planner plan`` as a function: the search's best plan, with the next ``top_k`` as ``alternatives`` and its
    statistics as ``search``. Raises InfeasibleError when nothing fits. ``options`` go to
    :func:`planner.search.engine.search` (``space``, ``refine_partition``)."""
    from planner.search.engine import search  # here, so that reading a plan file does not load numpy

    res = search(model, cluster, num_gpus, global_batch_size, seq_len, objective=objective, top=top_k,
                 max_memory_gib=max_memory_gib, **options)
    alternatives = tuple(Plan(model, cluster.name, c.config, c.estimate) for c in res.alternatives)
    return Plan(model, cluster.name, res.best.config, res.best.estimate, alternatives=alternatives,
                search=dict(res.stats))


def attempt(search: Callable[[], Plan]) -> Plan | InfeasibleError:
    """``search()``'s plan, or the InfeasibleError it raised (for :func:`best_of`)."""
    try:
        return search()
    except InfeasibleError as e:
        return e


def best_of(results: list[Plan | InfeasibleError], top_k: int, objective: str = "time") -> Plan:
    """The best plan of several searches over disjoint spaces (each exact within its own) and the best ``top_k``
    runners-up of all of them; the first search's error when none found a plan. Search statistics add up."""
    from planner.search.engine import objective_key

    plans = [r for r in results if isinstance(r, Plan)]
    if not plans:
        raise next(r for r in results if isinstance(r, InfeasibleError))
    every = sorted((p for plan in plans for p in (plan,) + plan.alternatives),
                   key=lambda p: objective_key(p.estimate, objective))
    best, rest = every[0], every[1:1 + top_k]
    stats: dict[str, Any] = {}
    for plan in plans:
        for key, value in (plan.search or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("candidates_per_s",):
                stats[key] = stats.get(key, 0) + value
            else:
                stats.setdefault(key, value)
    if "candidates_per_s" in stats and stats.get("time_s"):
        stats["candidates_per_s"] = stats["candidates"] / stats["time_s"]
    return replace(best, alternatives=tuple(replace(p, alternatives=()) for p in rest), search=stats)
