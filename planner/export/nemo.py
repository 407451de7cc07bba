"""NeMo 2.0 ``MegatronStrategy`` snippet (and recipe overrides) for a plan.

Names follow NeMo 2.0: ``nl.MegatronStrategy(tensor_model_parallel_size, pipeline_model_parallel_size,
virtual_pipeline_model_parallel_size, context_parallel_size, sequence_parallel, expert_model_parallel_size,
expert_tensor_parallel_size, ddp=DistributedDataParallelConfig(...))``; recipe fields ``data.micro_batch_size``,
``data.global_batch_size``, ``data.seq_length``, ``model.config.recompute_granularity/method/num_layers``,
``model.config.num_layers_in_first/last_pipeline_stage``, ``model.config.cp_comm_type`` and
``optim.config.use_distributed_optimizer``.

NeMo 2.0 trains with Megatron Core, so it refuses what the Megatron-LM exporter refuses (schedules other than
1F1B and interleaved 1F1B); it also refuses ZeRO-2/3 and uneven pipeline splits other than a different first and
last stage, which this snippet does not express.
"""

from __future__ import annotations

from typing import Any

from planner.export._common import (PlanView, first_last_split, read_plan, recompute_counts, summary_comment,
                                    uniform_recompute_count, unsupported)
from planner.export.megatron import CP_COMM_TYPE, SCHEDULE_SUPPORT

LAUNCHER = "nemo"


def _check(view: PlanView) -> None:
    cfg = view.cfg
    if cfg.pp > 1 and SCHEDULE_SUPPORT.get(cfg.schedule) is None:
        raise unsupported(LAUNCHER, f"pipeline schedule '{cfg.schedule}' (NeMo 2.0 / Megatron Core runs only 1F1B "
                                    "and interleaved 1F1B)",
                          "export to torchtitan, or plan with schedule 1f1b / interleaved-1f1b")
    if cfg.zero_stage >= 2:
        raise unsupported(LAUNCHER, f"ZeRO-{cfg.zero_stage}; this export covers DDP and the distributed optimizer "
                                    "(ZeRO-0/1)", "plan with ZeRO-0 or ZeRO-1, or export to megatron")
    if cfg.pp > 1 and not view.even_split and (cfg.vpp > 1 or first_last_split(view.layers_per_stage) is None):
        raise unsupported(LAUNCHER, f"uneven pipeline split {list(view.layers_per_stage)}",
                          "export to megatron (--pipeline-model-parallel-layout) or torchtitan")
    if cfg.recompute == "full" and uniform_recompute_count(view) is False:
        raise unsupported(LAUNCHER, f"a different number of recomputed layers per stage "
                                    f"({list(recompute_counts(view))})",
                          "model.config.recompute_num_layers is one number for every stage; plan with one count")


def strategy_kwargs(plan: Any, source: str = "<plan>") -> dict[str, Any]:
    """Keyword arguments of ``nl.MegatronStrategy`` (without ``ddp``, see ``ddp_kwargs``)."""
    view = read_plan(plan, source)
    _check(view)
    cfg = view.cfg
    kw: dict[str, Any] = {
        "tensor_model_parallel_size": cfg.tp,
        "pipeline_model_parallel_size": cfg.pp,
        "virtual_pipeline_model_parallel_size": cfg.vpp if cfg.vpp > 1 else None,
        "context_parallel_size": cfg.cp,
        "sequence_parallel": bool(cfg.sequence_parallel and cfg.tp > 1),
    }
    if view.is_moe:
        kw["expert_model_parallel_size"] = cfg.ep
        kw["expert_tensor_parallel_size"] = cfg.expert_tp
    return kw


def ddp_kwargs(plan: Any, source: str = "<plan>") -> dict[str, Any]:
    """Keyword arguments of Megatron Core's ``DistributedDataParallelConfig``."""
    cfg = read_plan(plan, source).cfg
    return {
        "use_distributed_optimizer": cfg.zero_stage == 1,
        "overlap_grad_reduce": cfg.overlap_grad_reduce,
        "overlap_param_gather": bool(cfg.overlap_param_gather and cfg.zero_stage == 1),
        "grad_reduce_in_fp32": cfg.grad_reduce_bytes == 4,
    }


def recipe_overrides(plan: Any, source: str = "<plan>") -> dict[str, Any]:
    """Dotted recipe paths -> values, for a NeMo-Run pretraining recipe."""
    view = read_plan(plan, source)
    _check(view)
    cfg = view.cfg
    out: dict[str, Any] = {f"trainer.strategy.{k}": v for k, v in strategy_kwargs(plan, source).items()}
    out.update({f"trainer.strategy.ddp.{k}": v for k, v in ddp_kwargs(plan, source).items()})
    out.update({"data.micro_batch_size": cfg.micro_batch_size, "data.global_batch_size": cfg.global_batch_size,
                "data.seq_length": cfg.seq_len, "model.config.seq_length": cfg.seq_len})
    if cfg.cp > 1:
        out["model.config.cp_comm_type"] = CP_COMM_TYPE[cfg.cp_kind]
    if cfg.pp > 1 and not view.even_split:
        first, last = first_last_split(view.layers_per_stage)
        out["model.config.num_layers_in_first_pipeline_stage"] = first
        out["model.config.num_layers_in_last_pipeline_stage"] = last
    if cfg.recompute == "selective":
        out["model.config.recompute_granularity"] = "selective"
        out["model.config.recompute_modules"] = cfg.recompute_modules.split(",") if cfg.recompute_modules else []
    elif cfg.recompute == "full" and uniform_recompute_count(view) != 0:
        k = uniform_recompute_count(view)
        out["model.config.recompute_granularity"] = "full"
        out["model.config.recompute_method"] = "uniform" if k is None else "block"
        out["model.config.recompute_num_layers"] = 1 if k is None else k
    else:
        out["model.config.recompute_granularity"] = None
    out["optim.config.use_distributed_optimizer"] = cfg.zero_stage == 1
    return out


def notes(plan: Any, source: str = "<plan>") -> list[str]:
    cfg = read_plan(plan, source).cfg
    out = ["set trainer.num_nodes and trainer.devices so that nodes x devices = "
           f"{cfg.num_gpus} GPUs"]
    if cfg.tp_comm_overlap and cfg.tp > 1:
        out.append("TP communication overlap: add MegatronCommOverlapCallback(tp_comm_overlap=True) to the trainer")
    if cfg.ep_comm_overlap:
        out.append("MoE all-to-all overlap: set comm_overlap.overlap_moe_expert_parallel_comm = True and "
                   "comm_overlap.delay_wgrad_compute = True (Megatron-Bridge CommOverlapConfig)")
    if cfg.precision != "bf16":
        plugin = {"fp16": "MegatronMixedPrecision(precision='16-mixed')",
                  "fp8": "MegatronMixedPrecision(precision='bf16-mixed', fp8='hybrid', fp8_recipe='delayed')",
                  "mxfp8": "MegatronMixedPrecision(precision='bf16-mixed', fp8='e4m3', fp8_recipe='mxfp8')"}
        out.append(f"{cfg.precision} GEMMs: use the precision plugin {plugin[cfg.precision]}")
    return out


def _kwargs_block(kw: dict[str, Any], indent: str) -> list[str]:
    return [f"{indent}{k}={v!r}," for k, v in kw.items()]


def render(plan: Any, source: str = "<plan>") -> str:
    view = read_plan(plan, source)
    skw, dkw, over = strategy_kwargs(plan, source), ddp_kwargs(plan, source), recipe_overrides(plan, source)
    lines = ['"""NeMo 2.0 settings generated by planner.', ""]
    lines += summary_comment(view)
    lines += [f"note: {n}" for n in notes(plan, source)]
    lines += ['"""', "", "from megatron.core.distributed import DistributedDataParallelConfig",
              "from nemo import lightning as nl", "", "strategy = nl.MegatronStrategy("]
    lines += _kwargs_block(skw, "    ")
    lines += ["    ddp=DistributedDataParallelConfig("] + _kwargs_block(dkw, "        ") + ["    ),", ")", ""]
    lines += ["# The same plan as overrides of a NeMo-Run pretraining recipe (dotted attribute paths).",
              "RECIPE_OVERRIDES = {"]
    lines += [f"    {k!r}: {v!r}," for k, v in over.items()]
    lines += ["}", "", "", "def apply_plan(recipe):",
              '    """Set every override on ``recipe`` (e.g. ``llm.llama31_405b.pretrain_recipe(...)``)."""',
              "    for path, value in RECIPE_OVERRIDES.items():",
              "        *parents, leaf = path.split('.')",
              "        node = recipe",
              "        for name in parents:",
              "            node = getattr(node, name)",
              "        setattr(node, leaf, value)",
              "    return recipe", ""]
    return "\n".join(lines)
