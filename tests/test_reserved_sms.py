"""SMs a stack's communication kernels hold through the step (``RunConfig.comm_reserved_sms``): DeepSeek-V3's DualPipe
keeps 20 of the H800's 132 for its all-to-all kernels (report Sec. 3.2.2 and 3.5.1, "which will limit the
computational throughput"). Every compute kernel then runs on the other SMs, and the overlapped all-to-alls cost
nothing beyond that reservation; 0 (the default) keeps the dynamic sharing the profile's interference prices."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost import comm
from planner.cost.compute import compute_sm_share
from planner.cost.step import end_costs, estimate, layer_costs
from planner.cost.validity import config_problems
from planner.errors import PlannerError
from planner.plan import config_from_dict
from planner.specs.config import RunConfig
from planner.specs.hardware import cluster_from_dict, load_cluster
from planner.specs.model import load_model

H800 = load_cluster("h800-80gb-sxm")
DSV3 = load_model("deepseek-v3")
#: DeepSeek-V3's report layout, smaller: the same degrees per layer on fewer pipeline stages
CFG = RunConfig(num_gpus=512, pp=4, ep=64, global_batch_size=2048, seq_len=4096, schedule="dualpipe",
                precision="fp8", ep_comm_overlap=True, ep_dispatcher="deepep")


def test_profiles_carry_the_sm_counts_of_their_sources():
    """NVIDIA's whitepapers (A100 108, H100 SXM5 132) and the DeepSeek-V3 report (H800: 132)."""
    assert H800.gpu.sm_count == 132
    assert load_cluster("h100-80gb-sxm").gpu.sm_count == 132
    assert load_cluster("a100-80gb-sxm").gpu.sm_count == 108
    assert compute_sm_share(H800.gpu, 20) == pytest.approx(112 / 132)
    assert compute_sm_share(H800.gpu, 0) == 1.0


def test_every_kernel_runs_on_the_remaining_sms_and_the_overlap_costs_nothing_more():
    groups = comm.groups_for(H800, CFG.tp, CFG.cp, CFG.dp, CFG.pp, CFG.ep, CFG.expert_tp)
    slow = 132 / 112
    for kind in DSV3.layer_kinds:
        free, held = (layer_costs(DSV3, H800, CFG.with_(comm_reserved_sms=r), groups, kind) for r in (0, 20))
        if kind.moe:
            # the pass times are the shared-SM ones over the share; the paired all-to-alls leave only what
            # sticks out of the (slower) compute, no interference: none here, the transfers hide
            assert float(held.fwd_s + held.bwd_input_s + held.bwd_weight_s) > \
                slow * 0.99 * float(free.fwd_s + free.bwd_input_s + free.bwd_weight_s)
            assert float(free.ep_fwd_s) > 0 and float(held.ep_fwd_s) == 0.0
        else:
            assert float(held.fwd_s) == pytest.approx(slow * float(free.fwd_s))
            assert float(held.bwd_input_s) == pytest.approx(slow * float(free.bwd_input_s))
    ends = [end_costs(DSV3, H800, CFG.with_(comm_reserved_sms=r), groups) for r in (0, 20)]
    assert float(ends[1].emb_fwd_s) == pytest.approx(slow * float(ends[0].emb_fwd_s))


def test_a_reservation_slows_the_step_and_zero_changes_nothing():
    base = estimate(DSV3, H800, CFG)
    assert estimate(DSV3, H800, CFG.with_(comm_reserved_sms=0)).step_time_s == base.step_time_s
    assert estimate(DSV3, H800, CFG.with_(comm_reserved_sms=20)).step_time_s > base.step_time_s


def test_a_reservation_the_profile_cannot_price_is_refused():
    b200 = load_cluster("b200-180gb")  # no SM count in its profile: nothing to divide
    problems = dict(config_problems(DSV3, b200, CFG.with_(comm_reserved_sms=20)))
    assert "comm_reserved_sms" in problems and "gpu.sm_count" in problems["comm_reserved_sms"]
    problems = dict(config_problems(DSV3, H800, CFG.with_(comm_reserved_sms=132)))
    assert "leave none" in problems["comm_reserved_sms"]
    assert "comm_reserved_sms" not in dict(config_problems(DSV3, H800, CFG.with_(comm_reserved_sms=20)))


def test_a_profile_sm_count_must_be_a_whole_number():
    from planner.specs.hardware import _profile_path
    from planner.specs.model import read_json_file

    data = read_json_file(_profile_path("h800-80gb-sxm"), "hardware profile")
    data["gpu"]["sm_count"] = -1
    with pytest.raises(PlannerError) as e:
        cluster_from_dict(data, source="p.json")
    assert e.value.field == "gpu.sm_count"


RUN = ["estimate", "--model", "deepseek-v3", "--cluster", "h800-80gb-sxm", "--gpus", "512", "--global-batch", "2048",
       "--seq-len", "4096", "--pp", "4", "--ep", "64", "--schedule", "dualpipe", "--precision", "fp8",
       "--ep-comm-overlap", "--ep-dispatcher", "deepep"]


def test_the_cli_takes_it_records_it_and_refuses_a_bad_value():
    runner = CliRunner()
    out = runner.invoke(app, RUN + ["--comm-reserved-sms", "20", "--json"])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)  # stderr warns that Megatron-Core runs no DualPipe (DeepSeek's own framework does)
    assert plan["options"]["comm_reserved_sms"] == 20
    assert config_from_dict(plan).comm_reserved_sms == 20
    default = json.loads(runner.invoke(app, RUN + ["--json"]).stdout)
    assert "comm_reserved_sms" not in default["options"]
    assert plan["estimate"]["step_time_s"] > default["estimate"]["step_time_s"]
    bad = runner.invoke(app, RUN + ["--comm-reserved-sms", "-1"])
    assert bad.exit_code != 0 and "--comm-reserved-sms" in bad.output and "Traceback" not in bad.output
    refused = runner.invoke(app, RUN[:4] + ["b200-180gb"] + RUN[5:] + ["--comm-reserved-sms", "20"])
    assert refused.exit_code != 0 and "sm_count" in refused.output


def test_plan_refuses_a_reservation_it_cannot_price_before_searching():
    out = CliRunner().invoke(app, ["plan", "--model", "mixtral-8x7b", "--cluster", "b200-180gb", "--gpus", "64",
                                   "--global-batch", "512", "--seq-len", "4096", "--comm-reserved-sms", "20"])
    assert out.exit_code != 0 and "--comm-reserved-sms" in out.output and "gpu.sm_count" in out.output
    planned = CliRunner().invoke(app, ["plan", "--model", "mixtral-8x7b", "--cluster", "h100-80gb-sxm", "--gpus", "64",
                                       "--global-batch", "512", "--seq-len", "4096", "--comm-reserved-sms", "20",
                                       "--json"])
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["options"]["comm_reserved_sms"] == 20
