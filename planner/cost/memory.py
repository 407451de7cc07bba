"""Memory cost per GPU: parameters, model states under ZeRO, and activations under TP / SP / CP / recomputation.

Sources:
* Parameters: Narayanan et al. 2021, Eq. 2, P = 12 L h^2 (1 + 13/(12h) + (V+s)/(12 L h)) for GPT; the general
  count below adds GQA, gated MLPs, RMSNorm, untied heads and experts matrix by matrix.
* Model states: Rajbhandari et al. 2020 (ZeRO), mixed-precision Adam = 2 + 2 + 12 bytes per parameter; stage 1
  shards the 12 optimizer bytes over the data-parallel group, stage 2 also the gradients, stage 3 the weights.
* Activations: Korthikanti et al. 2022, Table 2, per layer s b h (34 + 5 a s / h) bytes and its TP / SP /
  selective / full variants; the general form below counts each stored tensor, so it reduces to Table 2 for GPT
  (dropout, GELU MLP of 4h, multi-head attention) and covers GQA, SwiGLU, no-dropout and flash attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost.compute import (ACT_BYTES, FP8_STORE_BYTES, Config, expert_tp_token_share, image_keys, moe_load,
                                  sp_degree, torchtitan_matmuls)
from planner.specs.config import per_precision, recompute_module_on
from planner.specs.model import DENSE_LAYER, MOE_LAYER, LayerKind, ModelSpec

WEIGHT_BYTES = 2  # bf16 weights
GRAD_BYTES = 2  # bf16 gradients (ZeRO paper's 2 + 2 + 12)
OPTIMIZER_BYTES = 12  # fp32 master weights + Adam's two moments
MASTER_WEIGHT_BYTES = 4  # fp32 master weights
LOGIT_BYTES = 4


# ---------------------------------------------------------------------------------------------------------------
# Parameter counts
# ---------------------------------------------------------------------------------------------------------------
def norm_params(model: ModelSpec) -> int:
    return model.hidden_size * (2 if model.norm == "layernorm" else 1)


def mla_params(model: ModelSpec) -> int:
    """Multi-head latent attention weights (DeepSeek-V2 paper, Sec. 2.1.2, Eq. 9-10 and 12-13 for the shapes).

    Queries: h -> q_lora_rank (with its RMSNorm) -> heads x (nope + rope); without a query rank, h -> heads x
    (nope + rope) directly. Keys and values: h -> kv_lora_rank + rope (the shared rotary key), RMSNorm on the
    latent, latent -> heads x (nope + v). Output: heads x v -> h. DeepSeek-V3: 187.1M per layer.
    """
    h, heads = model.hidden_size, model.num_heads
    qk_head = model.qk_nope_head_dim + model.qk_rope_head_dim
    if model.q_lora_rank:
        q = h * model.q_lora_rank + model.q_lora_rank + model.q_lora_rank * heads * qk_head
    else:
        q = h * heads * qk_head
    kv = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank + \
        model.kv_lora_rank * heads * (model.qk_nope_head_dim + model.v_head_dim)
    return q + kv + model.attn_out_dim * h


def attention_params(model: ModelSpec) -> int:
    """Q, K, V and output projections (with their biases where the model has them) and the QK-norm weights: a
    head_dim weight each for queries and keys ("head", Qwen3 / Gemma 3), or q_dim + kv_dim ("full", OLMo 2)."""
    if model.is_mla:
        return mla_params(model)
    h = model.hidden_size
    n = h * (model.q_dim + 2 * model.kv_dim) + model.q_dim * h
    if model.linear_bias:
        n += model.q_dim + 2 * model.kv_dim + h
    if model.qk_norm == "head":
        n += 2 * model.head_size
    elif model.qk_norm == "full":
        n += model.q_dim + model.kv_dim
    return n


def dense_mlp_params(model: ModelSpec, ffn: int | None = None) -> int:
    h = model.hidden_size
    f = model.ffn_hidden_size if ffn is None else ffn
    n_mats = 3 if model.gated_mlp else 2
    n = n_mats * h * f
    if model.mlp_bias:
        n += (n_mats - 1) * f + h
    return n


def expert_params_per_layer(model: ModelSpec) -> int:
    """Routed expert weights of one MoE layer (sharded by expert parallelism)."""
    return model.num_experts * dense_mlp_params(model, model.moe_ffn_hidden_size) if model.is_moe else 0


def mamba_params(model: ModelSpec) -> int:
    """A Mamba-2 mixer's weights (megatron/core/ssm/mamba_mixer.py): the in-projection h x (2d + 2GN + H) (z, x, B,
    C, dt), the depthwise convolution over x, B and C (kernel and bias per channel), A_log, D and dt_bias per head,
    the gated RMSNorm's weight over d and the out-projection d x h; no projection biases (Nemotron-H
    ``mamba_proj_bias`` false)."""
    h, d, GN, H = model.hidden_size, model.mamba_inner, model.mamba_groups * model.mamba_state_dim, model.mamba_heads
    conv_channels = d + 2 * GN
    return h * (2 * d + 2 * GN + H) + conv_channels * (model.mamba_conv_kernel + 1) + 3 * H + d + d * h


def mixer_params(model: ModelSpec, kind: LayerKind) -> int:
    """The token mixer of a layer of kind ``kind``: attention, a Mamba-2 mixer, or none."""
    return {"attention": attention_params, "mamba": mamba_params,
            "cross_attention": cross_attention_params}.get(kind.mixer, lambda m: 0)(model)


def cross_attention_params(model: ModelSpec) -> int:
    """A cross-attention block (transformers' MllamaTextCrossAttention and its decoder layer): the Q, K, V and output
    projections of self-attention, an RMSNorm of head_dim on the queries and one on the keys, and the block's two
    tanh gates (attention and MLP)."""
    return attention_params(model.with_(qk_norm="")) + 2 * model.head_size + 2


def layer_norms(model: ModelSpec, kind: LayerKind) -> int:
    """Norm weights of a layer, replicated over TP (Megatron): ``norms_per_layer`` for a transformer layer's two
    blocks, half of them per block in a hybrid layer."""
    return model.norms_per_layer * kind.blocks // 2 * norm_params(model)


def layer_params(model: ModelSpec, kind: LayerKind = DENSE_LAYER) -> int:
    """All parameters of one decoder layer of kind ``kind`` (its mixer, its MLP or MoE incl. shared experts and
    router, its norms)."""
    n = mixer_params(model, kind) + layer_norms(model, kind)
    if kind.moe:
        n += expert_params_per_layer(model)
        n += model.num_shared_experts * dense_mlp_params(model, model.moe_ffn_hidden_size)
        n += model.hidden_size * model.num_experts  # router
    elif kind.ffn:
        n += dense_mlp_params(model)
    return n


def embedding_params(model: ModelSpec, seq_len: int | None = None) -> int:
    n = model.vocab_size * model.hidden_size
    if model.learned_positions:
        n += (seq_len or model.max_seq_len) * model.hidden_size
    return n


def head_params(model: ModelSpec) -> int:
    """Final norm plus the LM head matrix (none when tied to the input embedding)."""
    return norm_params(model) + (0 if model.tied_embeddings else model.vocab_size * model.hidden_size)


def vision_params(model: ModelSpec) -> int:
    """The vision encoder's layers, the projector (LLaVA's two layers, h_v h + h + h h + h; Llama 3.2 Vision's one,
    from ``vision_output_dim``: d_out h + h) and what the spec counts besides (``vision_extra_params``: LLaVA's
    patch and position embeddings, under 1M for a ViT-L, are left out). 0 without an encoder."""
    enc = model.vision_encoder
    if enc is None:
        return 0
    h, hv = model.hidden_size, model.vision_hidden_size
    projector = model.vision_output_dim * h + h if model.vision_output_dim else hv * h + h + h * h + h
    return enc.num_layers * layer_params(enc) + projector + model.vision_extra_params


def total_params(model: ModelSpec, seq_len: int | None = None) -> int:
    """Total parameters (Narayanan Eq. 2 for GPT with learned positions of length s), a vision encoder's included."""
    layers = sum(model.kind_index.count(k) * layer_params(model, kind) for k, kind in enumerate(model.layer_kinds))
    return layers + embedding_params(model, seq_len) + head_params(model) + vision_params(model)


def active_params(model: ModelSpec, seq_len: int | None = None) -> int:
    """Parameters touched per token: routed experts count only the top-k chosen ones."""
    if not model.is_moe:
        return total_params(model, seq_len)
    unused = (model.num_experts - model.experts_per_token) * dense_mlp_params(model, model.moe_ffn_hidden_size)
    return total_params(model, seq_len) - model.num_moe_layers * unused


def gpt_params_eq2(L: int, h: int, V: int, s: int) -> float:
    """Narayanan et al. 2021, Eq. 2: P = 12 L h^2 (1 + 13/(12h) + (V+s)/(12 L h))."""
    return 12.0 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))


# ---------------------------------------------------------------------------------------------------------------
# Activations
# ---------------------------------------------------------------------------------------------------------------
#: bytes per element of a linear layer's input as Transformer Engine saves it for the weight gradient: the
#: quantized copy, column-wise data only ("Discard row-wise data since it is not needed in backward pass",
#: transformer_engine/pytorch/module/linear.py and grouped_linear.py, TE v2.18), 1 B in fp8 and, in mxfp8, one
#: E8M0 scale per 32-element block (the OCP MX format); the bf16 tensor itself in 16-bit training
SAVED_INPUT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32}


def saved_linear_input_bytes(precision):
    """:data:`SAVED_INPUT_BYTES` of a precision name or an array of them."""
    return per_precision(precision, SAVED_INPUT_BYTES.items(), 2.0)


def activation_input_bytes(model: ModelSpec, cfg: Config):
    """Bytes per output element the feed-forward activation keeps for backward: a GELU / squared ReLU its input
    (2, bf16); a SwiGLU its two halves (4), or their fp8 copy (2) under ``activation_fp8_input_store``
    (Megatron-Core ``activation_func_fp8_input_store``, SwiGLU only: transformer_config.py)."""
    if not model.gated_mlp:
        return 2.0
    return np.where(np.asarray(cfg.activation_fp8_input_store, dtype=bool), 2 * FP8_STORE_BYTES, 2 * ACT_BYTES)


#: the planner ops of torchtitan's row-parallel linear layers (their mm output, before the TP reduce-scatter, is
#: the whole hidden width on every TP rank) and of the down-projections the planner keeps whole on every TP rank
ROW_PARALLEL_OPS = ("attn_out_proj", "mlp_out", "shared_experts_out")
UNSPLIT_OPS = ("q_down_proj", "kv_down_proj")


def op_sac_bytes_per_token(model: ModelSpec, cfg: Config, kind: LayerKind, policy: str):
    """Bytes per token a transformer block keeps for backward on one GPU under torchtitan's per-op selective
    checkpointing (``policy`` "op_sac" or "op_sac_v02", :func:`planner.cost.compute.op_sac_shares`): the block's
    input (bf16, split by SP as the checkpoint wrapper receives it), the outputs of the ops its policy saves and
    nothing else (torchtitan/distributed/activation_checkpoint.py: MUST_SAVE ops' outputs are cached for the
    recompute; the tensors backward needs are re-created by it): the 16-bit matmuls it saves
    (``compute.torchtitan_matmuls``; a column-parallel one's output split by TP, a row-parallel one's whole before
    its reduce-scatter) or, in fp8, every linear layer's output under "op_sac" (``aten._scaled_mm`` saved) and none
    under "op_sac_v02"; the reduce-scatters' outputs (TP with SP, one per block); the attention kernel's output and
    its fp32 log-sum-exp; a MoE block's two all-to-all outputs (its k token copies out and back, EP > 1)."""
    t, h = cfg.tp, model.hidden_size
    sp = sp_degree(cfg)
    low = np.isin(np.asarray(cfg.precision), ("fp8", "mxfp8"))
    kept = 2.0 * h / sp
    for name, width, saved_16bit in torchtitan_matmuls(model, kind):
        split = 1.0 if name in ROW_PARALLEL_OPS or name in UNSPLIT_OPS else 1.0 / t
        saved = np.where(low, 1.0 if policy == "op_sac" else 0.0, float(saved_16bit))
        kept = kept + saved * ACT_BYTES * width * split
    blocks_scattered = kind.blocks * np.where((np.asarray(t) > 1) & (np.asarray(sp) > 1), 1.0, 0.0)
    kept = kept + blocks_scattered * ACT_BYTES * h / sp
    kept = kept + ACT_BYTES * model.attn_out_dim / t + 4 * model.num_heads / t
    if kind.moe:
        k = model.experts_per_token * moe_load(cfg)
        kept = kept + np.where(np.asarray(cfg.ep) > 1, 2 * ACT_BYTES * k * h * expert_tp_token_share(cfg), 0.0)
    return kept


def activation_bytes_per_layer(model: ModelSpec, cfg: Config, recompute: str | None = None,
                               kind: LayerKind = DENSE_LAYER):
    """Activation bytes one layer of kind ``kind`` keeps for backward, one micro-batch, on one GPU.

    Korthikanti et al. 2022 Table 2, counted tensor by tensor (bytes per token, 16-bit):
      replicated across TP unless SP: two norm inputs 4h, QKV input 2h, MLP input 2h, two dropout masks 2h
      split by TP: Q 2q, K and V 4kv, attention output 2q, MLP: GELU 4f (input + fc2 input) or SwiGLU 6f
      score matrix (no flash kernel, no selective recompute): 5 a s with dropout (2 a s without), split by TP
      with a QK-norm (Qwen3, Gemma 3, OLMo 2): the norms' inputs, Q 2q and K 2kv, split by TP
      a cross-attention layer (Llama 3.2 Vision): Q, its norm's input and the attention output per text token; K, V
      and the key norm's input per image token (b x images x cross_attention_tokens of them), split by TP
    Full recompute keeps only the layer input, 2h (split by TP with SP, as Megatron stores it). Selective
    recomputation drops what its modules redo; "mlp" and "moe" (a dense MLP, a whole MoE block: Megatron-Core's
    ``tensor_parallel.checkpoint`` around it) keep only the block's input, 2h.
    In fp8 / mxfp8 each linear layer's input is kept as Transformer Engine saves it (:data:`SAVED_INPUT_BYTES`):
    the QKV and MLP inputs, the fc2 input and the experts' inputs shrink to about 1 B per element, and the
    attention output, which the attention kernel keeps in bf16, gains the out-projection's fp8 copy.
    ``recompute`` (one mode for the whole batch) defaults to the configuration's own.
    """
    mode = np.asarray(cfg.recompute if recompute is None else recompute)
    t, h = cfg.tp, model.hidden_size
    sp = sp_degree(cfg)
    tokens = cfg.tokens_per_rank
    flash = np.asarray(cfg.flash_attention, dtype=bool)
    lin = saved_linear_input_bytes(cfg.precision)  # a linear layer's saved input, bytes per element
    fp8_copy = np.where(lin < 2, lin, 0.0)  # an fp8 copy kept beside a bf16 tensor another kernel keeps

    def on(module):  # selective recomputation of this module (Megatron-Core --recompute-modules) drops its tensors
        return (mode == "selective") & recompute_module_on(cfg.recompute_modules, module)

    moe, attention = kind.moe, kind.mixer == "attention"
    if moe:  # the routed copies the busiest EP rank holds (compute.moe_load: k with balanced routing)
        k = model.experts_per_token * moe_load(cfg)
        f_total = model.moe_ffn_hidden_size * (k + model.num_shared_experts)
    else:
        f_total = model.ffn_hidden_size if kind.ffn else 0
    # gated: fc1's two outputs (bf16, the activation's backward; an fp8 copy under activation_fp8_input_store) +
    # fc2's input; GELU: fc1 output + fc2 input
    act_in = activation_input_bytes(model, cfg)
    mlp = act_in * f_total + lin * f_total
    mlp_in = lin * h if kind.ffn else 0.0
    moe_block = on("moe") if moe else False  # "moe" checkpoints the whole MoE block: only its input stays (bf16)
    if moe:  # "moe_act" discards the routed experts' activation output (fc2's input) and redoes it in backward
        mlp = mlp - np.where(on("moe_act"), lin * model.moe_ffn_hidden_size * k, 0.0)
        mlp = np.where(moe_block, 0.0, mlp)
        mlp_in = np.where(moe_block, 2 * h, mlp_in)
    elif kind.ffn:  # "mlp" checkpoints a dense layer's MLP: only its input stays, in bf16
        mlp = np.where(on("mlp"), 0.0, mlp)
        mlp_in = np.where(on("mlp"), 2 * h, mlp_in)
    # each block's norm input (2h); "layernorm" discards the norms' outputs (the mixer's and the MLP's inputs) and
    # redoes the norms in backward
    mixer_in = lin * h if kind.mixer else 0.0
    replicated = 2 * kind.blocks * h + np.where(on("layernorm"), 0.0, mixer_in + mlp_in) + \
        (kind.blocks * h if model.dropout else 0)
    split = mlp
    if attention:
        # Q, K, V and the attention output (for MLA their per-head widths, DeepSeek-V2 Sec. 2.1.2); "mla_up_proj"
        # discards Q, K and V (the up-projections' and RoPE's outputs) and redoes them in backward
        qkv = 2 * (model.attn_q_dim + model.attn_k_dim + model.attn_v_dim)
        if model.is_mla:
            qkv = np.where(on("mla_up_proj"), 0.0, qkv)
        split = qkv + 2 * model.attn_out_dim + mlp + fp8_copy * model.attn_out_dim
        if model.qk_norm:  # the QK-norm's RMSNorms keep their inputs, the projected Q and K (bf16), for backward
            split = split + 2 * (model.q_dim + model.kv_dim)
    elif kind.mixer == "cross_attention":
        # per text token: the per-head RMSNorm's input and its output Q (bf16), the attention output and the
        # out-projection's fp8 copy of it; the image tokens' K and V follow below
        split = 2 * model.q_dim + 2 * model.q_dim + 2 * model.q_dim + mlp + fp8_copy * model.q_dim
    elif kind.mixer == "mamba":
        # Megatron-Core's training path (mamba_split_conv1d_scan_combined) keeps the in-projection's output z x B C
        # dt and the scan's raw output (mamba_ssm MambaSplitConv1dScanCombinedFn.save_for_backward), then the
        # gated RMSNorm its input and the out-projection its input, as a linear layer does
        d, GN = model.mamba_inner, model.mamba_groups * model.mamba_state_dim
        split = 2 * (2 * d + 2 * GN + model.mamba_heads) + 2 * d + 2 * d + lin * d + mlp
    if moe:
        split += np.where(moe_block, 0.0, 4 * model.num_experts)  # router logits + probs, fp32 (tiny)
    per_token = replicated / sp + split / t
    if model.is_mla and attention:  # the latents feeding the up-projections, whole on every TP rank
        per_token = per_token + 2 * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
    if moe:
        # Megatron-Core MoE: the k permuted token copies entering the experts (the experts' fc1 input, kept as a
        # linear input is), gathered over the expert-TP group (kh per token of the etp ranks' shards: x etp / tp
        # per local token with SP, x 1 without). The routing probabilities multiply inside the experts'
        # activation (megatron/core/transformer/moe/experts.py, since Megatron-Core 0.13), so the combine keeps
        # no expert outputs for their gradient.
        per_token = per_token + np.where(moe_block, 0.0,
                                         lin * k * h * expert_tp_token_share(cfg))
    if attention:
        scores = (5 if model.dropout else 2) * model.num_heads * cfg.seq_len / cfg.cp / t  # unfused score matrix
        lse = 4 * model.num_heads / t  # softmax log-sum-exp kept by the flash kernel (fp32)
        per_token = per_token + np.where(flash, lse, np.where(on("core_attn"), 0.0, scores))
    image = 0.0
    if kind.mixer == "cross_attention":
        keys = image_keys(model)
        scores = 2 * model.num_heads * keys / t  # unfused: the T x V score matrix (bf16), no dropout
        per_token = per_token + np.where(flash, 4 * model.num_heads / t, np.where(on("core_attn"), 0.0, scores))
        # per image token: K and V (bf16) and the key RMSNorm's input, split by TP; the K / V projections' input
        # is the projector's output, one tensor every such layer shares (memory.vision_projector_activation_bytes),
        # plus in fp8 each layer's quantized copy of it
        image = cfg.micro_batch_size * keys * (3 * 2 * model.kv_dim / t + fp8_copy * h)
    if attention:  # torchtitan's per-op policies keep what their save lists name (other layers: all, unrecomputed)
        for policy in ("op_sac", "op_sac_v02"):
            if np.any(on(policy)):
                per_token = np.where(on(policy), op_sac_bytes_per_token(model, cfg, kind, policy), per_token)
    return np.where(mode == "full", tokens * 2 * h / sp, tokens * per_token + image)


def offloaded_bytes_per_layer(model: ModelSpec, cfg: Config, kind: LayerKind = DENSE_LAYER):
    """Activation bytes of one layer, one micro-batch, on one GPU that Megatron-Core's fine-grained activation
    offloading sends to host memory: the inputs of the modules in ``cfg.offload_modules``
    (megatron/core/transformer/transformer_config.py ``offload_modules``), each the tensor
    :func:`activation_bytes_per_layer` keeps for it: attn_norm the layer input 2h and mlp_norm the residual 2h
    (split with SP), qkv_linear the QKV projection's saved input (the norm output, ``SAVED_INPUT_BYTES`` per
    element, split with SP), core_attn Q, K and V, attn_proj the attention output (and its fp8 copy), split by TP;
    in MoE layers expert_fc1 the k dispatched token copies and moe_act the routed experts' fc1 outputs (each only in
    a layer with that block: a hybrid model's Mamba layers offload nothing). Nothing under
    full recomputation, whose layers keep only their input (the validity rules refuse the combination)."""
    modules = cfg.offload_modules
    t, h = cfg.tp, model.hidden_size
    sp = sp_degree(cfg)
    lin = saved_linear_input_bytes(cfg.precision)
    fp8_copy = np.where(lin < 2, lin, 0.0)

    def on(name):
        return np.where(recompute_module_on(modules, name), 1.0, 0.0)

    attention, ffn = float(kind.mixer == "attention"), float(bool(kind.ffn))  # the blocks these modules are in
    per_token = (attention * on("attn_norm") + ffn * on("mlp_norm")) * 2 * h / sp + \
        attention * on("qkv_linear") * lin * h / sp
    per_token = per_token + attention * on("core_attn") * 2 * (model.attn_q_dim + model.attn_k_dim +
                                                               model.attn_v_dim) / t
    per_token = per_token + attention * on("attn_proj") * (2 + fp8_copy) * model.attn_out_dim / t
    if kind.moe:
        k = model.experts_per_token * moe_load(cfg)  # the busiest EP rank's copies
        per_token = per_token + on("expert_fc1") * lin * k * h * expert_tp_token_share(cfg)
        per_token = per_token + on("moe_act") * activation_input_bytes(model, cfg) * model.moe_ffn_hidden_size * k / t
    return np.where(np.asarray(cfg.recompute) == "full", 0.0, cfg.tokens_per_rank * per_token)


def korthikanti_table2(s: int, b: int, h: int, a: int, t: int, variant: str) -> float:
    """Korthikanti et al. 2022, Table 2, activation bytes per layer (16-bit), for the tests' pinning."""
    if variant == "none":
        return s * b * h * (34 + 5 * a * s / h)
    if variant == "tp":
        return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    if variant == "tp_sp":
        return s * b * h * (34 / t + 5 * a * s / (h * t))
    if variant == "tp_selective":
        return s * b * h * (10 + 24 / t)
    if variant == "tp_sp_selective":
        return s * b * h * (34 / t)
    if variant == "full":
        return s * b * h * 2
    raise ValueError(variant)


def head_activation_bytes(model: ModelSpec, cfg: Config):
    """Last stage: final-norm input (2h, split with SP) + bf16 logits (2V/t) + fp32 softmax for the loss (4V/t)."""
    return cfg.tokens_per_rank * (2 * model.hidden_size / sp_degree(cfg) + (2 + LOGIT_BYTES) * model.vocab_size /
                                  cfg.tp)


def mtp_projection_activation_bytes(model: ModelSpec, cfg: Config):
    """One multi-token-prediction module's input kept for backward: the two normalized inputs and their
    concatenation, 2h + 2h bf16 per token (the block's own activations: ``activation_bytes_per_layer``)."""
    return cfg.tokens_per_rank * 4 * model.hidden_size * 2


def vision_projector_activation_bytes(model: ModelSpec, cfg: Config):
    """The projector's saved tensors on the image tokens (``cfg``: ``compute.vision_config``): its input (2 h_v per
    token, bf16), its first layer's output and the GELU output (2 h / t each); Llama 3.2 Vision's one layer: its
    input (2 x ``vision_output_dim``) and its output, the cross-attention states every cross-attention layer's K / V
    projections read (2 h, whole on each TP rank), on the unpadded tokens. Approximation: the states a later
    pipeline stage receives and keeps for its own cross-attention layers are not counted there."""
    if model.vision_output_dim:
        tokens = cfg.tokens_per_rank * model.cross_attention_tokens / model.vision_tokens
        return tokens * (2 * model.vision_output_dim + 2 * model.hidden_size)
    return cfg.tokens_per_rank * (2 * model.vision_hidden_size + 4 * model.hidden_size / cfg.tp)


def embedding_activation_bytes(model: ModelSpec, cfg: Config):
    """First stage: the embedding output (and its dropout mask for GPT), Korthikanti Sec. 4.3."""
    return cfg.tokens_per_rank * model.hidden_size * (3 if model.dropout else 2) / sp_degree(cfg)


# ---------------------------------------------------------------------------------------------------------------
# Model states
# ---------------------------------------------------------------------------------------------------------------
def layer_params_on_gpu(model: ModelSpec, tp, ep, kind: LayerKind, etp=None):
    """(dense, expert) parameters of one decoder layer of kind ``kind`` on one GPU: the non-expert weights split by
    TP except the norms (replicated across TP, Megatron), the routed experts split over EP x expert TP (TP when
    ``etp`` is None)."""
    norms = layer_norms(model, kind)
    experts = expert_params_per_layer(model) if kind.moe else 0
    etp = tp if etp is None else etp
    dense = (layer_params(model, kind) - experts - norms) / np.asarray(tp) + norms
    return dense, experts / (np.asarray(ep) * etp)


def mtp_params(model: ModelSpec) -> tuple[int, int]:
    """(dense, routed-expert) parameters of the multi-token-prediction modules (DeepSeek-V3 report Sec. 2.2): per
    module a transformer block (MoE where the model is), the projection of [norm(h); norm(embedding)] (2h -> h) and
    its two RMSNorms; the embedding and the LM head are shared with the main model. Not in ``total_params`` (the
    reports count the main model: DeepSeek-V3's 671B without the 14B of its MTP module)."""
    if not model.mtp_layers:
        return 0, 0
    experts = expert_params_per_layer(model) if model.is_moe else 0
    block = layer_params(model, MOE_LAYER if model.is_moe else DENSE_LAYER) - experts
    h = model.hidden_size
    return model.mtp_layers * (block + 2 * h * h + 2 * norm_params(model)), model.mtp_layers * experts


def end_params_on_gpu(model: ModelSpec, seq_len: int, tp, num_stages, ep=1, etp=None):
    """(embedding, LM head) parameters on one GPU of the first / last pipeline stage, split by TP (Megatron's
    vocab-parallel embedding and output layer); with tied embeddings and more than one stage the last stage keeps
    its own copy of the embedding matrix for the LM head (Megatron's shared word embeddings). The last stage also
    holds the multi-token-prediction modules (Megatron-Core places them with the loss), their experts split over
    EP x expert TP like any MoE layer's; the first holds the vision encoder and projector, split by TP."""
    tied_copy = model.vocab_size * model.hidden_size if model.tied_embeddings else 0
    head = head_params(model) + np.where(np.asarray(num_stages) > 1, tied_copy, 0)
    mtp_dense, mtp_experts = mtp_params(model)
    etp = tp if etp is None else etp
    head_gpu = (head + mtp_dense) / np.asarray(tp) + mtp_experts / (np.asarray(ep) * np.asarray(etp))
    return (embedding_params(model, seq_len) + vision_params(model)) / np.asarray(tp), head_gpu


def gathered_layer_params(model: ModelSpec, tp, ep, kind: LayerKind, etp=None):
    """Parameters ZeRO-3 gathers for one layer of kind ``kind`` on one GPU: the whole layer after TP (and EP x
    expert TP for the experts)."""
    experts = expert_params_per_layer(model) if kind.moe else 0
    etp = tp if etp is None else etp
    return (layer_params(model, kind) - experts) / np.asarray(tp) + experts / (np.asarray(ep) * etp)


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a pipeline stage holds (after TP / EP sharding), split by how ZeRO may shard them
    (numbers, or arrays over a batch)."""

    dense: float | np.ndarray  # sharded by ZeRO over the DP x CP group
    expert: float | np.ndarray  # sharded by ZeRO over the expert-data-parallel group (DP x CP / EP)
    largest_layer: float | np.ndarray  # the biggest single layer on this GPU (ZeRO-3 gathers it whole)
    #: of ``dense``, the embedding and LM-head parameters, which stay bf16 whatever the linear layers' weights are
    #: kept in (Megatron-Core builds only the decoder layers under Transformer Engine's fp8_model_init)
    ends: float | np.ndarray = 0.0


# The ZeRO stage from which each model state is sharded over the data-parallel ranks (Rajbhandari et al. 2020,
# Sec. 5: P_os, P_os+g, P_os+g+p)
ZERO_SHARDED_FROM_STAGE = {"optimizer": 1, "gradients": 2, "weights": 3}


def zero_sharded_params(dense, expert, zero_stage, dp_shard, expert_dp_shard, state: str):
    """Parameters whose ``state`` (weights, gradients, optimizer) one GPU holds under ZeRO stage 0-3: all of them,
    or from the stage that shards the state on (``ZERO_SHARDED_FROM_STAGE``) the dense ones over DP x CP and the
    expert ones over the expert-DP group (Rajbhandari et al. 2020, Sec. 5)."""
    return np.where(np.asarray(zero_stage) >= ZERO_SHARDED_FROM_STAGE[state],
                    dense / dp_shard + expert / expert_dp_shard, dense + expert)


def model_state_bytes(p: StageParams, zero_stage, dp_shard, expert_dp_shard,
                      linear_weight_bytes=WEIGHT_BYTES, gathered_weight_bytes=None,
                      grad_bytes=GRAD_BYTES, optimizer_bytes=OPTIMIZER_BYTES, pipelined=False,
                      accumulated_grad_bytes=GRAD_BYTES) -> dict[str, np.ndarray]:
    """Weights, gradients and optimizer states on one GPU under ZeRO stage 0-3 (Rajbhandari et al. 2020).

    Stage 3 also holds the gathered weights of the layer in use and of the one prefetched (2 layers). Under pipeline
    stages (``pipelined``: PP > 1) stages 2 and 3 hold their gradients unsharded until the step's last micro-batch,
    at ``accumulated_grad_bytes`` (the reduce dtype's): the stacks that shard gradients under pipeline stages run
    FSDP2 under torch.distributed.pipelining (torchtitan, NeMo AutoModel), which defers FSDP's gradient sync to the
    last micro-batch (pipelining stage.py backward_maybe_with_nosync), and FSDP2 accumulates the unsharded gradients
    in the reduce dtype where it differs from the parameters' (_fsdp_param.py to_accumulated_grad_if_needed). The
    decoder
    layers' weights take ``linear_weight_bytes`` per element as held (:func:`held_linear_weight_bytes`; their norms
    and biases, under 1%, with them) and ``gathered_weight_bytes`` (default: the same) as gathered for use, the
    embedding and LM head (``p.ends``) bf16's 2; gradients ``grad_bytes`` per element (:func:`held_grad_bytes`), the
    optimizer's states ``optimizer_bytes`` (:func:`optimizer_state_bytes`).
    """
    zero_stage, dp_shard = np.asarray(zero_stage), np.asarray(dp_shard)
    gathered_b = linear_weight_bytes if gathered_weight_bytes is None else gathered_weight_bytes

    def held(state: str):
        return zero_sharded_params(p.dense, p.expert, zero_stage, dp_shard, expert_dp_shard, state)

    ends = zero_sharded_params(p.ends, 0.0, zero_stage, dp_shard, expert_dp_shard, "weights")
    weights = (held("weights") - ends) * linear_weight_bytes + ends * WEIGHT_BYTES
    gathered = np.where((zero_stage >= 3) & (dp_shard > 1), 2 * p.largest_layer * gathered_b, 0.0)
    deferred = np.asarray(pipelined, dtype=bool) & (zero_stage >= ZERO_SHARDED_FROM_STAGE["gradients"])
    grads = np.where(deferred, (p.dense + p.expert) * accumulated_grad_bytes, held("gradients") * grad_bytes)
    return {"weights": weights + gathered, "gradients": grads, "optimizer": held("optimizer") * optimizer_bytes}


def optimizer_state_bytes(adam_moment_bytes=4):
    """Bytes per parameter of mixed-precision Adam's states: fp32 master weights and the two moments at
    ``adam_moment_bytes`` each (the ZeRO paper's 12 in fp32; 8 with bf16 moments, Megatron-Core's precision-aware
    optimizer, megatron/core/optimizer/optimizer_config.py exp_avg_dtype / exp_avg_sq_dtype)."""
    return MASTER_WEIGHT_BYTES + 2 * np.asarray(adam_moment_bytes)


def held_grad_bytes(grad_reduce_bytes, grads_in_reduce_dtype=True):
    """Bytes per element of the gradients a GPU accumulates: the reduction's dtype where the stack's gradient buffer
    has it (Megatron-Core: param_and_grad_buffer.py grad_dtype = torch.float if grad_reduce_in_fp32 else the
    parameter's), else the ZeRO paper's 2."""
    return np.where(np.asarray(grads_in_reduce_dtype, dtype=bool), grad_reduce_bytes, GRAD_BYTES)


#: bytes per element of a per-tensor fp8 tensor (Float8Tensor): its data, and on GPUs whose fp8 GEMMs take the TN
#: layout only (``GPU.fp8_gemm_tn_only``) an fp8 transpose beside it (Transformer Engine csrc/quantizer.cpp,
#: Float8Quantizer / Float8CurrentScalingQuantizer: with_transpose = columnwise_usage and not non-TN, TE v2.9)
FP8_TENSOR_BYTES = {"data": 1.0, "transpose": 1.0}
#: bytes per element of an MXFP8 tensor a weight is used as in training: row-wise and column-wise data, 1 B each,
#: each with one E8M0 scale per 32-element block (MXFP8Tensor; the OCP MX format)
MXFP8_TENSOR_BYTES = 2 * (1.0 + 1.0 / 32)


def quantized_weight_bytes(precision, fp8_gemm_tn_only=True):
    """Bytes per element of a weight as Transformer Engine quantizes it for training's GEMMs (forward, and the
    input gradient's in backward): fp8 1 B, plus a 1 B transpose on a TN-only GPU (Hopper 2 B, Blackwell 1 B);
    mxfp8 both usages' data and scales (:data:`MXFP8_TENSOR_BYTES`); 0 in 16-bit precisions."""
    precision = np.asarray(precision)
    fp8 = FP8_TENSOR_BYTES["data"] + np.where(np.asarray(fp8_gemm_tn_only, dtype=bool),
                                              FP8_TENSOR_BYTES["transpose"], 0.0)
    return np.where(precision == "fp8", fp8, np.where(precision == "mxfp8", MXFP8_TENSOR_BYTES, 0.0))


def held_linear_weight_bytes(precision, fp8_params, fp8_gemm_tn_only=True, te_weights=False, zero_stage=0):
    """Bytes per element a GPU holds of a decoder linear layer's weight between its uses (fp32 master weights are
    the optimizer's): bf16's 2, except in fp8 / mxfp8 under a stack whose linear layers are Transformer Engine
    modules (``te_weights``, ``RunConfig.te_quantized_weights``; elsewhere, e.g. torchao, the bf16 weight is
    quantized per use and freed):
    * weights kept quantized (Megatron-Core ``--fp8-param-gather``, ``RunConfig.fp8_param_gather``, builds the
      decoder layers under TE's fp8_model_init: "keep the parameters in fp8 precision to save memory",
      megatron/core/transformer/transformer_config.py fp8_param, megatron/core/fp8_utils.py
      get_fp8_context(is_init=True)): the quantized tensor alone (:func:`quantized_weight_bytes`), no bf16 copy;
      under ZeRO-3 (Megatron-FSDP) an fp8 shard without its transpose, which is made for each use and released
      after (keep_fp8_transpose_cache false by default, megatron/core/distributed/fsdp/src/megatron_fsdp/
      megatron_fsdp.py);
    * bf16 weights: the bf16 weight plus its quantized copy, made at a step's first micro-batch and reused by the
      others (TE's weight workspace); not counted under ZeRO-3, where a layer's weights exist whole only while
      gathered."""
    precision, zero_stage = np.asarray(precision), np.asarray(zero_stage)
    te = (np.asarray(te_weights, dtype=bool)) & ((precision == "fp8") | (precision == "mxfp8"))
    quantized = quantized_weight_bytes(precision, fp8_gemm_tn_only)
    fsdp_fp8_shard = np.where((zero_stage >= 3) & (precision == "fp8"), FP8_TENSOR_BYTES["data"], quantized)
    cached = WEIGHT_BYTES + np.where(zero_stage < 3, quantized, 0.0)
    return np.where(te, np.where(np.asarray(fp8_params, dtype=bool), fsdp_fp8_shard, cached), WEIGHT_BYTES)


def gathered_weight_bytes(precision, fp8_params, fp8_gemm_tn_only=True, te_weights=False):
    """Bytes per element of a decoder linear layer's weight while ZeRO-3 holds it gathered for use: the quantized
    tensor with its transpose where Transformer Engine keeps the weights quantized, else the bf16 weight."""
    low = np.isin(np.asarray(precision), ("fp8", "mxfp8")) & np.asarray(fp8_params, dtype=bool) & \
        np.asarray(te_weights, dtype=bool)
    return np.where(low, quantized_weight_bytes(precision, fp8_gemm_tn_only), WEIGHT_BYTES)
