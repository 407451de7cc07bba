"""Batch-level overlap of the MoE all-to-alls (Megatron-Core --overlap-moe-expert-parallel-comm; DualPipe's F&B):
one micro-batch's dispatch / combine hidden under another's kernels of the layer."""

import numpy as np
import pytest

from planner.cost import comm
from planner.cost.data_parallel import exposed_s
from planner.cost.moe import ep_layer_cost
from planner.cost.step import estimate, layer_costs
from planner.errors import PlannerError
from planner.export import export
from planner.plan import config_from_dict, plan_dict
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import MOE_LAYER, load_model
from planner.validation.compare import evaluate_modern_run, load_modern_runs

H800 = load_cluster("h800-80gb-sxm")
DSV3 = load_model("deepseek-v3")
CFG = RunConfig(num_gpus=2048, pp=16, vpp=2, ep=64, seq_len=4096, global_batch_size=16384, micro_batch_size=1,
                sequence_parallel=False, schedule="interleaved-1f1b", precision="fp8",
                layers_per_stage=(1,) + (2,) * 29 + (1, 1))


def test_overlapped_all_to_alls_are_what_sticks_out_of_the_layers_kernels():
    groups = comm.groups_for(H800, 1, 1, CFG.dp, 16, 64)
    plain = layer_costs(DSV3, H800, CFG, groups, MOE_LAYER)
    both = layer_costs(DSV3, H800, CFG.with_(ep_comm_overlap=True), groups, MOE_LAYER)
    a2a = ep_layer_cost(DSV3, H800, CFG, groups.ep, groups.tp).fwd_s
    assert plain.ep_fwd_s == pytest.approx(a2a)
    kernels = plain.fwd_s + plain.bwd_input_s + plain.bwd_weight_s
    assert both.ep_fwd_s == pytest.approx(exposed_s(2 * a2a, kernels, H800.gpu.comm_overlap_interference) / 2)
    assert both.ep_fwd_s < plain.ep_fwd_s
    # kernels and memory are untouched
    assert both.fwd_s == plain.fwd_s and both.act_bytes == plain.act_bytes
    faster = estimate(DSV3, H800, CFG.with_(ep_comm_overlap=True))
    assert faster.step_time_s < estimate(DSV3, H800, CFG).step_time_s
    assert faster.breakdown["ep_comm_s"] < estimate(DSV3, H800, CFG).breakdown["ep_comm_s"]


@pytest.mark.parametrize("change,match", [
    (dict(vpp=1, schedule="1f1b", layers_per_stage=(3,) + (4,) * 14 + (2,)), "virtual"),
    (dict(recompute="full"), "full recomputation"),
    (dict(ep=1), "expert parallelism"),
])
def test_megatron_cores_rules(change, match):
    with pytest.raises(PlannerError, match=match):
        estimate(DSV3, H800, CFG.with_(ep_comm_overlap=True, **change))


def test_plan_json_and_exports():
    cfg = CFG.with_(ep_comm_overlap=True)
    plan = plan_dict(DSV3, "h800-80gb-sxm", cfg, estimate(DSV3, H800, cfg))
    assert plan["options"]["ep_comm_overlap"] is True and config_from_dict(plan).ep_comm_overlap
    args = " ".join(export(plan, "megatron").text.split())
    assert "--overlap-moe-expert-parallel-comm --delay-wgrad-compute" in args
    mixtral, h100 = load_model("mixtral-8x7b"), load_cluster("h100-80gb-sxm")
    small = RunConfig(num_gpus=64, ep=8, seq_len=4096, global_batch_size=256, sequence_parallel=False,
                      ep_comm_overlap=True)
    nemo_plan = plan_dict(mixtral, "h100-80gb-sxm", small, estimate(mixtral, h100, small))
    from planner.export import nemo
    assert nemo.comm_overlap_kwargs(nemo_plan) == {"tp_comm_overlap": False, "overlap_moe_expert_parallel_comm": True,
                                                   "delay_wgrad_compute": True}
    assert "'overlap_moe_expert_parallel_comm': True" in export(nemo_plan, "nemo").text
    for refusing in ("torchtitan", "deepspeed"):
        with pytest.raises(PlannerError, match="all-to-alls"):
            export(nemo_plan, refusing)


def test_the_recipes_overlap_explains_the_deepseek_b200_row():
    """Megatron-Bridge 26.04.01, DeepSeek-V3 on 256 B200 (PP 8, VP 2, EP 32, mxfp8): its recipe overlaps the all-to-
    alls (overlap_moe_expert_parallel_comm, perf_recipes/deepseek/b200/deepseek_v3.py @ 067f987d). Without the
    overlap the model was 31% slow on it; with it, within 15%."""
    run = next(r for r in load_modern_runs() if r["id"] == "MB260401-B200-DeepSeekV3-mxfp8")
    assert run["layout"]["ep_comm_overlap"] is True
    assert abs(evaluate_modern_run(run).error) < 0.15
    off = {**run, "layout": {**run["layout"], "ep_comm_overlap": False}}
    assert evaluate_modern_run(off).error < -0.25


def test_searched_where_it_can_run_and_only_by_stacks_that_run_it():
    from planner.cost.schedule import SCHEDULES
    from planner.export.spaces import launcher_spaces, stack_spaces
    from planner.search.engine import search
    from planner.search.space import GROUP_COLS, SearchSpace, build_space
    from planner.specs.stack import load_stack

    assert all(s.ep_comm_overlap == (False,) for t in ("torchtitan", "deepspeed") for s in launcher_spaces(t))
    assert any(True in s.ep_comm_overlap for s in stack_spaces(load_stack("megatron-core")))
    assert all(s.ep_comm_overlap == (False,) for s in stack_spaces(load_stack("megatron-2021")))
    mixtral, h100 = load_model("mixtral-8x7b"), load_cluster("h100-80gb-sxm")
    sp = build_space(mixtral, h100, 32, 64, 4096)
    g = sp.groups
    cols = {name: i for i, name in enumerate(GROUP_COLS)}
    on = g[:, cols["epo"]] == 1
    assert on.any()
    assert (g[on, cols["ep"]] > 1).all()  # only with expert parallelism
    # with PP it needs virtual stages (Megatron-Core), or a schedule that pairs micro-batches itself (DualPipe)
    pairs = np.array([SCHEDULES[name].pairs_microbatches for name in sp.schedules])[g[:, cols["sched"]]]
    assert not ((g[:, cols["pp"]] > 1) & (g[:, cols["vpp"]] == 1) & on & ~pairs).any()
    assert ((g[:, cols["pp"]] > 1) & (g[:, cols["vpp"]] == 1) & on & pairs).any()
    best = search(mixtral, h100, 32, 64, 4096, top=1).best.config
    off = search(mixtral, h100, 32, 64, 4096, top=1, space=SearchSpace(ep_comm_overlap=(False,))).best
    assert estimate(mixtral, h100, best).step_time_s <= off.estimate.step_time_s
