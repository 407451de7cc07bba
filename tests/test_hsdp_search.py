"""HSDP as a searched dimension (issue 10): beside ZeRO over all of DP, every group holds rows whose ZeRO stages
shard within groups of DP ranks filling 1, 2, 4 or 8 whole nodes (``SearchSpace.hsdp_node_spans``) or the shard
sizes a user asks for (``--dp-shard``), replicated over the rest of DP, with the ZeRO stages the stack runs HSDP
with (megatron-core: the distributed optimizer's instances, ZeRO-1; torchtitan: FSDP2, ZeRO-1..3; DeepSpeed and
2021 Megatron: none). The search stays exact over the larger space (brute force below), and its pruning floors
per (ZeRO stage, HSDP variant) column never exceed a row's exact value."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.export import stack_spaces
from planner.search.bounds import (column_floors, column_memory_floors, group_floors, group_tables,
                                   refined_group_bounds, row_memory_bound, row_time_bound)
from planner.search.engine import search
from planner.search.space import Constraints, SearchSpace, build_space
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from planner.specs.stack import load_stack

RUNNER = CliRunner()
H100 = load_cluster("h100-80gb-sxm")
L8 = load_model("llama-3.1-8b")
#: Llama-3.1-8B as FSDP runs it on 32 H100 nodes: TP 1, no pipeline, ZeRO-3, batch 256 x 8192
FSDP_8B = (L8, H100, 256, 256, 8192)
FSDP_SPACE = Constraints(tp=(1,), pp=(1,), cp=(1,), micro_batch=(1,), zero=(1, 3),
                         recompute=("none", "full")).apply(SearchSpace(partial_recompute=False))


def _every_row(model, cluster, n, batch, seq, space):
    sp = build_space(model, cluster, n, batch, seq, space)
    rows = sp.expand(np.arange(len(sp.groups)))
    cfgs = [sp.config(int(g), int(z), int(r), int(h)) for g, z, r, h in zip(rows.group, rows.zero, rows.rec,
                                                                             rows.hsdp)]
    return sp, rows, cfgs


def test_the_shard_sizes_fill_whole_nodes_and_split_dp():
    sp, rows, cfgs = _every_row(*FSDP_8B, FSDP_SPACE)
    # 256 DP ranks of one GPU each: shard groups of 8, 16, 32 and 64 GPUs (1, 2, 4, 8 nodes of 8)
    assert sorted({c.dp_shard for c in cfgs if c.dp_shard}) == [8, 16, 32, 64]
    assert {c.zero_stage for c in cfgs if c.dp_shard} == {1, 3}
    assert len(rows) == len(sp.groups) * 2 * (2 + 4 * 2)  # recompute x (plain stages + 4 sizes x 2 stages)
    for c in cfgs:
        assert not config_problems(L8, H100, c), c


def test_moe_shard_sizes_split_the_expert_data_parallel_group():
    mixtral = load_model("mixtral-8x7b")
    sp, _, cfgs = _every_row(mixtral, H100, 128, 256, 4096,
                             Constraints(tp=(2,), pp=(1,), cp=(1,), micro_batch=(1,), zero=(3,),
                                         recompute=("full",)).apply(SearchSpace(partial_recompute=False)))
    hsdp = [c for c in cfgs if c.dp_shard]
    assert hsdp and {c.dp_shard for c in hsdp} <= {4, 8, 16, 32}
    for c in cfgs:  # validity's rule: the expert-DP group splits into the dp / dp_shard replicas
        assert not config_problems(mixtral, H100, c), c


def test_search_is_exact_over_hsdp_rows_and_picks_hsdp_where_it_wins():
    """Brute force over every row: the search returns the least step time. Under ZeRO-3 the shard groups of 8 nodes
    keep the per-layer gathers on fewer, nearer ranks, and the model ranks that first (0.799 s against 0.805 s for
    ZeRO-3 over all 256 ranks, computed here)."""
    model, cluster, n, batch, seq = FSDP_8B
    sp, rows, cfgs = _every_row(*FSDP_8B, FSDP_SPACE)
    times = [estimate(model, cluster, c, check=False) for c in cfgs]
    fitting = [(e.step_time_s, c) for e, c in zip(times, cfgs) if e.fits]
    best_t, best_c = min(fitting, key=lambda x: x[0])
    res = search(model, cluster, n, batch, seq, space=FSDP_SPACE, top=0, refine_partition=False)
    assert res.best.estimate.step_time_s == pytest.approx(best_t, rel=1e-12)
    assert res.stats["bound_violations"] == 0
    z3 = [(t, c) for t, c in fitting if c.zero_stage == 3]
    z3_best = min(z3, key=lambda x: x[0])
    z3_plain = min((x for x in z3 if x[1].dp_shard is None), key=lambda x: x[0])
    assert z3_best[1].dp_shard == 64 and z3_best[0] < z3_plain[0]
    only_z3 = Constraints(zero=(3,)).apply(FSDP_SPACE)
    got = search(model, cluster, n, batch, seq, space=only_z3, top=0, refine_partition=False).best
    assert got.config.dp_shard == 64 and got.estimate.step_time_s == pytest.approx(z3_best[0], rel=1e-12)


@pytest.mark.parametrize("case", ["dense", "moe"])
def test_column_floors_never_exceed_a_rows_bounds_or_exact_values(case):
    if case == "dense":
        model, cluster, n, batch, seq = FSDP_8B
        space = FSDP_SPACE
    else:
        model, cluster, n, batch, seq = load_model("mixtral-8x7b"), H100, 128, 256, 4096
        space = Constraints(pp=(1, 2), cp=(1,), micro_batch=(1,), schedules=("1f1b",),
                            recompute=("none", "full")).apply(SearchSpace(partial_recompute=False))
    sp = build_space(model, cluster, n, batch, seq, space)
    t = group_tables(model, cluster, sp)
    every = np.arange(len(sp.groups))
    pipe = refined_group_bounds(sp, t, every)
    coef, const, opt = group_floors(model, cluster, sp, t, every)
    n_cols = coef.shape[2]
    cols = column_floors(sp, pipe, coef, const, opt)
    mem_cols = column_memory_floors(sp, t, every, n_cols)
    rows = sp.expand(every)
    assert rows.hsdp.any()
    col = rows.column
    tb = row_time_bound(sp, t, rows, pipe[rows.group], (coef[rows.group], const[rows.group]))
    mb = row_memory_bound(sp, t, rows)
    assert np.all(cols[rows.group, col] <= tb * (1 + 1e-12))
    assert np.all(mem_cols[rows.group, col] <= mb * (1 + 1e-12))
    for i in range(0, len(rows), max(1, len(rows) // 60)):  # a spread of rows, exactly
        cfg = sp.config(int(rows.group[i]), int(rows.zero[i]), int(rows.rec[i]), int(rows.hsdp[i]))
        e = estimate(model, cluster, cfg, check=False)
        assert tb[i] <= e.step_time_s * (1 + 1e-9), cfg
        assert mb[i] <= e.peak_memory_bytes * (1 + 1e-9), cfg


def test_stacks_search_hsdp_only_as_they_run_it():
    def stages(name):
        return {z for s in stack_spaces(load_stack(name)) for z in s.hsdp_zero_stages}
    assert stages("megatron-core") == {1}  # --num-distributed-optimizer-instances: distributed optimizer copies
    assert stages("torchtitan") == {1, 2, 3}  # FSDP2 over a replicate x shard mesh
    assert stages("deepspeed") == set() and stages("megatron-2021") == set()
    model, cluster, n, batch, seq = FSDP_8B
    for space in stack_spaces(load_stack("deepspeed")):
        sp = build_space(model, cluster, n, batch, seq, space)
        assert not sp.hsdp_count().any()


def _plan(*extra):
    return RUNNER.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "256",
                               "--global-batch", "256", "--seq-len", "8192", "--tp", "1", "--pp", "1", "--cp", "1",
                               "--json", *extra])


def test_cli_dp_shard_constrains_the_search():
    out = _plan("--zero", "3", "--stack", "any", "--dp-shard", "32")
    assert out.exit_code == 0, out.output
    d = json.loads(out.output)
    assert d["parallelism"]["dp_shard"] == 32 and d["parallelism"]["zero_stage"] == 3
    out = _plan("--zero", "3", "--stack", "any", "--dp-shard", "none")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["parallelism"]["dp_shard"] is None
    out = _plan("--zero", "3", "--stack", "any")  # the default space holds both; HSDP wins here (above)
    assert json.loads(out.output)["parallelism"]["dp_shard"] == 64


@pytest.mark.parametrize("extra,needle", [
    (("--stack", "deepspeed", "--dp-shard", "8"), "runs no HSDP"),
    (("--dp-shard", "1"), "must be >= 2"),
    (("--dp-shard", "eight"), "not an integer"),
    (("--stack", "any", "--dp-shard", "3"), "--dp-shard"),  # 3 divides no DP degree of 256 GPUs
])
def test_cli_dp_shard_errors_name_the_option(extra, needle):
    out = _plan(*extra)
    assert out.exit_code != 0
    assert needle in out.output and "Traceback" not in out.output
