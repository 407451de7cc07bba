"""torchtitan's per-op selective activation checkpointing (recompute modules "op_sac", torchtitan 0.3, and
"op_sac_v02", torchtitan 0.2): what each re-runs and keeps, pinned to torchtitan's policy
(torchtitan/distributed/activation_checkpoint.py: every second aten.mm re-runs, the attention kernel and the
reduce-scatters are saved, torch._scaled_mm only in 0.3), and that the stack, the CLI, the search and the
exporters carry it."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.cost import comm
from planner.cost.compute import layer_ops, op_sac_shares, recomputed
from planner.cost.memory import activation_bytes_per_layer
from planner.cost.step import layer_costs, tp_regather_s
from planner.cost.validity import recompute_modules_problem
from planner.errors import PlannerError
from planner.export import export
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from planner.specs.stack import load_stack
from planner.validation.compare import evaluate_modern_run, load_modern_runs
from tests.test_export import config_only_plan

H100 = load_cluster("h100-80gb-sxm")
L8B = load_model("llama-3.1-8b")
DSV3 = load_model("deepseek-v3")


def _cfg(modules="op_sac", precision="bf16", **kw):
    base = dict(num_gpus=8, tp=1, seq_len=4096, global_batch_size=8, micro_batch_size=1, sequence_parallel=False,
                recompute="selective", recompute_modules=modules, precision=precision)
    base.update(kw)
    return RunConfig(**base)


def test_llama_block_reruns_wk_wo_and_w3():
    """Llama's block calls wq, wk, wv, wo, w1, w3, w2 (torchtitan's QKVLinear and FeedForward): the policy saves
    the 1st, 3rd, 5th and 7th matmul and re-runs wk, wo and w3 -- a sixth of Llama 3.1 8B's fused QKV op (K is
    1,024 of its 6,144 outputs), the whole out-projection, half of the fused w1 / w3 op, none of w2."""
    shares = op_sac_shares(L8B, _cfg())
    assert float(shares["qkv_proj"][0]) == pytest.approx(1024 / 6144)
    assert float(shares["attn_out_proj"][0]) == 1.0
    assert float(shares["mlp_in"][0]) == 0.5
    assert float(shares["mlp_out"][0]) == 0.0
    ops = layer_ops(L8B, _cfg())
    rerun = sum(o.flops * recomputed(o, "op_sac") for o in ops if o.kind == "gemm")
    tokens, h = 4096, L8B.hidden_size
    expected = 2 * tokens * h * (L8B.kv_dim + h + L8B.ffn_hidden_size)  # wk, wo, w3 forward
    assert rerun == pytest.approx(expected)
    by_name = {o.name: o for o in ops}
    assert recomputed(by_name["attention_core"], "op_sac") == 0.0  # the SDPA output is saved
    for name in ("norms", "residual", "mlp_act", "rope"):
        assert recomputed(by_name[name], "op_sac") == 1.0


@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
def test_fp8_linears_are_saved_in_03_and_rerun_in_02(precision):
    """An fp8 linear layer calls torch._scaled_mm, not aten.mm: 0.3's save set (PyTorch's compute-intensive ops)
    keeps every one's output; 0.2's per-model list lacks it, so every one runs again with its quantization."""
    for modules, share in (("op_sac", 0.0), ("op_sac_v02", 1.0)):
        ops = {o.name: o for o in layer_ops(L8B, _cfg(modules, precision))}
        for name in ("qkv_proj", "attn_out_proj", "mlp_in", "mlp_out", "mlp_in_fp8_cast"):
            assert float(recomputed(ops[name], modules)) == share


def test_what_a_llama_block_keeps():
    """Bytes per token a Llama 3.1 8B block keeps (no TP): its input, the saved matmuls' outputs (wq, wv, w1, w2),
    the attention output and its fp32 log-sum-exp in 16-bit; in fp8 under 0.2 only the input and the attention's
    output; under 0.3 every linear layer's output."""
    h, q, kv, f, heads = 4096, 4096, 1024, 14336, 32
    per_token = {("op_sac", "bf16"): 2 * (h + q + kv + f + h) + 2 * q + 4 * heads,
                 ("op_sac_v02", "fp8"): 2 * h + 2 * q + 4 * heads,
                 ("op_sac", "fp8"): 2 * h + 2 * (q + 2 * kv + h + 2 * f + h) + 2 * q + 4 * heads}
    for (modules, precision), expected in per_token.items():
        got = activation_bytes_per_layer(L8B, _cfg(modules, precision))
        assert got == pytest.approx(4096 * expected)


def test_tp_gathers_run_again():
    """The save list keeps the reduce-scatters' outputs but not the all-gathers': under TP with SP each of a
    transformer layer's two blocks gathers its input again in backward."""
    cfg = _cfg(num_gpus=8, tp=4, sequence_parallel=True)
    groups = comm.groups_for(H100, 4, 1, 2, 1)
    lc = layer_costs(L8B, H100, cfg, groups)
    gather = comm.all_gather_s(H100, groups.tp, 4096 * L8B.hidden_size * 2)
    assert lc.recompute_tp_s == pytest.approx(2 * gather)
    assert float(tp_regather_s(L8B, H100, cfg.with_(tp=1, sequence_parallel=False), groups.tp, 2)) == 0.0
    assert layer_costs(L8B, H100, cfg.with_(recompute_modules="core_attn"), groups).recompute_tp_s == 0.0


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "deepseek-v3", "mixtral-8x7b", "qwen2.5-72b"]),
       precision=st.sampled_from(["bf16", "fp8"]), tp=st.sampled_from([1, 2, 4]), mb=st.sampled_from([1, 2]))
def test_policies_sit_between_no_and_full_recompute(model, precision, tp, mb):
    """Per layer kind: what a policy re-runs lies between nothing and the whole forward, 0.2 re-runs at least
    what 0.3 does and keeps at most what 0.3 keeps, and full recomputation keeps less than either."""
    spec = load_model(model)
    ep = 8 if spec.is_moe else 1
    cfg = _cfg(num_gpus=8 * tp, tp=tp, ep=ep, sequence_parallel=tp > 1, precision=precision, micro_batch_size=mb,
               global_batch_size=8 * mb)
    for kind in spec.layer_kinds:
        ops = layer_ops(spec, cfg, kind)
        fwd = sum(o.flops for o in ops)
        again = {m: sum(o.flops * recomputed(o, m) for o in ops) for m in ("op_sac", "op_sac_v02")}
        assert 0.0 <= again["op_sac"] <= again["op_sac_v02"] <= fwd + 1e-6
        kept = {m: float(activation_bytes_per_layer(spec, cfg.with_(recompute_modules=m), kind=kind))
                for m in ("op_sac", "op_sac_v02")}
        full = float(activation_bytes_per_layer(spec, cfg, "full", kind))
        assert full < kept["op_sac_v02"] <= kept["op_sac"]


def test_validity_refuses_mixing_and_prices_transformer_blocks_only():
    """A policy stands alone; on a model with Mamba or cross-attention layers (which torchtitan does not train)
    those layers re-run and drop nothing under it, the transformer blocks as torchtitan runs them."""
    assert "alone" in recompute_modules_problem(L8B, "core_attn,op_sac")
    assert recompute_modules_problem(DSV3, "op_sac_v02") is None
    hybrid = load_model("nemotron-h-56b")
    assert recompute_modules_problem(hybrid, "op_sac") is None
    cfg = _cfg(num_gpus=8, seq_len=4096)
    for kind in hybrid.layer_kinds:
        kept = activation_bytes_per_layer(hybrid, cfg, kind=kind)
        if kind.mixer == "attention":
            assert kept < activation_bytes_per_layer(hybrid, cfg, "none", kind)
        else:
            assert kept == activation_bytes_per_layer(hybrid, cfg, "none", kind)
            assert all(recomputed(o, "op_sac") == 0.0 for o in layer_ops(hybrid, cfg, kind))


def test_the_torchtitan_stack_prices_its_policy():
    """--stack torchtitan with --recompute selective prices 0.2's per-op policy (the release its launcher writes)
    unless --recompute-modules says otherwise; the plan JSON records it."""
    assert load_stack("torchtitan").recompute_modules == "op_sac_v02"
    assert load_stack("megatron-core").recompute_modules == "core_attn"
    from planner.cli.listing import stack_rows
    assert "selective recompute op_sac_v02" in next(r for r in stack_rows() if r["name"] == "torchtitan")["options"]
    runner = CliRunner()
    base = ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--stack", "torchtitan", "--gpus",
            "8", "--global-batch", "16", "--micro-batch", "2", "--seq-len", "8192", "--zero", "3", "--json"]
    sel = json.loads(runner.invoke(app, base + ["--recompute", "selective"]).stdout)
    assert sel["recompute"]["modules"] == ["op_sac_v02"]
    none = json.loads(runner.invoke(app, base + ["--recompute", "none"]).stdout)
    assert sel["estimate"]["step_time_s"] > none["estimate"]["step_time_s"]
    refused = runner.invoke(app, base + ["--recompute", "none", "--recompute-modules", "op_sac"])
    assert refused.exit_code != 0 and "--recompute selective" in refused.output


def test_exporters_run_only_their_own_policy():
    """torchtitan 0.2 writes op_sac_v02 (and 0.3's policy where the two agree, 16-bit), torchtitan 0.3 op_sac;
    Megatron-LM and Megatron-Bridge refuse a plan priced with either."""
    plan = config_only_plan(num_gpus=64, tp=8, global_batch_size=64, seq_len=8192, recompute="selective",
                            recompute_modules="op_sac_v02")
    assert 'selective_ac_option = "op"' in export(plan, "torchtitan").text
    assert "SelectiveAC" in export({**plan, "recompute": {**plan["recompute"], "modules": ["op_sac"]}},
                                   "torchtitan-0.3").text
    for target in ("megatron", "nemo"):
        with pytest.raises(PlannerError, match="per-op"):
            export(plan, target)
    fp8 = config_only_plan(num_gpus=64, tp=8, global_batch_size=64, seq_len=8192, recompute="selective",
                           recompute_modules="op_sac", precision="fp8")
    with pytest.raises(PlannerError, match="torchtitan-0.3"):
        export(fp8, "torchtitan")
    megatron_priced = config_only_plan(num_gpus=64, tp=8, global_batch_size=64, seq_len=8192, recompute="selective")
    assert any("--recompute-modules op_sac" in n for n in export(megatron_priced, "torchtitan-0.3").notes)
    with pytest.raises(PlannerError, match="op_sac_v02"):
        export({**megatron_priced, "recompute": {**megatron_priced["recompute"], "modules": ["layernorm"]}},
               "torchtitan")


def test_torchtitan_h200_rows_read_within_5pct():
    """The two torchtitan fp8 FSDP rows on H200 (Trainy, torchtitan e7c0cae: 0.2's policy, fp8 linears re-run)
    through op_sac_v02: +2.5% and +4.1% (written as Megatron's mlp,layernorm before, +6.1% / +7.8%)."""
    rows = [evaluate_modern_run(r) for r in load_modern_runs() if r["id"].startswith("TT-H200")]
    assert len(rows) == 2 and all("op_sac_v02" in r.command for r in rows)
    assert np.allclose([r.error for r in rows], [0.0246, 0.0414], atol=0.003)


def test_the_block_being_rerun_is_a_transient():
    """While a block runs again in backward it holds what its policy did not keep: a rank without the LM head
    charges that (the layer's activations without recomputation, less what it saved) as workspace."""
    from planner.cost.step import estimate
    l70 = load_model("llama-3.1-70b")
    cfg = _cfg(num_gpus=64, tp=8, pp=2, sequence_parallel=True, global_batch_size=64, micro_batch_size=1)
    first = estimate(l70, H100, cfg).stages[0]
    kind = l70.layer_kinds[0]
    rerun = activation_bytes_per_layer(l70, cfg, "none", kind) - activation_bytes_per_layer(l70, cfg, kind=kind)
    assert first.memory_bytes["workspace"] >= rerun > 0
    assert estimate(l70, H100, cfg.with_(recompute_modules="core_attn")).stages[0].memory_bytes["workspace"] < rerun
