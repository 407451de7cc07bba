"""The search against brute force: same optimum, bounds never above the exact values, infeasible requests explained."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.errors import InfeasibleError, PlannerError
from planner.search.bounds import (group_floors, group_memory_bound, group_tables, group_time_bound,
                                   rank_times, refined_group_bounds, row_memory_bound, row_time_bound)
from planner.search.engine import memory_limit_bytes, search
from planner.search.space import SearchSpace, build_space
from planner.specs.config import RunConfig
from planner.specs.hardware import GIB, load_cluster
from planner.specs.model import ModelSpec, load_model

H100 = load_cluster("h100-80gb-sxm")
A100 = load_cluster("a100-80gb-sxm")


def small_gpt(layers: int = 8, hidden: int = 2048, heads: int = 16, vocab: int = 51200) -> ModelSpec:
    return ModelSpec(name=f"gpt-{layers}x{hidden}", model_type="gpt2", hidden_size=hidden, ffn_hidden_size=4 * hidden,
                     num_layers=layers, num_heads=heads, num_kv_heads=heads, vocab_size=vocab, max_seq_len=4096,
                     tied_embeddings=True, gated_mlp=False, norm="layernorm", learned_positions=True,
                     linear_bias=True, dropout=True)


_BRUTE: dict = {}


def brute_force(model, cluster, n, batch, seq, space=SearchSpace(), limit=None):
    """Every configuration of the space, evaluated exactly: [(time, memory, cfg, time bound, memory bound)]."""
    limit = memory_limit_bytes(cluster) if limit is None else limit
    key = (model, cluster, n, batch, seq, space)
    if key in _BRUTE:
        return _BRUTE[key][:3] + (limit,)
    sp = build_space(model, cluster, n, batch, seq, space)
    tables = group_tables(model, cluster, sp)
    rows = sp.expand(np.arange(len(sp.groups)))
    every = np.arange(len(sp.groups))
    refined = refined_group_bounds(sp, tables, every)
    coef, coll, _ = group_floors(model, cluster, sp, tables, every)
    tb = row_time_bound(sp, tables, rows, refined[rows.group], (coef[rows.group], coll[rows.group]))
    mb = row_memory_bound(sp, tables, rows)
    out = []
    for i in range(len(rows)):
        cfg = sp.config(int(rows.group[i]), int(rows.zero[i]), int(rows.rec[i]),
                        int(rows.hsdp[i]) if rows.hsdp is not None else 0)
        assert not config_problems(model, cluster, cfg), cfg  # the space holds only valid configurations
        e = estimate(model, cluster, cfg, check=False)
        out.append((e.step_time_s, e.peak_memory_bytes, cfg, tb[i], mb[i]))
    _BRUTE[key] = (out, sp, tables, limit)
    return _BRUTE[key]


#: (model, cluster, GPUs, global batch, sequence, space): the small case searches the whole default space; the
#: medium ones narrow it so that brute force stays within a few seconds on two cores
CASES = [
    (small_gpt(layers=4, hidden=1024, heads=8), A100, 4, 8, 2048, SearchSpace()),
    (small_gpt(layers=12, hidden=1024, heads=8), H100, 16, 16, 4096,
     SearchSpace(partial_recompute=False, schedules=("1f1b", "interleaved-1f1b", "zb-h1"))),
    (load_model("llama-3.1-8b"), H100, 8, 8, 4096,
     SearchSpace(schedules=("1f1b", "interleaved-1f1b", "bfs"), cp_kinds=("ring",), partial_recompute=False)),
    (load_model("mixtral-8x7b"), H100, 16, 32, 4096,
     SearchSpace(schedules=("1f1b",), cp_kinds=("ring",), partial_recompute=False, zero_stages=(1, 3))),
]
IDS = ["gpt-4L-4gpu-full-space", "gpt-12L-16gpu", "llama-8b-8gpu", "mixtral-16gpu"]
#: every runtime option with both of its values (the default space keeps the best value of each alone)
ALL_OPTIONS = dict(flash_attention=(True, False), tp_comm_overlap=(True, False), overlap_grad_reduce=(True, False),
                   overlap_param_gather=(True, False), grad_reduce_bytes=(2, 4))
CASES.append((small_gpt(layers=4, hidden=1024, heads=8), H100, 4, 8, 2048,
              SearchSpace(partial_recompute=False, schedules=("1f1b", "zb-h1"), zero_stages=(0, 3),
                          recompute_modes=("none", "full"), **ALL_OPTIONS)))
IDS.append("gpt-4L-4gpu-every-option")
#: 13 layers: virtual pipelines whose end chunks are a layer short (SearchSpace.uneven_chunks), with partial full
#: recomputation, whose memory bound must hold for chunks of either size
CASES.append((small_gpt(layers=13, hidden=1024, heads=8), H100, 8, 16, 2048,
              SearchSpace(schedules=("interleaved-1f1b", "zbv", "bfs"), cp_kinds=("ring",), zero_stages=(1, 3))))
IDS.append("gpt-13L-8gpu-uneven-chunks")
#: interleaved pipelines over two nodes with blocking sends (a stack without overlap_p2p_comm): the other branch of
#: the pipeline-send bounds
CASES.append((small_gpt(layers=12, hidden=1024, heads=8), H100, 16, 16, 4096,
              SearchSpace(partial_recompute=False, schedules=("interleaved-1f1b",), overlap_p2p_comm=False)))
IDS.append("gpt-12L-16gpu-blocking-sends")
#: MoE over two nodes with both dispatchers searched: DeepEP's per-node deduplicated dispatch where an EP group spans
#: nodes (a column of the layer key), the all-to-all alone inside a node; the experts' SwiGLU inputs kept in fp8
#: (activation bytes and casts the bounds' tables share), and routing 25% over balance on the busiest EP rank
CASES.append((load_model("mixtral-8x7b"), H100, 16, 32, 4096,
              SearchSpace(schedules=("1f1b",), cp_kinds=("ring",), partial_recompute=False, zero_stages=(1,),
                          ep_dispatchers=("alltoall", "deepep"), activation_fp8_input_store=True,
                          moe_load_factor=1.25)))
IDS.append("mixtral-16gpu-two-dispatchers")


#: fp8 with bf16 weights and Transformer Engine's quantized copies beside them (held below ZeRO-3, not under it):
#: the memory bound's per-ZeRO-stage weight bytes; bf16 Adam moments (the optimizer's states and step)
CASES.append((small_gpt(layers=12, hidden=1024, heads=8), H100, 8, 16, 4096,
              SearchSpace(schedules=("1f1b", "interleaved-1f1b"), cp_kinds=("ring",), zero_stages=(0, 1, 3),
                          precision="fp8", fp8_param_gather=False, adam_moment_bytes=2)))
IDS.append("gpt-12L-8gpu-fp8-weight-copies")


def test_the_uneven_case_holds_uneven_virtual_chunks():
    rows, *_ = brute_force(*CASES[IDS.index("gpt-13L-8gpu-uneven-chunks")])
    assert any(cfg.vpp > 1 and 13 % (cfg.pp * cfg.vpp) for _, _, cfg, _, _ in rows)


@pytest.mark.parametrize("model,cluster,n,batch,seq,space", CASES, ids=IDS)
def test_bounds_never_exceed_the_exact_estimate(model, cluster, n, batch, seq, space):
    rows, sp, tables, _ = brute_force(model, cluster, n, batch, seq, space)
    assert len(rows) > 1000
    for t, mem, cfg, tb, mb in rows:
        assert tb <= t * (1 + 1e-9), cfg
        assert mb <= mem * (1 + 1e-9), cfg
    # group bounds are below every member's bound
    g_time, g_mem = group_time_bound(sp, tables), group_memory_bound(sp, tables)
    all_rows = sp.expand(np.arange(len(sp.groups)))
    assert np.all(g_time[all_rows.group] <= row_time_bound(sp, tables, all_rows) * (1 + 1e-12))
    assert np.all(g_mem[all_rows.group] <= row_memory_bound(sp, tables, all_rows) * (1 + 1e-12))
    # and they are useful: for the fastest tenth of the space, the time bound is typically within 10% of the
    # exact time (what is left out: pipeline imbalance, point-to-point, data-parallel communication)
    by_time = sorted(rows, key=lambda r: r[0])[:max(1, len(rows) // 10)]
    assert np.median([tb / t for t, _, _, tb, _ in by_time]) > 0.9


@pytest.mark.parametrize("model,cluster,n,batch,seq,space", CASES, ids=IDS)
def test_search_finds_the_brute_force_optimum(model, cluster, n, batch, seq, space):
    rows, _, _, limit = brute_force(model, cluster, n, batch, seq, space)
    feasible = sorted((t, mem) for t, mem, *_ in rows if mem <= limit)
    res = search(model, cluster, n, batch, seq, top=4, space=space, refine_partition=False)
    assert res.stats["bound_violations"] == 0
    assert res.best.estimate.step_time_s == pytest.approx(feasible[0][0], rel=1e-12)
    # the alternatives are the next best distinct estimates, in order
    distinct = sorted(set(feasible))
    got = [(c.estimate.step_time_s, c.estimate.peak_memory_bytes) for c in res.ranked]
    assert len(got) == min(5, len(distinct))
    for (t, m), (bt, bm) in zip(got, distinct):
        assert t == pytest.approx(bt, rel=1e-12) and m == pytest.approx(bm, rel=1e-12)
    # having evaluated only a small part of the space exactly
    assert res.stats["candidates"] == len(rows)
    assert res.stats["exact_evaluations"] < len(rows) / 5
    if model.is_moe:
        assert any(cfg.ep > 1 for _, _, cfg, _, _ in rows)


def test_memory_objective_and_cap_match_brute_force():
    model, cluster, n, batch, seq, space = CASES[1]
    rows, *_ = brute_force(model, cluster, n, batch, seq, space)
    res = search(model, cluster, n, batch, seq, objective="memory", top=0, space=space, refine_partition=False)
    assert res.best.estimate.peak_memory_bytes == pytest.approx(min(m for _, m, *_ in rows), rel=1e-12)
    # a cap between the smallest and the largest footprint: the fastest plan under it
    cap_gib = sorted(m for _, m, *_ in rows)[len(rows) // 3] / GIB
    best_capped = min(t for t, m, *_ in rows if m <= cap_gib * GIB)
    rows_capped, *_ = brute_force(model, cluster, n, batch, seq, space, cap_gib * GIB)
    assert min(t for t, m, *_ in rows_capped if m <= cap_gib * GIB) == best_capped
    res = search(model, cluster, n, batch, seq, max_memory_gib=cap_gib, space=space, refine_partition=False)
    assert res.best.estimate.step_time_s == pytest.approx(best_capped, rel=1e-12)
    assert res.best.estimate.peak_memory_bytes <= cap_gib * GIB


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.sampled_from([4, 6, 8]), heads=st.sampled_from([8, 16]), hidden_per_head=st.sampled_from([64, 128]),
       gpus=st.sampled_from([2, 4, 8]), batch=st.sampled_from([4, 8, 12]), seq=st.sampled_from([1024, 4096]))
def test_search_equals_brute_force_on_random_models(layers, heads, hidden_per_head, gpus, batch, seq):
    model = small_gpt(layers=layers, hidden=heads * hidden_per_head, heads=heads)
    space = SearchSpace(partial_recompute=False, schedules=("gpipe", "1f1b", "interleaved-1f1b", "zb-h2"))
    rows, _, _, limit = brute_force(model, A100, gpus, batch, seq, space)
    for t, mem, cfg, tb, mb in rows:
        assert tb <= t * (1 + 1e-9) and mb <= mem * (1 + 1e-9), cfg
    feasible = [t for t, mem, *_ in rows if mem <= limit]
    res = search(model, A100, gpus, batch, seq, top=0, space=space, refine_partition=False)
    assert res.best.estimate.step_time_s == pytest.approx(min(feasible), rel=1e-12)
    assert not config_problems(model, A100, res.best.config)
    assert estimate(model, A100, res.best.config).step_time_s == res.best.estimate.step_time_s


def test_search_is_deterministic():
    a = search(load_model("llama-3.1-8b"), H100, 16, 16, 8192, top=3)
    b = search(load_model("llama-3.1-8b"), H100, 16, 16, 8192, top=3)
    assert [c.config for c in a.ranked] == [c.config for c in b.ranked]


def test_partition_refinement_never_makes_the_best_plan_worse():
    model = load_model("llama-3.1-70b")
    plain = search(model, H100, 64, 64, 4096, top=2, refine_partition=False)
    refined = search(model, H100, 64, 64, 4096, top=2)
    assert refined.best.estimate.step_time_s <= plain.best.estimate.step_time_s
    assert refined.stats["partitions_tried"] >= 0


def test_large_request_plans_fast_and_within_memory():
    res = search(load_model("gpt3-175b"), A100, 1024, 1536, 2048, top=3)
    assert res.stats["candidates"] > 1_000_000
    assert res.stats["exact_evaluations"] < 2000
    assert res.stats["bound_violations"] == 0
    for c in res.ranked:
        assert c.estimate.peak_memory_bytes <= memory_limit_bytes(A100)
        assert not config_problems(load_model("gpt3-175b"), A100, c.config)


def test_infeasible_request_names_the_reason_and_the_nearest_fix():
    with pytest.raises(InfeasibleError) as e:
        search(load_model("llama-3.1-405b"), H100, 8, 8, 8192)
    msg = str(e.value)
    assert "fits" in msg and "GiB" in msg and "--gpus" in msg
    assert e.value.exit_code == 1
    # the suggested GPU count really plans
    n = int(msg.split("--gpus ")[1].split()[0].rstrip(";)"))
    assert n > 8
    assert search(load_model("llama-3.1-405b"), H100, n, 8, 8192, top=0).best


def test_no_valid_layout_is_explained():
    with pytest.raises(InfeasibleError) as e:
        # 7 GPUs: TP 7 does not divide 8 heads, PP 7 exceeds 4 layers, CP 7 does not split 2048, DP 7 not 16
        search(small_gpt(layers=4), A100, 7, 16, 2048)
    assert "global batch" in str(e.value) or "divisible" in str(e.value)


@pytest.mark.parametrize("kwargs,source", [({"objective": "speed"}, "--objective"), ({"top": -1}, "--top"),
                                           ({"max_memory_gib": 0}, "--max-memory-gib")])
def test_bad_arguments_are_usage_errors(kwargs, source):
    with pytest.raises(PlannerError) as e:
        search(small_gpt(), A100, 8, 16, 2048, **kwargs)
    assert e.value.exit_code == 2 and e.value.source == source


def test_memory_limit_respects_the_cap():
    assert memory_limit_bytes(H100, 10) == 10 * GIB
    assert memory_limit_bytes(H100) == H100.gpu.hbm_bytes - H100.gpu.memory_reserve_bytes
    assert not math.isinf(memory_limit_bytes(H100, 1e9))


# ---- one cost model: the search's tables are the cost model's batch functions, equal to estimate() ------------
@pytest.mark.parametrize("model_name,cluster_name,n,batch,seq", [
    ("gpt3-175b", "a100-80gb-sxm", 64, 64, 2048),  # dense MHA, learned positions, biases, dropout
    ("llama-3.1-405b", "h100-80gb-sxm", 128, 64, 8192),  # GQA (8 K/V heads: replicated beyond TP 8), RoPE
    ("mixtral-8x7b", "mi300x-192gb", 64, 128, 4096),  # MoE without shared experts (TP halved by EP)
    ("deepseek-v3", "h800-80gb-sxm", 256, 256, 4096),  # MLA, shared experts, group-limited routing across nodes
])
def test_search_evaluation_equals_estimate_on_random_configurations(model_name, cluster_name, n, batch, seq):
    """Random rows of a space with every option value and every schedule: the search's per-rank times (built from
    ``step.layer_costs`` over all the space's layer keys at once) equal what ``estimate()`` (the batch of one)
    puts on each rank, its exact evaluation is ``estimate()``'s, and every bound stays below the exact value."""
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    sp = build_space(model, cluster, n, batch, seq, SearchSpace(**ALL_OPTIONS))
    t = group_tables(model, cluster, sp)
    rng = np.random.default_rng(11)
    groups = rng.choice(len(sp.groups), 60, replace=False)
    F, B, W = rank_times(sp, t, groups)
    refined = refined_group_bounds(sp, t, groups, (F, B, W))
    coef, const, _ = group_floors(model, cluster, sp, t, groups, (F, B, W))
    seen = set()
    for i, g in enumerate(groups.tolist()):
        rows = sp.expand(np.array([g]))
        j = int(rng.integers(len(rows)))
        for r in sorted({0, j}):  # row 0: no recomputation, whose rank times are exact
            cfg = sp.config(int(rows.group[r]), int(rows.zero[r]), int(rows.rec[r]), int(rows.hsdp[r]))
            seen.add((cfg.schedule, cfg.flash_attention, cfg.tp_comm_overlap, cfg.overlap_grad_reduce,
                      cfg.grad_reduce_bytes))
            exact = estimate(model, cluster, cfg)  # the checked public path
            assert estimate(model, cluster, cfg, check=False) == exact  # what the search's exact step calls
            if cfg.recompute == "none":
                p = cfg.pp
                np.testing.assert_allclose([s.fwd_s for s in exact.stages], F[i, :p], rtol=1e-12)
                np.testing.assert_allclose([s.bwd_s - s.bwd_weight_s for s in exact.stages], B[i, :p], rtol=1e-12)
                np.testing.assert_allclose([s.bwd_weight_s for s in exact.stages], W[i, :p], rtol=1e-12)
            tb = row_time_bound(sp, t, rows.take([r]), np.array([refined[i]]),
                                (coef[i:i + 1], const[i:i + 1]))[0]
            mb = row_memory_bound(sp, t, rows.take([r]))[0]
            assert tb <= exact.step_time_s * (1 + 1e-9), cfg
            assert mb <= exact.peak_memory_bytes * (1 + 1e-9), cfg
    assert len({x[0] for x in seen}) >= 4 and {x[1] for x in seen} == {True, False}


def test_runtime_options_are_dominated_so_the_default_space_loses_nothing():
    """The default space keeps each runtime option's best value alone (SearchSpace's comment): widening every option
    to both values finds the same optimum, now that the search can explore them."""
    model = load_model("llama-3.1-8b")
    narrow = search(model, H100, 16, 32, 8192, top=0, refine_partition=False)
    wide = search(model, H100, 16, 32, 8192, top=0, refine_partition=False, space=SearchSpace(**ALL_OPTIONS))
    assert wide.stats["candidates"] > 8 * narrow.stats["candidates"]
    assert wide.best.estimate.step_time_s == pytest.approx(narrow.best.estimate.step_time_s, rel=1e-12)
    # and an option the space excludes is never chosen
    off = search(model, H100, 16, 32, 8192, top=2, refine_partition=False,
                 space=SearchSpace(tp_comm_overlap=(False,), flash_attention=(False,)))
    assert all(not c.config.tp_comm_overlap and not c.config.flash_attention for c in off.ranked)


def test_search_picks_tp_comm_overlap_where_tensor_parallelism_runs():
    res = search(load_model("gpt3-175b"), A100, 1024, 1536, 2048, top=3)
    assert any(c.config.tp > 1 for c in res.ranked)
    for c in res.ranked:
        assert c.config.tp_comm_overlap == (c.config.tp > 1 and c.config.sequence_parallel)


def test_memory_bound_of_a_subset_equals_the_whole_space_s():
    model, cluster = load_model("mixtral-8x7b"), H100
    sp = build_space(model, cluster, 64, 256, 4096)
    t = group_tables(model, cluster, sp)
    subset = np.random.default_rng(3).choice(len(sp.groups), 200, replace=False)
    np.testing.assert_array_equal(group_memory_bound(sp, t, subset), group_memory_bound(sp, t)[subset])



@settings(max_examples=20, deadline=None)
@given(pp=st.sampled_from([2, 4, 8]), mb=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1, 3]),
       rec=st.sampled_from(["none", "selective", "full"]))
def test_gpipe_is_dominated_by_1f1b_so_the_space_leaves_it_out(pp, mb, zero, rec):
    """The space skips GPipe where 1F1B is in it (space.group_rows): the same step time, never less memory."""
    model = load_model("llama-3.1-8b")
    cfg = RunConfig(num_gpus=64, tp=2, pp=pp, global_batch_size=128, micro_batch_size=mb, seq_len=4096,
                    zero_stage=zero, recompute=rec, schedule="1f1b")
    one, gp = estimate(model, H100, cfg), estimate(model, H100, cfg.with_(schedule="gpipe"))
    assert gp.step_time_s == pytest.approx(one.step_time_s, rel=1e-12)
    assert gp.peak_memory_bytes >= one.peak_memory_bytes
    sp = build_space(model, H100, 64, 128, 4096, SearchSpace(schedules=("gpipe", "1f1b")))
    assert set(sp.col("sched").tolist()) == {sp.schedules.index("1f1b")}
    alone = build_space(model, H100, 64, 128, 4096, SearchSpace(schedules=("gpipe",)))
    assert len(alone.groups) > 0


def test_every_row_holds_the_spaces_fixed_options():
    """``SearchSpace.fixed`` reaches every configuration the space builds, whatever the row (the options the search
    does not vary travel as one value, ``config.FixedOptions``), and ``with_fixed`` round-trips a RunConfig's."""
    from planner.specs.config import FixedOptions

    mixtral = load_model("mixtral-8x7b")
    fixed = FixedOptions(precision="fp8", attention_kernel="flash-attention-2", per_expert_gemm_calls=False,
                         fp8_param_gather=True, recompute_fused_attention=False, recompute_modules="core_attn,moe_act",
                         packed_doc_len=1024.0, packed_attention_cv=0.3, offload_modules="")
    space = SearchSpace().with_fixed(fixed)
    assert space.fixed == fixed
    sp = build_space(mixtral, H100, 32, 64, 4096, space)
    rows = sp.expand(np.arange(len(sp.groups)))
    picks = np.unique(np.linspace(0, len(rows) - 1, 25).astype(int))
    for i in picks:
        cfg = sp.config(int(rows.group[i]), int(rows.zero[i]), int(rows.rec[i]),
                        int(rows.hsdp[i]) if rows.hsdp is not None else 0)
        assert cfg.fixed == fixed
    assert SearchSpace().with_fixed(cfg.fixed).fixed == fixed
