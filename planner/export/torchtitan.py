"""torchtitan TOML job config (``[training]``, ``[parallelism]``, ``[activation_checkpoint]``) for a plan.

Key names follow torchtitan's job config: ``data_parallel_replicate_degree`` / ``data_parallel_shard_degree`` (FSDP2),
``fsdp_reshard_after_forward``, ``tensor_parallel_degree``, ``context_parallel_degree``,
``pipeline_parallel_degree`` / ``_schedule`` / ``_microbatch_size``, ``module_fqns_per_model_part`` (the exact layers
of every pipeline stage), ``expert_parallel_degree`` / ``expert_tensor_parallel_degree`` and
``[activation_checkpoint] mode`` / ``selective_ac_option``. Schedule names are those of
``torch.distributed.pipelining``.

Mapping choices (each also printed as a note):
* ZeRO-0 is plain replication (``data_parallel_replicate_degree``); ZeRO-1/2 are FSDP2 that keeps parameters
  gathered between forward and backward (``fsdp_reshard_after_forward = "never"``: gradients and optimizer states
  sharded, never more memory than the plan's ZeRO-1); ZeRO-3 reshards after forward (``"always"``).
* Batch: without pipeline parallelism ``local_batch_size`` is the micro-batch and torchtitan accumulates
  ``global / (local x dp)`` micro-batches; with it the local batch is all micro-batches of one step and the pipeline
  splits it into ``pipeline_parallel_microbatch_size`` pieces.
Refused: Ulysses context parallelism, schedules torch has no class for (ZB-H2), V-shaped schedules without exactly
two stages per rank, and partial full recomputation that torchtitan's every-N-th-layer option cannot express.
"""

from __future__ import annotations

from typing import Any

from planner.export._common import (PlanView, read_plan, recompute_counts, refuse_megatron_core_only,
                                    op_sac_note, refuse_recompute_modules, summary_comment, unsupported)

LAUNCHER = "torchtitan"
#: the release this exporter targets, what it writes, and what checks its output (`planner list launchers`)
RELEASE = 'torchtitan 0.2.2'
FORMAT = 'TOML job config'
CHECKED_BY = "its ConfigManager, ParallelDims and torch's pipelining schedules (conformance/)"
#: planner schedule name -> torch.distributed.pipelining schedule name (None: no equivalent)
SCHEDULE_NAMES: dict[str, str | None] = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved-1f1b": "Interleaved1F1B",
    "bfs": "LoopedBFS",
    "zb-h1": "InterleavedZeroBubble",
    "zbv": "ZBVZeroBubble",
    "dualpipev": "DualPipeV",
    "dualpipe": None,  # DeepSeek's bidirectional DualPipe; torch runs its cut-in-half DualPipeV only
    "zb-h2": None,
}
#: schedules whose stages are placed in a V (rank r holds stages r and 2 pp - 1 - r): exactly two per rank
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
#: planner CP kind -> torchtitan's context_parallel_rotate_method; the ring passes K/V shards rank to rank
CP_ROTATE = {"ring": "alltoall"}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def to_toml(sections: dict[str, dict[str, Any]]) -> str:
    """A minimal TOML writer for what exporters produce: tables of booleans, integers, strings and (nested) arrays."""
    out = []
    for name, body in sections.items():
        out.append(f"[{name}]")
        for key, value in body.items():
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple)):
                out.append(f"{key} = [")
                out += [f"  {_toml_value(row)}," for row in value]
                out.append("]")
            else:
                out.append(f"{key} = {_toml_value(value)}")
        out.append("")
    return "\n".join(out)


def stage_modules(layers: tuple[int, ...], head: str = "output") -> list[list[str]]:
    """torchtitan module names of every pipeline stage in model order (Llama naming: tok_embeddings, layers.i,
    norm and the LM head, ``output`` in 0.2, ``lm_head`` in 0.3's common decoder)."""
    parts, start = [], 0
    for i, n in enumerate(layers):
        names = ["tok_embeddings"] if i == 0 else []
        names += [f"layers.{j}" for j in range(start, start + n)]
        start += n
        if i == len(layers) - 1:
            names += ["norm", head]
        parts.append(names)
    return parts


def _activation_checkpoint(view: PlanView) -> dict[str, Any]:
    cfg = view.cfg
    if cfg.recompute == "none":
        return {"mode": "none"}
    if cfg.recompute == "selective":
        return {"mode": "selective", "selective_ac_option": "op"}
    counts, layers = recompute_counts(view), view.layers_per_stage
    if counts == layers:
        return {"mode": "full"}
    if not any(counts):
        return {"mode": "none"}
    # torchtitan's integer option checkpoints every N-th layer: N must give each stage exactly its count
    every = {n // c for n, c in zip(layers, counts) if c}
    if len(every) != 1 or any(c == 0 or n % c for n, c in zip(layers, counts)):
        raise unsupported(LAUNCHER, f"full recomputation of {list(counts)} layers of stages {list(layers)}",
                          "torchtitan checkpoints every N-th layer only; plan with recompute full on all layers or "
                          "a count that divides every stage")
    return {"mode": "selective", "selective_ac_option": str(every.pop())}


def data_parallel_degrees(cfg) -> dict[str, Any]:
    """torchtitan's data-parallel fields (0.2 and 0.3 alike): ZeRO-0 plain replication; ZeRO-1/2/3 FSDP2 over the
    shard group (all of DP, or HSDP's ``dp_shard``) replicated ``dp_replicas`` times, resharding after forward
    for ZeRO-3 only."""
    if cfg.zero_stage == 0:
        return {"data_parallel_replicate_degree": cfg.dp, "data_parallel_shard_degree": 1}
    return {"data_parallel_replicate_degree": cfg.dp_replicas, "data_parallel_shard_degree": cfg.zero_shard_dp,
            "fsdp_reshard_after_forward": "always" if cfg.zero_stage == 3 else "never"}


def check_runs(cfg, launcher: str) -> str | None:
    """Refuse what no torchtitan release runs (Megatron's recompute modules, Ulysses CP, schedules torch has no class
    for, V schedules without two stages per rank); the torch.distributed.pipelining schedule name (None without PP).
    Shared by the 0.2 and 0.3 exporters."""
    refuse_recompute_modules(launcher, cfg)
    if cfg.cp > 1 and cfg.cp_kind not in CP_ROTATE:
        raise unsupported(launcher, f"{cfg.cp_kind} context parallelism (torchtitan's context parallelism is "
                                    "ring attention)", "plan with cp_kind ring or export to megatron")
    if cfg.pp <= 1:
        return None
    name = SCHEDULE_NAMES.get(cfg.schedule)
    if name is None:
        raise unsupported(launcher, f"pipeline schedule '{cfg.schedule}' has no torch.distributed.pipelining class",
                          f"plan with one of: {', '.join(k for k, v in SCHEDULE_NAMES.items() if v)}")
    if name in V_SCHEDULES and cfg.vpp != 2:
        raise unsupported(launcher, f"{name} places exactly two stages per rank, the plan has vpp={cfg.vpp}",
                          "plan with vpp 2")
    return name


def sections(plan: Any, source: str = "<plan>") -> dict[str, dict[str, Any]]:
    """The TOML content as a dict of sections (what ``render`` writes)."""
    view = read_plan(plan, source)
    cfg = view.cfg
    # torchtitan overlaps the MoE all-to-alls of DualPipeV's F&B pairs (pipeline_parallel_expert_parallel_overlap,
    # torchtitan/distributed/pipeline_parallel.py at v0.2.2: DualPipeV only, pp > 1, ep > 1, no checkpointing)
    dualpipev_overlap = cfg.schedule == "dualpipev" and cfg.pp > 1 and cfg.ep > 1
    refuse_megatron_core_only(LAUNCHER, cfg, ep_comm_overlap_runs=dualpipev_overlap)
    if cfg.ep_comm_overlap and cfg.recompute != "none":
        raise unsupported(LAUNCHER, f"the MoE all-to-all overlap of DualPipeV with recompute {cfg.recompute} "
                                    "(torchtitan's pipeline_parallel_expert_parallel_overlap runs without "
                                    "activation checkpointing)", "plan with --recompute none, or export to megatron")
    pipe_name = check_runs(cfg, LAUNCHER)
    training = {"global_batch_size": cfg.global_batch_size, "seq_len": cfg.seq_len}
    # with PP the schedule runs one local batch per step() call; gradient accumulation repeats it (pipeline_flushes)
    training["local_batch_size"] = cfg.micro_batch_size * (cfg.num_microbatches // cfg.pipeline_flushes
                                                           if cfg.pp > 1 else 1)
    par: dict[str, Any] = data_parallel_degrees(cfg)
    par["tensor_parallel_degree"] = cfg.tp
    if cfg.tp_comm_overlap and cfg.tp > 1:
        par["enable_async_tensor_parallel"] = True
    par["context_parallel_degree"] = cfg.cp
    if cfg.cp > 1:
        par["context_parallel_rotate_method"] = CP_ROTATE[cfg.cp_kind]
    par["pipeline_parallel_degree"] = cfg.pp
    if cfg.pp > 1:
        par["pipeline_parallel_schedule"] = pipe_name
        par["pipeline_parallel_microbatch_size"] = cfg.micro_batch_size
        par["module_fqns_per_model_part"] = stage_modules(view.layers_per_stage)
    if view.is_moe:
        # experts sharded by EP and expert TP (as the cost model counts them); torchtitan's ParallelDims (v0.2.2)
        # borrows EP from dp_shard * cp * tp / etp (its efsdp mesh) and runs expert TP = TP or 1
        etp = cfg.expert_tp
        if cfg.ep > 1 and etp not in (1, cfg.tp):
            raise unsupported(LAUNCHER, f"expert TP {etp} with TP {cfg.tp} (torchtitan runs ETP = TP or 1)",
                              "plan with --etp 1 or the TP degree, or export to megatron")
        if (cfg.dp * cfg.cp * cfg.tp) % (cfg.ep * etp) or cfg.zero_stage == 0 and cfg.ep > 1:
            raise unsupported(LAUNCHER, f"ep*etp = {cfg.ep * etp} must divide the FSDP shard group times TP, "
                                        f"dp*cp*tp = {cfg.dp * cfg.cp * cfg.tp}",
                              "plan with ZeRO >= 1 and an EP degree that divides it")
        par["expert_parallel_degree"] = cfg.ep
        par["expert_tensor_parallel_degree"] = cfg.expert_tp
        if dualpipev_overlap:  # torchtitan turns it on by default: say what the plan costed
            par["pipeline_parallel_expert_parallel_overlap"] = bool(cfg.ep_comm_overlap)
    out = {"training": training, "parallelism": par, "activation_checkpoint": _activation_checkpoint(view)}
    if cfg.precision in ("fp8", "mxfp8"):
        # torchao's float8 / MX linear converters; the LM head ("output") stays bf16, as the cost model keeps it
        name = "float8" if cfg.precision == "fp8" else "mx"
        out["model"] = {"converters": [name]}
        out[name] = {"recipe_name": "tensorwise" if cfg.precision == "fp8" else "mxfp8", "filter_fqns": ["output"]}
        if cfg.precision == "fp8" and cfg.zero_stage >= 1:  # FSDP2 all-gathers the fp8 weights (torchao)
            out[name]["enable_fsdp_float8_all_gather"] = bool(cfg.fp8_param_gather)
    elif cfg.precision == "fp16":
        raise unsupported(LAUNCHER, "fp16 mixed precision (torchtitan trains in bf16 with fp32 reductions)",
                          "plan with --precision bf16 or export to megatron")
    return out


def notes(plan: Any, source: str = "<plan>") -> list[str]:
    view = read_plan(plan, source)
    cfg = view.cfg
    out = ["add [model], [optimizer], [lr_scheduler] and [job] sections; module names assume torchtitan's Llama "
           "layout (tok_embeddings, layers.i, norm, output)"]
    if cfg.zero_stage in (1, 2) and cfg.dp > 1:
        out.append(f"ZeRO-{cfg.zero_stage} maps to FSDP2 with fsdp_reshard_after_forward = \"never\" (gradients "
                   "are sharded too; memory is at most the plan's)")
    if cfg.tp > 1 and not cfg.sequence_parallel:
        out.append("torchtitan shards norms and dropout along the sequence with TP (sequence parallel); the plan "
                   "assumed no SP, so activation memory will be lower than estimated")
    if cfg.recompute == "selective":
        out.append(op_sac_note(cfg, "op_sac_v02") + " (selective_ac_option = \"op\")")
    if cfg.tp_comm_overlap and cfg.tp > 1:
        out.append("async tensor parallelism needs torch.compile ([compile] enable = true)")
    return out


def render(plan: Any, source: str = "<plan>") -> str:
    view = read_plan(plan, source)
    body = to_toml(sections(plan, source))
    head = ["# torchtitan job config generated by planner"] + [f"# {line}" for line in summary_comment(view)]
    head += [f"# note: {n}" for n in notes(plan, source)]
    return "\n".join(head) + "\n\n" + body
