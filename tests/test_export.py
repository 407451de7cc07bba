"""Launcher exports: each parses, holds the plan's numbers, uses the launchers' documented names, and refuses what a
launcher cannot run."""

from __future__ import annotations

import ast
import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.schedule import SCHEDULES
from planner.cost.step import estimate
from planner.errors import PlannerError
from planner.export import TARGETS, emit, export
from planner.export import deepspeed, megatron, nemo, torchtitan
from planner.plan import Plan, dumps, plan_dict
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model

runner = CliRunner()

# Names as documented by each launcher (Megatron-LM arguments.py, torchtitan job config, DeepSpeed config JSON,
# NeMo 2.0 MegatronStrategy / Megatron Core configs); an export may use no other key.
MEGATRON_FLAGS = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size", "--cp-comm-type",
    "--sequence-parallel", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout", "--micro-batch-size",
    "--global-batch-size", "--seq-length", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--overlap-grad-reduce",
    "--overlap-param-gather", "--tp-comm-overlap", "--accumulate-allreduce-grads-in-fp32", "--num-layers",
    "--num-distributed-optimizer-instances", "--attention-backend", "--no-overlap-p2p-communication", "--window-size",
    "--moe-router-pre-softmax", "--no-rope-freq",
    "--window-attn-skip-freq",
    "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention", "--num-query-groups",
    "--kv-channels", "--max-position-embeddings", "--untie-embeddings-and-output-weights", "--swiglu",
    "--normalization", "--position-embedding-type", "--disable-bias-linear", "--attention-dropout", "--hidden-dropout",
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
    "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--moe-grouped-gemm",
    "--moe-layer-freq", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--bf16", "--fp16",
    "--fp8-format", "--fp8-recipe", "--grad-reduce-in-bf16", "--ckpt-format", "--cross-entropy-loss-fusion",
    "--cpu-offloading-num-layers", "--use-precision-aware-optimizer", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    # ModelParallelConfig / TransformerConfig fields arguments.py turns into flags (ArgumentGroupFactory): hybrid CP
    "--hybrid-context-parallel", "--max-seqlen-per-dp-cp-rank", "--calculate-per-token-loss", "--dataloader-type",
}
TORCHTITAN_KEYS = {
    "training": {"local_batch_size", "global_batch_size", "seq_len"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "enable_async_tensor_parallel", "context_parallel_degree",
                    "context_parallel_rotate_method", "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "module_fqns_per_model_part", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "pipeline_parallel_expert_parallel_overlap"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}
TORCH_SCHEDULES = {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
                   "DualPipeV"}
DEEPSPEED_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16",
                  "communication_data_type", "zero_optimization"}
NEMO_STRATEGY_KWARGS = {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                        "virtual_pipeline_model_parallel_size", "context_parallel_size", "sequence_parallel",
                        "expert_model_parallel_size", "expert_tensor_parallel_size", "ddp"}
NEMO_DDP_KWARGS = {"use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather", "grad_reduce_in_fp32"}


def make_plan(model: str, cluster: str, **cfg) -> dict:
    spec, hw = load_model(model), load_cluster(cluster)
    config = RunConfig(**cfg)
    return json.loads(dumps(plan_dict(spec, hw.name, config, estimate(spec, hw, config))))


@pytest.fixture(scope="module")
def gpt3() -> dict:
    """GPT-3 175B as Narayanan et al. 2021 ran it: 1536 A100s, TP 8, PP 12, interleaved (2 chunks), batch 1536."""
    return make_plan("gpt3-175b", "a100-80gb-sxm", num_gpus=1536, tp=8, pp=12, vpp=2, schedule="interleaved-1f1b",
                     global_batch_size=1536, micro_batch_size=1, seq_len=2048)


@pytest.fixture(scope="module")
def llama405() -> dict:
    """Llama 3.1 405B as Meta ran it: 16384 H100s, TP 8, PP 16, DP 128, 8K context, 2048 x 8192 tokens per step;
    126 layers over 16 stages -> 7 on the first and last stage, 8 elsewhere."""
    return make_plan("llama-3.1-405b", "h100-80gb-sxm", num_gpus=16384, tp=8, pp=16, global_batch_size=2048,
                     micro_batch_size=1, seq_len=8192, recompute="full", recompute_num_layers=2)


def pairs(args: list[str]) -> dict[str, str | None]:
    """Flag -> value (None for a bare flag)."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[a] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def config_only_plan(model: str = "llama-3.1-70b", **cfg) -> dict:
    """A plan dict without an estimate (exporters only read the configuration)."""
    from planner.plan import config_fields
    from dataclasses import asdict
    spec = load_model(model)
    config = RunConfig(**cfg)
    d = {"schema_version": "1.0", "model": spec.name, "cluster": "h100-80gb-sxm", **config_fields(spec, config),
         "model_spec": asdict(spec)}
    return json.loads(json.dumps(d))


def check_torchtitan03(plan: dict) -> dict:
    """The ``ParallelismConfig`` keywords of a torchtitan-0.3 export (parsed from its source; torchtitan 0.3 itself
    reads it in conformance_tt03/), checked against the plan's degrees and layers."""
    tree = ast.parse(emit(plan, "torchtitan-0.3"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ParallelismConfig"]
    par = {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords}
    p = plan["parallelism"]
    assert (par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"], par["tensor_parallel_degree"],
            par["context_parallel_degree"], par["pipeline_parallel_degree"]) == (p["dp"], p["tp"], p["cp"], p["pp"])
    if p["pp"] > 1:
        named = [m for part in par["module_fqns_per_model_part"] for m in part if m.startswith("layers.")]
        assert len(named) == len(set(named)) == sum(plan["layers_per_stage"])
    return par


# ----- Megatron-LM --------------------------------------------------------------------------------------------
def test_megatron_gpt3_arguments(gpt3):
    text = emit(gpt3, "megatron")
    args = megatron.parse_rendered(text)
    assert args == megatron.arguments(gpt3)
    kv = pairs(args)
    assert set(kv) <= MEGATRON_FLAGS, set(kv) - MEGATRON_FLAGS
    assert kv["--tensor-model-parallel-size"] == "8"
    assert kv["--pipeline-model-parallel-size"] == "12"
    assert kv["--context-parallel-size"] == "1"
    assert kv["--num-layers-per-virtual-pipeline-stage"] == str(96 // (12 * 2))
    assert kv["--micro-batch-size"] == "1" and kv["--global-batch-size"] == "1536"
    assert kv["--seq-length"] == "2048"
    assert kv["--recompute-granularity"] == "selective"
    assert "--sequence-parallel" in kv and "--use-distributed-optimizer" in kv and "--overlap-grad-reduce" in kv
    assert kv["--num-layers"] == "96" and kv["--hidden-size"] == "12288" and kv["--num-attention-heads"] == "96"
    # GPT-3: tied embeddings, GELU, LayerNorm, learned positions, biases: none of the Llama flags
    assert not {"--untie-embeddings-and-output-weights", "--swiglu", "--disable-bias-linear"} & set(kv)


def test_megatron_llama405_arguments(llama405):
    kv = pairs(megatron.arguments(llama405))
    assert set(kv) <= MEGATRON_FLAGS
    assert kv["--tensor-model-parallel-size"] == "8" and kv["--pipeline-model-parallel-size"] == "16"
    first, last = int(kv["--decoder-first-pipeline-num-layers"]), int(kv["--decoder-last-pipeline-num-layers"])
    assert (first, last) == (7, 7)
    assert (126 - first - last) % (16 - 2) == 0  # Megatron splits the rest evenly
    assert kv["--recompute-granularity"] == "full" and kv["--recompute-method"] == "block"
    assert kv["--recompute-num-layers"] == "2"
    assert kv["--num-query-groups"] == "8" and "--group-query-attention" in kv
    assert kv["--seq-length"] == "8192" and kv["--global-batch-size"] == "2048"
    assert "--swiglu" in kv and kv["--normalization"] == "RMSNorm" and "--untie-embeddings-and-output-weights" in kv
    assert "--num-layers-per-virtual-pipeline-stage" not in kv


@pytest.mark.parametrize("kernel, flash, backend", [("cudnn", True, "fused"), ("flash-attention-2", True, "flash"),
                                                   ("flash-attention-3", True, "flash"), ("", True, None),
                                                   ("cudnn", False, "unfused")])
def test_megatron_and_nemo_pin_the_attention_backend_the_plan_was_costed_with(kernel, flash, backend):
    """--attention-backend (Megatron-Core's AttnBackend: fused = Transformer Engine's cuDNN FusedAttention, flash =
    the flash-attn package, unfused) as the stack or --attention-kernel named the kernel; none (Megatron's auto)
    when the plan names no kernel; NeMo / Megatron-Bridge get the same name as model.attention_backend."""
    plan = config_only_plan("llama-3.1-8b", num_gpus=8, global_batch_size=64, seq_len=8192, attention_kernel=kernel,
                            flash_attention=flash)
    kv = pairs(megatron.arguments(plan))
    assert set(kv) <= MEGATRON_FLAGS
    assert kv.get("--attention-backend") == backend
    assert nemo.overrides(plan).get("model.attention_backend") == backend
    assert any("flash-attn" in n for n in megatron.notes(plan)) == kernel.startswith("flash-attention")


def test_megatron_full_recompute_of_every_layer_is_uniform():
    plan = config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, recompute="full")
    kv = pairs(megatron.arguments(plan))
    assert (kv["--recompute-method"], kv["--recompute-num-layers"]) == ("uniform", "1")


def test_megatron_irregular_split_uses_layout():
    plan = config_only_plan(num_gpus=32, tp=8, pp=4, global_batch_size=32, layers_per_stage=(18, 22, 20, 20))
    kv = pairs(megatron.arguments(plan))
    layout = kv["--pipeline-model-parallel-layout"]
    assert layout == "Et*18|t*22|t*20|t*20L"
    assert sum(int(p.strip("EL").split("*")[1]) for p in layout.split("|")) == 80


def test_megatron_first_last_split_and_cp():
    plan = config_only_plan(num_gpus=64, tp=4, pp=4, cp=2, global_batch_size=32, seq_len=32768,
                            layers_per_stage=(18, 22, 22, 18), zero_stage=0)
    kv = pairs(megatron.arguments(plan))
    assert kv["--decoder-first-pipeline-num-layers"] == "18" and kv["--decoder-last-pipeline-num-layers"] == "18"
    assert kv["--context-parallel-size"] == "2" and kv["--cp-comm-type"] == "p2p"
    assert "--use-distributed-optimizer" not in kv and "--overlap-param-gather" not in kv


@pytest.mark.parametrize("schedule,vpp", [("gpipe", 1), ("zb-h1", 1), ("zb-h2", 1), ("bfs", 2)])
def test_megatron_refuses_schedules_it_lacks(schedule, vpp):
    assert schedule in SCHEDULES
    plan = config_only_plan(num_gpus=64, tp=8, pp=4, vpp=vpp, global_batch_size=64, schedule=schedule)
    for target in ("megatron", "nemo"):
        with pytest.raises(PlannerError, match=schedule):
            emit(plan, target)


def test_megatron_zero3_with_pp_refused_without_pp_fsdp():
    with pytest.raises(PlannerError, match="ZeRO-3 with pipeline"):
        emit(config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, zero_stage=3), "megatron")
    kv = pairs(megatron.arguments(config_only_plan(num_gpus=64, tp=8, global_batch_size=64, zero_stage=3)))
    assert "--use-megatron-fsdp" in kv and kv["--data-parallel-sharding-strategy"] == "optim_grads_params"
    # Megatron-LM's validate_args: "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format"
    assert kv["--ckpt-format"] == "fsdp_dtensor"
    assert "--use-distributed-optimizer" not in kv


def test_megatron_moe_plan_sets_expert_parallelism():
    plan = config_only_plan("mixtral-8x7b", num_gpus=64, tp=2, pp=1, ep=8, global_batch_size=64)
    kv = pairs(megatron.arguments(plan))
    assert kv["--expert-model-parallel-size"] == "8" and kv["--expert-tensor-parallel-size"] == "2"
    assert kv["--num-experts"] == "8" and kv["--moe-router-topk"] == "2"


def test_every_schedule_has_a_decision_in_every_exporter():
    """A new schedule must get an explicit mapping (or refusal) in the exporters, never fall through silently."""
    assert set(SCHEDULES) <= set(megatron.SCHEDULE_SUPPORT)
    assert set(SCHEDULES) <= set(torchtitan.SCHEDULE_NAMES)
    assert set(v for v in torchtitan.SCHEDULE_NAMES.values() if v) <= TORCH_SCHEDULES


# ----- torchtitan ---------------------------------------------------------------------------------------------
def check_torchtitan(plan: dict) -> dict:
    doc = tomllib.loads(emit(plan, "torchtitan"))
    for section, keys in doc.items():
        assert set(keys) <= TORCHTITAN_KEYS[section], set(keys) - TORCHTITAN_KEYS[section]
    par, tr = doc["parallelism"], doc["training"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    world = dp * par["tensor_parallel_degree"] * par["context_parallel_degree"] * par["pipeline_parallel_degree"]
    assert world == plan["num_gpus"]
    assert dp == plan["parallelism"]["dp"]
    # torchtitan accumulates global / (local x dp) local batches; the pipeline splits a local batch into micro-batches
    accumulation = tr["global_batch_size"] // (tr["local_batch_size"] * dp)
    assert tr["global_batch_size"] == accumulation * tr["local_batch_size"] * dp
    micro = par.get("pipeline_parallel_microbatch_size", tr["local_batch_size"])
    assert accumulation * tr["local_batch_size"] // micro == plan["batch"]["num_microbatches"]
    assert micro == plan["batch"]["micro_batch_size"]
    if par["pipeline_parallel_degree"] > 1:
        parts = par["module_fqns_per_model_part"]
        assert [sum(n.startswith("layers.") for n in p) for p in parts] == plan["layers_per_stage"]
        flat = [n for p in parts for n in p if n.startswith("layers.")]
        assert flat == [f"layers.{i}" for i in range(sum(plan["layers_per_stage"]))]
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
        assert par["pipeline_parallel_schedule"] in TORCH_SCHEDULES
    return doc


def test_torchtitan_gpt3(gpt3):
    doc = check_torchtitan(gpt3)
    par = doc["parallelism"]
    assert par["tensor_parallel_degree"] == 8 and par["pipeline_parallel_degree"] == 12
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert len(par["module_fqns_per_model_part"]) == 24
    assert par["data_parallel_shard_degree"] == 16 and par["fsdp_reshard_after_forward"] == "never"
    assert doc["training"] == {"global_batch_size": 1536, "seq_len": 2048, "local_batch_size": 96}
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_torchtitan_llama405_full_recompute(llama405):
    plan = dict(llama405, recompute={"mode": "full", "num_layers": None})
    doc = check_torchtitan(plan)
    assert doc["activation_checkpoint"] == {"mode": "full"}
    assert doc["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    assert [len(p) for p in doc["parallelism"]["module_fqns_per_model_part"]][:2] == [8, 8]  # embedding + 7 layers
    # recomputing 2 of 7 or 8 layers per stage is not "every N-th layer": refused, not approximated
    with pytest.raises(PlannerError, match="every N-th layer"):
        emit(llama405, "torchtitan")


def test_torchtitan_partial_recompute_as_every_nth_layer():
    plan = config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, recompute="full", recompute_num_layers=10)
    doc = check_torchtitan(plan)  # 40 layers per stage, 10 recomputed: every 4th layer
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "4"}


def test_torchtitan_zero_stages_and_cp():
    doc = check_torchtitan(config_only_plan(num_gpus=64, tp=8, global_batch_size=64, zero_stage=0))
    assert doc["parallelism"]["data_parallel_replicate_degree"] == 8
    assert doc["parallelism"]["data_parallel_shard_degree"] == 1
    doc = check_torchtitan(config_only_plan(num_gpus=64, tp=8, cp=2, seq_len=16384, global_batch_size=64,
                                            zero_stage=3))
    assert doc["parallelism"]["fsdp_reshard_after_forward"] == "always"
    assert doc["parallelism"]["context_parallel_degree"] == 2
    with pytest.raises(PlannerError, match="ulysses"):
        emit(config_only_plan(num_gpus=64, tp=4, cp=2, seq_len=16384, global_batch_size=64, cp_kind="ulysses"),
             "torchtitan")


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_torchtitan_schedule_names(name):
    vpp = 2 if getattr(SCHEDULES[name], "supports_vpp", False) else 1
    plan = config_only_plan(num_gpus=32, tp=8, pp=4, vpp=vpp, global_batch_size=64, schedule=name)
    expected = torchtitan.SCHEDULE_NAMES[name]
    if expected is None:
        with pytest.raises(PlannerError, match=name):
            emit(plan, "torchtitan")
    else:
        assert check_torchtitan(plan)["parallelism"]["pipeline_parallel_schedule"] == expected


# ----- DeepSpeed ----------------------------------------------------------------------------------------------
def test_deepspeed_llama405(llama405):
    ds = json.loads(emit(llama405, "deepspeed"))
    assert set(ds) <= DEEPSPEED_KEYS
    dp = llama405["parallelism"]["dp"]
    assert ds["train_batch_size"] == 2048
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * dp
    assert ds["gradient_accumulation_steps"] == llama405["batch"]["num_microbatches"] == 16
    assert ds["zero_optimization"]["stage"] == 1 and ds["bf16"] == {"enabled": True}
    notes = export(llama405, "deepspeed").notes
    assert any("--tensor-model-parallel-size 8" in n and "--pipeline-model-parallel-size 16" in n for n in notes)


def test_deepspeed_refusals(gpt3):
    with pytest.raises(PlannerError, match="1F1B"):
        emit(gpt3, "deepspeed")  # interleaved: the pipeline engine has no virtual stages
    with pytest.raises(PlannerError, match="ZeRO-3 with pipeline"):
        emit(config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, zero_stage=3), "deepspeed")
    ds = json.loads(emit(config_only_plan(num_gpus=64, tp=8, global_batch_size=64, zero_stage=3), "deepspeed"))
    assert ds["zero_optimization"]["stage"] == 3


# ----- NeMo: Megatron-Bridge overrides ------------------------------------------------------------------------
#: ConfigContainer paths an export may set (megatron/bridge/training/config.py and Megatron Core's TransformerConfig)
BRIDGE_PATHS = {
    "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size", "model.context_parallel_size", "model.sequence_parallel",
    "model.expert_model_parallel_size", "model.expert_tensor_parallel_size", "model.cp_comm_type",
    "model.moe_token_dispatcher_type", "model.moe_grouped_gemm",
    "model.pipeline_model_parallel_layout", "model.seq_length", "dataset.seq_length", "train.micro_batch_size",
    "train.global_batch_size", "model.recompute_granularity", "model.recompute_modules", "model.recompute_method",
    "model.recompute_num_layers", "ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer",
    "ddp.overlap_grad_reduce", "ddp.overlap_param_gather", "ddp.grad_reduce_in_fp32", "ddp.use_megatron_fsdp",
    "ddp.num_distributed_optimizer_instances",
    "ddp.data_parallel_sharding_strategy", "checkpoint.ckpt_format", "mixed_precision",
    "model.cross_entropy_loss_fusion", "model.cpu_offloading", "model.cpu_offloading_num_layers",
    # megatron.core.optimizer.OptimizerConfig, as Megatron-Bridge's perf_recipes/deepseek/common.py sets it
    "optimizer.use_precision_aware_optimizer",
    # TransformerConfig.activation_func_fp8_input_store (megatron/core/transformer/transformer_config.py)
    "model.activation_func_fp8_input_store"}
#: Megatron-Bridge mixed-precision presets the export may name (megatron/bridge/training/mixed_precision.py)
BRIDGE_PRECISIONS = {"bf16_mixed", "fp16_mixed", "bf16_with_fp8_delayed_scaling_mixed", "bf16_with_mxfp8_mixed"}
BRIDGE_OVERLAP = {"tp_comm_overlap", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute"}


def nemo_parts(text: str) -> tuple[dict, dict, dict, dict]:
    """(PLAN_OVERRIDES, COMM_OVERLAP, ENVIRONMENT, namespace with apply_plan) of the snippet, run without
    Megatron-Bridge (apply_plan's import is stubbed)."""
    import sys
    import types

    ns: dict = {}
    exec(compile(text, "<nemo>", "exec"), ns)
    stub = types.ModuleType("megatron.bridge.training.comm_overlap")
    stub.CommOverlapConfig = lambda **kw: SimpleNamespace(**kw)
    names = ["megatron", "megatron.bridge", "megatron.bridge.training", "megatron.bridge.training.comm_overlap"]
    saved = {n: sys.modules.get(n) for n in names}
    for n in names[:-1]:
        sys.modules.setdefault(n, types.ModuleType(n))
    sys.modules[names[-1]] = stub
    ns["_restore"] = lambda: [sys.modules.pop(n, None) if saved[n] is None else sys.modules.__setitem__(n, saved[n])
                              for n in names]
    over, overlap, env = ns["PLAN_OVERRIDES"], ns["COMM_OVERLAP"], ns["ENVIRONMENT"]
    assert set(over) <= BRIDGE_PATHS and set(overlap) <= BRIDGE_OVERLAP
    assert over["mixed_precision"] in BRIDGE_PRECISIONS
    return over, overlap, env, ns


def fake_config() -> SimpleNamespace:
    ns = SimpleNamespace
    return ns(model=ns(), train=ns(), dataset=ns(), ddp=ns(), optimizer=ns(), checkpoint=ns(), mixed_precision=None,
              comm_overlap=None)


def test_nemo_gpt3(gpt3, monkeypatch):
    over, overlap, env, ns = nemo_parts(emit(gpt3, "nemo"))
    assert over["model.tensor_model_parallel_size"] == 8 and over["model.pipeline_model_parallel_size"] == 12
    assert over["model.virtual_pipeline_model_parallel_size"] == 2 and over["model.sequence_parallel"] is True
    assert over["ddp.use_distributed_optimizer"] is True and over["optimizer.use_distributed_optimizer"] is True
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    try:
        cfg = ns["apply_plan"](fake_config())
    finally:
        ns["_restore"]()
    assert cfg.model.pipeline_model_parallel_size == 12 and cfg.train.global_batch_size == 1536
    assert cfg.train.micro_batch_size == 1 and cfg.model.recompute_granularity == "selective"
    assert cfg.dataset.seq_length == 2048 and cfg.mixed_precision == "bf16_mixed"
    assert cfg.comm_overlap.tp_comm_overlap is False  # the 2022 plan has no TP overlap
    import os
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_nemo_llama405_writes_the_uneven_split_as_a_layout(llama405):
    over, _, _, _ = nemo_parts(emit(llama405, "nemo"))
    assert over["model.pipeline_model_parallel_size"] == 16 and over["model.virtual_pipeline_model_parallel_size"] \
        is None
    layout = over["model.pipeline_model_parallel_layout"]
    assert layout.split("|")[0] == "Et*7" and layout.split("|")[-1] == "t*7L" and len(layout.split("|")) == 16
    assert (over["model.recompute_method"], over["model.recompute_num_layers"]) == ("block", 2)


def test_nemo_runs_zero3_through_megatron_fsdp_and_deepseek_v3_uneven_chunks():
    over, _, env, _ = nemo_parts(emit(config_only_plan(num_gpus=64, tp=8, global_batch_size=64, zero_stage=3),
                                      "nemo"))
    assert over["ddp.use_megatron_fsdp"] is True and over["ddp.data_parallel_sharding_strategy"] == \
        "optim_grads_params" and over["checkpoint.ckpt_format"] == "fsdp_dtensor"
    assert env == {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    with pytest.raises(PlannerError, match="nemo cannot run this plan: ZeRO-3 with pipeline"):
        emit(config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, zero_stage=3), "nemo")
    # 61 layers over PP 16 x VPP 2, as Megatron-Bridge's own DeepSeek-V3 recipe splits them with a layout
    dsv3 = config_only_plan("deepseek-v3", num_gpus=2048, pp=16, vpp=2, ep=64, global_batch_size=4096,
                            seq_len=4096)
    over, _, _, _ = nemo_parts(emit(dsv3, "nemo"))
    assert len(over["model.pipeline_model_parallel_layout"].split("|")) == 32


# ----- API and CLI --------------------------------------------------------------------------------------------
def test_emit_accepts_a_plan_object():
    spec, hw = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    cfg = RunConfig(num_gpus=16, tp=2, pp=2, global_batch_size=32, micro_batch_size=2, seq_len=4096)
    plan = Plan(spec, hw.name, cfg, estimate(spec, hw, cfg))
    for target in TARGETS:
        assert emit(plan, target) == emit(json.loads(plan.to_json()), target)
    with pytest.raises(PlannerError, match="unknown launcher"):
        emit(plan, "slurm")


def test_cli_export_writes_file_and_notes(gpt3, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(gpt3))
    out = tmp_path / "job.toml"
    res = runner.invoke(app, ["export", str(path), "--to", "torchtitan", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert tomllib.loads(out.read_text())["parallelism"]["pipeline_parallel_degree"] == 12
    assert "note:" in res.stderr
    res = runner.invoke(app, ["export", str(path), "--to", "megatron"])
    assert res.exit_code == 0 and "--tensor-model-parallel-size 8" in res.stdout


def test_cli_export_errors(gpt3, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(gpt3))
    res = runner.invoke(app, ["export", str(path), "--to", "deepspeed"])
    assert res.exit_code == 2 and "deepspeed cannot run this plan" in res.stderr
    res = runner.invoke(app, ["export", str(path), "--to", "slurm"])
    assert res.exit_code == 2 and "unknown launcher" in res.stderr
    res = runner.invoke(app, ["export", str(tmp_path / "missing.json"), "--to", "megatron"])
    assert res.exit_code == 2 and "file not found" in res.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "x"}')
    res = runner.invoke(app, ["export", str(bad), "--to", "megatron"])
    assert res.exit_code == 2 and "does not match the plan schema" in res.stderr


def test_plan_command_emits_the_searched_plan(tmp_path):
    """``planner plan ... --emit X --out F --json``: F is the export of exactly the plan printed as JSON."""
    base = ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16", "--global-batch", "64",
            "--seq-len", "4096", "--top", "0"]
    for target, suffix in (("torchtitan", "toml"), ("deepspeed", "json"), ("megatron", "sh")):
        out = tmp_path / f"job.{suffix}"
        res = runner.invoke(app, base + ["--emit", target, "--out", str(out), "--json"])
        assert res.exit_code == 0, res.output
        plan = json.loads(res.stdout)
        assert out.read_text() == emit(plan, target)
        if target == "torchtitan":
            check_torchtitan(plan)
        if target == "deepspeed":
            ds = json.loads(out.read_text())
            assert ds["train_batch_size"] == 64
            assert ds["gradient_accumulation_steps"] == plan["batch"]["num_microbatches"]
    res = runner.invoke(app, base + ["--emit", "slurm"])
    assert res.exit_code == 2 and "unknown launcher" in res.stderr


# ----- searching only what a launcher runs -------------------------------------------------------------------
SEARCHED = {"gpt3-175b": ("a100-80gb-sxm", 1536, 1536, 2048), "llama-3.1-405b": ("h100-80gb-sxm", 16384, 2048, 8192)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("model", sorted(SEARCHED))
def test_searched_plans_export_for_every_launcher(model, target):
    """The acceptance models, planned by the search for each launcher: the export is accepted and holds the plan."""
    from planner.export import plan_for_launcher
    from planner.export.torchtitan03 import MODELS
    cluster, gpus, batch, seq = SEARCHED[model]
    if target == "torchtitan-0.3" and model not in MODELS:  # torchtitan 0.3 ships no configuration of it
        with pytest.raises(PlannerError, match="ships configurations"):  # refused before any search
            plan_for_launcher(load_model(model), load_cluster(cluster), gpus, batch, seq, target)
        return
    plan = json.loads(plan_for_launcher(load_model(model), load_cluster(cluster), gpus, batch, seq, target).to_json())
    assert plan["num_gpus"] == gpus and plan["batch"]["global_batch_size"] == batch
    par = plan["parallelism"]
    if target in ("megatron", "nemo"):
        assert plan["schedule"] in ("1f1b", "interleaved-1f1b") or par["pp"] == 1
    if target == "megatron":
        kv = pairs(megatron.arguments(plan))
        assert set(kv) <= MEGATRON_FLAGS
        assert kv["--tensor-model-parallel-size"] == str(par["tp"])
        assert kv["--pipeline-model-parallel-size"] == str(par["pp"])
        assert kv["--context-parallel-size"] == str(par["cp"])
        assert kv["--global-batch-size"] == str(batch) and kv["--seq-length"] == str(seq)
    elif target == "torchtitan":
        check_torchtitan(plan)
    elif target == "torchtitan-0.3":
        check_torchtitan03(plan)
    elif target == "deepspeed":
        ds = json.loads(emit(plan, "deepspeed"))
        assert set(ds) <= DEEPSPEED_KEYS
        assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * \
            par["dp"] == batch
        assert ds["zero_optimization"]["stage"] == par["zero_stage"]
        assert par["pp"] == 1 or par["zero_stage"] <= 1
    else:
        over, _, _, _ = nemo_parts(emit(plan, "nemo"))
        assert over["model.tensor_model_parallel_size"] == par["tp"]
        assert over["model.pipeline_model_parallel_size"] == par["pp"]
        assert over["model.context_parallel_size"] == par["cp"] and over["train.global_batch_size"] == batch


def test_launcher_restriction_never_beats_the_full_search():
    from planner.export import plan_for_launcher
    from planner.search import search_plans
    args = (load_model("llama-3.1-405b"), load_cluster("h100-80gb-sxm"), 16384, 2048, 8192)
    best = search_plans(*args, top_k=0).estimate.step_time_s
    for target in TARGETS:
        assert plan_for_launcher(*args, target).estimate.step_time_s >= best * (1 - 1e-9)
    with pytest.raises(PlannerError, match="unknown launcher"):
        plan_for_launcher(*args, "slurm")


# ----- any valid configuration: a faithful export or a PlannerError, never anything else --------------------
from hypothesis import HealthCheck, event, given, settings, strategies as st  # noqa: E402

from planner.cost.validity import config_problems  # noqa: E402

_MODELS = {name: load_model(name) for name in ("llama-3.1-8b", "gpt3-175b", "mixtral-8x7b")}
_CLUSTER = load_cluster("h100-80gb-sxm")


@st.composite
def valid_configs(draw):
    name = draw(st.sampled_from(sorted(_MODELS)))
    model = _MODELS[name]
    tp, pp, cp = draw(st.sampled_from([1, 2, 8])), draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([1, 2])) if model.is_moe else 1
    schedule = draw(st.sampled_from(sorted(SCHEDULES)))
    vpp = 2 if getattr(SCHEDULES[schedule], "supports_vpp", False) else 1
    mb = draw(st.sampled_from([1, 2]))
    layers = None
    if draw(st.booleans()) and pp * vpp > 1:  # an uneven split: move one layer from the last stage to the first
        even = [model.num_layers // (pp * vpp)] * (pp * vpp)
        even[-1] += model.num_layers - sum(even)
        even[0], even[-1] = even[0] + 1, even[-1] - 1
        layers = tuple(even)
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    cfg = RunConfig(num_gpus=tp * pp * cp * dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, schedule=schedule,
                    global_batch_size=dp * mb * draw(st.sampled_from([4, 8, 16])), micro_batch_size=mb,
                    seq_len=4096, cp_kind=draw(st.sampled_from(["ring", "ulysses"])), recompute=recompute,
                    recompute_num_layers=draw(st.sampled_from([None, 1, 2])) if recompute == "full" else None,
                    zero_stage=draw(st.sampled_from([0, 1, 2, 3])), sequence_parallel=tp > 1 and draw(st.booleans()),
                    layers_per_stage=layers, tp_comm_overlap=draw(st.booleans()))
    from hypothesis import assume
    assume(not config_problems(model, _CLUSTER, cfg))
    return config_only_plan(name, **{k: getattr(cfg, k) for k in (
        "num_gpus", "tp", "pp", "cp", "ep", "vpp", "schedule", "global_batch_size", "micro_batch_size", "seq_len",
        "cp_kind", "recompute", "recompute_num_layers", "zero_stage", "sequence_parallel", "layers_per_stage",
        "tp_comm_overlap")})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(valid_configs())
def test_every_valid_config_exports_faithfully_or_is_refused(plan):
    par, batch = plan["parallelism"], plan["batch"]
    for target in TARGETS:
        try:
            text = emit(plan, target)
        except PlannerError as e:
            assert f"{target} cannot run this plan" in str(e)  # a deliberate refusal, with its reason
            event(f"{target} refused")
            continue
        event(f"{target} exported")
        if target == "megatron":
            kv = pairs(megatron.parse_rendered(text))
            assert set(kv) <= MEGATRON_FLAGS
            assert (kv["--tensor-model-parallel-size"], kv["--pipeline-model-parallel-size"],
                    kv["--context-parallel-size"]) == (str(par["tp"]), str(par["pp"]), str(par["cp"]))
            assert kv["--micro-batch-size"] == str(batch["micro_batch_size"])
            if "--num-layers-per-virtual-pipeline-stage" in kv:
                assert int(kv["--num-layers-per-virtual-pipeline-stage"]) * par["pp"] * par["vpp"] == \
                    sum(plan["layers_per_stage"])
            if "--pipeline-model-parallel-layout" in kv:
                chunks = kv["--pipeline-model-parallel-layout"].split("|")
                assert len(chunks) == par["pp"] * par["vpp"]
        elif target == "torchtitan":
            check_torchtitan(plan)
        elif target == "torchtitan-0.3":
            check_torchtitan03(plan)
        elif target == "deepspeed":
            ds = json.loads(text)
            assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * \
                ds["gradient_accumulation_steps"] * par["dp"] == batch["global_batch_size"]
        else:
            over, _, _, _ = nemo_parts(text)
            assert over["model.pipeline_model_parallel_size"] == par["pp"]
            assert (over["model.virtual_pipeline_model_parallel_size"] or 1) == par["vpp"]
            assert over["train.micro_batch_size"] == batch["micro_batch_size"]
            if "model.pipeline_model_parallel_layout" in over:
                assert len(over["model.pipeline_model_parallel_layout"].split("|")) == par["pp"] * par["vpp"]


@pytest.mark.parametrize("per_stage", [None, (0, 0)])
def test_full_recompute_of_no_layer_exports_as_no_recompute(per_stage):
    """recompute "full" with zero recomputed layers per stage is the cost model's "none" (every layer keeps its
    activations); launchers get no recompute setting, not a recompute count of 0 (Megatron asks for 1 or more)."""
    plan = config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, recompute="full",
                            recompute_num_layers=0 if per_stage is None else None,
                            recompute_layers_per_stage=per_stage)
    assert not any(a.startswith("--recompute") for a in megatron.arguments(plan))
    assert nemo.overrides(plan)["model.recompute_granularity"] is None
    assert "--recompute" not in deepspeed.notes(plan)[0]
    assert torchtitan.sections(plan)["activation_checkpoint"] == {"mode": "none"}


def test_the_searched_tp_comm_overlap_is_what_each_launcher_is_told():
    """TP communication overlap is a search dimension: the plan records it and each exporter writes it in its own
    knob (Megatron --tp-comm-overlap, torchtitan async TP, NeMo's comm-overlap callback) or refuses it (DeepSpeed),
    and a search for DeepSpeed never picks it."""
    from planner.export.spaces import plan_for_launcher

    plan = config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, tp_comm_overlap=True)
    assert "--tp-comm-overlap" in megatron.arguments(plan)
    assert torchtitan.sections(plan)["parallelism"]["enable_async_tensor_parallel"] is True
    assert nemo.comm_overlap_kwargs(plan)["tp_comm_overlap"] is True
    with pytest.raises(PlannerError, match="deepspeed cannot run this plan.*TP communication overlap"):
        deepspeed.config(plan)
    off = config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, tp_comm_overlap=False)
    assert "--tp-comm-overlap" not in megatron.arguments(off)
    assert "enable_async_tensor_parallel" not in torchtitan.sections(off)["parallelism"]
    model, cluster = load_model("llama-3.1-70b"), load_cluster("h100-80gb-sxm")
    best = plan_for_launcher(model, cluster, 64, 64, 4096, "megatron")
    assert best.config.tp_comm_overlap == (best.config.tp > 1 and best.config.sequence_parallel)
    ds = plan_for_launcher(model, cluster, 64, 64, 4096, "deepspeed")
    assert not ds.config.tp_comm_overlap


# ---------------------------------------------------------------------------------------------------------------
# What Megatron-LM's validate_args and Megatron-DeepSpeed need beyond the parallel layout (issue 11)
# ---------------------------------------------------------------------------------------------------------------
def test_megatron_script_sets_the_environment_validate_args_requires():
    """megatron/training/arguments.py: TP or CP need CUDA_DEVICE_MAX_CONNECTIONS=1 (before Blackwell); Megatron
    FSDP needs it unset or > 1; the MoE all-to-all overlap wants it larger."""
    tp = megatron.render(config_only_plan(num_gpus=64, tp=8, global_batch_size=64))
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in tp and "it sets CUDA_DEVICE_MAX_CONNECTIONS" in tp
    fsdp = megatron.render(config_only_plan(num_gpus=64, tp=8, global_batch_size=64, zero_stage=3))
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in fsdp and "export CUDA_DEVICE_MAX_CONNECTIONS" not in fsdp
    moe = megatron.render(config_only_plan("mixtral-8x7b", num_gpus=64, pp=4, vpp=2, ep=8, global_batch_size=64,
                                           ep_comm_overlap=True))
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in moe
    plain = megatron.render(config_only_plan(num_gpus=64, global_batch_size=64))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in plain
    # the script still parses back to the same arguments
    assert megatron.parse_rendered(tp) == megatron.arguments(config_only_plan(num_gpus=64, tp=8,
                                                                              global_batch_size=64))


def test_megatron_reduces_gradients_in_the_dtype_the_plan_was_costed_with():
    bf16 = pairs(megatron.arguments(config_only_plan(num_gpus=64, tp=8, global_batch_size=64, grad_reduce_bytes=2)))
    assert "--grad-reduce-in-bf16" in bf16 and "--accumulate-allreduce-grads-in-fp32" not in bf16
    fp32 = pairs(megatron.arguments(config_only_plan(num_gpus=64, tp=8, global_batch_size=64, grad_reduce_bytes=4)))
    assert "--accumulate-allreduce-grads-in-fp32" in fp32 and "--grad-reduce-in-bf16" not in fp32


def test_megatron_deepspeed_runs_zero3_without_the_pipeline_module():
    """With PP 1 Megatron-DeepSpeed must be told --no-pipeline-parallel, else it builds GPTModelPipe and DeepSpeed
    asserts that ZeRO-2/3 is incompatible with pipeline parallelism."""
    note = deepspeed.notes(config_only_plan(num_gpus=64, tp=8, global_batch_size=64, zero_stage=3))[0]
    assert "--no-pipeline-parallel" in note and "--zero-stage 3" in note
    piped = deepspeed.notes(config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, zero_stage=1))[0]
    assert "--no-pipeline-parallel" not in piped


def test_torchtitan_runs_dualpipev_and_its_expert_parallel_overlap():
    """torchtitan 0.2.2 runs DualPipeV (torch's ScheduleDualPipeV, V placement) and overlaps the MoE all-to-alls of
    its F&B pairs (``pipeline_parallel_expert_parallel_overlap``, on by default, DualPipeV with pp > 1 and ep > 1,
    no activation checkpointing): the export says what the plan costed; the overlap under any other schedule, or
    with recomputation, is refused; DeepSeek's bidirectional DualPipe has no torch class."""
    base = dict(model="mixtral-8x7b", num_gpus=64, pp=2, vpp=2, ep=8, global_batch_size=128, schedule="dualpipev",
                recompute="none")
    par = check_torchtitan(config_only_plan(**base, ep_comm_overlap=True))["parallelism"]
    assert par["pipeline_parallel_schedule"] == "DualPipeV"
    assert par["pipeline_parallel_expert_parallel_overlap"] is True
    off = check_torchtitan(config_only_plan(**base))["parallelism"]
    assert off["pipeline_parallel_expert_parallel_overlap"] is False
    with pytest.raises(PlannerError, match="activation checkpointing"):
        emit(config_only_plan(**{**base, "recompute": "selective"}, ep_comm_overlap=True), "torchtitan")
    with pytest.raises(PlannerError, match="overlap"):
        emit(config_only_plan(**{**base, "schedule": "zbv"}, ep_comm_overlap=True), "torchtitan")
    with pytest.raises(PlannerError, match="dualpipe"):
        emit(config_only_plan(model="llama-3.1-70b", num_gpus=32, tp=8, pp=4, global_batch_size=64,
                              schedule="dualpipe"), "torchtitan")


def test_megatron_exports_what_megatron_core_asks_of_moe_and_fp8():
    """Megatron-Core's TransformerConfig rules (conformance/test_megatron_core.py runs them): the all-to-all
    dispatcher and grouped GEMM the plan costs (the defaults are allgather and one GEMM per expert, with which
    --overlap-moe-expert-parallel-comm and moe_act recomputation are refused), and per-tensor current scaling where
    fp8 recomputes moe_act or layernorm (delayed scaling refused)."""
    from planner.export import megatron, nemo

    plan = config_only_plan(model="mixtral-8x7b", num_gpus=64, ep=8, global_batch_size=64, precision="fp8",
                            recompute="selective", recompute_modules="layernorm,moe_act")
    args = " ".join(megatron.render(plan).split())
    assert "--moe-token-dispatcher-type alltoall" in args and "--moe-grouped-gemm" in args
    assert "--fp8-recipe tensorwise" in args
    assert nemo.overrides(plan)["mixed_precision"] == "bf16_with_fp8_current_scaling_mixed"
    plain = config_only_plan(model="mixtral-8x7b", num_gpus=64, ep=8, global_batch_size=64, precision="fp8")
    assert "--fp8-recipe delayed" in " ".join(megatron.render(plain).split())


def test_megatron_export_writes_the_sliding_windows_the_plan_costs():
    """A plan costed with sliding-window attention exports it (the launched model would attend fully otherwise):
    gpt-oss's 128-token window on alternate layers as --window-size 128,0 --window-attn-skip-freq 2 (Megatron-Core's
    is_layer_window_attention: every 2nd layer global, as its layer_types say), Gemma 3's five local to one global
    over 62 layers as a per-layer list, Mistral's window on every layer with no skip; Llama 4's chunked attention,
    which Megatron-Core lacks, is not written, its every-fourth global layer without RoPE is (--no-rope-freq 4,
    transformers' no_rope_layers). Top-1 routing adds --moe-router-pre-softmax, which Megatron-Core's
    TransformerConfig requires with one expert per token (the conformance check found it)."""
    from dataclasses import asdict

    from planner.export._common import read_plan
    from planner.export.megatron import _model_args, window_args
    from planner.plan import config_fields
    from planner.specs.model import load_model, model_from_config
    from tests.test_hf_models import GEMMA3_27B, MISTRAL_NEMO

    oss = load_model(str(Path(__file__).parents[1] / "planner/validation/models/gpt-oss-120b.json"))
    assert window_args(oss) == ["--window-size", "128,0", "--window-attn-skip-freq", "2"]
    gemma = window_args(model_from_config(GEMMA3_27B))
    bits = eval(gemma[3], {"__builtins__": {}})
    assert gemma[:2] == ["--window-size", "1024,0"] and len(bits) == 62 and bits[5] == 0 and sum(bits) == 52
    mistral = model_from_config({**MISTRAL_NEMO, "sliding_window": 4096})
    assert window_args(mistral) == ["--window-size", "4096,0"]
    maverick = load_model("llama-4-maverick")  # chunked attention not written; its NoPE global layers are
    assert maverick.sliding_window and window_args(maverick) == ["--no-rope-freq", "4"]
    cfg = RunConfig(num_gpus=64, tp=2, ep=8, etp=1, global_batch_size=64, seq_len=8192, sequence_parallel=True)
    plan = json.loads(json.dumps({"schema_version": "1.0", "model": maverick.name, "cluster": "h100-80gb-sxm",
                                  **config_fields(maverick, cfg), "model_spec": asdict(maverick)}))
    assert "--moe-router-pre-softmax" in _model_args(read_plan(plan))


def test_bf16_adam_moments_are_exported_where_megatron_core_runs_them(monkeypatch):
    """--adam-moments bf16 (Megatron-Core's precision-aware optimizer): Megatron-LM gets
    --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 (megatron/training/arguments.py),
    Megatron-Bridge the OptimizerConfig fields with torch.bfloat16; torchtitan and DeepSpeed refuse it in one line."""
    import sys
    import types

    plan = make_plan("llama-3.1-8b", "h100-80gb-sxm", num_gpus=8, global_batch_size=16, seq_len=4096,
                     adam_moment_bytes=2)
    assert plan["options"]["adam_moment_bytes"] == 2
    kv = pairs(megatron.arguments(plan))
    assert "--use-precision-aware-optimizer" in kv and kv["--exp-avg-dtype"] == kv["--exp-avg-sq-dtype"] == "bf16"
    assert set(kv) <= MEGATRON_FLAGS
    over, _, _, ns = nemo_parts(emit(plan, "nemo"))
    assert over["optimizer.use_precision_aware_optimizer"] is True
    fake_torch = types.SimpleNamespace(bfloat16="torch.bfloat16")
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    try:
        cfg = ns["apply_plan"](fake_config())
    finally:
        ns["_restore"]()
    assert cfg.optimizer.exp_avg_dtype == cfg.optimizer.exp_avg_sq_dtype == "torch.bfloat16"
    for target in ("torchtitan", "deepspeed"):
        with pytest.raises(PlannerError, match="Adam moments in bf16"):
            emit(plan, target)
    zero0 = make_plan("llama-3.1-8b", "h100-80gb-sxm", num_gpus=8, global_batch_size=16, seq_len=4096,
                      adam_moment_bytes=2, zero_stage=0)
    for target in ("megatron", "nemo"):  # megatron/core/optimizer/__init__.py: only with the distributed optimizer
        with pytest.raises(PlannerError, match="distributed optimizer"):
            emit(zero0, target)
    plain = make_plan("llama-3.1-8b", "h100-80gb-sxm", num_gpus=8, global_batch_size=16, seq_len=4096)
    assert "adam_moment_bytes" not in plain["options"]
    assert "--use-precision-aware-optimizer" not in megatron.arguments(plain)
