"""GEMM precision (issue 9): per-dtype tensor-core peaks from the profiles, which operators run narrow, the fp8
quantization traffic, refusals on GPUs without the format, and the launchers' own switches."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.compute import FP8_CAST_BYTES_PER_ELEMENT, layer_ops, op_time_s
from planner.cost.memory import gathered_weight_bytes, held_linear_weight_bytes, layer_params_on_gpu
from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.errors import PlannerError
from planner.export import deepspeed, megatron, nemo, torchtitan
from planner.search.engine import search
from planner.search.space import SearchSpace
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import DENSE_LAYER, load_model

H100, A100, B200 = load_cluster("h100-80gb-sxm"), load_cluster("a100-80gb-sxm"), load_cluster("b200-180gb")
L8B = load_model("llama-3.1-8b")


def test_profiles_carry_the_datasheet_dense_peaks():
    """Vendor datasheets, dense (half the sparse figure): H100 FP8 1,979; B200 FP8 and MXFP8 4,500; A100 no FP8."""
    assert H100.gpu.tensor_speedup("fp8") == pytest.approx(1979 / 989)
    assert float(B200.gpu.tensor_speedup("mxfp8")) == pytest.approx(2.0)
    assert H100.gpu.precisions() == ("bf16", "fp16", "fp8") and "mxfp8" in B200.gpu.precisions()
    assert np.isnan(A100.gpu.tensor_speedup("fp8")) and float(A100.gpu.tensor_speedup("fp16")) == 1.0


def test_only_the_linear_layers_run_narrow_and_each_pays_its_quantization():
    cfg = RunConfig(num_gpus=8, tp=8, seq_len=8192, global_batch_size=8, precision="fp8")
    ops = {o.name: o for o in layer_ops(L8B, cfg)}
    assert ops["qkv_proj"].precision == "fp8" and ops["mlp_out"].precision == "fp8"
    assert ops["attention_core"].precision == "bf16"  # the attention core stays bf16 (no fp8 attention)
    # Transformer Engine's cast-transpose: 2 B read + 1 B fp8 + 1 B fp8 transpose per element of the GEMM's input
    T, h = 8192, L8B.hidden_size
    assert float(ops["qkv_proj_fp8_cast"].hbm_bytes) == FP8_CAST_BYTES_PER_ELEMENT * T * h == 4 * T * h
    bf16 = {o.name: o for o in layer_ops(L8B, cfg.with_(precision="bf16"))}
    assert float(bf16["qkv_proj_fp8_cast"].hbm_bytes) == 0.0
    # a large GEMM takes half the time at twice the peak when both run at the same duration-equivalent efficiency
    t8, t16 = float(op_time_s(ops["mlp_in"], H100.gpu)), float(op_time_s(bf16["mlp_in"], H100.gpu))
    assert 0.5 <= t8 / t16 < 0.62


def test_fp8_step_is_faster_but_not_twice_and_bf16_is_unchanged():
    cfg = RunConfig(num_gpus=8, cp=2, seq_len=8192, global_batch_size=128)
    bf16, fp8 = estimate(L8B, H100, cfg), estimate(L8B, H100, cfg.with_(precision="fp8"))
    assert 1.1 < bf16.step_time_s / fp8.step_time_s < 1.8
    assert estimate(L8B, H100, cfg.with_(precision="fp16")).step_time_s == pytest.approx(bf16.step_time_s)


def test_fp8_weights_are_held_as_transformer_engine_holds_them():
    """Megatron-Core --fp8-param-gather builds the decoder layers under Transformer Engine's fp8_model_init: the
    weight is a Float8Tensor (1 B, plus a 1 B transpose where fp8 GEMMs are TN-only: Hopper) or an MXFP8Tensor
    (row- and column-wise data, one E8M0 scale per 32 elements each) and no bf16 copy; Megatron-FSDP drops the fp8
    transpose of its shards between uses. Without it TE keeps a quantized copy beside each bf16 weight across the
    micro-batches of a step. torchao (te_quantized_weights false) quantizes per use: bf16 alone. The embedding and
    LM head stay bf16, and gradients and optimizer states do not change."""
    assert H100.gpu.fp8_gemm_tn_only and not B200.gpu.fp8_gemm_tn_only
    held = held_linear_weight_bytes
    assert held("fp8", True, True, True) == 2.0 and held("fp8", True, False, True) == 1.0
    assert held("mxfp8", True, False, True) == pytest.approx(2 * 33 / 32)
    assert held("fp8", False, True, True) == 4.0 and held("fp8", False, False, True) == 3.0
    assert held("fp8", True, True, True, zero_stage=3) == 1.0 and held("fp8", False, True, True, zero_stage=3) == 2.0
    assert held("fp8", True, True, False) == held("fp8", False, True, False) == held("bf16", True, True, True) == 2.0
    assert gathered_weight_bytes("fp8", True, True, True) == 2.0 and gathered_weight_bytes("fp8", True, True, False) == 2
    cfg = RunConfig(num_gpus=8, tp=8, seq_len=8192, global_batch_size=64, precision="fp8", zero_stage=1)
    layers = L8B.num_layers * float(layer_params_on_gpu(L8B, 8, 1, DENSE_LAYER)[0])  # decoder weights, a TP rank

    def states(cluster, **kw):
        return estimate(L8B, cluster, cfg.with_(**kw)).stages[0].memory_bytes

    on, cached, torchao = (states(B200, fp8_param_gather=g, te_quantized_weights=te)
                           for g, te in ((True, True), (False, True), (False, False)))
    assert torchao["weights"] - on["weights"] == pytest.approx(layers * 1.0, rel=1e-6)
    assert cached["weights"] - torchao["weights"] == pytest.approx(layers * 1.0, rel=1e-6)
    assert on["gradients"] == torchao["gradients"] and on["optimizer"] == torchao["optimizer"]
    h100_on, h100_cached = (states(H100, fp8_param_gather=g) for g in (True, False))
    assert h100_on["weights"] == pytest.approx(torchao["weights"])  # Hopper: 1 B data + 1 B transpose = bf16's 2
    assert h100_cached["weights"] - h100_on["weights"] == pytest.approx(layers * 2.0, rel=1e-6)


def test_a_precision_the_gpu_lacks_is_refused_naming_the_option():
    cfg = RunConfig(num_gpus=8, seq_len=4096, global_batch_size=8, precision="fp8")
    assert config_problems(L8B, A100, cfg)[0][0] == "precision"
    assert config_problems(L8B, H100, cfg.with_(precision="mxfp8"))[0][0] == "precision"
    assert not config_problems(L8B, B200, cfg.with_(precision="mxfp8"))
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "a100-80gb-sxm", "--gpus", "8",
                                 "--global-batch", "8", "--precision", "fp8"])
    assert r.exit_code == 2 and "--precision" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "a100-80gb-sxm", "--gpus", "8",
                                 "--global-batch", "8", "--precision", "fp9"])
    assert r.exit_code == 2 and "--precision" in r.output
    with pytest.raises(PlannerError, match="fp8"):
        search(L8B, A100, 8, 8, 4096, space=SearchSpace(precision="fp8"))


def test_search_and_plan_json_carry_the_precision():
    res = search(L8B, H100, 8, 64, 8192, top=1, space=SearchSpace(precision="fp8"))
    assert all(c.config.precision == "fp8" for c in res.ranked)
    bf16 = search(L8B, H100, 8, 64, 8192, top=0)
    assert res.best.estimate.step_time_s < bf16.best.estimate.step_time_s
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                                 "--global-batch", "64", "--seq-len", "8192", "--precision", "fp8", "--json",
                                 "--top", "0"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["options"]["precision"] == "fp8"


def test_launchers_are_told_the_precision_or_refuse_it():
    from tests.test_export import config_only_plan

    fp8 = config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, precision="fp8")
    args = megatron.arguments(fp8)
    assert args[args.index("--fp8-format") + 1] == "hybrid" and "--bf16" in args
    assert torchtitan.sections(fp8)["model"] == {"converters": ["float8"]}
    assert nemo.overrides(fp8)["mixed_precision"] == "bf16_with_fp8_delayed_scaling_mixed"
    with pytest.raises(PlannerError, match="deepspeed cannot run this plan"):
        deepspeed.config(fp8)
    mx = config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, precision="mxfp8")
    assert "mxfp8" in megatron.arguments(mx)
    fp16 = config_only_plan(num_gpus=64, tp=8, pp=2, global_batch_size=64, precision="fp16")
    assert "--fp16" in megatron.arguments(fp16) and "--bf16" not in megatron.arguments(fp16)
    assert json.loads(deepspeed.render(fp16))["fp16"] == {"enabled": True}


def test_gb200_nvl72_is_one_72_gpu_nvlink_domain():
    """GB200 NVL72 (issue 9): the datasheet's per-GPU dense peaks, and groups of up to 72 GPUs stay on NVLink where
    an 8-GPU HGX B200 node sends them over the NIC."""
    from planner.cost import comm

    gb = load_cluster("gb200-nvl72")
    assert gb.gpus_per_node == 72 and gb.gpu.peak_flops == 2500e12
    assert float(gb.gpu.tensor_speedup("mxfp8")) == pytest.approx(2.0)
    assert not bool(comm.place_group(16, 4, gb.gpus_per_node).spans_nodes)  # CP 16 over TP 4: 64 GPUs
    assert bool(comm.place_group(16, 4, B200.gpus_per_node).spans_nodes)
    cfg = RunConfig(num_gpus=64, tp=4, cp=16, seq_len=131072, global_batch_size=1, precision="mxfp8")
    assert estimate(L8B, gb, cfg).step_time_s < estimate(L8B, B200, cfg).step_time_s
