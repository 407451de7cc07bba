"""Megatron-LM ``pretrain_gpt.py`` arguments for a plan.

Key names follow Megatron-LM's argument parser (``megatron/training/arguments.py``): parallel degrees
(``--tensor-model-parallel-size`` ...), virtual stages (``--num-layers-per-virtual-pipeline-stage``), uneven pipeline
splits (``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, or the general
``--pipeline-model-parallel-layout``), recomputation (``--recompute-granularity/-method/-num-layers``), ZeRO
(``--use-distributed-optimizer``; ZeRO-2/3 through Megatron FSDP's ``--data-parallel-sharding-strategy``) and the
overlap flags.

Refused, because Megatron-LM has no equivalent: pipeline schedules other than 1F1B and interleaved 1F1B (GPipe,
looped BFS, the zero-bubble family, DualPipe and DualPipeV; ``--delay-wgrad-compute`` only defers weight gradients to overlap
MoE all-to-all in the combined 1F1B schedule, it does not fill the pipeline bubble), and ZeRO-2/3 together with
pipeline parallelism (Megatron FSDP shards over the data-parallel group of a model without pipeline stages).
"""

from __future__ import annotations

import itertools
import shlex
from typing import Any

from planner.specs.config import DEFAULT_RECOMPUTE_MODULES
from planner.export._common import (PlanView, first_last_split, read_plan, recompute_counts,
                                    refuse_pipeline_flushes, refuse_recompute_modules, summary_comment,
                                    uniform_recompute_count, unsupported)

LAUNCHER = "megatron"
#: the release this exporter targets, what it writes, and what checks its output (`planner list launchers`)
RELEASE = 'Megatron-LM main (megatron/training/arguments.py; Megatron Core 0.16)'
FORMAT = 'bash array of pretrain_gpt.py arguments + environment'
CHECKED_BY = 'Megatron-Core 0.16.1 TransformerConfig / DistributedDataParallelConfig (conformance/) and the names of arguments.py (tests/test_export.py)'
#: planner schedule name -> how Megatron-LM runs it (None: it cannot)
SCHEDULE_SUPPORT: dict[str, str | None] = {
    "1f1b": "1F1B (forward_backward_pipelining_without_interleaving)",
    "interleaved-1f1b": "interleaved 1F1B (virtual pipeline stages)",
    "gpipe": None,
    "bfs": None,
    "zb-h1": None,
    "zb-h2": None,
    "zbv": None,
    "dualpipe": None,
    "dualpipev": None,
}
#: ZeRO stage -> Megatron FSDP data-parallel sharding strategy (ZeRO-1 is the distributed optimizer)
FSDP_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
CP_COMM_TYPE = {"ring": "p2p", "ulysses": "a2a"}


def check_plan(view: PlanView) -> None:
    """Refuse what Megatron Core cannot run (shared with the Megatron-Bridge exporter, ``planner.export.nemo``)."""
    cfg = view.cfg
    if cfg.pp > 1 and SCHEDULE_SUPPORT.get(cfg.schedule) is None:
        raise unsupported(LAUNCHER, f"pipeline schedule '{cfg.schedule}' (Megatron-LM runs only 1F1B and "
                                    f"interleaved 1F1B)",
                          "export to torchtitan, which has GPipe, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble "
                          "and DualPipeV, or plan with schedule 1f1b / interleaved-1f1b")
    if view.hybrid_cp_max_per_rank is not None and (cfg.pp > 1 or cfg.zero_stage >= 2):
        raise unsupported(LAUNCHER, "hybrid context parallelism with pipeline parallelism or Megatron-FSDP "
                                    "(validate_args refuses both)", "plan with --dynamic-cp, which keeps PP 1 and "
                                                                    "ZeRO 0-1")
    refuse_pipeline_flushes(LAUNCHER, cfg)
    if cfg.zero_stage >= 2 and cfg.pp > 1:
        raise unsupported(LAUNCHER, f"ZeRO-{cfg.zero_stage} with pipeline parallelism (pp={cfg.pp}); Megatron "
                                    "FSDP does not combine with pipeline stages",
                          "plan with ZeRO-1 (--use-distributed-optimizer) or without pipeline parallelism")
    if cfg.adam_moment_bytes != 4 and cfg.zero_stage == 0:  # megatron/core/optimizer/__init__.py: "only supported
        # with distributed optimizer" (Megatron-FSDP v1 brings its own)
        raise unsupported(LAUNCHER, "bf16 Adam moments without the distributed optimizer (Megatron-Core runs the "
                                    "precision-aware optimizer only with it)", "plan with --zero 1, 2 or 3")


def layout_string(layers: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout``: one '|'-separated entry per model chunk in model order (Megatron deals
    chunk i to pipeline rank i mod pp); E = embedding, t*N = N decoder layers, L = loss (final norm + LM head)."""
    parts = []
    for i, n in enumerate(layers):
        item = "E" if i == 0 else ""
        if n:
            item += "t" if n == 1 else f"t*{n}"
        if i == len(layers) - 1:
            item += "L"
        parts.append(item)
    return "|".join(parts)


def hybrid_pattern(pattern: str, layers: tuple[int, ...] | None) -> str:
    """``--hybrid-layer-pattern`` of a hybrid model: its symbols (M Mamba, * attention, - MLP, E MoE), with a '|'
    between the model chunks of a pipeline split (pp x vpp segments in model order; Megatron-Core's flexible
    virtual pipeline parallelism deals segment i to pipeline rank i mod pp and derives vpp from their count,
    megatron/core/models/hybrid/hybrid_layer_allocation.py). ``layers``: layers per chunk, None for no split."""
    if not layers or len(layers) == 1:
        return pattern
    cuts = [0]
    for n in layers:
        cuts.append(cuts[-1] + n)
    return "|".join(pattern[a:b] for a, b in zip(cuts, cuts[1:]))


def _hybrid_args(view: PlanView) -> list[str]:
    """A hybrid model's shape arguments (pretrain_hybrid.py): the pattern (with its pipeline split), the Mamba-2
    mixer's TransformerConfig fields (``--mamba-state-dim`` ...), squared-ReLU MLPs and no position embeddings
    (Nemotron-H)."""
    m, cfg = view.model, view.cfg
    args = ["--hybrid-layer-pattern", hybrid_pattern(m.layer_pattern, view.layers_per_stage if cfg.pp > 1 else None)]
    if m.mamba_heads:
        args += ["--mamba-num-heads", str(m.mamba_heads), "--mamba-head-dim", str(m.mamba_head_dim),
                 "--mamba-state-dim", str(m.mamba_state_dim), "--mamba-num-groups", str(m.mamba_groups)]
    if not m.gated_mlp:
        args.append("--squared-relu")
    return args


def _model_args(view: PlanView) -> list[str]:
    m = view.model
    if m is None:
        return []
    cfg = view.cfg
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_heads)]
    if m.num_kv_heads != m.num_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    if m.head_dim and m.head_dim != m.hidden_size // m.num_heads:
        args += ["--kv-channels", str(m.head_dim)]
    args += ["--seq-length", str(cfg.seq_len), "--max-position-embeddings", str(max(m.max_seq_len, cfg.seq_len))]
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if m.gated_mlp:
        args.append("--swiglu")
    if m.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if not m.rotary_positions:
        args += ["--position-embedding-type", "none"]
    elif not m.learned_positions:
        args += ["--position-embedding-type", "rope"]
    if not (m.linear_bias or m.mlp_bias):
        args.append("--disable-bias-linear")
    args += window_args(m)
    if not m.dropout:
        args += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    if m.is_moe:
        args += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.experts_per_token),
                 "--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size),
                 # what the plan costs: its token dispatcher (planner.cost.moe: alltoall, or the flex dispatcher's
                 # DeepEP / HybridEP backend) and Transformer Engine's grouped GEMM over the local experts
                 # (compute.ffn_ops); Megatron-Core's defaults are the all-gather dispatcher and one GEMM per
                 # expert, and its --overlap-moe-expert-parallel-comm and moe_act recomputation need these
                 # (TransformerConfig.__post_init__)
                 *dispatcher_args(cfg.ep_dispatcher), "--moe-grouped-gemm"]
        if m.experts_per_token == 1:  # TransformerConfig: "Please use --moe-router-pre-softmax when topk is 1"
            args.append("--moe-router-pre-softmax")
        if m.num_shared_experts:
            args += ["--moe-shared-expert-intermediate-size", str(m.num_shared_experts * m.moe_ffn_hidden_size)]
        if (m.first_k_dense_layers or m.moe_layer_pattern) and not m.layer_pattern:
            args += ["--moe-layer-freq", moe_layer_freq(m)]
    if m.is_mla:
        args.append("--multi-latent-attention")
        if m.q_lora_rank:
            args += ["--q-lora-rank", str(m.q_lora_rank)]
        args += ["--kv-lora-rank", str(m.kv_lora_rank)]
    if m.layer_pattern:
        args += _hybrid_args(view)
    return args


def dispatcher_fields(dispatcher: str) -> dict[str, str]:
    """Megatron-Core's TransformerConfig token-dispatcher fields for a plan's ``ep_dispatcher``: the all-to-all
    dispatcher, or the flex dispatcher with its backend (moe_token_dispatcher_type / moe_flex_dispatcher_backend)."""
    if dispatcher == "alltoall":
        return {"moe_token_dispatcher_type": "alltoall"}
    return {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": dispatcher}


def dispatcher_args(dispatcher: str) -> list[str]:
    """Megatron-LM's arguments for :func:`dispatcher_fields`."""
    return [x for k, v in dispatcher_fields(dispatcher).items() for x in ("--" + k.replace("_", "-"), v)]


def layer_list_expression(bits: list[int]) -> str:
    """A per-layer 0 / 1 list as the Python list expression Megatron-LM's ``moe_freq_type`` evaluates
    (megatron/training/arguments.py: ``--moe-layer-freq``, ``--window-attn-skip-freq``): the shortest repeating unit
    times its count where there is one (``([0,1]*24)``), else the runs (``([0]*3+[1]*58)``)."""
    words, L = [str(int(b)) for b in bits], len(bits)
    for p in range(1, L // 2 + 1):
        if L % p == 0 and words == words[:p] * (L // p):
            return f"([{','.join(words[:p])}]*{L // p})"
    runs = [(b, len(list(g))) for b, g in itertools.groupby(words)]
    return "(" + "+".join(f"[{b}]*{n}" for b, n in runs) + ")"


def every_nth(marked: list[bool]) -> int | None:
    """N where exactly every N-th layer (1-indexed: layers N, 2N, ...) is marked, as Megatron-LM's integer forms of
    ``--window-attn-skip-freq`` and ``--no-rope-freq`` mean; None where the marks follow no such period."""
    L = len(marked)
    return next((n for n in range(1, L + 1) if L % n == 0 and marked == ([False] * (n - 1) + [True]) * (L // n)),
                None)


def moe_layer_freq(model) -> str:
    """Megatron-LM's ``--moe-layer-freq`` (1 a MoE layer, 0 a dense one, per layer): Llama 4 Maverick
    ``([0,1]*24)``, DeepSeek-V3 ``([0]*3+[1]*58)``."""
    return layer_list_expression(list(model.kind_index))


def window_args(model) -> list[str]:
    """Sliding-window attention as the plan costs it: ``--window-size W,0`` (Transformer Engine's (left, right)
    window, as Megatron-Bridge's gpt-oss provider writes window_size=(128, 0) for a 128-token sliding_window) and,
    where some layers attend globally, ``--window-attn-skip-freq`` (megatron/core/transformer/utils.py
    is_layer_window_attention: N = every N-th layer global; a list = 1 where the layer is windowed). Llama 4's
    chunked attention, which the cost model counts as a window, has no Megatron-Core equivalent and is not written;
    its global layers, which run without RoPE (transformers' no_rope_layers), are ``--no-rope-freq``
    (TransformerConfig.no_rope_freq: N = every N-th layer skips RoPE, else a per-layer list, 1 = skipped)."""
    if model.model_type in ("llama4", "llama4_text"):
        nope = [c == "G" for c in model.attention_pattern]
        if not any(nope):
            return []
        every = every_nth(nope)
        return ["--no-rope-freq", str(every) if every else layer_list_expression(nope)]
    if not model.sliding_window:
        return []
    pattern = model.attention_pattern or ("L" * model.num_layers
                                          if model.sliding_window_layers == model.num_layers else "")
    if len(pattern) != model.num_layers:
        raise unsupported(LAUNCHER, f"sliding-window attention on {model.sliding_window_layers} of "
                                    f"{model.num_layers} layers without their positions",
                          "give layer_types in the model's config.json")
    args = ["--window-size", f"{model.sliding_window},0"]
    if "G" in pattern:
        every = every_nth([c == "G" for c in pattern])
        args += ["--window-attn-skip-freq",
                 str(every) if every else layer_list_expression([c == "L" for c in pattern])]
    return args


def arguments(plan: Any, source: str = "<plan>") -> list[str]:
    """The plan as a list of ``pretrain_gpt.py`` arguments (flags and values as separate items)."""
    view = read_plan(plan, source)
    check_plan(view)
    cfg = view.cfg
    if cfg.activation_fp8_input_store:  # megatron/training/arguments.py excludes it from TransformerConfig's flags
        raise unsupported(LAUNCHER, "the SwiGLU fp8 input store (TransformerConfig.activation_func_fp8_input_store "
                                    "has no Megatron-LM command-line flag)",
                          "export to nemo (Megatron-Bridge's model config sets it), or plan without "
                          "--activation-fp8-input-store")
    args = ["--tensor-model-parallel-size", str(cfg.tp), "--pipeline-model-parallel-size", str(cfg.pp),
            "--context-parallel-size", str(cfg.cp)]
    if cfg.cp > 1:
        args += ["--cp-comm-type", CP_COMM_TYPE[cfg.cp_kind]]
    if cfg.sequence_parallel and cfg.tp > 1:
        args.append("--sequence-parallel")
    if view.is_moe:
        args += ["--expert-model-parallel-size", str(cfg.ep), "--expert-tensor-parallel-size", str(cfg.expert_tp)]
    # pipeline split: even chunks need no flag (interleaving needs the chunk size); uneven ones are spelled out
    layers = view.layers_per_stage
    hybrid = view.model is not None and bool(view.model.layer_pattern)
    if cfg.pp > 1 and not hybrid:  # (a hybrid model's split is its pattern's '|' segments: _hybrid_args)
        if view.even_split:
            if cfg.vpp > 1:
                args += ["--num-layers-per-virtual-pipeline-stage", str(layers[0])]
        elif cfg.vpp == 1 and first_last_split(layers) is not None:
            first, last = first_last_split(layers)
            args += ["--decoder-first-pipeline-num-layers", str(first), "--decoder-last-pipeline-num-layers",
                     str(last)]
        else:
            args += ["--pipeline-model-parallel-layout", layout_string(layers)]
    args += ["--micro-batch-size", str(cfg.micro_batch_size), "--global-batch-size", str(cfg.global_batch_size)]
    if view.model is None:
        args += ["--seq-length", str(cfg.seq_len)]
    if cfg.pp > 1 and cfg.vpp > 1 and not cfg.overlap_p2p_comm:  # on by default with virtual stages
        args.append("--no-overlap-p2p-communication")
    if cfg.ep_comm_overlap:  # the batch-level EP overlap needs the split weight-gradient pass
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    # recomputation
    refuse_recompute_modules(LAUNCHER, cfg)
    if cfg.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
        if cfg.recompute_modules != DEFAULT_RECOMPUTE_MODULES:  # Megatron-Core's default is core_attn
            args += ["--recompute-modules", *cfg.recompute_modules.split(",")]
    elif cfg.recompute == "full":
        k = uniform_recompute_count(view)
        if k is False:
            raise unsupported(LAUNCHER, f"a different number of recomputed layers per stage "
                                        f"({list(recompute_counts(view))})",
                              "Megatron-LM's --recompute-num-layers is one number for every stage; plan with one "
                              "recompute count")
        if k is None:  # every layer is its own recompute unit
            args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        elif k:  # the first k layers of every chunk are recomputed, the others keep their activations (k = 0: none)
            args += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
                     str(k)]
    # data parallelism / ZeRO and overlap
    if cfg.zero_stage == 1:
        args.append("--use-distributed-optimizer")
    elif cfg.zero_stage in FSDP_SHARDING:  # validate_args: "Megatron-FSDP requires the fsdp_dtensor checkpointing
        # format"
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_SHARDING[cfg.zero_stage],
                 "--ckpt-format", "fsdp_dtensor"]
    if cfg.dp_shard is not None and cfg.dp_replicas > 1:  # HSDP: copies of the distributed optimizer / FSDP shards
        args += ["--num-distributed-optimizer-instances", str(cfg.dp_replicas)]
    if cfg.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if cfg.overlap_param_gather and cfg.zero_stage == 1:
        args.append("--overlap-param-gather")
    if cfg.tp_comm_overlap and cfg.tp > 1:
        args.append("--tp-comm-overlap")
    if cfg.grad_reduce_bytes == 4:
        args.append("--accumulate-allreduce-grads-in-fp32")
    elif cfg.precision != "fp16":  # with --bf16 Megatron reduces in fp32 unless told otherwise
        args.append("--grad-reduce-in-bf16")
    if cfg.adam_moment_bytes == 2:  # the precision-aware optimizer keeps Adam's moments in bf16
        args += ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    if cfg.fused_cross_entropy:  # off by default in Megatron-LM: the plan was costed with the fused loss
        args.append("--cross-entropy-loss-fusion")
    if fp8_param_gather(cfg):  # validate_args: only with the distributed optimizer or FSDP
        args.append("--fp8-param-gather")
        if cfg.precision == "mxfp8":  # DistributedDataParallelConfig: MXFP8 params gathered in the grad buffer
            args.append("--reuse-grad-buf-for-mxfp8-param-ag")
    if attention_backend(cfg) is not None:  # the kernel the plan was costed with, not TE's own pick
        args += ["--attention-backend", attention_backend(cfg)]
    if cfg.offload_layers:  # arguments.py: a count > 0 turns cpu_offloading on (activations only by default)
        args += ["--cpu-offloading-num-layers", str(cfg.offload_layers)]
    if cfg.offload_modules:  # TransformerConfig.fine_grained_activation_offloading / offload_modules (a list)
        args += ["--fine-grained-activation-offloading", "--offload-modules", *cfg.offload_modules.split(",")]
    if view.hybrid_cp_max_per_rank is not None:  # validate_args: per-token loss and the single data loader
        args += ["--hybrid-context-parallel", "--max-seqlen-per-dp-cp-rank", str(view.hybrid_cp_max_per_rank),
                 "--calculate-per-token-loss", "--dataloader-type", "single"]
    args += _model_args(view)
    args += precision_args(cfg)
    return args


#: Megatron-Core's attention backend (``--attention-backend``, TransformerConfig.attention_backend, an AttnBackend
#: name) for the kernel the plan was costed with: Transformer Engine's FusedAttention is cuDNN's kernel, its
#: FlashAttention backend runs the flash-attn package (FlashAttention-3 on Hopper where flash-attn 3 is installed,
#: else FlashAttention-2: transformer_engine/pytorch/attention/dot_product_attention/utils.py)
ATTENTION_BACKEND = {"cudnn": "fused", "cudnn-9.0": "fused", "flash-attention-2": "flash", "flash-attention-3": "flash"}


def attention_backend(cfg) -> str | None:
    """The AttnBackend name a plan's attention was costed with: ``unfused`` without a fused kernel, the named
    kernel's backend, None (Megatron's ``auto``, Transformer Engine's own pick) when the plan names none."""
    if not cfg.flash_attention:
        return "unfused"
    return ATTENTION_BACKEND.get(cfg.attention_kernel)


def fp8_param_gather(cfg) -> bool:
    """Whether the export keeps the weights in fp8 and gathers them so (Megatron ``--fp8-param-gather``): the plan's
    ``fp8_param_gather`` for an fp8 / mxfp8 run whose weights are gathered at all (distributed optimizer or FSDP:
    Megatron-LM's validate_args refuses it otherwise)."""
    return bool(cfg.fp8_param_gather) and cfg.precision in ("fp8", "mxfp8") and cfg.zero_stage >= 1


def current_scaling_needed(cfg) -> bool:
    """fp8 with moe_act or layernorm recomputation: Megatron-Core refuses delayed scaling with them
    (TransformerConfig.__post_init__: 'Delayed scaling does not support moe_act and layernorm recompute'), so the
    export takes per-tensor current scaling, what Megatron-Bridge's fp8_cs recipes run."""
    return cfg.precision == "fp8" and cfg.recompute == "selective" and bool(
        {"moe_act", "layernorm"} & set(cfg.recompute_modules.split(",")))


def precision_args(cfg) -> list[str]:
    """:data:`PRECISION_ARGS` of the plan's precision, with current scaling where :func:`current_scaling_needed`."""
    args = list(PRECISION_ARGS[cfg.precision])
    if current_scaling_needed(cfg):
        args[args.index("delayed")] = "tensorwise"
    return args


#: Megatron-LM arguments of each GEMM precision (megatron/training/arguments.py: --fp8-format, --fp8-recipe); fp8
#: and mxfp8 keep bf16 parameters and run Transformer Engine's linear layers in fp8
PRECISION_ARGS = {"bf16": ["--bf16"], "fp16": ["--fp16"],
                  "fp8": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "delayed"],
                  "mxfp8": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]}


def notes(plan: Any, source: str = "<plan>") -> list[str]:
    view = read_plan(plan, source)
    out = ["add data, tokenizer, optimizer and checkpoint arguments; the vocabulary size comes from the tokenizer"]
    if view.model is None:
        out.append("the plan has no model_spec: add the model shape arguments (--num-layers, --hidden-size, ...)")
    if view.model is not None and view.model.layer_pattern:
        out.append("a hybrid model: launch pretrain_hybrid.py with these arguments (not pretrain_gpt.py); "
                   "--hybrid-layer-pattern carries the pipeline split")
    if view.model is not None and view.model.is_mla:
        out.append("multi-latent attention: also set --qk-head-dim, --qk-pos-emb-head-dim and --v-head-dim from the "
                   "model config")
    if not view.cfg.flash_attention:
        out.append("the plan assumes an unfused attention kernel (flash_attention = false)")
    if view.cfg.flash_attention and view.cfg.attention_kernel.startswith("flash-attention"):
        out.append(f"the plan was costed with {view.cfg.attention_kernel}: --attention-backend flash runs the "
                   "flash-attn package Transformer Engine finds (FlashAttention-3 on Hopper needs flash-attn 3 "
                   "installed)")
    if view.hybrid_cp_max_per_rank is not None:
        out.append("hybrid context parallelism schedules each sample of the global batch on its own CP group: give "
                   "it variable-length samples (e.g. --sft-sequence-packing), not fixed-length ones")
    return out


def environment(plan: Any, source: str = "<plan>") -> dict[str, str | None]:
    """Environment variables Megatron-LM's ``validate_args`` requires of this plan (None: must be unset):
    CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP (before Blackwell, so that the communication kernels are queued
    first), unset for Megatron FSDP ("FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset") and larger for the
    MoE all-to-all overlap (its own warning: 1 or 32; 32 lets the overlap run); NVTE_CPU_OFFLOAD_V1=1 with
    fine-grained activation offloading (asserted with Transformer Engine >= 2.10)."""
    cfg = read_plan(plan, source).cfg
    # validate_args: fine-grained offloading with Transformer Engine >= 2.10 needs NVTE_CPU_OFFLOAD_V1=1
    offload = {"NVTE_CPU_OFFLOAD_V1": "1"} if cfg.offload_modules else {}
    if cfg.zero_stage in FSDP_SHARDING:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None, **offload}
    if cfg.ep_comm_overlap:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "32", **offload}
    if cfg.tp > 1 or cfg.cp > 1:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1", **offload}
    return offload


def render(plan: Any, source: str = "<plan>") -> str:
    """A bash snippet that sets the environment the plan needs and defines ``PLANNER_ARGS`` (one argument pair a
    line) to splice into a torchrun command."""
    view = read_plan(plan, source)
    args = arguments(plan, source)
    script = "pretrain_hybrid.py" if view.model is not None and view.model.layer_pattern else "pretrain_gpt.py"
    lines = ["#!/usr/bin/env bash", f"# Megatron-LM {script} arguments generated by planner"]
    lines += [f"# {line}" for line in summary_comment(view)]
    lines += [f"# note: {n}" for n in notes(plan, source)]
    env = environment(plan, source)
    lines.append(f'# usage: source this file, then torchrun --nproc-per-node <GPUs per node> --nnodes <nodes> '
                 f'{script} "${{PLANNER_ARGS[@]}}" <data and optimizer arguments>   ({view.cfg.num_gpus} GPUs '
                 f'in all){"; it sets " + ", ".join(env) if env else ""}')
    for name, value in env.items():
        lines.append(f"unset {name}" if value is None else f"export {name}={value}")
    lines.append("PLANNER_ARGS=(")
    i = 0
    while i < len(args):
        item = args[i]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"  {item} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(f"  {item}")
            i += 1
    lines.append(")")
    return "\n".join(lines) + "\n"


def parse_rendered(text: str) -> list[str]:
    """The argument list inside a rendered ``PLANNER_ARGS=( ... )`` block (for tests and round trips)."""
    body = text.split("PLANNER_ARGS=(", 1)[1].rsplit(")", 1)[0]
    return shlex.split(body)
