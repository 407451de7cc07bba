"""Current Hugging Face config.json families (issue 11): each loads with its own field names and parameter rules, and
its parameter count lands within 2% of the published one.

The configs below carry the fields of each model's config.json that the planner reads (others are ignored). Where
Megatron-Bridge's model providers give the shapes, they are cited (github NVIDIA-NeMo/Megatron-Bridge @ 00b7660,
src/megatron/bridge/models/...); the published counts come from the model cards and reports named per row.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.memory import active_params, total_params
from planner.errors import PlannerError
from planner.specs.model import SUPPORTED_MODEL_TYPES, model_from_config

QWEN3_8B = {  # qwen/qwen_provider.py Qwen3ModelProvider8B; published: 8.2B (Qwen/Qwen3-8B model card)
    "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False}
QWEN3_30B_A3B = {  # Qwen3MoEModelProvider30B_A3B; published: 30.5B total, 3.3B activated (model card)
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False}
QWEN3_235B = {**QWEN3_30B_A3B, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
              "num_hidden_layers": 94, "num_attention_heads": 64}  # Qwen3MoEModelProvider235B_A22B: 235B / 22B
GEMMA2_9B = {  # gemma/gemma2_provider.py Gemma2ModelProvider9B; Gemma 2 report Table 1: 8,324,201,984
    # non-embedding parameters (+ 256000 x 3584 tied embedding = 9.24B)
    "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
    "max_position_embeddings": 8192, "sliding_window": 4096}
GEMMA2_27B = {**GEMMA2_9B, "hidden_size": 4608, "intermediate_size": 36864, "num_hidden_layers": 46,
              "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128}  # 26,047,480,320 non-emb.
GEMMA3_27B = {  # gemma/gemma3_provider.py Gemma3ModelProvider27B, as the multimodal checkpoint nests it;
    # Gemma 3 report Table 1: 27B: 1,416M embedding + 25,600M non-embedding parameters (text)
    "model_type": "gemma3", "vision_config": {"hidden_size": 1152},
    "text_config": {"hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
                    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "vocab_size": 262208,
                    "max_position_embeddings": 131072, "sliding_window": 1024, "sliding_window_pattern": 6}}
GPT_OSS_120B = {  # gpt_oss/gpt_oss_provider.py GPTOSSProvider120B; OpenAI gpt-oss model card: 116.8B total
    "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
    "num_experts_per_tok": 4, "vocab_size": 201088, "max_position_embeddings": 131072, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "tie_word_embeddings": False}
PHI3_MINI = {  # Phi-3 report (Abdin et al. 2024, Sec. 2): 3072 hidden, 32 heads, 32 layers, vocabulary 32064; 3.8B
    "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064, "max_position_embeddings": 4096,
    "tie_word_embeddings": False}
OLMO2_7B = {  # allenai/OLMo-2-1124-7B config.json; OLMo 2 report: 7.3B (QK-norm over the full widths)
    "model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352, "max_position_embeddings": 4096,
    "tie_word_embeddings": False}
GPT_NEOX_20B = {  # Black et al. 2022, "GPT-NeoX-20B", Table 1: 44 layers, d_model 6144, 64 heads; 20,554,567,680
    "model_type": "gpt_neox", "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 44,
    "num_attention_heads": 64, "vocab_size": 50432, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    "use_parallel_residual": True, "rotary_pct": 0.25}
MPT_7B = {  # mosaicml/mpt-7b config.json; MosaicML: 6.7B parameters
    "model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4, "vocab_size": 50432,
    "max_seq_len": 2048, "no_bias": True}
LLAMA4_SCOUT = {  # meta-llama/Llama-4-Scout-17B-16E config.json (text_config); Meta: 109B total (with the vision
    # encoder, ~1B), 17B active
    "model_type": "llama4", "vision_config": {"hidden_size": 1408},
    "text_config": {"hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
                    "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                    "vocab_size": 202048, "max_position_embeddings": 10485760, "attention_chunk_size": 8192,
                    "no_rope_layers": [1, 1, 1, 0] * 12, "tie_word_embeddings": False}}
DEEPSEEK_V2_LITE = {  # deepseek-ai/DeepSeek-V2-Lite config.json; DeepSeek-V2 report: 15.7B total, 2.4B activated
    "model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400,
    "max_position_embeddings": 163840, "tie_word_embeddings": False}
MISTRAL_NEMO = {  # mistralai/Mistral-Nemo-Base-2407 config.json; Mistral AI: 12B (12.2B)
    "model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 131072,
    "max_position_embeddings": 1024000, "tie_word_embeddings": False}

#: vendors count "active" parameters two ways: with the input embedding (Qwen, Meta, Mistral) or without it, the
#: embedding being a lookup and no GEMM (DeepSeek, OpenAI); `model_params.active` counts it, so for the second kind
#: the comparison takes it out
WITHOUT_EMBEDDING = ("deepseek_v2",)
PUBLISHED = [  # (config, total parameters, active per token or None, tolerance)
    (QWEN3_8B, 8.19e9, None, 0.02),
    (QWEN3_30B_A3B, 30.5e9, 3.3e9, 0.02),
    (QWEN3_235B, 235e9, 22e9, 0.02),
    (GEMMA2_9B, 8_324_201_984 + 256000 * 3584, None, 0.001),
    (GEMMA2_27B, 26_047_480_320 + 256000 * 4608, None, 0.001),
    (GEMMA3_27B, 1.416e9 + 25.600e9, None, 0.02),
    (GPT_OSS_120B, 116.8e9, None, 0.02),
    (PHI3_MINI, 3.8e9, None, 0.02),
    (OLMO2_7B, 7.3e9, None, 0.02),
    (GPT_NEOX_20B, 20_554_567_680, None, 0.002),
    (MPT_7B, 6.7e9, None, 0.02),
    (LLAMA4_SCOUT, 109e9 - 1e9, 17e9, 0.02),
    (DEEPSEEK_V2_LITE, 15.7e9, 2.4e9, 0.03),
    (MISTRAL_NEMO, 12.2e9, None, 0.02),
]


@pytest.mark.parametrize("config, total, active, rel", PUBLISHED,
                         ids=[f"{c['model_type']}-{i}" for i, (c, *_rest) in enumerate(PUBLISHED)])
def test_parameter_counts_match_the_published_ones(config, total, active, rel):
    spec = model_from_config(config)
    assert total_params(spec) == pytest.approx(total, rel=rel)
    if active is not None:
        lookup = spec.vocab_size * spec.hidden_size if spec.model_type in WITHOUT_EMBEDDING else 0
        assert spec.is_moe and active_params(spec) - lookup == pytest.approx(active, rel=rel)


def test_family_rules_read_from_the_config():
    g2 = model_from_config(GEMMA2_9B)
    assert g2.tied_embeddings and g2.norms_per_layer == 4 and g2.sliding_window == 4096
    assert g2.sliding_window_layers == 21  # every other layer of 42
    g3 = model_from_config(GEMMA3_27B)
    assert g3.hidden_size == 5376 and g3.qk_norm == "head" and g3.sliding_window_layers == 62 - 62 // 6
    oss = model_from_config(GPT_OSS_120B)
    assert oss.linear_bias and oss.mlp_bias and oss.sliding_window_layers == 18 and oss.num_experts == 128
    assert model_from_config(OLMO2_7B).qk_norm == "full"
    neox = model_from_config(GPT_NEOX_20B)
    assert not neox.gated_mlp and neox.norm == "layernorm" and neox.linear_bias and not neox.tied_embeddings
    scout = model_from_config(LLAMA4_SCOUT)
    assert scout.ffn_hidden_size == 16384 and scout.moe_ffn_hidden_size == 8192 and scout.num_shared_experts == 1
    assert scout.sliding_window == 8192 and scout.sliding_window_layers == 36  # chunked attention on 3 of 4 layers
    falcon = model_from_config({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128,
                                "num_hidden_layers": 60, "new_decoder_architecture": True, "num_kv_heads": 8,
                                "vocab_size": 65024})
    assert falcon.num_kv_heads == 8 and falcon.ffn_hidden_size == 4 * 8192 and not falcon.gated_mlp
    falcon7 = model_from_config({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
                                 "num_hidden_layers": 32, "multi_query": True, "vocab_size": 65024})
    assert falcon7.num_kv_heads == 1
    sc2 = model_from_config({"model_type": "starcoder2", "hidden_size": 6144, "intermediate_size": 24576,
                             "num_hidden_layers": 40, "num_attention_heads": 48, "num_key_value_heads": 4,
                             "vocab_size": 49152, "max_position_embeddings": 16384, "sliding_window": 4096})
    assert sc2.sliding_window_layers == 40 and sc2.linear_bias and not sc2.gated_mlp


def test_interleaved_moe_layers_from_config_json():
    """MoE layers interleaved with dense ones (issue 16, heterogeneous layers): Llama 4 Maverick's
    interleave_moe_layer_step 2 (transformers' Llama4TextConfig: layers 1, 3, ... MoE, the dense ones of
    intermediate_size_mlp width), its explicit moe_layers list, Qwen-MoE's decoder_sparse_step with mlp_only_layers;
    Maverick's shipped spec holds Meta's published sizes, 400B total and 17B active (model card), and exports
    Megatron-LM's --moe-layer-freq as the repeating unit (DeepSeek-V3's leading dense layers as runs)."""
    from planner.cost.memory import active_params, total_params
    from planner.export.megatron import moe_layer_freq
    from planner.specs.model import load_model

    maverick = json.loads(json.dumps(LLAMA4_SCOUT))
    maverick["text_config"].update(interleave_moe_layer_step=2, num_local_experts=128)
    m = model_from_config(maverick)
    assert m.moe_layer_pattern == "DE" * 24 and m.num_moe_layers == 24 and m.kind_index[:4] == (0, 1, 0, 1)
    listed = json.loads(json.dumps(maverick))
    listed["text_config"]["moe_layers"] = list(range(1, 48, 2))
    assert model_from_config(listed).moe_layer_pattern == m.moe_layer_pattern
    qwen = model_from_config({**QWEN3_30B_A3B, "decoder_sparse_step": 2, "mlp_only_layers": [1]})
    assert qwen.moe_layer_pattern[:6] == "DDDEDE" and qwen.num_moe_layers == 23
    assert model_from_config({**QWEN3_30B_A3B, "mlp_only_layers": []}).moe_layer_pattern == ""  # every layer MoE
    shipped = load_model("llama-4-maverick")
    assert shipped.moe_layer_pattern == "DE" * 24
    assert total_params(shipped, 8192) == pytest.approx(400e9, rel=0.005)
    assert active_params(shipped, 8192) == pytest.approx(17e9, rel=0.02)  # 17.2B
    assert moe_layer_freq(shipped) == "([0,1]*24)"
    assert moe_layer_freq(load_model("deepseek-v3")) == "([0]*3+[1]*58)"
    with pytest.raises(PlannerError, match="moe_layers"):
        bad = json.loads(json.dumps(maverick))
        bad["text_config"]["moe_layers"] = [48]
        model_from_config(bad)
    with pytest.raises(PlannerError, match="unknown model_type 'bert'") as e:
        model_from_config({"model_type": "bert"})
    assert "qwen3_moe" in str(e.value) and len(SUPPORTED_MODEL_TYPES) >= 20


@pytest.mark.parametrize("config", [QWEN3_30B_A3B, GEMMA3_27B, GPT_NEOX_20B, LLAMA4_SCOUT, MPT_7B],
                         ids=["qwen3_moe", "gemma3", "gpt_neox", "llama4", "mpt"])
def test_configs_plan_through_the_cli_and_report_their_counts(config, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    r = CliRunner().invoke(app, ["plan", "--model", str(path), "--cluster", "h100-80gb-sxm", "--gpus", "64",
                                 "--global-batch", "128", "--seq-len", "4096", "--json", "--top", "0"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    spec = model_from_config(config)
    assert d["model_params"] == {"total": total_params(spec, 4096), "active": active_params(spec, 4096)}
