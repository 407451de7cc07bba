"""Compare the cost model with published measurements (``published_runs.json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from planner.cost.compute import gpt_full_recompute_flops_eq3, model_flops_per_step
from planner.cost.step import estimate
from planner.errors import PlannerError
from planner.specs.config import RunConfig
from planner.specs.hardware import (GIB, check_attention_kernel, cluster_variant, derived_attention_kernel,
                                    load_cluster)
from planner.specs.model import model_from_config
from planner.specs.stack import DEFAULT_STACK, load_stack
from planner.validation.bands import gpu_family

RUNS_FILE = Path(__file__).with_name("published_runs.json")


def relative_error(estimated: float, measured: float) -> float:
    """Signed relative error of every validation set: (estimated - measured) / measured."""
    return (estimated - measured) / measured


@dataclass(frozen=True)
class ValidationRow:
    id: str
    table: str
    metric: str
    measured: float
    estimated: float
    heldout: bool = False  # never used to fit a constant

    @property
    def error(self) -> float:
        return relative_error(self.estimated, self.measured)


def load_runs(path: Path = RUNS_FILE) -> list[dict]:
    return json.loads(path.read_text())["runs"]


def run_config(layout: dict) -> RunConfig:
    """A validation row's layout (JSON: its ``layers_per_stage`` a list) as a RunConfig."""
    conf = dict(layout)
    if conf.get("layers_per_stage") is not None:
        conf["layers_per_stage"] = tuple(conf["layers_per_stage"])
    return RunConfig(**conf)


def evaluate_run(run: dict) -> ValidationRow:
    model = model_from_config(run["model"], source=run["id"], default_name=run["model"].get("name", run["id"]))
    cluster = load_cluster(run["cluster"])
    cfg = run_config(run["config"])
    est = estimate(model, cluster, cfg)
    metric = run["measured"]["metric"]
    if metric == "step_time_s":
        value = est.step_time_s
    elif metric == "tflops_per_gpu_eq3":
        # Narayanan et al. count Eq. 3 FLOPs (with the recompute forward) per second per GPU
        flops = gpt_full_recompute_flops_eq3(cfg.global_batch_size, cfg.seq_len, model.num_layers,
                                             model.hidden_size, model.vocab_size)
        value = flops / est.step_time_s / cfg.num_gpus / 1e12
    elif metric == "mfu":
        value = est.mfu
    elif metric == "mfu_causal":
        # MFU counting only the unmasked half of causal attention's s^2 FLOPs (the convention under which long-
        # context runs report MFU close to their short-context MFU, as Llama 3's Table 4 does)
        flops = model_flops_per_step(model, cfg.global_batch_size, cfg.seq_len, causal_half=True)
        value = flops / est.step_time_s / (cfg.num_gpus * cluster.gpu.peak_flops)
    else:
        raise ValueError(f"unknown metric {metric}")
    return ValidationRow(run["id"], run["table"], metric, float(run["measured"]["value"]), value,
                         bool(run.get("heldout", False)))


def validate(runs: list[dict] | None = None) -> list[ValidationRow]:
    return [evaluate_run(r) for r in (runs if runs is not None else load_runs())]


# ---------------------------------------------------------------------------------------------------------------
# The modern set: current stacks, tokens per second per GPU
# ---------------------------------------------------------------------------------------------------------------
MODERN_FILE = Path(__file__).with_name("modern_runs.json")
#: accuracy groups of the modern set (a row may be in several), in report order
GROUPS = ("dense bf16", "fp8", "MoE", "hybrid (Mamba)", "FSDP / ZeRO-2/3", "long context", "context parallel",
          "H100 / H200 / H800", "B200", "B300 / GB300")
#: from this sequence length on a run counts as long context
LONG_CONTEXT_TOKENS = 32768


@dataclass(frozen=True)
class ModernRow:
    id: str
    source: str
    framework: str
    measured: float  # tokens / s / GPU
    estimated: float | None  # None where the layout cannot be expressed
    groups: tuple[str, ...]
    command: str  # the `planner estimate` command that reproduces the estimate
    cannot_express: str = ""
    peak_memory_gib: float | None = None  # the memory model's peak for the published layout
    memory_limit_gib: float | None = None  # what the profile lets a GPU use
    model_type: str = ""  # the model's family (its config's model_type), for accuracy per family

    @property
    def fits(self) -> bool | None:
        """Whether the memory model lets the published layout run (it did run): None where not estimated."""
        return None if self.peak_memory_gib is None else self.peak_memory_gib <= self.memory_limit_gib

    @property
    def error(self) -> float:
        return relative_error(self.estimated, self.measured)


def load_modern_runs(path: Path = MODERN_FILE) -> list[dict]:
    return json.loads(path.read_text())["runs"]


def modern_model_ref(run: dict) -> str:
    """The --model value of a row: a shipped name, or the path of its config.json under ``models/``."""
    ref = run["model"]
    return str(Path(__file__).with_name(ref.split("/", 1)[0]) / ref.split("/", 1)[1]) if "/" in ref else ref


def modern_config(run: dict) -> RunConfig:
    return run_config(run["layout"])


def row_groups(run: dict, model, cfg: RunConfig) -> tuple[str, ...]:
    """The accuracy groups a row belongs to, from its configuration (not from hand-written tags); its GPU's group is
    the GPU family its error band is kept under (``bands.gpu_family``)."""
    out = []
    if cfg.precision == "bf16" and not model.is_moe:
        out.append("dense bf16")
    if cfg.precision in ("fp8", "mxfp8"):
        out.append("fp8")
    if model.is_moe:
        out.append("MoE")
    if "M" in model.layer_pattern:
        out.append("hybrid (Mamba)")
    # sharded data parallelism: its ZeRO-2 rows are FSDP2 runs that keep their weights gathered across the step
    # (under pipeline stages), as the torchtitan export maps fsdp_reshard_after_forward "never"
    if cfg.zero_stage >= 2:
        out.append("FSDP / ZeRO-2/3")
    if cfg.seq_len >= LONG_CONTEXT_TOKENS:
        out.append("long context")
    if cfg.cp > 1:
        out.append("context parallel")
    family = gpu_family(run["gpu"])
    if family in GROUPS:
        out.append(family)
    return tuple(out)


def row_stack(run: dict) -> str:
    """The stack a row ran (``stack``; absent: the default, megatron-core): the release whose expert GEMM issue
    times price it (``stacks/megatron-core-25.11.json`` for the NeMo 25.11 and 26.02 containers)."""
    return run.get("stack", DEFAULT_STACK)


def row_cluster(run: dict):
    """The cluster a row ran on as its stack runs there (``Stack.on_cluster``: the release's own expert GEMM issue
    times, where it has them)."""
    base = cluster_variant(run["cluster"], run.get("profile_set") or {}, "profile_set")
    return load_stack(row_stack(run)).on_cluster(base)


def estimate_command(run: dict) -> str:
    """``planner estimate`` with every knob of the row's layout spelled as a CLI option."""
    cfg = modern_config(run)
    default = RunConfig(num_gpus=1)
    parts = ["planner estimate", f"--model {modern_model_ref(run)}", f"--cluster {run['cluster']}",
             *([f"--stack {row_stack(run)}"] if row_stack(run) != DEFAULT_STACK else []),
             f"--gpus {cfg.num_gpus}", f"--global-batch {cfg.global_batch_size}",
             f"--micro-batch {cfg.micro_batch_size}", f"--seq-len {cfg.seq_len}"]
    for flag, name in (("--tp", "tp"), ("--pp", "pp"), ("--cp", "cp"), ("--ep", "ep"), ("--vpp", "vpp")):
        if getattr(cfg, name) != 1:
            parts.append(f"{flag} {getattr(cfg, name)}")
    if cfg.etp is not None:
        parts.append(f"--etp {cfg.etp}")
    if cfg.dp_shard is not None:  # HSDP: sharded within groups of dp_shard ranks, replicated across them
        parts.append(f"--dp-shard {cfg.dp_shard}")
    if cfg.cp > 1:
        parts.append(f"--cp-kind {cfg.cp_kind}")
    parts += [f"--schedule {cfg.schedule}", f"--recompute {cfg.recompute}", f"--zero {cfg.zero_stage}",
              f"--precision {cfg.precision}",
              f"--grad-reduce-dtype {'fp32' if cfg.grad_reduce_bytes == 4 else 'bf16'}"]
    if cfg.recompute_modules != default.recompute_modules:
        parts.append(f"--recompute-modules {cfg.recompute_modules}")
    for flag, name in (("sequence-parallel", "sequence_parallel"), ("flash-attention", "flash_attention"),
                       ("overlap-grad-reduce", "overlap_grad_reduce"), ("overlap-param-gather", "overlap_param_gather"),
                       ("tp-comm-overlap", "tp_comm_overlap"), ("ep-comm-overlap", "ep_comm_overlap"),
                       ("fp8-param-gather", "fp8_param_gather")):
        value = getattr(cfg, name)
        # TP overlap and fp8 parameter gather spelled out always: the default stack sets both
        if value != getattr(default, name) or name in ("tp_comm_overlap", "fp8_param_gather"):
            parts.append(f"--{flag}" if value else f"--no-{flag}")
    if cfg.ep_dispatcher != default.ep_dispatcher:
        parts.append(f"--ep-dispatcher {cfg.ep_dispatcher}")
    if cfg.attention_kernel:
        parts.append(f"--attention-kernel {cfg.attention_kernel}")
    if not cfg.per_expert_gemm_calls:
        parts.append("--grouped-expert-gemm")
    if not cfg.overlap_p2p_comm:
        parts.append("--no-overlap-p2p-comm")
    if cfg.adam_moment_bytes != 4:
        parts.append("--adam-moments bf16")
    if cfg.activation_fp8_input_store:
        parts.append("--activation-fp8-input-store")
    if cfg.moe_load_factor != 1.0:
        parts.append(f"--moe-load-factor {cfg.moe_load_factor:g}")
    if cfg.comm_reserved_sms:
        parts.append(f"--comm-reserved-sms {cfg.comm_reserved_sms}")
    if cfg.te_quantized_weights != load_stack(row_stack(run)).te_quantized_weights:
        parts.append("--te-fp8-weights" if cfg.te_quantized_weights else "--no-te-fp8-weights")
    if cfg.layers_per_stage is not None:
        parts.append("--layers-per-stage " + ",".join(map(str, cfg.layers_per_stage)))
    if cfg.offload_layers:
        parts.append(f"--offload-layers {cfg.offload_layers}")
    if cfg.pipeline_flushes != 1:
        parts.append(f"--pipeline-flushes {cfg.pipeline_flushes}")
    if not cfg.fused_cross_entropy:
        parts.append("--no-fused-cross-entropy")
    for path, value in run.get("profile_set", {}).items():  # the cluster as the row's source describes it
        parts.append(f"--profile-set {path}={value:g}")
    return " ".join(parts)


def evaluate_modern_run(run: dict, cluster=None) -> ModernRow:
    """The row's tokens/s/GPU as ``planner estimate`` computes it for the published layout, or why the layout
    cannot be expressed (a validity rule it breaks). ``cluster``: instead of the row's profile (the fit's trials)."""
    from planner.cost.validity import config_problems
    from planner.specs.model import load_model

    model = load_model(modern_model_ref(run))
    cluster = cluster if cluster is not None else row_cluster(run)
    cfg = modern_config(run)
    # the CLI's rule: sequence parallelism only with TP
    cfg = cfg.with_(sequence_parallel=cfg.sequence_parallel and cfg.tp > 1)
    base = dict(id=run["id"], source=run["source"], framework=run["framework"],
                measured=float(run["measured_tokens_per_s_per_gpu"]), groups=row_groups(run, model, cfg),
                command=estimate_command(run), model_type=model.model_type)
    problems = config_problems(model, cluster, cfg)
    if cfg.attention_kernel:  # a kernel the row names, refused as the CLI refuses it
        try:
            check_attention_kernel(cluster.gpu, run["cluster"], cfg.attention_kernel, option="attention_kernel")
        except PlannerError as e:
            problems = [("attention_kernel", e.reason)]
    if problems:
        return ModernRow(estimated=None, cannot_express=f"{problems[0][0]}: {problems[0][1]}", **base)
    est = estimate(model, cluster, cfg)
    return ModernRow(estimated=est.tokens_per_s / cfg.num_gpus, peak_memory_gib=est.peak_memory_gib,
                     memory_limit_gib=est.memory_limit_bytes / GIB, **base)


#: how much every attention table is slowed to read a row's attention share (a finite difference)
ATTENTION_PROBE_SLOWDOWN = 1.10


def slowed_attention(cluster, factor: float):
    """``cluster`` with every attention table's plateau rates (and the single ``attention_efficiency``) divided by
    ``factor``, the tables' shape costs unchanged."""
    gpu = cluster.gpu

    def slow(k):
        return derived_attention_kernel(k, k.name, 1.0 / factor) if k else k

    return replace(cluster, gpu=replace(gpu, attention_kernel=slow(gpu.attention_kernel),
                                        attention_efficiency=gpu.attention_efficiency / factor,
                                        other_attention_kernels=tuple(slow(k) for k in gpu.other_attention_kernels)))


def attention_gap(run: dict, error: float | None = None) -> tuple[float, float, float]:
    """Whether a row's gap follows its attention: (error, the attention kernels' share of its step, the slowdown of
    the attention alone that closes the gap). The share is d log step / d log attention time (every table slowed
    :data:`ATTENTION_PROBE_SLOWDOWN`); the step scales as 1 + share (k - 1), so k = 1 + error / share. ``error``
    replaces the row's own (e.g. its left-out one). A gap that is the kernel's needs one k on every row of a
    container; one in the GEMMs a k that falls as attention takes over the step; a ring cost one that grows with CP."""
    base = evaluate_modern_run(run)
    slowed = evaluate_modern_run(run, cluster=slowed_attention(row_cluster(run), ATTENTION_PROBE_SLOWDOWN))
    share = (base.estimated / slowed.estimated - 1.0) / (ATTENTION_PROBE_SLOWDOWN - 1.0)
    e = base.error if error is None else error
    return e, share, (1.0 + e / share) if share > 0.01 else float("nan")


@dataclass(frozen=True)
class MissingTime:
    """What a row's step lacks in the model (measured step less estimated step, both from tokens/s/GPU), per step and
    normalized three ways, so that a gap's form can be read off rows of different layouts: per micro-batch of one
    pipeline replica, and per token and layer (the tokens one replica carries through a step times the layers one
    GPU holds). A cost the model lacks per step reads constant in the first; one per token the GPU computes, in the
    last."""

    step_s: float
    per_micro_batch_s: float
    per_token_layer_s: float


def missing_time(run: dict) -> MissingTime:
    """:class:`MissingTime` of a modern row (negative where the model is slow)."""
    from planner.specs.model import load_model

    cfg, model = modern_config(run), load_model(modern_model_ref(run))
    tokens_per_gpu = cfg.global_batch_size * cfg.seq_len / cfg.num_gpus
    row = evaluate_modern_run(run)
    step_s = tokens_per_gpu / row.measured - tokens_per_gpu / row.estimated
    replica_tokens = cfg.global_batch_size * cfg.seq_len / cfg.dp
    return MissingTime(step_s, step_s / cfg.num_microbatches, step_s / (replica_tokens * model.num_layers / cfg.pp))


def validate_modern(runs: list[dict] | None = None) -> list[ModernRow]:
    return [evaluate_modern_run(r) for r in (runs if runs is not None else load_modern_runs())]
