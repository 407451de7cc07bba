"""fp8 parameter all-gather (issue 12 item 2): the sharded optimizer / FSDP gathers the linear layers' weights in
fp8 where the stack keeps them so (Megatron --fp8-param-gather, Megatron-Bridge's fp8 presets; torchtitan's
enable_fsdp_float8_all_gather), bf16 otherwise and for mxfp8 (Megatron-Core gathers MXFP8 weights in bf16)."""

from __future__ import annotations

import json

import pytest

from planner.cost.data_parallel import dp_collectives, dp_groups, gathered_linear_weight_bytes
from planner.cost.step import estimate
from planner.export import emit
from planner.export import megatron, nemo
from planner.plan import config_from_dict, plan_dict
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from planner.specs.stack import load_stack

H100 = load_cluster("h100-80gb-sxm")
L8B = load_model("llama-3.1-8b")


def test_bytes_per_gathered_weight():
    assert float(gathered_linear_weight_bytes("fp8", True)) == 1
    assert float(gathered_linear_weight_bytes("fp8", False)) == 2
    assert float(gathered_linear_weight_bytes("mxfp8", True)) == 2  # gathered in bf16, cast after
    assert float(gathered_linear_weight_bytes("bf16", True)) == 2
    assert [load_stack(s).fp8_param_gather for s in ("megatron-core", "torchtitan", "deepspeed")] == \
        [True, False, False]


def test_the_all_gather_carries_half_the_bytes():
    """Over 8 nodes' DP ring (one GPU per node, NIC-bound) a 1 GB weight buffer gathered at 1 byte per element takes
    half the time of the bf16 one, within the ring's per-step latency (under 2%)."""
    g = dp_groups(H100, 8, 1, 8, 1)[0]
    params = 1e9
    half = dp_collectives(H100, g, g, params, 0.0, 4, weight_bytes=(1, 2)).all_gather_s
    full = dp_collectives(H100, g, g, params, 0.0, 4).all_gather_s
    assert half / full == pytest.approx(0.5, rel=0.02)


def test_estimate_gathers_decoder_weights_in_fp8_and_the_ends_in_bf16():
    """Llama-3.1-8B, ZeRO-1 with nothing overlapped (the all-gather fully exposed), fp8: with the gather in fp8 the
    exposed DP time falls by the decoder layers' half of the weight bytes -- the embedding and LM head (1.05B of
    8.03B parameters) stay bf16, so the gather carries (6.98 x 1 + 1.05 x 2) / (8.03 x 2) = 0.565 of the bf16
    bytes; bf16 runs and ZeRO-0 are unchanged; the plan JSON keeps the setting."""
    cfg = RunConfig(num_gpus=64, tp=1, global_batch_size=64, seq_len=8192, precision="fp8", zero_stage=1,
                    overlap_grad_reduce=False, overlap_param_gather=False)
    on = cfg.with_(fp8_param_gather=True)
    off_est, on_est = estimate(L8B, H100, cfg), estimate(L8B, H100, on)
    dp_off, dp_on = off_est.breakdown["dp_comm_s"], on_est.breakdown["dp_comm_s"]
    g = dp_groups(H100, 1, 1, 64, 1)[0]
    ag_bf16 = dp_collectives(H100, g, g, 8.03e9, 0.0, 2).all_gather_s
    saved = float(dp_off - dp_on)
    assert saved == pytest.approx((1 - 0.565) * float(ag_bf16), rel=0.05)
    bf16 = cfg.with_(precision="bf16")
    assert estimate(L8B, H100, bf16).step_time_s == estimate(L8B, H100, bf16.with_(fp8_param_gather=True)).step_time_s
    zero0 = cfg.with_(zero_stage=0)
    assert estimate(L8B, H100, zero0).step_time_s == estimate(L8B, H100, zero0.with_(fp8_param_gather=True)).step_time_s
    back = config_from_dict(json.loads(json.dumps(plan_dict(L8B, H100.name, on, on_est))))
    assert back.fp8_param_gather is True


def _plan(**kw):
    cfg = RunConfig(num_gpus=64, global_batch_size=64, seq_len=8192, **kw)
    return json.loads(json.dumps(plan_dict(L8B, H100.name, cfg, estimate(L8B, H100, cfg))))


def test_exports_spell_the_fp8_gather():
    """Megatron-LM: --fp8-param-gather with the distributed optimizer (its validate_args refuses it without one),
    and --reuse-grad-buf-for-mxfp8-param-ag with mxfp8 (DistributedDataParallelConfig asks for it); torchtitan:
    [float8] enable_fsdp_float8_all_gather; NeMo: the fp8 presets gather in fp8, so a plan that does not says so."""
    args = megatron.arguments(_plan(precision="fp8", zero_stage=1, fp8_param_gather=True))
    assert "--fp8-param-gather" in args and "--reuse-grad-buf-for-mxfp8-param-ag" not in args
    b200 = load_cluster("b200-180gb")
    cfg = RunConfig(num_gpus=64, global_batch_size=64, seq_len=8192, precision="mxfp8", fp8_param_gather=True)
    mx = json.loads(json.dumps(plan_dict(L8B, b200.name, cfg, estimate(L8B, b200, cfg))))
    assert {"--fp8-param-gather", "--reuse-grad-buf-for-mxfp8-param-ag"} <= set(megatron.arguments(mx))
    assert "--fp8-param-gather" not in megatron.arguments(_plan(precision="fp8", zero_stage=0, fp8_param_gather=True))
    assert "--fp8-param-gather" not in megatron.arguments(_plan(precision="fp8", zero_stage=1))
    text = emit(_plan(precision="fp8", zero_stage=3, fp8_param_gather=True), "torchtitan")
    assert "enable_fsdp_float8_all_gather = true" in text
    assert any("fp8_param_gather" in n for n in nemo.notes(_plan(precision="fp8", zero_stage=1)))
    assert not any("fp8_param_gather" in n for n in nemo.notes(_plan(precision="fp8", zero_stage=1,
                                                                       fp8_param_gather=True)))


def test_search_is_exact_and_its_bounds_hold_with_the_fp8_gather():
    """Brute force over every row of an fp8 FSDP space (ZeRO-1 / ZeRO-3, HSDP shard sizes) with the weights gathered
    in fp8: the search returns the least step time and no row's estimate falls under its bound (the bounds price
    every weight at the fp8 byte, a floor of the estimate's bf16 embedding and head)."""
    import numpy as np

    from planner.search.engine import search
    from planner.search.space import Constraints, SearchSpace, build_space

    space = Constraints(tp=(1,), pp=(1,), cp=(1,), micro_batch=(1,), zero=(1, 3), recompute=("none", "full")).apply(
        SearchSpace(partial_recompute=False, precision="fp8", fp8_param_gather=True))
    sp = build_space(L8B, H100, 256, 256, 8192, space)
    rows = sp.expand(np.arange(len(sp.groups)))
    cfgs = [sp.config(int(g), int(z), int(r), int(h)) for g, z, r, h in zip(rows.group, rows.zero, rows.rec,
                                                                             rows.hsdp)]
    assert all(c.fp8_param_gather and c.precision == "fp8" for c in cfgs)
    fitting = [e.step_time_s for e in (estimate(L8B, H100, c, check=False) for c in cfgs) if e.fits]
    res = search(L8B, H100, 256, 256, 8192, space=space, top=0, refine_partition=False)
    assert res.best.estimate.step_time_s == pytest.approx(min(fitting), rel=1e-12)
    assert res.stats["bound_violations"] == 0
    assert res.best.config.fp8_param_gather
