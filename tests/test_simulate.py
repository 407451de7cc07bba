"""The discrete-event pipeline simulator on hand-worked cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.schedule import get_schedule
from planner.cost.simulate import per_chunk, simulate, simulate_schedule


def test_two_stage_1f1b_by_hand():
    # rank 0: F0 [0,1] F1 [1,2] .. B0 [4,6] .. B1 [7,9]; rank 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]
    sim = simulate_schedule("1f1b", [1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 2)
    assert sim.total_s == 9.0
    r0 = [(o.kind, o.microbatch, o.start_s, o.end_s) for o in sim.timeline[0]]
    assert r0 == [("F", 0, 0.0, 1.0), ("F", 1, 1.0, 2.0), ("B", 0, 4.0, 6.0), ("B", 1, 7.0, 9.0)]
    assert sim.busy_s == (6.0, 6.0)
    assert sim.bubble_s == 3.0


def test_p2p_latency_bounds():
    """P2P transfers delay at least the (p - 1) forward and (p - 1) backward hops of the critical path, and at most
    what folding them into every F and B costs (the cost model's convention, an upper bound)."""
    p, m, d = 4, 8, 0.1
    f, b, w = [1.0] * p, [2.0] * p, [0.0] * p
    base = simulate_schedule("1f1b", f, b, w, m).total_s
    with_p2p = simulate_schedule("1f1b", f, b, w, m, p2p_s=d).total_s
    folded = simulate_schedule("1f1b", [x + d for x in f], [x + d for x in b], w, m).total_s
    assert base + 2 * (p - 1) * d - 1e-9 <= with_p2p <= folded + 1e-9
    assert with_p2p > base


def test_deferred_w_runs_after_its_b_and_every_op_once():
    p, m = 4, 8
    sim = simulate_schedule("zb-h1", [1.0] * p, [1.0] * p, [1.0] * p, m)
    for tl in sim.timeline:
        seen = {}
        for o in tl:
            seen[(o.kind, o.microbatch)] = o
        assert len(tl) == 3 * m
        for i in range(m):
            assert seen[("W", i)].start_s >= seen[("B", i)].end_s
            assert seen[("B", i)].start_s >= seen[("F", i)].end_s


def test_no_rank_runs_two_ops_at_once():
    sim = simulate_schedule("interleaved-1f1b", [1.0, 1.1, 0.9, 1.0], [2.0] * 4, [1.0] * 4, 8, 2)
    for tl in sim.timeline:
        for a, b in zip(tl, tl[1:]):
            assert b.start_s >= a.end_s - 1e-12


def test_deadlock_is_reported():
    # rank 0 wants B of micro-batch 0 before it ran any forward
    order = [[("B", 0, 0), ("F", 0, 0)], [("F", 0, 0), ("B", 0, 0)]]
    with pytest.raises(ValueError, match="deadlock"):
        simulate(2, 1, 1, [1.0, 1.0], [1.0, 1.0], [0.0, 0.0], order, get_schedule("1f1b").stage_index)


def test_bad_stage_placement_is_rejected():
    with pytest.raises(ValueError, match="stage_index"):
        simulate(2, 1, 1, [1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [[], []], lambda p, v, r, c: 0)


def test_per_chunk_tables():
    assert per_chunk([2.0, 4.0], 2, 2) == [[1.0, 1.0], [2.0, 2.0]]
    assert per_chunk([[1.0, 3.0], [2.0, 2.0]], 2, 2) == [[1.0, 3.0], [2.0, 2.0]]
    with pytest.raises(ValueError):
        per_chunk([1.0], 2, 1)


def test_v_shape_placement_is_played():
    """A V placement (rank r holds stages r and 2p-1-r) runs through the same engine: BFS order on it."""
    p, m, v = 3, 4, 2
    order = [get_schedule("bfs").order(p, m, v, r) for r in range(p)]
    sim = simulate(p, m, v, [2.0] * p, [4.0] * p, [0.0] * p, order,
                   lambda p_, v_, r, c: r if c == 0 else 2 * p_ - 1 - r)
    # last rank runs stage p-1 then stage p back to back: its chunk-1 forwards need no P2P wait
    assert sim.total_s >= m * 6.0
    assert max(sim.peak_inflight) == m


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), times=st.lists(st.floats(0.1, 3.0), min_size=6, max_size=6))
def test_busy_time_is_m_times_stage_time_and_total_covers_it(p, m, times):
    f, b = times[:p], [2 * x for x in times[:p]]
    w = [0.5 * x for x in times[:p]]
    sim = simulate_schedule("1f1b" if p > 1 else "gpipe", f, b, w, m)
    for r in range(p):
        assert sim.busy_s[r] == pytest.approx(m * (f[r] + b[r] + w[r]))
    assert sim.total_s >= max(sim.busy_s) - 1e-9
    assert sim.total_s >= sum(f) + sum(b) + w[0] - 1e-9  # one micro-batch's round trip
