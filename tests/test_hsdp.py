"""HSDP (hybrid sharded data parallelism, issue 10): ZeRO shards model states within groups of ``dp_shard``
data-parallel ranks and replicates them across dp / dp_shard groups (Zhao et al. 2023, "PyTorch FSDP", Sec. 3.2.2;
torchtitan's data_parallel_shard x replicate degrees; Megatron's distributed-optimizer instances; DeepSpeed 0.19 has
none since it removed MiCS)."""

from __future__ import annotations

import json

import pytest

from planner.cost import comm
from planner.cost.data_parallel import dp_collectives, dp_groups, hsdp_groups
from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.errors import PlannerError
from planner.export import emit
from planner.plan import config_from_dict, plan_dict
from planner.schema import validate_plan_json
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from tests.test_export import check_torchtitan, config_only_plan, pairs

H100 = load_cluster("h100-80gb-sxm")
L70 = load_model("llama-3.1-70b")
BASE = RunConfig(num_gpus=1024, global_batch_size=1024, seq_len=8192, zero_stage=3, recompute="full")


def test_states_are_sharded_over_the_shard_group_only():
    plain, hsdp = estimate(L70, H100, BASE), estimate(L70, H100, BASE.with_(dp_shard=64))
    for state in ("weights", "gradients", "optimizer"):  # ZeRO-3: all three sharded over 16x fewer ranks
        assert hsdp.stages[0].memory_bytes[state] > plain.stages[0].memory_bytes[state]
    z1 = BASE.with_(zero_stage=1, recompute="full")
    assert estimate(L70, H100, z1.with_(dp_shard=64)).stages[0].memory_bytes["optimizer"] == pytest.approx(
        16 * estimate(L70, H100, z1).stages[0].memory_bytes["optimizer"])


def test_one_shard_group_is_plain_zero():
    """dp_shard = dp: no replicas, the same estimate as plain ZeRO."""
    a, b = estimate(L70, H100, BASE), estimate(L70, H100, BASE.with_(dp_shard=BASE.dp))
    assert a.step_time_s == pytest.approx(b.step_time_s) and a.peak_memory_bytes == b.peak_memory_bytes


def test_a_node_sized_shard_group_gathers_over_nvlink_and_all_reduces_across_nodes():
    """Shards of 8 DP ranks sit in one node (TP 1): each layer's gathers and reduce-scatters ride NVLink; the
    gradient shard is then all-reduced with the 128 replicas across nodes (counted in the reduce-scatter window)."""
    shard, expert = dp_groups(H100, 1, 1, 1024, 1, dp_shard=8)
    full, _ = dp_groups(H100, 1, 1, 1024, 1)
    assert not bool(shard.spans_nodes) and int(shard.size) == 8 and bool(full.spans_nodes)
    reps = hsdp_groups(H100, 1, 1, 1024, 1, dp_shard=8)
    assert int(reps[0].size) == 128 and bool(reps[0].spans_nodes)
    params = 70e9 / 80  # one layer's weights
    inside = dp_collectives(H100, shard, expert, params, 0.0, 2, 1.0)
    hybrid = dp_collectives(H100, shard, expert, params, 0.0, 2, 1.0, reps)
    across = dp_collectives(H100, full, expert, params, 0.0, 2, 1.0)
    assert hybrid.unit_all_gather_s == inside.unit_all_gather_s < across.unit_all_gather_s
    replica_ar = comm.all_reduce_s(H100, reps[0], params / 8 * 2)
    assert hybrid.unit_reduce_scatter_s == pytest.approx(inside.unit_reduce_scatter_s + replica_ar)


def test_rules():
    assert [p for p in config_problems(L70, H100, BASE.with_(dp_shard=100)) if p[0] == "dp_shard"]
    assert [p for p in config_problems(L70, H100, BASE.with_(dp_shard=8, zero_stage=0)) if p[0] == "dp_shard"]
    assert not config_problems(L70, H100, BASE.with_(dp_shard=8))
    mixtral = load_model("mixtral-8x7b")
    moe = RunConfig(num_gpus=64, ep=8, global_batch_size=64, seq_len=4096, zero_stage=1)
    assert not config_problems(mixtral, H100, moe.with_(dp_shard=16))  # expert DP 8 splits into 4 replicas
    assert [p for p in config_problems(mixtral, H100, moe.with_(dp_shard=4)) if p[0] == "dp_shard"]  # 8 into 16: no


def test_plan_json_round_trip_and_exports():
    cfg = BASE.with_(dp_shard=64)
    d = json.loads(json.dumps(plan_dict(L70, "h100-80gb-sxm", cfg, estimate(L70, H100, cfg))))
    validate_plan_json(d, "plan")
    assert d["parallelism"]["dp_shard"] == 64 and config_from_dict(d).dp_shard == 64
    plan = config_only_plan(model="llama-3.1-70b", num_gpus=1024, global_batch_size=1024, seq_len=8192,
                            zero_stage=3, dp_shard=64)
    par = check_torchtitan(plan)["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (16, 64)
    assert "data_parallel_replicate_degree=16" in emit(plan, "torchtitan-0.3")
    with pytest.raises(PlannerError, match="MiCS"):  # DeepSpeed 0.19's own config refuses mics_shard_size
        emit(plan, "deepspeed")
    z1 = config_only_plan(model="llama-3.1-70b", num_gpus=1024, tp=8, global_batch_size=1024, seq_len=8192,
                          zero_stage=1, dp_shard=32)
    from planner.export import megatron
    assert pairs(megatron.arguments(z1))["--num-distributed-optimizer-instances"] == "4"
    assert "'ddp.num_distributed_optimizer_instances': 4," in emit(z1, "nemo")
    with pytest.raises(PlannerError, match="MiCS"):
        emit(z1, "deepspeed")
