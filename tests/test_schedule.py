"""Pipeline schedules: closed forms against the simulator, the published bubble figures, memory per schedule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.schedule import SCHEDULES, get_schedule
from planner.cost.simulate import simulate_schedule
from planner.cost.validity import config_problems
from planner.specs.config import RunConfig
from planner.specs.model import load_model
from planner.specs.hardware import load_cluster


def equal(p, f, b, w):
    return [f] * p, [b] * p, [w] * p


# ----- published bubble figures ---------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 8), (8, 32)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_flush_bubble_is_p_minus_1_over_m(name, p, m):
    """Narayanan et al. 2021 Sec. 2.2: bubble fraction (p - 1)/m, closed form and simulator."""
    f, b, w = equal(p, 1.0, 1.5, 0.5)
    sched = get_schedule(name)
    closed = sched.time(f, b, w, m, 1)
    sim = simulate_schedule(name, f, b, w, m)
    ideal = m * 3.0
    assert closed.bubble_s / ideal == pytest.approx((p - 1) / m)
    assert sim.total_s == pytest.approx(closed.total_s)
    assert sim.bubble_fraction() == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 3)])
@pytest.mark.parametrize("name", ["interleaved-1f1b", "bfs"])
def test_interleaved_bubble_is_p_minus_1_over_vm(name, p, m, v):
    """Narayanan et al. 2021 Sec. 2.2 (interleaved) and Lamy-Poirier 2022 (breadth-first): (p - 1)/(v m)."""
    f, b, w = equal(p, 1.0, 1.0, 1.0)
    sched = get_schedule(name)
    closed = sched.time(f, b, w, m, v)
    sim = simulate_schedule(name, f, b, w, m, v)
    assert closed.bubble_s / (m * 3.0) == pytest.approx((p - 1) / (v * m))
    assert sim.total_s == pytest.approx(closed.total_s)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 24), (16, 64)])
def test_zb_h1_bubble_is_a_third_of_1f1b(p, m):
    """Qi et al. 2023 Sec. 3.1: with T_F = T_B = T_W, ZB-H1's bubble (p-1)(F+B-W) is 1/3 of 1F1B's (p-1)(F+B+W)."""
    f, b, w = equal(p, 1.0, 1.0, 1.0)
    zb = simulate_schedule("zb-h1", f, b, w, m)
    base = simulate_schedule("1f1b", f, b, w, m)
    assert zb.bubble_s / base.bubble_s == pytest.approx(1 / 3)
    assert get_schedule("zb-h1").time(f, b, w, m, 1).bubble_s == pytest.approx(zb.bubble_s)
    assert zb.bubble_s == pytest.approx((p - 1) * (1.0 + 1.0 - 1.0))


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 6), mult=st.integers(2, 4), f=st.sampled_from([0.5, 1.0, 1.5, 2.0]),
       b=st.sampled_from([0.5, 1.0, 1.5, 2.0]), wfrac=st.sampled_from([0.25, 0.5, 0.75, 1.0]))
def test_zero_bubble_closed_forms_match_simulator(p, mult, f, b, wfrac):
    """ZB-H1: m t + (p-1)(F+B-W); ZB-H2: m t + (p-1)(F + max(0, B-2W)); exact when W <= min(F, B)."""
    m = mult * p
    w = wfrac * min(f, b)
    fs, bs, ws = equal(p, f, b, w)
    for name in ("zb-h1", "zb-h2"):
        sim = simulate_schedule(name, fs, bs, ws, m)
        assert get_schedule(name).time(fs, bs, ws, m, 1).total_s == pytest.approx(sim.total_s), name
    assert simulate_schedule("zb-h1", fs, bs, ws, m).total_s == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w))


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 6), extra=st.integers(0, 6), f=st.sampled_from([0.5, 1.0, 1.5]),
       b_over_f=st.sampled_from([1.0, 1.25, 2.0]), w_frac=st.sampled_from([0.25, 0.5, 1.0]))
def test_zbv_closed_form_matches_simulator(p, extra, f, b_over_f, w_frac):
    """ZB-V: m t + (p - 1) max(B - W, B/2), exact against its static order when W <= F <= B, m >= 2p - 1."""
    m = 2 * p - 1 + extra
    b, w = f * b_over_f, f * w_frac
    fs, bs, ws = equal(p, f, b, w)
    sim = simulate_schedule("zbv", fs, bs, ws, m, 2)
    assert get_schedule("zbv").time(fs, bs, ws, m, 2).total_s == pytest.approx(sim.total_s)
    assert sim.total_s == pytest.approx(m * (f + b + w) + (p - 1) * max(b - w, b / 2))
    assert list(sim.peak_inflight) == [float(p)] * p  # 2p half-size chunks: 1F1B's first-rank peak


def test_zbv_halves_zb_h1_bubble_when_f_b_w_are_equal():
    """Qi et al. 2024 Sec. 6: the V placement turns the fill into chunk-sized steps."""
    p, m = 8, 32
    fs, bs, ws = equal(p, 1.0, 1.0, 1.0)
    zbv = simulate_schedule("zbv", fs, bs, ws, m, 2).bubble_s
    h1 = simulate_schedule("zb-h1", fs, bs, ws, m).bubble_s
    assert zbv == pytest.approx(h1 / 2)


def test_zbv_places_first_and_last_stage_on_rank_0():
    s = get_schedule("zbv")
    assert [s.stage_index(4, 2, 0, c) for c in (0, 1)] == [0, 7]
    assert [s.stage_index(4, 2, 3, c) for c in (0, 1)] == [3, 4]


def test_zb_h2_beats_zb_h1_only_where_b_exceeds_w():
    p, m = 4, 16
    fs, bs, ws = equal(p, 1.0, 2.0, 1.0)
    h1 = simulate_schedule("zb-h1", fs, bs, ws, m).total_s
    h2 = simulate_schedule("zb-h2", fs, bs, ws, m).total_s
    assert h2 < h1
    assert h2 == pytest.approx(m * 4.0 + (p - 1) * 1.0)  # only the last rank's (p - 1) F wait is left


# ----- memory ---------------------------------------------------------------------------------------------------
def test_1f1b_first_stage_holds_p_microbatches():
    s = get_schedule("1f1b")
    assert [s.inflight(8, 32, 1, r) for r in range(8)] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert s.inflight(8, 3, 1, 0) == 3  # never more than m


@pytest.mark.parametrize("p,v", [(4, 2), (8, 3), (16, 4)])
def test_interleaved_memory_factor(p, v):
    """Korthikanti et al. 2022 Sec. 4.2.3: the first stage holds p (1 + (p - 1)/(p v)) micro-batches' worth."""
    assert get_schedule("interleaved-1f1b").inflight(p, 8 * p, v, 0) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_zb_h2_holds_more_than_1f1b_to_remove_the_bubble():
    p = 8
    assert get_schedule("zb-h1").inflight(p, 64, 1, 0) == p
    assert get_schedule("zb-h2").inflight(p, 64, 1, 0) == 2 * p - 1
    assert get_schedule("gpipe").inflight(p, 64, 1, 0) == 64


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(sorted(SCHEDULES)), p=st.integers(2, 6), mult=st.integers(2, 3), v=st.integers(1, 3))
def test_simulated_peak_memory_matches_inflight(name, p, mult, v):
    sched = get_schedule(name)
    v = v if sched.supports_vpp else 1
    m = mult * p
    if sched.check(p, m, v):
        return
    sim = simulate_schedule(name, *equal(p, 1.0, 1.2, 0.8), m, v)
    assert list(sim.peak_inflight) == pytest.approx([sched.inflight(p, m, v, r) for r in range(p)])


# ----- unequal stages -------------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(SCHEDULES)), p=st.sampled_from([2, 4, 8]), mult=st.integers(2, 4),
       scale=st.lists(st.floats(0.8, 1.2), min_size=8, max_size=8), v=st.integers(1, 2))
def test_closed_forms_within_12_percent_for_unequal_stages(name, p, mult, scale, v):
    """The closed forms assume equal stages; with +-20% imbalance they stay within 12% of the simulator."""
    sched = get_schedule(name)
    v = v if sched.supports_vpp else 1
    if name == "interleaved-1f1b":
        v = 2
    m = mult * p
    if sched.check(p, m, v):
        return
    f = [s for s in scale[:p]]
    b = [1.3 * s for s in scale[:p]]
    w = [0.8 * s for s in scale[:p]]
    sim = simulate_schedule(name, f, b, w, m, v)
    closed = sched.time(f, b, w, m, v)
    assert abs(closed.total_s - sim.total_s) <= 0.12 * sim.total_s
    assert sim.total_s >= sched.passes(m) * max(fi + bi + wi for fi, bi, wi in zip(f, b, w)) - 1e-9


def test_1f1b_closed_form_is_an_upper_bound_for_a_slow_stage():
    """(m - 1) max t + sum t charges the slow stage's time to every fill and drain hop; the simulator shows the
    pipeline does better (34 vs 38 here), never worse."""
    f, b, w = [1.0, 2.0, 1.0, 1.0], [1.0, 2.0, 1.0, 1.0], [0.0] * 4
    sim = simulate_schedule("1f1b", f, b, w, 8)
    closed = get_schedule("1f1b").time(f, b, w, 8, 1).total_s
    assert sim.total_s == pytest.approx(34.0)
    assert closed == pytest.approx(7 * 4.0 + 10.0)
    assert sim.busy_s == (16.0, 32.0, 16.0, 16.0)


# ----- constraints ----------------------------------------------------------------------------------------------
def test_schedule_rules():
    assert get_schedule("1f1b").check(4, 8, 2)  # no virtual stages
    assert get_schedule("interleaved-1f1b").check(4, 6, 2)  # m not a multiple of p
    assert get_schedule("interleaved-1f1b").check(4, 8, 2) is None
    assert get_schedule("zb-h1").check(4, 3, 1)  # fewer micro-batches than stages
    assert get_schedule("zb-h1").check(4, 4, 1) is None
    assert get_schedule("zb-h2").check(4, 6, 1)  # needs 2p - 1 = 7
    assert get_schedule("zb-h2").check(4, 7, 1) is None
    assert get_schedule("bfs").check(4, 8, 3) is None
    assert get_schedule("bfs").check(1, 8, 1)
    assert get_schedule("zbv").check(4, 8, 1)  # needs two chunks per rank
    assert get_schedule("zbv").check(4, 6, 2)  # needs 2p - 1 = 7 micro-batches
    assert get_schedule("zbv").check(4, 7, 2) is None


def test_validity_applies_schedule_rules():
    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    cfg = RunConfig(num_gpus=8, tp=2, pp=4, global_batch_size=6, schedule="zb-h2")
    assert any(opt == "schedule" for opt, _ in config_problems(model, cluster, cfg))
    assert not config_problems(model, cluster, cfg.with_(global_batch_size=8))


def test_every_schedule_estimates_and_zero_bubble_is_faster():
    from planner.cost.step import estimate
    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    base = RunConfig(num_gpus=16, tp=2, pp=4, global_batch_size=64, seq_len=4096)
    times = {}
    for name in SCHEDULES:
        cfg = base.with_(schedule=name, vpp=2 if name in ("interleaved-1f1b", "zbv", "dualpipev") else 1)
        times[name] = estimate(model, cluster, cfg).step_time_s
    assert times["zb-h1"] < times["1f1b"]
    assert times["zbv"] < times["zb-h1"]
    assert times["interleaved-1f1b"] < times["1f1b"]
    assert times["gpipe"] == pytest.approx(times["1f1b"])


def test_estimate_cli_accepts_new_schedules():
    from typer.testing import CliRunner
    from planner.cli.app import app
    for name in ("zb-h1", "zb-h2", "bfs"):
        r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm",
                                     "--gpus", "16", "--tp", "2", "--pp", "4", "--global-batch", "64",
                                     "--schedule", name, "--json"])
        assert r.exit_code == 0, r.output
        assert f'"schedule": "{name}"' in r.output


def test_bfs_gathers_zero3_weights_once_per_step():
    """Lamy-Poirier 2022: breadth-first runs all micro-batches through a chunk before the next, so sharded DP
    (ZeRO-3 / FSDP) gathers each chunk once per step; depth-first 1F1B re-gathers per micro-batch. The price is
    GPipe's memory: every micro-batch's activations are held."""
    from planner.cost.step import estimate
    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    base = RunConfig(num_gpus=256, tp=1, pp=4, global_batch_size=1024, seq_len=512, zero_stage=3)
    dfs = estimate(model, cluster, base.with_(schedule="1f1b"))
    bfs = estimate(model, cluster, base.with_(schedule="bfs"))
    assert dfs.breakdown["dp_comm_s"] > 0.1 * dfs.step_time_s
    assert bfs.breakdown["dp_comm_s"] < dfs.breakdown["dp_comm_s"] / 10
    assert bfs.step_time_s < dfs.step_time_s
    assert bfs.stages[0].inflight_microbatches == base.num_microbatches > dfs.stages[0].inflight_microbatches
    # without ZeRO-3 the two only differ in memory
    z1 = [estimate(model, cluster, base.with_(schedule=s, zero_stage=1)).step_time_s for s in ("1f1b", "bfs")]
    assert z1[0] == pytest.approx(z1[1])


# ----- DualPipe and DualPipeV (DeepSeek-V3 report Sec. 3.2.1, Table 2; github deepseek-ai/DualPipe) -------------
@pytest.mark.parametrize("name,p,m,v", [("dualpipe", 2, 4, 1), ("dualpipe", 4, 8, 1), ("dualpipe", 8, 20, 1),
                                        ("dualpipev", 2, 4, 2), ("dualpipev", 4, 10, 2), ("dualpipev", 8, 16, 2)])
def test_dualpipe_orders_run_every_pass_once(name, p, m, v):
    """Every rank runs one F, B and W per micro-batch of its path's chunks: DualPipe m (half per direction, each
    through one of the rank's two stages), DualPipeV m through each of its two chunks."""
    sched = get_schedule(name)
    per_rank = m if name == "dualpipe" else 2 * m
    for r in range(p):
        order = sched.order(p, m, v, r)
        for kind in "FW":
            assert sum(op[0] == kind for op in order) == per_rank
        assert sum(op[0] in "Bb" for op in order) == per_rank
        assert len({(op[0].upper(), op[1], op[2]) for op in order}) == len(order)


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_dualpipe_holds_pp_plus_one_stage_microbatches(p):
    """DeepSeek-V3 report Table 2 (and the DualPipe README): activations per device PP + 1 (stage-micro-batches);
    DualPipeV on the same PP stages over PP / 2 devices, also PP + 1. The simulator playing DeepSeek's order agrees."""
    f, b, w = equal(p, 2.0, 2.4, 1.6)
    dual = simulate_schedule("dualpipe", f, b, w, 4 * p)
    assert dual.peak_inflight == pytest.approx([(p + 1) / 2] * p)  # units: a micro-batch through both stages
    assert [get_schedule("dualpipe").inflight(p, 4 * p, 1, r) for r in range(p)] == [(p + 1) / 2] * p
    n = max(1, p // 2)
    if n >= 2:
        v = simulate_schedule("dualpipev", *equal(n, 2.0, 2.4, 1.6), 4 * n, 2)
        assert v.peak_inflight == pytest.approx([(2 * n + 1) / 2] * n)  # 2n stages + 1, in units of both chunks


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("f,b,w", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 1.0)])
def test_dualpipe_cut_in_half_is_dualpipev(p, f, b, w):
    """DualPipeV is DualPipe cut in half (DualPipe README; Sea AI Lab): p ranks of DualPipe with m micro-batches
    time like p / 2 ranks of DualPipeV with m / 2, stage for stage (each DualPipe rank pair-time = 2 chunks)."""
    m = 4 * p
    dual = simulate_schedule("dualpipe", *equal(p, 2 * f, 2 * b, 2 * w), m)
    v = simulate_schedule("dualpipev", *equal(p // 2, 2 * f, 2 * b, 2 * w), m // 2, 2)
    assert dual.total_s == pytest.approx(v.total_s)


@pytest.mark.parametrize("name,v", [("dualpipe", 1), ("dualpipev", 2)])
@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("f,b,w", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 1.0),
                                   (1.0, 1.3, 0.8)])
def test_dualpipe_closed_form_bounds_the_simulator(name, v, p, f, b, w):
    """The closed form (chain of PP/2 - 1 steps of F + B + max(F, B) - 2W per chunk) is at or above the simulated
    order, within 4% of it at the fewest micro-batches the schedules run (the chain's first steps are shorter, a
    constant of about two steps' B - W), and below the report's (PP/2 - 1)(F&B + B - 3W) with F&B = F + B + W."""
    m = 2 * p if name == "dualpipev" else 4 * p
    sched = get_schedule(name)
    fs, bs, ws = equal(p, 2 * f, 2 * b, 2 * w)  # per rank: two chunks of (f, b, w)
    sim = simulate_schedule(name, fs, bs, ws, m, v)
    closed = sched.time(fs, bs, ws, m, v)
    assert sim.total_s - 1e-9 <= closed.total_s <= 1.04 * sim.total_s
    chain = p // 2 - 1 if name == "dualpipe" else p - 1
    assert closed.bubble_s <= chain * ((f + b + w) + (b + w) - 3 * w) + 1e-9


def test_dualpipe_rules():
    s = get_schedule("dualpipe")
    assert s.check(3, 12, 1)  # even pp
    assert s.check(4, 16, 2)  # vpp 1: the mirror is the second chunk
    assert s.check(4, 6, 1)  # at least 2 pp micro-batches
    assert s.check(4, 9, 1)  # even micro-batches, half per direction
    assert s.check(4, 8, 1) is None
    v = get_schedule("dualpipev")
    assert v.check(4, 8, 1) and v.check(4, 7, 2)
    assert v.check(4, 8, 2) is None


def test_dualpipe_holds_two_copies_of_each_stage():
    """DeepSeek-V3 report Table 2: DualPipe keeps 2x the parameters per device of 1F1B on the same stages (rank r
    holds stage r and stage p - 1 - r); its ranks run the same compute in all as 1F1B's (each pass of a rank is one
    micro-batch of each direction, m / 2 passes), with a shorter fill and drain."""
    from planner.cost.step import estimate
    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    base = RunConfig(num_gpus=16, tp=2, pp=4, global_batch_size=64, seq_len=4096)
    one = estimate(model, cluster, base)
    dual = estimate(model, cluster, base.with_(schedule="dualpipe"))
    for a, d in zip(one.stages, dual.stages):
        mirror = one.stages[base.pp - 1 - a.rank]
        assert d.params_dense == pytest.approx(a.params_dense + mirror.params_dense)
        assert d.layers == a.layers + mirror.layers
    m = base.num_microbatches
    assert sum(s.compute_s for s in dual.stages) * m / 2 == pytest.approx(sum(s.compute_s for s in one.stages) * m)
    assert dual.breakdown["bubble_s"] < one.breakdown["bubble_s"]


def test_dualpipe_pairs_are_the_all_to_all_overlap():
    """DualPipe's F&B pairs are its own batch-level all-to-all overlap, so --ep-comm-overlap needs no virtual stages
    there (Megatron-Core's overlap does), and the overlap makes DeepSeek-V3 under DualPipe faster."""
    from planner.cost.step import estimate
    model, cluster = load_model("deepseek-v3"), load_cluster("h800-80gb-sxm")
    cfg = RunConfig(num_gpus=256, pp=4, ep=64, global_batch_size=256, seq_len=4096, schedule="dualpipe",
                    precision="fp8")
    assert not [p for p in config_problems(model, cluster, cfg.with_(ep_comm_overlap=True)) if p[0] == "ep_comm_overlap"]
    assert [p for p in config_problems(model, cluster, cfg.with_(schedule="1f1b", ep_comm_overlap=True))
            if p[0] == "ep_comm_overlap"]
    fast = estimate(model, cluster, cfg.with_(ep_comm_overlap=True), check=False)
    assert fast.step_time_s < estimate(model, cluster, cfg, check=False).step_time_s


def test_dualpipe_copies_join_the_data_parallel_group():
    """DualPipe's two copies of a stage (ranks r and p - 1 - r) are one more data-parallel replica of it: gradients
    summed over 2 x DP ranks and ZeRO's shards spread over them, so a rank keeps twice a stage's weights and
    gradients but a stage's share of optimizer states (DeepSeek-V3 report Sec. 3.2.1: "two copies of the model
    parameters", not of the optimizer)."""
    from planner.cost import comm
    from planner.cost.data_parallel import dp_groups
    from planner.cost.step import estimate
    model, cluster = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    base = RunConfig(num_gpus=64, tp=2, pp=4, global_batch_size=128, seq_len=4096, zero_stage=1)
    one, dual = estimate(model, cluster, base), estimate(model, cluster, base.with_(schedule="dualpipe"))
    for a, d in zip(one.stages, dual.stages):
        mirror = one.stages[base.pp - 1 - a.rank]
        for state in ("weights", "gradients"):
            assert d.memory_bytes[state] == pytest.approx(a.memory_bytes[state] + mirror.memory_bytes[state])
        assert d.memory_bytes["optimizer"] == pytest.approx((a.memory_bytes["optimizer"] +
                                                             mirror.memory_bytes["optimizer"]) / 2)
    dense, _ = dp_groups(cluster, 2, 1, 8, 1, None, 2, 4)
    plain, _ = dp_groups(cluster, 2, 1, 8, 1)
    assert int(dense.size) == 2 * int(plain.size) and bool(dense.spans_nodes)
    single = comm.place_group(1, 2, cluster.gpus_per_node)
    assert int(dp_groups(cluster, 2, 1, 1, 1, None, 2, 2)[0].size) == 2 * int(single.size)
