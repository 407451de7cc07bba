"""Memory-aware stage partition with per-stage recomputation."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.plan import config_fields, config_from_dict
from planner.search.partition import best_uniform_recompute, partition, partition_report, simulated_pipeline_s
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model


@pytest.fixture(scope="module")
def big():
    return load_model("llama-3.1-405b"), load_cluster("h100-80gb-sxm")


def cfg_405b(**kw) -> RunConfig:
    base = dict(num_gpus=2048, tp=8, pp=16, global_batch_size=2048, micro_batch_size=2, seq_len=8192,
                recompute="none")
    base.update(kw)
    return RunConfig(**base)


def test_405b_uneven_partition_beats_even_split(big):
    """Acceptance: 405B, 128K vocabulary, tp 8 pp 16: the planned partition with per-stage recomputation beats the
    even split with its best single recomputation setting, in the planner's own model, and fits."""
    model, cluster = big
    even = best_uniform_recompute(model, cluster, cfg_405b())
    assert even is not None
    planned = partition(model, cluster, even)
    e0, e1 = estimate(model, cluster, even), estimate(model, cluster, planned)
    assert e1.fits and not config_problems(model, cluster, planned)
    assert e1.step_time_s < 0.95 * e0.step_time_s
    layers = planned.layers_per_stage
    assert sum(layers) == model.num_layers and len(layers) == 16
    assert layers != tuple(s.layers[0] for s in e0.stages)  # uneven, not the even split
    # early ranks (more micro-batches in flight under 1F1B) recompute at least as much as late ones
    rec = planned.recompute_layers_per_stage
    assert rec[0] >= rec[-1] and sum(rec[:8]) > sum(rec[8:])
    # the busiest rank got faster
    assert max(s.time_per_microbatch_s for s in e1.stages) < max(s.time_per_microbatch_s for s in e0.stages)
    # and the gain holds in the discrete-event simulation of the unequal stages, not only in the closed form
    (c0, s0), (c1, s1) = simulated_pipeline_s(model, cluster, even), simulated_pipeline_s(model, cluster, planned)
    assert s1 < 0.95 * s0
    assert c0 == pytest.approx(s0, rel=0.01) and c1 == pytest.approx(s1, rel=0.01)


def test_report_shows_per_rank_time_and_memory(big):
    text = partition_report(*big, cfg_405b())
    assert "| rank |" in text and text.count("\n| ") >= 17  # header + 16 ranks
    assert "ms / micro-batch" in text and "peak GiB" in text


def test_partition_is_fast_and_deterministic(big):
    model, cluster = big
    cfg = cfg_405b(seq_len=4096, micro_batch_size=4)  # not cached by the other tests
    t0 = time.perf_counter()
    a = partition(model, cluster, cfg)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0  # typically 0.1-0.2 s on one core
    assert partition(model, cluster, cfg) == a


def test_returns_input_when_nothing_is_better(big):
    """With micro-batch 1 the even 7/8/.../8/7 split already fits without recomputation: nothing to gain."""
    model, cluster = big
    cfg = cfg_405b(micro_batch_size=1)
    out = partition(model, cluster, cfg)
    assert estimate(model, cluster, out).step_time_s == pytest.approx(estimate(model, cluster, cfg).step_time_s)
    assert out == cfg


def test_invalid_or_unpipelined_input_is_returned_unchanged(big):
    model, cluster = big
    bad = cfg_405b(global_batch_size=2047)
    assert partition(model, cluster, bad) is bad
    flat = RunConfig(num_gpus=8, tp=8, pp=1, global_batch_size=8)
    assert partition(model, cluster, flat) is flat


def test_nothing_fits_returns_input():
    model, cluster = load_model("llama-3.1-405b"), load_cluster("h100-80gb-sxm")
    cfg = RunConfig(num_gpus=64, tp=8, pp=8, global_batch_size=64, seq_len=8192)  # 405B on 64 GPUs: too big
    assert partition(model, cluster, cfg) is cfg


def test_partition_with_zero_bubble_makes_an_unfitting_config_fit(big):
    """ZB-H1 keeps p micro-batches on every rank until their W: without recomputation it does not fit; the
    partition adds just enough per-stage recomputation and is no slower than the best uniform setting."""
    model, cluster = big
    cfg = cfg_405b(micro_batch_size=1, schedule="zb-h1")
    assert not estimate(model, cluster, cfg).fits
    out = partition(model, cluster, cfg)
    e = estimate(model, cluster, out)
    assert e.fits and out.recompute == "full"
    uniform = best_uniform_recompute(model, cluster, cfg)
    assert e.step_time_s <= estimate(model, cluster, uniform).step_time_s


def test_partition_with_interleaved_chunks(big):
    model, cluster = big
    cfg = cfg_405b(micro_batch_size=1, schedule="interleaved-1f1b", vpp=2, recompute="full", recompute_num_layers=2,
                   layers_per_stage=tuple([3] + [4] * 30 + [3]))
    before = estimate(model, cluster, cfg)
    assert before.fits
    out = partition(model, cluster, cfg)
    e = estimate(model, cluster, out)
    assert e.fits and len(out.layers_per_stage) == 32 and sum(out.layers_per_stage) == 126
    assert e.step_time_s < before.step_time_s


# ----- per-stage recomputation in the cost model ------------------------------------------------------------------
def test_per_stage_recompute_zero_is_no_recompute_and_all_is_full():
    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    base = RunConfig(num_gpus=16, tp=2, pp=4, global_batch_size=64, seq_len=4096)
    none = estimate(model, cluster, base.with_(recompute="none"))
    full = estimate(model, cluster, base.with_(recompute="full"))
    zero = estimate(model, cluster, base.with_(recompute="full", recompute_layers_per_stage=(0, 0, 0, 0)))
    every = estimate(model, cluster, base.with_(recompute="full", recompute_layers_per_stage=(8, 8, 8, 8)))
    assert zero.step_time_s == pytest.approx(none.step_time_s)
    assert zero.peak_memory_bytes == pytest.approx(none.peak_memory_bytes)
    assert every.step_time_s == pytest.approx(full.step_time_s)
    mixed = estimate(model, cluster, base.with_(recompute="full", recompute_layers_per_stage=(8, 4, 0, 0)))
    assert mixed.stages[0].recompute_s > mixed.stages[1].recompute_s > mixed.stages[2].recompute_s == 0.0
    assert mixed.stages[0].memory_bytes["activations"] < zero.stages[0].memory_bytes["activations"]


def test_per_stage_recompute_validity_and_json_roundtrip():
    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    cfg = RunConfig(num_gpus=16, tp=2, pp=4, global_batch_size=64, recompute="full",
                    layers_per_stage=(7, 9, 9, 7), recompute_layers_per_stage=(3, 2, 1, 0))
    assert not config_problems(model, cluster, cfg)
    assert config_problems(model, cluster, cfg.with_(recompute_layers_per_stage=(1, 2, 3)))
    assert config_problems(model, cluster, cfg.with_(recompute_layers_per_stage=(8, 0, 0, 0)))  # 8 > 7 layers
    assert config_problems(model, cluster, cfg.with_(recompute="selective"))
    d = config_fields(model, cfg)
    assert d["recompute"]["layers_per_stage"] == [3, 2, 1, 0]
    assert config_from_dict(d) == cfg


def test_virtual_stages_that_do_not_divide_get_a_valid_split(big):
    """126 layers over 16 x 2 V-placed chunks: without an explicit split the chunks are as even as possible (30 of 4
    layers, two of 3: config.even_layer_split, which Megatron's --pipeline-model-parallel-layout can spell); the
    partition supplies a valid split of its own."""
    model, cluster = big
    cfg = cfg_405b(micro_batch_size=1, schedule="zbv", vpp=2)
    assert not config_problems(model, cluster, cfg)
    chunks = [n for st in estimate(model, cluster, cfg).stages for n in st.layers]
    assert sorted(chunks)[:2] == [3, 3] and set(sorted(chunks)[2:]) == {4}
    out = partition(model, cluster, cfg)
    assert not config_problems(model, cluster, out)
    e = estimate(model, cluster, out)
    assert e.fits and sum(out.layers_per_stage) == 126 and len(out.layers_per_stage) == 32
    # the V puts the embedding (stage 0) and the LM head (stage 31) on rank 0
    assert e.stages[0].layers == (out.layers_per_stage[0], out.layers_per_stage[31])


def test_moe_with_dense_prefix_is_partitioned_by_layer_type():
    """DeepSeek-V3's first 3 layers are dense (cheap, light), the other 58 MoE: the DP costs each stage by the
    types of the layers it would hold, so the split fits and beats the best uniform recomputation."""
    model, cluster = load_model("deepseek-v3"), load_cluster("h800-80gb-sxm")
    cfg = RunConfig(num_gpus=2048, tp=1, pp=16, ep=64, global_batch_size=3840, seq_len=4096, recompute="none")
    assert not estimate(model, cluster, cfg).fits
    out = partition(model, cluster, cfg)
    e = estimate(model, cluster, out)
    assert e.fits and not config_problems(model, cluster, out)
    uniform = best_uniform_recompute(model, cluster, cfg)
    assert e.step_time_s < estimate(model, cluster, uniform).step_time_s


@settings(max_examples=15, deadline=None)
@given(pp=st.sampled_from([2, 4]), tp=st.sampled_from([1, 2]), mbs=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([2048, 8192]), recompute=st.sampled_from(["none", "selective", "full"]),
       sched=st.sampled_from(["1f1b", "zb-h1", "interleaved-1f1b", "gpipe"]))
def test_partition_never_returns_something_worse(pp, tp, mbs, seq, recompute, sched):
    """Property: the result is valid; when it differs from the input it fits and is faster (or the input did
    not fit)."""
    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    vpp = 2 if sched == "interleaved-1f1b" else 1
    cfg = RunConfig(num_gpus=8 * pp * tp, tp=tp, pp=pp, vpp=vpp, global_batch_size=64 * pp, micro_batch_size=mbs,
                    seq_len=seq, recompute=recompute, schedule=sched)
    if config_problems(model, cluster, cfg):
        assert partition(model, cluster, cfg) is cfg
        return
    out = partition(model, cluster, cfg)
    assert not config_problems(model, cluster, out)
    if out != cfg:
        before, after = estimate(model, cluster, cfg), estimate(model, cluster, out)
        assert after.fits
        assert not before.fits or after.step_time_s < before.step_time_s
        assert sum(out.layers_per_stage) == model.num_layers


def test_tighter_memory_budget_is_honoured(big):
    model, cluster = big
    cfg = cfg_405b(micro_batch_size=1)  # fits the GPU as is (73.7 GiB of 76.6)
    budget = 60 * 2**30
    out = partition(model, cluster, cfg, memory_limit_bytes=budget)
    assert out != cfg
    assert estimate(model, cluster, out).peak_memory_bytes <= budget
    assert partition(model, cluster, cfg, memory_limit_bytes=1e9) is cfg  # nothing fits 1 GB: input unchanged


def test_search_partitions_under_the_users_memory_cap():
    """With --max-memory-gib the partition DP plans to that cap (not to the GPU's own memory, whose proposals
    the search would then reject as over the cap): Llama-3.1-70B on 64 H100s at 28 GiB gains per-stage
    recomputation that the even split cannot have (at 40 GiB until 2026-12-07, when ZeRO-2 / 3 under pipeline stages
    began holding its gradients unsharded, as FSDP2 under torch.distributed.pipelining does, and the plans that had
    needed it no longer fit)."""
    from planner.search.engine import search
    from planner.search.space import SearchSpace

    model, cluster = load_model("llama-3.1-70b"), load_cluster("h100-80gb-sxm")
    kw = dict(top=0, max_memory_gib=28, space=SearchSpace(max_cp=1))
    even = search(model, cluster, 64, 256, 4096, refine_partition=False, **kw).best
    res = search(model, cluster, 64, 256, 4096, **kw)
    assert res.stats["partitions_improved"] >= 1 and res.best.config.recompute_layers_per_stage is not None
    assert res.best.estimate.step_time_s < even.estimate.step_time_s
    assert res.best.estimate.peak_memory_bytes <= 28 * 2**30
