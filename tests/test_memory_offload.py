"""CPU activation offloading (Megatron-Core cpu_offloading_num_layers; issue 13 of the backlog, 'offload'): what it
frees on the device, what its transfers cost, the rules Megatron-Core sets, and the exports."""

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.export import megatron, nemo
from planner.errors import PlannerError
from planner.export import emit
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model

GB200 = load_cluster("gb200-nvl72")
H100 = load_cluster("h100-80gb-sxm")
LLAMA70 = load_model("llama-3.1-70b")
BASE = RunConfig(num_gpus=64, global_batch_size=256, micro_batch_size=2, seq_len=8192, zero_stage=3,
                 recompute="none", sequence_parallel=False, precision="fp8")


def test_offloading_frees_all_but_one_offloaded_layer_and_hides_under_compute_on_c2c():
    """70B at 2 x 8K tokens per micro-batch without recomputation: each layer keeps ~3.6 GiB of activations;
    offloading 40 of the 80 frees 39 of them; over GB200's NVLink-C2C (225 GB/s per GPU per direction) a layer's
    copy takes ~17 ms, about one layer's forward: nearly all of it hides."""
    plain = estimate(LLAMA70, GB200, BASE)
    act = {k: estimate(LLAMA70, GB200, BASE.with_(offload_layers=k)).stages[0].memory_bytes["activations"]
           for k in (1, 2, 40)}
    per_layer = plain.stages[0].memory_bytes["activations"] - act[2]  # offloading 2 layers frees one
    assert act[1] == plain.stages[0].memory_bytes["activations"]  # one offloaded layer stays in transfer
    assert 3 * 2**30 < per_layer < 4.5 * 2**30
    assert plain.stages[0].memory_bytes["activations"] - act[40] == pytest.approx(39 * per_layer, rel=1e-9)
    off = estimate(LLAMA70, GB200, BASE.with_(offload_layers=40))
    # the copy (~17 ms) is a little longer than a layer's forward (~16 ms) and well under its backward (~29 ms):
    # a sliver of each forward sticks out, about 3.5% of the step
    assert 0 < off.breakdown["offload_s"] < 0.05 * off.step_time_s
    assert off.step_time_s == pytest.approx(plain.step_time_s + off.breakdown["offload_s"], rel=1e-9)


def test_a_slow_host_link_exposes_the_transfers():
    """The same copies over a 1 GB/s link take far longer than the layers' compute: what sticks out is added to
    the step and reported as offload_s (the breakdown still adds up to the step)."""
    from dataclasses import replace
    slow = replace(GB200, host_link_bytes_per_s=1e9)
    plain = estimate(LLAMA70, slow, BASE)
    off = estimate(LLAMA70, slow, BASE.with_(offload_layers=10))
    assert off.breakdown["offload_s"] > 1.0
    assert off.step_time_s == pytest.approx(plain.step_time_s + off.breakdown["offload_s"], rel=1e-6)
    assert sum(off.breakdown.values()) == pytest.approx(off.step_time_s, rel=1e-9)


@pytest.mark.parametrize("change, field", [(dict(offload_layers=80), "offload_layers"),
                                           (dict(offload_layers=10, pp=2), "offload_layers"),
                                           (dict(offload_layers=10, recompute="selective"), "offload_layers")])
def test_megatron_cores_rules(change, field):
    """TransformerConfig: fewer than the model's layers, no pipeline parallelism, no recomputation."""
    problems = config_problems(LLAMA70, GB200, BASE.with_(**change))
    assert problems and problems[0][0] == field


def test_exports_and_cli():
    from tests.test_export import config_only_plan, pairs
    plan = config_only_plan(num_gpus=64, global_batch_size=256, micro_batch_size=2, seq_len=8192, zero_stage=3,
                            recompute="none", sequence_parallel=False, offload_layers=40)
    assert pairs(megatron.arguments(plan))["--cpu-offloading-num-layers"] == "40"
    over = nemo.overrides(plan)
    assert over["model.cpu_offloading"] is True and over["model.cpu_offloading_num_layers"] == 40
    for refusing in ("torchtitan", "deepspeed"):
        with pytest.raises(PlannerError, match="activation offloading"):
            emit(plan, refusing)
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-70b", "--cluster", "gb200-nvl72", "--gpus", "64",
                                 "--global-batch", "256", "--micro-batch", "2", "--seq-len", "8192", "--zero", "3",
                                 "--recompute", "none", "--no-sequence-parallel", "--precision", "fp8",
                                 "--offload-layers", "40", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["options"]["offload_layers"] == 40 and "offload_s" in d["estimate"]["breakdown"]
    from planner.plan import config_from_dict
    assert config_from_dict(d).offload_layers == 40


# ---------------------------------------------------------------------------------------------------------------
# The loss's cross-entropy, fused or Megatron-Core's unfused passes (core_r0.8.0 cross_entropy.py)
# ---------------------------------------------------------------------------------------------------------------
def test_unfused_cross_entropy_moves_52_bytes_per_logit_and_exports_say_which():
    from planner.cost.compute import head_ops, pass_times
    from tests.test_export import config_only_plan, pairs

    model = load_model("llama-3.1-8b")
    fused = RunConfig(num_gpus=8, global_batch_size=8, seq_len=4096)
    unfused = fused.with_(fused_cross_entropy=False)
    logits = 4096 * model.vocab_size

    def ce_bytes(cfg):
        ops = [o for o in head_ops(model, cfg) if o.name.startswith("cross_entropy")]
        return sum(float(o.hbm_bytes) * (1 + o.bwd_ratio) for o in ops)

    assert ce_bytes(fused) == pytest.approx(24 * logits)  # fp32: about three passes each way
    assert ce_bytes(unfused) == pytest.approx(52 * logits)  # forward 38 + backward 14, pass by pass
    h100 = load_cluster("h100-80gb-sxm")
    assert pass_times(head_ops(model, unfused), h100.gpu).fwd_s > pass_times(head_ops(model, fused), h100.gpu).fwd_s
    plan = config_only_plan(num_gpus=64, tp=8, global_batch_size=64)
    assert "--cross-entropy-loss-fusion" in pairs(megatron.arguments(plan))
    assert nemo.overrides(plan)["model.cross_entropy_loss_fusion"] is True
    off = config_only_plan(num_gpus=64, tp=8, global_batch_size=64, fused_cross_entropy=False)
    assert "--cross-entropy-loss-fusion" not in pairs(megatron.arguments(off))
    assert nemo.overrides(off)["model.cross_entropy_loss_fusion"] is False
