"""Validity rules of a configuration against a model and a cluster (shared by ``estimate`` and the search)."""

from __future__ import annotations

import numpy as np

from planner.cost.data_parallel import expert_dp_degree
from planner.cost.schedule import SCHEDULES
from planner.errors import PlannerError
from planner.specs.config import (CP_KINDS, OP_SAC_MODULES, PRECISIONS, RECOMPUTE_MODES,
                                   ZERO_STAGES, RunConfig, canonical_recompute_modules, comm_reserved_sms_value,
                                   even_layer_split, moe_load_factor_value, recompute_module_on)
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec


def tp_splits_heads(model: ModelSpec, tp: int) -> bool:
    """True when TP can split the attention: heads divide by TP, and KV heads either divide by TP or are fewer and
    replicated (TP a multiple of them); and a Mamba-2 mixer's heads and groups divide by TP (Megatron-Core's
    MambaMixer asserts both). Shared with the search's walk (``planner.search.space``)."""
    if model.mamba_heads and (model.mamba_heads % tp or model.mamba_groups % tp):
        return False
    return not (model.num_heads % tp or model.num_kv_heads % tp and tp % model.num_kv_heads)


def mamba_cp_problem(model: ModelSpec, tp: int, cp: int) -> str | None:
    """Why context parallelism cannot split a Mamba-2 mixer over cp ranks, or None: its all-to-alls hand each rank
    whole heads, so the heads per TP rank must divide by cp, and the groups per TP rank either divide by cp or,
    fewer, divide cp (then replicated) (megatron/core/ssm/mamba_context_parallel.py asserts both). Shared with the
    search's walk."""
    if not model.mamba_heads or cp <= 1:
        return None
    heads, groups = model.mamba_heads // tp, max(model.mamba_groups // tp, 1)
    if heads % cp or groups % cp and cp % groups:
        return f"the Mamba mixer's {heads} heads and {groups} groups per TP rank must divide by cp={cp} (groups " \
               f"fewer than cp must divide it; Megatron-Core's Mamba context parallelism); use a smaller cp"
    return None


def model_cp_problem(model: ModelSpec, tp: int, cp: int) -> str | None:
    """Why the model's layers cannot run context parallelism over cp ranks, or None: a Mamba mixer's head split
    (:func:`mamba_cp_problem`), or cross-attention layers (Llama 3.2 Vision), whose image keys every CP rank would
    hold whole and whose states' gradient would need a reduction over CP the planner does not price. Shared with
    the search's walk."""
    if model.cross_attention_pattern and cp > 1:
        return "cross-attention layers (image keys whole on every rank) are priced without context parallelism; " \
               "use --cp 1"
    return mamba_cp_problem(model, tp, cp)


def ulysses_problem(model: ModelSpec, tp: int, cp: int) -> str | None:
    """Why Ulysses cannot split the heads over tp*cp, or None. DeepSpeed-Ulysses (Jacobs et al. 2023, Sec. 3.1):
    the all-to-all hands each rank whole heads, and the K/V heads per TP rank must divide or be divisible by cp
    (fewer K/V heads are replicated). Shared with the search's walk (``planner.search.space``)."""
    if model.num_heads % (cp * tp):
        return f"Ulysses needs heads ({model.num_heads}) divisible by tp*cp = {tp * cp}; use a smaller cp or " \
               f"--cp-kind ring"
    kv_per_tp = max(model.attn_kv_heads // tp, 1)
    if kv_per_tp % cp and cp % kv_per_tp:
        return f"Ulysses needs the {kv_per_tp} K/V heads per TP rank to divide or be divisible by cp={cp} (fewer " \
               f"K/V heads are replicated)"
    return None


def hsdp_splits_expert_dp(model: ModelSpec, dp, cp, ep, tp, etp, dp_shard):
    """Whether HSDP's dp / dp_shard replicas split the expert-data-parallel group evenly (each replica keeps the
    same expert shards); always for dense models. Numbers or arrays."""
    if not model.is_moe:
        return True
    replicas = np.maximum(np.asarray(dp) // np.maximum(np.asarray(dp_shard), 1), 1)
    return expert_dp_degree(dp, cp, ep, tp, etp) % replicas == 0


def recompute_modules_problem(model: ModelSpec, modules: str, recompute: str = "selective") -> str | None:
    """Why ``modules`` (a configuration's ``recompute_modules``) cannot be recomputed for ``model``, or None. They
    shape selective recomputation only: under ``recompute`` none or full a search row or a plan keeps its space's
    modules, which nothing prices (``planner estimate`` refuses them given with another mode)."""
    try:
        canonical = canonical_recompute_modules(modules)
    except ValueError as e:
        return str(e)
    if canonical != modules:
        return f"'{modules}' is not in canonical form; write '{canonical}'"
    policies = [m for m in OP_SAC_MODULES if recompute_module_on(modules, m)]
    if policies and modules != policies[0]:
        return f"{policies[0]} is torchtitan's per-op policy and picks every op itself; give it alone " \
               f"(--recompute-modules {policies[0]}) or give Megatron-Core modules without it"
    if recompute_module_on(modules, "mla_up_proj") and not model.is_mla:
        return f"mla_up_proj needs multi-head latent attention, which {model.name} does not have; drop it"
    if recompute_module_on(modules, "moe_act") and not model.is_moe:
        return f"moe_act recomputes experts' activations; {model.name} has no experts; drop it"
    if recompute_module_on(modules, "moe") and not model.is_moe:
        return f"moe recomputes MoE blocks; {model.name} has no experts; drop it (dense MLPs: mlp)"
    return None


def reserved_sms_problem(cluster: Cluster, reserved: int) -> str | None:
    """Why ``reserved`` SMs held by communication kernels (``RunConfig.comm_reserved_sms``) cannot be priced on this
    cluster's GPU, or None: its profile gives no SM count, or the reservation leaves none to compute."""
    sms = cluster.gpu.sm_count
    if reserved and not sms:
        return (f"the {cluster.gpu.name} profile gives no SM count (gpu.sm_count), so reserved SMs cannot be priced; "
                "add it to the profile or use 0")
    if reserved >= sms > 0:
        return (f"{reserved} SMs reserved for communication leave none of the {cluster.gpu.name}'s {sms} to compute; "
                "use fewer")
    return None


def config_problems(model: ModelSpec, cluster: Cluster, cfg: RunConfig) -> list[tuple[str, str]]:
    """Every rule a configuration breaks, as (option, message naming the rule and a valid alternative).

    Rules: degrees multiply to the GPU count; heads and KV heads divisible by TP; TP inside one node; global batch
    divisible by DP x micro-batch; enough layers for PP x VPP stages; CP divides the sequence; EP divides DP x CP
    and the experts (Megatron's rule); TP communication overlap with sequence parallelism; a GEMM precision the GPU
    has; the schedule's own constraints.
    """
    out: list[tuple[str, str]] = []
    for name in ("num_gpus", "tp", "pp", "cp", "ep", "vpp", "global_batch_size", "micro_batch_size", "seq_len"):
        if getattr(cfg, name) < 1:
            out.append((name, f"must be >= 1, got {getattr(cfg, name)}"))
    if out:
        return out
    prod = cfg.tp * cfg.pp * cfg.cp
    if cfg.num_gpus % prod:
        out.append(("gpus", f"{cfg.num_gpus} GPUs are not divisible by tp*pp*cp = {prod}; "
                            f"use a GPU count that is a multiple of {prod}"))
        return out
    if cluster.max_gpus and cfg.num_gpus > cluster.max_gpus:
        out.append(("gpus", f"cluster {cluster.name} has at most {cluster.max_gpus} GPUs"))
    if not tp_splits_heads(model, cfg.tp):
        ok = [t for t in range(1, cluster.gpus_per_node + 1) if tp_splits_heads(model, t)]
        mamba = f" (Mamba: {model.mamba_heads} heads, {model.mamba_groups} groups)" if model.mamba_heads else ""
        out.append(("tp", f"{model.num_heads} attention heads / {model.num_kv_heads} KV heads{mamba} are not "
                          f"divisible by tp={cfg.tp}; use tp in {{{', '.join(map(str, ok))}}}"))
    if cfg.tp > cluster.gpus_per_node:
        out.append(("tp", f"tp={cfg.tp} is larger than a node ({cluster.gpus_per_node} GPUs); "
                          f"use tp <= {cluster.gpus_per_node}"))
    dp = cfg.dp
    if cfg.global_batch_size % (dp * cfg.micro_batch_size):
        unit = dp * cfg.micro_batch_size
        below = cfg.global_batch_size // unit * unit
        near = f"{below} or {below + unit}" if below else f"{unit}"
        out.append(("global-batch", f"global batch {cfg.global_batch_size} is not divisible by dp*micro_batch = "
                                    f"{dp}*{cfg.micro_batch_size}; use a multiple of {unit} (e.g. {near}), a smaller "
                                    f"micro-batch or a larger tp*pp*cp"))
    elif cfg.pipeline_flushes > 1 and cfg.pp == 1:
        out.append(("pipeline-flushes", f"{cfg.pipeline_flushes} pipeline flushes need pipeline stages (pp > 1): "
                                        "without them every micro-batch is its own pass already; use 1"))
    elif cfg.pipeline_flushes < 1 or cfg.num_microbatches % cfg.pipeline_flushes:
        out.append(("pipeline-flushes", f"{cfg.pipeline_flushes} pipeline flushes do not divide the step's "
                                        f"{cfg.num_microbatches} micro-batches per pipeline; use a divisor of "
                                        f"{cfg.num_microbatches} (1: one schedule over the step)"))
    stages = cfg.pp * cfg.vpp
    if cfg.layers_per_stage is not None:
        if len(cfg.layers_per_stage) != stages or sum(cfg.layers_per_stage) != model.num_layers or \
                min(cfg.layers_per_stage) < 0:
            out.append(("layers_per_stage", f"must list {stages} non-negative counts summing to "
                                            f"{model.num_layers} layers"))
    elif model.num_layers < stages:
        out.append(("pp", f"{model.num_layers} layers cannot fill pp*vpp = {stages} stages; use pp*vpp <= "
                          f"{model.num_layers}"))
    if cfg.recompute_layers_per_stage is not None:
        per_stage = cfg.layers_per_stage
        if per_stage is None and model.num_layers >= stages:
            per_stage = even_layer_split(model.num_layers, stages)
        if len(cfg.recompute_layers_per_stage) != stages or min(cfg.recompute_layers_per_stage) < 0 or (
                per_stage is not None and len(per_stage) == stages
                and any(k > n for k, n in zip(cfg.recompute_layers_per_stage, per_stage))):
            out.append(("recompute_layers_per_stage", f"must list {stages} counts, each between 0 and its stage's "
                                                      f"layers"))
        elif cfg.recompute != "full":
            out.append(("recompute_layers_per_stage", "per-stage recomputation needs --recompute full"))
    if cfg.seq_len % (2 * cfg.cp) and cfg.cp > 1:
        out.append(("cp", f"seq_len {cfg.seq_len} must be divisible by 2*cp = {2 * cfg.cp} (load-balanced "
                          f"causal split)"))
    if model_cp_problem(model, cfg.tp, cfg.cp):
        out.append(("cp", model_cp_problem(model, cfg.tp, cfg.cp)))
    if cfg.cp_kind not in CP_KINDS:
        out.append(("cp_kind", f"unknown context-parallel kind '{cfg.cp_kind}'; use one of {', '.join(CP_KINDS)}"))
    elif cfg.cp_kind == "ulysses" and cfg.cp > 1:
        reason = ulysses_problem(model, cfg.tp, cfg.cp)
        if reason:
            out.append(("cp", reason))
    etp = cfg.expert_tp
    n_before = len(out)
    if cfg.etp is not None:
        if cfg.etp < 1:
            out.append(("etp", f"must be >= 1, got {cfg.etp}"))
        elif not model.is_moe and cfg.etp != cfg.tp:
            out.append(("etp", "expert tensor parallelism needs a mixture-of-experts model; leave it unset"))
        elif cfg.etp > cluster.gpus_per_node:
            out.append(("etp", f"etp={cfg.etp} is larger than a node ({cluster.gpus_per_node} GPUs)"))
        elif cfg.etp != cfg.tp and cfg.tp > 1 and not cfg.sequence_parallel:
            out.append(("etp", "expert TP other than TP needs sequence parallelism (Megatron-Core's MoE folding); "
                               "turn it on or use etp = tp"))
    if len(out) == n_before and (cfg.ep > 1 or etp != cfg.tp):
        # Megatron-Core MoE parallel folding: the MoE layers' grid (expert TP x EP x expert DP) covers the same
        # tp x cp x dp ranks of a pipeline stage as the attention's (with expert TP = TP: EP divides DP x CP)
        if cfg.ep > 1 and not model.is_moe:
            out.append(("ep", "expert parallelism needs a mixture-of-experts model; use ep=1"))
        elif (cfg.tp * cfg.cp * dp) % (cfg.ep * etp):
            out.append(("ep", f"ep*etp = {cfg.ep}*{etp} must divide tp*cp*dp = {cfg.tp * cfg.cp * dp} "
                              f"(Megatron-Core MoE parallel folding; with etp = tp: ep divides dp*cp)"))
        elif model.num_experts % cfg.ep:
            out.append(("ep", f"ep={cfg.ep} must divide the {model.num_experts} experts"))
        elif cfg.tp > 1 and not cfg.sequence_parallel:
            out.append(("sequence_parallel", "expert parallelism with tp > 1 needs sequence parallelism "
                                             "(Megatron-Core MoE); turn it on"))
    if cfg.dp_shard is not None:  # HSDP: shard groups of dp_shard DP ranks, replicated across the rest of DP
        if cfg.dp_shard < 1 or dp % cfg.dp_shard:
            out.append(("dp_shard", f"must divide the data-parallel degree {dp}, got {cfg.dp_shard}"))
        elif cfg.zero_stage < 1:
            out.append(("dp_shard", "HSDP shards model states with ZeRO; use --zero 1, 2 or 3, or drop --dp-shard"))
        elif not hsdp_splits_expert_dp(model, dp, cfg.cp, cfg.ep, cfg.tp, etp, cfg.dp_shard):
            edp = int(expert_dp_degree(dp, cfg.cp, cfg.ep, cfg.tp, etp))
            out.append(("dp_shard", f"the expert-data-parallel group ({edp} ranks) must split into "
                                    f"the {dp // cfg.dp_shard} replicas; use a larger --dp-shard"))
    if cfg.offload_layers:  # Megatron-Core TransformerConfig's checks of cpu_offloading
        if cfg.offload_layers < 0 or cfg.offload_layers >= model.num_layers:
            out.append(("offload_layers", f"must be 0 to {model.num_layers - 1} (fewer than the model's layers), got "
                                          f"{cfg.offload_layers}"))
        elif cfg.pp > 1:
            out.append(("offload_layers", "activation offloading runs without pipeline stages (Megatron-Core); use "
                                          "pp=1 or no offloading"))
        elif cfg.recompute != "none":
            out.append(("offload_layers", "activation offloading runs without recomputation (Megatron-Core); use "
                                          "--recompute none"))
        elif not cluster.host_link_bytes_per_s:
            out.append(("offload_layers", f"profile {cluster.name} gives no host link (host_link.bandwidth_gb_s)"))
    if cfg.offload_modules:  # Megatron-Core's fine-grained activation offloading
        mods = cfg.offload_modules.split(",")
        sel = cfg.recompute_modules.split(",") if cfg.recompute == "selective" else []
        if cfg.offload_layers:
            out.append(("offload_modules", "fine-grained offloading cannot run with layer offloading "
                                           "(TransformerConfig: not with cpu_offloading); drop one"))
        elif cfg.recompute == "full":
            out.append(("offload_modules", "full recomputation keeps only each layer's input: offload with "
                                           "--recompute none or selective"))
        elif not cluster.host_link_bytes_per_s:
            out.append(("offload_modules", f"profile {cluster.name} gives no host link (host_link.bandwidth_gb_s)"))
        elif "attn_proj" in mods and "core_attn" not in mods:
            out.append(("offload_modules", "attn_proj must be offloaded together with core_attn (Megatron-Core)"))
        elif not model.is_moe and {"expert_fc1", "moe_act"} & set(mods):
            out.append(("offload_modules", "expert_fc1 and moe_act are MoE modules; this model has no experts"))
        elif "qkv_linear" in mods and "layernorm" in sel:
            out.append(("offload_modules", "selective recomputation of layernorm drops the QKV input that "
                                           "qkv_linear would offload; drop one of them"))
        elif {"expert_fc1", "moe_act"} & set(mods) and "moe" in sel:
            out.append(("offload_modules", "selective recomputation of moe checkpoints the whole MoE block, so "
                                           "nothing inside it is kept to offload (Megatron-Core); drop expert_fc1 / "
                                           "moe_act from the offload modules or moe from the recompute modules"))
        elif "core_attn" in mods and "mla_up_proj" in sel:
            out.append(("offload_modules", "selective recomputation of mla_up_proj drops the Q, K, V that core_attn "
                                           "would offload; drop one of them"))
    if cfg.tp_comm_overlap and cfg.tp > 1 and not cfg.sequence_parallel:
        out.append(("tp_comm_overlap", "TP communication overlap needs sequence parallelism (Megatron-Core's "
                                       "--tp-comm-overlap rule); turn sequence parallelism on or the overlap off"))
    if cfg.precision not in PRECISIONS:
        out.append(("precision", f"unknown precision '{cfg.precision}'; use one of {', '.join(PRECISIONS)}"))
    elif cfg.precision not in cluster.gpu.precisions():
        out.append(("precision", f"{cluster.gpu.name} has no {cfg.precision} tensor cores (its profile gives "
                                 f"{', '.join(cluster.gpu.precisions())}); use --precision "
                                 f"{'fp8' if 'fp8' in cluster.gpu.precisions() else 'bf16'} or a GPU that has it"))
    if cfg.grad_reduce_bytes not in (2, 4):
        out.append(("grad_reduce_bytes", f"must be 2 (bf16) or 4 (fp32), got {cfg.grad_reduce_bytes}"))
    if cfg.recompute not in RECOMPUTE_MODES:
        out.append(("recompute", f"unknown mode '{cfg.recompute}'; use one of {', '.join(RECOMPUTE_MODES)}"))
    try:
        moe_load_factor_value(cfg.moe_load_factor, "moe_load_factor")
    except PlannerError as e:
        out.append(("moe_load_factor", e.reason))
    try:
        problem = reserved_sms_problem(cluster, comm_reserved_sms_value(cfg.comm_reserved_sms, "comm_reserved_sms"))
    except PlannerError as e:
        problem = e.reason
    if problem:
        out.append(("comm_reserved_sms", problem))
    if cfg.activation_fp8_input_store and not model.gated_mlp:
        # Megatron-Core: "Storing activation input in FP8 is supported only for SwiGLU." (transformer_config.py)
        out.append(("activation_fp8_input_store", f"{model.name}'s MLPs are not gated (SwiGLU): Megatron-Core "
                                                  "stores the activation input in fp8 for SwiGLU only; drop "
                                                  "--activation-fp8-input-store"))
    if cfg.ep_comm_overlap:  # Megatron-Core's rules for --overlap-moe-expert-parallel-comm (transformer_config.py)
        if not model.is_moe or cfg.ep <= 1:
            out.append(("ep_comm_overlap", "overlapping the MoE all-to-alls needs expert parallelism (a MoE model, "
                                           "--ep > 1); drop --ep-comm-overlap"))
        elif cfg.pp > 1 and cfg.vpp <= 1 and not getattr(SCHEDULES.get(cfg.schedule), "pairs_microbatches", False):
            out.append(("ep_comm_overlap", "with pipeline parallelism the all-to-all overlap pairs micro-batches of "
                                           "virtual stages (Megatron-Core: needs virtual pipeline stages); add --vpp "
                                           "2 or more, or drop --ep-comm-overlap"))
        elif cfg.recompute == "full":
            out.append(("ep_comm_overlap", "the all-to-all overlap cannot run with full recomputation (Megatron-"
                                           "Core); use --recompute selective or none"))
        elif cfg.recompute == "selective" and recompute_module_on(cfg.recompute_modules, "moe"):
            out.append(("ep_comm_overlap", "the all-to-all overlap cannot run while the MoE block is recomputed "
                                           "(Megatron-Core); drop moe from --recompute-modules or the overlap"))
    problem = recompute_modules_problem(model, cfg.recompute_modules, cfg.recompute)
    if problem:
        out.append(("recompute_modules", problem))
    if cfg.zero_stage not in ZERO_STAGES:
        out.append(("zero", f"unknown ZeRO stage {cfg.zero_stage}; use 0, 1, 2 or 3"))
    sched = SCHEDULES.get(cfg.schedule)
    if sched is None:
        out.append(("schedule", f"unknown schedule '{cfg.schedule}'; use one of {', '.join(SCHEDULES)}"))
    elif cfg.num_microbatches >= 1:
        reason = sched.check(cfg.pp, cfg.num_microbatches, cfg.vpp)
        if reason:
            out.append(("schedule", reason))
    return out
