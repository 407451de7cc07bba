"""Heterogeneous layers by position (issue 16 part 4, first slice): a dense model's sliding-window and global
attention layers (Gemma 2 / 3's local:global pattern, transformers' ``layer_types``) are costed as the two kinds of
layer they are, wherever they sit, so the pipeline partition balances stages by their real cost."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.cost.step import estimate
from planner.plan import search_plans
from planner.search.engine import search
from planner.search.space import SearchSpace, build_space
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import model_from_config
from tests.test_hf_models import GEMMA3_27B, GPT_OSS_120B

H100 = load_cluster("h100-80gb-sxm")
G27 = model_from_config(GEMMA3_27B)
#: a small Gemma-3-like model (12 layers, every 6th global) for brute force
SMALL = model_from_config({"model_type": "gemma3_text", "hidden_size": 2048, "intermediate_size": 8192,
                           "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 8,
                           "head_dim": 128, "vocab_size": 32000, "max_position_embeddings": 32768,
                           "sliding_window": 512, "sliding_window_pattern": 6})


def test_patterns_from_config_json():
    """transformers' Gemma 3: layer i is global when (i + 1) % sliding_window_pattern == 0; gpt-oss writes
    layer_types, but as a MoE model keeps the averaged window (its two kinds are dense and MoE)."""
    assert G27.attention_pattern == ("LLLLLG" * 11)[:62] and G27.attention_pattern.count("G") == 10
    assert G27.positional_windows and G27.num_second_kind == 52
    oss = model_from_config(GPT_OSS_120B)
    assert oss.attention_pattern == "LG" * 18 and not oss.positional_windows
    assert oss.second_kind == (True,) * 36  # its MoE layers


def test_whole_model_work_is_the_averaged_one():
    """On one stage without CP, the attention of 52 local and 10 global layers adds up to the averaged model's:
    only where the layers sit changes."""
    cfg = RunConfig(num_gpus=8, tp=8, seq_len=32768, global_batch_size=1, recompute="full", tp_comm_overlap=True)
    positional = estimate(G27, H100, cfg)
    averaged = estimate(G27.with_(attention_pattern=""), H100, cfg)
    assert positional.stages[0].compute_s == pytest.approx(averaged.stages[0].compute_s, rel=1e-9)


def test_stages_holding_global_layers_are_slower():
    """PP 8 over 62 layers, split 8 x 7 + 6: at 128K each middle rank's forward time grows with its global layers."""
    cfg = RunConfig(num_gpus=64, tp=8, pp=8, seq_len=131072, global_batch_size=8, recompute="full",
                    tp_comm_overlap=True)
    e = estimate(G27, H100, cfg)
    starts = np.cumsum((0,) + tuple(len(s.layers) and s.layers[0] for s in e.stages))[:-1]
    middle = range(1, 7)
    globals_ = [G27.attention_pattern[starts[r]:starts[r] + e.stages[r].layers[0]].count("G") for r in middle]
    fwd = [e.stages[r].fwd_s for r in middle]
    order = np.argsort(globals_, kind="stable")
    assert all(fwd[order[i]] <= fwd[order[i + 1]] + 1e-12 for i in range(len(order) - 1))
    assert max(fwd) > 1.05 * min(fwd)


def test_search_is_exact_with_positional_windows():
    """Brute force over every row of a small space = the search's best; the pruning floors hold (no violations)."""
    space = SearchSpace(partial_recompute=False, tp_values=(1, 2), schedules=("1f1b", "interleaved-1f1b"),
                        zero_stages=(1,), hsdp_node_spans=())
    cfgs = assert_search_is_exact(SMALL, 8, 16, 16384, space)
    assert any(c.pp > 1 for c in cfgs)


def assert_search_is_exact(model, gpus: int, global_batch: int, seq_len: int, space: SearchSpace) -> list:
    """Brute force over every row of the space = the search's best, with no bound above an exact value; returns
    the rows' configurations."""
    sp = build_space(model, H100, gpus, global_batch, seq_len, space)
    rows = sp.expand(np.arange(len(sp.groups)))
    cfgs = [sp.config(int(g), int(z), int(r), int(h)) for g, z, r, h in zip(rows.group, rows.zero, rows.rec,
                                                                             rows.hsdp)]
    fitting = [e.step_time_s for e in (estimate(model, H100, c, check=False) for c in cfgs) if e.fits]
    res = search(model, H100, gpus, global_batch, seq_len, space=space, top=0, refine_partition=False)
    assert res.best.estimate.step_time_s == pytest.approx(min(fitting), rel=1e-12)
    assert res.stats["bound_violations"] == 0
    return cfgs


def test_partition_balances_global_layers_and_beats_the_even_split():
    """Gemma-3-27B at 128K on 256 H100 as TP 8, PP 8 (1F1B, ZeRO-1): the partition DP, costing each layer as the
    kind it is, gives the stages holding more global layers fewer layers; 4.4% faster than the even split by layer
    count and 1.8% faster than the split that saw only the averaged layer cost (numbers of this model, 2026-12-05:
    since the attention kernel is timed by its tiles, a 1,024-token window layer pays its masked and per-row tiles,
    so local and global layers differ less than their attended FLOPs say; 4.5% and 4% before)."""
    space = SearchSpace(pp_values=(8,), tp_values=(8,), schedules=("1f1b",), zero_stages=(1,))
    even = search_plans(G27, H100, 256, 64, 131072, top_k=0, space=space, refine_partition=False)
    part = search_plans(G27, H100, 256, 64, 131072, top_k=0, space=space)
    split = part.config.layers_per_stage
    assert split is not None and sum(split) == 62 and len(set(split)) > 2
    assert part.estimate.step_time_s < 0.97 * even.estimate.step_time_s
    averaged = search_plans(G27.with_(attention_pattern=""), H100, 256, 64, 131072, top_k=0, space=space)
    blind = estimate(G27, H100, averaged.config)  # the averaged model's split, costed by position
    assert part.estimate.step_time_s < 0.99 * blind.step_time_s
    starts = np.cumsum((0,) + split)[:-1]
    g = [G27.attention_pattern[a:a + n].count("G") for a, n in zip(starts, split)]
    dense_g = [x / n for x, n in zip(g, split)]
    # the stage with the largest share of global layers holds no more layers than the one with the smallest
    assert split[int(np.argmax(dense_g[1:7])) + 1] <= split[int(np.argmin(dense_g[1:7])) + 1]


def test_the_plan_json_round_trips_the_pattern(tmp_path):
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.plan import model_from_plan_dict
    from planner.schema import validate_plan_json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3_27B))
    r = CliRunner().invoke(app, ["plan", "--model", str(path), "--cluster", "h100-80gb-sxm", "--gpus", "64",
                                 "--global-batch", "64", "--seq-len", "32768", "--pp", "8", "--json", "--top", "0"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    validate_plan_json(d)
    assert model_from_plan_dict(d).attention_pattern == G27.attention_pattern


# --- a vision encoder in front of the language model (LLaVA) -------------------------------------------------------
#: LLaVA-1.5-13B (liuhaotian/llava-v1.5-13b, as transformers' llava-hf/llava-1.5-13b-hf config.json): Vicuna-13B
#: behind CLIP ViT-L/14 at 336 pixels
LLAVA_13B = {"model_type": "llava", "projector_hidden_act": "gelu",
             "text_config": {"model_type": "llama", "hidden_size": 5120, "intermediate_size": 13824,
                             "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
                             "vocab_size": 32064, "max_position_embeddings": 4096},
             "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                               "num_attention_heads": 16, "image_size": 336, "patch_size": 14}}


def test_llava_config_reads_the_vision_tower():
    """CLIP ViT-L/14: 24 layers of 1024; 336-pixel images in 14-pixel patches are 576 patch tokens + the class
    token. Its encoder layers hold ~304M parameters (OpenAI CLIP model card: ViT-L/14 image encoder 304M, whose
    patch and position embeddings, ~1.2M, the planner leaves out)."""
    from planner.cost.memory import layer_params, total_params, vision_params

    m = model_from_config(LLAVA_13B)
    assert (m.vision_layers, m.vision_hidden_size, m.vision_tokens, m.vision_images) == (24, 1024, 577, 1)
    enc = m.vision_encoder
    assert not enc.causal and enc.num_layers == 24
    patch_and_positions = 3 * 14 * 14 * 1024 + 577 * 1024
    assert 24 * layer_params(enc) + patch_and_positions == pytest.approx(304e6, rel=0.01)
    projector = 1024 * 5120 + 5120 + 5120 * 5120 + 5120
    assert vision_params(m) == 24 * layer_params(enc) + projector
    assert total_params(m, 4096) == total_params(m.with_(vision_layers=0), 4096) + vision_params(m)


def test_the_encoder_runs_on_the_first_stage_with_whole_attention_squares():
    from planner.cost import comm
    from planner.cost.compute import layer_ops, vision_config, vision_projector_ops
    from planner.cost.step import layer_costs
    from planner.cost.compute import pass_times

    m = model_from_config(LLAVA_13B)
    cfg = RunConfig(num_gpus=32, tp=4, pp=8, global_batch_size=64, seq_len=4096, recompute="selective",
                    tp_comm_overlap=True)
    vcfg = vision_config(m, cfg)
    core = {o.name: o for o in layer_ops(m.vision_encoder, vcfg)}["attention_core"]
    T = 577  # one image per sample, micro-batch 1: every query attends all 577 keys (no causal half)
    assert float(core.flops) == pytest.approx(2.0 * T * 577 * 2 * 1024 / 4)
    with_, without = estimate(m, H100, cfg), estimate(m.with_(vision_layers=0), H100, cfg)
    enc = layer_costs(m.vision_encoder, H100, vcfg, comm.groups_for(H100, 4, 1, 1, 1))
    proj = pass_times(vision_projector_ops(m, vcfg), H100.gpu)
    extra = 24 * float(enc.fwd_total_s + enc.bwd_input_total_s + enc.bwd_weight_s) + float(proj.fwd_s + proj.bwd_s)
    assert with_.stages[0].time_per_microbatch_s == pytest.approx(without.stages[0].time_per_microbatch_s + extra)
    assert [s.time_per_microbatch_s for s in with_.stages[1:]] == \
        pytest.approx([s.time_per_microbatch_s for s in without.stages[1:]])


def test_partition_gives_the_encoder_stage_fewer_layers():
    """LLaVA-1.5-13B with five images per sample (AnyRes-style tiling) on 32 H100 as TP 4, PP 8, 1F1B: the encoder
    weighs about two decoder layers on stage 0; the partition DP moves layers off it. Even split by layer count
    3.89 s, balanced 3.46 s (1.13x; numbers of this model, 2026-12-05). Splits with the same slowest stage tie
    under 1F1B, so only stage 0's share is pinned: fewer layers than the even five."""
    m = model_from_config(LLAVA_13B).with_(vision_images=5)
    space = SearchSpace(pp_values=(8,), tp_values=(4,), schedules=("1f1b",), zero_stages=(1,))
    even = search_plans(m, H100, 32, 128, 4096, top_k=0, space=space, refine_partition=False)
    part = search_plans(m, H100, 32, 128, 4096, top_k=0, space=space)
    split = part.config.layers_per_stage
    assert split is not None and split[0] < 40 / 8 and sum(split) == 40
    assert part.estimate.step_time_s < 0.92 * even.estimate.step_time_s


def test_search_is_exact_with_a_vision_encoder():
    small = model_from_config({**LLAVA_13B, "text_config": {**LLAVA_13B["text_config"], "hidden_size": 2048,
                                                            "intermediate_size": 5504, "num_hidden_layers": 8,
                                                            "num_attention_heads": 16, "num_key_value_heads": 16}})
    small = small.with_(vision_images=4)
    space = SearchSpace(partial_recompute=False, tp_values=(1, 2), schedules=("1f1b",), zero_stages=(1,),
                        hsdp_node_spans=())
    assert_search_is_exact(small, 8, 16, 4096, space)


def test_exporters_refuse_a_vision_language_plan():
    from planner.errors import PlannerError
    from planner.export import emit
    from planner.plan import plan_dict

    m = model_from_config(LLAVA_13B)
    cfg = RunConfig(num_gpus=32, tp=4, pp=8, global_batch_size=64, seq_len=4096)
    d = json.loads(json.dumps(plan_dict(m, H100.name, cfg, estimate(m, H100, cfg))))
    for target in ("megatron", "torchtitan", "deepspeed", "nemo"):
        with pytest.raises(PlannerError, match="vision encoder"):
            emit(d, target)


def test_plan_cli_plans_a_vlm_under_the_default_stack_and_emit_says_why_not(tmp_path):
    """The default stack (Megatron-Core) runs LLaVA-style models, so `plan` answers; `--emit` refuses before
    searching, naming the reason, with a non-zero exit."""
    from typer.testing import CliRunner

    from planner.cli import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAVA_13B))
    base = ["plan", "--model", str(path), "--cluster", "h100-80gb-sxm", "--gpus", "32", "--global-batch", "128",
            "--seq-len", "4096", "--pp", "8", "--tp", "4", "--top", "0"]
    r = CliRunner().invoke(app, base + ["--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["parallelism"]["pp"] == 8
    r = CliRunner().invoke(app, base + ["--emit", "megatron"])
    assert r.exit_code != 0 and "vision encoder" in r.output and "Traceback" not in r.output


#: a small Qwen-MoE-like model whose MoE layers alternate with dense ones (decoder_sparse_step 2)
INTERLEAVED = model_from_config({"model_type": "qwen2_moe", "hidden_size": 1024, "intermediate_size": 4096,
                                 "moe_intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
                                 "num_key_value_heads": 8, "num_experts": 8, "num_experts_per_tok": 2,
                                 "decoder_sparse_step": 2, "vocab_size": 32000, "max_position_embeddings": 8192})


def test_search_is_exact_with_interleaved_moe_layers():
    """MoE layers between dense ones (``moe_layer_pattern``): brute force over every row of a small space with
    expert parallelism and virtual stages = the search's best, no bound above an exact value; a stage's MoE layers
    are where the pattern puts them."""
    assert INTERLEAVED.moe_layer_pattern == "DE" * 4
    space = SearchSpace(partial_recompute=False, tp_values=(1, 2), schedules=("1f1b", "interleaved-1f1b"),
                        zero_stages=(1,), hsdp_node_spans=(), cp_kinds=("ring",))
    cfgs = assert_search_is_exact(INTERLEAVED, 8, 16, 4096, space)
    assert any(c.ep > 1 for c in cfgs) and any(c.vpp > 1 for c in cfgs)
    # PP 2: each stage holds two dense and two MoE layers; the estimate's parameters say so
    e = estimate(INTERLEAVED, H100, RunConfig(num_gpus=8, pp=2, ep=4, global_batch_size=16, seq_len=4096))
    assert e.stages[0].params_expert == pytest.approx(e.stages[1].params_expert) and e.stages[0].params_expert > 0


# --- cross-attention layers over an image encoder (Llama 3.2 Vision) ------------------------------------------------
def test_mllama_config_reads_the_cross_attention_layers_and_counts_every_parameter():
    """Llama-3.2-11B-Vision: 40 decoder layers, cross-attention at 3, 8, ..., 38; a ViT of 32 local + 8 global
    layers over 4 tiles of 560 pixels in 14-pixel patches (1,601 tokens a tile with the class token, padded to 1,608
    in the encoder); the text attends 6,404 image tokens. Its parameters counted as transformers builds the model
    match the checkpoint's 10,670,220,835 exactly."""
    from planner.cost.memory import total_params
    from planner.specs.model import CROSS_ATTENTION_LAYER, load_model

    m = load_model("llama-3.2-11b-vision")
    assert m.cross_attention_pattern == "".join("X" if i % 5 == 3 else "S" for i in range(40))
    assert m.layer_kinds[1] == CROSS_ATTENTION_LAYER and m.kind_index.count(1) == 8
    assert (m.vision_layers, m.vision_tokens, m.cross_attention_tokens, m.vision_output_dim) == (40, 6432, 6404, 7680)
    assert not m.vision_encoder.linear_bias and m.vision_encoder.mlp_bias
    assert total_params(m) == 10_670_220_835


def test_a_cross_attention_layer_by_hand():
    """TP 2, one 4,096-token sample with one image: queries from the text (h -> q_dim), keys and values from the
    6,404 image tokens (h -> 2 kv_dim), every query attending every image key (no causal half), no RoPE."""
    from planner.cost.compute import layer_ops
    from planner.specs.model import CROSS_ATTENTION_LAYER, load_model

    m = load_model("llama-3.2-11b-vision")
    cfg = RunConfig(num_gpus=2, tp=2, global_batch_size=1, seq_len=4096)
    ops = {o.name: o for o in layer_ops(m, cfg, CROSS_ATTENTION_LAYER)}
    assert float(ops["q_proj"].flops) == 2 * 4096 * 4096 * 4096 / 2
    assert float(ops["cross_kv_proj"].flops) == 2 * 6404 * 4096 * 2 * 1024 / 2
    assert float(ops["attention_core"].flops) == 2 * 4096 * 6404 * (4096 + 4096) / 2
    assert not ops["attention_core"].shape.causal and float(ops["attention_core"].shape.keys) == 6404
    assert "rope" not in ops and "qkv_proj" not in ops


def test_model_flops_count_the_cross_attention_layers_by_hand():
    """Turning the 8 cross-attention layers into self-attention ones changes a step's model FLOPs (3 x forward,
    full squares) per sample by: Q / output projections instead of QKV / output (minus 2 x 2 h kv per text token
    and layer), the image keys' square instead of the text's (2 s (V - s) 2q), and the K / V projections of the
    V image tokens (2 V h 2 kv)."""
    from planner.cost.compute import model_flops_per_step
    from planner.specs.model import load_model

    m = load_model("llama-3.2-11b-vision")
    s, V, h, q, kv = 4096, 6404, 4096, 4096, 1024
    delta = model_flops_per_step(m, 1, s) - model_flops_per_step(m.with_(cross_attention_pattern="S" * 40), 1, s)
    by_hand = 3 * 8 * (-s * 2 * h * 2 * kv + s * 2 * (V - s) * 2 * q + V * 2 * h * 2 * kv)
    assert delta == pytest.approx(by_hand, rel=1e-12)


def test_later_stages_receive_the_cross_attention_states_and_cp_is_refused():
    from planner.cost.step import pipeline_message_bytes
    from planner.cost.validity import config_problems
    from planner.specs.model import load_model

    m = load_model("llama-3.2-11b-vision")
    cfg = RunConfig(num_gpus=16, tp=4, pp=4, global_batch_size=64, micro_batch_size=2, seq_len=4096)
    assert float(pipeline_message_bytes(m, cfg)) == (2 * 4096 + 2 * 6404) * 4096 * 2 / 4
    problems = dict(config_problems(m, H100, cfg.with_(num_gpus=32, cp=2)))
    assert "cross-attention" in problems["cp"]


def test_partition_balances_the_encoder_stage_and_the_cross_attention_layers():
    """Llama-3.2-11B-Vision on 16 H100 as TP 4, PP 4, 1F1B: the 40-layer encoder over 6,432 tokens weighs more than
    a stage of decoder layers, so the DP leaves stage 0 one layer (1, 15, 14, 10): 3.31 s against 4.98 s for the
    even split by layer count (1.50x; this model, 2026-12-06)."""
    from planner.specs.model import load_model

    m = load_model("llama-3.2-11b-vision")
    space = SearchSpace(pp_values=(4,), tp_values=(4,), schedules=("1f1b",), zero_stages=(1,))
    even = search_plans(m, H100, 16, 64, 4096, top_k=0, space=space, refine_partition=False)
    part = search_plans(m, H100, 16, 64, 4096, top_k=0, space=space)
    split = part.config.layers_per_stage
    assert split is not None and sum(split) == 40 and split[0] <= 2
    assert part.estimate.step_time_s < even.estimate.step_time_s / 1.4


def test_search_is_exact_with_cross_attention_layers():
    small = model_from_config({"model_type": "mllama",
                               "text_config": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
                                               "num_attention_heads": 8, "num_key_value_heads": 4,
                                               "vocab_size": 32000, "cross_attention_layers": [2, 6]},
                               "vision_config": {"hidden_size": 512, "intermediate_size": 2048,
                                                 "num_hidden_layers": 4, "num_global_layers": 2,
                                                 "attention_heads": 8, "image_size": 224, "patch_size": 14}})
    space = SearchSpace(partial_recompute=False, tp_values=(1, 2), schedules=("1f1b",), zero_stages=(1,),
                        hsdp_node_spans=())
    rows = assert_search_is_exact(small, 8, 16, 2048, space)
    assert all(cfg.cp == 1 for cfg in rows)


def test_exporters_refuse_a_cross_attention_plan():
    from planner.errors import PlannerError
    from planner.export import emit
    from planner.plan import plan_dict
    from planner.specs.model import load_model

    m = load_model("llama-3.2-11b-vision")
    cfg = RunConfig(num_gpus=16, tp=4, pp=4, global_batch_size=64, seq_len=4096)
    d = json.loads(json.dumps(plan_dict(m, H100.name, cfg, estimate(m, H100, cfg))))
    for target in ("megatron", "torchtitan", "deepspeed", "nemo"):
        with pytest.raises(PlannerError, match="vision encoder"):
            emit(d, target)


def test_more_images_per_sample_never_make_a_cross_attention_step_faster_or_smaller():
    """More images per sample: more keys for every cross-attention query, more K/V to project and keep, a longer
    encoder pass and a bigger pipeline message; never less time or memory."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from planner.specs.model import load_model

    m = load_model("llama-3.2-11b-vision")

    @settings(max_examples=15, deadline=None)
    @given(st.integers(1, 3), st.integers(0, 2), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]))
    def check(images, more, tp, pp):
        cfg = RunConfig(num_gpus=tp * pp, tp=tp, pp=pp, global_batch_size=8, seq_len=2048)
        a = estimate(m.with_(vision_images=images), H100, cfg)
        b = estimate(m.with_(vision_images=images + more), H100, cfg)
        assert b.step_time_s >= a.step_time_s * (1 - 1e-12)
        assert b.peak_memory_bytes >= a.peak_memory_bytes * (1 - 1e-12)

    check()
