"""Expert tensor parallelism as a searched degree (issue 10): the search tries expert TP = TP and, with TP > 1,
expert TP 1 with EP folded over TP x CP x DP (Megatron-Core's MoE parallel folding, torchtitan's ETP=1), the two
values both launchers run; ``--etp`` narrows it; the exports carry it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.search.engine import search
from planner.search.space import SearchSpace, build_space
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model

RUNNER = CliRunner()
QWEN3_235B = "planner/validation/models/qwen3-235b-a22b.json"


def test_the_space_holds_expert_tp_1_with_ep_folded_over_tp():
    model, cluster = load_model("mixtral-8x7b"), load_cluster("h100-80gb-sxm")
    sp = build_space(model, cluster, 64, 256, 4096, SearchSpace())
    tp, ep, etp, cp, pp = (sp.col(c) for c in ("tp", "ep", "etp", "cp", "pp"))
    folded = (etp == 1) & (tp > 1)
    assert folded.any() and np.all(ep[folded] > 1)
    assert np.all((etp == tp) | (etp == 1))
    # EP beyond DP x CP only where expert TP 1 lets it fold over TP
    beyond = (sp.dp * cp) % ep != 0
    assert beyond.any() and np.all(folded[beyond])
    # every such row is a valid configuration (the validity rules are the estimate's)
    for g in np.flatnonzero(folded)[:: max(1, int(folded.sum()) // 40)]:
        cfg = sp.config(int(g), 1, 1)
        assert cfg.expert_tp == 1 and not config_problems(model, cluster, cfg), cfg


def test_the_search_picks_expert_tp_1_where_the_model_says_it_is_faster():
    """Qwen3-235B at TP 2, PP 8 on 256 H100 (the Megatron-Bridge H100 preset's TP and PP): the best plan folds EP
    over TP (expert TP 1), and it is faster under the model than the best with expert TP = TP."""
    model, cluster = load_model(QWEN3_235B), load_cluster("h100-80gb-sxm")
    base = SearchSpace(precision="fp8", tp_values=(2,), pp_values=(8,))
    best = search(model, cluster, 256, 2048, 4096, space=base).best
    tied_space = SearchSpace(precision="fp8", tp_values=(2,), pp_values=(8,), etp_values=(2,))
    tied = search(model, cluster, 256, 2048, 4096, space=tied_space).best
    assert best.config.expert_tp == 1 and tied.config.expert_tp == 2
    assert best.estimate.step_time_s < tied.estimate.step_time_s
    assert best.estimate.step_time_s == estimate(model, cluster, best.config).step_time_s


def test_etp_constraint_on_the_cli_and_in_the_plan_json():
    args = ["plan", "--model", QWEN3_235B, "--cluster", "h100-80gb-sxm", "--gpus", "256", "--global-batch", "2048",
            "--seq-len", "4096", "--precision", "fp8", "--tp", "2", "--pp", "8", "--json"]
    for etp in ("1", "2"):
        r = RUNNER.invoke(app, args + ["--etp", etp])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["parallelism"]["etp"] == int(etp)
    r = RUNNER.invoke(app, args[:-1] + ["--etp", "0"])
    assert r.exit_code != 0 and "--etp" in r.output


def test_torchtitan_takes_expert_tp_1_with_ep_borrowed_from_tp():
    """torchtitan 0.2.2's ParallelDims: expert TP = TP or 1, EP x expert TP dividing dp_shard x cp x tp (efsdp)."""
    from planner.errors import PlannerError
    from planner.export import emit
    from tests.test_export import check_torchtitan, config_only_plan
    plan = config_only_plan(model="mixtral-8x7b", num_gpus=64, tp=2, ep=16, etp=1, sequence_parallel=True,
                            global_batch_size=128)
    assert check_torchtitan(plan)["parallelism"]["expert_tensor_parallel_degree"] == 1
    with pytest.raises(PlannerError, match="ETP"):
        emit(config_only_plan(model="mixtral-8x7b", num_gpus=64, tp=4, ep=4, etp=2, sequence_parallel=True,
                              global_batch_size=128), "torchtitan")
