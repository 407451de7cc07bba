"""Sliding-window attention: which layers use it (config.json) and the share of the score square a flash kernel
computes for them."""

import pytest

from planner.cost.compute import attended_fraction, layer_ops
from planner.errors import PlannerError
from planner.specs.config import RunConfig
from planner.specs.model import MOE_LAYER, load_model, model_from_config
from planner.validation.compare import modern_model_ref

GPT_OSS = load_model(modern_model_ref({"model": "models/gpt-oss-120b.json"}))
BASE = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 8,
        "num_hidden_layers": 4, "vocab_size": 32000, "max_position_embeddings": 8192}


def test_gpt_oss_window_by_hand():
    """gpt-oss: window 128 on the 18 even layers of 36. At s = 4096 a windowed query sees on average
    128 - 128*127/(2*4096) = 126.016 keys, 0.030766 of s; the full causal layers half: (0.5 + 0.030766) / 2."""
    assert (GPT_OSS.sliding_window, GPT_OSS.sliding_window_layers) == (128, 18)
    assert attended_fraction(GPT_OSS, 4096) == pytest.approx((0.5 + (128 - 128 * 127 / 8192) / 4096) / 2, rel=1e-12)
    cfg = RunConfig(num_gpus=8, ep=8, seq_len=4096, global_batch_size=8, sequence_parallel=False)
    core = next(o for o in layer_ops(GPT_OSS, cfg, MOE_LAYER) if o.name == "attention_core")
    full = 2.0 * 4096 * 4096 * (GPT_OSS.attn_q_dim + GPT_OSS.attn_out_dim)
    assert core.flops == pytest.approx(full * attended_fraction(GPT_OSS, 4096))
    # a window as long as the sequence changes nothing
    assert attended_fraction(GPT_OSS, 128) == pytest.approx(0.5)


def test_which_layers_slide_from_config_json():
    assert model_from_config({**BASE, "sliding_window": 512}).sliding_window_layers == 0  # llama: no window
    mistral = model_from_config({**BASE, "model_type": "mistral", "sliding_window": 512})
    assert (mistral.sliding_window, mistral.sliding_window_layers) == (512, 4)
    assert model_from_config({**BASE, "model_type": "mistral", "sliding_window": None}).sliding_window == 0
    qwen = model_from_config({**BASE, "model_type": "qwen2", "sliding_window": 512, "use_sliding_window": True,
                              "max_window_layers": 3})
    assert qwen.sliding_window_layers == 1  # layers from max_window_layers on
    typed = model_from_config({**BASE, "sliding_window": 256,
                               "layer_types": ["sliding_attention"] * 3 + ["full_attention"]})
    assert typed.sliding_window_layers == 3
    with pytest.raises(PlannerError, match="layer_types"):
        model_from_config({**BASE, "sliding_window": 256, "layer_types": ["sliding_attention"]})
