"""torchtitan 0.3 configuration for a plan: a Python module with one function returning a ``Trainer.Config``, run
as ``python -m torchtitan.train --module <file's module> --config planner_plan``.

torchtitan 0.3 replaced the TOML job file by a registry of Python functions (``torchtitan/config/manager.py``:
``--module`` / ``--config``; ``torchtitan/config/README.md``). The function starts from the configuration torchtitan
ships for the model's flavor (``torchtitan.models.<family>.config_registry``; for Llama 3.1 405B from the 70B one,
whose model spec is swapped, because the shipped 405B function converts the model to float8 at build time) and sets
what the plan decides: ``training`` (local and global batch, sequence), ``parallelism`` (``ParallelismConfig``:
replicate / shard degrees and ``fsdp_reshard_after_forward``, TP with ``enable_sequence_parallel``, CP, EP, the pipeline
degree, schedule, micro-batch and ``module_fqns_per_model_part``), ``activation_checkpoint`` (``FullAC`` /
``SelectiveAC`` / none), ``compile`` (async TP needs it) and, for fp8 / mxfp8, the model spec rebuilt with
torchao's float8 (rowwise) or MXFP8 linear converter, the LM head left in bf16.

Refused, with the reason: models torchtitan 0.3 ships no configuration for; Ulysses context parallelism; schedules
torch has no class for; V schedules without two stages per rank; ZeRO-0 with expert parallelism (EP borrows its
ranks from FSDP); expert TP other than 1 with EP (0.3 has no expert TP: EP borrows ranks from FSDP and TP,
``ParallelDims``); selective recomputation of Megatron modules and partial full recomputation (0.3 has full,
op-level selective or memory-budget checkpointing only); fp16; what only Megatron Core runs.
"""

from __future__ import annotations

from typing import Any

from planner.errors import PlannerError
from planner.export._common import (PlanView, op_sac_note, read_plan, recompute_counts, refuse_megatron_core_only,
                                    summary_comment, unsupported)
from planner.export.torchtitan import check_runs, data_parallel_degrees, stage_modules

LAUNCHER = "torchtitan-0.3"
#: the release this exporter targets, what it writes, and what checks its output (`planner list launchers`)
RELEASE = "torchtitan 0.3.0"
FORMAT = "Python config function (--module / --config)"
CHECKED_BY = "its ConfigManager (tyro), ParallelDims, pipelining schedules and the model's modules (conformance/)"
#: the function the module defines
FUNCTION = "planner_plan"
#: planner model name -> (torchtitan model family, flavor, the shipped config function the plan starts from)
MODELS: dict[str, tuple[str, str, str]] = {
    "llama-3.1-8b": ("llama3", "8B", "llama3_8b"),
    "llama-3.1-70b": ("llama3", "70B", "llama3_70b"),
    "llama-3.1-405b": ("llama3", "405B", "llama3_70b"),  # 70B's function, the 405B model spec swapped in
    "deepseek-v3": ("deepseek_v3", "671B", "deepseek_v3_671b"),
    "qwen3-0.6b": ("qwen3", "0.6B", "qwen3_0_6b"),
    "qwen3-1.7b": ("qwen3", "1.7B", "qwen3_1_7b"),
    "qwen3-14b": ("qwen3", "14B", "qwen3_14b"),
    "qwen3-32b": ("qwen3", "32B", "qwen3_32b"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3_30b_a3b"),
    "gpt-oss-20b": ("gpt_oss", "20b", "gpt_oss_20b"),
    "gpt-oss-120b": ("gpt_oss", "120b", "gpt_oss_120b"),
}
#: the shipped functions whose model spec is not the plan's flavor (it is rebuilt with ``model_registry``)
_SWAPPED = {"llama-3.1-405b"}


def check_model(name: str, option: str | None = None) -> tuple[str, str, str]:
    """(family, flavor, shipped function) of a model torchtitan 0.3 ships a configuration of; refused otherwise
    (``option``: the CLI option that asked, for the message)."""
    key = name.lower()
    if key not in MODELS:
        shipped = ", ".join(sorted(MODELS))
        err = unsupported(LAUNCHER, f"model '{name}' (torchtitan 0.3 ships configurations of: {shipped})",
                          "plan one of those models, or export to megatron / deepspeed")
        raise err if option is None else PlannerError(err.reason, source=option, fix=err.fix)
    return MODELS[key]


def _model(view: PlanView) -> tuple[str, str, str]:
    return check_model(view.model_name)


def _activation_checkpoint(view: PlanView) -> str:
    """The ``activation_checkpoint`` expression: None, ``SelectiveAC.Config()`` or ``FullAC.Config()``."""
    cfg = view.cfg
    if cfg.recompute == "none":
        return "None"
    if cfg.recompute == "selective":
        return "SelectiveAC.Config()"
    if recompute_counts(view) != view.layers_per_stage:
        raise unsupported(LAUNCHER, f"full recomputation of {list(recompute_counts(view))} of the layers "
                                    f"{list(view.layers_per_stage)} (torchtitan 0.3 checkpoints all layers, by op "
                                    "policy or to a memory budget)",
                          "plan with recompute full on every layer, selective or none, or export to megatron")
    return "FullAC.Config()"


def parallelism(view: PlanView) -> dict[str, Any]:
    """The ``ParallelismConfig`` fields the plan sets (after the refusals of the module docstring)."""
    cfg = view.cfg
    refuse_megatron_core_only(LAUNCHER, cfg)
    schedule = check_runs(cfg, LAUNCHER)
    if cfg.precision == "fp16":
        raise unsupported(LAUNCHER, "fp16 mixed precision (torchtitan trains in bf16 with fp32 reductions)",
                          "plan with --precision bf16 or export to megatron")
    par: dict[str, Any] = data_parallel_degrees(cfg)
    par["tensor_parallel_degree"] = cfg.tp
    par["enable_sequence_parallel"] = bool(cfg.sequence_parallel) if cfg.tp > 1 else True
    par["context_parallel_degree"] = cfg.cp
    if view.is_moe:
        if cfg.ep > 1 and cfg.zero_stage == 0:
            raise unsupported(LAUNCHER, f"ep={cfg.ep} without FSDP (EP borrows its ranks from FSDP and TP)",
                              "plan with ZeRO >= 1")
        if cfg.ep > 1 and cfg.tp > 1 and cfg.expert_tp != 1:
            raise unsupported(LAUNCHER, f"expert TP {cfg.expert_tp} with EP {cfg.ep} (torchtitan 0.3 has no expert "
                                        "TP: experts are whole on their EP rank)", "plan with --etp 1")
        if (cfg.zero_shard_dp * cfg.cp * cfg.tp) % cfg.ep:
            raise unsupported(LAUNCHER, f"ep={cfg.ep} must divide dp_shard*cp*tp = "
                                        f"{cfg.zero_shard_dp * cfg.cp * cfg.tp}",
                              "plan with an EP degree that divides it")
        par["expert_parallel_degree"] = cfg.ep
    par["pipeline_parallel_degree"] = cfg.pp
    if cfg.pp > 1:
        par["pipeline_parallel_schedule"] = schedule
        par["pipeline_parallel_microbatch_size"] = cfg.micro_batch_size
        par["module_fqns_per_model_part"] = stage_modules(view.layers_per_stage, head="lm_head")
    return par


def _py(v: Any, indent: str) -> str:
    if isinstance(v, list) and v and isinstance(v[0], list):
        inner = "".join(f"{indent}    {row!r},\n" for row in v)
        return "[\n" + inner + indent + "]"
    return repr(v)


def render(plan: Any, source: str = "<plan>") -> str:
    view = read_plan(plan, source)
    cfg = view.cfg
    family, flavor, base = _model(view)
    par = parallelism(view)
    ac = _activation_checkpoint(view)
    async_tp = cfg.tp_comm_overlap and cfg.tp > 1
    swapped = view.model_name.lower() in _SWAPPED
    converters, imports = "", []
    if cfg.precision in ("fp8", "mxfp8"):
        conv = "Float8LinearConverter" if cfg.precision == "fp8" else "MXFP8LinearConverter"
        imports.append(f"from torchtitan.components.quantization import {conv}")
        # torchao's converters; the LM head stays bf16, as the cost model keeps it; MXFP8 needs torch.compile
        converters = (f"{conv}.Config(filter_fqns=['lm_head'], model_compile_enabled=True)" if cfg.precision == "fp8"
                      else f"{conv}.Config(model_compile_enabled=True)")
    compile_on = async_tp or bool(converters)
    imports.append("from torchtitan.config import " + ("CompileConfig, " if compile_on else "") + "ParallelismConfig")
    if ac != "None":
        imports.append(f"from torchtitan.distributed.activation_checkpoint import {ac.split('.')[0]}")
    if converters or swapped:
        imports.append(f"from torchtitan.models.{family} import model_registry")
    imports.append(f"from torchtitan.models.{family}.config_registry import {base}")
    local = cfg.micro_batch_size * (cfg.num_microbatches // cfg.pipeline_flushes if cfg.pp > 1 else 1)
    lines = ['"""torchtitan 0.3 configuration generated by planner.',
             *summary_comment(view),
             f"Run: python -m torchtitan.train --module <this module> --config {FUNCTION} "
             f"(on {cfg.num_gpus} GPUs)", '"""', "", *imports, "", "",
             f"def {FUNCTION}():",
             f"    config = {base}()"]
    if converters or swapped:
        lines.append(f"    config.model_spec = model_registry({flavor!r}" +
                     (f", converters=[{converters}])" if converters else ")"))
    lines += [f"    config.training.local_batch_size = {local}",
              f"    config.training.global_batch_size = {cfg.global_batch_size}",
              f"    config.training.seq_len = {cfg.seq_len}"]
    if cfg.pp > 1 or cfg.ep > 1:
        # torchtitan 0.3's Trainer.Config refuses CUDA graphs with pipeline parallelism, and with the all-to-all
        # token dispatcher (its CPU synchronization) under expert parallelism; the estimate assumes none
        lines.append("    config.training.disable_cuda_graphs = True")
    lines += ["    config.parallelism = ParallelismConfig("]
    lines += [f"        {k}={_py(v, '        ')}," for k, v in par.items()]
    lines += ["    )", f"    config.activation_checkpoint = {ac}"]
    if compile_on:
        lines.append(f"    config.compile = CompileConfig(enable=True, enable_async_tensor_parallel={async_tp})")
    lines += ["    return config", ""]
    return "\n".join(lines)


def notes(plan: Any, source: str = "<plan>") -> list[str]:
    view = read_plan(plan, source)
    cfg = view.cfg
    out = [f"save as a module on PYTHONPATH and run python -m torchtitan.train --module <module> --config {FUNCTION}; "
           "dataset, tokenizer (hf_assets_path), optimizer and steps are those of torchtitan's shipped configuration"]
    if cfg.zero_stage in (1, 2) and cfg.dp > 1:
        out.append(f"ZeRO-{cfg.zero_stage} maps to FSDP2 with fsdp_reshard_after_forward = \"never\"")
    if cfg.recompute == "selective":
        out.append(op_sac_note(cfg, "op_sac") + " (SelectiveAC)")
    if cfg.precision in ("fp8", "mxfp8"):
        out.append("fp8 / mxfp8 need torchao and a GPU that has them (the converter checks at model build)")
    return out
