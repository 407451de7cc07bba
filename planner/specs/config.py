"""One typed configuration holding every parallelism and training knob (torchtitan's habit).

The search produces these; ``planner estimate`` takes one from the command line; exporters turn one into launcher
arguments. Derived quantities (DP degree, number of micro-batches) are properties, never stored twice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from planner.errors import PlannerError
from planner.specs.model import MAX_CONFIG_INT

RECOMPUTE_MODES = ("none", "selective", "full")
#: what selective recomputation redoes, as Megatron-Core's ``--recompute-modules`` names it
#: (megatron/core/transformer/transformer_config.py, ``recompute_modules``), in this order: the attention core,
#: the two norms, MLA's up-projections and RoPE, a dense layer's MLP, a whole MoE block (router, dispatch, experts,
#: combine and shared experts: MoELayer's checkpointed forward, megatron/core/transformer/moe/moe_layer.py
#: ``moe_layer_recompute``), the experts' activation function. Megatron's "shared_experts" is not modelled.
#: After them, torchtitan's per-op selective activation checkpointing, which picks ops by a policy instead of modules
#: (torchtitan/distributed/activation_checkpoint.py, ``mode = "selective"``): every transformer block saves the
#: outputs of its compute-intensive and communication ops and re-runs everything else in backward, every second
#: matmul included. "op_sac" is the policy of torchtitan 0.3 (one save set for every model: PyTorch's
#: ``get_default_op_list().compute_intensive_ops``, which holds ``aten._scaled_mm``, so fp8 linear layers are never
#: re-run); "op_sac_v02" that of torchtitan 0.2.x and earlier (a per-model save list without ``torch._scaled_mm``, so
#: every fp8 linear layer runs again). Either stands alone (planner.cost.compute.op_sac_shares says what each re-runs).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "op_sac", "op_sac_v02")
#: the recompute "modules" that are torchtitan's per-op policies, not Megatron-Core modules
OP_SAC_MODULES = ("op_sac", "op_sac_v02")
#: Megatron-Core's default modules of selective recomputation
DEFAULT_RECOMPUTE_MODULES = "core_attn"


def _canonical_modules(names: str | Sequence[str], allowed: tuple[str, ...], kind: str) -> str:
    """``names`` (a comma / space separated string or a sequence) as one comma-separated string in ``allowed``
    order; ValueError names the unknown ones."""
    items = [n.strip() for n in (names.replace(" ", ",").split(",") if isinstance(names, str) else names)]
    items = [n for n in items if n]
    unknown = sorted(set(items) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {kind} module(s) {', '.join(unknown)}; use any of {', '.join(allowed)}")
    return ",".join(m for m in allowed if m in items)


def canonical_recompute_modules(names: str | Sequence[str]) -> str:
    """The modules as one comma-separated string in :data:`RECOMPUTE_MODULES` order (``"core_attn,layernorm"``);
    ValueError names the unknown ones."""
    return _canonical_modules(names, RECOMPUTE_MODULES, "recompute")


def op_sac_on(modules):
    """Whether ``modules`` (a canonical string, or an array of them) name one of torchtitan's per-op policies
    (:data:`OP_SAC_MODULES`)."""
    return np.logical_or.reduce([recompute_module_on(modules, m) for m in OP_SAC_MODULES])


def single_value(values: np.ndarray):
    """The one value of an array that holds a single value broadcast over a batch (every stride 0: a setting a
    :class:`ConfigBatch` was given as a scalar), else None; lets string settings be looked at once, not per row."""
    if values.size and not any(values.strides):
        return values.flat[0]
    return None


def recompute_module_on(modules, name: str):
    """Whether selective recomputation redoes ``name`` under ``modules`` (a canonical string, or an array of them
    over a batch)."""
    if isinstance(modules, str):
        return name in modules.split(",")
    modules = np.asarray(modules, dtype=str)
    one = single_value(modules)
    if one is None and modules.size and (modules == modules.flat[0]).all():
        one = modules.flat[0]
    if one is not None:  # one setting over the batch (a search's): no string ops per row
        return np.full(modules.shape, name in str(one).split(","))
    padded = np.char.add(np.char.add(",", modules), ",")
    return np.char.find(padded, f",{name},") >= 0


#: MoE token dispatchers (RunConfig.ep_dispatcher): Megatron-Core's all-to-all dispatcher, which sends every token
#: copy to its expert's rank, and the flex dispatcher's two backends, DeepEP and HybridEP, whose kernels send a
#: token once to each remote node holding one of its experts and forward it to those experts' GPUs over NVLink
#: (megatron/core/transformer/moe/token_dispatcher.py MoEFlexTokenDispatcher; --moe-token-dispatcher-type flex
#: --moe-flex-dispatcher-backend deepep|hybridep)
EP_DISPATCHERS = ("alltoall", "deepep", "hybridep")
#: the dispatchers that send a token across the network once per remote node (planner.cost.moe)
NODE_DEDUP_DISPATCHERS = ("deepep", "hybridep")
#: the module inputs Megatron-Core's fine-grained activation offloading can send to host memory
#: (TransformerConfig.offload_modules, docs/user-guide/features/fine_grained_activation_offloading.md), in forward
#: order: the layer input (attention norm's input), the QKV projection's input, Q / K / V (the attention core's
#: input), the attention output (the out-projection's input), the MLP norm's input, the routed experts' fc1 input
#: and their activation's input (MoE only)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")


def canonical_offload_modules(names: str | Sequence[str]) -> str:
    """The modules as one comma-separated string in :data:`OFFLOAD_MODULES` order; ValueError names unknown ones."""
    return _canonical_modules(names, OFFLOAD_MODULES, "offload")


ZERO_STAGES = (0, 1, 2, 3)
CP_KINDS = ("ring", "ulysses")
#: precision of the linear layers' GEMMs (the attention core, router, LM head and softmax stay bf16 / fp32, as
#: Transformer Engine's fp8 recipes run them): bf16 | fp16 | fp8 (Hopper / Ada / MI300 tensor cores, per-tensor
#: scaling) | mxfp8 (Blackwell block-scaled fp8)
PRECISIONS = ("bf16", "fp16", "fp8", "mxfp8")
#: the precisions whose linear layers run their GEMMs on 16-bit operands (no quantization)
SIXTEEN_BIT = ("bf16", "fp16")
#: dtypes of Adam's two moments (``--adam-moments``) and their bytes per element: fp32, or bf16 as Megatron-Core's
#: precision-aware optimizer keeps them (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype
#: bf16, megatron/core/optimizer/optimizer_config.py; Megatron-Bridge's tuned DeepSeek-V3 recipes,
#: perf_recipes/deepseek/common.py) and the DeepSeek-V3 report does (Sec. 3.3.2)
ADAM_MOMENT_DTYPES = {"fp32": 4, "bf16": 2}


def moe_load_factor_value(value: float, option: str = "--moe-load-factor") -> float:
    """A request's ``moe_load_factor`` (:class:`RunConfig`), refused in one line naming ``option`` unless >= 1
    and finite."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 1.0 <= value < float("inf")):
        raise PlannerError(f"must be a number >= 1 (the busiest EP rank's load over the mean), got {value!r}",
                           source=option, fix="use 1 for balanced routing, or the measured max / mean")
    return float(value)


def comm_reserved_sms_value(value: int, option: str = "--comm-reserved-sms") -> int:
    """A request's ``comm_reserved_sms`` (:class:`RunConfig`), refused in one line naming ``option`` unless a
    non-negative integer (the profile's SM count bounds it: ``validity``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CONFIG_INT:
        raise PlannerError(f"must be a whole number of SMs >= 0, got {value!r}", source=option,
                           fix="use 0 (kernels share the SMs), or the SMs the stack's communication kernels hold "
                               "(DeepSeek-V3's DualPipe: 20)")
    return int(value)


def per_precision(precision, values, default: float) -> np.ndarray:
    """``values`` ((name, value) pairs) looked up for ``precision`` (a name, or an array of names over a batch);
    ``default`` for names not listed."""
    precision = np.asarray(precision)
    one = single_value(precision)
    if one is not None:  # one precision over the batch: looked up once
        return np.full(precision.shape, dict(values).get(str(one), default), dtype=float)
    out = np.full(precision.shape, default, dtype=float)
    for name, value in values:
        out = np.where(precision == name, value, out)
    return out


@dataclass(frozen=True)
class RunConfig:
    num_gpus: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1  # expert parallel degree (ep x expert TP divides tp x cp x dp: Megatron's MoE parallel folding)
    vpp: int = 1  # virtual pipeline stages (model chunks) per pipeline rank
    global_batch_size: int = 1  # sequences per optimizer step
    micro_batch_size: int = 1
    seq_len: int = 2048
    sequence_parallel: bool = True
    zero_stage: int = 1
    recompute: str = "selective"
    #: with recompute == "selective": the modules recomputed (:data:`RECOMPUTE_MODULES`, canonical string)
    recompute_modules: str = DEFAULT_RECOMPUTE_MODULES
    #: with recompute == "full": how many layers per pipeline stage are fully recomputed (None = all of them);
    #: the others keep all their activations
    recompute_num_layers: int | None = None
    #: with recompute == "full": fully recomputed layers of each pipeline stage (pp * vpp entries, model order),
    #: chosen per stage as AdaPipe does; overrides recompute_num_layers; None = recompute_num_layers everywhere
    recompute_layers_per_stage: tuple[int, ...] | None = None
    schedule: str = "1f1b"
    cp_kind: str = "ring"
    #: layers of each pipeline stage (pp * vpp entries, in model order); None = as even as possible
    layers_per_stage: tuple[int, ...] | None = None
    flash_attention: bool = True  # fused attention kernel: no s^2 activations, causal blocks skipped
    overlap_grad_reduce: bool = True  # DP gradient reduction overlapped with backward (Megatron --overlap-grad-reduce)
    overlap_param_gather: bool = True  # ZeRO-1/3 parameter all-gather overlapped with the next forward
    tp_comm_overlap: bool = False  # TP collectives overlapped with GEMMs (Megatron --tp-comm-overlap)
    #: MoE all-to-alls of one micro-batch hidden under another's compute (Megatron-Core's batch-level overlap,
    #: --overlap-moe-expert-parallel-comm --delay-wgrad-compute; DeepSeek's DualPipe does the same pairing)
    ep_comm_overlap: bool = False
    grad_reduce_bytes: int = 2  # bytes per element of the DP gradient reduction (bf16 = 2, fp32 = 4)
    precision: str = "bf16"  # GEMM precision of the linear layers (PRECISIONS)
    #: the fused attention kernel that runs (a hardware profile's table name, ``hardware.ATTENTION_KERNELS``; the
    #: stack's choice or ``--attention-kernel``); "" = the profile's default table
    attention_kernel: str = ""
    #: the stack issues a MoE layer's grouped expert GEMM as one host call per local expert (Transformer Engine's
    #: GroupedLinear in Megatron-Core, DeepSpeed-MoE's expert loop), so that GEMMs shorter than their issue leave the
    #: GPU waiting (``GPU.expert_gemm_call_s``); False: one grouped kernel over all local experts (torchtitan's
    #: torch._grouped_mm)
    per_expert_gemm_calls: bool = True
    #: under the batch-level MoE overlap (``ep_comm_overlap``) the paired micro-batch's kernels fill the host's
    #: per-expert issue gaps (``compute.PassTimes.paired_scale``): the current Megatron-Core; False where the
    #: overlap adds host work instead (the 25.11 containers: Megatron-Bridge PR 1760, "Disable moe_a2a_overlap due to
    #: CPU overhead")
    moe_overlap_fills_issue_gaps: bool = True
    #: the linear layers' weights kept in fp8 and all-gathered in fp8 by the sharded optimizer / FSDP (Megatron
    #: --fp8-param-gather, on in Megatron-Bridge's fp8 and mxfp8 presets; torchtitan [float8]
    #: enable_fsdp_float8_all_gather): 1 byte per element with per-tensor fp8; mxfp8 weights are gathered in bf16
    #: and cast after (Megatron's reuse_grad_buf_for_mxfp8_param_ag), so only ``precision`` "fp8" gathers fewer bytes
    fp8_param_gather: bool = False
    #: bytes per element of each of Adam's two moments (:data:`ADAM_MOMENT_DTYPES`): 4 in fp32, 2 in bf16; the fp32
    #: master weights stay 4
    adam_moment_bytes: int = 4
    #: the SwiGLU activations (dense MLPs and experts) keep their input for backward as an fp8 (e4m3) copy instead
    #: of bf16, cast in forward and back in backward (Megatron-Core TransformerConfig
    #: ``activation_func_fp8_input_store``: megatron/core/fusions/fused_bias_swiglu.py ``input.to(torch.float8_e4m3fn)``;
    #: the DeepSeek-V3 report's SwiGLU inputs cached in FP8, Sec. 3.3.3), whatever the GEMM precision
    activation_fp8_input_store: bool = False
    #: MoE routing's load on the busiest expert-parallel rank over the mean (>= 1): the token copies it receives,
    #: computes and sends back, which set the pace of every all-to-all and of the layer. 1: balanced routing, what
    #: the published benchmarks force (Megatron-Core moe_router_force_load_balancing, "only for benchmark",
    #: transformer_config.py); a dropless run's real data is above it; with a capacity factor C and padding to
    #: capacity (moe_expert_capacity_factor, moe_pad_expert_input_to_capacity) every rank computes C
    moe_load_factor: float = 1.0
    #: SMs the stack's communication kernels hold through the step (a static partition: DeepSeek-V3's DualPipe keeps
    #: 20 of the H800's 132 for its all-to-all kernels, report Sec. 3.2.2 and 3.5.1, "which will limit the
    #: computational throughput"; DeepGEMM's persistent kernels take their SM count from deep_gemm.set_num_sms):
    #: every compute kernel runs on the GPU's other SMs (``GPU.sm_count``), and the overlapped MoE all-to-alls cost
    #: nothing more. 0: kernels share the SMs dynamically and each overlapped transfer costs
    #: ``GPU.comm_overlap_interference`` of its time (Megatron-Core, whose DeepEP / HybridEP kernels hold their SMs
    #: only while they run)
    comm_reserved_sms: int = 0
    #: the fp8 / mxfp8 linear layers hold their weights as Transformer Engine modules under Megatron-Core do
    #: (``memory.held_linear_weight_bytes``): with ``fp8_param_gather`` as quantized tensors instead of bf16
    #: (fp8_model_init), without it bf16 plus a quantized copy kept across the micro-batches of a step (TE's weight
    #: workspace, transformer_engine/pytorch/module/base.py get_weight_workspace, reused while Megatron-Core passes
    #: is_first_microbatch=False: megatron/core/extensions/transformer_engine.py). False: bf16 weights quantized per
    #: use and freed, in fp8 gathered as such (torchao's Float8Linear and its FSDP2 float8 all-gather)
    te_quantized_weights: bool = True
    #: the gradients accumulate in a buffer of the reduction's dtype (``grad_reduce_bytes`` per element: Megatron-Core's
    #: main_grad buffer is fp32 when it reduces in fp32, megatron/core/distributed/param_and_grad_buffer.py
    #: grad_dtype = torch.float if grad_reduce_in_fp32); False: 2 bytes, the ZeRO paper's 2 + 2 + 12 accounting
    #: (FSDP2's fp32 shards are their own master weights, so its 16 bytes per parameter add up the same)
    grads_in_reduce_dtype: bool = True
    #: selective recomputation of "core_attn" re-runs the fused attention kernel too (Megatron-Core checkpoints the
    #: core attention whatever its kernel: megatron/core/transformer/attention.py checkpoint_core_attention); False:
    #: the fused kernel's outputs are kept (torchtitan's op-level selective checkpointing saves the SDPA ops')
    recompute_fused_attention: bool = True
    #: pipeline sends and receives posted asynchronously and waited only when their tensor is needed, so a chunk's
    #: transfer runs under the next chunk's compute (Megatron-Core ``overlap_p2p_comm``: on by default for the
    #: interleaved schedule, megatron/training/arguments.py ``--no-overlap-p2p-communication``; Megatron-Bridge
    #: comm_overlap.py sets it with virtual stages); applies to schedules that run it
    #: (``Schedule.overlaps_p2p``), elsewhere the sends block. False: every send on the critical path (2021
    #: Megatron-LM's batched sends)
    overlap_p2p_comm: bool = True
    #: the MoE token dispatcher (EP_DISPATCHERS): "alltoall" sends every token copy over the EP all-to-all;
    #: "deepep" / "hybridep" (Megatron's flex dispatcher) send a token over the network once per remote node its
    #: experts sit on and forward it inside the node over NVLink (planner.cost.moe.node_dedup_all_to_all_s)
    ep_dispatcher: str = "alltoall"
    #: gradient-accumulation passes per step, each its own run of the pipeline schedule over num_microbatches /
    #: pipeline_flushes micro-batches, with its own fill and drain and, under FSDP / ZeRO-3, its own gather and
    #: reduce-scatter (torchtitan and NeMo AutoModel: the schedule consumes one local batch per step() call and
    #: gradient accumulation calls it again); 1 = one schedule over the global batch (Megatron-Core)
    pipeline_flushes: int = 1
    #: expert tensor-parallel degree (Megatron --expert-tensor-parallel-size); None = TP (Megatron's default)
    etp: int | None = None
    #: HSDP: ZeRO shards model states over groups of ``dp_shard`` data-parallel ranks (x CP) and replicates them
    #: across dp / dp_shard such groups (FSDP2 / torchtitan data_parallel_shard x replicate degrees, Megatron
    #: --num-distributed-optimizer-instances, DeepSpeed MiCS); None = shard over all of DP (plain ZeRO / FSDP)
    dp_shard: int | None = None
    #: decoder layers whose saved activations go to host memory during forward and come back for backward
    #: (Megatron-Core's cpu_offloading_num_layers: activations only, no pipeline stages, no recomputation)
    offload_layers: int = 0
    #: the loss's vocab-parallel cross-entropy fused into a few kernels (Megatron --cross-entropy-loss-fusion, on in
    #: Megatron-Bridge / NeMo recipes); False: Megatron-Core's unfused path of separate elementwise passes
    fused_cross_entropy: bool = True
    #: packed sequences of variable-length documents with per-document attention masking (Transformer Engine's
    #: THD format, cu_seqlens): the token-weighted mean document length E[L^2] / E[L] (``SeqLenDist.
    #: packed_doc_len``), the keys a query attends on average; 0 = one document per sequence
    packed_doc_len: float = 0.0
    #: with packed_doc_len: coefficient of variation of one packed sequence's attention work (the sum of its
    #: documents' squared lengths; ``variable_length.packed_attention_cv``), which makes data-parallel ranks wait
    #: for the one whose sequences hold the most (``data_parallel.packed_wait_s``); 0 = equal work
    packed_attention_cv: float = 0.0
    #: Megatron-Core fine-grained activation offloading: the module inputs (:data:`OFFLOAD_MODULES`, canonical
    #: string) every decoder layer sends to host memory in forward and reloads before its backward; "" = none
    offload_modules: str = ""

    # ----- derived --------------------------------------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Data-parallel degree: GPUs / (TP x PP x CP). Callers check divisibility with ``validity``."""
        return self.num_gpus // (self.tp * self.pp * self.cp)

    @property
    def zero_shard_dp(self) -> int:
        """Data-parallel ranks ZeRO shards over: ``dp_shard`` (HSDP), or all of DP."""
        return self.dp if self.dp_shard is None else self.dp_shard

    @property
    def dp_replicas(self) -> int:
        """Replicas of each ZeRO shard group across DP (HSDP's replicate degree; 1 for plain ZeRO)."""
        return max(1, self.dp // max(1, self.zero_shard_dp))

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel degree: ``etp``, or TP when not set."""
        return self.tp if self.etp is None else self.etp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step: B / (DP x b)."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    @property
    def num_stages(self) -> int:
        """Model chunks along the pipeline: PP x VPP."""
        return self.pp * self.vpp

    @property
    def tokens_per_rank(self) -> float:
        """Tokens of one micro-batch on one GPU: b s / cp (the T of the cost model's per-layer formulas)."""
        return self.micro_batch_size * self.seq_len / self.cp

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def with_(self, **changes: Any) -> "RunConfig":
        return replace(self, **changes)

    @property
    def fixed(self) -> "FixedOptions":
        """The options a search holds fixed (:data:`FIXED_FIELDS`) as this configuration has them."""
        return FixedOptions.of(self)


#: the RunConfig fields a search holds fixed in every row it ranks: the run's GEMM precision, and what the stack
#: (attention kernel, expert GEMM issue, fp8 weight gather, recomputation of the fused attention, the modules
#: selective recomputation redoes, offloaded module inputs, overlapped pipeline sends) and the data (packed
#: document lengths) decide
FIXED_FIELDS = ("precision", "attention_kernel", "per_expert_gemm_calls", "moe_overlap_fills_issue_gaps",
                "fp8_param_gather", "te_quantized_weights", "grads_in_reduce_dtype", "adam_moment_bytes",
                "activation_fp8_input_store", "moe_load_factor", "comm_reserved_sms", "recompute_fused_attention",
                "recompute_modules", "packed_doc_len", "packed_attention_cv", "offload_modules", "overlap_p2p_comm")


@dataclass(frozen=True)
class FixedOptions:
    """The :data:`FIXED_FIELDS` of a run as one value, with :class:`RunConfig`'s defaults: what a search space
    carries into every configuration it builds, and what a re-plan keeps from the plan it replaces."""

    precision: str = RunConfig.precision
    attention_kernel: str = RunConfig.attention_kernel
    per_expert_gemm_calls: bool = RunConfig.per_expert_gemm_calls
    moe_overlap_fills_issue_gaps: bool = RunConfig.moe_overlap_fills_issue_gaps
    fp8_param_gather: bool = RunConfig.fp8_param_gather
    te_quantized_weights: bool = RunConfig.te_quantized_weights
    grads_in_reduce_dtype: bool = RunConfig.grads_in_reduce_dtype
    adam_moment_bytes: int = RunConfig.adam_moment_bytes
    activation_fp8_input_store: bool = RunConfig.activation_fp8_input_store
    moe_load_factor: float = RunConfig.moe_load_factor
    comm_reserved_sms: int = RunConfig.comm_reserved_sms
    recompute_fused_attention: bool = RunConfig.recompute_fused_attention
    recompute_modules: str = RunConfig.recompute_modules
    packed_doc_len: float = RunConfig.packed_doc_len
    packed_attention_cv: float = RunConfig.packed_attention_cv
    offload_modules: str = RunConfig.offload_modules
    overlap_p2p_comm: bool = RunConfig.overlap_p2p_comm

    @classmethod
    def of(cls, obj: Any) -> "FixedOptions":
        """The fixed options of anything that has them as attributes (a RunConfig, a search space)."""
        return cls(**{f: getattr(obj, f) for f in FIXED_FIELDS})

    def as_dict(self) -> dict[str, Any]:
        """Field name -> value, to pass as keyword arguments (``RunConfig(**fixed.as_dict(), ...)``)."""
        return {f: getattr(self, f) for f in FIXED_FIELDS}


#: the RunConfig fields one decoder layer's costs read (kernels, activations, TP / CP / EP communication): the
#: columns of a :class:`ConfigBatch`
LAYER_FIELDS = ("tp", "cp", "cp_kind", "ep", "micro_batch_size", "seq_len", "sequence_parallel", "recompute",
                "flash_attention", "tp_comm_overlap", "precision", "expert_tp", "recompute_modules",
                "ep_comm_overlap", "fused_cross_entropy", "packed_doc_len", "offload_modules", "attention_kernel",
                "per_expert_gemm_calls", "recompute_fused_attention", "ep_dispatcher", "activation_fp8_input_store",
                "moe_load_factor", "moe_overlap_fills_issue_gaps", "comm_reserved_sms")


@dataclass(frozen=True, eq=False)
class ConfigBatch:
    """Many configurations as columns: one numpy array per field of :data:`LAYER_FIELDS`, all of one length.

    The cost model's per-layer functions take either one :class:`RunConfig` or a ``ConfigBatch`` and are written
    with numpy expressions that broadcast over both, so a configuration and a search's thousands of keys go through
    the same code (``cp_kind``, ``recompute`` and ``precision`` are string arrays: ``batch.cp_kind == "ulysses"`` is elementwise).
    """

    tp: np.ndarray
    cp: np.ndarray
    cp_kind: np.ndarray
    ep: np.ndarray
    micro_batch_size: np.ndarray
    seq_len: np.ndarray
    sequence_parallel: np.ndarray
    recompute: np.ndarray
    flash_attention: np.ndarray
    tp_comm_overlap: np.ndarray
    precision: np.ndarray
    expert_tp: np.ndarray
    recompute_modules: np.ndarray
    ep_comm_overlap: np.ndarray
    fused_cross_entropy: np.ndarray
    packed_doc_len: np.ndarray
    offload_modules: np.ndarray
    attention_kernel: np.ndarray
    per_expert_gemm_calls: np.ndarray
    recompute_fused_attention: np.ndarray
    ep_dispatcher: np.ndarray
    activation_fp8_input_store: np.ndarray
    moe_load_factor: np.ndarray
    moe_overlap_fills_issue_gaps: np.ndarray
    comm_reserved_sms: np.ndarray

    @classmethod
    def from_columns(cls, **cols: Any) -> "ConfigBatch":
        """A batch from arrays (or scalars, broadcast to the arrays' length), one per field of LAYER_FIELDS."""
        missing = [f for f in LAYER_FIELDS if f not in cols]
        if missing:
            raise TypeError(f"ConfigBatch.from_columns: missing {', '.join(missing)}")
        arrays = np.broadcast_arrays(*(np.asarray(cols[f]) for f in LAYER_FIELDS))
        kinds = {"tp": np.int64, "cp": np.int64, "ep": np.int64, "micro_batch_size": np.int64, "seq_len": np.int64,
                 "expert_tp": np.int64,
                 "sequence_parallel": bool, "flash_attention": bool, "tp_comm_overlap": bool, "ep_comm_overlap": bool,
                 "fused_cross_entropy": bool, "packed_doc_len": float, "per_expert_gemm_calls": bool,
                 "recompute_fused_attention": bool, "activation_fp8_input_store": bool,
                 "moe_load_factor": float, "moe_overlap_fills_issue_gaps": bool, "comm_reserved_sms": np.int64}
        # a string setting given as a scalar stays a broadcast view (strides 0), which ``single_value`` reads once
        out = {f: (a.astype(kinds[f]) if f in kinds else a if a.dtype.kind == "U" else a.astype(str))
               for f, a in zip(LAYER_FIELDS, arrays)}
        return cls(**out)

    @classmethod
    def of(cls, cfgs: Sequence[RunConfig]) -> "ConfigBatch":
        """The batch of the given configurations, in order."""
        return cls.from_columns(**{f: [getattr(c, f) for c in cfgs] for f in LAYER_FIELDS})

    def __len__(self) -> int:
        return len(self.tp)

    @property
    def tokens_per_rank(self) -> np.ndarray:
        """Tokens of one micro-batch on one GPU: b s / cp (as :attr:`RunConfig.tokens_per_rank`)."""
        return self.micro_batch_size * self.seq_len / self.cp


def parse_megatron_layout(text: str) -> tuple[int, ...]:
    """Decoder layers per model chunk from Megatron-Core's ``--pipeline-model-parallel-layout`` string
    (megatron/core/transformer/pipeline_parallel_layer_layout.py): chunks separated by '|', in model order; 'E' the
    embedding, 't' a decoder layer, 'm' a multi-token-prediction layer (not a decoder layer here), 'L' the loss;
    'x*N' repeats a token and '(...)*N' a group; ',' is ignored. The planner keeps the embedding on the first chunk
    and the loss on the last, so a layout placing them elsewhere is refused (ValueError, with the reason)."""
    import re

    t = text.replace(" ", "")
    if not t or re.search(r"[^EtmL|()*,0-9]", t):
        raise ValueError("use only E, t, m, L, |, (, ), * and digits (Megatron's layout syntax)")
    group = re.compile(r"\(([^()]*)\)\*(\d+)")
    while group.search(t):
        t = group.sub(lambda mt: mt.group(1) * int(mt.group(2)), t)
    if "(" in t or ")" in t:
        raise ValueError("unbalanced parentheses, or a group without '*N'")
    t = re.sub(r"([EtmL])\*(\d+)", lambda mt: mt.group(1) * int(mt.group(2)), t).replace(",", "")
    if "*" in t:
        raise ValueError("'*N' must follow a token or a parenthesized group")
    chunks = t.split("|")
    if "E" in "".join(chunks[1:]) or "L" in "".join(chunks[:-1]):
        raise ValueError("the planner keeps the embedding (E) on the first chunk and the loss (L) on the last")
    return tuple(c.count("t") for c in chunks)


def even_layer_split(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers per pipeline stage, as even as possible; the remainder goes to the middle stages, since the first
    and last stages also carry the embedding and the LM head."""
    base, extra = divmod(num_layers, num_stages)
    counts = [base] * num_stages
    order = sorted(range(num_stages), key=lambda i: (abs(i - (num_stages - 1) / 2), i))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)

