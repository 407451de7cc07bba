"""Pipelines over several GPU pools (issue 15 part 1): the pool file, the estimate rank by rank on each pool's
profile, the split by speed and memory, the search's branch and bound, the CLI and the exports."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost import comm
from planner.cost.pooled import pooled_estimate, rank_pools
from planner.cost.simulate import simulate_schedule
from planner.cost.step import estimate, pipeline_message_bytes
from planner.errors import PlannerError
from planner.plan import search_plans
from planner.schema import validate_plan_json
from planner.search.pooled import (partition_pooled, pooled_candidates, pooled_rates, balance_bound_s,
                                   search_pooled)
from planner.search.space import SearchSpace
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from planner.specs.pools import is_pooled_cluster, load_pooled_cluster, pooled_cluster_from_dict

L8B = load_model("llama-3.1-8b")
MIXED = "h100-a100-4+4-nodes"


def _pools(*pools, links=()):
    return pooled_cluster_from_dict({"name": "t", "pools": [{"name": n, "profile": p, "nodes": k} for n, p, k in pools],
                                     "links": list(links)})


def test_pool_file_and_its_errors():
    pc = load_pooled_cluster(MIXED)
    assert [p.name for p in pc.pools] == ["h100", "a100"] and pc.num_gpus == 64
    assert is_pooled_cluster(MIXED) and not is_pooled_cluster("h100-80gb-sxm")
    link = pc.link(1, 0)
    assert link.bandwidth_bytes_per_s == 25e9 and link.latency_s == pytest.approx(6e-6)
    # no link given: the slower of the two networks (the A100 profile's HDR NICs)
    bare = _pools(("fast", "h100-80gb-sxm", 1), ("slow", "a100-80gb-sxm", 1))
    assert bare.link(0, 1) == load_cluster("a100-80gb-sxm").inter_node
    for bad, field in (({"pools": []}, "pools"),
                       ({"pools": [{"name": "a", "profile": "h100-80gb-sxm", "nodes": 0}]}, "pools[0].nodes"),
                       ({"pools": [{"name": "a", "profile": "h100-80gb-sxm", "nodes": 1},
                                   {"name": "a", "profile": "a100-80gb-sxm", "nodes": 1}]}, "pools[1].name"),
                       ({"pools": [{"name": "a", "profile": "h100-80gb-sxm", "nodes": 1}],
                         "links": [{"pools": ["a", "b"], "bandwidth_gb_s": 1, "latency_us": 1, "efficiency": 1}]},
                        "links[0].pools")):
        with pytest.raises(PlannerError) as e:
            pooled_cluster_from_dict(bad, source="f.json")
        assert e.value.field == field


def test_identical_pools_are_the_homogeneous_cluster():
    """Two pools of the same profile joined by that profile's own network: every rank, the sends and the step are
    the homogeneous estimate's (stages of a whole node, so every send crosses the NIC either way)."""
    h100 = load_cluster("h100-80gb-sxm")
    pc = _pools(("a", "h100-80gb-sxm", 2), ("b", "h100-80gb-sxm", 2))
    for cfg in (RunConfig(num_gpus=32, tp=2, pp=4, global_batch_size=64, seq_len=4096, sequence_parallel=True),
                RunConfig(num_gpus=32, tp=1, pp=4, vpp=2, schedule="interleaved-1f1b", global_batch_size=64,
                          seq_len=4096)):
        pe, ref = pooled_estimate(L8B, pc, cfg), estimate(L8B, h100, cfg)
        assert pe.rank_pools == (0, 0, 1, 1)
        assert pe.estimate.step_time_s == pytest.approx(ref.step_time_s, rel=1e-12)
        assert pe.estimate.peak_memory_bytes == pytest.approx(ref.peak_memory_bytes, rel=1e-12)
        assert pe.estimate.tokens_per_s == pytest.approx(ref.tokens_per_s, rel=1e-12)


def test_the_link_between_pools_carries_the_boundary_sends():
    """The last H100 rank's forward send and the first A100 rank's backward send take the link: M / beta + alpha
    with M the rank's 1/t share of the boundary activation (4096 tokens x 4096 x 2 B / TP 2 = 16 MiB)."""
    slow = {"pools": ["h100", "a100"], "bandwidth_gb_s": 1, "latency_us": 100, "efficiency": 1.0}
    fast = dict(slow, bandwidth_gb_s=400, latency_us=1)
    cfg = RunConfig(num_gpus=32, tp=2, pp=4, global_batch_size=64, seq_len=4096, sequence_parallel=True)
    msg = float(pipeline_message_bytes(L8B, cfg))
    assert msg == 4096 * 4096 * 2 / 2
    ests = {}
    for name, link in (("slow", slow), ("fast", fast)):
        pc = _pools(("h100", "h100-80gb-sxm", 2), ("a100", "a100-80gb-sxm", 2), links=[link])
        ests[name] = pooled_estimate(L8B, pc, cfg)
        assert ests[name].boundary_send_s == pytest.approx(
            (0.0, msg / (link["bandwidth_gb_s"] * 1e9) + link["latency_us"] * 1e-6, 0.0, 0.0))
    assert ests["slow"].estimate.step_time_s > ests["fast"].estimate.step_time_s


def test_a_faster_pool_gets_more_layers_and_the_pipeline_matches_the_simulator():
    pc = load_pooled_cluster(MIXED)
    res = search_pooled(L8B, pc, 256, 4096, top=3)
    for plan in res.ranked:
        pe = plan.estimate
        per_pool = {q: 0 for q in set(pe.rank_pools)}
        for s, q in zip(pe.estimate.stages, pe.rank_pools):
            per_pool[q] += sum(s.layers)
        ranks = {q: pe.rank_pools.count(q) for q in per_pool}
        assert per_pool[0] / ranks[0] > 2 * per_pool[1] / ranks[1]  # an H100 rank holds over twice an A100 rank's
        assert pe.estimate.fits
        f, b, w = (list(x) for x in zip(*pe.rank_times_s))
        sim = simulate_schedule(plan.config.schedule, f, b, w, plan.config.num_microbatches, plan.config.vpp)
        if plan.config.schedule == "1f1b":
            assert pe.pipeline_s == pytest.approx(sim.total_s, rel=1e-9)
        else:  # interleaved: Narayanan's bubble (exact for equal stages) within 5% of the played schedule; with a
            # pool's ranks unequal it can fall just below it (0.13% here on 2026-12-05 with the causal attention
            # share; 0.05% before): the closed form is not a bound, so it is held within half a percent below
            assert 0.995 * sim.total_s <= pe.pipeline_s <= 1.05 * sim.total_s
    best = res.ranked[0].estimate
    times = [s.time_per_microbatch_s for s in best.estimate.stages]
    assert max(times) / min(times) < 1.1  # the split balances the pools' ranks


def test_pools_together_beat_each_pool_alone_and_the_even_split():
    """Metis (Um et al., USENIX ATC'24, abstract): heterogeneity-aware plans train 1.05-8.43x faster than plans
    that ignore the GPUs' differences. Here: the split by speed against Megatron's even split of the same layout,
    and the mixed cluster against each of its pools alone (their own best plans over the whole homogeneous
    space, the same request)."""
    pc = load_pooled_cluster(MIXED)
    best = search_pooled(L8B, pc, 256, 4096, top=0).ranked[0]
    t = best.estimate.estimate.step_time_s
    assert best.even_split_step_s is not None and 1.05 <= best.even_split_step_s / t <= 8.43
    for pool in pc.pools:
        alone = search_plans(L8B, pool.cluster, pool.num_gpus, 256, 4096, top_k=0, space=SearchSpace())
        assert alone.estimate.step_time_s > t


def test_branch_and_bound_is_exact_within_the_space():
    """Every candidate partitioned and estimated gives the same best plan as the bounded walk; the bound is below
    every candidate's pipeline time."""
    pc = _pools(("h100", "h100-80gb-sxm", 1), ("a100", "a100-80gb-sxm", 1))
    res = search_pooled(L8B, pc, 32, 2048, top=0)
    brute = []
    for cfg in pooled_candidates(L8B, pc, 32, 2048):
        bound = cfg.num_microbatches * balance_bound_s(pooled_rates(L8B, pc, cfg, False), L8B.num_layers)
        try:
            pe = partition_pooled(L8B, pc, cfg).estimate
        except PlannerError:
            continue
        assert bound <= pe.pipeline_s * (1 + 1e-9)
        brute.append(pe.estimate.step_time_s)
    assert res.evaluated <= res.candidates
    assert res.ranked[0].estimate.estimate.step_time_s == pytest.approx(min(brute), rel=1e-12)


def test_whole_stages_only():
    pc = _pools(("h100", "h100-80gb-sxm", 1), ("a100", "a100-80gb-sxm", 2))
    cfg = RunConfig(num_gpus=24, tp=1, pp=2, global_batch_size=48, seq_len=2048)  # stages of 12 GPUs
    with pytest.raises(PlannerError, match="whole stages"):
        pooled_estimate(L8B, pc, cfg)
    assert rank_pools(pc, RunConfig(num_gpus=24, tp=1, pp=3, global_batch_size=48, seq_len=2048)) == (0, 1, 1)


def test_cli_plan_json_explain_and_exports(tmp_path):
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", MIXED, "--gpus", "64",
                                 "--global-batch", "256", "--seq-len", "4096", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    validate_plan_json(d)
    assert d["pools"]["rank_pools"][0] == "h100" and d["pools"]["rank_pools"][-1] == "a100"
    assert [a["pool"] for a in d["pools"]["each_pool_alone"]] == ["h100", "a100"]
    plan = tmp_path / "p.json"
    plan.write_text(r.stdout)
    ex = CliRunner().invoke(app, ["explain", str(plan)])
    assert ex.exit_code == 0 and "re-estimated over the pools" in ex.output and "pools: h100" in ex.output
    mg = CliRunner().invoke(app, ["export", str(plan), "--to", "megatron"])
    assert mg.exit_code == 0 and "--pipeline-model-parallel-layout" in mg.stdout
    assert "ranks 0-31: pool h100" in mg.output
    tt = CliRunner().invoke(app, ["export", str(plan), "--to", "torchtitan"])
    assert tt.exit_code == 2 and "several GPU pools" in tt.output
    text = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", MIXED, "--gpus", "64",
                                    "--global-batch", "256", "--seq-len", "4096"])
    assert text.exit_code == 0 and "Pipeline ranks by pool" in text.output and "alone" in text.output
    wrong = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", MIXED, "--gpus", "32",
                                     "--global-batch", "256"])
    assert wrong.exit_code == 2 and "--gpus 64" in wrong.output
    refused = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", MIXED, "--gpus", "64",
                                       "--global-batch", "256", "--stack", "torchtitan"])
    assert refused.exit_code == 2 and "--stack" in refused.output


# ----- uneven data parallelism over pools (Metis) ------------------------------------------------------------
def test_replicas_of_identical_pools_are_the_homogeneous_cluster():
    """Two pools of one profile, the same micro-batches per replica: the homogeneous estimate of all replicas."""
    from planner.cost.pooled import replica_estimate

    h100 = load_cluster("h100-80gb-sxm")
    pc = _pools(("a", "h100-80gb-sxm", 2), ("b", "h100-80gb-sxm", 2))
    cfg = RunConfig(num_gpus=32, tp=2, pp=2, global_batch_size=64, seq_len=4096, sequence_parallel=True)
    got = replica_estimate(L8B, pc, cfg, (8, 8))  # 4 + 4 replicas of 4 GPUs, 8 micro-batches each: a batch of 64
    ref = estimate(L8B, h100, cfg)
    assert got.replicas == (4, 4)
    assert got.estimate.step_time_s == pytest.approx(ref.step_time_s, rel=1e-12)
    assert got.estimate.tokens_per_s == pytest.approx(ref.tokens_per_s, rel=1e-12)


def test_uneven_data_parallelism_gives_faster_pools_more_microbatches():
    from planner.cost.pooled import replica_estimate
    from planner.search.pooled import allocate_microbatches, replica_candidates, search_replicas

    pc = load_pooled_cluster(MIXED)
    best = search_replicas(L8B, pc, 256, 4096)
    reps, mbs = best.estimate.replicas, best.estimate.microbatches
    assert sum(r * m for r, m in zip(reps, mbs)) * best.config.micro_batch_size == 256
    assert mbs[0] > mbs[1]  # an H100 replica takes more micro-batches than an A100 one
    # the allocation is the best of every split of the batch over the two pools (brute force)
    total = 256 // best.config.micro_batch_size
    options = [replica_estimate(L8B, pc, best.config, (m, (total - reps[0] * m) // reps[1]))
               for m in range(1, total // reps[0]) if (total - reps[0] * m) % reps[1] == 0]
    fitting = [o.estimate.step_time_s for o in options if o.estimate.fits]
    assert best.estimate.estimate.step_time_s == pytest.approx(min(fitting), rel=1e-12)
    # the bound of the search is below every candidate's best allocation, and the search's best is the least
    small = _pools(("h100", "h100-80gb-sxm", 1), ("a100", "a100-80gb-sxm", 1))
    found = search_replicas(L8B, small, 32, 2048)
    times = [a.estimate.step_time_s for c in replica_candidates(L8B, small, 32, 2048)
             if (a := allocate_microbatches(L8B, small, c)) is not None]
    assert found.estimate.estimate.step_time_s == pytest.approx(min(times), rel=1e-12)


def test_a_slow_link_between_pools_slows_the_gradient_ring():
    """The data-parallel ring over every pool runs at its slowest hop (the link between the pools here)."""
    from planner.cost.pooled import replica_estimate, slowest_link

    cfg = RunConfig(num_gpus=32, tp=1, pp=1, global_batch_size=64, seq_len=2048)
    steps = []
    for gb_s in (1, 25):
        pc = _pools(("h100", "h100-80gb-sxm", 2), ("a100", "a100-80gb-sxm", 2),
                    links=[{"pools": ["h100", "a100"], "bandwidth_gb_s": gb_s, "latency_us": 6, "efficiency": 1.0}])
        assert slowest_link(pc).bandwidth_bytes_per_s == gb_s * 1e9
        steps.append(replica_estimate(L8B, pc, cfg, (3, 1)).estimate.step_time_s)
    assert steps[0] > 1.5 * steps[1]


def test_cli_reports_uneven_data_parallelism_and_exports_the_launchable_plan():
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", MIXED, "--gpus", "64",
                                 "--global-batch", "256", "--seq-len", "4096", "--json"])
    u = json.loads(r.stdout)["pools"]["uneven_data_parallel"]
    assert u["launchable"] is False and [p["name"] for p in u["pools"]] == ["h100", "a100"]
    assert sum(p["replicas"] * p["microbatches_per_replica"] for p in u["pools"]) * u["micro_batch_size"] == 256
