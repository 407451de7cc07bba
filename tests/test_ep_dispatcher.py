"""The MoE token dispatcher (``RunConfig.ep_dispatcher``): Megatron-Core's all-to-all dispatcher sends every token
copy, the flex dispatcher's DeepEP / HybridEP backends send a token across the network once per remote node
(planner.cost.moe.node_dedup_all_to_all_s, pinned by hand in tests/test_moe.py). Here: the step it changes, the stacks
and CLI that set it, the plan JSON that records it and the exports that say it or refuse it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.step import estimate
from planner.errors import PlannerError
from planner.plan import config_from_dict, plan_dict
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from planner.specs.stack import load_stack, shipped_stacks, stack_from_dict, stacks_dir

H100 = load_cluster("h100-80gb-sxm")
DSV3 = load_model("deepseek-v3")
MIXTRAL = load_model("mixtral-8x7b")
#: EP 32 over four H100 nodes: the all-to-alls cross the network
CROSS = RunConfig(num_gpus=256, pp=8, ep=32, global_batch_size=256, seq_len=4096, precision="fp8",
                  recompute_modules="layernorm,mla_up_proj,moe_act")


def test_dedup_shortens_only_cross_node_expert_parallelism():
    plain, dedup = estimate(DSV3, H100, CROSS), estimate(DSV3, H100, CROSS.with_(ep_dispatcher="deepep"))
    assert dedup.breakdown["ep_comm_s"] < 0.8 * plain.breakdown["ep_comm_s"]
    assert dedup.step_time_s < plain.step_time_s
    # DeepEP and HybridEP send the same bytes: one effect, priced once
    assert estimate(DSV3, H100, CROSS.with_(ep_dispatcher="hybridep")).step_time_s == pytest.approx(dedup.step_time_s)
    # EP inside one node: nothing to deduplicate
    inside = RunConfig(num_gpus=64, pp=2, ep=8, global_batch_size=64, seq_len=4096)
    assert estimate(MIXTRAL, H100, inside.with_(ep_dispatcher="deepep")).step_time_s == pytest.approx(
        estimate(MIXTRAL, H100, inside).step_time_s)


def test_stacks_default_to_the_all_to_all_dispatcher_and_refuse_unknown_ones(tmp_path):
    for name in shipped_stacks():
        assert load_stack(name).ep_dispatcher == "alltoall"
        assert load_stack(name).fixed_options()["ep_dispatcher"] == "alltoall"
    data = json.loads((stacks_dir() / "megatron-core.json").read_text())
    data["options"]["ep_dispatcher"] = "deepep"
    assert stack_from_dict(data, source="s.json").apply(CROSS).ep_dispatcher == "deepep"
    data["options"]["ep_dispatcher"] = "nccl"
    with pytest.raises(PlannerError) as e:
        stack_from_dict(data, source="s.json")
    assert e.value.field == "options.ep_dispatcher"


def test_plan_json_round_trip_and_exports():
    from planner.export.megatron import arguments
    from planner.export.nemo import overrides as recipe_overrides
    from planner.export.torchtitan import sections

    cfg = CROSS.with_(ep_dispatcher="hybridep")
    d = json.loads(json.dumps(plan_dict(DSV3, H100.name, cfg, estimate(DSV3, H100, cfg))))
    assert d["options"]["ep_dispatcher"] == "hybridep"
    assert config_from_dict(d).ep_dispatcher == "hybridep"
    args = arguments(d)
    i = args.index("--moe-token-dispatcher-type")
    assert args[i + 1] == "flex" and args[args.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    over = recipe_overrides(d)
    assert over["model.moe_token_dispatcher_type"] == "flex"
    assert over["model.moe_flex_dispatcher_backend"] == "hybridep"
    with pytest.raises(PlannerError) as e:
        sections(d)
    assert "dispatcher" in e.value.reason and "--ep-dispatcher alltoall" in e.value.fix
    plain = json.loads(json.dumps(plan_dict(DSV3, H100.name, CROSS, estimate(DSV3, H100, CROSS))))
    assert "ep_dispatcher" not in plain["options"]
    assert "--moe-flex-dispatcher-backend" not in arguments(plain)


def test_cli_estimate_and_plan_take_the_dispatcher():
    runner = CliRunner()
    base = ["estimate", "--model", "deepseek-v3", "--cluster", "h100-80gb-sxm", "--gpus", "256", "--global-batch",
            "256", "--seq-len", "4096", "--pp", "8", "--ep", "32", "--precision", "fp8", "--recompute-modules",
            "layernorm,mla_up_proj,moe_act", "--json"]
    plain = json.loads(runner.invoke(app, base).stdout)
    dedup = json.loads(runner.invoke(app, base + ["--ep-dispatcher", "deepep"]).stdout)
    assert dedup["options"]["ep_dispatcher"] == "deepep" and "ep_dispatcher" not in plain["options"]
    assert dedup["estimate"]["step_time_s"] < plain["estimate"]["step_time_s"]
    bad = runner.invoke(app, base + ["--ep-dispatcher", "nccl"])
    assert bad.exit_code != 0 and "--ep-dispatcher" in bad.output and "Traceback" not in bad.output
    out = runner.invoke(app, ["plan", "--model", "mixtral-8x7b", "--cluster", "h100-80gb-sxm", "--gpus", "64",
                              "--global-batch", "64", "--seq-len", "4096", "--ep-dispatcher", "deepep", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["options"]["ep_dispatcher"] == "deepep"
