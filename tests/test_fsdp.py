"""ZeRO-3 / FSDP timed unit by unit, as PyTorch FSDP, torchtitan, Megatron-FSDP and DeepSpeed run it: each decoder
layer's weights gathered before its forward and again before its backward (not the last of forward), its
gradients reduce-scattered after its backward, the next unit prefetched under this one's compute."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.data_parallel import (DPCollectives, dp_collectives, dp_exposed_s, dp_groups,
                                        zero3_exposed_per_microbatch_s)
from planner.cost.step import estimate
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model

A100 = load_cluster("a100-80gb-sxm")
#: AWS p4d.24xlarge: 8 A100 40/80 GB per instance with 400 Gb/s of EFA per instance (aws.amazon.com/ec2/instance-
#: types/p4), i.e. 50 Gb/s = 6.25 GB/s per GPU: the kind of network the ZeRO-3 scaling studies ran on (MiCS, Zhang
#: et al. 2022, Sec. 2: "ZeRO-3 ... communication overhead ... grows with the number of GPUs" on p4d)
P4D = replace(A100, name="p4d", inter_node=replace(A100.inter_node, bandwidth_bytes_per_s=6.25e9))
LLAMA8 = load_model("llama-3.1-8b")


def _unit(ag, rs, n):
    return DPCollectives(all_reduce_s=0.0, reduce_scatter_s=0.0, all_gather_s=0.0, unit_all_gather_s=ag,
                         unit_reduce_scatter_s=rs, units=float(n))


def test_one_micro_batch_unit_by_unit_by_hand():
    """11 units, a gather of 10 ms and a reduce-scatter of 10 ms each; forward 88 ms, backward 198 ms: the 10
    prefetched gathers (100 ms) hide under 10/11 of forward (80 ms) but 20 ms; backward's 10 re-gathers and
    reduce-scatters (200 ms) under 10/11 of backward (180 ms) but 20 ms; plus the first gather and the last
    reduce-scatter (20 ms): 60 ms exposed, without interference."""
    c = _unit(0.010, 0.010, 11)
    assert c.zero3_per_gather_s == pytest.approx(21 * 0.010 + 11 * 0.010)
    assert zero3_exposed_per_microbatch_s(c, 0.088, 0.198, 0.0) == pytest.approx(0.060)
    # one unit: nothing to overlap with, its gather and reduce-scatter are exposed (it stays gathered for backward)
    assert zero3_exposed_per_microbatch_s(_unit(0.010, 0.010, 1), 5.0, 5.0, 0.0) == pytest.approx(0.020)


@settings(max_examples=60, deadline=None)
@given(ag=st.floats(1e-6, 1.0), rs=st.floats(1e-6, 1.0), n=st.integers(1, 200), f=st.floats(0, 10),
       b=st.floats(0, 20), i=st.floats(0, 0.5))
def test_exposure_lies_between_the_edges_and_the_whole_traffic(ag, rs, n, f, b, i):
    """At least the first gather and last reduce-scatter, at most every byte; never less than the traffic minus the
    (1 - i) x compute it could hide under (the search's ZeRO-3 floor, planner.search.bounds.group_floors)."""
    c = _unit(ag, rs, n)
    e = zero3_exposed_per_microbatch_s(c, f, b, i)
    assert ag + rs - 1e-12 <= e <= c.zero3_per_gather_s + 1e-12
    assert e >= c.zero3_per_gather_s - (1 - i) * (f + b) - 1e-12
    # more compute never exposes more
    assert zero3_exposed_per_microbatch_s(c, 2 * f, 2 * b, i) <= e + 1e-12


def test_a_layer_per_collective_pays_the_latency_once_per_layer():
    """The same bytes in 32 layer-sized all-gathers over 512 ranks take longer than in one (NCCL's ring latency,
    planner.cost.comm, once per call, about a millisecond over 64 nodes): a little for 500 MB layers, several times
    for 1 MB ones."""
    dense_group, expert_group = dp_groups(A100, 1, 1, 512, 1)
    params = 8e9
    one = dp_collectives(A100, dense_group, expert_group, params, 0.0, 4, units=1)
    per_layer = dp_collectives(A100, dense_group, expert_group, params, 0.0, 4, units=32)
    assert 32 * per_layer.unit_all_gather_s > one.all_gather_s
    assert 32 * per_layer.unit_all_gather_s < 2 * one.all_gather_s  # 500 MB per layer: mostly bandwidth
    tiny = dp_collectives(A100, dense_group, expert_group, 32e6, 0.0, 4, units=32)
    assert 32 * tiny.unit_all_gather_s > 2 * dp_collectives(A100, dense_group, expert_group, 32e6, 0.0, 4).all_gather_s


def test_breadth_first_gathers_once_and_exposes_only_the_edges_when_compute_is_long():
    c = _unit(0.010, 0.010, 32)
    once = dp_exposed_s(c, 3, 1.0, 2.0, 0.0, 8, True, True, True, 0.0)
    each = dp_exposed_s(c, 3, 1.0, 2.0, 0.0, 8, False, True, True, 0.0)
    assert once == pytest.approx(0.020) and each == pytest.approx(8 * 0.020)


def _step(cluster, n, gbs=1024, seq=1024):
    cfg = RunConfig(num_gpus=n, global_batch_size=gbs, micro_batch_size=gbs // n, seq_len=seq, zero_stage=3,
                    recompute="full", sequence_parallel=False)
    return estimate(LLAMA8, cluster, cfg, check=False)


def test_zero3_step_time_flattens_then_rises_with_gpus_at_a_fixed_global_batch():
    """Issue 10's shape: at a fixed global batch (1024 x 1K tokens, one micro-batch per GPU), Llama-3.1-8B under
    ZeRO-3 on p4d-like nodes (6.25 GB/s per GPU) speeds up almost linearly while compute dominates, then stops:
    each step still gathers the whole model twice and scatters its gradients once, a fixed amount of traffic per
    GPU, while compute per GPU keeps halving; past that, the rings' latency, paid once per layer per collective,
    grows with the number of nodes and the step gets slower."""
    t = {n: _step(P4D, n).step_time_s for n in (8, 16, 256, 512, 1024)}
    assert t[16] < 0.55 * t[8]  # compute-bound: near-linear
    assert t[512] > 0.85 * t[256]  # communication-bound: flat
    assert t[1024] > t[512]  # and slower again: per-layer ring latency over 128 nodes
    dp = {n: _step(P4D, n).breakdown["dp_comm_s"] for n in (256, 512, 1024)}
    assert dp[256] < dp[512] < dp[1024]  # exposed traffic grows as compute shrinks under it, latency as rings grow
    # on the fast InfiniBand of the shipped A100 profile (25 GB/s per GPU) the same runs stay compute-bound longer
    assert _step(A100, 1024).step_time_s < 0.5 * t[1024]


def test_estimates_use_the_ranks_layers_as_units():
    """A pipeline rank's units are its layers: 4 stages of Llama-3.1-8B hold 8 each."""
    cfg = RunConfig(num_gpus=64, pp=4, global_batch_size=64, seq_len=2048, zero_stage=3, sequence_parallel=False,
                    schedule="1f1b")
    e = estimate(LLAMA8, A100, cfg, check=False)
    assert [s.layers for s in e.stages] == [(8,), (8,), (8,), (8,)]
    assert np.isfinite(e.breakdown["dp_comm_s"]) and e.breakdown["dp_comm_s"] > 0
