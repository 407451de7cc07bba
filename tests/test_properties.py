"""Property tests over random models, clusters and sizes (hypothesis). Each test states the invariant it checks.

Random models are built through the HF ``config.json`` loader (so they are models a user could pass); random
clusters are the shipped profiles with a random HBM size and node width; configurations are drawn from degrees
that mostly satisfy the validity rules. Example counts are small so the whole file runs in well under a minute.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.cost import step as step_mod
from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.errors import InfeasibleError, PlannerError
from planner.plan import dumps, plan_dict
from planner.schema import plan_consistency_errors, plan_json_errors
from planner.specs.config import RunConfig
from planner.specs.hardware import GIB, cluster_from_dict, hardware_profiles_dir
from planner.specs.model import ModelSpec, model_from_config

#: examples per property; CI keeps it small, ``PLANNER_PROPERTY_EXAMPLES=500`` digs deeper locally
EXAMPLES = int(os.environ.get("PLANNER_PROPERTY_EXAMPLES", "40"))
PROPS = settings(max_examples=EXAMPLES, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                        HealthCheck.data_too_large])
REL = 1e-9  # floating-point summation order

PROFILES = {p.stem: json.loads(p.read_text()) for p in sorted(hardware_profiles_dir().glob("*.json"))}


# ----------------------------------------------------------------------------------------------------------------
# Strategies
# ----------------------------------------------------------------------------------------------------------------
@st.composite
def models(draw) -> ModelSpec:
    """A Llama-style (optionally MoE) or GPT-2-style decoder, 1-1.5B-ish to a few tens of billions of parameters."""
    kind = draw(st.sampled_from(["llama", "gpt2", "mixtral"]))
    heads = draw(st.sampled_from([8, 16, 32, 48, 64]))
    head_dim = draw(st.sampled_from([64, 128]))
    hidden = heads * head_dim
    layers = draw(st.integers(2, 40))
    vocab = draw(st.sampled_from([32000, 50257, 128256]))
    max_pos = draw(st.sampled_from([2048, 8192, 131072]))
    if kind == "gpt2":
        cfg = {"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_layer": layers, "vocab_size": vocab,
               "n_positions": max_pos}
    else:
        kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
        cfg = {"model_type": kind, "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv,
               "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": max_pos,
               "intermediate_size": draw(st.sampled_from([2, 3, 4])) * hidden,
               "tie_word_embeddings": draw(st.booleans())}
        if kind == "mixtral":
            experts = draw(st.sampled_from([4, 8, 16]))
            cfg.update(num_local_experts=experts, num_experts_per_tok=draw(st.integers(1, min(4, experts))))
    return model_from_config(cfg, source="<random>", default_name=f"random-{kind}")


@st.composite
def clusters(draw):
    name = draw(st.sampled_from(sorted(PROFILES)))
    doc = json.loads(json.dumps(PROFILES[name]))
    doc["gpu"]["hbm_gib"] = draw(st.sampled_from([40, 80, 141, 192]))
    doc["node"]["gpus_per_node"] = draw(st.sampled_from([4, 8]))
    return cluster_from_dict(doc, source=f"<random {name}>", default_name=name)


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16) if d <= cap and n % d == 0]


@st.composite
def setups(draw, schedules=("1f1b", "gpipe", "interleaved-1f1b")):
    """(model, cluster, config) with the configuration valid by ``config_problems``."""
    model = draw(models())
    cluster = draw(clusters())
    tp = draw(st.sampled_from(_divisors(model.num_heads, cluster.gpus_per_node)))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if p <= model.num_layers]))
    schedule = draw(st.sampled_from(schedules)) if pp > 1 else draw(st.sampled_from(["1f1b", "gpipe"]))
    vpp = 2 if schedule == "interleaved-1f1b" else 1
    cp = draw(st.sampled_from([1, 1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    mb = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 4)) * (pp if vpp > 1 else 1)
    seq = draw(st.sampled_from([512, 1024, 2048]))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if model.is_moe and model.num_experts % e == 0
                               and (dp * cp) % e == 0] or [1]))
    cfg = RunConfig(num_gpus=tp * pp * cp * dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, global_batch_size=dp * mb * m,
                    micro_batch_size=mb, seq_len=seq, sequence_parallel=tp > 1,
                    zero_stage=draw(st.sampled_from([0, 1, 2, 3])),
                    recompute=draw(st.sampled_from(["none", "selective", "full"])), schedule=schedule)
    assume(config_problems(model, cluster, cfg) == [])
    return model, cluster, cfg


def _fresh_estimate(model, cluster, cfg):
    """An estimate computed from scratch (the cost model memoizes; determinism must not rest on the cache)."""
    step_mod._estimate_cached.cache_clear()
    return estimate(model, cluster, cfg)


# ----------------------------------------------------------------------------------------------------------------
# Cost model invariants
# ----------------------------------------------------------------------------------------------------------------
@PROPS
@given(setups())
def test_estimate_is_deterministic(setup) -> None:
    """The same input gives equal estimates and byte-identical JSON, whether or not the cache is warm."""
    model, cluster, cfg = setup
    a = _fresh_estimate(model, cluster, cfg)
    b = _fresh_estimate(model, cluster, cfg)
    c = estimate(model, cluster, cfg)  # cached
    assert a == b == c
    assert dumps(plan_dict(model, cluster.name, cfg, a)) == dumps(plan_dict(model, cluster.name, cfg, b))


@PROPS
@given(setups())
def test_breakdown_adds_up_and_numbers_are_consistent(setup) -> None:
    """The breakdown components add up to the step time; every number is finite; throughput, TFLOP/s and MFU are
    the same quantity in three units; MFU <= HFU <= 1; fits means the largest stage peak is within the limit."""
    model, cluster, cfg = setup
    est = estimate(model, cluster, cfg)
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s, rel=REL)
    assert all(math.isfinite(v) for v in est.breakdown.values())
    assert min(est.breakdown.values()) >= -REL * est.step_time_s
    assert est.step_time_s > 0 and math.isfinite(est.step_time_s)
    assert est.tokens_per_s * est.step_time_s == pytest.approx(cfg.global_batch_size * cfg.seq_len, rel=REL)
    assert est.mfu == pytest.approx(est.tflops_per_gpu * 1e12 / cluster.gpu.peak_flops, rel=REL)
    assert 0 < est.mfu <= est.hfu * (1 + REL) and est.hfu <= 1
    assert est.peak_memory_bytes == max(s.peak_memory_bytes for s in est.stages)
    assert est.memory_limit_bytes == cluster.gpu.hbm_bytes - cluster.gpu.memory_reserve_bytes
    assert est.fits == (est.peak_memory_bytes <= est.memory_limit_bytes)
    assert len(est.stages) == cfg.pp
    assert sum(sum(s.layers) for s in est.stages) == model.num_layers
    for s in est.stages:
        assert all(v >= 0 and math.isfinite(v) for v in s.memory_bytes.values())


@PROPS
@given(setups(), st.sampled_from([2, 4]))
def test_memory_is_monotone_in_micro_batch_size(setup, factor) -> None:
    """With the number of micro-batches fixed (global batch grows with the micro-batch), every stage's peak memory
    does not decrease when the micro-batch grows, and activations grow strictly."""
    model, cluster, cfg = setup
    big = cfg.with_(micro_batch_size=cfg.micro_batch_size * factor, global_batch_size=cfg.global_batch_size * factor)
    assume(config_problems(model, cluster, big) == [])
    a, b = estimate(model, cluster, cfg), estimate(model, cluster, big)
    assert b.peak_memory_bytes >= a.peak_memory_bytes * (1 - REL)
    for sa, sb in zip(a.stages, b.stages):
        assert sb.peak_memory_bytes >= sa.peak_memory_bytes * (1 - REL)
        assert sb.memory_bytes["activations"] > sa.memory_bytes["activations"]


@PROPS
@given(setups(), st.sampled_from([2, 4]))
def test_memory_is_monotone_in_sequence_length(setup, factor) -> None:
    """Everything else fixed, a longer sequence never needs less memory on any stage."""
    model, cluster, cfg = setup
    long = cfg.with_(seq_len=cfg.seq_len * factor)
    assert config_problems(model, cluster, long) == []  # doubling keeps every divisibility rule
    a, b = estimate(model, cluster, cfg), estimate(model, cluster, long)
    assert b.peak_memory_bytes >= a.peak_memory_bytes * (1 - REL)
    for sa, sb in zip(a.stages, b.stages):
        assert sb.peak_memory_bytes >= sa.peak_memory_bytes * (1 - REL)
        assert sb.memory_bytes["activations"] > sa.memory_bytes["activations"]


@PROPS
@given(setups())
def test_zero_stages_never_add_memory(setup) -> None:
    """ZeRO 0 -> 1 -> 2 shards more of the model states: per-GPU memory never grows (ZeRO-3 is excluded: it adds
    gathered-layer buffers that can outweigh the sharding at small DP)."""
    model, cluster, cfg = setup
    peaks = [estimate(model, cluster, cfg.with_(zero_stage=z)).peak_memory_bytes for z in (0, 1, 2)]
    assert peaks[0] >= peaks[1] * (1 - REL) and peaks[1] >= peaks[2] * (1 - REL)


@PROPS
@given(setups(schedules=("1f1b", "gpipe")))
def test_recomputation_trades_time_for_activation_memory(setup) -> None:
    """Stored activations: full <= selective <= none. Step time: none <= selective <= full (without ZeRO-3, whose
    parameter gathers hide behind the longer recomputing micro-batches)."""
    model, cluster, cfg = setup
    ests = {r: estimate(model, cluster, cfg.with_(recompute=r)) for r in ("none", "selective", "full")}
    act = {r: sum(s.memory_bytes["activations"] for s in e.stages) for r, e in ests.items()}
    assert act["full"] <= act["selective"] * (1 + REL) and act["selective"] <= act["none"] * (1 + REL)
    if cfg.zero_stage < 3:
        t = {r: e.step_time_s for r, e in ests.items()}
        assert t["none"] <= t["selective"] * (1 + REL) and t["selective"] <= t["full"] * (1 + REL)


@PROPS
@given(models(), clusters(), st.sampled_from([1, 2, 3, 4, 6, 8, 16]), st.sampled_from([1, 2, 3, 4, 8]),
       st.sampled_from([1, 2, 5]), st.sampled_from([1, 3, 4]), st.sampled_from([1, 2, 3]),
       st.sampled_from([1, 6, 8, 64]), st.sampled_from([1, 4]), st.sampled_from([100, 512, 2048]),
       st.sampled_from(["1f1b", "interleaved-1f1b", "gpipe"]))
def test_estimate_accepts_exactly_the_valid_configs(model, cluster, tp, pp, vpp, cp, dp, gb, mb, seq, sched) -> None:
    """``estimate`` raises PlannerError (exit code 2, naming an option) exactly when ``config_problems`` reports a
    broken rule; otherwise it returns finite numbers. Random degrees break every rule now and then."""
    cfg = RunConfig(num_gpus=tp * pp * cp * dp, tp=tp, pp=pp, vpp=vpp, cp=cp, global_batch_size=gb,
                    micro_batch_size=mb, seq_len=seq, schedule=sched, sequence_parallel=tp > 1)
    problems = config_problems(model, cluster, cfg)
    if problems:
        with pytest.raises(PlannerError) as exc:
            estimate(model, cluster, cfg)
        assert exc.value.exit_code == 2 and str(exc.value).startswith("--")
        assert all(isinstance(o, str) and isinstance(msg, str) and msg for o, msg in problems)
    else:
        est = estimate(model, cluster, cfg)
        assert math.isfinite(est.step_time_s) and est.step_time_s > 0 and math.isfinite(est.peak_memory_bytes)


# ----------------------------------------------------------------------------------------------------------------
# Search invariants (``planner.search.search_plans``, the function behind ``planner plan``)
# ----------------------------------------------------------------------------------------------------------------
def _search_plans():
    from planner.search import search_plans

    return search_plans


SEARCH = settings(max_examples=max(1, EXAMPLES * 3 // 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def search_requests(draw):
    model = draw(models())
    cluster = draw(clusters())
    gpus = draw(st.sampled_from([4, 8, 16, 32]))
    gb = gpus * draw(st.sampled_from([1, 2, 4]))
    seq = draw(st.sampled_from([1024, 2048, 4096]))
    objective = draw(st.sampled_from(["time", "memory"]))
    return model, cluster, gpus, gb, seq, objective


@SEARCH
@given(search_requests())
def test_every_plan_is_valid_fits_and_reestimates_identically(request_) -> None:
    """Every plan returned (the best and each alternative) breaks no validity rule, fits memory by the planner's own
    estimate, and ``estimate`` of its configuration gives exactly the numbers the plan carries. The best is
    ranked first by the objective. Its JSON matches the plan schema. No plan at all is an InfeasibleError (exit
    code 1)."""
    search_plans = _search_plans()
    model, cluster, gpus, gb, seq, objective = request_
    try:
        plan = search_plans(model, cluster, gpus, gb, seq, top_k=3, objective=objective)
    except InfeasibleError as e:
        assert e.exit_code == 1 and str(e)
        return
    ranked = (plan,) + tuple(plan.alternatives)
    printed = json.loads(plan.to_json())  # what `plan --json` prints matches the schema and is consistent
    assert plan_json_errors(printed) == [] and plan_consistency_errors(printed) == []
    for p in ranked:
        cfg = p.config
        assert cfg.num_gpus == gpus and cfg.global_batch_size == gb and cfg.seq_len == seq
        assert config_problems(model, cluster, cfg) == []
        assert p.estimate.fits and p.estimate.peak_memory_bytes <= cluster.gpu.hbm_bytes
        again = _fresh_estimate(model, cluster, cfg)
        assert again.step_time_s == p.estimate.step_time_s
        assert again.peak_memory_bytes == p.estimate.peak_memory_bytes
        assert again.breakdown == p.estimate.breakdown
    key = (lambda p: p.estimate.step_time_s) if objective == "time" else (lambda p: p.estimate.peak_memory_bytes)
    assert all(key(ranked[0]) <= key(p) * (1 + REL) for p in ranked)
    assert len({p.config for p in ranked}) == len(ranked)  # alternatives are distinct configurations


@SEARCH
@given(search_requests(), st.sampled_from([10.0, 20.0, 40.0]))
def test_memory_cap_is_respected(request_, cap_gib) -> None:
    """With ``max_memory_gib`` every returned plan's peak stays under the cap."""
    search_plans = _search_plans()
    model, cluster, gpus, gb, seq, objective = request_
    try:
        plan = search_plans(model, cluster, gpus, gb, seq, top_k=2, objective=objective, max_memory_gib=cap_gib)
    except InfeasibleError:
        return
    for p in (plan,) + tuple(plan.alternatives):
        assert p.estimate.peak_memory_bytes <= cap_gib * GIB * (1 + REL)


@SEARCH
@given(search_requests())
def test_search_is_deterministic(request_) -> None:
    """Two searches of the same request return the same configurations in the same order and the same JSON."""
    search_plans = _search_plans()
    model, cluster, gpus, gb, seq, objective = request_
    runs = []
    for _ in range(2):
        step_mod._estimate_cached.cache_clear()
        try:
            plan = search_plans(model, cluster, gpus, gb, seq, top_k=3, objective=objective)
        except InfeasibleError as e:
            runs.append(str(e))
            continue
        d = plan.to_dict()
        d.pop("search", None)  # search statistics may include wall time
        runs.append(([plan.config] + [a.config for a in plan.alternatives], dumps(d)))
    assert runs[0] == runs[1]


@SEARCH
@given(search_requests())
def test_time_and_memory_optima_are_consistent(request_) -> None:
    """The search is exact over its space (partition refinement off, so both objectives search the same space):
    the fastest plan is no slower than the smallest plan, and the smallest plan needs no more memory than the
    fastest one."""
    search_plans = _search_plans()
    model, cluster, gpus, gb, seq, _ = request_
    try:
        fast = search_plans(model, cluster, gpus, gb, seq, top_k=0, objective="time", refine_partition=False)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            search_plans(model, cluster, gpus, gb, seq, top_k=0, objective="memory", refine_partition=False)
        return
    small = search_plans(model, cluster, gpus, gb, seq, top_k=0, objective="memory", refine_partition=False)
    assert fast.estimate.step_time_s <= small.estimate.step_time_s * (1 + REL)
    assert small.estimate.peak_memory_bytes <= fast.estimate.peak_memory_bytes * (1 + REL)


@SEARCH
@given(search_requests(), st.sampled_from([0.5, 0.8]))
def test_a_memory_cap_never_speeds_up_the_optimum(request_, fraction) -> None:
    """Capping memory below the fastest plan's peak only removes candidates: the capped optimum is no faster."""
    search_plans = _search_plans()
    model, cluster, gpus, gb, seq, _ = request_
    try:
        free = search_plans(model, cluster, gpus, gb, seq, top_k=0, refine_partition=False)
    except InfeasibleError:
        return
    cap_gib = free.estimate.peak_memory_bytes * fraction / GIB
    try:
        capped = search_plans(model, cluster, gpus, gb, seq, top_k=0, max_memory_gib=cap_gib, refine_partition=False)
    except InfeasibleError:
        return
    assert capped.estimate.peak_memory_bytes <= cap_gib * GIB * (1 + REL)
    assert capped.estimate.step_time_s >= free.estimate.step_time_s * (1 - REL)


def test_per_stage_recompute_counts_are_checked_against_the_even_split_too():
    """validity's rule "each between 0 and its stage's layers" holds whether the split is given or the even one."""
    from planner.cost.validity import config_problems
    from planner.specs.hardware import load_cluster
    from planner.specs.model import load_model

    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")  # 32 layers: 16 per stage at pp 2
    base = RunConfig(num_gpus=16, tp=8, pp=2, global_batch_size=16, recompute="full")
    assert not config_problems(model, cluster, base.with_(recompute_layers_per_stage=(16, 3)))
    problems = config_problems(model, cluster, base.with_(recompute_layers_per_stage=(17, 3)))
    assert [opt for opt, _ in problems] == ["recompute_layers_per_stage"]
