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
from planner.search.bounds import (data_parallel_floor_s, group_memory_bound, group_tables, group_time_bound, refined_group_bound,
                                   row_memory_bound, row_time_bound)
from planner.search.engine import memory_limit_bytes, search
from planner.search.space import SearchSpace, build_space
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
    refined = np.array([refined_group_bound(sp, tables, g) for g in range(len(sp.groups))])
    floors = [data_parallel_floor_s(model, cluster, sp, tables, g) for g in range(len(sp.groups))]
    coef, coll = np.array([f[0] for f in floors]), np.array([f[1] for f in floors])
    tb = row_time_bound(sp, tables, rows, refined[rows.group], (coef[rows.group], coll[rows.group]))
    mb = row_memory_bound(sp, tables, rows)
    out = []
    for i in range(len(rows)):
        cfg = sp.config(int(rows.group[i]), int(rows.zero[i]), int(rows.rec[i]))
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


# ---- the vectorized per-layer costs (planner.search.layer_table) against the scalar cost model ------------------
_LAYER_FIELDS = ("tp_fwd_s", "tp_bwd_s", "cp_fwd_s", "cp_bwd_s", "ep_fwd_s", "act_bytes", "act_full_bytes",
                 "act_none_bytes", "cp_buffer_bytes")
_PASS_FIELDS = ("fwd_s", "bwd_input_s", "bwd_weight_s", "selective_recompute_s")


@pytest.mark.parametrize("model_name,cluster_name", [
    ("gpt3-175b", "a100-80gb-sxm"),  # dense MHA, learned positions, biases, dropout
    ("llama-3.1-405b", "h100-80gb-sxm"),  # GQA (8 K/V heads: replicated beyond TP 8), gated MLP, RoPE
    ("mixtral-8x7b", "mi300x-192gb"),  # MoE without shared experts (TP halved by EP), 8-GPU nodes
    ("deepseek-v3", "h800-80gb-sxm"),  # MLA, shared experts, group-limited routing across nodes
])
def test_layer_table_equals_the_scalar_layer_cost(model_name, cluster_name):
    """Every field of ``layer_table.layer_costs`` / ``end_costs`` equals ``step._layer_cost`` (uncached) and the
    embedding / head pass times on random keys (TP, CP of both kinds inside and across nodes, micro-batch, SP,
    EP inside and across nodes), so the replica cannot drift from the cost model."""
    from planner.cost import comm
    from planner.cost.compute import embedding_ops, head_ops, pass_times
    from planner.cost.memory import embedding_activation_bytes, head_activation_bytes
    from planner.cost.step import _layer_cost
    from planner.search import layer_table
    from planner.specs.config import CP_KINDS, RunConfig

    model, cluster = load_model(model_name), load_cluster(cluster_name)
    rng = np.random.default_rng(7)
    n = 120
    ep_choices = [1, 2, 4, 8, 16, 64] if model.is_moe else [1]
    keys = np.stack([rng.choice([1, 2, 4, 8], n), rng.choice([1, 2, 4, 8, 16, 64, 256], n), rng.integers(0, 2, n),
                     rng.choice([1, 2, 3, 5, 16, 128], n), rng.integers(0, 2, n), rng.choice(ep_choices, n)], axis=1)
    for seq in (2048, 32768):
        ends = layer_table.end_costs(model, cluster, seq, keys[:, 0], keys[:, 1], keys[:, 3], keys[:, 4])
        for moe in ((False, True) if model.is_moe else (False,)):
            vec = layer_table.layer_costs(model, cluster, seq, *keys.T, moe=moe)
            for i, (t, c, k, b, s, e) in enumerate(keys.tolist()):
                cfg = RunConfig(num_gpus=t * c * e, tp=t, cp=c, ep=e, cp_kind=CP_KINDS[k], micro_batch_size=b,
                                seq_len=seq, sequence_parallel=bool(s), recompute="selective")
                lc = _layer_cost.__wrapped__(model, cluster, cfg, comm.groups_for(cluster, t, c, e, 1, e), moe)
                want = [getattr(lc.pt, f) for f in _PASS_FIELDS] + [getattr(lc, f) for f in _LAYER_FIELDS]
                got = [vec[f][i] for f in _PASS_FIELDS + _LAYER_FIELDS]
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=f"{model_name} {cfg}")
                if moe:
                    continue
                emb, head = pass_times(embedding_ops(model, cfg), cluster.gpu), pass_times(head_ops(model, cfg),
                                                                                          cluster.gpu)
                want = [emb.fwd_s, emb.bwd_s, head.fwd_s, head.bwd_input_s, head.bwd_weight_s,
                        embedding_activation_bytes(model, cfg), head_activation_bytes(model, cfg)]
                got = [ends[f][i] for f in ("emb_fwd_s", "emb_bwd_s", "head_fwd_s", "head_bwd_input_s",
                                            "head_bwd_weight_s", "act_emb_bytes", "head_act_bytes")]
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=f"{model_name} {cfg}")


def test_group_layer_tables_equal_the_scalar_composition():
    """The bounds' per-key tables built from the vectorized layer costs equal those built from ``_layer_cost``."""
    from planner.search.bounds import _layer_tables, _layer_tables_scalar, _unique_rows

    model, cluster = load_model("mixtral-8x7b"), H100
    sp = build_space(model, cluster, 64, 256, 4096)
    uniq, _ = _unique_rows(*(sp.col(k) for k in ("tp", "cp", "cp_kind", "mb", "sp", "ep")))
    assert len(uniq) > 500
    vec, ref = _layer_tables(model, cluster, 4096, uniq), _layer_tables_scalar(model, cluster, 4096, uniq)
    assert vec.keys() == ref.keys()
    for name in ref:
        np.testing.assert_allclose(vec[name], ref[name], rtol=1e-12, atol=0, err_msg=name)


@pytest.mark.parametrize("model_name,cluster_name,n,batch,seq", [
    ("mixtral-8x7b", "h100-80gb-sxm", 64, 256, 4096),  # MoE: EP groups, six checked ranks
    ("llama-3.1-8b", "a100-80gb-sxm", 128, 256, 8192),  # dense, every schedule incl. interleaved and ZB-V
])
def test_vectorized_group_bounds_equal_the_per_group_ones(model_name, cluster_name, n, batch, seq):
    """The engine's batch bounds (``refined_group_bounds``, ``group_floors``, ``floored_group_bound``, the memory
    bound of a subset) equal the per-group functions they vectorize, on 1,500 random groups of the space."""
    from planner.search.bounds import (_optimizer_floats, floored_group_bound, group_floors, refine_group,
                                       refined_group_bounds)

    model, cluster = load_model(model_name), load_cluster(cluster_name)
    sp = build_space(model, cluster, n, batch, seq)
    t = group_tables(model, cluster, sp)
    g = np.arange(len(sp.groups))
    assert len(set(sp.schedules[i] for i in sp.col("sched"))) >= 5
    refined = refined_group_bounds(sp, t, g)
    coef, const, opt = group_floors(model, cluster, sp, t, g)
    cheap = group_time_bound(sp, t)
    bound = floored_group_bound(sp, np.maximum(cheap, refined), coef, const, opt)
    for i in np.random.default_rng(5).choice(len(g), 1500, replace=False).tolist():
        assert refined[i] == refined_group_bound(sp, t, i)
        a, c = data_parallel_floor_s(model, cluster, sp, t, i)
        np.testing.assert_array_equal(coef[i], a)
        np.testing.assert_array_equal(const[i], c)
        np.testing.assert_array_equal(opt[i], _optimizer_floats(sp, t, i))
        assert bound[i] == refine_group(model, cluster, sp, t, i, float(cheap[i]))[0]
    subset = np.random.default_rng(3).choice(len(g), 200, replace=False)
    np.testing.assert_array_equal(group_memory_bound(sp, t, subset), group_memory_bound(sp, t)[subset])
