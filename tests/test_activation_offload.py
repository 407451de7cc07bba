"""Activation offloading for any pipeline layout (issue 16 part 3): Megatron-Core's fine-grained activation
offloading (``offload_modules``) costed per layer, searched beside plans without it, shown with its host traffic,
never free, and exported to Megatron-LM / Megatron-Bridge (other launchers refuse)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.memory import offloaded_bytes_per_layer
from planner.cost.step import LAYER_COSTS, _estimate_cached, estimate
from planner.cost.validity import config_problems
from planner.plan import search_plans
from planner.schema import validate_plan_json
from planner.search.engine import search
from planner.search.space import SearchSpace, build_space
from planner.specs.config import RunConfig
from planner.specs.hardware import cluster_variant, load_cluster
from planner.specs.model import load_model

runner = CliRunner()
H100 = load_cluster("h100-80gb-sxm")
L8 = load_model("llama-3.1-8b")
ALL = "attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm"
#: Llama-3.1-8B on 16 H100 at 16K tokens, TP 1 (a user's constraint), Megatron-Core's ZeRO-1 and 1F1B schedules
TIGHT = dict(tp_values=(1,), cp_values=(1,), zero_stages=(1,), schedules=("1f1b", "interleaved-1f1b"))


def test_offloaded_bytes_by_hand():
    """Llama-3.1-8B, TP 2 with SP, 4096 tokens, bf16, all five dense modules: per token the layer input and the MLP
    norm's input 2h each and the QKV input 2h, split by SP (6 x 4096 / 2), Q, K, V 2(4096 + 1024 + 1024) / 2, the
    attention output 2 x 4096 / 2."""
    cfg = RunConfig(num_gpus=2, tp=2, seq_len=4096, offload_modules=ALL)
    per_token = 6 * 4096 / 2 + 2 * (4096 + 2 * 1024) / 2 + 2 * 4096 / 2
    assert float(offloaded_bytes_per_layer(L8, cfg)) == pytest.approx(4096 * per_token)
    assert float(offloaded_bytes_per_layer(L8, cfg.with_(offload_modules="core_attn"))) == \
        pytest.approx(4096 * 2 * (4096 + 2048) / 2)
    assert float(offloaded_bytes_per_layer(L8, cfg.with_(offload_modules=""))) == 0.0


def test_memory_and_traffic_of_a_pipeline_rank():
    """PP 4, 1F1B: rank 0 holds 4 micro-batches in flight; offloading takes each one's offloaded bytes off the
    device, keeping one layer's in transit each way (workspace); the traffic is the rank's layers' bytes."""
    cfg = RunConfig(num_gpus=8, tp=2, pp=4, seq_len=4096, global_batch_size=16, recompute="selective")
    base, off = estimate(L8, H100, cfg), estimate(L8, H100, cfg.with_(offload_modules=ALL))
    per_layer = float(offloaded_bytes_per_layer(L8, cfg.with_(offload_modules=ALL)))
    r0, o0 = base.stages[0], off.stages[0]
    assert o0.offload_bytes == pytest.approx(8 * per_layer)  # 8 layers on rank 0
    assert o0.inflight_microbatches == 4
    assert o0.memory_bytes["activations"] == pytest.approx(r0.memory_bytes["activations"] - 4 * 8 * per_layer)
    assert o0.memory_bytes["workspace"] >= 2 * per_layer
    assert o0.host_memory_bytes == pytest.approx(4 * 8 * per_layer)
    assert off.peak_memory_bytes < base.peak_memory_bytes


def test_a_slow_host_link_exposes_the_copies_by_hand():
    """At 1 GB/s a layer's copy outlasts its forward and backward: the step pays copy - window per layer and
    direction, so offloading is never free; its time is bounded below by the copies compute cannot hide."""
    slow = cluster_variant("h100-80gb-sxm", {"host_link.bandwidth_gb_s": 1})
    cfg = RunConfig(num_gpus=8, tp=8, seq_len=8192, global_batch_size=1, recompute="none", offload_modules=ALL,
                    tp_comm_overlap=True)
    base = estimate(L8, slow, cfg.with_(offload_modules=""))
    e = estimate(L8, slow, cfg)
    per_layer = float(offloaded_bytes_per_layer(L8, cfg))
    copy = per_layer / slow.host_link_bytes_per_s
    st0, b0 = e.stages[0], base.stages[0]
    fwd_layer = (b0.fwd_s - 0) / 32  # upper bound of a layer's forward (the stage also holds the ends)
    assert copy > 10 * fwd_layer  # the link, not compute, sets the pace here
    assert e.breakdown["offload_s"] > 0
    # exposure per layer = copy - that layer's window, each way: at least 2 x 32 x (copy - the stage's F and B)
    assert st0.offload_s >= 2 * 32 * copy - b0.fwd_s - b0.bwd_s
    assert st0.offload_s <= 2 * 32 * copy
    assert e.step_time_s == pytest.approx(base.step_time_s + e.breakdown["offload_s"], rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2, 4]), mb=st.sampled_from([1, 2]),
       seq=st.sampled_from([2048, 8192, 32768]), rec=st.sampled_from(["none", "selective"]),
       mods=st.sampled_from(["core_attn", "core_attn,attn_proj", ALL]), link=st.sampled_from([0.5, 8, 64]))
def test_offloading_never_speeds_a_layout_up_and_never_adds_memory(tp, pp, mb, seq, rec, mods, link):
    cluster = H100 if link == 64 else cluster_variant("h100-80gb-sxm", {"host_link.bandwidth_gb_s": link})
    cfg = RunConfig(num_gpus=tp * pp, tp=tp, pp=pp, micro_batch_size=mb, seq_len=seq, global_batch_size=8 * mb,
                    recompute=rec, tp_comm_overlap=tp > 1)
    base, off = estimate(L8, cluster, cfg), estimate(L8, cluster, cfg.with_(offload_modules=mods))
    assert off.step_time_s >= base.step_time_s * (1 - 1e-12)
    for s_off, s_base in zip(off.stages, base.stages):
        assert s_off.memory_bytes["activations"] <= s_base.memory_bytes["activations"] + 1e-6
        assert s_off.offload_bytes > 0


@pytest.mark.parametrize("change, words", [
    ({"recompute": "full"}, "full recomputation"),
    ({"offload_modules": "attn_proj"}, "together with core_attn"),
    ({"offload_modules": "expert_fc1"}, "MoE modules"),
    ({"recompute_modules": "core_attn,layernorm", "offload_modules": "qkv_linear"}, "layernorm"),
    ({"offload_layers": 2, "pp": 1, "recompute": "none"}, "layer offloading"),
])
def test_validity_refuses_what_megatron_refuses_or_cannot_offload(change, words):
    cfg = RunConfig(num_gpus=8, tp=2, pp=4, seq_len=4096, global_batch_size=16, offload_modules="core_attn")
    if change.get("offload_layers"):
        cfg = cfg.with_(num_gpus=2)
    problems = config_problems(L8, H100, cfg.with_(**change))
    assert any(words in msg for _, msg in problems), problems


def test_search_with_offloading_is_exact_and_matches_estimate():
    """Brute force over every row of a small offloading space = the search's best; the search's cost of its plan
    = estimate() of it, uncached; the space holds no full recomputation."""
    space = SearchSpace(offload_modules=ALL, partial_recompute=False, **TIGHT)
    sp = build_space(L8, H100, 8, 32, 8192, space)
    rows = sp.expand(np.arange(len(sp.groups)))
    cfgs = [sp.config(int(g), int(z), int(r), int(h)) for g, z, r, h in zip(rows.group, rows.zero, rows.rec,
                                                                             rows.hsdp)]
    assert cfgs and all(c.recompute != "full" and c.offload_modules == ALL for c in cfgs)
    fitting = [e.step_time_s for e in (estimate(L8, H100, c, check=False) for c in cfgs) if e.fits]
    res = search(L8, H100, 8, 32, 8192, space=space, top=0, refine_partition=False)
    assert res.best.estimate.step_time_s == pytest.approx(min(fitting), rel=1e-12)
    assert res.stats["bound_violations"] == 0
    LAYER_COSTS.clear()
    _estimate_cached.cache_clear()
    assert estimate(L8, H100, res.best.config).step_time_s == pytest.approx(res.best.estimate.step_time_s, rel=1e-12)


def test_offloading_turns_a_recompute_heavy_plan_into_a_faster_one():
    """Llama-3.1-8B on 16 H100, 16K tokens, TP 1: without offloading the best plan fully recomputes layers; with
    it the best recomputes nothing (PP 2, interleaved) and is faster, its copies hidden under compute."""
    without = search_plans(L8, H100, 16, 64, 16384, top_k=0, space=SearchSpace(**TIGHT))
    with_ = search_plans(L8, H100, 16, 64, 16384, top_k=0, space=SearchSpace(offload_modules=ALL, **TIGHT))
    assert without.config.recompute == "full"
    assert with_.config.recompute != "full" and with_.estimate.fits
    assert with_.estimate.step_time_s < 0.95 * without.estimate.step_time_s
    assert with_.estimate.breakdown["offload_s"] == 0.0
    assert all(s.offload_bytes > 0 for s in with_.estimate.stages)


PLAN = ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16", "--global-batch", "64",
        "--seq-len", "16384", "--tp", "1", "--cp", "1", "--zero", "1", "--schedules", "1f1b,interleaved-1f1b"]


def test_plan_cli_searches_with_and_without_offloading_and_shows_the_traffic():
    r = runner.invoke(app, PLAN + ["--offload-modules", ALL])
    assert r.exit_code == 0, r.output
    assert "activation offload over the host link" in r.stdout and "GiB per micro-batch each way" in r.stdout
    r = runner.invoke(app, PLAN + ["--offload-modules", ALL, "--json"])
    d = json.loads(r.stdout)
    validate_plan_json(d)
    assert d["options"]["offload_modules"] == ALL and d["recompute"]["mode"] != "full"
    assert d["estimate"]["stages"][0]["offload_bytes"] > 0
    # runner-ups come from both searches, ranked together
    times = [d["estimate"]["step_time_s"]] + [a["estimate"]["step_time_s"] for a in d["alternatives"]]
    assert times == sorted(times)


def test_exports_megatron_and_bridge_and_others_refuse(tmp_path):
    from planner.export import emit
    from planner.export.megatron import environment, parse_rendered
    from tests.test_export import MEGATRON_FLAGS

    r = runner.invoke(app, PLAN + ["--offload-modules", ALL, "--json"])
    d = json.loads(r.stdout)
    args = parse_rendered(emit(d, "megatron"))
    i = args.index("--offload-modules")
    assert "--fine-grained-activation-offloading" in args and args[i + 1:i + 6] == ALL.split(",")
    assert {a for a in args if a.startswith("--")} <= MEGATRON_FLAGS | {"--fine-grained-activation-offloading",
                                                                        "--offload-modules"}
    assert environment(d)["NVTE_CPU_OFFLOAD_V1"] == "1"
    bridge = emit(d, "nemo")
    assert "fine_grained_activation_offloading" in bridge and "core_attn" in bridge
    from planner.errors import PlannerError
    for target in ("torchtitan", "torchtitan-0.3"):  # (DeepSpeed refuses the interleaved schedule first)
        with pytest.raises(PlannerError, match="fine-grained activation offloading"):
            emit(d, target)


def test_offloading_on_a_stack_without_it_is_refused():
    r = runner.invoke(app, PLAN + ["--offload-modules", "core_attn", "--stack", "torchtitan"])
    assert r.exit_code != 0 and "--offload-modules" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, PLAN + ["--offload-modules", "bogus"])
    assert r.exit_code != 0 and "unknown offload module" in r.output
