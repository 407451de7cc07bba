"""Model specifications: one frozen dataclass, loaded from Hugging Face ``config.json`` files.

A transformer here is a stack of identical decoder layers (attention + MLP, optionally mixture-of-experts) between an
input embedding and an output (LM head) layer. The cost model only needs the shapes below; everything else in a
``config.json`` is ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.errors import PlannerError

#: model_type values read as a Llama-style decoder (RMSNorm, gated MLP, rotary positions, optional GQA), with the
#: family differences of :data:`FAMILY_RULES`
LLAMA_LIKE = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "deepseek_v3", "deepseek_v2", "qwen3",
              "qwen3_moe", "gemma2", "gemma3_text", "gemma3", "gpt_oss", "phi3", "olmo2", "llama4", "llama4_text")
#: model_type values of hybrid models: layers of one kind each (Mamba-2 mixer, attention, MLP, MoE) in the order of a
#: Megatron-Core hybrid layer pattern (``hybrid_override_pattern``)
HYBRID = ("nemotron_h",)
#: model_type values with a GPT-style block (LayerNorm, a non-gated GELU MLP), each read by its own field names
GPT_LIKE = ("gpt2", "gpt_neox", "falcon", "starcoder2", "mpt")
SUPPORTED_MODEL_TYPES = LLAMA_LIKE + GPT_LIKE + HYBRID + ("llava", "mllama")
#: per Llama-like family, what its config.json does not spell out (transformers' modeling_<type>.py): QK-norm
#: ("head": one RMSNorm weight of head_dim for queries and one for keys, Qwen3 / Gemma 3; "full": over the whole
#: query and key widths, OLMo 2), norms per layer (Gemma 2 / 3 norm before and after attention and MLP), biases of
#: the attention projections and of the MLP / experts by default, tied embeddings by default, and the default
#: sliding-window pattern (every n-th layer global) where the config gives no layer_types
FAMILY_RULES: dict[str, dict[str, Any]] = {
    "qwen2": {"attention_bias": True},
    "qwen2_moe": {"attention_bias": True},
    "qwen3": {"qk_norm": "head"},
    "qwen3_moe": {"qk_norm": "head"},
    "gemma2": {"norms_per_layer": 4, "tied": True, "global_every": 2},
    "gemma3_text": {"norms_per_layer": 4, "tied": True, "qk_norm": "head", "global_every": 6},
    "gemma3": {"norms_per_layer": 4, "tied": True, "qk_norm": "head", "global_every": 6},
    "gpt_oss": {"attention_bias": True, "mlp_bias": True},
    "olmo2": {"qk_norm": "full"},
    "llama4": {"qk_norm": ""},
    "llama4_text": {"qk_norm": ""},
}
#: configs that keep the language model's shapes under "text_config" (multimodal checkpoints)
NESTED_TEXT_CONFIG = ("gemma3", "llama4")
#: largest integer accepted in a config.json: int32, the type frameworks store shapes in; larger values are typos
#: and would overflow the cost model's float arithmetic
MAX_CONFIG_INT = 2**31 - 1
#: most decoder layers a config may declare: the deepest published decoders hold a few hundred (GPT-3 96, Llama 3.1
#: 405B 126, Nemotron-H 56B 118); the cost model keeps per-layer tables (kinds by position, the partition DP's
#: L x L grid), so a layer count of millions is a typo that would otherwise exhaust memory before any check
MAX_LAYERS = 4096
#: largest JSON file read (specs, profiles and plans are kilobytes; anything this big is a wrong path)
MAX_JSON_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class LayerKind:
    """One kind of decoder layer, as the cost model prices it: its token mixer (``mixer``: "attention", "mamba" a
    Mamba-2 SSD mixer, or "" none) and its feed-forward block (``ffn``: "dense" MLP, "moe" routed experts, or ""
    none). A transformer's decoder layer holds both (attention + MLP or MoE); a hybrid model's layers hold one each
    (Megatron-Core's hybrid layer pattern: M Mamba, * attention, - MLP, E MoE). ``window``: a sliding-window (True)
    or global (False) attention layer, None the model's average."""

    mixer: str = "attention"
    ffn: str = "dense"
    window: bool | None = None

    @property
    def moe(self) -> bool:
        return self.ffn == "moe"

    @property
    def blocks(self) -> int:
        """Residual blocks of the layer (a pre-norm and a residual add each): the mixer and the feed-forward."""
        return int(bool(self.mixer)) + int(bool(self.ffn))


#: a transformer's dense and MoE decoder layers
DENSE_LAYER = LayerKind()
MOE_LAYER = LayerKind(ffn="moe")
#: a decoder layer whose mixer is cross-attention from the text tokens to an image's encoded tokens, then an MLP
#: (Llama 3.2 Vision, transformers' MllamaCrossAttentionDecoderLayer)
CROSS_ATTENTION_LAYER = LayerKind(mixer="cross_attention")
#: Megatron-Core's hybrid layer symbols (megatron/core/models/hybrid/hybrid_layer_allocation.py ``Symbols``) and the
#: kind of layer each builds, in the order :attr:`ModelSpec.layer_kinds` lists them
HYBRID_SYMBOLS = {"M": LayerKind(mixer="mamba", ffn=""), "*": LayerKind(ffn=""),
                  "-": LayerKind(mixer="", ffn="dense"), "E": LayerKind(mixer="", ffn="moe")}


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a decoder-only transformer.

    ``ffn_hidden_size`` is the dense MLP width; ``moe_ffn_hidden_size`` the width of one routed expert.
    """

    name: str
    model_type: str
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_seq_len: int
    head_dim: int = 0  # 0 means hidden_size // num_heads
    tied_embeddings: bool = False
    gated_mlp: bool = True  # SwiGLU (three matrices) vs GELU (two)
    norm: str = "rmsnorm"  # or "layernorm" (has a bias: twice the parameters and bytes)
    learned_positions: bool = False
    #: rotary position embeddings on queries and keys (False: none, as Nemotron-H's attention layers)
    rotary_positions: bool = True
    linear_bias: bool = False  # biases on the attention projections
    mlp_bias: bool = False  # biases on the MLP (and expert) projections
    dropout: bool = False  # Megatron GPT keeps dropout masks (Korthikanti Table 2 counts them)
    #: QK-norm: "" none, "head" (a head_dim RMSNorm weight for queries and for keys), "full" (over q_dim / kv_dim)
    qk_norm: str = ""
    norms_per_layer: int = 2
    # Mixture of experts (0 experts = dense model)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_ffn_hidden_size: int = 0
    num_shared_experts: int = 0
    first_k_dense_layers: int = 0
    #: which layers of a MoE model are MoE ("E") and which dense ("D"), one letter per layer, where they interleave
    #: (Llama 4 Maverick's ``interleave_moe_layer_step`` 2, Qwen-MoE's ``decoder_sparse_step`` / ``mlp_only_layers``);
    #: "" = dense below ``first_k_dense_layers``, MoE from there on
    moe_layer_pattern: str = ""
    #: group-limited routing (DeepSeek-V3 report Sec. 2.1.2 / 3.2.2, HF ``n_group`` / ``topk_group``): experts
    #: form ``expert_groups`` groups and each token's experts lie in at most ``expert_groups_per_token`` of them;
    #: deployed one group per node, a token crosses the network to at most that many nodes. 0 = unrestricted
    expert_groups: int = 0
    expert_groups_per_token: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3), 0 = standard attention
    q_lora_rank: int = 0  # 0 with MLA: queries projected directly (DeepSeek-V2-Lite)
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_nope_head_dim: int = 0
    #: sliding-window attention: each query of the ``sliding_window_layers`` layers attends to at most the
    #: ``sliding_window`` keys before it (config.json ``sliding_window``; which layers: ``layer_types``, all layers
    #: of Mistral's original config); 0 = every layer attends to the whole causal prefix
    sliding_window: int = 0
    sliding_window_layers: int = 0
    #: which layers use the window, one letter per layer in model order: "L" local (sliding window), "G" global
    #: (transformers' ``layer_types``, or the family's pattern: Gemma 3 five local then one global); "" = not known,
    #: every layer then costs the average of the two (and always for MoE models, whose two layer kinds are dense and
    #: MoE). With a pattern, a dense model's local and global layers are costed as the two kinds of layer they are
    #: (``second_kind``), so the pipeline split balances them
    attention_pattern: str = ""
    #: multi-token prediction modules (DeepSeek-V3 report Sec. 2.2, config ``num_nextn_predict_layers``): each one
    #: more transformer block with its own input projection, sharing the embedding and the LM head, on the last stage
    mtp_layers: int = 0
    #: False for a bidirectional encoder (every query attends every key: the whole square)
    causal: bool = True
    #: a vision encoder in front of the language model (LLaVA-style: a ViT whose patch tokens a two-layer MLP
    #: projects into the language model's sequence), run on the first pipeline stage with the embedding
    #: (Megatron-Core's LLaVA model); 0 layers = none. ``vision_tokens``: tokens one image becomes in the encoder
    #: ((image_size / patch_size)^2, + 1 with a class token); ``vision_images``: images per training sample
    vision_layers: int = 0
    vision_hidden_size: int = 0
    vision_ffn_hidden_size: int = 0
    vision_heads: int = 0
    vision_tokens: int = 0
    vision_images: int = 0
    #: width of the encoder's output the projector reads (Llama 3.2 Vision: the final and five intermediate layers'
    #: states concatenated, 7680); 0: LLaVA's two-layer MLP from ``vision_hidden_size``
    vision_output_dim: int = 0
    #: the encoder's parameters outside its layers and projector, counted from the config at load time (Llama 3.2
    #: Vision: patch, class, position and tile-position embeddings, the pre / post norms, the global layers' gates,
    #: the image tokens' embedding rows); 0 where they are left out (LLaVA's CLIP: under 1M)
    vision_extra_params: int = 0
    #: cross-attention layers (Llama 3.2 Vision): one letter per decoder layer, "X" a cross-attention layer over the
    #: images' tokens, "S" a self-attention layer; "" = none. ``cross_attention_tokens``: the keys one image gives
    #: those layers (its tiles' patch and class tokens, without the encoder's padding)
    cross_attention_pattern: str = ""
    cross_attention_tokens: int = 0
    #: a hybrid model's layers in order, one Megatron-Core hybrid symbol each (:data:`HYBRID_SYMBOLS`: "M" Mamba-2,
    #: "*" attention, "-" MLP, "E" MoE; Hugging Face ``hybrid_override_pattern``); "" = transformer decoder layers
    layer_pattern: str = ""
    #: the hybrid symbols the model's kinds of layer are, in :data:`HYBRID_SYMBOLS` order (those of its pattern as
    #: loaded; kept when :meth:`uniform` rewrites the pattern, so the kinds and their indices stay the model's)
    layer_symbols: str = ""
    #: Mamba-2 mixer shapes (Dao & Gu 2024, "Transformers are SSMs", Sec. 7; megatron/core/ssm/mamba_mixer.py):
    #: heads x head dim = the inner width, SSM state size N, groups sharing B and C, the depthwise convolution's
    #: kernel and the chunk length of the SSD algorithm
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state_dim: int = 0
    mamba_groups: int = 0
    mamba_conv_kernel: int = 0
    mamba_chunk_size: int = 0
    source: str = ""

    # ----- derived shapes -------------------------------------------------------------------------------------
    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection (num_heads x head size)."""
        return self.num_heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """Width of one of the K or V projections (num_kv_heads x head size); GQA makes it smaller than q_dim."""
        return self.num_kv_heads * self.head_size

    # Widths (elements per token, all heads) of the four tensors around the attention core. Standard attention:
    # Q and the output are q_dim wide, K and V kv_dim. Multi-head latent attention (DeepSeek-V2 paper, Sec. 2.1.2)
    # up-projects per head a (nope + rope)-wide query and key and a v_head_dim-wide value, with as many KV heads as
    # query heads; these widths are what the core's FLOPs, the context-parallel exchanges and the stored
    # activations see.
    @property
    def attn_q_dim(self) -> int:
        """Query width entering QK^T (num_heads x query/key head size)."""
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.q_dim

    @property
    def attn_k_dim(self) -> int:
        """Key width entering QK^T."""
        return self.attn_q_dim if self.is_mla else self.kv_dim

    @property
    def attn_v_dim(self) -> int:
        """Value width entering scores x V."""
        return self.num_heads * self.v_head_dim if self.is_mla else self.kv_dim

    @property
    def attn_out_dim(self) -> int:
        """Width of the attention output (the input of the output projection)."""
        return self.num_heads * self.v_head_dim if self.is_mla else self.q_dim

    @property
    def attn_kv_heads(self) -> int:
        """Distinct K/V heads: MLA up-projects one per query head."""
        return self.num_heads if self.is_mla else self.num_kv_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        if self.layer_pattern:
            return self.layer_pattern.count("E")
        if self.moe_layer_pattern:
            return self.moe_layer_pattern.count("E")
        return self.num_layers - self.first_k_dense_layers if self.is_moe else 0

    @property
    def hybrid_symbols(self) -> str:
        """The hybrid symbols of :attr:`layer_kinds` (``layer_symbols``, or those the pattern holds)."""
        return self.layer_symbols or "".join(c for c in HYBRID_SYMBOLS if c in self.layer_pattern)

    @property
    def mamba_inner(self) -> int:
        """Width of the Mamba-2 mixer's inner stream x (and of its gate z): heads x head dim."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def positional_windows(self) -> bool:
        """Whether local and global attention layers are costed apart (a dense model with ``attention_pattern``)."""
        return bool(self.attention_pattern) and not self.is_moe and self.sliding_window > 0 and not self.layer_pattern

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """The distinct kinds of decoder layer the cost model prices apart, in a fixed order: a hybrid model's kinds
        in :data:`HYBRID_SYMBOLS` order (those its pattern holds); a MoE model's dense and MoE layers; a dense
        model's global and sliding-window layers (``positional_windows``); otherwise one kind, its attention the
        model's average. Which layer is which: :attr:`kind_index`."""
        if self.layer_pattern:
            return tuple(HYBRID_SYMBOLS[c] for c in self.hybrid_symbols)
        if self.is_moe:
            return (DENSE_LAYER, MOE_LAYER)
        if self.positional_windows:
            return (LayerKind(window=False), LayerKind(window=True))
        if self.cross_attention_pattern:
            return (DENSE_LAYER, CROSS_ATTENTION_LAYER)
        return (DENSE_LAYER,)

    @property
    def kind_index(self) -> tuple[int, ...]:
        """Per layer (model order), its kind: an index into :attr:`layer_kinds`."""
        if self.layer_pattern:
            return tuple(self.hybrid_symbols.index(c) for c in self.layer_pattern)
        if self.is_moe and self.moe_layer_pattern:
            return tuple(int(c == "E") for c in self.moe_layer_pattern)
        if self.is_moe:
            return tuple(int(i >= self.first_k_dense_layers) for i in range(self.num_layers))
        if self.positional_windows:
            return tuple(int(c == "L") for c in self.attention_pattern)
        if self.cross_attention_pattern:
            return tuple(int(c == "X") for c in self.cross_attention_pattern)
        return (0,) * self.num_layers

    def uniform(self, kind: int) -> "ModelSpec":
        """This model with every layer of kind ``kind`` (same :attr:`layer_kinds`): the partition's probes of one
        kind's per-layer costs."""
        L = self.num_layers
        if self.layer_pattern:
            return self.with_(layer_pattern=self.hybrid_symbols[kind] * L, layer_symbols=self.hybrid_symbols)
        if self.is_moe:
            return self.with_(first_k_dense_layers=0 if kind else L, moe_layer_pattern="")
        if self.positional_windows:
            return self.with_(attention_pattern="LG"[not kind] * L, sliding_window_layers=L if kind else 0)
        if self.cross_attention_pattern:
            return self.with_(cross_attention_pattern="SX"[kind] * L)
        return self

    @property
    def second_kind(self) -> tuple[bool, ...]:
        """Per layer, whether it is not of the first kind (MoE, or sliding-window attention)."""
        return tuple(k > 0 for k in self.kind_index)

    @property
    def num_second_kind(self) -> int:
        return sum(self.second_kind)

    @property
    def vision_encoder(self) -> "ModelSpec | None":
        """The vision encoder as a model of its own (a bidirectional ViT: LayerNorm, GELU MLP with biases; biased
        attention projections in LLaVA's CLIP, none in Llama 3.2 Vision's MllamaVisionAttention), or None."""
        if not self.vision_layers:
            return None
        return ModelSpec(name=f"{self.name}-vision", model_type="vit", hidden_size=self.vision_hidden_size,
                         ffn_hidden_size=self.vision_ffn_hidden_size, num_layers=self.vision_layers,
                         num_heads=self.vision_heads, num_kv_heads=self.vision_heads, vocab_size=1,
                         max_seq_len=self.vision_tokens, gated_mlp=False, norm="layernorm",
                         linear_bias=not self.cross_attention_pattern, mlp_bias=True, causal=False)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def with_(self, **changes: Any) -> "ModelSpec":
        return replace(self, **changes)


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------
def _data_dir(kind: str) -> Path:
    """Shipped data files: inside the installed wheel (planner/_data) or, in a source checkout, at the repo root."""
    here = Path(__file__).resolve().parent.parent
    installed = here / "_data" / kind
    if installed.is_dir():
        return installed
    return here.parent / kind


def model_specs_dir() -> Path:
    return _data_dir("model_specs")


def shipped_models() -> list[str]:
    return sorted(p.stem for p in model_specs_dir().glob("*.json"))


def read_json_file(path: Path, what: str) -> Any:
    """Read a JSON file, turning every I/O or syntax problem into a one-line PlannerError.

    Reads at most ``MAX_JSON_FILE_BYTES`` (so a device like /dev/zero or a huge file by mistake cannot hang or
    exhaust memory; pipes such as /dev/stdin still work)."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_JSON_FILE_BYTES + 1)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise PlannerError("file not found", source=str(path), fix=f"pass an existing {what} file or a shipped name")
    except IsADirectoryError:
        raise PlannerError("is a directory, not a file", source=str(path), fix=f"pass a {what} JSON file")
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise PlannerError(f"cannot read: {e.__class__.__name__}", source=str(path), fix=f"pass a readable {what} file")
    if len(raw) > MAX_JSON_FILE_BYTES:
        raise PlannerError(f"larger than {MAX_JSON_FILE_BYTES // 2**20} MiB", source=str(path),
                           fix=f"a {what} is a small JSON file; check the path")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PlannerError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}", source=str(path),
                           fix="fix the JSON syntax (truncated file?)")
    except RecursionError:
        raise PlannerError("invalid JSON: nested too deeply", source=str(path), fix=f"pass a {what} JSON file")


def _path_exists(path: Path) -> bool:
    """``Path.exists`` that treats unusable names (too long, NUL bytes) as missing instead of raising."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _resolve(name_or_path: str, shipped_dir: Path, option: str, what: str, fix: str) -> Path:
    """A path that exists, else a shipped file ``<name>.json`` (names may contain dots: ``llama-3.1-8b``).

    A name that looks like neither a path nor a JSON file and is not shipped is an unknown name (option error);
    anything else is left for ``read_json_file`` to report as a missing file."""
    path = Path(name_or_path)
    if not name_or_path.strip():
        raise PlannerError(f"empty {what} name", source=option, fix=fix)
    if _path_exists(path):
        return path
    candidate = shipped_dir / f"{name_or_path}.json"
    if "/" not in name_or_path and _path_exists(candidate):
        return candidate
    if path.suffix != ".json" and "/" not in name_or_path:
        raise PlannerError(f"unknown {what} {name_or_path!r}", source=option, fix=fix)
    return path


def load_model(name_or_path: str) -> ModelSpec:
    """Load a shipped model by name (a file in ``model_specs/``) or a Hugging Face ``config.json`` path."""
    path = _resolve(name_or_path, model_specs_dir(), "--model", "model",
                    f"use a path to a config.json or one of: {', '.join(shipped_models())}")
    if path.is_dir() and (path / "config.json").is_file():  # a Hugging Face model directory
        path = path / "config.json"
    data = read_json_file(path, "model config.json")
    default_name = path.stem if path.name != "config.json" else (path.parent.name or "model")
    return model_from_config(data, source=str(path), default_name=default_name)


class _Fields:
    """Typed access to a config dict that names the file and field in every error."""

    def __init__(self, data: Any, source: str):
        if not isinstance(data, dict):
            raise PlannerError("top level must be a JSON object", source=source,
                               fix="a Hugging Face config.json is an object of fields")
        self.data = data
        self.source = source

    def int(self, *keys: str, default: int | None = None, minimum: int = 1, maximum: int = MAX_CONFIG_INT) -> int:
        for key in keys:
            if key in self.data and self.data[key] is not None:
                value = self.data[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                        isinstance(value, float) and not math.isfinite(value) or int(value) != value:
                    raise PlannerError(f"must be an integer, got {value!r}", source=self.source, field=key)
                if value < minimum:
                    raise PlannerError(f"must be >= {minimum}, got {value}", source=self.source, field=key)
                if value > maximum:
                    raise PlannerError(f"must be <= {maximum}, got {value}", source=self.source, field=key,
                                       fix="no real model shape is this large")
                return int(value)
        if default is not None:
            return default
        raise PlannerError("missing required field", source=self.source, field=keys[0],
                           fix=f"add \"{keys[0]}\" (an integer)")

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise PlannerError(f"must be true or false, got {value!r}", source=self.source, field=key)
        return value

    def str(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if value is None:
            raise PlannerError("missing required field", source=self.source, field=key)
        if not isinstance(value, str):
            raise PlannerError(f"must be a string, got {value!r}", source=self.source, field=key)
        return value


def model_from_config(data: Any, *, source: str = "<config>", default_name: str = "model") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` dict (``llama``-family or ``gpt2``)."""
    f = _Fields(data, source)
    model_type = f.str("model_type")
    name = f.str("name", default_name) if "name" in f.data else default_name
    src = f.data.get("source", "") if isinstance(f.data.get("source", ""), str) else ""
    if model_type in ("llava", "mllama"):  # a language model behind a vision encoder: the pair's checks too
        spec = (_llava if model_type == "llava" else _mllama)(f, name, src, source)
        validate_model(spec, source)
        return spec
    if model_type in NESTED_TEXT_CONFIG:  # a multimodal checkpoint: the language model's own config
        text = f.data.get("text_config")
        if isinstance(text, dict):
            f = _Fields({"model_type": model_type, **text}, source)
    if model_type in HYBRID:
        spec = _nemotron_h(f, name, src)
    elif model_type in GPT_LIKE and model_type != "gpt2":
        spec = _gpt_like(f, model_type, name, src)
    elif model_type == "gpt2":
        h = f.int("n_embd", "hidden_size")
        heads = f.int("n_head", "num_attention_heads")
        spec = ModelSpec(
            name=name, model_type=model_type, hidden_size=h,
            ffn_hidden_size=f.int("n_inner", "intermediate_size", default=4 * h),
            num_layers=f.int("n_layer", "num_hidden_layers", maximum=MAX_LAYERS), num_heads=heads,
            num_kv_heads=heads,
            vocab_size=f.int("vocab_size"), max_seq_len=f.int("n_positions", "max_position_embeddings"),
            tied_embeddings=f.bool("tie_word_embeddings", True), gated_mlp=False, norm="layernorm",
            learned_positions=True, linear_bias=True, mlp_bias=True, dropout=f.bool("dropout", True), source=src,
        )
    elif model_type in LLAMA_LIKE:
        rules = FAMILY_RULES.get(model_type, {})
        heads = f.int("num_attention_heads")
        h = f.int("hidden_size")
        layers = f.int("num_hidden_layers", maximum=MAX_LAYERS)
        num_experts = f.int("num_local_experts", "n_routed_experts", "num_experts", default=0, minimum=0)
        moe_ffn = shared = 0
        dense_ffn = f.int("intermediate_size_mlp", "intermediate_size")  # Llama 4: the dense layers' width
        if num_experts:
            moe_ffn = f.int("moe_intermediate_size", default=0, minimum=0) or f.int("intermediate_size")
            shared = f.int("n_shared_experts", default=1 if model_type in ("llama4", "llama4_text") else 0,
                           minimum=0)
            # Qwen2-MoE gives the shared expert as one MLP of shared_expert_intermediate_size: n_s = that / f
            shared_width = f.int("shared_expert_intermediate_size", default=0, minimum=0)
            if shared_width:
                if shared_width % moe_ffn:
                    raise PlannerError(f"shared_expert_intermediate_size {shared_width} is not a multiple of "
                                       f"moe_intermediate_size {moe_ffn}", source=source,
                                       field="shared_expert_intermediate_size")
                shared = shared_width // moe_ffn
        window, window_layers, pattern = _sliding_window(f, model_type, layers, rules.get("global_every", 0))
        spec = ModelSpec(
            name=name, model_type=model_type, hidden_size=h, ffn_hidden_size=dense_ffn,
            num_layers=layers, num_heads=heads,
            num_kv_heads=f.int("num_key_value_heads", default=heads),
            head_dim=f.int("head_dim", default=0, minimum=0) if model_type != "deepseek_v3" else 0,
            vocab_size=f.int("vocab_size"), max_seq_len=f.int("max_position_embeddings"),
            tied_embeddings=f.bool("tie_word_embeddings", rules.get("tied", False)),
            linear_bias=f.bool("attention_bias", rules.get("attention_bias", False)),
            mlp_bias=f.bool("mlp_bias", rules.get("mlp_bias", False)),
            qk_norm=rules.get("qk_norm", ""), norms_per_layer=rules.get("norms_per_layer", 2),
            num_experts=num_experts,
            experts_per_token=f.int("num_experts_per_tok", default=2 if num_experts else 0, minimum=0),
            moe_ffn_hidden_size=moe_ffn,
            num_shared_experts=shared,
            first_k_dense_layers=f.int("first_k_dense_replace", default=0, minimum=0),
            moe_layer_pattern=_moe_layer_pattern(f, layers) if num_experts else "",
            expert_groups=f.int("n_group", default=0, minimum=0) if num_experts else 0,
            expert_groups_per_token=f.int("topk_group", default=0, minimum=0) if num_experts else 0,
            q_lora_rank=f.int("q_lora_rank", default=0, minimum=0),
            kv_lora_rank=f.int("kv_lora_rank", default=0, minimum=0),
            qk_rope_head_dim=f.int("qk_rope_head_dim", default=0, minimum=0),
            v_head_dim=f.int("v_head_dim", default=0, minimum=0),
            qk_nope_head_dim=f.int("qk_nope_head_dim", default=0, minimum=0),
            sliding_window=window, sliding_window_layers=window_layers if window else 0,
            attention_pattern=pattern if window else "",
            mtp_layers=f.int("num_nextn_predict_layers", default=0, minimum=0),
            source=src,
        )
    else:
        raise PlannerError(f"unknown model_type {model_type!r}", source=source, field="model_type",
                           fix=f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    validate_model(spec, source)
    return spec


def _moe_layer_pattern(f: "_Fields", layers: int) -> str:
    """Which layers are MoE where MoE and dense layers interleave (``ModelSpec.moe_layer_pattern``), from
    config.json: Llama 4's ``moe_layers`` or ``interleave_moe_layer_step`` k (transformers' Llama4TextConfig: layers
    k-1, 2k-1, ... are MoE), Qwen-MoE's ``decoder_sparse_step`` k with ``mlp_only_layers`` (transformers'
    Qwen2MoeDecoderLayer: layer i is MoE when it is not listed and (i + 1) % k == 0); "" where every layer from
    ``first_k_dense_replace`` on is MoE."""
    listed = f.data.get("moe_layers")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(i, int) and 0 <= i < layers for i in listed):
            raise PlannerError(f"must list layer indices in 0..{layers - 1}", source=f.source, field="moe_layers")
        moe = set(listed)
    else:
        step = f.int("interleave_moe_layer_step", "decoder_sparse_step", default=1, minimum=1)
        dense = f.data.get("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
            raise PlannerError("must list layer indices", source=f.source, field="mlp_only_layers")
        moe = {i for i in range(layers) if (i + 1) % step == 0 and i not in set(dense)}
    if moe == set(range(layers)):
        return ""
    if not moe:
        raise PlannerError("no layer is a MoE layer", source=f.source, field="interleave_moe_layer_step",
                           fix="a step no larger than num_hidden_layers")
    return "".join("E" if i in moe else "D" for i in range(layers))


def _gpt_like(f: "_Fields", model_type: str, name: str, src: str) -> ModelSpec:
    """GPT-NeoX (EleutherAI; parallel residual, biases, untied), Falcon (multi-query or grouped KV heads with
    ``new_decoder_architecture``, no biases, tied), StarCoder2 (GQA, biases, sliding window, tied) and MPT
    (``d_model`` / ``expansion_ratio``, no biases, tied): LayerNorm and a non-gated GELU MLP, rotary positions (MPT:
    ALiBi, no position weights either way), each from its own config.json field names (transformers'
    configuration_<type>.py)."""
    if model_type == "mpt":
        h = f.int("d_model")
        heads = f.int("n_heads")
        ratio = f.data.get("expansion_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
            raise PlannerError(f"must be a positive number, got {ratio!r}", source=f.source, field="expansion_ratio")
        no_bias = f.bool("no_bias", True)
        return ModelSpec(name=name, model_type=model_type, hidden_size=h, ffn_hidden_size=int(ratio * h),
                         num_layers=f.int("n_layers", maximum=MAX_LAYERS), num_heads=heads, num_kv_heads=heads,
                         vocab_size=f.int("vocab_size"), max_seq_len=f.int("max_seq_len", default=2048),
                         tied_embeddings=True, gated_mlp=False, norm="rmsnorm" if no_bias else "layernorm",
                         linear_bias=not no_bias, mlp_bias=not no_bias, source=src)
    h = f.int("hidden_size")
    heads = f.int("num_attention_heads", "n_head")
    layers = f.int("num_hidden_layers", "n_layer", maximum=MAX_LAYERS)
    if model_type == "falcon":
        if f.bool("new_decoder_architecture", False):
            kv = f.int("num_kv_heads", default=heads)
        else:
            kv = 1 if f.bool("multi_query", True) else heads
        bias = f.bool("bias", False)
        return ModelSpec(name=name, model_type=model_type, hidden_size=h,
                         ffn_hidden_size=f.int("ffn_hidden_size", default=4 * h), num_layers=layers, num_heads=heads,
                         num_kv_heads=kv, vocab_size=f.int("vocab_size"),
                         max_seq_len=f.int("max_position_embeddings", default=2048),
                         tied_embeddings=f.bool("tie_word_embeddings", True), gated_mlp=False, norm="layernorm",
                         linear_bias=bias, mlp_bias=bias, source=src)
    if model_type == "gpt_neox":
        bias = f.bool("attention_bias", True)
        return ModelSpec(name=name, model_type=model_type, hidden_size=h, ffn_hidden_size=f.int("intermediate_size"),
                         num_layers=layers, num_heads=heads, num_kv_heads=heads, vocab_size=f.int("vocab_size"),
                         max_seq_len=f.int("max_position_embeddings"),
                         tied_embeddings=f.bool("tie_word_embeddings", False), gated_mlp=False, norm="layernorm",
                         linear_bias=bias, mlp_bias=True, source=src)
    # starcoder2
    bias = f.bool("use_bias", True)
    window = f.int("sliding_window", default=0, minimum=0)
    return ModelSpec(name=name, model_type=model_type, hidden_size=h, ffn_hidden_size=f.int("intermediate_size"),
                     num_layers=layers, num_heads=heads, num_kv_heads=f.int("num_key_value_heads", default=heads),
                     vocab_size=f.int("vocab_size"), max_seq_len=f.int("max_position_embeddings"),
                     tied_embeddings=f.bool("tie_word_embeddings", True), gated_mlp=False, norm="layernorm",
                     linear_bias=bias, mlp_bias=bias, sliding_window=window, sliding_window_layers=layers if window
                     else 0, attention_pattern="L" * layers if window else "", source=src)


#: Mamba-2's SSD chunk length where a config gives none (mamba_ssm ``Mamba2`` and Megatron-Core ``MambaMixer``
#: default ``chunk_size=128``)
DEFAULT_MAMBA_CHUNK = 128


def _nemotron_h(f: "_Fields", name: str, src: str) -> ModelSpec:
    """Nemotron-H / Nemotron 3 (transformers' ``NemotronHConfig``): ``hybrid_override_pattern`` gives each layer's
    kind in Megatron-Core's hybrid symbols (M Mamba-2 mixer, * attention, - MLP, E MoE), every layer one RMSNorm
    and one residual block; attention without position embeddings (Megatron-Bridge's NemotronH bridge sets
    ``position_embedding_type="none"``), the MLPs and experts squared-ReLU (``mlp_hidden_act`` relu2: two matrices,
    not gated); the shared expert is one MLP of ``moe_shared_expert_intermediate_size``."""
    layers = f.int("num_hidden_layers", maximum=MAX_LAYERS)
    pattern = f.str("hybrid_override_pattern")
    if len(pattern) != layers or set(pattern) - set(HYBRID_SYMBOLS):
        raise PlannerError(f"must hold one of {''.join(HYBRID_SYMBOLS)} per layer ({layers} layers), got "
                           f"{pattern!r}", source=f.source, field="hybrid_override_pattern",
                           fix="M Mamba-2, * attention, - MLP, E MoE (Megatron-Core's hybrid symbols)")
    if f.int("num_nextn_predict_layers", default=0, minimum=0):
        raise PlannerError("multi-token prediction of hybrid models (an MTP pattern) is not supported yet",
                           source=f.source, field="num_nextn_predict_layers", fix="0")
    if f.str("mlp_hidden_act", "relu2") != "relu2":
        raise PlannerError(f"only the squared ReLU MLP of Nemotron-H is supported, got {f.data['mlp_hidden_act']!r}",
                           source=f.source, field="mlp_hidden_act", fix="relu2")
    h = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    experts = f.int("n_routed_experts", "num_experts", default=0, minimum=0) if "E" in pattern else 0
    moe_ffn = f.int("moe_intermediate_size") if experts else 0
    shared = 0
    if experts:
        width = f.int("moe_shared_expert_intermediate_size", default=0, minimum=0)
        if width % moe_ffn:
            raise PlannerError(f"moe_shared_expert_intermediate_size {width} is not a multiple of "
                               f"moe_intermediate_size {moe_ffn}", source=f.source,
                               field="moe_shared_expert_intermediate_size")
        shared = width // moe_ffn if f.int("n_shared_experts", default=1, minimum=0) else 0
    mamba = "M" in pattern
    return ModelSpec(
        name=name, model_type="nemotron_h", hidden_size=h, ffn_hidden_size=f.int("intermediate_size"),
        num_layers=layers, num_heads=heads, num_kv_heads=f.int("num_key_value_heads", default=heads),
        head_dim=f.int("head_dim", "attention_head_dim", default=0, minimum=0), vocab_size=f.int("vocab_size"),
        max_seq_len=f.int("max_position_embeddings"), tied_embeddings=f.bool("tie_word_embeddings", False),
        gated_mlp=False, rotary_positions=False, linear_bias=f.bool("attention_bias", False),
        mlp_bias=f.bool("mlp_bias", False), norms_per_layer=2, num_experts=experts,
        experts_per_token=f.int("num_experts_per_tok", default=0, minimum=0) if experts else 0,
        moe_ffn_hidden_size=moe_ffn, num_shared_experts=shared, layer_pattern=pattern,
        mamba_heads=f.int("mamba_num_heads") if mamba else 0, mamba_head_dim=f.int("mamba_head_dim") if mamba else 0,
        mamba_state_dim=f.int("ssm_state_size") if mamba else 0, mamba_groups=f.int("n_groups") if mamba else 0,
        mamba_conv_kernel=f.int("conv_kernel", default=4) if mamba else 0,
        mamba_chunk_size=f.int("chunk_size", default=DEFAULT_MAMBA_CHUNK) if mamba else 0, source=src)


def _llava(f: "_Fields", name: str, src: str, source: str) -> ModelSpec:
    """LLaVA (transformers' ``LlavaConfig``): the language model of ``text_config`` (its own ``model_type``, Llama by
    default) behind a CLIP vision tower (``vision_config``: CLIPVisionConfig's defaults where a field is absent,
    as transformers fills them: 12 layers of 768, 3072 MLP, 12 heads, 224-pixel images in 32-pixel patches) whose
    patch tokens, (image / patch)^2 plus the class token, a two-layer MLP projects (``projector_hidden_act`` GELU).
    One image per sample."""
    text = f.data.get("text_config")
    vision = f.data.get("vision_config")
    if not isinstance(text, dict) or not isinstance(vision, dict):
        raise PlannerError("a llava config needs text_config and vision_config objects", source=source,
                           field="text_config", fix="pass the checkpoint's config.json")
    spec = model_from_config({"model_type": "llama", **text, "name": name, "source": src}, source=source,
                             default_name=name)
    v = _Fields(vision, f"{source}: vision_config")
    image, patch = v.int("image_size", default=224), v.int("patch_size", default=32)
    if image % patch:
        raise PlannerError(f"image_size {image} is not a multiple of patch_size {patch}", source=v.source,
                           field="patch_size")
    return spec.with_(model_type="llava", vision_layers=v.int("num_hidden_layers", default=12, maximum=MAX_LAYERS),
                      vision_hidden_size=v.int("hidden_size", default=768),
                      vision_ffn_hidden_size=v.int("intermediate_size", default=3072),
                      vision_heads=v.int("num_attention_heads", default=12),
                      vision_tokens=(image // patch) ** 2 + 1, vision_images=1)


#: transformers' MllamaVisionConfig defaults (configuration_mllama.py): the five intermediate layers whose states
#: join the last one's, and the eight supported tile aspect ratios of four tiles
MLLAMA_INTERMEDIATE_LAYERS = 5
MLLAMA_ASPECT_RATIOS = 8
#: the Mllama vision encoder pads each tile's patch tokens to a multiple of this (MllamaVisionModel.forward)
MLLAMA_TILE_PAD = 8
#: transformers' MllamaTextConfig defaults, for the fields a text_config leaves out (configuration_mllama.py)
MLLAMA_TEXT_DEFAULTS = {"vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "intermediate_size": 14336, "max_position_embeddings": 131072,
                        "tie_word_embeddings": False}


def _mllama(f: "_Fields", name: str, src: str, source: str) -> ModelSpec:
    """Llama 3.2 Vision (transformers' ``MllamaConfig``, modeling_mllama.py): a Llama decoder (``text_config``)
    whose layers listed in ``cross_attention_layers`` cross-attend (queries from the text, keys and values from the
    images' tokens, RMSNorms on per-head queries and keys, tanh gates) instead of self-attending, behind a ViT
    (``vision_config``) over up to ``max_num_tiles`` tiles of ``image_size`` pixels in ``patch_size`` patches: each
    tile (patches + a class token, padded to a multiple of 8) runs ``num_hidden_layers`` local and
    ``num_global_layers`` gated global layers (LayerNorm, GELU MLP with biases, projections without), the tiles'
    tokens attending each other; the last state and five intermediate ones (``vision_output_dim``) go through one
    linear projector (with bias) into the text width. One image (all its tiles) per sample. Parameters outside the
    layers, counted here: the patch convolution (no bias), the class embedding, the gated position embedding and
    the per-aspect-ratio tile position embedding of every patch, the pre- and post-tile aspect-ratio embeddings
    with their gates, the pre / post LayerNorms, two gates per global layer, and the 8 image tokens' rows of the
    text embedding (``vocab_size + 8``). Llama-3.2-11B-Vision: 10,670,220,835 parameters."""
    text = f.data.get("text_config")
    vision = f.data.get("vision_config")
    if not isinstance(text, dict) or not isinstance(vision, dict):
        raise PlannerError("an mllama config needs text_config and vision_config objects", source=source,
                           field="text_config", fix="pass the checkpoint's config.json")
    spec = model_from_config({"model_type": "llama", **MLLAMA_TEXT_DEFAULTS,
                              **{k: v for k, v in text.items() if k != "model_type"}, "name": name, "source": src},
                             source=source, default_name=name)
    t = _Fields(text, f"{source}: text_config")
    layers = spec.num_layers
    marks = text.get("cross_attention_layers", [3, 8, 13, 18, 23, 28, 33, 38])
    if not isinstance(marks, list) or not all(isinstance(i, int) and 0 <= i < layers for i in marks) or not marks:
        raise PlannerError(f"cross_attention_layers must list layer indices below {layers}", source=t.source,
                           field="cross_attention_layers")
    v = _Fields(vision, f"{source}: vision_config")
    image, patch = v.int("image_size", default=448), v.int("patch_size", default=14)
    if image % patch:
        raise PlannerError(f"image_size {image} is not a multiple of patch_size {patch}", source=v.source,
                           field="patch_size")
    d = v.int("hidden_size", default=1280)
    tiles = v.int("max_num_tiles", default=4)
    local, glob = v.int("num_hidden_layers", default=32), v.int("num_global_layers", default=8)
    patches = (image // patch) ** 2 + 1  # + the class token
    padded = -(-patches // MLLAMA_TILE_PAD) * MLLAMA_TILE_PAD
    out_dim = v.int("vision_output_dim", default=d * (1 + MLLAMA_INTERMEDIATE_LAYERS))
    ratios = vision.get("supported_aspect_ratios") or [None] * MLLAMA_ASPECT_RATIOS
    if not isinstance(ratios, list):
        raise PlannerError("must be a list of [rows, columns] tile layouts", source=v.source,
                           field="supported_aspect_ratios")
    ratios = len(ratios)
    extra = (d * v.int("num_channels", default=3) * patch * patch + d + patches * d + (ratios + 1) * tiles * patches * d
             + 1 + 2 * ((ratios + 1) * tiles * d + 1) + 2 * 2 * d + 2 * glob + 8 * spec.hidden_size)
    return spec.with_(model_type="mllama", vision_layers=local + glob, vision_hidden_size=d,
                      vision_ffn_hidden_size=v.int("intermediate_size", default=5120),
                      vision_heads=v.int("attention_heads", "num_attention_heads", default=16),
                      vision_tokens=tiles * padded, vision_images=1, vision_output_dim=out_dim,
                      vision_extra_params=extra, cross_attention_tokens=tiles * patches,
                      cross_attention_pattern="".join("X" if i in marks else "S" for i in range(layers)))


def _sliding_window(f: "_Fields", model_type: str, layers: int, global_every: int = 0) -> tuple[int, int, str]:
    """(window, layers that use it) from a config.json: ``layer_types`` counts the "sliding_attention" layers
    (transformers' convention, gpt-oss and Gemma 3 write it); without it Mistral applies ``sliding_window`` to every
    layer, Qwen2 only with ``use_sliding_window`` (to the layers from ``max_window_layers`` on), and Gemma 2 / 3 to
    all but every ``global_every``-th layer (``sliding_window_pattern`` where the config gives it; Gemma 2: every
    other layer). Llama 4's chunked attention (``attention_chunk_size``, on the layers ``no_rope_layers`` marks 1)
    is counted as a window of the chunk size: a query sees on average about as many keys."""
    window = f.int("sliding_window", default=0, minimum=0)
    if model_type in ("llama4", "llama4_text"):
        chunk = f.int("attention_chunk_size", default=0, minimum=0)
        marks = f.data.get("no_rope_layers")
        if chunk and isinstance(marks, list) and len(marks) == layers:
            return chunk, sum(1 for x in marks if x), "".join("L" if x else "G" for x in marks)
        return 0, 0, ""
    if not window:
        return 0, 0, ""
    types = f.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
            raise PlannerError(f"must list {layers} layer type names", source=f.source, field="layer_types")
        return window, sum(t == "sliding_attention" for t in types), \
            "".join("L" if t == "sliding_attention" else "G" for t in types)
    if model_type == "mistral":
        return window, layers, "L" * layers
    if global_every:  # transformers' Gemma: layer i is global when (i + 1) % pattern == 0
        every = f.int("sliding_window_pattern", default=global_every)
        pattern = "".join("G" if (i + 1) % every == 0 else "L" for i in range(layers))
        return window, pattern.count("L"), pattern
    if model_type in ("qwen2", "qwen2_moe") and f.bool("use_sliding_window", False):
        first = min(layers, f.int("max_window_layers", default=layers, minimum=0))
        return window, layers - first, "G" * first + "L" * (layers - first)
    return 0, 0, ""


def validate_model(spec: ModelSpec, source: str) -> None:
    """Cross-field checks a config.json can fail."""
    if spec.num_heads % spec.num_kv_heads:
        raise PlannerError(f"num_attention_heads ({spec.num_heads}) is not a multiple of num_key_value_heads "
                           f"({spec.num_kv_heads})", source=source, field="num_key_value_heads")
    if not spec.head_dim and spec.hidden_size % spec.num_heads:
        raise PlannerError(f"hidden size {spec.hidden_size} is not divisible by {spec.num_heads} heads",
                           source=source, field="num_attention_heads", fix="or give head_dim explicitly")
    if spec.is_moe and not 0 < spec.experts_per_token <= spec.num_experts:
        raise PlannerError(f"num_experts_per_tok must be in 1..{spec.num_experts}, got {spec.experts_per_token}",
                           source=source, field="num_experts_per_tok")
    if spec.is_mla and not (spec.qk_nope_head_dim and spec.qk_rope_head_dim and spec.v_head_dim):
        raise PlannerError("multi-head latent attention (kv_lora_rank > 0) needs qk_nope_head_dim, qk_rope_head_dim "
                           "and v_head_dim", source=source, field="kv_lora_rank")
    if spec.expert_groups and (spec.num_experts % spec.expert_groups
                               or not 0 < spec.expert_groups_per_token <= spec.expert_groups):
        raise PlannerError(f"n_group ({spec.expert_groups}) must divide the {spec.num_experts} experts and topk_group "
                           f"({spec.expert_groups_per_token}) be in 1..n_group", source=source, field="topk_group")
    if spec.is_moe and not spec.moe_ffn_hidden_size:
        raise PlannerError("experts need a width", source=source, field="moe_intermediate_size")
    if spec.attention_pattern and (len(spec.attention_pattern) != spec.num_layers
                                   or set(spec.attention_pattern) - {"L", "G"}
                                   or spec.attention_pattern.count("L") != spec.sliding_window_layers):
        raise PlannerError(f"attention_pattern must hold one L (sliding window) or G (global) per layer, "
                           f"{spec.sliding_window_layers} L of {spec.num_layers}", source=source,
                           field="attention_pattern")
    if spec.cross_attention_pattern and (len(spec.cross_attention_pattern) != spec.num_layers
                                         or set(spec.cross_attention_pattern) - set("SX")
                                         or not spec.vision_layers or not spec.cross_attention_tokens
                                         or spec.is_moe or spec.layer_pattern or spec.positional_windows):
        raise PlannerError(f"cross_attention_pattern must give S or X for each of the {spec.num_layers} layers of a "
                           "dense model with a vision encoder and cross_attention_tokens > 0", source=source,
                           field="cross_attention_pattern")
    if spec.vision_layers and (not spec.vision_heads or spec.vision_hidden_size % spec.vision_heads
                               or not spec.vision_tokens or not spec.vision_images):
        raise PlannerError(f"vision encoder: hidden size {spec.vision_hidden_size} must split into "
                           f"{spec.vision_heads} heads, with tokens and images per sample > 0", source=source,
                           field="vision_config")
    if spec.layer_pattern and (len(spec.layer_pattern) != spec.num_layers
                               or set(spec.layer_pattern) - set(spec.hybrid_symbols)
                               or set(spec.hybrid_symbols) - set(HYBRID_SYMBOLS)):
        raise PlannerError(f"layer_pattern must hold one of {''.join(HYBRID_SYMBOLS)} per layer ({spec.num_layers})",
                           source=source, field="layer_pattern")
    if "E" in spec.layer_pattern and not spec.is_moe:
        raise PlannerError("MoE layers (E) need experts", source=source, field="n_routed_experts")
    if "M" in spec.layer_pattern:
        if not (spec.mamba_heads and spec.mamba_head_dim and spec.mamba_state_dim and spec.mamba_groups
                and spec.mamba_conv_kernel and spec.mamba_chunk_size):
            raise PlannerError("Mamba layers (M) need mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups, "
                               "conv_kernel and chunk_size > 0", source=source, field="mamba_num_heads")
        if spec.mamba_heads % spec.mamba_groups:
            raise PlannerError(f"mamba_num_heads ({spec.mamba_heads}) is not a multiple of n_groups "
                               f"({spec.mamba_groups})", source=source, field="n_groups",
                               fix="Megatron-Core's MambaMixer needs heads divisible by groups")
    if spec.moe_layer_pattern and (len(spec.moe_layer_pattern) != spec.num_layers
                                   or set(spec.moe_layer_pattern) - set("DE") or not spec.is_moe
                                   or spec.first_k_dense_layers or spec.layer_pattern):
        raise PlannerError(f"moe_layer_pattern must give one of D (dense) / E (MoE) for each of the "
                           f"{spec.num_layers} layers of a MoE model without first_k_dense_replace or a hybrid "
                           f"pattern", source=source, field="moe_layer_pattern")
    if spec.first_k_dense_layers > spec.num_layers:
        raise PlannerError("first_k_dense_replace is larger than num_hidden_layers", source=source,
                           field="first_k_dense_replace")
