"""Compute cost: FLOPs of every operator of a decoder layer, the embedding and the LM head, and their time on a GPU.

The model is a list of operators whose costs add up (Calculon's habit): each :class:`Op` is either a GEMM
(compute-bound, timed with the GPU's matmul efficiency curve at that GEMM's size), the attention core (timed with
the attention kernel's efficiency), or a memory-bound kernel (timed by bytes moved over HBM bandwidth).

FLOP counts follow Narayanan et al. 2021 (Eq. 3) and Korthikanti et al. 2022 (App. A): a GEMM of (m x k) by
(k x n) costs 2mkn FLOPs forward and twice that backward (input and weight gradient, each 2mkn).
"""

from __future__ import annotations

from dataclasses import replace, dataclass
from functools import lru_cache

import numpy as np

from planner.specs.config import SIXTEEN_BIT, ConfigBatch, RunConfig, recompute_module_on, single_value
from planner.specs.hardware import GPU, AttentionKernel
from planner.specs.model import DENSE_LAYER, LayerKind, ModelSpec

#: one configuration or a batch of them (every per-layer function broadcasts over both)
Config = RunConfig | ConfigBatch

ACT_BYTES = 2  # bf16 activations
LOGIT_BYTES = 4  # Megatron keeps the logits and softmax for the cross-entropy in fp32

#: backward / forward FLOP ratio of a GEMM: input gradient (2mkn) + weight gradient (2mkn) vs forward (2mkn)
GEMM_BWD_RATIO = 2.0
#: flash-attention backward recomputes the score matrix: 5 s^2 GEMMs against 2 in forward (Dao 2022, Sec. 3.1.2)
FLASH_ATTN_BWD_RATIO = 2.5
#: the attention core's operators: the fused (flash) kernel and, without it, the two batched score / value GEMMs
ATTENTION_CORE_OPS = ("attention_core", "attention_core_unfused")


@dataclass(frozen=True)
class Op:
    """One operator of one micro-batch on one GPU.

    ``flops`` and ``hbm_bytes`` are forward costs (numbers, or arrays over a batch of configurations; an operator
    a configuration does not run has 0 of both there); ``bwd_ratio`` scales them for backward. ``kind`` is one of
    "gemm", "attention", "scan" (a fused kernel of small matmuls, :func:`op_time_s`) or "memory". ``weight_grad_fraction`` is the share of backward spent on weight gradients
    (the W pass of zero-bubble schedules).
    """

    name: str
    kind: str
    flops: float | np.ndarray = 0.0
    hbm_bytes: float | np.ndarray = 0.0
    bwd_ratio: float | np.ndarray = GEMM_BWD_RATIO
    weight_grad_fraction: float = 0.5
    #: the selective-recompute modules (config.RECOMPUTE_MODULES, comma-separated) any of whose recomputation
    #: redoes this op in backward (once, however many of them are on)
    recompute_module: str = ""
    #: where that recomputation redoes it (a configuration's flag, or an array of them): the fused attention kernel
    #: only under stacks that checkpoint it (``RunConfig.recompute_fused_attention``)
    recompute_when: bool | np.ndarray = True
    gemm_flops: float | np.ndarray = 0.0  # FLOPs of one GEMM of a batched op (sets its efficiency); 0 = flops
    precision: str | np.ndarray = "bf16"  # tensor-core precision of a GEMM (config.PRECISIONS)
    #: GEMMs of a grouped GEMM the host issues one call each for (a layer's local experts), per forward; its
    #: backward issues two per forward GEMM (input and weight gradient). 0: one kernel, never host-bound
    expert_calls: float | np.ndarray = 0.0
    #: whether those calls follow Megatron-Core's all-to-all dispatcher (``RunConfig.ep_dispatcher`` "alltoall" with
    #: EP > 1), whose host sync adds a time per GEMM pass on top of the calls (``GPU.expert_alltoall_sync_s``)
    expert_alltoall: bool | np.ndarray = False
    #: the fused attention kernel's shape (kind "attention"), which sets its speed (:func:`attention_time_s`)
    shape: "AttentionShape | None" = None
    #: the share of this op's forward that torchtitan's per-op selective checkpointing runs again in backward, under
    #: the "op_sac" and "op_sac_v02" policies (config.OP_SAC_MODULES; :func:`op_sac_shares`)
    op_sac: float | np.ndarray = 0.0
    op_sac_v02: float | np.ndarray = 0.0
    #: whether this GEMM's weight gradients are a 16-bit grouped expert GEMM whose bias the stack's grouped linear
    #: layer applies and whose bias gradient it fuses into them (:func:`ffn_ops`), priced
    #: ``GPU.biased_grouped_wgrad_factor`` times longer (a flag, or an array of them over a batch)
    biased_grouped_wgrad: bool | np.ndarray = False
    #: backward over forward FLOPs of a "scan" op, whose backward kernels do other matmuls than its forward's
    #: (:func:`ssd_traffic`); 0: ``bwd_ratio`` scales both its FLOPs and its bytes
    bwd_flops_ratio: float | np.ndarray = 0.0


@dataclass(frozen=True)
class AttentionShape:
    """What a fused attention kernel's speed depends on (:func:`attention_work_factor`): the query/key head
    dimension, the keys a sequence (or packed document) spans, causal masking, a sliding window (tokens; 0: none)
    on a share of the op's layers, and the ring steps of context parallelism (each a kernel call per query tile
    row; 1 without ring CP), and the kernel that runs it (a profile's table name, ``RunConfig.attention_kernel``;
    empty: the profile's default). Numbers or arrays over a batch of configurations."""

    head_dim: float
    keys: float | np.ndarray
    causal: bool = True
    window: float = 0.0
    window_share: float = 0.0
    ring_steps: float | np.ndarray = 1.0
    kernel: str | np.ndarray = ""


def _gemm(name: str, m, k, n, batch=1.0, **kw) -> Op:
    """A (batch of) GEMM(s) of (m x k) by (k x n): 2mkn FLOPs each, and 2 bytes per element of A, B and C moved
    over HBM at least once (the roofline's memory side, which bounds thin GEMMs such as per-head attention)."""
    return Op(name, "gemm", flops=2.0 * m * k * n * batch, hbm_bytes=ACT_BYTES * (m * k + k * n + m * n) * batch,
              gemm_flops=2.0 * m * k * n, **kw)


#: bytes of HBM traffic per element of a GEMM operand quantized to fp8 by Transformer Engine's fused cast-transpose
#: (``transformer_engine/common/transpose/cast_transpose``): read it in bf16 (2 B), write the fp8 copy and its fp8
#: transpose (1 + 1 B) that the other GEMM of backward reads; the amax reduction rides along
FP8_CAST_BYTES_PER_ELEMENT = 2 + 1 + 1


def _linear(name: str, m, k, n, cfg: "Config", batch=1.0, module: str = "", expert_calls=0.0,
            expert_alltoall=False) -> list[Op]:
    """A linear layer's GEMM (m x k input by k x n weight) at the configuration's GEMM precision, and, in fp8 /
    mxfp8, the quantization of its operands: the input in forward, the output gradient in backward (the weights
    are cast once per step and cached across micro-batches, Megatron's ``is_first_microbatch``, so not here)."""
    precision = np.asarray(cfg.precision)
    low = (precision == "fp8") | (precision == "mxfp8")
    cast = Op(f"{name}_fp8_cast", "memory", hbm_bytes=np.where(low, FP8_CAST_BYTES_PER_ELEMENT * m * k * batch, 0.0),
              bwd_ratio=n / k, weight_grad_fraction=0.0, recompute_module=module)
    return [_gemm(name, m, k, n, batch, precision=cfg.precision, recompute_module=module,
                  expert_calls=expert_calls, expert_alltoall=expert_alltoall), cast]


def _grouped(op: Op, per_expert_calls) -> Op:
    """An expert GEMM op sized for its efficiency as the stack launches it: one GEMM per local expert where the
    stack issues them one by one (Transformer Engine's GroupedLinear in Megatron-Core: each expert's GEMM its own
    cuBLAS call, so the curve is read at one expert's GEMM), the whole grouped problem where one kernel runs all
    local experts (torchtitan's torch._grouped_mm, torchtitan/models/common/moe.py GroupedExperts._grouped_mm: its
    tiles fill the GPU together and its launch and tail are paid once, so the curve is read at the kernel's total
    work, as for any one GEMM of that duration). Memory-bound ops pass unchanged."""
    if op.kind != "gemm":
        return op
    return replace(op, gemm_flops=np.where(per_expert_calls, op.gemm_flops, op.flops))


def sp_degree(cfg: Config):
    """The degree activations outside the TP regions are split by: TP with sequence parallelism, else 1."""
    return np.where(cfg.sequence_parallel, cfg.tp, 1)


def alltoall_dispatch(cfg: Config):
    """Where a configuration's MoE tokens go through Megatron-Core's all-to-all dispatcher (EP > 1, ``ep_dispatcher``
    "alltoall"), whose host sync on the compute stream before the all-to-all (megatron/core/transformer/moe/
    token_dispatcher.py, cuda_sync_point "before_ep_alltoall") sets how the expert GEMMs after it issue
    (:func:`ffn_ops`, ``Op.expert_alltoall``) and keeps the MoE overlap's paired micro-batch from filling their gaps
    (``step.layer_costs``); the flex dispatcher (DeepEP, HybridEP) waits on a host counter instead."""
    return (np.asarray(cfg.ep) > 1) & (np.asarray(cfg.ep_dispatcher) == "alltoall")


def expert_tp_token_share(cfg: Config):
    """Tokens an expert-TP group gathers per token a TP rank holds (Megatron-Core MoE, all-gather after dispatch):
    the etp ranks' sequence shards, etp / tp, with SP; 1 without SP, where the TP ranks hold the same tokens."""
    return np.where(cfg.sequence_parallel, cfg.expert_tp / np.asarray(cfg.tp), 1.0)


def layer_ops(model: ModelSpec, cfg: Config, kind: LayerKind = DENSE_LAYER) -> list[Op]:
    """Operators of one decoder layer of kind ``kind`` (``ModelSpec.layer_kinds``), one micro-batch, on one GPU
    (after TP, CP and SP sharding): its token mixer (:func:`attention_ops`, :func:`cross_attention_ops` or
    :func:`mamba_ops`), its feed-forward block (:func:`ffn_ops`: MLP or routed experts) and the memory-bound kernels
    around them (:func:`elementwise_ops`). A transformer layer holds attention (or cross-attention) and an MLP or MoE
    block; a hybrid model's layer one of the four."""
    ops: list[Op] = []
    if kind.mixer == "attention":
        ops += attention_ops(model, cfg, kind.window)
    elif kind.mixer == "cross_attention":
        ops += cross_attention_ops(model, cfg)
    elif kind.mixer == "mamba":
        ops += mamba_ops(model, cfg)
    if kind.ffn:
        ops += ffn_ops(model, cfg, kind.moe)
    ops += elementwise_ops(model, cfg, kind)
    if kind.mixer != "attention":  # torchtitan's policies are priced for transformer blocks; a Mamba or
        return ops                  # cross-attention layer under them re-runs nothing (torchtitan trains neither)
    shares = op_sac_shares(model, cfg, kind)
    return [replace(o, op_sac=shares[o.name][0], op_sac_v02=shares[o.name][1]) if o.name in shares else o
            for o in ops]


def torchtitan_linears(model: ModelSpec, kind: LayerKind = DENSE_LAYER) -> list[tuple[str, tuple[float, ...]]]:
    """The linear layers of a transformer block of kind ``kind`` in the order torchtitan's forward calls them, as
    (the planner op that holds them, the output width of each nn.Linear it fuses): attention Q, K, V (torchtitan's
    QKVLinear: ``self.wq(x), self.wk(x), self.wv(x)``, torchtitan/models/common/attention.py) or MLA's wq_a, wq_b,
    wkv_a, wkv_b (models/deepseek_v3), the out-projection wo, then the feed-forward's w1, w3, w2
    (``self.w2(F.silu(self.w1(x)) * self.w3(x))``, models/common/feed_forward.py; w1, w2 without a gate) -- a MoE
    block's shared experts' (its router gate is recomputed by name, its routed experts run ``torch._grouped_mm``:
    neither is counted)."""
    if model.is_mla:
        qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        q = ([("q_down_proj", (model.q_lora_rank,)), ("q_up_proj", (model.num_heads * qk_head,))]
             if model.q_lora_rank else [("q_proj", (model.num_heads * qk_head,))])
        attn = q + [("kv_down_proj", (model.kv_lora_rank + model.qk_rope_head_dim,)),
                    ("kv_up_proj", (model.num_heads * (model.qk_nope_head_dim + model.v_head_dim),))]
    else:
        attn = [("qkv_proj", (model.q_dim, model.kv_dim, model.kv_dim))]
    attn.append(("attn_out_proj", (model.hidden_size,)))
    f = (model.moe_ffn_hidden_size * model.num_shared_experts if kind.moe
         else model.ffn_hidden_size if kind.ffn else 0)
    first, second = ("shared_experts_in", "shared_experts_out") if kind.moe else ("mlp_in", "mlp_out")
    ffn = [(first, (f, f) if model.gated_mlp else (f,)), (second, (model.hidden_size,))] if f else []
    return attn + ffn


def torchtitan_matmuls(model: ModelSpec, kind: LayerKind = DENSE_LAYER) -> list[tuple[str, float, bool]]:
    """Each nn.Linear of :func:`torchtitan_linears`, in call order, as (its planner op, its output width, whether
    the per-op policy saves its 16-bit output): a checkpointed block counts its ``aten.mm`` calls and saves the odd
    ones, re-running every second (torchtitan/distributed/activation_checkpoint.py)."""
    widths = [(name, width) for name, ws in torchtitan_linears(model, kind) for width in ws]
    return [(name, width, i % 2 == 0) for i, (name, width) in enumerate(widths)]


#: ops torchtitan's per-op policy always runs again: memory-bound kernels (no save list names a pointwise or
#: normalization op), the router's gate (``force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]``) and the routed
#: experts' grouped GEMMs (``torch._grouped_mm`` is not among PyTorch's compute-intensive ops,
#: torch/_functorch/partitioners.py ``get_default_op_list``, torch 2.13), with the token permutation around them
OP_SAC_RERUN = ("norms", "residual", "mlp_act", "moe_act", "rope", "qk_norm", "softmax_dropout", "router",
                "experts_in", "experts_out", "experts_in_fp8_cast", "experts_out_fp8_cast", "experts_out_bias",
                "moe_permute", "mlp_act_fp8_store", "moe_act_fp8_store")


def op_sac_shares(model: ModelSpec, cfg: Config, kind: LayerKind = DENSE_LAYER) -> dict[str, tuple]:
    """Per op of a transformer block of kind ``kind``, the share of its forward that torchtitan's per-op selective
    activation checkpointing runs again in backward, under "op_sac" (torchtitan 0.3) and "op_sac_v02" (0.2.x)
    (torchtitan/distributed/activation_checkpoint.py: each checkpointed block counts its ``aten.mm`` calls and
    saves the outputs of the odd ones, recomputing every second; SDPA, collective and, in 0.3, ``aten._scaled_mm``
    outputs are saved; everything else runs again). 16-bit linear layers alternate along
    :func:`torchtitan_linears` (Llama: wk, wo and w3 run again, a fused op re-running the share of its width they
    are); fp8 linear layers call ``torch._scaled_mm``, never ``aten.mm``: 0.3 saves each one's output, 0.2.x none
    (re-running each with its quantization); the attention kernel is saved (0); :data:`OP_SAC_RERUN` runs again
    (1)."""
    low = np.isin(np.asarray(cfg.precision), ("fp8", "mxfp8"))
    shares: dict[str, tuple] = {name: (1.0, 1.0) for name in OP_SAC_RERUN}
    matmuls = torchtitan_matmuls(model, kind)
    for name in dict.fromkeys(n for n, _, _ in matmuls):
        total = sum(w for n, w, _ in matmuls if n == name)
        mm = sum(w for n, w, saved in matmuls if n == name and not saved) / total
        op_sac, v02 = np.where(low, 0.0, mm), np.where(low, 1.0, mm)
        shares[name] = shares[f"{name}_fp8_cast"] = (op_sac, v02)
    return shares


def attention_ops(model: ModelSpec, cfg: Config, window: bool | None = None) -> list[Op]:
    """The attention half of a layer: projections and the core. Tokens per GPU are b*s/cp; GEMM output dims are
    split by TP. Attention core FLOPs: 4*b*s^2*h per layer (QK^T and attention x V, Narayanan Eq. 3's s/(6h) term),
    divided by CP, times the share a flash kernel computes (:func:`attended_fraction`: half of a causal mask, less
    in sliding-window layers; an assumption stated in the README). ``window``: a sliding-window (True) or global
    (False) attention layer; None: the model's average."""
    t, cp = cfg.tp, cfg.cp
    T = cfg.tokens_per_rank  # tokens on this GPU
    h = model.hidden_size
    flash = np.asarray(cfg.flash_attention, dtype=bool)
    ops: list[Op] = []
    if model.is_mla:
        ops += mla_projection_ops(model, cfg)
    else:
        ops += _linear("qkv_proj", T, h, (model.q_dim + 2 * model.kv_dim) / t, cfg)
    s_kv = cfg.seq_len  # each query attends to the whole (causal) sequence, whatever the CP split
    # QK^T (2 T s q) and scores x V (2 T s out): 4 T s q_dim for standard attention; MLA's value head is narrower
    core_flops = 2.0 * T * s_kv * (model.attn_q_dim + model.attn_out_dim) / t
    # a fused kernel attends within each packed document (:func:`attended_keys`); the unfused path masks the square
    keys = attended_keys(cfg)
    flash_flops = core_flops * (keys / s_kv) * attended_fraction(model, keys, window)
    # the kernel's shape: its windowed share of the op's layers (this kind's, or the model's average)
    windowed = (model.sliding_window_layers / model.num_layers if window is None else float(bool(window))) \
        if model.sliding_window_layers else 0.0
    shape = AttentionShape(head_dim=model.attn_k_dim / model.attn_kv_heads, keys=keys, causal=model.causal,
                           window=float(model.sliding_window) if windowed else 0.0, window_share=windowed,
                           ring_steps=np.where(np.asarray(cfg.cp_kind) == "ring", cfg.cp, 1),
                           kernel=cfg.attention_kernel)
    # Megatron-Core checkpoints the core attention under selective "core_attn", the fused kernel too
    # (megatron/core/transformer/attention.py, checkpoint_core_attention): its forward runs again in backward;
    # torchtitan's op-level selective checkpointing saves the SDPA outputs instead (RunConfig.recompute_fused_attention)
    ops.append(Op("attention_core", "attention", flops=np.where(flash, flash_flops, 0.0),
                  bwd_ratio=FLASH_ATTN_BWD_RATIO, weight_grad_fraction=0.0, shape=shape, recompute_module="core_attn",
                  recompute_when=cfg.recompute_fused_attention))
    ops.append(ring_merge_op(model, cfg))
    # unfused attention: two batched GEMMs per head, QK^T (s x d by d x s) and scores x V (s x s by s x d); with
    # head size d ~ 100 they are thin, so the roofline's memory side matters
    heads = cfg.micro_batch_size * model.num_heads / t
    qk = _gemm("attention_scores", cfg.seq_len / cp, model.head_size, s_kv, batch=heads)
    ops.append(Op("attention_core_unfused", "gemm", flops=np.where(flash, 0.0, core_flops),
                  hbm_bytes=np.where(flash, 0.0, 2 * qk.hbm_bytes), gemm_flops=qk.gemm_flops,
                  weight_grad_fraction=0.0, recompute_module="core_attn"))
    # scale-mask-softmax + dropout over the a*s*s score matrix: read 2 B, write 2 B, dropout read/write + mask
    per_score = (2 + 2 + 2 + 2 + 1) if model.dropout else (2 + 2)
    score_elems = T * s_kv * model.num_heads / t
    ops.append(Op("softmax_dropout", "memory", hbm_bytes=np.where(flash, 0.0, per_score * score_elems),
                  bwd_ratio=1.0, weight_grad_fraction=0.0, recompute_module="core_attn"))
    ops += _linear("attn_out_proj", T, model.attn_out_dim / t, h, cfg)
    return ops


#: HBM bytes per element of a ring-CP rank's attention output (and of its query, key and value gradients) that
#: Transformer Engine's ring attention moves merging the steps' partial results, beyond the kernels
#: (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, AttnFuncWithCPAndKVP2P, v2.9,
#: bf16 sbhd): the first step's result copied in (read 2 B, write 2 B), each later step's added over the rows it
#: covers (read the step's 2 B and the running 2 B, write 2 B)
RING_MERGE_FIRST_BYTES = 2 + 2
RING_MERGE_LATER_BYTES = 2 + 2 + 2


def ring_merge_op(model: ModelSpec, cfg: Config) -> Op:
    """Ring attention's merges of its cp steps' partial results (memory-bound; 0 without ring CP or a fused kernel),
    as Transformer Engine runs them (:data:`RING_MERGE_FIRST_BYTES`): forward, the output rescaled by each step's
    log-sum-exp and summed (flash_attn_fwd_out_correction_init / _out_correction); backward, dQ summed over the steps
    on this rank and dK / dV over the steps their block passes through, after one copy of K / V into the ring's send
    buffer (4 B per element). Later steps cover :data:`RING_ROWS_PER_LATER_STEP` of a rank's rows on average (half
    the queries or half the keys in a balanced causal split; all of them without a causal mask). The per-head
    log-sum-exp merges are 1 / head_dim of these bytes and left out."""
    T = cfg.tokens_per_rank
    steps = np.asarray(cfg.cp, dtype=float) - 1.0
    later = np.where(model.causal, RING_ROWS_PER_LATER_STEP, 1.0) * steps
    per_element = RING_MERGE_FIRST_BYTES + RING_MERGE_LATER_BYTES * later
    out_elems = T * model.attn_out_dim / cfg.tp
    dq_elems = T * model.attn_q_dim / cfg.tp
    kv_elems = T * (model.attn_k_dim + model.attn_v_dim) / cfg.tp
    on = (np.asarray(cfg.cp) > 1) & (np.asarray(cfg.cp_kind) == "ring") & np.asarray(cfg.flash_attention, dtype=bool)
    fwd = out_elems * per_element
    bwd = (dq_elems + kv_elems) * per_element + kv_elems * RING_MERGE_FIRST_BYTES
    return Op("cp_ring_merge", "memory", hbm_bytes=np.where(on, fwd, 0.0), bwd_ratio=bwd / np.maximum(fwd, 1e-30),
              weight_grad_fraction=0.0, recompute_module="core_attn", recompute_when=cfg.recompute_fused_attention)


def image_keys(model: ModelSpec) -> float:
    """Keys one sample's cross-attention queries see: its images' tokens (``cross_attention_tokens`` each)."""
    return float(model.vision_images * model.cross_attention_tokens)


def cross_attention_ops(model: ModelSpec, cfg: Config) -> list[Op]:
    """A cross-attention block (Llama 3.2 Vision, transformers' MllamaTextCrossAttention; Alayrac et al. 2022's
    gated cross-attention): queries from the T text tokens (h -> q_dim, no RoPE), keys and values from the
    micro-batch's image tokens, V = b x images x ``cross_attention_tokens``, already projected to the text width
    (h -> 2 kv_dim), an RMSNorm on each head's queries and keys, every query attending all of its sample's image
    keys (no causal mask: :class:`AttentionShape` causal False), the output projection and a tanh gate on the
    residual. TP splits the heads as in self-attention; the image tokens are whole on every TP rank (not split by SP
    or CP). The unfused path: per-head batched GEMMs over the T x V scores and their softmax."""
    t, h = cfg.tp, model.hidden_size
    T = cfg.tokens_per_rank
    keys = image_keys(model)
    V = cfg.micro_batch_size * keys
    flash = np.asarray(cfg.flash_attention, dtype=bool)
    ops = _linear("q_proj", T, h, model.q_dim / t, cfg) + _linear("cross_kv_proj", V, h, 2 * model.kv_dim / t, cfg)
    core_flops = 2.0 * T * keys * 2 * model.q_dim / t  # QK^T and scores x V, q_dim wide each
    shape = AttentionShape(head_dim=model.head_size, keys=keys, causal=False, kernel=cfg.attention_kernel)
    ops.append(Op("attention_core", "attention", flops=np.where(flash, core_flops, 0.0),
                  bwd_ratio=FLASH_ATTN_BWD_RATIO, weight_grad_fraction=0.0, shape=shape, recompute_module="core_attn",
                  recompute_when=cfg.recompute_fused_attention))
    heads = cfg.micro_batch_size * model.num_heads / t
    qk = _gemm("attention_scores", cfg.seq_len / cfg.cp, model.head_size, keys, batch=heads)
    ops.append(Op("attention_core_unfused", "gemm", flops=np.where(flash, 0.0, core_flops),
                  hbm_bytes=np.where(flash, 0.0, 2 * qk.hbm_bytes), gemm_flops=qk.gemm_flops,
                  weight_grad_fraction=0.0, recompute_module="core_attn"))
    ops.append(Op("softmax_dropout", "memory", hbm_bytes=np.where(flash, 0.0, 4 * T * keys * model.num_heads / t),
                  bwd_ratio=1.0, weight_grad_fraction=0.0, recompute_module="core_attn"))
    # the per-head RMSNorms on the queries (text tokens) and keys (image tokens): read and write each
    ops.append(Op("cross_qk_norm", "memory", hbm_bytes=ACT_BYTES * NORM_ELEMENTS * (T * model.q_dim +
                                                                                  V * model.kv_dim) / t,
                  bwd_ratio=ELEMENTWISE_BWD_RATIO, weight_grad_fraction=0.0))
    ops += _linear("attn_out_proj", T, model.q_dim / t, h, cfg)
    return ops


#: HBM bytes per element of the routed experts' output (the k token copies of width h) that Megatron-Core moves adding
#: the second expert GEMM's bias outside the grouped GEMM (megatron/core/transformer/moe/experts.py,
#: TEGroupedMLP._apply_bias, core_v0.15.0 to core_v0.18.0: linear_fc2 runs with skip_bias_add, then per local expert
#: ``t + b * p`` over its rows, concatenated; bf16, as the router's probabilities are without moe_router_dtype):
#: forward b * p written (2 B), the sum reading t and it and writing (6 B), the concatenation read and written (4 B);
#: backward the gradients of b and p, each a product written and read back for its reduction beside the gradient
#: read (2 x 6 B). The first GEMM's bias is Transformer Engine's GroupedLinear epilogue (no pass of its own)
EXPERT_BIAS_FWD_BYTES = 2 + 6 + 4
EXPERT_BIAS_BWD_BYTES = 2 * 6


def moe_load(cfg: Config):
    """The busiest expert-parallel rank's routed token copies over the mean (``RunConfig.moe_load_factor``), where
    experts are split over ranks (EP > 1); 1 without EP, where every rank holds every expert and computes all of
    its tokens' copies whatever their spread. The all-to-alls synchronize the EP group, so that rank's expert
    GEMMs, activations and received volume are the layer's."""
    return np.where(np.asarray(cfg.ep) > 1, cfg.moe_load_factor, 1.0)


def biased_grouped_wgrad(model: ModelSpec, cfg: Config):
    """Whether (a flag, or an array over a batch) the experts' first GEMM takes Transformer Engine's biased 16-bit
    grouped path: Megatron-Core builds it as GroupedLinear with its bias (TEGroupedMLP linear_fc1: bias, not
    skip_bias_add; the second GEMM returns its bias to Megatron-Core's loop), and in 16-bit GroupedLinear fuses the
    bias gradient into its per-expert weight-gradient GEMMs (transformer_engine/pytorch/module/grouped_linear.py v2.9,
    backward: "Grad bias is fused with wgrad GEMM"; fp8 / mxfp8 compute it apart, bgrad_quantize). So: a MoE model
    with biased experts, a stack issuing per-expert GEMMs, a 16-bit precision."""
    if not (model.is_moe and model.mlp_bias):
        return False
    return np.asarray(cfg.per_expert_gemm_calls, dtype=bool) & np.isin(np.asarray(cfg.precision), SIXTEEN_BIT)


def ffn_ops(model: ModelSpec, cfg: Config, moe: bool) -> list[Op]:
    """The feed-forward half of a layer: a dense MLP split by TP ("mlp" recomputes it), or the router, the routed
    experts (grouped GEMMs over the local experts; with expert biases, Megatron-Core's unfused pass adding the second
    GEMM's, :data:`EXPERT_BIAS_FWD_BYTES`) and the shared experts, all of which "moe" recomputes."""
    T, t, h = cfg.tokens_per_rank, cfg.tp, model.hidden_size
    n_mats = 3 if model.gated_mlp else 2
    ops: list[Op] = []
    if moe:
        k = model.experts_per_token
        f = model.moe_ffn_hidden_size
        # each TP rank routes its SP shard
        ops.append(_gemm("router", T / sp_degree(cfg), h, model.num_experts, recompute_module="moe"))
        # routed experts (Megatron-Core MoE): after the EP all-to-all and the expert-TP all-gather each GPU holds,
        # with balanced routing, the k copies of its expert-TP group's tokens (T etp / tp with SP: the group's
        # sequence shards; T without SP, where TP ranks hold the same tokens and expert TP = TP) spread over its
        # E/ep local experts, and runs them as a grouped GEMM of E/ep GEMMs of m_e = T k ep / E x etp / tp tokens
        # each, each expert's matrices split over the etp ranks
        etp = cfg.expert_tp
        local = model.num_experts / cfg.ep
        # the busiest EP rank's copies (moe_load: RunConfig.moe_load_factor, 1 balanced) set the layer's pace
        m_e = T * k / local * expert_tp_token_share(cfg) * moe_load(cfg)
        # host calls of the grouped GEMM: one per local expert where the stack loops over them
        # (RunConfig.per_expert_gemm_calls), none that can bind where one grouped kernel runs them all
        per_expert = np.asarray(cfg.per_expert_gemm_calls, dtype=bool)
        calls = np.where(per_expert, local, 0.0)
        # the dispatcher the tokens came through (:func:`alltoall_dispatch`) sets the calls' issue time
        issue = dict(expert_calls=calls, expert_alltoall=alltoall_dispatch(cfg))
        experts_in = [_grouped(op, per_expert) for op in
                      _linear("experts_in", m_e, h, (n_mats - 1) * f / etp, cfg, batch=local, module="moe", **issue)]
        # Transformer Engine's biased 16-bit grouped path (:func:`biased_grouped_wgrad`)
        experts_in[0] = replace(experts_in[0], biased_grouped_wgrad=biased_grouped_wgrad(model, cfg))
        ops += experts_in + [_grouped(op, per_expert) for op in
                             _linear("experts_out", m_e, f / etp, h, cfg, batch=local, module="moe", **issue)]
        if model.mlp_bias:  # biased experts (gpt-oss): the second GEMM's bias, weighted by each copy's probability
            ops.append(Op("experts_out_bias", "memory", hbm_bytes=EXPERT_BIAS_FWD_BYTES * local * m_e * h,
                          bwd_ratio=EXPERT_BIAS_BWD_BYTES / EXPERT_BIAS_FWD_BYTES, weight_grad_fraction=0.0,
                          recompute_module="moe"))
        if model.num_shared_experts:  # DeepSeekMoE: shared experts see every token, a dense MLP of width n_s * f
            f_sh = f * model.num_shared_experts
            ops += _linear("shared_experts_in", T, h, (n_mats - 1) * f_sh / t, cfg, module="moe")
            ops += _linear("shared_experts_out", T, f_sh / t, h, cfg, module="moe")
        # permute before and unpermute + probability-weighted combine after the experts: each reads and writes
        # the T k token copies (bf16); their share per TP rank is 1/sp
        ops.append(Op("moe_permute", "memory", hbm_bytes=ACT_BYTES * 4 * T * k * h / sp_degree(cfg), bwd_ratio=1.0,
                      weight_grad_fraction=0.0, recompute_module="moe"))
    else:
        f = model.ffn_hidden_size
        ops += _linear("mlp_in", T, h, (n_mats - 1) * f / t, cfg, module="mlp")
        ops += _linear("mlp_out", T, f / t, h, cfg, module="mlp")
    return ops


#: elements a fused (RMS/Layer)Norm moves per element of its input in forward: it reads the input and writes the
#: output once (planner/validation/memory_kernels.json checks the profiles' memory-bound efficiency with it)
NORM_ELEMENTS = 2
#: a memory-bound kernel's backward moves twice its forward's bytes (the gradient read and written beside the
#: saved input)
ELEMENTWISE_BWD_RATIO = 2.0
#: bytes per element of the SwiGLU input an fp8 input store keeps (torch.float8_e4m3fn, no scale:
#: megatron/core/fusions/fused_bias_swiglu.py ``input.to(torch.float8_e4m3fn)``)
FP8_STORE_BYTES = 1.0


def elementwise_ops(model: ModelSpec, cfg: Config, kind: LayerKind) -> list[Op]:
    """Memory-bound kernels of a layer (bytes moved per token, bf16), each forward read + write and twice that
    backward: the norms and residual adds of its blocks (a transformer layer's two, ``norms_per_layer`` norms;
    one each in a hybrid layer), the feed-forward activation and RoPE on the attention's queries and keys; apart
    where a recompute module redoes them: the norms ("layernorm"), the MLP activation ("mlp" in a dense layer,
    "moe" in a MoE layer, and "moe_act" too for the routed experts'), RoPE (with MLA's up-projections,
    "mla_up_proj"); the QK-norm of models that have one (``ModelSpec.qk_norm``) is recomputed by none."""
    t, h, sp = cfg.tp, model.hidden_size, sp_degree(cfg)
    share = kind.blocks / 2  # of a two-block layer's norms and residual adds
    norm_elems = NORM_ELEMENTS
    resid_elems = 3 + (0.5 if model.dropout else 0)  # fused bias-dropout-add: read x and residual, write; 1-B mask
    per_elem = 3 if model.gated_mlp else 2  # SwiGLU: read 2f write f; GeLU: read + write
    if kind.moe:  # the busiest EP rank's copies (:func:`moe_load`)
        routed_width = model.moe_ffn_hidden_size * model.experts_per_token / t * moe_load(cfg)
        shared_width = model.moe_ffn_hidden_size * model.num_shared_experts / t
    else:
        routed_width, shared_width = 0.0, (model.ffn_hidden_size / t if kind.ffn else 0.0)
    rotary = kind.mixer == "attention" and model.rotary_positions and not model.learned_positions
    rope_elems = 2 * (model.q_dim + model.kv_dim) / t if rotary else 0
    # QK-norm (Qwen3, Gemma 3: per head; OLMo 2: over the whole projection): an RMSNorm reads this rank's queries
    # and keys and writes them back (Megatron-Core attention.py q_layernorm / k_layernorm, qk_layernorm=True)
    qk_elems = 2 * (model.q_dim + model.kv_dim) / t if (kind.mixer == "attention" and model.qk_norm) else 0
    ops = []
    for name, elems, module in (("norms", share * model.norms_per_layer * norm_elems * h / sp, "layernorm"),
                                ("residual", share * 2 * resid_elems * h / sp, ""),
                                ("mlp_act", per_elem * shared_width, "moe" if kind.moe else "mlp"),
                                ("moe_act", per_elem * routed_width, "moe_act,moe"),
                                ("rope", rope_elems, "mla_up_proj" if model.is_mla else ""),
                                ("qk_norm", qk_elems, "")):
        if np.any(elems):
            ops.append(Op(name, "memory", hbm_bytes=ACT_BYTES * cfg.tokens_per_rank * elems,
                          bwd_ratio=ELEMENTWISE_BWD_RATIO, weight_grad_fraction=0.0, recompute_module=module))
    # the fp8 input store's casts (Megatron-Core activation_func_fp8_input_store, fused_bias_swiglu.py): forward
    # reads the SwiGLU's 2f-wide bf16 input and writes its fp8 copy, backward reads the copy and writes it back in
    # bf16, 3 B per element each way (the activation kernels themselves move what they moved before)
    store = np.asarray(cfg.activation_fp8_input_store, dtype=bool)
    if model.gated_mlp and np.any(store):
        for name, width, module in (("mlp_act_fp8_store", shared_width, "moe" if kind.moe else "mlp"),
                                    ("moe_act_fp8_store", routed_width, "moe_act,moe")):
            if np.any(width):
                ops.append(Op(name, "memory", hbm_bytes=np.where(store, cfg.tokens_per_rank * 2 * width *
                                                                 (ACT_BYTES + FP8_STORE_BYTES), 0.0),
                              bwd_ratio=1.0, weight_grad_fraction=0.0, recompute_module=module))
    return ops


@dataclass(frozen=True)
class SsdTraffic:
    """Per token and TP rank of one, the Mamba-2 SSD kernels' HBM bytes and matmul FLOPs forward and backward
    (:func:`ssd_traffic`); a TP rank of t moves and computes 1/t of each."""

    fwd_bytes: float
    bwd_bytes: float
    fwd_flops: float
    bwd_flops: float


def ssd_traffic(model: ModelSpec) -> SsdTraffic:
    """The chunked SSD algorithm (Dao & Gu 2024, Sec. 6) as mamba_ssm runs it in training
    (mamba_ssm/ops/triton/ssd_combined.py ``_mamba_chunk_scan_combined_fwd`` / ``_bwd``, which Megatron-Core's
    ``mamba_split_conv1d_scan_combined`` calls), kernel by kernel, in bytes per token: with H heads of head dim P
    (inner width d = HP), state N, G groups of B and C and chunks of Q tokens, each token carries d of x and of the
    gate z, GN of B and of C, H of dt, a share S = HPN/Q of the fp32 chunk states and GQ of the fp32 C B^T block.
    Forward: chunk cumsum (dt read bf16, dA and dt written fp32: 10H), chunk state (B, x, dt, dA read, fp32 states
    written: 2GN + 2d + 8H + 4S), state passing (fp32 states read, bf16 written: 6S), C B^T (4GN + 4GQ), chunk scan
    (C B^T, x, z, dt, dA, C, states read, the gated and the raw output written: 4GQ + 8d + 8H + 2GN + 2S), in all
    26H + 8GN + 10d + 12S + 8GQ. Backward recomputes cumsum, C B^T, chunk states and their passing (it keeps none of
    them), then runs dz (12d), dstates (2GN + 4H + 2d + 2S), state-passing backward (8S), dx (6d + 12H + 2GN + 4GQ +
    2S), dB (2d + 8H + 2S + 4GN), dC (2S + 4H + 2d + 4GN), dCB (4d + 8H + 4GQ), two C B^T backward (12GN + 8GQ),
    ddA (4d + 12H + 4GQ) and the cumsum backward (10H): 76H + 30GN + 34d + 26S + 24GQ. FLOPs forward: chunk states
    2dN, C B^T 2GQN, the chunk scan's intra-chunk 2dQ and inter-chunk 2dN: 4dN + 2dQ + 2GQN. Backward
    (``_mamba_chunk_scan_combined_bwd``'s matmuls): the recomputed C B^T (2GQN) and chunk states (2dN), dstates
    (C^T dout, 2dN), dx (the decayed C B^T against dout and B against dstates, 2dQ + 2dN), dB (x^T dstates, 2dN),
    dC (dout states^T, 2dN), dCB (dout x^T, 2dQ), the two C B^T backward (4GQN) and ddA (2dQ): 10dN + 6dQ + 6GQN."""
    H, P, N, G, Q = (model.mamba_heads, model.mamba_head_dim, model.mamba_state_dim, model.mamba_groups,
                     model.mamba_chunk_size)
    d, S, GN, GQ = H * P, H * P * N / Q, G * N, G * Q
    fwd = 26 * H + 8 * GN + 10 * d + 12 * S + 8 * GQ
    bwd = 76 * H + 30 * GN + 34 * d + 26 * S + 24 * GQ
    return SsdTraffic(fwd_bytes=float(fwd), bwd_bytes=float(bwd), fwd_flops=float(4 * d * N + 2 * d * Q + 2 * GQ * N),
                      bwd_flops=float(10 * d * N + 6 * d * Q + 6 * GQ * N))


#: backward / forward HBM traffic of the Mamba mixer's causal depthwise convolution in Megatron-Core's training path
#: (``mamba_split_conv1d_scan_combined``: forward reads x B C and writes them convolved, 4 B per channel; backward
#: recomputes that forward and runs causal_conv1d's backward, reading the input and the output gradient and writing
#: the input gradient, 4 + 6 = 10 B)
MAMBA_CONV_BWD_RATIO = 10 / 4


def mamba_ops(model: ModelSpec, cfg: Config) -> list[Op]:
    """A Mamba-2 mixer (Dao & Gu 2024, Sec. 7; megatron/core/ssm/mamba_mixer.py), split over TP by heads and groups
    as Megatron-Core splits it: the in-projection to z, x, B, C and dt (h -> 2d + 2GN + H, column-parallel), the
    causal depthwise convolution over x, B and C, the SSD scan (:func:`ssd_traffic`, timed by :func:`scan_time_s`),
    the gated group RMSNorm over d and the out-projection
    (d -> h, row-parallel). The scan runs in bf16 / fp32 whatever the GEMM precision."""
    T, t, h = cfg.tokens_per_rank, cfg.tp, model.hidden_size
    d, GN, H = model.mamba_inner, model.mamba_groups * model.mamba_state_dim, model.mamba_heads
    ssd = ssd_traffic(model)
    local = T / t  # the per-rank share of every head-split tensor
    return (_linear("mamba_in_proj", T, h, (2 * d + 2 * GN + H) / t, cfg)
            + [Op("mamba_conv1d", "memory", hbm_bytes=ACT_BYTES * 2 * (d + 2 * GN) * local,
                  bwd_ratio=MAMBA_CONV_BWD_RATIO, weight_grad_fraction=0.0),
               Op("mamba_ssd", "scan", flops=ssd.fwd_flops * local, hbm_bytes=ssd.fwd_bytes * local,
                  bwd_ratio=ssd.bwd_bytes / ssd.fwd_bytes, bwd_flops_ratio=ssd.bwd_flops / ssd.fwd_flops,
                  weight_grad_fraction=0.0),
               Op("mamba_norm", "memory", hbm_bytes=ACT_BYTES * 2 * d * local, bwd_ratio=2.0,
                  weight_grad_fraction=0.0)]
            + _linear("mamba_out_proj", T, d / t, h, cfg))


def attended_keys(cfg: Config):
    """Length of the causal square a fused attention kernel computes per query, on average: the sequence, or with
    packed variable-length documents (``packed_doc_len``, per-document masking via Transformer Engine's THD
    format / flash-attention's varlen kernels) the token-weighted mean document length, at most the sequence."""
    s = np.asarray(cfg.seq_len, dtype=float)
    packed = np.asarray(cfg.packed_doc_len, dtype=float)
    return np.where(packed > 0, np.minimum(packed, s), s)


def attended_fraction(model: ModelSpec, seq_len, window: bool | None = None):
    """Share of the s x s score square a flash kernel computes: half under a causal mask (the masked blocks are
    skipped); for a sliding-window layer (window w < s) the mean number of keys a query attends, w - w (w - 1) /
    (2 s) (the first w queries see fewer), over s. ``window`` True / False: a local / global layer; None: averaged
    over the model's layers. Layers and windows from the spec."""
    seq_len = np.asarray(seq_len, dtype=float)
    if not model.causal:  # a bidirectional encoder: every query attends every key
        return 1.0 + 0.0 * seq_len
    n, w = model.sliding_window_layers, float(model.sliding_window)
    windowed = np.where(seq_len > w, (w - w * (w - 1) / (2 * seq_len)), 0.5 * seq_len) / seq_len
    if window is not None:
        return windowed if window and n else 0.5 + 0.0 * seq_len
    return ((model.num_layers - n) * 0.5 + n * windowed) / model.num_layers


def mla_projection_ops(model: ModelSpec, cfg: Config) -> list[Op]:
    """Multi-head latent attention projections (DeepSeek-V2 paper, Sec. 2.1.2; shapes as in
    :func:`planner.cost.memory.mla_params`). The down-projections to the latents are small and kept whole on every
    TP rank (an approximation of Megatron-Core's MLA); the up-projections are split by heads over TP. Costed
    without the inference-time absorbed-weight trick, as in training."""
    t = cfg.tp
    T = cfg.tokens_per_rank
    h, heads = model.hidden_size, model.num_heads
    qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
    ops = []
    if model.q_lora_rank:
        ops += _linear("q_down_proj", T, h, model.q_lora_rank, cfg)
        ops += _linear("q_up_proj", T, model.q_lora_rank, heads * qk_head / t, cfg, module="mla_up_proj")
    else:
        ops += _linear("q_proj", T, h, heads * qk_head / t, cfg)
    ops += _linear("kv_down_proj", T, h, model.kv_lora_rank + model.qk_rope_head_dim, cfg)
    ops += _linear("kv_up_proj", T, model.kv_lora_rank, heads * (model.qk_nope_head_dim + model.v_head_dim) / t, cfg,
                   module="mla_up_proj")
    return ops


def vision_config(model: ModelSpec, cfg: Config):
    """The configuration the vision encoder (``ModelSpec.vision_encoder``) runs under on the first pipeline stage:
    the micro-batch's images (b x images per sample) of ``vision_tokens`` tokens each, with the stage's TP and SP,
    not split by CP (each CP rank encodes its samples' images), no packing, no offloading."""
    return replace(cfg, cp=1, seq_len=model.vision_tokens, micro_batch_size=cfg.micro_batch_size * model.vision_images,
                   packed_doc_len=0.0, offload_modules="")


def vision_projector_ops(model: ModelSpec, cfg: Config) -> list[Op]:
    """LLaVA's projector on the image tokens (``cfg``: :func:`vision_config`): h_v -> h -> h, GELU between
    (Liu et al. 2023, "Improved Baselines with Visual Instruction Tuning": an MLP of two layers), split by TP
    as a column- then row-parallel pair; Llama 3.2 Vision's: one linear layer from ``vision_output_dim`` (the
    concatenated encoder states, MllamaForConditionalGeneration.multi_modal_projector), split by TP."""
    T, t, h = cfg.tokens_per_rank, cfg.tp, model.hidden_size
    if model.vision_output_dim:  # Llama 3.2 Vision: one linear layer on the unpadded tokens the text attends
        return _linear("vision_proj_in", T * model.cross_attention_tokens / model.vision_tokens,
                       model.vision_output_dim, h / t, cfg)
    return (_linear("vision_proj_in", T, model.vision_hidden_size, h / t, cfg)
            + [Op("vision_proj_act", "memory", hbm_bytes=ACT_BYTES * 2 * T * h / t, bwd_ratio=2.0,
                  weight_grad_fraction=0.0)]
            + _linear("vision_proj_out", T, h / t, h, cfg))


def mtp_projection_ops(model: ModelSpec, cfg: Config) -> list[Op]:
    """The input of one multi-token-prediction module (DeepSeek-V3 report Sec. 2.2, Eq. 21): RMSNorm of the main
    model's hidden state and of the shifted tokens' embedding (a memory-bound pass over 2h, read and written), their
    concatenation projected 2h -> h (a linear layer, split by TP)."""
    T, h = cfg.tokens_per_rank, model.hidden_size
    norms = Op("mtp_norms", "memory", hbm_bytes=ACT_BYTES * T * 2 * (2 * h), bwd_ratio=2.0, weight_grad_fraction=0.0)
    return [norms] + _linear("mtp_proj", T, 2 * h, h / cfg.tp, cfg)


def embedding_ops(model: ModelSpec, cfg: Config) -> list[Op]:
    """Input embedding lookup (memory-bound gather of b*s rows of h)."""
    rows = cfg.tokens_per_rank / sp_degree(cfg)  # with SP the output is scattered along the sequence
    return [Op("embedding", "memory", hbm_bytes=ACT_BYTES * rows * model.hidden_size * 2, bwd_ratio=1.0,
               weight_grad_fraction=1.0)]


#: HBM bytes per logit of Megatron-Core's unfused vocab-parallel cross-entropy beyond the fused one's 12 + 12
#: (megatron/core/tensor_parallel/cross_entropy.py at core_r0.8.0, pass by pass: forward the fp32 copy of the bf16
#: logits 2 + 4, max 4, subtract in place 4 + 4, exp in place 4 + 4, sum 4, divide in place 4 + 4 = 38; backward the
#: in-place scale by the loss gradient 4 + 4 and the bf16 cast for the LM head 4 + 2 = 14)
UNFUSED_CE_EXTRA_FWD_BYTES = 38 - 3 * LOGIT_BYTES
UNFUSED_CE_EXTRA_BWD_BYTES = 14 - 3 * LOGIT_BYTES


def head_ops(model: ModelSpec, cfg: Config) -> list[Op]:
    """Final norm, LM head GEMM (2*b*s*h*V, Narayanan Eq. 3's V/(16Lh) term) and the fp32 cross-entropy: fused
    (``cfg.fused_cross_entropy``, Megatron --cross-entropy-loss-fusion) it writes and re-reads the fp32 logits in
    about three passes each way; unfused it pays the extra passes of :data:`UNFUSED_CE_EXTRA_FWD_BYTES`."""
    T = cfg.tokens_per_rank
    h, V = model.hidden_size, model.vocab_size
    logits_elems = T * V / cfg.tp
    unfused = ~np.asarray(cfg.fused_cross_entropy, dtype=bool)
    return [
        _gemm("lm_head", T, h, V / cfg.tp),
        Op("cross_entropy", "memory", hbm_bytes=LOGIT_BYTES * logits_elems * 3, bwd_ratio=1.0,
           weight_grad_fraction=0.0),
        Op("cross_entropy_unfused", "memory", hbm_bytes=np.where(unfused, UNFUSED_CE_EXTRA_FWD_BYTES * logits_elems,
                                                                 0.0),
           bwd_ratio=UNFUSED_CE_EXTRA_BWD_BYTES / UNFUSED_CE_EXTRA_FWD_BYTES, weight_grad_fraction=0.0),
    ]


#: Megatron-Core's ring attention (Transformer Engine ``AttnFuncWithCPAndKVP2P``, load-balanced split, see
#: planner.cost.context_parallel): query-tile rows per step, in units of a rank's query tiles, averaged over the
#: steps after the first: half of them run all the rank's queries against half a K/V block, half run half its
#: queries against a whole block
RING_ROWS_PER_LATER_STEP = 0.75


def attention_work_factor(shape: AttentionShape, tile_tokens: float, row_overhead_tiles, masked_tile_extra):
    """Tile-equivalents a FlashAttention-style kernel spends per tile of attended (useful) scores, >= 1 (Dao 2023,
    Sec. 3.1 tiling; the costs fitted per kernel in :class:`planner.specs.hardware.AttentionKernel`). With
    n = keys / tile key tiles per sequence, a query-tile row costs ``row_overhead_tiles`` (c) and a masked tile
    ``masked_tile_extra`` (d) on top of its one:

    * causal: n^2 / 2 useful tiles, n diagonal tiles half used (1/2 + d each), n rows: 1 + (1 + 2d + 2c) / n;
      with ring CP of p steps, a rank's n / p query tiles run one diagonal step and p - 1 steps of 3/4 of its
      rows (:data:`RING_ROWS_PER_LATER_STEP`): 1 + (1 + 2d + 2c (1/4 + 3p/4)) / n (the kernel calls are p times
      shorter);
    * sliding window of w < keys tokens: a query tile walks k = ceil((w - 1) / tile) + 1 key tiles, two of them
      masked, for w' / tile useful ones (w' the mean keys a query attends, :func:`attended_fraction`):
      (k + 2d + c) / (w' / tile); its layers weigh by their useful work;
    * bidirectional (an encoder): n^2 useful tiles in n rows: 1 + c / n."""
    B, c, d = tile_tokens, row_overhead_tiles, masked_tile_extra
    keys = np.asarray(shape.keys, dtype=float)
    n = np.maximum(keys / B, 1.0)
    if not shape.causal:
        return 1.0 + c * np.asarray(shape.ring_steps, dtype=float) / n
    p = np.asarray(shape.ring_steps, dtype=float)
    rows = 1.0 + RING_ROWS_PER_LATER_STEP * (np.maximum(p, 1.0) - 1.0)  # row calls per query tile
    global_factor = 1.0 + (1.0 + 2.0 * d + 2.0 * c * rows) / n
    if not (shape.window and shape.window_share):
        return global_factor
    w = float(shape.window)
    tiles = np.minimum(np.ceil((w - 1.0) / B) + 1.0, n)
    attended = np.where(keys > w, w - w * (w - 1.0) / (2.0 * keys), 0.5 * keys)
    window_factor = np.where(keys > w, (tiles + 2.0 * d + c) / np.maximum(attended / B, 1e-9), global_factor)
    # weights: each kind of layer's useful work (half the square for global layers, w' per query for windowed)
    share = float(shape.window_share)
    useful_global, useful_window = (1.0 - share) * 0.5 * keys, share * np.minimum(attended, 0.5 * keys)
    return (useful_global * global_factor + useful_window * window_factor) / (useful_global + useful_window)


def causal_rate_ratio(kernel: AttentionKernel, shape: AttentionShape):
    """The share of an unmasked call's tile rate that ``shape``'s calls reach: ``kernel.causal_plateau_ratio`` for
    causal calls, 1 for unmasked ones. Under ring CP only the diagonal step is a causal call (Transformer Engine's
    ``AttnFuncWithCPAndKVP2P`` runs the later steps' half blocks without a mask), 1 / p of the equal steps' work
    (:func:`planner.cost.context_parallel.balanced_causal_work`)."""
    if not shape.causal:
        return 1.0
    causal_share = 1.0 / np.maximum(np.asarray(shape.ring_steps, dtype=float), 1.0)
    return 1.0 / (causal_share / kernel.causal_plateau_ratio + 1.0 - causal_share)


def attention_rate_flops(kernel: AttentionKernel, shape: AttentionShape, backward: bool = False):
    """Attended FLOP/s of ``kernel`` at ``shape`` (forward, or backward): its plateau rate at the shape's head
    dimension, times the causal calls' share of it (:func:`causal_rate_ratio`), over the tiles it spends per
    attended tile (:func:`attention_work_factor`)."""
    head_dim = shape.head_dim
    work = attention_work_factor(shape, kernel.tile_tokens, kernel.row_overhead_tiles(head_dim, backward),
                                 kernel.masked_tile_extra)
    return kernel.plateau_flops(head_dim, backward) * causal_rate_ratio(kernel, shape) / work


def attention_time_s(op: Op, gpu: GPU, backward: bool = False):
    """Time of the fused attention core ``op`` forward (or backward: ``op.bwd_ratio`` times its FLOPs): with a
    kernel table in the profile (:class:`planner.specs.hardware.AttentionKernel`), at the kernel's rate for the
    op's shape (:func:`attention_rate_flops`); without one, at the profile's single ``attention_efficiency``; either
    at the part's sustained share of its datasheet clocks (``GPU.sustained_tensor_ratio``)."""
    flops = op.flops * (op.bwd_ratio if backward else 1.0)
    if gpu.attention_kernel is None or op.shape is None:
        return flops / (gpu.tensor_flops * gpu.attention_efficiency)
    names = np.asarray(op.shape.kernel)
    if names.ndim == 0:
        rate = attention_rate_flops(gpu.attention_table(str(names)), op.shape, backward)
    else:  # a batch whose configurations name different kernels: each kernel's rate where it is named
        rate = np.zeros(names.shape)
        for name in np.unique(names):
            rate = np.where(names == name, attention_rate_flops(gpu.attention_table(str(name)), op.shape, backward),
                            rate)
    # the tables hold the kernels' speeds at the datasheet clocks; a power-capped part runs them slower
    return flops / (rate * gpu.sustained_tensor_ratio)


def op_time_s(op: Op, gpu: GPU):
    """Forward time of one operator: FLOPs / (sustained peak x efficiency) for compute (``GPU.tensor_flops``: the
    datasheet peak at the share a power limit leaves), bytes / (HBM BW x efficiency) for memory-bound kernels."""
    if op.kind == "gemm":
        # roofline: the slower of compute at the efficiency of this GEMM size and moving its operands over HBM. A
        # narrower precision runs at its tensor-core peak (s x bf16's); its efficiency is the curve's at the
        # bf16 GEMM of the same duration (FLOPs / s): launch and tail overheads scale with time, not FLOPs; times
        # the fraction of that efficiency the narrow format's kernels reach (fitted, ``gemm_efficiency_ratio``)
        speedup = gpu.tensor_speedup(op.precision)
        size = np.where(np.asarray(op.gemm_flops) != 0, op.gemm_flops, op.flops) / speedup
        efficiency = gpu.matmul_efficiency(size) * gpu.gemm_efficiency_ratio(op.precision)
        compute = op.flops / (gpu.tensor_flops * speedup * efficiency)
        return np.maximum(compute, op.hbm_bytes / gpu.hbm_bandwidth_bytes_per_s)
    if op.kind == "attention":
        return attention_time_s(op, gpu)
    if op.kind == "scan":
        return scan_time_s(op, gpu)
    return op.hbm_bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_bound_efficiency)


def scan_time_s(op: Op, gpu: GPU, backward: bool = False):
    """Time of a fused kernel of many small matmuls over a long stream (the Mamba-2 SSD, :func:`ssd_traffic`),
    forward or backward (``Op.bwd_flops_ratio`` times its FLOPs, ``Op.bwd_ratio`` times its bytes): the slower of
    its bytes at the memory-bound kernels' efficiency and its FLOPs at ``GPU.ssd_scan_flops``, the rate the
    profile's fitted value gives those kernels (their Triton tiles are far smaller than a GEMM's) at the part's
    sustained share of its clocks (``GPU.sustained_tensor_ratio``: the value is fitted at rated power), or where
    the profile has none at the matmul efficiency of their whole work."""
    flops_ratio = np.where(np.asarray(op.bwd_flops_ratio) > 0, op.bwd_flops_ratio, op.bwd_ratio)
    flops = op.flops * (flops_ratio if backward else 1.0)
    hbm = op.hbm_bytes * (op.bwd_ratio if backward else 1.0)
    rate = (gpu.ssd_scan_flops * gpu.sustained_tensor_ratio if gpu.ssd_scan_flops > 0
            else gpu.tensor_flops * gpu.matmul_efficiency(flops))
    return np.maximum(flops / rate, hbm / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_bound_efficiency))


@dataclass(frozen=True)
class PassTimes:
    """Times of one micro-batch through a group of ops: forward, input-gradient (B), weight-gradient (W), and the
    extra forward work under selective recompute (numbers, or arrays over a batch)."""

    fwd_s: float | np.ndarray
    bwd_input_s: float | np.ndarray
    bwd_weight_s: float | np.ndarray
    selective_recompute_s: float | np.ndarray
    #: forward + backward of the kernels alone, and of the host's per-expert GEMM issue alone (both passes)
    kernel_s: float | np.ndarray = 0.0
    issue_s: float | np.ndarray = 0.0

    @property
    def bwd_s(self):
        return self.bwd_input_s + self.bwd_weight_s

    def on_sm_share(self, share):
        """These pass times with every kernel on ``share`` of the GPU's SMs (:func:`compute_sm_share`): the kernels'
        times over the share (a GEMM or attention kernel's tiles take proportionally more waves; memory-bound kernels
        are taken the same, their SMs' issue and load slots reserved alike); the host's issue time is unchanged."""
        share = np.asarray(share, dtype=float)
        return replace(self, fwd_s=self.fwd_s / share, bwd_input_s=self.bwd_input_s / share,
                       bwd_weight_s=self.bwd_weight_s / share,
                       selective_recompute_s=self.selective_recompute_s / share, kernel_s=self.kernel_s / share)

    def paired_scale(self):
        """The share of this pass pair's time left when another micro-batch's kernels fill the host's issue gaps
        (Megatron-Core's batch-level MoE overlap runs one micro-batch's forward beside another's backward: while
        the host waits on one's dropless token counts and issues its expert GEMMs one by one, the GPU runs the
        other's queued kernels): max(kernels, issue) of the pair over the sum of each op's max (1 where nothing
        is host-bound)."""
        floored = self.fwd_s + self.bwd_input_s + self.bwd_weight_s
        paired = np.maximum(self.kernel_s, self.issue_s)
        return np.where(floored > 0, np.minimum(1.0, paired / np.where(floored > 0, floored, 1.0)), 1.0)


def compute_sm_share(gpu: GPU, reserved_sms):
    """The share of the GPU's SMs left to compute kernels when the stack reserves ``reserved_sms`` (a number, or an
    array over a batch) for its communication kernels (``RunConfig.comm_reserved_sms``): (S - R) / S with S the
    profile's ``sm_count`` (DeepSeek-V3 report Sec. 3.5.1: 20 of the H800's 132 SMs for communication, "which will
    limit the computational throughput"); 1 where none are reserved. ``validity`` refuses R >= S and a reservation
    on a profile without an SM count."""
    reserved = np.asarray(reserved_sms, dtype=float)
    total = float(gpu.sm_count)
    return np.where((reserved > 0) & (total > reserved), (total - reserved) / max(total, 1.0), 1.0)


def op_bwd_time_s(op: Op, gpu: GPU, fwd_s):
    """Backward time of one operator whose forward takes ``fwd_s``: the attention kernel at its own backward rate
    (:func:`attention_time_s`), a scan by its backward kernels' FLOPs and bytes (:func:`scan_time_s`), any other op
    ``bwd_ratio`` times its forward."""
    if op.kind == "attention":
        return attention_time_s(op, gpu, backward=True)
    if op.kind == "scan":
        return scan_time_s(op, gpu, backward=True)
    return fwd_s * op.bwd_ratio


def _may_hold_op_sac(modules) -> bool:
    """Whether ``modules`` (a string, or an array of them over a batch) may name a torchtitan per-op policy: false
    only where it is one string without one, the common case the search's batches skip the arithmetic for."""
    if isinstance(modules, str):
        return "op_sac" in modules
    one = single_value(np.asarray(modules))
    return one is None or "op_sac" in str(one)


def recomputed(op: Op, modules):
    """The share of ``op``'s forward that selective recomputation under ``modules`` (a configuration's
    ``recompute_modules``, or an array of them) redoes in backward: 1 where one of its Megatron-Core modules is on,
    its :func:`op_sac_shares` share under a torchtitan policy, else 0."""
    sac = 0.0
    if _may_hold_op_sac(modules):
        sac = np.maximum(np.where(recompute_module_on(modules, "op_sac"), op.op_sac, 0.0),
                         np.where(recompute_module_on(modules, "op_sac_v02"), op.op_sac_v02, 0.0))
    if not op.recompute_module:
        return sac
    on = False
    for module in op.recompute_module.split(","):
        on = on | recompute_module_on(modules, module)
    return np.maximum(np.where(on & np.asarray(op.recompute_when, dtype=bool), 1.0, 0.0), sac)


def biased_wgrad_slowdown(op: Op, gpu: GPU):
    """(backward time multiplier, weight-gradient share) of ``op`` where its weight gradients run
    ``gpu.biased_grouped_wgrad_factor`` times longer (``Op.biased_grouped_wgrad``): the weight-gradient share w of
    its backward becomes w k, so backward takes (1 - w) + w k times as long and w k / ((1 - w) + w k) of it is the
    weight-gradient pass; (1, w) elsewhere."""
    w = op.weight_grad_fraction
    slow = np.where(np.asarray(op.biased_grouped_wgrad, dtype=bool), gpu.biased_grouped_wgrad_factor, 1.0)
    scale = (1.0 - w) + w * slow
    return scale, w * slow / scale


def pass_times(ops: list[Op], gpu: GPU, modules="") -> PassTimes:
    """Forward, input- and weight-gradient times of ``ops``, and the forward time selective recomputation of
    ``modules`` (the configuration's ``recompute_modules``) adds."""
    fwd = bwd_in = bwd_w = sel = kernels = issued = 0.0
    for op in ops:
        tf = op_time_s(op, gpu)
        tb = op_bwd_time_s(op, gpu, tf)
        w = op.weight_grad_fraction
        if gpu.biased_grouped_wgrad_factor != 1.0 and np.any(op.biased_grouped_wgrad):
            scale, w = biased_wgrad_slowdown(op, gpu)
            tb = tb * scale
        kernels = kernels + tf + tb
        if np.any(op.expert_calls) and (gpu.expert_gemm_call_s or gpu.expert_alltoall_sync_s):
            # a grouped expert GEMM runs no faster than the stack issues its per-expert GEMMs (and, after the
            # all-to-all dispatcher's host sync, what the host issues before them onto the idle GPU)
            issue = gpu.expert_issue_s(op.precision, op.expert_calls, op.expert_alltoall)
            issued = issued + (1.0 + GEMM_BWD_RATIO) * issue
            tf, tb = np.maximum(tf, issue), np.maximum(tb, GEMM_BWD_RATIO * issue)
        fwd = fwd + tf
        bwd_w = bwd_w + tb * w
        bwd_in = bwd_in + tb * (1.0 - w)
        sel = sel + tf * recomputed(op, modules)
    return PassTimes(fwd, bwd_in, bwd_w, sel, kernels, issued)


def attention_core_s(ops: list[Op], gpu: GPU, cfg: Config):
    """(forward time, backward / forward ratio) of the attention core among ``ops``: the fused kernel's, or the
    unfused score and value GEMMs' (the ring of context parallelism overlaps its transfers with this time)."""
    core = [o for o in ops if o.name in ATTENTION_CORE_OPS]
    fwds = [op_time_s(o, gpu) for o in core]
    fwd = sum(fwds)
    bwd = sum(op_bwd_time_s(o, gpu, t) for o, t in zip(core, fwds))
    ratio = np.where(cfg.flash_attention, FLASH_ATTN_BWD_RATIO, GEMM_BWD_RATIO)
    return fwd, np.where(np.asarray(fwd) > 0, bwd / np.where(np.asarray(fwd) > 0, fwd, 1.0), ratio)


#: per block of a layer, the linear layers TP splits column-wise (their input all-gathered under sequence
#: parallelism) and row-wise (their output reduce-scattered): Megatron-Core's ColumnParallelLinear /
#: RowParallelLinear of the mixer (attention or Mamba) and of the feed-forward block (MLP, or the experts and shared
#: experts of a MoE block)
TP_COLUMN_GEMMS = {"mixer": ("qkv_proj", "q_proj", "q_down_proj", "q_up_proj", "kv_down_proj", "kv_up_proj",
                             "mamba_in_proj"),
                   "ffn": ("mlp_in", "experts_in", "shared_experts_in")}
TP_ROW_GEMMS = {"mixer": ("attn_out_proj", "mamba_out_proj"), "ffn": ("mlp_out", "experts_out", "shared_experts_out")}


def tp_overlap_windows(ops: list[Op], gpu: GPU, kind: LayerKind) -> list[tuple]:
    """Per TP-split block of a layer of kind ``kind`` (its mixer, then its feed-forward block; ``kind.blocks`` of
    them), the forward time of the block's column-parallel GEMMs and of its row-parallel GEMMs: the windows its
    all-gather and its reduce-scatter can hide under. Transformer Engine's userbuffers overlap each collective with
    the GEMM next to it, not with the layer's others (transformer_engine/pytorch/module/layernorm_linear.py and
    linear.py: ``ub_overlap_ag`` splits the gathered input's GEMM, qkv / fc1; ``ub_overlap_rs`` the GEMM whose
    output is scattered, proj / fc2; Megatron-Bridge comm_overlap.py configures qkv_fprop, proj_fprop, fc1_fprop,
    fc2_fprop)."""
    times = {o.name: op_time_s(o, gpu) for o in ops if o.kind == "gemm"}
    blocks = [b for b, present in (("mixer", bool(kind.mixer)), ("ffn", bool(kind.ffn))) if present]
    return [(sum(times.get(n, 0.0) for n in TP_COLUMN_GEMMS[b]), sum(times.get(n, 0.0) for n in TP_ROW_GEMMS[b]))
            for b in blocks]


# ---------------------------------------------------------------------------------------------------------------
# Model FLOPs (for MFU) — closed forms from the papers
# ---------------------------------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def model_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int, causal_half: bool = False,
                         keys: float | None = None) -> float:
    """Model FLOPs of one training step (forward + backward, no recomputation).

    For a GPT model this is Korthikanti et al. 2022, App. A, Eq. 7: 72 B L s h^2 (1 + s/(6h) + V/(12 h L));
    the general form counts each GEMM of the layer (GQA, gated MLP, MoE active experts) at 3 x 2mkn.
    ``causal_half`` counts only the unmasked half of the attention scores (the convention some reports use).
    ``keys``: the square's side per query when it is not the sequence (packed documents: :func:`attended_keys`,
    each document's own square). A vision encoder adds its layers' and projector's FLOPs on every sample's images;
    cross-attention layers their Q / output projections per text token, the K / V projections per image token and
    a whole T x V square (no causal half) per sample.
    """
    h, s, B = model.hidden_size, seq_len, global_batch
    tokens = B * s
    attn_proj = 2 * h * (model.q_dim + 2 * model.kv_dim) + 2 * model.q_dim * h
    if model.is_mla:  # 2 FLOPs per weight of each MLA projection (DeepSeek-V2 Sec. 2.1.2)
        attn_proj = float(sum(o.flops for o in mla_projection_ops(model, RunConfig(num_gpus=1, seq_len=1)))) + \
            2 * model.attn_out_dim * h
    n_mats = 3 if model.gated_mlp else 2
    dense_mlp = 2 * n_mats * h * model.ffn_hidden_size
    moe_mlp = 0.0
    if model.is_moe:
        moe_mlp = 2 * n_mats * h * model.moe_ffn_hidden_size * (model.experts_per_token + model.num_shared_experts)
        moe_mlp += 2 * h * model.num_experts
    mamba = 0.0
    if model.mamba_heads:  # in- and out-projection weights, 2 FLOPs each, and the SSD scan (ssd_traffic)
        d, GN = model.mamba_inner, model.mamba_groups * model.mamba_state_dim
        mamba = 2 * h * (2 * d + 2 * GN + model.mamba_heads) + 2 * d * h + ssd_traffic(model).fwd_flops
    cross = 2 * h * model.q_dim + 2 * model.q_dim * h  # a cross-attention layer's Q and output projections
    per_kind = ({"attention": attn_proj, "mamba": mamba, "cross_attention": cross, "": 0.0},
                {"dense": dense_mlp, "moe": moe_mlp, "": 0.0})
    kinds = model.layer_kinds
    counts = [model.kind_index.count(k) for k in range(len(kinds))]
    per_token_layers = sum(n * (per_kind[0][k.mixer] + per_kind[1][k.ffn]) for n, k in zip(counts, kinds))
    attention_layers = sum(n for n, k in zip(counts, kinds) if k.mixer == "attention")
    attn_core = 2 * (s if keys is None else keys) * (model.attn_q_dim + model.attn_out_dim) * attention_layers * \
        (0.5 if causal_half else 1.0)
    head = 2 * h * model.vocab_size
    cross_layers = sum(n for n, k in zip(counts, kinds) if k.mixer == "cross_attention")
    if cross_layers:  # every text token attends all its sample's image keys; K and V projected per image token
        image_tokens = model.vision_images * model.cross_attention_tokens
        attn_core += 2 * image_tokens * 2 * model.q_dim * cross_layers
    vision = 0.0
    if model.vision_layers:  # the encoder and projector on each sample's images (whole attention squares)
        vcfg = RunConfig(num_gpus=1, seq_len=model.vision_tokens, micro_batch_size=model.vision_images)
        vision = B * float(model.vision_layers * sum(o.flops for o in layer_ops(model.vision_encoder, vcfg))
                           + sum(o.flops for o in vision_projector_ops(model, vcfg)))
        vision += B * cross_layers * model.vision_images * model.cross_attention_tokens * 2 * h * 2 * model.kv_dim
    return 3.0 * (tokens * (per_token_layers + attn_core + head) + vision)


def gpt_model_flops_eq7(B: int, s: int, L: int, h: int, V: int) -> float:
    """Korthikanti et al. 2022, App. A, Eq. 7: 72 B L s h^2 (1 + s/(6h) + V/(12 h L))."""
    return 72.0 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))


def gpt_full_recompute_flops_eq3(B: int, s: int, L: int, h: int, V: int) -> float:
    """Narayanan et al. 2021, Eq. 3: 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) (with one extra forward)."""
    return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def gpt_selective_hardware_flops_eq8(B: int, s: int, L: int, h: int, V: int) -> float:
    """Korthikanti et al. 2022, App. A, Eq. 8: 72 B L s h^2 (1 + s/(3h) + V/(12 h L))."""
    return 72.0 * B * L * s * h * h * (1 + s / (3 * h) + V / (12 * h * L))
