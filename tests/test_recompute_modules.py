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
    groups = comm.groups_for(H100, 1, 1, 8, 1)
    # beyond core_attn's (the fused attention's forward, re-run: test_core_attn_reruns_the_fused_kernel_in_megatron)
    extra = layer_costs(L8B, H100, ln, groups).selective_recompute_s - \
        layer_costs(L8B, H100, base, groups).selective_recompute_s
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
    core = layer_costs(L8B, H100, base, comm.groups_for(H100, 1, 1, 8, 1))  # core_attn alone: the attention re-run
    assert lc.selective_recompute_s - core.selective_recompute_s == pytest.approx(rerun)
    assert lc.recompute_flops - core.recompute_flops == \
        pytest.approx(sum(o.flops for o in ops if o.name in ("mlp_in", "mlp_out")))


def test_mla_up_proj_drops_q_k_v_and_reruns_the_up_projections():
    """DeepSeek-V3 MLA: Q and K of 128 heads x 192, V of 128 x 128, bf16: 2 x 128 x (192 + 192 + 128) bytes per
    token dropped; the q / kv up-projections (and RoPE) re-run."""
    cfg = _cfg(num_gpus=64, ep=8, global_batch_size=64, precision="fp8")
    up = cfg.with_(recompute_modules="core_attn,mla_up_proj")
    drop = activation_bytes_per_layer(DSV3, cfg, kind=MOE_LAYER) - activation_bytes_per_layer(DSV3, up, kind=MOE_LAYER)
    assert drop == pytest.approx(4096 * 2 * 128 * (192 + 192 + 128))
    lc = layer_costs(DSV3, H100, up, comm.groups_for(H100, 1, 1, 64, 1, 8), MOE_LAYER)
    core = layer_costs(DSV3, H100, cfg, comm.groups_for(H100, 1, 1, 64, 1, 8), MOE_LAYER)
    ups = [o for o in layer_ops(DSV3, up, MOE_LAYER) if o.name in ("q_up_proj", "kv_up_proj")]
    assert lc.recompute_flops - core.recompute_flops == pytest.approx(sum(o.flops for o in ups))


def test_moe_act_drops_the_routed_experts_activation_output():
    cfg = _cfg(ep=8, precision="fp8")
    act = cfg.with_(recompute_modules="core_attn,moe_act")
    k, f = MIXTRAL.experts_per_token, MIXTRAL.moe_ffn_hidden_size
    drop = activation_bytes_per_layer(MIXTRAL, cfg, kind=MOE_LAYER) - activation_bytes_per_layer(MIXTRAL, act, kind=MOE_LAYER)
    assert drop == pytest.approx(4096 * 1.0 * k * f)  # fc2's fp8 input, 1 B per element


def test_modules_apply_only_to_selective_and_to_models_that_have_them():
    # a search row or a plan without selective recomputation keeps its space's modules, which nothing prices;
    # given on the command line with another mode they are refused
    none = estimate(L8B, H100, _cfg(recompute="none", recompute_modules="core_attn,layernorm"))
    assert none.step_time_s == estimate(L8B, H100, _cfg(recompute="none")).step_time_s
    refused = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus",
                                       "8", "--global-batch", "8", "--recompute", "none", "--recompute-modules",
                                       "core_attn,layernorm"])
    assert refused.exit_code != 0 and "--recompute selective" in refused.output
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


MOE_OPS = ("router", "experts_in", "experts_in_fp8_cast", "experts_out", "experts_out_fp8_cast", "moe_permute",
           "moe_act", "shared_experts_in", "shared_experts_in_fp8_cast", "shared_experts_out",
           "shared_experts_out_fp8_cast", "mlp_act")


def test_moe_checkpoints_the_whole_moe_block():
    """'moe' (Megatron-Core MoELayer's tensor_parallel.checkpoint) keeps only the block's bf16 input: Mixtral
    (SwiGLU, k = 2 of 8 experts, f = 14336, h = 4096; bf16, TP 1) drops fc1's two outputs and fc2's input 6 f k, the
    router's fp32 logits and probabilities 4 E and the k dispatched token copies 2 k h, per token."""
    cfg = _cfg(ep=8)
    moe = cfg.with_(recompute_modules="core_attn,moe")
    k, f, h, E = 2, 14336, 4096, 8
    assert (MIXTRAL.experts_per_token, MIXTRAL.moe_ffn_hidden_size, MIXTRAL.hidden_size, MIXTRAL.num_experts) == \
        (k, f, h, E)
    drop = activation_bytes_per_layer(MIXTRAL, cfg, kind=MOE_LAYER) - \
        activation_bytes_per_layer(MIXTRAL, moe, kind=MOE_LAYER)
    assert drop == pytest.approx(4096 * (6 * f * k + 4 * E + 2 * k * h))
    # in fp8 the MLP input the checkpoint keeps is the bf16 norm output (2 h), where the experts kept fp8 copies
    fp8 = cfg.with_(precision="fp8")
    drop8 = activation_bytes_per_layer(MIXTRAL, fp8, kind=MOE_LAYER) - \
        activation_bytes_per_layer(MIXTRAL, fp8.with_(recompute_modules="core_attn,moe"), kind=MOE_LAYER)
    assert drop8 == pytest.approx(4096 * ((4 + 1) * f * k + 4 * E + 1 * k * h + 1 * h - 2 * h))
    # moe_act on top of moe drops nothing more; on a dense layer moe does nothing (and is refused, below)
    both = cfg.with_(recompute_modules="core_attn,moe,moe_act")
    assert activation_bytes_per_layer(MIXTRAL, both, kind=MOE_LAYER) == \
        pytest.approx(activation_bytes_per_layer(MIXTRAL, moe, kind=MOE_LAYER))


def test_moe_reruns_the_block_and_its_all_to_alls():
    """The recomputed forward re-runs the router, the experts, permute / unpermute, the activation and the shared
    experts (DeepSeek-V3: one shared expert), and the dispatch and combine all-to-alls once more, unpaired; the
    attention half is not redone."""
    cfg = _cfg(num_gpus=64, ep=8, global_batch_size=64, precision="fp8")
    moe = cfg.with_(recompute_modules="core_attn,moe")
    groups = comm.groups_for(H100, 1, 1, 64, 1, 8)
    lc = layer_costs(DSV3, H100, moe, groups, MOE_LAYER)
    base = layer_costs(DSV3, H100, cfg, groups, MOE_LAYER)
    ops = layer_ops(DSV3, moe, MOE_LAYER)
    rerun = [o for o in ops if o.name in MOE_OPS]
    assert {o.name for o in rerun} >= {"router", "experts_in", "experts_out", "shared_experts_in", "moe_act"}
    expected = 0.0
    for o in rerun:  # a grouped expert GEMM runs no faster than the stack issues its per-expert GEMMs
        t = op_time_s(o, H100.gpu)
        if o.expert_calls:
            t = max(t, float(H100.gpu.expert_issue_s(o.precision, o.expert_calls, o.expert_alltoall)))
        expected += t
    # beyond core_attn's re-run of the fused attention, which the base (core_attn alone) pays too
    assert lc.selective_recompute_s - base.selective_recompute_s == pytest.approx(expected, rel=1e-9)
    assert base.recompute_ep_s == 0.0 and lc.recompute_ep_s == pytest.approx(base.ep_fwd_s) and lc.ep_fwd_s > 0
    assert lc.recompute_flops - base.recompute_flops == pytest.approx(sum(o.flops for o in rerun))
    # end to end: the step pays the re-run kernels and the extra all-to-alls, and keeps fewer activations
    e0, e1 = estimate(DSV3, H100, cfg), estimate(DSV3, H100, moe)
    assert e1.step_time_s > e0.step_time_s and e1.peak_memory_bytes < e0.peak_memory_bytes
    assert e1.breakdown["ep_comm_s"] > e0.breakdown["ep_comm_s"]
    assert e1.breakdown["recompute_s"] > e0.breakdown["recompute_s"]


def test_moe_module_rules():
    """Megatron-Core's rules (transformer_config.py): 'moe' needs MoE layers, cannot run with the all-to-all
    overlap, and leaves nothing inside the block to offload."""
    with pytest.raises(PlannerError, match="no experts"):
        estimate(L8B, H100, _cfg(recompute_modules="core_attn,moe"))
    mix = MIXTRAL
    with pytest.raises(PlannerError, match="overlap"):
        estimate(mix, H100, _cfg(num_gpus=16, ep=8, global_batch_size=16, recompute_modules="core_attn,moe",
                                 ep_comm_overlap=True))
    with pytest.raises(PlannerError, match="offload"):
        estimate(mix, H100, _cfg(ep=8, recompute_modules="core_attn,moe", offload_modules="moe_act"))
    # the overlap with no recomputation stays valid
    estimate(mix, H100, _cfg(num_gpus=16, ep=8, global_batch_size=16, recompute="none", ep_comm_overlap=True))


def test_search_with_moe_recompute_never_pairs_it_with_the_overlap_and_exports_it():
    mix = MIXTRAL
    res = search(mix, H100, 16, 64, 4096, top=50,
                 space=SearchSpace(recompute_modules="core_attn,moe", recompute_modes=("selective",)))
    cfgs = [c.config for c in res.ranked]
    assert any(c.recompute == "selective" for c in cfgs)
    assert not any(c.recompute == "selective" and c.ep_comm_overlap for c in cfgs)
    # the space itself: overlapped groups keep their rows without recomputation and lose the selective ones
    import numpy as np
    from planner.search.space import REC_NONE, REC_SELECTIVE, build_space
    for modules, selective_overlap in (("core_attn,moe", False), ("core_attn", True)):
        space = build_space(mix, H100, 16, 64, 4096, SearchSpace(recompute_modules=modules))
        rows = space.expand(np.arange(len(space.groups)))
        epo = space.col("epo")[rows.group].astype(bool)
        assert (epo & (rows.rec == REC_NONE)).any()
        assert (epo & (rows.rec == REC_SELECTIVE)).any() == selective_overlap
        assert ((~epo) & (rows.rec == REC_SELECTIVE)).any()
    # offloading inside a recomputed MoE block cannot run: such a space holds no selective rows at all
    offloading = build_space(mix, H100, 16, 64, 4096, SearchSpace(recompute_modules="core_attn,moe",
                                                                   offload_modules="moe_act"))
    assert REC_SELECTIVE not in offloading.rec_codes and REC_NONE in offloading.rec_codes
    for cand in res.ranked[:5]:
        assert cand.estimate.step_time_s == pytest.approx(estimate(mix, H100, cand.config).step_time_s, rel=1e-9)
    sel = next(c for c in cfgs if c.recompute == "selective")
    plan = plan_dict(mix, "h100-80gb-sxm", sel, estimate(mix, H100, sel))
    assert plan["recompute"]["modules"] == ["core_attn", "moe"]
    assert "--recompute-modules core_attn moe" in " ".join(export(plan, "megatron").text.split())


def test_core_attn_reruns_the_fused_kernel_in_megatron_not_in_torchtitan():
    """Megatron-Core checkpoints the core attention under selective "core_attn" whatever its kernel
    (megatron/core/transformer/attention.py, checkpoint_core_attention), so the fused kernel's forward runs again in
    backward: the layer's selective recompute time is that kernel's forward, its FLOPs the recomputed ones, and
    the step is longer than with no recomputation. torchtitan's op-level selective checkpointing saves the SDPA ops'
    outputs (stacks/torchtitan.json recompute_fused_attention false): nothing re-runs, the step equals no
    recomputation's."""
    from planner.cost.compute import attention_time_s
    from planner.specs.stack import load_stack

    assert [load_stack(s).recompute_fused_attention for s in ("megatron-core", "torchtitan", "deepspeed")] == \
        [True, False, False]
    cfg = _cfg(recompute="selective")
    groups = comm.groups_for(H100, 1, 1, 8, 1)
    [core] = [o for o in layer_ops(L8B, cfg) if o.name == "attention_core"]
    lc = layer_costs(L8B, H100, cfg, groups)
    assert lc.selective_recompute_s == pytest.approx(float(attention_time_s(core, H100.gpu)), rel=1e-12)
    assert lc.recompute_flops == pytest.approx(float(core.flops))
    kept = layer_costs(L8B, H100, cfg.with_(recompute_fused_attention=False), groups)
    assert kept.selective_recompute_s == 0.0 and kept.recompute_flops == 0.0
    none = cfg.with_(recompute="none")
    assert estimate(L8B, H100, cfg).step_time_s > estimate(L8B, H100, none).step_time_s
    assert estimate(L8B, H100, cfg.with_(recompute_fused_attention=False)).step_time_s == \
        pytest.approx(estimate(L8B, H100, none).step_time_s, rel=1e-12)
