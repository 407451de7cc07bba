"""The torchtitan 0.3 exporter (``--emit torchtitan-0.3``): a Python module whose function returns a Trainer.Config
(torchtitan's --module / --config). torchtitan 0.3's own code reads these in conformance_tt03/ (.ci/run); here the
module's source and the refusals are checked without torchtitan."""

from __future__ import annotations

import ast

import pytest

from planner.errors import PlannerError
from planner.export import emit, export
from tests.test_export import config_only_plan


def _function(text: str) -> ast.FunctionDef:
    tree = ast.parse(text)  # valid Python
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert fn.name == "planner_plan"
    return fn


def _parallelism(fn: ast.FunctionDef) -> dict:
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ParallelismConfig":
            return {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    raise AssertionError("no ParallelismConfig")


def test_llama_405b_pipeline_with_uneven_stages():
    plan = config_only_plan(model="llama-3.1-405b", num_gpus=2048, tp=8, pp=16, global_batch_size=1024, seq_len=8192,
                            layers_per_stage=(7,) + (8,) * 14 + (7,), sequence_parallel=True, tp_comm_overlap=True)
    text = emit(plan, "torchtitan-0.3")
    fn = _function(text)
    par = _parallelism(fn)
    assert par["tensor_parallel_degree"] == 8 and par["pipeline_parallel_degree"] == 16
    parts = par["module_fqns_per_model_part"]
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [7] + [8] * 14 + [7]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    assert "model_registry('405B')" in text and "llama3_70b()" in text  # 405B's shipped function needs float8
    assert "enable_async_tensor_parallel=True" in text and "disable_cuda_graphs = True" in text


def test_moe_expert_parallel_borrows_from_fsdp_and_tp():
    plan = config_only_plan(model="deepseek-v3", num_gpus=256, tp=2, pp=4, ep=32, etp=1, global_batch_size=256,
                            seq_len=4096, sequence_parallel=True)
    par = _parallelism(_function(emit(plan, "torchtitan-0.3")))
    assert par["expert_parallel_degree"] == 32 and par["data_parallel_shard_degree"] == 32
    with pytest.raises(PlannerError, match="expert TP"):
        emit(config_only_plan(model="deepseek-v3", num_gpus=256, tp=2, pp=4, ep=32, global_batch_size=256,
                              seq_len=4096, sequence_parallel=True), "torchtitan-0.3")


@pytest.mark.parametrize("change,match", [
    (dict(model="gpt3-175b"), "ships configurations"),
    (dict(cp=2, cp_kind="ulysses", seq_len=16384), "ulysses"),
    (dict(pp=4, schedule="zb-h2"), "zb-h2"),
    (dict(recompute="full", recompute_num_layers=2, pp=2), "full recomputation"),
    (dict(precision="fp16"), "fp16"),
    (dict(recompute="selective", recompute_modules="mlp"), "selective"),
])
def test_refusals_name_the_reason(change, match):
    spec = dict(model="llama-3.1-8b", num_gpus=32, global_batch_size=64)
    spec.update(change)
    with pytest.raises(PlannerError, match=match):
        emit(config_only_plan(**spec), "torchtitan-0.3")


def test_fp8_converter_and_notes():
    out = export(config_only_plan(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, precision="fp8"),
                 "torchtitan-0.3")
    assert "Float8LinearConverter.Config(filter_fqns=['lm_head']" in out.text and out.suffix == ".py"
    assert any("torchao" in n for n in out.notes)
