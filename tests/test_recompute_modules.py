"""Megatron-Core's selective-recompute modules (--recompute-modules): what each drops from the activations, what
it re-runs in backward, and that the CLI, the search, the plan JSON and the exporters carry them."""

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.compute import layer_ops, op_time_s
from planner.cost.memory import activation_bytes_per_layer
from planner.cost.step import estimate, layer_costs
from planner.cost import comm
from planner.errors import PlannerError
from planner.export import export
from planner.plan import config_from_dict, plan_dict
from planner.search.engine import search
from planner.search.space import SearchSpace
from planner.specs.config import RunConfig, canonical_recompute_modules
from planner.specs.hardware import load_cluster
from planner.specs.model import MOE_LAYER, load_model

H100 = load_cluster("h100-80gb-sxm")
L8B = load_model("llama-3.1-8b")
DSV3 = load_model("deepseek-v3")
MIXTRAL = load_model("mixtral-8x7b")


def _cfg(**kw):
    base = dict(num_gpus=8, tp=1, seq_len=4096, global_batch_size=8, micro_batch_size=1, sequence_parallel=False)
    base.update(kw)
    return RunConfig(**base)


def test_names_are_canonical_and_checked():
    assert canonical_recompute_modules("layernorm, core_attn") == "core_attn,layernorm"
    assert canonical_recompute_modules(["moe_act", "mlp"]) == "mlp,moe_act"
    with pytest.raises(ValueError, match="shared_experts"):
        canonical_recompute_modules("core_attn,shared_experts")


@pytest.mark.parametrize("precision,lin", [("bf16", 2.0), ("fp8", 1.0)])
def test_layernorm_drops_both_norm_outputs(precision, lin):
    """'layernorm' discards the outputs of input_layernorm and pre_mlp_layernorm (the QKV and MLP inputs, kept
    as a linear input is: lin bytes per element) and redoes the norms in backward."""
    base = _cfg(precision=precision)
    ln = base.with_(recompute_modules="core_attn,layernorm")
    drop = activation_bytes_per_layer(L8B, base) - activation_bytes_per_layer(L8B, ln)
    assert drop == pytest.approx(4096 * 2 * lin * L8B.hidden_size)
    ops = {o.name: o for o in layer_ops(L8B, ln)}
    extra = layer_costs(L8B, H100, ln, comm.groups_for(H100, 1, 1, 8, 1)).selective_recompute_s
    assert extra == pytest.approx(op_time_s(ops["norms"], H100.gpu))


def test_mlp_checkpoints_a_dense_mlp_and_reruns_it():
    """'mlp' keeps only the dense MLP's input (bf16) and re-runs its forward: SwiGLU's 4f fc1 outputs and the f
    fc2 input go (bf16: 6f per token), the GEMMs and the activation re-run."""
    base = _cfg()
    mlp = base.with_(recompute_modules="core_attn,mlp")
    f = L8B.ffn_hidden_size
    assert activation_bytes_per_layer(L8B, base) - activation_bytes_per_layer(L8B, mlp) == \
        pytest.approx(4096 * 6 * f)
    ops = layer_ops(L8B, mlp)
    rerun = sum(op_time_s(o, H100.gpu) for o in ops if o.name in ("mlp_in", "mlp_out", "mlp_act"))
    lc = layer_costs(L8B, H100, mlp, comm.groups_for(H100, 1, 1, 8, 1))
    assert lc.selective_recompute_s == pytest.approx(rerun)
    assert lc.recompute_flops == pytest.approx(sum(o.flops for o in ops if o.name in ("mlp_in", "mlp_out")))


def test_mla_up_proj_drops_q_k_v_and_reruns_the_up_projections():
    """DeepSeek-V3 MLA: Q and K of 128 heads x 192, V of 128 x 128, bf16: 2 x 128 x (192 + 192 + 128) bytes per
    token dropped; the q / kv up-projections (and RoPE) re-run."""
    cfg = _cfg(num_gpus=64, ep=8, global_batch_size=64, precision="fp8")
    up = cfg.with_(recompute_modules="core_attn,mla_up_proj")
    drop = activation_bytes_per_layer(DSV3, cfg, kind=MOE_LAYER) - activation_bytes_per_layer(DSV3, up, kind=MOE_LAYER)
    assert drop == pytest.approx(4096 * 2 * 128 * (192 + 192 + 128))
    lc = layer_costs(DSV3, H100, up, comm.groups_for(H100, 1, 1, 64, 1, 8), MOE_LAYER)
    ups = [o for o in layer_ops(DSV3, up, MOE_LAYER) if o.name in ("q_up_proj", "kv_up_proj")]
    assert lc.recompute_flops == pytest.approx(sum(o.flops for o in ups))


def test_moe_act_drops_the_routed_experts_activation_output():
    cfg = _cfg(ep=8, precision="fp8")
    act = cfg.with_(recompute_modules="core_attn,moe_act")
    k, f = MIXTRAL.experts_per_token, MIXTRAL.moe_ffn_hidden_size
    drop = activation_bytes_per_layer(MIXTRAL, cfg, kind=MOE_LAYER) - activation_bytes_per_layer(MIXTRAL, act, kind=MOE_LAYER)
    assert drop == pytest.approx(4096 * 1.0 * k * f)  # fc2's fp8 input, 1 B per element


def test_modules_apply_only_to_selective_and_to_models_that_have_them():
    with pytest.raises(PlannerError, match="selective"):
        estimate(L8B, H100, _cfg(recompute="none", recompute_modules="core_attn,layernorm"))
    with pytest.raises(PlannerError, match="latent attention"):
        estimate(L8B, H100, _cfg(recompute_modules="core_attn,mla_up_proj"))
    with pytest.raises(PlannerError, match="no experts"):
        estimate(L8B, H100, _cfg(recompute_modules="moe_act"))
    # the default and the batch agree: a batch with mixed modules costs each row as its own configuration
    from planner.specs.config import ConfigBatch
    cfgs = [_cfg(), _cfg(recompute_modules="core_attn,layernorm,mlp"), _cfg(recompute_modules="")]
    batch = activation_bytes_per_layer(L8B, ConfigBatch.of(cfgs))
    assert batch == pytest.approx([float(activation_bytes_per_layer(L8B, c)) for c in cfgs], rel=1e-12)
    assert batch[1] < batch[0]


def test_cli_search_plan_json_and_exports_carry_the_modules():
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                                 "--global-batch", "8", "--seq-len", "4096", "--recompute-modules", "layernorm,core_attn",
                                 "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["recompute"]["modules"] == ["core_attn", "layernorm"]
    assert config_from_dict(d).recompute_modules == "core_attn,layernorm"
    bad = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                                   "--global-batch", "8", "--recompute-modules", "attention"])
    assert bad.exit_code == 2 and "--recompute-modules" in bad.output
    # the search keeps the modules it was given; its estimate is estimate()'s
    res = search(L8B, H100, 8, 64, 4096, top=1, space=SearchSpace(recompute_modules="core_attn,layernorm"))
    best = res.best.config
    assert best.recompute_modules == "core_attn,layernorm"
    assert res.best.estimate.step_time_s == pytest.approx(estimate(L8B, H100, best).step_time_s, rel=1e-12)
    cfg = _cfg(tp=2, sequence_parallel=True, recompute_modules="core_attn,layernorm")
    plan = plan_dict(L8B, "h100-80gb-sxm", cfg, estimate(L8B, H100, cfg))
    args = export(plan, "megatron").text
    assert "--recompute-modules core_attn layernorm" in " ".join(args.split())
    assert "recompute_modules" in export(plan, "nemo").text
    for refusing in ("torchtitan", "deepspeed"):
        with pytest.raises(PlannerError, match="recompute"):
            export(plan, refusing)
