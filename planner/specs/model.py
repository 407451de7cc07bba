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

#: model_type values read as a Llama-style decoder (RMSNorm, SwiGLU, rotary positions, optional GQA).
LLAMA_LIKE = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "deepseek_v3", "deepseek_v2")
SUPPORTED_MODEL_TYPES = LLAMA_LIKE + ("gpt2",)
#: largest integer accepted in a config.json: int32, the type frameworks store shapes in; larger values are typos
#: and would overflow the cost model's float arithmetic
MAX_CONFIG_INT = 2**31 - 1
#: largest JSON file read (specs, profiles and plans are kilobytes; anything this big is a wrong path)
MAX_JSON_FILE_BYTES = 64 * 2**20


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
    linear_bias: bool = False
    dropout: bool = False  # Megatron GPT keeps dropout masks (Korthikanti Table 2 counts them)
    # Mixture of experts (0 experts = dense model)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_ffn_hidden_size: int = 0
    num_shared_experts: int = 0
    first_k_dense_layers: int = 0
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
        return self.num_layers - self.first_k_dense_layers if self.is_moe else 0

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

    def int(self, *keys: str, default: int | None = None, minimum: int = 1) -> int:
        for key in keys:
            if key in self.data and self.data[key] is not None:
                value = self.data[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                        isinstance(value, float) and not math.isfinite(value) or int(value) != value:
                    raise PlannerError(f"must be an integer, got {value!r}", source=self.source, field=key)
                if value < minimum:
                    raise PlannerError(f"must be >= {minimum}, got {value}", source=self.source, field=key)
                if value > MAX_CONFIG_INT:
                    raise PlannerError(f"must be <= {MAX_CONFIG_INT}, got {value}", source=self.source, field=key,
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
    if model_type == "gpt2":
        h = f.int("n_embd", "hidden_size")
        heads = f.int("n_head", "num_attention_heads")
        spec = ModelSpec(
            name=name, model_type=model_type, hidden_size=h,
            ffn_hidden_size=f.int("n_inner", "intermediate_size", default=4 * h),
            num_layers=f.int("n_layer", "num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
            vocab_size=f.int("vocab_size"), max_seq_len=f.int("n_positions", "max_position_embeddings"),
            tied_embeddings=f.bool("tie_word_embeddings", True), gated_mlp=False, norm="layernorm",
            learned_positions=True, linear_bias=True, dropout=f.bool("dropout", True), source=src,
        )
    elif model_type in LLAMA_LIKE:
        heads = f.int("num_attention_heads")
        h = f.int("hidden_size")
        layers = f.int("num_hidden_layers")
        num_experts = f.int("num_local_experts", "n_routed_experts", "num_experts", default=0, minimum=0)
        moe_ffn = shared = 0
        if num_experts:
            moe_ffn = f.int("moe_intermediate_size", default=0, minimum=0) or f.int("intermediate_size")
            shared = f.int("n_shared_experts", default=0, minimum=0)
            # Qwen2-MoE gives the shared expert as one MLP of shared_expert_intermediate_size: n_s = that / f
            shared_width = f.int("shared_expert_intermediate_size", default=0, minimum=0)
            if shared_width:
                if shared_width % moe_ffn:
                    raise PlannerError(f"shared_expert_intermediate_size {shared_width} is not a multiple of "
                                       f"moe_intermediate_size {moe_ffn}", source=source,
                                       field="shared_expert_intermediate_size")
                shared = shared_width // moe_ffn
        window, window_layers = _sliding_window(f, model_type, layers)
        spec = ModelSpec(
            name=name, model_type=model_type, hidden_size=h, ffn_hidden_size=f.int("intermediate_size"),
            num_layers=layers, num_heads=heads,
            num_kv_heads=f.int("num_key_value_heads", default=heads),
            head_dim=f.int("head_dim", default=0, minimum=0) if model_type != "deepseek_v3" else 0,
            vocab_size=f.int("vocab_size"), max_seq_len=f.int("max_position_embeddings"),
            tied_embeddings=f.bool("tie_word_embeddings", False),
            linear_bias=f.bool("attention_bias", model_type in ("qwen2", "qwen2_moe")),
            num_experts=num_experts,
            experts_per_token=f.int("num_experts_per_tok", default=2 if num_experts else 0, minimum=0),
            moe_ffn_hidden_size=moe_ffn,
            num_shared_experts=shared,
            first_k_dense_layers=f.int("first_k_dense_replace", default=0, minimum=0),
            expert_groups=f.int("n_group", default=0, minimum=0) if num_experts else 0,
            expert_groups_per_token=f.int("topk_group", default=0, minimum=0) if num_experts else 0,
            q_lora_rank=f.int("q_lora_rank", default=0, minimum=0),
            kv_lora_rank=f.int("kv_lora_rank", default=0, minimum=0),
            qk_rope_head_dim=f.int("qk_rope_head_dim", default=0, minimum=0),
            v_head_dim=f.int("v_head_dim", default=0, minimum=0),
            qk_nope_head_dim=f.int("qk_nope_head_dim", default=0, minimum=0),
            sliding_window=window, sliding_window_layers=window_layers if window else 0,
            source=src,
        )
    else:
        raise PlannerError(f"unknown model_type {model_type!r}", source=source, field="model_type",
                           fix=f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    validate_model(spec, source)
    return spec


def _sliding_window(f: "_Fields", model_type: str, layers: int) -> tuple[int, int]:
    """(window, layers that use it) from a config.json: ``layer_types`` counts the "sliding_attention" layers
    (transformers' convention, gpt-oss and Gemma 3 write it); without it Mistral applies ``sliding_window`` to every
    layer, and Qwen2 only with ``use_sliding_window`` (to the layers from ``max_window_layers`` on)."""
    window = f.int("sliding_window", default=0, minimum=0)
    if not window:
        return 0, 0
    types = f.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
            raise PlannerError(f"must list {layers} layer type names", source=f.source, field="layer_types")
        return window, sum(t == "sliding_attention" for t in types)
    if model_type == "mistral":
        return window, layers
    if model_type in ("qwen2", "qwen2_moe") and f.bool("use_sliding_window", False):
        return window, max(0, layers - f.int("max_window_layers", default=layers, minimum=0))
    return 0, 0


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
    if spec.first_k_dense_layers > spec.num_layers:
        raise PlannerError("first_k_dense_replace is larger than num_hidden_layers", source=source,
                           field="first_k_dense_replace")
