"""Pipeline sends overlapped with compute in Megatron-Core's interleaved schedule (``overlap_p2p_comm``): priced as
what sticks out of the rank's chunk compute plus the interference of what hides, blocking elsewhere; the stacks
that run it, the bounds that stay below it and the exports that say it."""

from __future__ import annotations

import pytest

from planner.cost.data_parallel import exposed_s
from planner.cost.step import _groups_for, estimate, pipeline_send_s
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from planner.specs.stack import load_stack

GB200 = load_cluster("gb200-nvl72")
H100 = load_cluster("h100-80gb-sxm")
L405 = load_model("llama-3.1-405b")
#: Megatron-Bridge 26.06's Llama 3.1 405B MXFP8 layout on 256 GB200 (TP 4, PP 16, VPP 8: one layer per chunk, the
#: embedding and the loss each a chunk of their own, account_for_embedding / loss_in_pipeline_split)
MX = RunConfig(num_gpus=256, tp=4, pp=16, vpp=8, global_batch_size=1536, micro_batch_size=1, seq_len=8192,
               sequence_parallel=True, tp_comm_overlap=True, zero_stage=1, schedule="interleaved-1f1b",
               precision="mxfp8", fp8_param_gather=True, layers_per_stage=(0,) + (1,) * 126 + (0,))


def _send(cfg):
    groups = _groups_for(GB200, cfg.tp, cfg.cp, cfg.dp, cfg.pp, cfg.ep, cfg.expert_tp)
    return float(pipeline_send_s(L405, GB200, cfg, groups, cfg.pp))


def test_hidden_sends_cost_their_interference_share():
    """Every chunk's compute (mean of the rank's chunks) outlasts one 8,192-token boundary send of 67 MB over the
    NIC, so each of the 2 v sends per micro-batch costs the interference share of its time: the exposed pipeline
    communication is interference x what blocking sends cost, exactly."""
    on, off = estimate(L405, GB200, MX), estimate(L405, GB200, MX.with_(overlap_p2p_comm=False))
    send = _send(MX)
    m = MX.num_microbatches
    assert off.breakdown["pp_comm_s"] == pytest.approx(2 * MX.vpp * send * m, rel=1e-9)
    assert on.breakdown["pp_comm_s"] == pytest.approx(GB200.gpu.comm_overlap_interference * 2 * MX.vpp * send * m,
                                                      rel=1e-9)
    assert on.step_time_s < off.step_time_s
    # the compute itself is the same
    assert on.breakdown["compute_s"] == pytest.approx(off.breakdown["compute_s"], rel=1e-12)


def test_a_send_longer_than_its_window_sticks_out():
    """exposed_s: what the window cannot hold stays on the critical path, the hidden rest costs the interference."""
    assert exposed_s(3.0, 1.0, 0.2) == pytest.approx(2.0 + 0.2)
    assert exposed_s(1.0, 3.0, 0.2) == pytest.approx(0.2)


def test_blocking_where_the_schedule_or_the_stack_does_not_overlap():
    """Megatron-Core's 1F1B batches blocking sends (arguments.py turns overlap_p2p_comm off without virtual
    stages): the flag changes nothing there; the 2021 papers' stack, DeepSpeed's and torchtitan's send blocking."""
    one = MX.with_(vpp=1, schedule="1f1b", layers_per_stage=None, pp=16)
    assert estimate(L405, GB200, one).step_time_s == \
        estimate(L405, GB200, one.with_(overlap_p2p_comm=False)).step_time_s
    assert load_stack("megatron-core").overlap_p2p_comm
    for name in ("megatron-2021", "deepspeed", "torchtitan"):
        assert not load_stack(name).overlap_p2p_comm
        assert not load_stack(name).apply(MX).overlap_p2p_comm


def test_exports_say_when_sends_block():
    """Megatron-LM overlaps by default with virtual stages (--no-overlap-p2p-communication turns it off);
    Megatron-Bridge's CommOverlapConfig sets overlap_p2p_comm with virtual stages unless the user's config says
    otherwise."""
    from planner.export.megatron import arguments
    from planner.export.nemo import comm_overlap_kwargs
    from planner.plan import plan_dict

    for overlap in (True, False):
        cfg = MX.with_(overlap_p2p_comm=overlap)
        d = plan_dict(L405, GB200.name, cfg, estimate(L405, GB200, cfg))
        assert ("--no-overlap-p2p-communication" in arguments(d)) is (not overlap)
        assert comm_overlap_kwargs(d).get("overlap_p2p_comm", True) is overlap
        assert d["options"].get("overlap_p2p_comm", True) is overlap


def test_cli_estimate_flag(tmp_path):
    from typer.testing import CliRunner

    from planner.cli import app

    base = ["estimate", "--model", "llama-3.1-405b", "--cluster", "gb200-nvl72", "--gpus", "256", "--global-batch",
            "1536", "--seq-len", "8192", "--tp", "4", "--pp", "16", "--vpp", "8", "--schedule", "interleaved-1f1b",
            "--precision", "mxfp8", "--layers-per-stage", ",".join(map(str, MX.layers_per_stage)), "--json"]
    import json
    runner = CliRunner()
    on = json.loads(runner.invoke(app, base).stdout)
    off = json.loads(runner.invoke(app, base + ["--no-overlap-p2p-comm"]).stdout)
    assert off["options"]["overlap_p2p_comm"] is False and "overlap_p2p_comm" not in on["options"]
    assert on["estimate"]["step_time_s"] < off["estimate"]["step_time_s"]
