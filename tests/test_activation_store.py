"""The SwiGLU fp8 input store (Megatron-Core ``activation_func_fp8_input_store``; the DeepSeek-V3 report's SwiGLU
inputs cached in FP8, Sec. 3.3.3): the activation bytes it saves and the casts it adds, counted by hand; who runs it
and who refuses it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.compute import layer_ops
from planner.cost.memory import activation_bytes_per_layer, offloaded_bytes_per_layer
from planner.cost.step import estimate
from planner.errors import PlannerError
from planner.export import emit
from planner.plan import config_from_dict, plan_dict
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import DENSE_LAYER, load_model

runner = CliRunner()
LLAMA = load_model("llama-3.1-8b")  # SwiGLU, f = 14336
H100 = load_cluster("h100-80gb-sxm")
BASE = RunConfig(num_gpus=8, tp=2, global_batch_size=16, micro_batch_size=1, seq_len=4096, recompute="none",
                 sequence_parallel=True)


def test_the_store_halves_the_swiglu_input_kept_for_backward():
    """Per token the SwiGLU keeps its two f-wide halves, 2 x 2 B, or their e4m3 copy, 2 x 1 B: the layer's
    activations shrink by 2 f / tp bytes per token, nothing else moves. Llama 3.1 8B at TP 2, 4,096 tokens:
    4096 x 2 x 14336 / 2 = 58,720,256 bytes."""
    off = float(activation_bytes_per_layer(LLAMA, BASE))
    on = float(activation_bytes_per_layer(LLAMA, BASE.with_(activation_fp8_input_store=True)))
    assert off - on == 4096 * 2 * 14336 / 2 == 58_720_256


def test_the_casts_cost_three_bytes_per_element_each_way():
    """Forward reads the 2f-wide bf16 input and writes its fp8 copy, backward the reverse: 3 B per element, 2f
    elements per token on this TP rank, a backward of the forward's bytes."""
    ops = {o.name: o for o in layer_ops(LLAMA, BASE.with_(activation_fp8_input_store=True), DENSE_LAYER)}
    cast = ops["mlp_act_fp8_store"]
    assert float(cast.hbm_bytes) == 4096 * 2 * 14336 / 2 * 3
    assert cast.bwd_ratio == 1.0 and cast.recompute_module == "mlp"
    assert "mlp_act_fp8_store" not in {o.name for o in layer_ops(LLAMA, BASE, DENSE_LAYER)}


def test_the_store_trades_a_little_time_for_memory():
    """The casts move 3 x 2f / tp bytes per token each way, about a tenth of the forward GEMMs' time at H100's
    memory-bound rate and half that of the backward's: 2.3% of Llama 3.1 8B's step at TP 2 in bf16."""
    off, on = estimate(LLAMA, H100, BASE), estimate(LLAMA, H100, BASE.with_(activation_fp8_input_store=True))
    assert on.peak_memory_bytes < off.peak_memory_bytes
    assert off.step_time_s * 1.01 < on.step_time_s < off.step_time_s * 1.04


def test_offloaded_moe_activations_are_the_stored_copy():
    """moe_act offloading sends what the layer keeps for the activation: the fp8 copy under the store."""
    moe = load_model("mixtral-8x7b")
    cfg = RunConfig(num_gpus=8, ep=8, global_batch_size=8, seq_len=4096, recompute="none", offload_modules="moe_act")
    kind = moe.layer_kinds[-1]
    off = float(offloaded_bytes_per_layer(moe, cfg, kind))
    on = float(offloaded_bytes_per_layer(moe, cfg.with_(activation_fp8_input_store=True), kind))
    assert on == off / 2 == 4096 * 2 * 14336 * 2 * 1


def test_plan_json_keeps_it_and_the_exports_set_or_refuse_it():
    cfg = BASE.with_(activation_fp8_input_store=True)
    d = json.loads(json.dumps(plan_dict(LLAMA, H100.name, cfg, estimate(LLAMA, H100, cfg))))
    assert d["options"]["activation_fp8_input_store"] is True
    assert config_from_dict(d).activation_fp8_input_store is True
    assert "'model.activation_func_fp8_input_store': True" in emit(d, "nemo")
    for target, what in (("megatron", "no Megatron-LM command-line flag"), ("torchtitan", "SwiGLU inputs kept in fp8"),
                         ("deepspeed", "SwiGLU inputs kept in fp8")):
        with pytest.raises(PlannerError, match=what):
            emit(d, target)


def test_the_cli_refuses_it_where_megatron_core_does_or_the_stack_cannot():
    base = ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--tp", "2",
            "--global-batch", "16", "--seq-len", "4096"]
    assert runner.invoke(app, base + ["--activation-fp8-input-store"]).exit_code == 0
    r = runner.invoke(app, base + ["--activation-fp8-input-store", "--stack", "torchtitan"])
    assert r.exit_code == 2 and "stack torchtitan keeps the SwiGLU inputs in bf16" in r.output
    gelu = ["estimate", "--model", "gpt3-175b", "--cluster", "a100-80gb-sxm", "--gpus", "8", "--tp", "8",
            "--global-batch", "8", "--seq-len", "2048", "--activation-fp8-input-store", "--json"]
    r = runner.invoke(app, gelu)
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["source"] == "--activation-fp8-input-store"


def test_plan_without_emit_searches_what_megatron_bridge_runs():
    """The megatron-core stack's launcher is Megatron-LM, which has no flag for the store: a plan that asks for it
    is searched and written for Megatron-Bridge instead of being refused."""
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16",
                            "--global-batch", "128", "--seq-len", "8192", "--activation-fp8-input-store", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["options"]["activation_fp8_input_store"] is True
