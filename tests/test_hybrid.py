"""Hybrid Mamba-2 / attention / MLP / MoE models (Nemotron-H, Nemotron 3): the layer pattern, the Mamba-2 mixer's
parameters, kernels, activations and communication, the search over them and the partition balancing their
unequal layers, the launch configs and the published runs they are checked on."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.cost import comm
from planner.cost.compute import layer_ops, ssd_traffic
from planner.cost.context_parallel import mamba_cp_cost
from planner.cost.memory import activation_bytes_per_layer, active_params, layer_params, mamba_params, total_params
from planner.cost.step import estimate, layer_costs, tp_layer_comm_s
from planner.cost.validity import config_problems
from planner.errors import PlannerError
from planner.plan import plan_dict, search_plans
from planner.search.space import SearchSpace
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import HYBRID_SYMBOLS, load_model, model_from_config
from tests.test_layer_kinds import assert_search_is_exact

H100 = load_cluster("h100-80gb-sxm")
NANO = load_model("nemotron-3-nano-30b-a3b")
NH56 = load_model("nemotron-h-56b")
MAMBA, ATTENTION, MLP, MOE = (HYBRID_SYMBOLS[c] for c in "M*-E")


def test_the_pattern_gives_each_layer_its_kind_and_the_counts_match_the_published_ones():
    """Nemotron 3 Nano: 23 Mamba-2, 23 MoE and 6 attention layers; 31.6B parameters, 3.6B active per token with the
    embeddings (NVIDIA's Nemotron 3 Nano model card: 31.6B total, 3.2B active, 3.6B including embeddings; the
    3.2B leaves out the input embedding, 0.35B). Nemotron-H-56B (Nemotron-H paper, 2025): 56B."""
    assert NANO.layer_kinds == (MAMBA, ATTENTION, MOE)
    counts = [NANO.kind_index.count(k) for k in range(3)]
    assert counts == [23, 6, 23] and NANO.num_moe_layers == 23
    assert total_params(NANO) == pytest.approx(31.6e9, rel=0.02)
    assert active_params(NANO) == pytest.approx(3.6e9, rel=0.02)
    assert active_params(NANO) - NANO.vocab_size * NANO.hidden_size == pytest.approx(3.2e9, rel=0.02)
    assert NH56.layer_kinds == (MAMBA, ATTENTION, MLP) and not NH56.is_moe
    assert total_params(NH56) == pytest.approx(56e9, rel=0.02)
    # the partition's probes keep the model's kinds and their indices
    assert NANO.uniform(2).layer_kinds == NANO.layer_kinds and set(NANO.uniform(2).kind_index) == {2}


def test_a_mamba_layer_counted_weight_by_weight():
    """megatron/core/ssm/mamba_mixer.py: in-projection h x (2d + 2GN + H), convolution kernel + bias over d + 2GN
    channels, A_log, D and dt_bias per head, the gated norm's d and the out-projection d x h; plus the layer's
    pre-norm (h)."""
    h, d, GN, H = 2688, 64 * 64, 8 * 128, 64
    mixer = h * (2 * d + 2 * GN + H) + (d + 2 * GN) * (4 + 1) + 3 * H + d + d * h
    assert mixer == 38_742_208
    assert mamba_params(NANO) == mixer
    assert layer_params(NANO, MAMBA) == mixer + h


def test_ssd_kernel_traffic_by_hand():
    """Per token, Nemotron 3 Nano's mixer (H 64 heads of P 64, N 128, G 8, Q 128): d = 4096, chunk states S =
    HPN/Q = 4096, GN = GQ = 1024. Forward 26H + 8GN + 10d + 12S + 8GQ = 108,160 B; backward 76H + 30GN + 34d + 26S +
    24GQ = 305,920 B; FLOPs forward 4dN + 2dQ + 2GQN = 3,407,872, backward 10dN + 6dQ + 6GQN = 9,175,040
    (ssd_traffic's kernel lists)."""
    t = ssd_traffic(NANO)
    assert (t.fwd_bytes, t.bwd_bytes, t.fwd_flops, t.bwd_flops) == (108_160, 305_920, 3_407_872, 9_175_040)


def test_the_ssd_scan_runs_at_the_profiles_kernel_rate_where_it_has_one():
    """With ``GPU.ssd_scan_flops`` the scan takes the slower of its FLOPs at that rate and its bytes at the
    memory-bound efficiency, forward and backward by their own FLOPs and bytes; without it, the roofline of the
    tensor cores and HBM. H100's fitted 35 TFLOP/s puts a Nano layer's scan (8,192 tokens) at 3,407,872 x 8,192 /
    35e12 = 0.80 ms forward and 9,175,040 x 8,192 / 35e12 = 2.15 ms backward, where its bytes need 0.37 / 1.04 ms;
    a power-capped part runs it at its sustained share of the clocks, as every tensor-core kernel."""
    from dataclasses import replace

    from planner.cost.compute import op_bwd_time_s, op_time_s
    from planner.specs.hardware import load_cluster

    gpu = load_cluster("h100-80gb-sxm").gpu
    assert gpu.ssd_scan_flops == pytest.approx(35e12)
    scan = next(o for o in layer_ops(NANO, RunConfig(num_gpus=8, seq_len=8192, global_batch_size=8), MAMBA)
                if o.name == "mamba_ssd")
    fwd = float(op_time_s(scan, gpu))
    assert fwd == pytest.approx(3_407_872 * 8192 / 35e12)
    assert float(op_bwd_time_s(scan, gpu, fwd)) == pytest.approx(9_175_040 * 8192 / 35e12)
    capped = load_cluster("h100-96gb-hbm2e").gpu  # the same die under a 500 W cap: the carried rate at its share
    assert capped.ssd_scan_flops == gpu.ssd_scan_flops and capped.sustained_tensor_ratio < 1
    assert float(op_time_s(scan, capped)) == pytest.approx(fwd / capped.sustained_tensor_ratio)
    roofline = replace(gpu, ssd_scan_flops=0.0)  # bytes-bound at the tensor cores' rate
    by_bytes = 108_160 * 8192 / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_bound_efficiency)
    assert float(op_time_s(scan, roofline)) == pytest.approx(by_bytes)
    assert float(op_bwd_time_s(scan, roofline, by_bytes)) == pytest.approx(by_bytes * 305_920 / 108_160)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_mamba_kernels_split_over_tp_by_heads(tp):
    cfg = RunConfig(num_gpus=8, tp=tp, seq_len=8192, global_batch_size=8, sequence_parallel=tp > 1)
    ops = {o.name: o for o in layer_ops(NANO, cfg, MAMBA)}
    T, h, d, GN, H = 8192, 2688, 4096, 1024, 64
    assert float(ops["mamba_in_proj"].flops) == pytest.approx(2 * T * h * (2 * d + 2 * GN + H) / tp)
    assert float(ops["mamba_out_proj"].flops) == pytest.approx(2 * T * d * h / tp)
    assert float(ops["mamba_ssd"].hbm_bytes) == pytest.approx(108_160 * T / tp)
    assert ops["mamba_ssd"].bwd_ratio == pytest.approx(305_920 / 108_160)
    assert "attention_core" not in ops and "mlp_in" not in ops  # a Mamba layer holds nothing else
    mlp = {o.name for o in layer_ops(NH56, cfg, MLP)}
    assert {"mlp_in", "mlp_out"} <= mlp and not mlp & {"qkv_proj", "attention_core", "mamba_in_proj"}
    assert "rope" not in {o.name for o in layer_ops(NANO, cfg, ATTENTION)}  # Nemotron-H: no position embeddings


def test_a_hybrid_layer_pays_one_blocks_tp_collectives():
    cfg = RunConfig(num_gpus=8, tp=8, seq_len=8192, global_batch_size=8, sequence_parallel=True,
                    tp_comm_overlap=False)
    groups = comm.groups_for(H100, 8, 1, 1, 1)
    one = tp_layer_comm_s(NANO, H100, cfg, groups.tp, [(0.0, 0.0)])
    two = tp_layer_comm_s(NANO, H100, cfg, groups.tp, [(0.0, 0.0), (0.0, 0.0)])
    assert float(one[0]) == pytest.approx(float(two[0]) / 2) and float(one[1]) == pytest.approx(float(two[1]) / 2)
    lc = layer_costs(NANO, H100, cfg, groups, MAMBA)
    assert float(lc.tp_fwd_s) == pytest.approx(float(one[0]))


def test_mamba_layer_activations_by_hand():
    """bf16, TP 1, no SP, no recomputation, per token: the layer input and the norm output (2h + 2h), the
    in-projection output z x B C dt kept by mamba_split_conv1d_scan_combined (2 (2d + 2GN + H)), the scan's raw
    output, the gated norm's input and the out-projection's input (2d each): 55,936 B; full recomputation keeps
    the input (2h)."""
    cfg = RunConfig(num_gpus=8, seq_len=8192, global_batch_size=8)
    h, d, GN, H = 2688, 4096, 1024, 64
    per_token = 4 * h + 2 * (2 * d + 2 * GN + H) + 6 * d
    assert per_token == 55_936
    assert float(activation_bytes_per_layer(NANO, cfg, "none", MAMBA)) == pytest.approx(8192 * per_token)
    assert float(activation_bytes_per_layer(NANO, cfg, "full", MAMBA)) == pytest.approx(8192 * 2 * h)
    # fp8: the two linear inputs as Transformer Engine keeps them (1 B each)
    fp8 = float(activation_bytes_per_layer(NANO, cfg.with_(precision="fp8"), "none", MAMBA))
    assert fp8 == pytest.approx(8192 * (per_token - h - d))


def test_context_parallelism_of_a_mamba_layer_is_two_all_to_alls_each_way():
    cfg = RunConfig(num_gpus=8, cp=8, seq_len=8192, global_batch_size=8)
    groups = comm.groups_for(H100, 1, 8, 1, 1)
    cost = mamba_cp_cost(NANO, H100, cfg, groups.cp)
    T, d, GN, H = 1024, 4096, 1024, 64
    into, out = T * (2 * d + 2 * GN + H) * 2, T * d * 2
    expected = comm.all_to_all_s(H100, groups.cp, into) + comm.all_to_all_s(H100, groups.cp, out)
    assert float(cost.fwd_exposed_s) == pytest.approx(float(expected))
    assert float(cost.bwd_exposed_s) == pytest.approx(float(expected))
    assert float(cost.fwd_bytes) == pytest.approx(7 / 8 * (into + out))
    assert float(mamba_cp_cost(NANO, H100, cfg.with_(cp=1, num_gpus=1), groups.cp).fwd_exposed_s) == 0.0
    # MLP and MoE layers exchange nothing over CP
    assert float(layer_costs(NANO, H100, cfg, groups, MOE).cp_fwd_s) == 0.0


def test_validity_follows_the_mamba_mixers_divisibility():
    """MambaMixer asserts heads and groups divisible by TP; Mamba context parallelism heads per TP rank divisible
    by cp and groups per TP rank divisible by cp or dividing it (replicated)."""
    ok = RunConfig(num_gpus=64, tp=8, cp=8, seq_len=8192, global_batch_size=8)
    assert not config_problems(NANO, H100, ok)  # 1 group per TP rank, replicated over cp 8; 8 heads
    assert not config_problems(NANO, H100, ok.with_(tp=1, cp=64))  # 64 heads, 8 groups dividing 64
    problems = dict(config_problems(NANO, H100, ok.with_(tp=4, cp=16)))  # 16 heads per TP rank over cp 16: fine,
    assert "cp" not in problems  # 2 groups dividing 16
    problems = dict(config_problems(NANO, H100, ok.with_(tp=8, cp=16, num_gpus=128)))  # 8 heads per TP rank
    assert "Mamba" in problems["cp"]
    bad = NANO.with_(mamba_groups=3, mamba_heads=63)
    assert "tp" in dict(config_problems(bad, H100, RunConfig(num_gpus=2, tp=2, seq_len=8192,
                                                                global_batch_size=2)))


def _config(**changes):
    base = json.loads((NANO_PATH).read_text())
    base.update(changes)
    return base


NANO_PATH = __import__("pathlib").Path(__file__).resolve().parents[1] / "model_specs" / "nemotron-3-nano-30b-a3b.json"


@pytest.mark.parametrize("changes, field", [
    ({"hybrid_override_pattern": "ME*"}, "hybrid_override_pattern"),
    ({"hybrid_override_pattern": "MEX" * 17 + "M"}, "hybrid_override_pattern"),
    ({"n_groups": 5}, "n_groups"),
    ({"num_nextn_predict_layers": 2}, "num_nextn_predict_layers"),
    ({"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
    ({"moe_shared_expert_intermediate_size": 1000}, "moe_shared_expert_intermediate_size"),
])
def test_bad_hybrid_configs_are_refused_with_the_field(changes, field):
    with pytest.raises(PlannerError) as e:
        model_from_config(_config(**changes), source="config.json")
    assert e.value.field == field


SMALL = model_from_config(_config(hidden_size=1024, num_hidden_layers=8, hybrid_override_pattern="ME*EMEME",
                                  mamba_num_heads=32, n_routed_experts=16, moe_intermediate_size=512,
                                  moe_shared_expert_intermediate_size=1024, num_experts_per_tok=2,
                                  intermediate_size=512, num_attention_heads=16, num_key_value_heads=4,
                                  head_dim=64, vocab_size=32768))


def test_search_is_exact_over_hybrid_layers():
    """Brute force over every row of a small hybrid space = the search's best, and the pruning floors hold."""
    space = SearchSpace(partial_recompute=False, tp_values=(1, 2), schedules=("1f1b", "interleaved-1f1b"),
                        zero_stages=(1,), hsdp_node_spans=())
    cfgs = assert_search_is_exact(SMALL, 8, 16, 8192, space)
    assert any(c.pp > 1 for c in cfgs) and any(c.ep > 1 for c in cfgs)


def test_partition_balances_mamba_attention_and_moe_layers():
    """Nemotron 3 Nano at 128K on 64 H100 as TP 1, PP 4, CP 4 (1F1B, ZeRO-1, fp8): its six attention layers carry
    the long context's quadratic work, so the partition DP gives the stages holding two of them fewer layers and
    the last stage, with one attention layer and the LM head, the most: 5.72 s against 6.29 s for the even split
    by layer count (1.10x; numbers of this model, 2026-12-07, with the SSD kernels' rate; 5.56 / 6.15 s before)."""
    space = SearchSpace(pp_values=(4,), tp_values=(1,), cp_values=(4,), schedules=("1f1b",), zero_stages=(1,),
                        precision="fp8")
    even = search_plans(NANO, H100, 64, 16, 131072, top_k=0, space=space, refine_partition=False)
    part = search_plans(NANO, H100, 64, 16, 131072, top_k=0, space=space)
    split = part.config.layers_per_stage
    assert split is not None and sum(split) == 52
    assert part.estimate.step_time_s < 0.93 * even.estimate.step_time_s
    starts = np.cumsum((0,) + split)[:-1]
    attention = [NANO.layer_pattern[a:a + n].count("*") for a, n in zip(starts, split)]
    assert split[-1] == max(split) and attention[-1] == min(attention)
    assert all(n < split[-1] for n, a in zip(split, attention) if a == max(attention))


def test_launch_configs_of_a_hybrid_plan():
    """Megatron-LM: pretrain_hybrid.py with --hybrid-layer-pattern split by '|' into the pp x vpp chunks (Megatron
    derives the split and vpp from the segments and refuses the other split flags with a pattern), the Mamba
    mixer's TransformerConfig fields, squared ReLU, no position embeddings. Megatron-Bridge: the pattern as
    model.hybrid_layer_pattern. torchtitan and DeepSpeed: refused."""
    from planner.export import emit
    from planner.export.megatron import arguments, render
    from planner.export.nemo import overrides

    cfg = RunConfig(num_gpus=64, pp=4, vpp=2, cp=4, ep=8, seq_len=131072, global_batch_size=16, precision="fp8",
                    schedule="interleaved-1f1b", layers_per_stage=(5, 7, 6, 7, 7, 6, 6, 8))
    plan = json.loads(json.dumps(plan_dict(NANO, H100.name, cfg, estimate(NANO, H100, cfg))))
    args = arguments(plan)
    pattern = args[args.index("--hybrid-layer-pattern") + 1]
    segments = pattern.split("|")
    assert "".join(segments) == NANO.layer_pattern
    assert [len(s) for s in segments] == list(plan["layers_per_stage"])
    for flag in ("--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
                 "--num-layers-per-virtual-pipeline-stage"):
        assert flag not in args
    assert args[args.index("--mamba-state-dim") + 1] == "128" and "--squared-relu" in args
    assert args[args.index("--position-embedding-type") + 1] == "none"
    assert "pretrain_hybrid.py" in render(plan)
    assert overrides(plan)["model.hybrid_layer_pattern"] == pattern
    assert "model.pipeline_model_parallel_layout" not in overrides(plan)
    for target in ("torchtitan", "deepspeed"):
        with pytest.raises(PlannerError, match="hybrid"):
            emit(plan, target)


def test_the_ssd_rate_is_fitted_on_a_dense_hybrid_and_checked_on_nemotron_3_nano():
    """The Mamba-2 SSD kernels' rate (``gpu.ssd_scan_tflops``, 2026-12-07) is fitted on the seven Nemotron-H 56B rows
    of NVIDIA's DGX Cloud Benchmarking 25.05 (H100, fp8, TP 8, 32-2048 GPUs; a hybrid without experts): 35 TFLOP/s,
    in-sample within 4%, where at the bytes' roofline they read +9% to +15%. Carried to Blackwell, it is checked by
    the 17 Nemotron 3 Nano rows, which no fit sees: the twelve Blackwell rows (B200, GB200, B300, GB300), +25% to +45%
    at the roofline, read within 6%; the five H100 rows (Megatron-Bridge fp8, NeMo AutoModel bf16), -10% to -14% at
    the roofline, read -15% to -19%: the SSD is not what they miss (the README's Nemotron paragraph)."""
    from planner.specs.hardware import load_cluster
    from planner.validation.compare import evaluate_modern_run, load_modern_runs
    from planner.validation.fit import SSD_CARRIED, fitted_row_ids, ssd_fitting_rows

    fitting = ssd_fitting_rows("h100-80gb-sxm")
    assert len(fitting) == 7 and {r["id"] for r in fitting} <= fitted_row_ids()
    assert all(r["model"] == "nemotron-h-56b" and r["layout"]["tp"] == 8 for r in fitting)
    assert all(abs(evaluate_modern_run(r).error) < 0.04 for r in fitting)
    for name in SSD_CARRIED:
        assert load_cluster(name).gpu.ssd_scan_flops == load_cluster("h100-80gb-sxm").gpu.ssd_scan_flops
    every = [r for r in load_modern_runs() if "Nemotron3Nano" in r["id"]]
    assert len(every) == 17 and all(r["held_out"] for r in every)
    assert not {r["id"] for r in every} & fitted_row_ids()
    errors = {r["id"]: evaluate_modern_run(r).error for r in every}
    blackwell = [i for i, r in zip(errors, every) if r["gpu"] != "H100"]
    assert len(blackwell) == 12 and all(abs(errors[i]) < 0.06 for i in blackwell), errors
    h100 = [i for i in errors if i not in blackwell]
    assert len(h100) == 5 and all(-0.19 < errors[i] < -0.14 for i in h100), errors
    first = next(r for r in every if r["id"] == "MB2606-H100-Nemotron3Nano-fp8")
    assert first["layout"]["recompute_modules"] == "core_attn,layernorm,moe,moe_act"  # as its recipe ran it
    assert all("hybrid (Mamba)" in evaluate_modern_run(r).groups for r in every)

def test_the_ssd_rate_is_listed_and_refused_in_one_line_when_malformed(tmp_path):
    """`planner list clusters --json` gives each profile's SSD kernel rate (None where it has none: the roofline);
    a profile whose ``gpu.ssd_scan_tflops`` is not an object with a positive value is refused naming the field."""
    import json

    from typer.testing import CliRunner

    from planner.cli.app import app
    from planner.errors import PlannerError
    from planner.specs.hardware import hardware_profiles_dir, load_cluster

    listed = {c["name"]: c for c in json.loads(CliRunner().invoke(app, ["list", "clusters", "--json"]).stdout)
              if "ssd_scan_tflops" in c}
    assert listed["h100-80gb-sxm"]["ssd_scan_tflops"] == listed["gb200-nvl72"]["ssd_scan_tflops"] == 35.0
    assert listed["a100-80gb-sxm"]["ssd_scan_tflops"] is None
    data = json.loads((hardware_profiles_dir() / "h100-80gb-sxm.json").read_text())
    for bad in (35, {"value": 0}, {"value": "fast"}):
        data["gpu"]["ssd_scan_tflops"] = bad
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data))
        with pytest.raises(PlannerError, match="ssd_scan_tflops"):
            load_cluster(str(path))
