"""DeepSpeed JSON config for a plan (with the Megatron-DeepSpeed arguments it needs, as notes).

DeepSpeed's batch rule: ``train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x
data-parallel GPUs``; for a plan these are the global batch, the micro-batch and the number of micro-batches.
``zero_optimization.stage`` is the plan's ZeRO stage. Tensor, pipeline and sequence parallelism are not part of the
JSON: Megatron-DeepSpeed takes them as ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size`` and
``--ds-sequence-parallel-size`` (Ulysses), listed by ``notes``.

Refused: ZeRO-2/3 with pipeline parallelism (DeepSpeed's pipeline engine allows ZeRO-0/1 only), pipeline schedules
other than 1F1B (its pipeline engine runs one schedule, no virtual stages), ring context parallelism (DeepSpeed's
sequence parallelism is Ulysses).
"""

from __future__ import annotations

import json
from typing import Any

from planner.export._common import (read_plan, recompute_counts, refuse_megatron_core_only, refuse_pipeline_flushes,
                                    refuse_recompute_modules, uniform_recompute_count, unsupported)

LAUNCHER = "deepspeed"
#: the release this exporter targets, what it writes, and what checks its output (`planner list launchers`)
RELEASE = 'DeepSpeed 0.19.8 (+ Megatron-DeepSpeed arguments in the notes)'
FORMAT = 'JSON config'
CHECKED_BY = 'DeepSpeedConfig (conformance/)'
#: bytes per element of the gradient reduction -> DeepSpeed communication_data_type
COMM_DTYPE = {2: "bf16", 4: "fp32"}


def config(plan: Any, source: str = "<plan>") -> dict[str, Any]:
    view = read_plan(plan, source)
    cfg = view.cfg
    if cfg.pp > 1 and cfg.zero_stage >= 2:
        raise unsupported(LAUNCHER, f"ZeRO-{cfg.zero_stage} with pipeline parallelism (pp={cfg.pp}); the "
                                    "pipeline engine supports ZeRO-0 and ZeRO-1 only",
                          "plan with ZeRO-1 or without pipeline parallelism")
    if cfg.pp > 1 and (cfg.schedule != "1f1b" or cfg.vpp > 1):
        raise unsupported(LAUNCHER, f"pipeline schedule '{cfg.schedule}' (vpp={cfg.vpp}); DeepSpeed's pipeline "
                                    "engine runs 1F1B without virtual stages",
                          "plan with schedule 1f1b, or export to megatron / torchtitan")
    if cfg.cp > 1 and cfg.cp_kind != "ulysses":
        raise unsupported(LAUNCHER, f"{cfg.cp_kind} context parallelism (DeepSpeed sequence parallelism is "
                                    "Ulysses all-to-all)", "plan with cp_kind ulysses or export to megatron")
    refuse_megatron_core_only(LAUNCHER, cfg)
    refuse_pipeline_flushes(LAUNCHER, cfg)
    if cfg.tp_comm_overlap and cfg.tp > 1:
        raise unsupported(LAUNCHER, "TP communication overlap (Megatron-Core's --tp-comm-overlap; Megatron-DeepSpeed "
                                    "has no such option)", "plan for deepspeed (--emit deepspeed), or export to "
                                                           "megatron / nemo / torchtitan")
    refuse_recompute_modules(LAUNCHER, cfg)
    if cfg.precision in ("fp8", "mxfp8"):
        raise unsupported(LAUNCHER, f"{cfg.precision} GEMMs (DeepSpeed's JSON config has no fp8 training switch)",
                          "plan with --precision bf16, or export to megatron / nemo / torchtitan")
    if cfg.dp_shard is not None and cfg.dp_replicas > 1:
        # DeepSpeed 0.19's DeepSpeedConfig: "MiCS ZeRO-3 sharding has been removed; 'zero_optimization.
        # mics_shard_size' is no longer supported" (found by the conformance check); ZeRO++'s hpZ keeps a second
        # copy of the weights per node but shards optimizer states over all of DP, not HSDP
        raise unsupported(LAUNCHER, f"HSDP (ZeRO shards of {cfg.zero_shard_dp} DP ranks x {cfg.dp_replicas} replicas; "
                                    "DeepSpeed 0.19 removed MiCS, its grouped sharding)",
                          "plan without --dp-shard, or export to torchtitan / megatron")
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage >= 1:
        zero["overlap_comm"] = cfg.overlap_grad_reduce
        zero["contiguous_gradients"] = True
    return {
        "train_batch_size": cfg.global_batch_size,
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.num_microbatches,
        **({"fp16": {"enabled": True}} if cfg.precision == "fp16" else {"bf16": {"enabled": True}}),
        "communication_data_type": COMM_DTYPE.get(cfg.grad_reduce_bytes, "fp32"),
        "zero_optimization": zero,
    }


def notes(plan: Any, source: str = "<plan>") -> list[str]:
    view = read_plan(plan, source)
    cfg = view.cfg
    args = [f"--tensor-model-parallel-size {cfg.tp}", f"--pipeline-model-parallel-size {cfg.pp}",
            f"--micro-batch-size {cfg.micro_batch_size}", f"--global-batch-size {cfg.global_batch_size}",
            f"--seq-length {cfg.seq_len}", f"--zero-stage {cfg.zero_stage}"]
    if cfg.pp == 1:  # else Megatron-DeepSpeed builds GPTModelPipe, and DeepSpeed asserts ZeRO-2/3 is not for pipelines
        args.append("--no-pipeline-parallel")
    if cfg.cp > 1:
        args.append(f"--ds-sequence-parallel-size {cfg.cp}")
    if cfg.sequence_parallel and cfg.tp > 1:
        args.append("--sequence-parallel")
    if cfg.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif cfg.recompute == "full":
        k = uniform_recompute_count(view)
        if k is False:
            raise unsupported(LAUNCHER, f"a different number of recomputed layers per stage "
                                        f"({list(recompute_counts(view))})", "plan with one recompute count")
        if k != 0:  # 0: no layer recomputed, the cost model's "none"
            args.append("--recompute-granularity full " + ("--recompute-method uniform --recompute-num-layers 1"
                                                            if k is None else f"--recompute-method block "
                                                                              f"--recompute-num-layers {k}"))
    out = ["Megatron-DeepSpeed arguments for the same plan: --deepspeed --deepspeed_config <this file> "
           + " ".join(args)]
    if cfg.ep > 1:
        out.append(f"expert parallelism is set in the model code (DeepSpeed-MoE ep_size={cfg.ep}), not in the JSON")
    return out


def render(plan: Any, source: str = "<plan>") -> str:
    return json.dumps(config(plan, source), indent=2) + "\n"
