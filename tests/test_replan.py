"""Elastic re-planning (issue 12 of the guide): the bytes of training state a re-plan moves, checked against an
independent cell-by-cell count and pinned to closed forms for Llama-3.1-70B on 512 H100; the node placement; the
`planner replan` command."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.memory import embedding_params, expert_params_per_layer, head_params, layer_params, total_params
from planner.cost.reshard import _assign, reshard
from planner.cost.schedule import get_schedule
from planner.cost.step import stage_layers
from planner.replan import replan, survivors_of
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import DENSE_LAYER, MOE_LAYER, ModelSpec, load_model

RUNNER = CliRunner()
H100 = load_cluster("h100-80gb-sxm")
L70 = load_model("llama-3.1-70b")
SEQ = 8192


# ---- an independent count: every unit cut into cells, each GPU's holdings as sets of cells ------------------------
def _holdings(model: ModelSpec, cfg: RunConfig, cells: int):
    """{gpu: (weights, optimizer)} as sets of (unit, cell), written from the layout rules directly (Megatron's
    rank order tp-cp-dp-pp; ZeRO shards the TP piece over DP x CP, or HSDP's shard group)."""
    layers = stage_layers(model, cfg)
    sched = get_schedule(cfg.schedule)
    starts = [sum(layers[:i]) for i in range(len(layers))]
    out = {}
    for g in range(cfg.num_gpus):
        t, c = g % cfg.tp, (g // cfg.tp) % cfg.cp
        d, p = (g // (cfg.tp * cfg.cp)) % cfg.dp, g // (cfg.tp * cfg.cp * cfg.dp)
        units = []
        for s in sched.stages_of(cfg.pp, cfg.vpp, p):
            units += list(range(starts[s], starts[s] + layers[s]))
            units += ["emb"] if s == 0 else []
            units += ["head"] if s == len(layers) - 1 else []
        def piece(pieces, rank, shards, idx):
            mine = [x for x in range(cells) if x * pieces // cells == rank]
            shard = [x for x in mine if (x - mine[0]) * shards // len(mine) == idx]
            return (shard if cfg.zero_stage >= 3 else mine), (shard if cfg.zero_stage >= 1 else mine)

        w, opt = piece(cfg.tp, t, cfg.zero_shard_dp * cfg.cp, (d % cfg.zero_shard_dp) * cfg.cp + c)
        held_w = {(u, x) for u in units for x in w}
        held_o = {(u, x) for u in units for x in opt}
        if model.is_moe:  # the MoE grid inside a stage: expert TP fastest, then EP, then expert DP
            local = g % (cfg.tp * cfg.cp * cfg.dp)
            x_r, e_r, edp = local % cfg.expert_tp, (local // cfg.expert_tp) % cfg.ep, local // (cfg.expert_tp * cfg.ep)
            e_shards = cfg.tp * cfg.cp * cfg.dp // (cfg.ep * cfg.expert_tp) // cfg.dp_replicas
            ew, eo = piece(cfg.expert_tp, x_r, e_shards, edp % e_shards)
            per = model.num_experts // cfg.ep
            experts = [("x", u, e) for u in units if isinstance(u, int) for e in range(e_r * per, (e_r + 1) * per)]
            held_w |= {(u, x) for u in experts for x in ew}
            held_o |= {(u, x) for u in experts for x in eo}
        out[g] = (held_w, held_o)
    return out


def _oracle(model, old, new, survivors, cells):
    """Bytes each new rank receives (survivors in order, then added GPUs), and the lost optimizer bytes."""
    experts = expert_params_per_layer(model)
    size = {u: layer_params(model, MOE_LAYER if model.is_moe else DENSE_LAYER) - experts for u in range(model.num_layers)}
    size["emb"] = embedding_params(model, SEQ)
    size["head"] = head_params(model)  # untied: no copy of the embedding
    for u in range(model.num_layers):
        for e in range(model.num_experts):
            size[("x", u, e)] = experts / model.num_experts
    a, b = _holdings(model, old, cells), _holdings(model, new, cells)
    received = []
    for j in range(new.num_gpus):
        w_old, o_old = a[survivors[j]] if j < len(survivors) else (set(), set())
        w_new, o_new = b[j]
        opt = o_new - o_old
        wts = w_new - w_old - o_new
        received.append(sum(12 * size[u] / cells for u, _ in opt) + sum(2 * size[u] / cells for u, _ in wts))
    alive = set().union(*(a[g][1] for g in survivors))
    every = set().union(*(a[g][1] for g in a))
    lost = sum(12 * size[u] / cells for u, _ in every - alive)
    return np.array(received), lost


TINY = ModelSpec(name="tiny", model_type="llama", hidden_size=256, ffn_hidden_size=512, num_layers=8, num_heads=4,
                 num_kv_heads=4, vocab_size=1000, max_seq_len=SEQ)


def _cfg(n, **kw):
    return RunConfig(num_gpus=n, global_batch_size=48, micro_batch_size=1, seq_len=SEQ, **kw)


PAIRS = [  # (old, new, lost nodes of 4 GPUs, added nodes)
    (_cfg(16, tp=2, pp=2, zero_stage=1), _cfg(12, tp=2, pp=2, zero_stage=1), (3,), 0),
    (_cfg(16, tp=2, pp=2, zero_stage=1), _cfg(12, tp=4, pp=1, zero_stage=3), (1,), 0),
    (_cfg(16, tp=4, pp=2, zero_stage=0), _cfg(8, tp=2, pp=4, zero_stage=2), (0, 2), 0),
    (_cfg(16, tp=1, pp=2, cp=2, zero_stage=3), _cfg(24, tp=2, pp=2, cp=2, zero_stage=1), (), 2),
    (_cfg(16, tp=2, pp=1, zero_stage=1, dp_shard=4), _cfg(12, tp=2, pp=1, zero_stage=1, dp_shard=2), (2,), 0),
    (_cfg(16, tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", zero_stage=1),
     _cfg(16, tp=2, pp=4, zero_stage=1), (3,), 1),
]


TINY_MOE = ModelSpec(name="tiny-moe", model_type="mixtral", hidden_size=256, ffn_hidden_size=512, num_layers=4,
                     num_heads=4, num_kv_heads=4, vocab_size=1000, max_seq_len=SEQ, num_experts=8, experts_per_token=2,
                     moe_ffn_hidden_size=256)
MOE_PAIRS = [
    (_cfg(16, tp=2, ep=4, zero_stage=1), _cfg(12, tp=2, ep=2, zero_stage=1), (3,), 0),
    (_cfg(16, tp=2, ep=8, etp=1, zero_stage=1), _cfg(16, tp=4, ep=4, zero_stage=3), (0,), 1),
    (_cfg(16, tp=1, pp=2, ep=2, zero_stage=0), _cfg(8, tp=2, pp=1, ep=4, etp=1, zero_stage=2), (1, 2), 0),
]


@pytest.mark.parametrize("old,new,lost,added", MOE_PAIRS)
def test_moe_reshard_bytes_match_a_cell_by_cell_count(old, new, lost, added):
    cells = math.lcm(*(c.tp * c.zero_shard_dp * c.cp for c in (old, new)),
                     *(c.expert_tp * (c.tp * c.cp * c.dp // (c.ep * c.expert_tp)) for c in (old, new)))
    survivors = survivors_of(old.num_gpus, 4, lost)
    got = reshard(TINY_MOE, old, new, survivors, 4, place=False)
    want, want_lost = _oracle(TINY_MOE, old, new, survivors.tolist(), cells)
    np.testing.assert_allclose(got.received_bytes, want, rtol=1e-9, atol=1e-3)
    assert got.lost_bytes == pytest.approx(want_lost, rel=1e-9, abs=1e-3)


@pytest.mark.parametrize("old,new,lost,added", PAIRS)
def test_reshard_bytes_match_a_cell_by_cell_count(old, new, lost, added):
    cells = math.lcm(*(c.tp * c.zero_shard_dp * c.cp for c in (old, new)))
    survivors = survivors_of(old.num_gpus, 4, lost)
    got = reshard(TINY, old, new, survivors, 4, place=False)
    want, want_lost = _oracle(TINY, old, new, survivors.tolist(), cells)
    np.testing.assert_allclose(got.received_bytes, want, rtol=1e-9, atol=1e-3)
    assert got.lost_bytes == pytest.approx(want_lost, rel=1e-9, abs=1e-3)


def test_placement_finds_the_least_moving_assignment():
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        cost = np.round(rng.random((n + int(rng.integers(0, 3)), n)) * 50)
        p = _assign(cost)
        best = min(sum(cost[q[j], j] for j in range(n)) for q in itertools.permutations(range(cost.shape[0]), n))
        assert len(set(p.tolist())) == n and cost[p, np.arange(n)].sum() == pytest.approx(best)
    # and it never moves more than keeping the survivors in order
    old, new = PAIRS[1][0], PAIRS[1][1]
    survivors = survivors_of(16, 4, (1,))
    assert reshard(TINY, old, new, survivors, 4).total_bytes <= reshard(TINY, old, new, survivors, 4,
                                                                         place=False).total_bytes


# ---- Llama-3.1-70B on 512 H100 (64 nodes of 8): closed forms --------------------------------------------------------
def _stage_params(model, cfg):
    layers = stage_layers(model, cfg)
    out = [n * layer_params(model) for n in layers]
    out[0] += embedding_params(model, SEQ)
    out[-1] += head_params(model)
    return out


def test_70b_losing_half_its_nodes_with_tp8_pp4_zero1():
    """TP 8, PP 4, DP 16, ZeRO-1; the last 32 nodes (ranks 256-511: all of stages 2 and 3) are lost, and the job
    goes on with the same degrees and DP 8. Stages 2 and 3 lose every optimizer shard: 12 (P2 + P3) bytes come from
    a checkpoint. Placed where they hold the most, the 8 nodes of each new stage-0/1 DP rank d hold half of its new
    shard (old shard 2d or 2d+1 of 16) and all its weights: each receives 6 P_s / 64 (6 P_s per stage); the nodes that
    take stages 2 and 3 receive their whole optimizer shards (12 P_s) and the TP piece's weights their master shard
    does not rebuild (64 x 2 P_s / 8 x 7/8 = 14 P_s)."""
    old = RunConfig(num_gpus=512, tp=8, pp=4, global_batch_size=512, micro_batch_size=1, seq_len=SEQ,
                    zero_stage=1)
    new = old.with_(num_gpus=256)
    p0, p1, p2, p3 = _stage_params(L70, old)
    rs = reshard(L70, old, new, survivors_of(512, 8, tuple(range(32, 64))), 8)
    assert rs.lost_bytes == pytest.approx(12 * (p2 + p3), rel=1e-12)
    assert rs.total_bytes == pytest.approx(6 * (p0 + p1) + 26 * (p2 + p3), rel=1e-12)
    assert rs.optimizer_bytes == pytest.approx(6 * (p0 + p1) + 12 * (p2 + p3), rel=1e-12)


@pytest.mark.parametrize("lost_gpus", [8, 64, 256])
def test_70b_on_512_h100_losing_8_64_256_gpus(lost_gpus):
    """TP 8, DP 64, ZeRO-1 (batch 4032 = 63 x 64, so DP 63, 56 and 32 all divide it): the lost nodes' DP ranks
    held the only copy of their optimizer shards, lost_gpus / 512 of 12 P bytes. The same layout on the GPUs left
    (DP 64 - lost nodes) moves, with the best placement, the rest of each GPU's new shard (pinned below)."""
    old = RunConfig(num_gpus=512, tp=8, global_batch_size=4032, micro_batch_size=1, seq_len=SEQ, zero_stage=1)
    total = total_params(L70, SEQ)
    r = replan(L70, H100, old, lose_nodes=lost_gpus // 8, horizon_s=24 * 3600)
    same = [o for o in r.options if o.plan.config.tp == 8 and o.plan.config.pp == 1 and o.plan.config.cp == 1
            and o.plan.config.num_gpus == 512 - lost_gpus]
    assert same, [o.label for o in r.options]
    rs = reshard(L70, old, same[0].plan.config, survivors_of(512, 8, tuple(range(64 - lost_gpus // 8, 64))), 8)
    assert rs.lost_bytes == pytest.approx(12 * total * lost_gpus / 512, rel=1e-12)
    # DP 64 -> n = 64 - k: new shard j covers [j/n, (j+1)/n) of each TP piece; the node (one DP rank of 8 TP
    # GPUs) that takes it keeps what its old shard [i/64, (i+1)/64) shares with it. Overlaps of intervals in order
    # are best matched without crossings: a dynamic program over (new shards, surviving old shards 0..n-1)
    n = 64 - lost_gpus // 8

    def overlap(j, i):
        return max(0.0, min((j + 1) / n, (i + 1) / 64) - max(j / n, i / 64))

    best = np.zeros((n + 1, n + 1))
    for j in range(1, n + 1):
        for i in range(1, n + 1):
            best[j, i] = max(best[j - 1, i], best[j, i - 1], best[j - 1, i - 1] + overlap(j - 1, i - 1))
    assert rs.optimizer_bytes == pytest.approx(12 * total * (1 - best[n, n]), rel=1e-9)
    assert rs.optimizer_bytes == pytest.approx({8: 228.250e9, 64: 317.492e9, 256: 634.983e9}[lost_gpus], rel=1e-5)
    assert rs.weight_bytes == pytest.approx(0.0, abs=1.0)  # TP pieces unchanged: every GPU keeps its weights
    best = r.options[0]
    assert best.tokens_in(r.horizon_s) == max(o.tokens_in(r.horizon_s) for o in r.options)


# ---- the command ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("replan") / "plan.json"
    out = RUNNER.invoke(app, ["plan", "--model", "llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "512",
                              "--global-batch", "512", "--seq-len", "8192", "--top", "0", "--json"])
    assert out.exit_code == 0, out.output
    path.write_text(out.stdout)
    return path


def test_cli_replan_json(plan_file):
    out = RUNNER.invoke(app, ["replan", str(plan_file), "--lose-nodes", "8", "--restart-s", "300",
                              "--checkpoint-gb-s", "50", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    assert d["num_gpus"] == 448 and d["lost_nodes"] == list(range(56, 64)) and d["stack"] == "megatron-core"
    first = d["options"][0]
    t = first["transition"]
    assert t["seconds"] == pytest.approx(300 + max(t["network_s"], t["checkpoint_s"]))
    assert t["checkpoint_s"] == pytest.approx(t["lost_bytes"] / 50e9)
    assert first["tokens_in_horizon"] == pytest.approx(first["tokens_per_s"] * (24 * 3600 - t["seconds"]))
    assert [o["tokens_in_horizon"] for o in d["options"]] == sorted((o["tokens_in_horizon"] for o in d["options"]),
                                                                    reverse=True)


def test_cli_replan_table_and_added_nodes(plan_file):
    out = RUNNER.invoke(app, ["replan", str(plan_file), "--add-nodes", "8"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "unchanged" in out.output and "576" in out.output


@pytest.mark.parametrize("args,needle", [
    ((), "say what changed"),
    (("--gpus", "500"), "multiple of 8"),
    (("--lost-nodes", "70"), "not one of the plan's nodes"),
    (("--lose-nodes", "64"), "no GPUs left"),
    (("--lose-nodes", "1", "--horizon-hours", "0"), "--horizon-hours"),
])
def test_cli_replan_errors_name_the_option(plan_file, args, needle):
    out = RUNNER.invoke(app, ["replan", str(plan_file), *args])
    assert out.exit_code != 0 and needle in out.output and "Traceback" not in out.output


def test_a_new_global_batch_can_use_every_gpu_left():
    """Losing one of 64 nodes: a batch of 512 splits over 504 GPUs only into 63-stage pipelines, so the best answer
    leaves nodes idle; at 504 sequences (a batch the user chooses to change) every GPU left runs a better plan."""
    old = RunConfig(num_gpus=512, tp=8, global_batch_size=512, micro_batch_size=1, seq_len=SEQ, zero_stage=1)
    same = replan(L70, H100, old, lose_nodes=1, horizon_s=24 * 3600, top_k=0)
    new = replan(L70, H100, old, lose_nodes=1, horizon_s=24 * 3600, top_k=0, global_batch=504)
    assert same.best.plan.config.num_gpus < 504 and same.best.plan.config.global_batch_size == 512
    assert new.best.plan.config.num_gpus == 504 and new.best.plan.config.global_batch_size == 504
    assert new.best.tokens_per_s > same.best.tokens_per_s


def test_replan_searches_with_the_old_plans_fixed_options():
    """A re-plan ranks its candidates under the options the old plan ran with (its stack's expert GEMM issue,
    fused-attention recomputation and fp8 weight gather, its precision): every option's configuration holds them,
    so the new plans and the "same layout" one are priced alike (the finder once kept only precision, recompute
    modules and attention kernel)."""
    model = load_model("mixtral-8x7b")
    old = RunConfig(num_gpus=32, tp=2, pp=2, ep=4, global_batch_size=256, micro_batch_size=1, seq_len=4096,
                    zero_stage=1, sequence_parallel=True, precision="fp8", per_expert_gemm_calls=False,
                    recompute_fused_attention=False, fp8_param_gather=True, recompute="selective")
    r = replan(model, H100, old, lose_nodes=1, horizon_s=3600.0)
    assert r.options
    for o in r.options:
        assert o.plan.config.fixed == old.fixed, o.label


@pytest.mark.parametrize("nodes_left, asked", [(3, [3]), (8, [8, 7]), (17, [17, 16, 15])])
def test_replan_tries_up_to_an_eighth_of_the_nodes_idle(nodes_left, asked):
    """``idle_nodes``: none idle from fewer than 8 nodes, one from 8, two from 16-23; the finder is asked for every
    node count from all of them down to that many idle (the range once stopped one short, so 8 nodes never tried 7
    and 3 nodes tried none at all)."""
    from planner.errors import InfeasibleError

    seen = []

    def find(num_gpus, constraints, top_k):  # records the counts asked, finds nothing
        seen.append((num_gpus // 8, constraints is None))
        raise InfeasibleError("recorded", source="test")
    old = RunConfig(num_gpus=8 * (nodes_left + 1), tp=8, global_batch_size=1680, micro_batch_size=1, seq_len=4096)
    with pytest.raises(InfeasibleError):
        replan(L70, H100, old, lose_nodes=1, horizon_s=3600.0, find=find)
    assert [n for n, free in seen if free] == asked
