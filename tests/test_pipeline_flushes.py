"""Gradient accumulation over separate runs of the pipeline schedule (``RunConfig.pipeline_flushes``): torchtitan
and NeMo AutoModel feed the schedule one local batch per step() call and accumulate over several, so each pass has
its own fill and drain and, under FSDP, its own gather and reduce-scatter; Megatron-Core runs every micro-batch of a
step in one schedule."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.errors import PlannerError
from planner.plan import config_from_dict, plan_dict
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model

H100 = load_cluster("h100-80gb-sxm")
L8 = load_model("llama-3.1-8b")
#: 32 micro-batches per pipeline over 4 stages, ZeRO-3 (torchtitan's FSDP2 with pipeline stages)
CFG = RunConfig(num_gpus=32, pp=4, vpp=2, schedule="interleaved-1f1b", global_batch_size=256, micro_batch_size=1,
                seq_len=4096, zero_stage=3, recompute="full", overlap_p2p_comm=False)


def test_a_step_of_f_passes_is_f_steps_of_its_local_batch_and_one_optimizer_step():
    """By hand: the step with f passes is f times the schedule and data-parallel time of one pass (the same layout
    at batch B / f, one pass) plus the one optimizer step."""
    for f in (2, 4, 8):
        whole, one = estimate(L8, H100, CFG.with_(pipeline_flushes=f)), estimate(
            L8, H100, CFG.with_(global_batch_size=CFG.global_batch_size // f))
        opt = one.breakdown["optimizer_s"]
        assert whole.step_time_s == pytest.approx(f * (one.step_time_s - opt) + opt, rel=1e-9)
        assert whole.breakdown["bubble_s"] == pytest.approx(f * one.breakdown["bubble_s"], rel=1e-9)
        assert whole.peak_memory_bytes <= estimate(L8, H100, CFG).peak_memory_bytes
    # more passes, more fills and drains: never faster
    times = [estimate(L8, H100, CFG.with_(pipeline_flushes=f)).step_time_s for f in (1, 2, 4, 8)]
    assert times == sorted(times) and times[-1] > times[0]


def test_flushes_need_stages_and_must_divide_the_micro_batches():
    assert not config_problems(L8, H100, CFG.with_(pipeline_flushes=4))
    assert config_problems(L8, H100, CFG.with_(pipeline_flushes=3))[0][0] == "pipeline-flushes"
    flat = RunConfig(num_gpus=8, global_batch_size=64, seq_len=4096, pipeline_flushes=2)
    assert config_problems(L8, H100, flat)[0][0] == "pipeline-flushes"


def test_exports_and_cli():
    from planner.export.megatron import arguments
    from planner.export.torchtitan import sections

    cfg = CFG.with_(pipeline_flushes=4)
    d = json.loads(json.dumps(plan_dict(L8, H100.name, cfg, estimate(L8, H100, cfg))))
    assert d["options"]["pipeline_flushes"] == 4 and config_from_dict(d).pipeline_flushes == 4
    # torchtitan: the local batch is one pass's micro-batches, and its gradient accumulation makes the rest
    assert sections(d)["training"]["local_batch_size"] == cfg.micro_batch_size * cfg.num_microbatches // 4
    with pytest.raises(PlannerError) as e:
        arguments(d)
    assert "pipeline flushes" in e.value.reason and "torchtitan" in e.value.fix
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "32",
                                 "--pp", "4", "--global-batch", "256", "--seq-len", "4096", "--pipeline-flushes", "4",
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["options"]["pipeline_flushes"] == 4
