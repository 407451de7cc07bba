"""Megatron-Bridge overrides for a plan: what NeMo users now run LLM pre-training with.

NeMo 3 moved LLM pre-training out of ``nemo.lightning`` (no ``MegatronStrategy``) into Megatron-Bridge, whose recipes
build a ``megatron.bridge.training.config.ConfigContainer`` (github NVIDIA-NeMo/Megatron-Bridge, release 26.04,
``src/megatron/bridge/training/config.py``). The export is a Python snippet with the plan as dotted overrides of that
container and an ``apply_plan(cfg)`` that sets them on a recipe's config (``llama31_405b_pretrain_config()`` and the
like), plus the ``CommOverlapConfig`` and the environment the plan needs. Field names: ``model.*`` are Megatron
Core's ``TransformerConfig`` / ``GPTModelProvider`` (``tensor_model_parallel_size``, ...,
``pipeline_model_parallel_layout``, ``recompute_*``), ``train.micro_batch_size`` / ``global_batch_size``,
``dataset.seq_length``, ``ddp.*`` (``DistributedDataParallelConfig``, Megatron FSDP's ``use_megatron_fsdp`` and
``data_parallel_sharding_strategy``), ``optimizer.use_distributed_optimizer``, ``checkpoint.ckpt_format`` and
``mixed_precision`` (a preset name of ``megatron/bridge/training/mixed_precision.py``).

Megatron-Bridge trains with Megatron Core, so it refuses what the Megatron-LM exporter refuses: schedules other than
1F1B and interleaved 1F1B, and ZeRO-2/3 (Megatron FSDP) together with pipeline stages. Uneven pipeline splits,
virtual stages included, are written as Megatron Core's ``pipeline_model_parallel_layout``.
"""

from __future__ import annotations

from typing import Any

from planner.errors import PlannerError
from planner.export._common import (PlanView, read_plan, recompute_counts, refuse_recompute_modules, summary_comment,
                                    uniform_recompute_count, unsupported)
from planner.export.megatron import (CP_COMM_TYPE, FSDP_SHARDING, attention_backend, check_plan,
                                     current_scaling_needed, dispatcher_fields, environment, fp8_param_gather,
                                     hybrid_pattern, layout_string)

LAUNCHER = "nemo"
#: the release this exporter targets, what it writes, and what checks its output (`planner list launchers`)
RELEASE = 'Megatron-Bridge 26.04 (NeMo 3 LLM pre-training)'
FORMAT = 'Python snippet of ConfigContainer overrides'
CHECKED_BY = 'the field names of training/config.py (tests/test_export.py)'
#: planner precision -> Megatron-Bridge mixed-precision preset (megatron/bridge/training/mixed_precision.py)
MIXED_PRECISION = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp8": "bf16_with_fp8_delayed_scaling_mixed",
                   "mxfp8": "bf16_with_mxfp8_mixed"}


def _check(view: PlanView) -> None:
    try:
        check_plan(view)
    except PlannerError as e:  # the same rules, under this launcher's name
        raise unsupported(LAUNCHER, e.reason.split(": ", 1)[-1], e.fix) from None
    if view.cfg.recompute == "full" and uniform_recompute_count(view) is False:
        raise unsupported(LAUNCHER, f"a different number of recomputed layers per stage "
                                    f"({list(recompute_counts(view))})",
                          "model.recompute_num_layers is one number for every stage; plan with one count")


def overrides(plan: Any, source: str = "<plan>") -> dict[str, Any]:
    """Dotted ``ConfigContainer`` paths -> values."""
    view = read_plan(plan, source)
    _check(view)
    cfg = view.cfg
    out: dict[str, Any] = {
        "model.tensor_model_parallel_size": cfg.tp,
        "model.pipeline_model_parallel_size": cfg.pp,
        "model.virtual_pipeline_model_parallel_size": cfg.vpp if cfg.vpp > 1 else None,
        "model.context_parallel_size": cfg.cp,
        "model.sequence_parallel": bool(cfg.sequence_parallel and cfg.tp > 1),
    }
    if view.is_moe:
        out["model.expert_model_parallel_size"] = cfg.ep
        out["model.expert_tensor_parallel_size"] = cfg.expert_tp
        # the dispatcher and expert GEMMs the plan costs (Megatron-Core's defaults are allgather, one GEMM per expert)
        # (Megatron-Bridge's apply_flex_dispatcher_backend sets the same pair for the flex dispatcher)
        out.update({f"model.{k}": v for k, v in dispatcher_fields(cfg.ep_dispatcher).items()})
        out["model.moe_grouped_gemm"] = True
    if cfg.cp > 1:
        out["model.cp_comm_type"] = CP_COMM_TYPE[cfg.cp_kind]
    if view.model is not None and view.model.layer_pattern:
        # a hybrid model (HybridModelProvider, the Nemotron-H recipes): the pattern carries the pipeline split as
        # '|' segments; Megatron Core refuses pipeline_model_parallel_layout with a hybrid pattern
        out["model.hybrid_layer_pattern"] = hybrid_pattern(view.model.layer_pattern,
                                                           view.layers_per_stage if cfg.pp > 1 else None)
    elif cfg.pp > 1 and not view.even_split:
        out["model.pipeline_model_parallel_layout"] = layout_string(view.layers_per_stage)
    out.update({"model.seq_length": cfg.seq_len, "dataset.seq_length": cfg.seq_len,
                "train.micro_batch_size": cfg.micro_batch_size, "train.global_batch_size": cfg.global_batch_size})
    refuse_recompute_modules(LAUNCHER, cfg)
    if cfg.recompute == "selective":
        out["model.recompute_granularity"] = "selective"
        out["model.recompute_modules"] = cfg.recompute_modules.split(",") if cfg.recompute_modules else []
    elif cfg.recompute == "full" and uniform_recompute_count(view) != 0:
        k = uniform_recompute_count(view)
        out["model.recompute_granularity"] = "full"
        out["model.recompute_method"] = "uniform" if k is None else "block"
        out["model.recompute_num_layers"] = 1 if k is None else k
    else:
        out["model.recompute_granularity"] = None
    fsdp = cfg.zero_stage in FSDP_SHARDING
    if cfg.dp_shard is not None and cfg.dp_replicas > 1:  # HSDP: Megatron's distributed-optimizer instances
        out["ddp.num_distributed_optimizer_instances"] = cfg.dp_replicas
    out.update({"ddp.use_distributed_optimizer": cfg.zero_stage == 1,
                "optimizer.use_distributed_optimizer": cfg.zero_stage == 1,
                "ddp.overlap_grad_reduce": cfg.overlap_grad_reduce,
                "ddp.overlap_param_gather": bool(cfg.overlap_param_gather and cfg.zero_stage == 1),
                "ddp.grad_reduce_in_fp32": cfg.grad_reduce_bytes == 4})
    if cfg.adam_moment_bytes == 2:  # OptimizerConfig: the precision-aware optimizer with bf16 moments (OPTIMIZER_DTYPES)
        out["optimizer.use_precision_aware_optimizer"] = True
    if cfg.activation_fp8_input_store:  # TransformerConfig: the SwiGLU input kept in fp8 for backward
        out["model.activation_func_fp8_input_store"] = True
    if fsdp:  # ConfigContainer: "Megatron-FSDP requires the fsdp_dtensor checkpointing format"
        out.update({"ddp.use_megatron_fsdp": True, "ddp.data_parallel_sharding_strategy": FSDP_SHARDING[cfg.zero_stage],
                    "checkpoint.ckpt_format": "fsdp_dtensor"})
    out["model.cross_entropy_loss_fusion"] = cfg.fused_cross_entropy
    if attention_backend(cfg) is not None:  # TransformerConfig.attention_backend (an AttnBackend name)
        out["model.attention_backend"] = attention_backend(cfg)
    if cfg.offload_layers:
        out.update({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": cfg.offload_layers})
    if cfg.offload_modules:  # TransformerConfig fields (Megatron-Core fine-grained activation offloading)
        out.update({"model.fine_grained_activation_offloading": True,
                    "model.offload_modules": cfg.offload_modules.split(",")})
    out["mixed_precision"] = "bf16_with_fp8_current_scaling_mixed" if current_scaling_needed(cfg) else \
        MIXED_PRECISION[cfg.precision]
    return out


def comm_overlap_kwargs(plan: Any, source: str = "<plan>") -> dict[str, Any]:
    """Keyword arguments of Megatron-Bridge's ``CommOverlapConfig`` (TP communication overlap, blocking pipeline
    sends where the plan has them, and the batch-level MoE all-to-all overlap with its deferred weight gradients)."""
    cfg = read_plan(plan, source).cfg
    kw: dict[str, Any] = {"tp_comm_overlap": bool(cfg.tp_comm_overlap and cfg.tp > 1)}
    if cfg.pp > 1 and cfg.vpp > 1 and not cfg.overlap_p2p_comm:  # Megatron-Bridge turns it on with virtual stages
        kw["overlap_p2p_comm"] = False
    if cfg.ep_comm_overlap:
        kw.update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    return kw


def notes(plan: Any, source: str = "<plan>") -> list[str]:
    view = read_plan(plan, source)
    cfg = view.cfg
    out = [f"launch on {cfg.num_gpus} GPUs in all (torchrun --nnodes x --nproc-per-node), with the recipe's data, "
           "tokenizer, optimizer and checkpoint settings"]
    if not cfg.flash_attention:
        out.append("the plan assumes an unfused attention kernel (flash_attention = false)")
    if cfg.precision in ("fp8", "mxfp8") and cfg.zero_stage >= 1 and not fp8_param_gather(cfg):
        out.append("the plan was costed with the weights gathered in bf16: the fp8 / mxfp8 presets gather them in "
                   "fp8 (set the mixed-precision config's fp8_param_gather = False to match)")
    return out


def optimizer_dtypes(plan: Any, source: str = "<plan>") -> dict[str, str]:
    """OptimizerConfig fields that take a torch dtype, by name (``torch.<name>``, set by ``apply_plan``): Adam's
    moments in bf16 where the plan keeps them so (Megatron-Bridge's tuned DeepSeek-V3 recipes set the same,
    perf_recipes/deepseek/common.py)."""
    cfg = read_plan(plan, source).cfg
    return {"optimizer.exp_avg_dtype": "bfloat16", "optimizer.exp_avg_sq_dtype": "bfloat16"} \
        if cfg.adam_moment_bytes == 2 else {}


def _dict_block(name: str, d: dict[str, Any]) -> list[str]:
    return [f"{name} = {{"] + [f"    {k!r}: {v!r}," for k, v in d.items()] + ["}"]


def render(plan: Any, source: str = "<plan>") -> str:
    view = read_plan(plan, source)
    over, overlap, env = overrides(plan, source), comm_overlap_kwargs(plan, source), environment(plan, source)
    lines = ['"""Megatron-Bridge (NeMo 3 LLM pre-training) settings generated by planner.', ""]
    lines += summary_comment(view)
    lines += [f"note: {n}" for n in notes(plan, source)]
    lines += ["", "Usage: cfg = apply_plan(<recipe>_pretrain_config(...)), then megatron.bridge.training.pretrain",
              "(cfg, forward_step); apply_plan sets the environment below before CUDA starts.", '"""', "",
              "import os", ""]
    lines += ["# dotted paths of megatron.bridge.training.config.ConfigContainer"]
    lines += _dict_block("PLAN_OVERRIDES", over) + [""]
    lines += ["# megatron.bridge.training.comm_overlap.CommOverlapConfig(**COMM_OVERLAP)"]
    lines += _dict_block("COMM_OVERLAP", overlap) + [""]
    lines += ["# what Megatron Core's checks need of this plan (None: unset)"]
    lines += _dict_block("ENVIRONMENT", env) + [""]
    lines += ["# dotted paths set to getattr(torch, value)"]
    lines += _dict_block("OPTIMIZER_DTYPES", optimizer_dtypes(plan, source)) + ["", ""]
    lines += ["def apply_plan(cfg):",
              '    """Set the plan on a Megatron-Bridge ConfigContainer (and the process environment); return it."""',
              "    from megatron.bridge.training.comm_overlap import CommOverlapConfig",
              "",
              "    for name, value in ENVIRONMENT.items():",
              "        if value is None:",
              "            os.environ.pop(name, None)",
              "        else:",
              "            os.environ[name] = value",
              "    for path, value in PLAN_OVERRIDES.items():",
              "        *parents, leaf = path.split('.')",
              "        node = cfg",
              "        for name in parents:",
              "            node = getattr(node, name)",
              "        setattr(node, leaf, value)",
              "    if OPTIMIZER_DTYPES:",
              "        import torch",
              "",
              "        for path, value in OPTIMIZER_DTYPES.items():",
              "            *parents, leaf = path.split('.')",
              "            node = cfg",
              "            for name in parents:",
              "                node = getattr(node, name)",
              "            setattr(node, leaf, getattr(torch, value))",
              "    cfg.comm_overlap = CommOverlapConfig(**COMM_OVERLAP)",
              "    return cfg", ""]
    return "\n".join(lines)
