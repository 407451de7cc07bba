"""``planner estimate``: evaluate one given configuration."""

from __future__ import annotations

import typer

from planner.cli.app import RUN_OPTIONS, app, choice, console, err, handle_errors, run_option_fields
from planner.cli.lengths import (DYNAMIC_CP, MAX_SEQLEN_PER_RANK, PACKING, SEQ_LEN_DIST, check_length_options,
                                 print_length_tables)
from planner.cli.render import attention_kernel_line, attention_kernel_priced, model_label, print_estimate
from planner.cost.schedule import SCHEDULES
from planner.cost.step import estimate as estimate_config
from planner.errors import PlannerError
from planner.export.spaces import stack_layout_problem
from planner.plan import dumps, plan_dict, request_warnings
from planner.specs.config import (CP_KINDS, DEFAULT_RECOMPUTE_MODULES, EP_DISPATCHERS, OFFLOAD_MODULES, OP_SAC_MODULES,
                                   PRECISIONS, RECOMPUTE_MODES, RECOMPUTE_MODULES, RunConfig, canonical_offload_modules,
                                   canonical_recompute_modules, parse_megatron_layout)
from planner.specs.stack import DEFAULT_STACK, GRAD_REDUCE_DTYPES, load_stack
from planner.validation.bands import band_for


def parse_layers_per_stage(text: str) -> tuple[int, ...]:
    """``--layers-per-stage 7,8,8,7`` as a tuple of non-negative integers, or a Megatron layout string
    (``Et*3|(tt|)*29,m|L``, ``config.parse_megatron_layout``); the count is checked against pp*vpp by the validity
    rules."""
    if any(ch.isalpha() for ch in text):
        try:
            return parse_megatron_layout(text)
        except ValueError as e:
            raise PlannerError(f"not a Megatron pipeline layout: {e}", source="--layers-per-stage",
                               fix="e.g. 'Et*3|(tt|)*29|tL' or a comma list such as 4,4,4,4")
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise PlannerError(f"must be comma-separated whole numbers, got '{text}'", source="--layers-per-stage",
                           fix="e.g. --layers-per-stage 7,8,8,7 (pp*vpp entries in model order)")
    if any(c < 0 for c in counts):
        raise PlannerError(f"layer counts must be >= 0, got '{text}'", source="--layers-per-stage")
    return counts


def parse_offload_modules(text: str | None) -> str:
    """``--offload-modules core_attn,attn_proj`` in canonical form (``config.canonical_offload_modules``)."""
    try:
        return canonical_offload_modules(text or "")
    except ValueError as e:
        raise PlannerError(str(e), source="--offload-modules", fix="e.g. --offload-modules core_attn,attn_proj") \
            from None


def profile_values(items: list[str] | None) -> dict[str, float]:
    """``--profile-set PATH=VALUE`` (repeatable) as {path: value}; one-line errors naming the option."""
    out: dict[str, float] = {}
    for item in items or []:
        path, sep, value = item.partition("=")
        path = path.strip()
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or not path or number is None or not number > 0:
            raise PlannerError(f"not PATH=VALUE with a positive number: '{item}'", source="--profile-set",
                               fix="e.g. --profile-set inter_node.bandwidth_gb_s=12.5")
        if path in out:
            raise PlannerError(f"'{path}' given twice", source="--profile-set", fix="one --profile-set per field")
        out[path] = number
    return out


def parse_recompute_modules(text: str) -> str:
    """``--recompute-modules core_attn,layernorm`` in canonical form (``config.canonical_recompute_modules``)."""
    try:
        return canonical_recompute_modules(text)
    except ValueError as e:
        raise PlannerError(str(e), source="--recompute-modules",
                           fix=f"e.g. --recompute-modules {DEFAULT_RECOMPUTE_MODULES},layernorm") from None


from planner.specs.hardware import ATTENTION_KERNELS, check_attention_kernel, cluster_variant
from planner.specs.model import load_model

ATTENTION_KERNEL_HELP = ("Fused attention kernel whose table prices attention: " + " | ".join(ATTENTION_KERNELS) +
                         " (default: the stack's; the profile must have its table: `planner list clusters --json`)")


@app.command()
@handle_errors
def estimate(
    model: str = typer.Option(..., "--model", help="Shipped model name (see `planner list models`) or a HF config.json"),
    cluster: str = typer.Option(..., "--cluster", help="Shipped hardware profile name or a profile JSON path"),
    gpus: int = typer.Option(..., "--gpus", help="Total GPUs"),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree"),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree"),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree"),
    cp_kind: str = typer.Option("ring", "--cp-kind", help="Context parallelism: ring (Megatron CP) | ulysses"),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree (MoE models; ep x etp divides tp x cp x dp)"),
    etp: int = typer.Option(None, "--etp", help="Expert tensor-parallel degree (MoE models; default: --tp)"),
    dp_shard: int = typer.Option(None, "--dp-shard", help="HSDP: ZeRO shards over groups of this many data-parallel "
                                                          "ranks, replicated across the rest of DP (default: all)"),
    vpp: int = typer.Option(1, "--vpp", help="Virtual pipeline stages (model chunks) per pipeline rank"),
    global_batch: int = typer.Option(..., "--global-batch", help="Global batch size in sequences"),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Micro-batch size in sequences"),
    seq_len: int = typer.Option(2048, "--seq-len", help="Sequence length in tokens"),
    recompute: str = typer.Option("selective", "--recompute", help="none | selective | full"),
    recompute_modules: str = typer.Option(None, "--recompute-modules",
                                          help="What --recompute selective redoes: Megatron-Core's "
                                               "--recompute-modules, a comma list of " +
                                               ", ".join(m for m in RECOMPUTE_MODULES if m not in OP_SAC_MODULES) +
                                               "; or torchtitan's per-op policy, op_sac (0.3) or op_sac_v02 (0.2) "
                                               "[default: the stack's: core_attn, torchtitan op_sac_v02]"),
    sequence_parallel: bool = typer.Option(True, "--sequence-parallel/--no-sequence-parallel"),
    zero: int = typer.Option(1, "--zero", help="ZeRO stage 0 | 1 | 2 | 3"),
    schedule: str = typer.Option("1f1b", "--schedule", help="Pipeline schedule (see `planner list schedules`)"),
    precision: str = typer.Option("bf16", "--precision",
                                  help="GEMM precision of the linear layers: bf16 | fp16 | fp8 | mxfp8 (fp8 needs "
                                       "Hopper/Ada/MI300 or newer, mxfp8 Blackwell)"),
    layers_per_stage: str = typer.Option(None, "--layers-per-stage",
                                         help="Layers of each of the pp*vpp stages in model order, e.g. 7,8,...,8,7, "
                                              "or Megatron's --pipeline-model-parallel-layout string "
                                              "(default: as even as possible)"),
    stack: str = typer.Option(DEFAULT_STACK, "--stack",
                              help="Training stack whose runtime options apply (see `planner list stacks`; default "
                                   f"{DEFAULT_STACK}, as NeMo / Megatron-Bridge run it); the flags below override one"),
    flash_attention: bool = typer.Option(None, "--flash-attention/--no-flash-attention",
                                         help="Fused attention kernel (2021-22 Megatron ran without)"),
    overlap_grad_reduce: bool = typer.Option(None, "--overlap-grad-reduce/--no-overlap-grad-reduce",
                                             help="Overlap the DP gradient reduction with backward"),
    overlap_param_gather: bool = typer.Option(None, "--overlap-param-gather/--no-overlap-param-gather",
                                              help="Overlap the ZeRO parameter all-gather with forward"),
    tp_comm_overlap: bool = typer.Option(None, "--tp-comm-overlap/--no-tp-comm-overlap",
                                         help="Overlap TP collectives with GEMMs (Megatron --tp-comm-overlap; needs SP)"),
    ep_comm_overlap: bool = typer.Option(False, "--ep-comm-overlap/--no-ep-comm-overlap",
                                         help="Hide one micro-batch's MoE all-to-alls under another's compute "
                                              "(Megatron --overlap-moe-expert-parallel-comm; DualPipe's pairing)"),
    grad_reduce_dtype: str = typer.Option(None, "--grad-reduce-dtype",
                                          help="Dtype of the DP gradient reduction: bf16 | fp32"),
    attention_kernel: str = typer.Option(None, "--attention-kernel", help=ATTENTION_KERNEL_HELP),
    profile_set: list[str] = typer.Option(None, "--profile-set",
                                          help="PATH=VALUE: one numeric field of the cluster's profile replaced, "
                                               "e.g. inter_node.bandwidth_gb_s=12.5 for a 100 Gb/s NIC per GPU "
                                               "(repeatable; the paths `planner sweep --vary` takes)"),
    per_expert_gemm_calls: bool = typer.Option(None, "--per-expert-gemm-calls/--grouped-expert-gemm",
                                               help="MoE: the stack issues one GEMM per local expert from the host "
                                                    "(Megatron-Core + Transformer Engine) or one grouped kernel "
                                                    "(torchtitan's torch._grouped_mm); default: the stack's"),
    fp8_param_gather: bool = typer.Option(None, "--fp8-param-gather/--no-fp8-param-gather",
                                          help="fp8 runs: the linear weights kept and all-gathered in fp8 by the "
                                               "sharded optimizer / FSDP (Megatron --fp8-param-gather; default: the "
                                               "stack's)"),
    moe_load_factor: float = RUN_OPTIONS["moe_load_factor"], act_fp8_store: bool = RUN_OPTIONS["act_fp8_store"],
    adam_moments: str = RUN_OPTIONS["adam_moments"], comm_reserved_sms: int = RUN_OPTIONS["comm_reserved_sms"],
    te_fp8_weights: bool = typer.Option(None, "--te-fp8-weights/--no-te-fp8-weights",
                                        help="fp8 / mxfp8 memory: the linear weights held as Transformer Engine "
                                             "holds them (quantized parameters with --fp8-param-gather, else a "
                                             "quantized copy beside the bf16 weight, kept across micro-batches) or "
                                             "quantized per use and freed (torchao); default: the stack's"),
    overlap_p2p_comm: bool = typer.Option(None, "--overlap-p2p-comm/--no-overlap-p2p-comm",
                                          help="Interleaved schedule: pipeline sends under the next chunk's compute "
                                               "(Megatron-Core's default; --no-overlap-p2p-communication turns it "
                                               "off); default: the stack's"),
    ep_dispatcher: str = typer.Option(None, "--ep-dispatcher",
                                      help="MoE token dispatcher: alltoall (every token copy over the EP all-to-all) "
                                           "| deepep | hybridep (Megatron's flex dispatcher: a token crosses the "
                                           "network once per remote node); default: the stack's"),
    pipeline_flushes: int = typer.Option(1, "--pipeline-flushes",
                                         help="Gradient-accumulation passes per step, each its own run of the "
                                              "pipeline schedule (torchtitan / NeMo AutoModel with PP: the step's "
                                              "micro-batches / local batch); 1: one schedule over the step "
                                              "(Megatron-Core)"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables"),
    fused_cross_entropy: bool = typer.Option(True, "--fused-cross-entropy/--no-fused-cross-entropy",
                                             help="Loss cross-entropy fused (Megatron --cross-entropy-loss-fusion) "
                                                  "or Megatron-Core's unfused passes"),
    offload_layers: int = typer.Option(0, "--offload-layers", help="Layers whose activations go to host memory "
                                                                   "(Megatron-Core --cpu-offloading-num-layers; "
                                                                   "pp 1, no recompute)"),
    require_fit: bool = typer.Option(False, "--require-fit", help="Exit 1 when the configuration does not fit in "
                                                                  "memory (the estimate is still printed)"),
    offload_modules: str = typer.Option("", "--offload-modules",
                                        help="Megatron-Core fine-grained activation offloading: module inputs every "
                                             "layer sends to host memory (comma list of " +
                                             ", ".join(OFFLOAD_MODULES) + "; any PP, no full recompute)"),
    seq_len_dist: str = SEQ_LEN_DIST, packing: bool = PACKING, dynamic_cp: bool = DYNAMIC_CP,
    max_seqlen_per_rank: int = MAX_SEQLEN_PER_RANK,
) -> None:
    """Estimate step time, throughput, MFU and per-stage memory of one configuration (DP = gpus / (tp*pp*cp))."""
    choice(recompute, RECOMPUTE_MODES, "--recompute")
    choice(schedule, tuple(SCHEDULES), "--schedule")
    choice(cp_kind, CP_KINDS, "--cp-kind")
    if zero not in (0, 1, 2, 3):
        raise PlannerError(f"unknown ZeRO stage {zero}", source="--zero", fix="use 0, 1, 2 or 3")
    for name, value in (("--gpus", gpus), ("--tp", tp), ("--pp", pp), ("--cp", cp), ("--ep", ep), ("--vpp", vpp),
                        ("--global-batch", global_batch), ("--micro-batch", micro_batch), ("--seq-len", seq_len)):
        if value < 1:
            raise PlannerError(f"must be >= 1, got {value}", source=name)
    choice(precision, PRECISIONS, "--precision")
    if grad_reduce_dtype is not None:
        choice(grad_reduce_dtype, tuple(GRAD_REDUCE_DTYPES), "--grad-reduce-dtype")
    if ep_dispatcher is not None:
        choice(ep_dispatcher, EP_DISPATCHERS, "--ep-dispatcher")
    dist = check_length_options(seq_len_dist, packing, dynamic_cp, max_seqlen_per_rank)
    split = parse_layers_per_stage(layers_per_stage) if layers_per_stage is not None else None
    offload = parse_offload_modules(offload_modules)
    run_stack = load_stack(stack)
    # not given: the stack's own selective recomputation (torchtitan's per-op policy), which applies to selective
    # recomputation only
    if recompute_modules is not None and recompute != "selective":
        raise PlannerError("recompute modules apply to selective recomputation", source="--recompute-modules",
                           fix="add --recompute selective or drop --recompute-modules")
    modules = parse_recompute_modules(recompute_modules) if recompute_modules is not None else \
        run_stack.recompute_modules if recompute == "selective" else DEFAULT_RECOMPUTE_MODULES
    spec = load_model(model)
    base = cluster_variant(cluster, profile_values(profile_set), "--profile-set")
    hw = run_stack.on_cluster(base)  # the stack release's expert GEMM issue times, if its own
    if attention_kernel is not None:
        check_attention_kernel(hw.gpu, hw.name, attention_kernel)
    cfg = RunConfig(num_gpus=gpus, tp=tp, pp=pp, cp=cp, cp_kind=cp_kind, ep=ep, vpp=vpp, global_batch_size=global_batch,
                    micro_batch_size=micro_batch, seq_len=seq_len, recompute=recompute,
                    sequence_parallel=sequence_parallel and tp > 1, zero_stage=zero, schedule=schedule,
                    precision=precision, layers_per_stage=split, etp=etp, dp_shard=dp_shard, recompute_modules=modules,
                    ep_comm_overlap=ep_comm_overlap, offload_layers=offload_layers, offload_modules=offload,
                    fused_cross_entropy=fused_cross_entropy, pipeline_flushes=pipeline_flushes,
                    **run_option_fields(adam_moments, act_fp8_store, moe_load_factor, run_stack, spec.gated_mlp,
                                       comm_reserved_sms))
    cfg = run_stack.apply(cfg, flash_attention=flash_attention, overlap_grad_reduce=overlap_grad_reduce,
                          overlap_param_gather=overlap_param_gather, tp_comm_overlap=tp_comm_overlap,
                          grad_reduce_bytes=GRAD_REDUCE_DTYPES.get(grad_reduce_dtype),
                          attention_kernel=attention_kernel, per_expert_gemm_calls=per_expert_gemm_calls,
                          fp8_param_gather=fp8_param_gather, te_quantized_weights=te_fp8_weights,
                          overlap_p2p_comm=overlap_p2p_comm,
                          ep_dispatcher=ep_dispatcher)
    est = estimate_config(spec, hw, cfg)
    data = None
    if dist is not None:
        from planner.cli.render import layout_label
        from planner.cost.variable_length import dynamic_cp as dynamic_estimate, length_aware_estimate
        from planner.lengths_plan import data_section

        aware = length_aware_estimate(spec, hw, cfg, dist, packing)
        dyn = (cfg, dynamic_estimate(spec, hw, cfg, dist, max_seqlen_per_rank)) if dynamic_cp else None
        data = data_section(dist, packing, aware, dyn, layout_label)
        est = aware.estimate
        if packing:
            from planner.cost.variable_length import packed_config
            cfg = packed_config(cfg, dist)
    accuracy = band_for(hw.gpu.name, cfg.precision, spec.is_moe, cfg.cp > 1, cfg.cp_kind,
                        vision=spec.vision_layers > 0, model_type=spec.model_type).to_dict()
    warnings = request_warnings(spec, cfg, hw.gpu)
    problem = stack_layout_problem(run_stack, cfg)
    if problem is not None:
        warnings.append(f"stack {run_stack.name} does not run {problem} (--stack): the estimate prices the layout as "
                        f"the cost model would; `planner plan --stack {run_stack.name}` searches what it runs, or name "
                        f"a stack that runs this one (`planner list stacks`)")
    for warning in warnings:
        err(f"warning: {warning}")
    if json_out:
        typer.echo(dumps({**plan_dict(spec, hw.name, cfg, est), "stack": run_stack.name,
                          "attention_kernel_priced": attention_kernel_priced(hw.gpu, cfg), "accuracy": accuracy,
                          **({"warnings": warnings} if warnings else {}),
                          **({"data": data} if data is not None else {})}), nl=False)
    else:
        print_estimate(console(), est, cfg, f"{model_label(spec, seq_len)} on {gpus} x {hw.gpu.name} ({hw.name}), "
                                            f"stack {run_stack.name}", accuracy, attention_kernel_line(hw.gpu, cfg))
        if data is not None:
            print_length_tables(console(), data)
    if require_fit and not est.fits:
        err(f"error: --require-fit: does not fit: peak {est.peak_memory_gib:.1f} GiB per GPU of "
            f"{est.memory_limit_bytes / 2**30:.1f} GiB usable (try more recomputation, ZeRO or more GPUs)")
        raise typer.Exit(1)
