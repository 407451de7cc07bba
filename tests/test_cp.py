"""Context parallelism: ring attention and DeepSpeed-Ulysses formulas pinned to their papers, the load-balanced
causal split, long-context attention cost, CP memory, validity rules and the estimate at 32K-1M tokens."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.cost import comm
from planner.cost.compute import ATTENTION_CORE_OPS, attention_core_s, layer_ops, model_flops_per_step
from planner.cost.context_parallel import (balanced_causal_work, cp_layer_cost, kv_bytes_per_token,
                                           ring_comm_bytes_per_layer, ring_kv_block_bytes,
                                           ring_min_tokens_per_rank, ulysses_bytes, ulysses_volume_elements)
from planner.cost.memory import activation_bytes_per_layer
from planner.cost.step import estimate
from planner.cost.validity import config_problems
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from planner.validation.compare import load_runs

H100 = load_cluster("h100-80gb-sxm")
A100 = load_cluster("a100-80gb-sxm")
L8B = load_model("llama-3.1-8b")
L405B = load_model("llama-3.1-405b")
GPT22B = load_model("megatron-gpt-22b")  # multi-head attention (K/V heads = heads)


# ---------------------------------------------------------------------------------------------------------------
# Load-balanced causal split (Megatron-Core CP: 2 cp chunks, rank i keeps chunks i and 2cp-1-i)
# ---------------------------------------------------------------------------------------------------------------
@given(st.integers(min_value=1, max_value=32))
def test_balanced_split_gives_every_rank_half_a_block_at_every_step(cp):
    work = balanced_causal_work(cp)
    assert all(w == pytest.approx(0.5) for row in work for w in row)
    # together the ranks cover exactly the causal triangle: (s/T)^2 / 2 blocks of T x T, T = s / cp
    assert sum(map(sum, work)) == pytest.approx(cp * cp / 2)


@given(st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=6))
@settings(max_examples=30, deadline=None)
def test_balanced_split_matches_token_level_count(cp, chunk):
    """Count (query, key) pairs with key <= query token by token: every rank at every step gets the same share,
    half a block plus the diagonal's half (which vanishes relative to the block as chunks grow)."""
    s = 2 * cp * chunk
    T = s // cp
    owner = {}
    for r in range(cp):
        for c in (r, 2 * cp - 1 - r):
            for tok in range(c * chunk, (c + 1) * chunk):
                owner[tok] = r
    pairs = {}
    for q in range(s):
        for k in range(q + 1):
            i, src = owner[q], owner[k]
            step = (i - src) % cp
            pairs[(i, step)] = pairs.get((i, step), 0) + 1
    counts = set(pairs.get((i, j), 0) for i in range(cp) for j in range(cp))
    # non-diagonal steps: exactly T^2 / 2 pairs; the local step adds the 2 * chunk diagonal tokens' half
    off_diag = {pairs.get((i, j), 0) for i in range(cp) for j in range(1, cp)}
    assert off_diag <= {T * T // 2}
    assert {pairs[(i, 0)] for i in range(cp)} == {T * T // 2 + T // 2}
    assert len(counts) <= 2


# ---------------------------------------------------------------------------------------------------------------
# Ring attention (Liu et al. 2023): volume per step and the overlap condition
# ---------------------------------------------------------------------------------------------------------------
def test_ring_kv_block_bytes_llama3_405b_cp16():
    """Llama 3 405B at 131072 tokens with TP 8, CP 16 (Dubey et al. 2024, Table 4): 8192 tokens per rank, 8 K/V
    heads of 128 over TP 8 = one head of K and one of V, bf16 -> 8192 x 2 x 128 x 2 B = 4 MiB per ring step."""
    cfg = RunConfig(num_gpus=16384, tp=8, cp=16, pp=16, global_batch_size=128, seq_len=131072)
    assert kv_bytes_per_token(L405B, 8) == 2 * 128 * 2
    assert ring_kv_block_bytes(L405B, cfg) == 8192 * 2 * 128 * 2 == 4 * 2**20
    fwd, bwd = ring_comm_bytes_per_layer(L405B, cfg)
    assert fwd == 15 * 4 * 2**20  # cp - 1 steps
    assert bwd == 2 * fwd  # K, V and dK, dV


def test_ring_kv_block_gqa_heads_replicated_beyond_kv_heads():
    """TP larger than the K/V heads keeps one (replicated) K/V head per TP rank."""
    cfg = RunConfig(num_gpus=64, tp=8, cp=8, seq_len=65536, global_batch_size=1)
    tiny_kv = L8B.with_(num_kv_heads=4)
    assert ring_kv_block_bytes(tiny_kv, cfg) == ring_kv_block_bytes(L8B, cfg) == 8192 * 2 * 128 * 2


def test_ring_min_block_liu_et_al_table():
    """Liu et al. 2023, Sec. 3 and its table of minimal block sizes: c >= F / B. A100 (312 TFLOP/s) with NVLink
    (300 GB/s) needs about 1.0K tokens per device; over InfiniBand (12.5 GB/s) about 24.5K."""
    assert ring_min_tokens_per_rank(312e12, 300e9) == pytest.approx(1.0e3, rel=0.05)
    assert ring_min_tokens_per_rank(312e12, 12.5e9) == pytest.approx(24.5e3, rel=0.03)
    # half-block causal steps need twice the tokens
    assert ring_min_tokens_per_rank(312e12, 300e9, causal_skip=True) == 2 * ring_min_tokens_per_rank(312e12, 300e9)


@pytest.mark.parametrize("cluster", [H100, A100])
@given(seq_exp=st.integers(min_value=13, max_value=20), cp_exp=st.integers(min_value=1, max_value=6),
       tp_exp=st.integers(min_value=0, max_value=3))
@settings(max_examples=40, deadline=None)
def test_ring_exposes_only_its_interference_exactly_when_the_overlap_condition_holds(cluster, seq_exp, cp_exp, tp_exp):
    cp, tp, s = 2**cp_exp, 2**tp_exp, 2**seq_exp
    cfg = RunConfig(num_gpus=cp * tp, tp=tp, cp=cp, seq_len=s, global_batch_size=1)
    groups = comm.groups_for(cluster, tp, cp, 1, 1)
    attn_s, attn_ratio = attention_core_s(layer_ops(L8B, cfg), cluster.gpu, cfg)
    c = cp_layer_cost(L8B, cluster, cfg, groups.cp, attn_s, attn_ratio)
    assert c.step_comm_s == pytest.approx(comm.p2p_s(cluster, groups.cp.spans_nodes, ring_kv_block_bytes(L8B, cfg)))
    intf = cluster.gpu.comm_overlap_interference
    # a hidden transfer leaves only its interference (the SMs NCCL's kernels hold), as every overlapped collective
    hidden = (cp - 1) * intf * c.step_comm_s
    assert c.overlapped == (c.fwd_exposed_s == pytest.approx(hidden))
    if not c.overlapped:
        assert c.fwd_exposed_s == pytest.approx((cp - 1) * (c.step_comm_s - (1.0 - intf) * c.step_compute_s))


def test_ring_overlap_flips_at_the_analytic_block_size():
    """On an inter-node ring the transfer is hidden above c* = 2 F_eff / B_eff tokens per rank (half-block causal
    steps, per-head widths cancel for multi-head attention): check just below and above c*."""
    gpu = H100.gpu
    f_eff = gpu.peak_flops * gpu.attention_efficiency
    b_eff = H100.inter_node.bus_bandwidth_bytes_per_s
    # MHA: step FLOPs 2 T^2 (2 h) / 2 = 2 T^2 h, bytes T * 2 h * 2 -> T* = 2 f_eff / b_eff
    t_star = 2 * f_eff / b_eff
    for T, hidden in ((t_star / 4, False), (t_star * 4, True)):
        cp = 16
        s = int(T * cp) // 32 * 32
        cfg = RunConfig(num_gpus=8 * cp, tp=8, cp=cp, seq_len=s, global_batch_size=1)
        groups = comm.groups_for(H100, 8, cp, 1, 1)
        assert groups.cp.spans_nodes
        attn_s, attn_ratio = attention_core_s(layer_ops(GPT22B, cfg), gpu, cfg)
        c = cp_layer_cost(GPT22B, H100, cfg, groups.cp, attn_s, attn_ratio)
        assert bool(c.overlapped) is hidden


# ---------------------------------------------------------------------------------------------------------------
# Ulysses (Jacobs et al. 2023): all-to-all volume
# ---------------------------------------------------------------------------------------------------------------
def test_ulysses_volume_is_4Nh_over_P_for_multi_head_attention():
    """Jacobs et al. 2023, Sec. 3.2: per-GPU volume 4 N h / P per layer forward. With the all-to-all keeping 1/P
    local, each GPU sends (P-1)/P of its Q, K, V and output: 4 N h / P x (P - 1)/P elements."""
    N, P = 32768, 8
    h = GPT22B.hidden_size
    cfg = RunConfig(num_gpus=P, cp=P, cp_kind="ulysses", seq_len=N, global_batch_size=1)
    qkv, out = ulysses_bytes(GPT22B, cfg)
    assert qkv == 3 * N / P * h * 2 and out == N / P * h * 2
    assert ulysses_volume_elements(N, h, P) == 4 * N * h / P
    sent_elements = (P - 1) / P * (qkv + out) / 2
    assert sent_elements == pytest.approx(ulysses_volume_elements(N, h, P) * (P - 1) / P)
    c = cp_layer_cost(GPT22B, H100, cfg, comm.groups_for(H100, 1, P, 1, 1).cp, 1.0, 2.5)
    assert c.fwd_bytes == pytest.approx(sent_elements * 2) and c.bwd_bytes == c.fwd_bytes


def test_ulysses_gqa_sends_less_than_mha_and_replicates_kv_heads():
    cfg = RunConfig(num_gpus=8, cp=8, cp_kind="ulysses", seq_len=65536, global_batch_size=1)
    qkv, out = ulysses_bytes(L8B, cfg)  # 32 heads, 8 K/V heads: exactly one K/V head per rank
    T = 65536 / 8
    assert qkv == T * (4096 + 2 * 1024) * 2 and out == T * 4096 * 2
    cfg16 = cfg.with_(num_gpus=16, cp=16)  # 8 K/V heads over 16 ranks: each K/V head goes to 2 ranks
    qkv16, _ = ulysses_bytes(L8B, cfg16)
    assert qkv16 == 65536 / 16 * (4096 + 16 * 2 * 128) * 2


def test_ulysses_all_to_all_time_uses_the_group_placement():
    cfg = RunConfig(num_gpus=16, cp=16, cp_kind="ulysses", seq_len=131072, global_batch_size=1)
    inside = cp_layer_cost(L8B, H100, cfg.with_(num_gpus=8, cp=8), comm.groups_for(H100, 1, 8, 1, 1).cp, 1.0, 2.5)
    across = cp_layer_cost(L8B, H100, cfg, comm.groups_for(H100, 1, 16, 1, 1).cp, 1.0, 2.5)
    assert across.fwd_exposed_s > inside.fwd_exposed_s > 0


# ---------------------------------------------------------------------------------------------------------------
# Attention at long context
# ---------------------------------------------------------------------------------------------------------------
def test_ring_merges_move_what_transformer_engine_moves():
    """Transformer Engine's ring attention (AttnFuncWithCPAndKVP2P, v2.9, bf16 sbhd) merges its steps' partial
    results: forward the first step's output copied in (4 B per element) and each later one added over the rows it
    covers (6 B; 3/4 of a rank's rows on average under the balanced causal split), backward dQ and dK / dV the same
    way after one copy of K / V (4 B). Llama 3.1 8B at 8K with CP 2 on TP 1: 4,096 tokens a rank, 4,096-wide output,
    1,024-wide K and V: forward 8.5 B x 16.8 M elements = 142.6 MB, backward 8.5 B x 25.2 M + 4 B x 8.4 M = 247.5 MB.
    Nothing without ring CP, with Ulysses or without a fused kernel."""
    from planner.cost.compute import ring_merge_op

    cfg = RunConfig(num_gpus=8, cp=2, seq_len=8192, global_batch_size=8)
    op = ring_merge_op(L8B, cfg)
    out, kv = 4096 * 4096, 4096 * 2 * 1024
    assert float(op.hbm_bytes) == pytest.approx(out * (4 + 6 * 0.75))
    assert float(op.hbm_bytes * op.bwd_ratio) == pytest.approx((out + kv) * (4 + 6 * 0.75) + 4 * kv)
    assert float(op.hbm_bytes) == pytest.approx(142.6e6, rel=1e-3)
    for other in (cfg.with_(cp=1), cfg.with_(cp_kind="ulysses"), cfg.with_(flash_attention=False)):
        assert float(ring_merge_op(L8B, other).hbm_bytes) == 0.0
    # in the estimate: the same layout costs more with the merges than its attention core and K/V ring alone
    ops = {o.name: o for o in layer_ops(L8B, cfg)}
    assert "cp_ring_merge" in ops and float(ops["cp_ring_merge"].hbm_bytes) == float(op.hbm_bytes)


def test_flash_kernel_halves_the_causal_attention_core():
    cfg = RunConfig(num_gpus=1, seq_len=32768, global_batch_size=1)
    flash = {o.name: o for o in layer_ops(L8B, cfg)}
    dense = {o.name: o for o in layer_ops(L8B, cfg.with_(flash_attention=False))}
    # one of the two attention-core operators runs, the other has no work
    assert flash["attention_core_unfused"].flops == 0 and dense["attention_core"].flops == 0
    flash, dense = flash["attention_core"], dense["attention_core_unfused"]
    assert flash.flops == pytest.approx(dense.flops / 2)
    # 4 s^2 h per layer (Narayanan Eq. 3's s/(6h) term): QK^T and scores x V
    assert dense.flops == pytest.approx(4 * 32768**2 * 4096)


def test_s_squared_term_dominates_at_one_million_tokens():
    cfg = RunConfig(num_gpus=64, cp=64, seq_len=2**20, global_batch_size=1)
    ops = layer_ops(L8B, cfg)
    attn = sum(o.flops for o in ops if o.name in ATTENTION_CORE_OPS)
    assert attn / sum(o.flops for o in ops) > 0.95
    # model FLOPs per token: attention's 4 s q_dim per layer against ~6N/3 for the GEMMs
    per_token = model_flops_per_step(L8B, 1, 2**20) / 2**20
    assert 3 * 4 * 2**20 * 4096 * 32 / per_token > 0.95


@given(st.integers(min_value=0, max_value=6), st.sampled_from(["none", "selective", "full"]))
def test_activations_divide_by_cp(cp_exp, recompute):
    cp = 2**cp_exp
    base = RunConfig(num_gpus=8, tp=8, seq_len=131072, global_batch_size=1)
    one = activation_bytes_per_layer(L8B, base, recompute)
    split = activation_bytes_per_layer(L8B, base.with_(num_gpus=8 * cp, cp=cp), recompute)
    assert split == pytest.approx(one / cp)


def test_ring_buffers_show_in_workspace():
    cfg = RunConfig(num_gpus=64, tp=8, cp=8, seq_len=131072, global_batch_size=1, recompute="selective")
    est = estimate(L8B, H100, cfg)
    assert est.stages[0].memory_bytes["workspace"] >= 4 * ring_kv_block_bytes(L8B, cfg)


# ---------------------------------------------------------------------------------------------------------------
# Validity rules the search relies on
# ---------------------------------------------------------------------------------------------------------------
def _problems(model, **kw):
    return [opt for opt, _ in config_problems(model, H100, RunConfig(**kw))]


def test_cp_validity_rules():
    assert _problems(L8B, num_gpus=16, cp=16, seq_len=131072, global_batch_size=1) == []
    assert "cp" in _problems(L8B, num_gpus=8, cp=8, seq_len=131072 + 8, global_batch_size=1)  # not / 2cp
    assert "cp" in _problems(L8B, num_gpus=64, cp=64, cp_kind="ulysses", seq_len=131072, global_batch_size=1)
    assert "cp" in _problems(L8B, num_gpus=64, tp=8, cp=8, cp_kind="ulysses", seq_len=131072,
                             global_batch_size=1)  # 32 heads over tp*cp = 64
    assert _problems(L8B, num_gpus=32, cp=32, cp_kind="ulysses", seq_len=131072, global_batch_size=1) == []
    assert "cp_kind" in _problems(L8B, num_gpus=8, cp=8, cp_kind="allgather", seq_len=8192, global_batch_size=1)


@given(tp=st.sampled_from([1, 2, 4, 8]), cp=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
       kind=st.sampled_from(["ring", "ulysses"]), seq=st.sampled_from([4096, 32768, 131072, 1 << 20, 100000]))
@settings(max_examples=80, deadline=None)
def test_every_valid_cp_config_estimates(tp, cp, kind, seq):
    cfg = RunConfig(num_gpus=tp * cp, tp=tp, cp=cp, cp_kind=kind, seq_len=seq, global_batch_size=1,
                    recompute="full")
    if config_problems(L8B, H100, cfg):
        assert seq % (2 * cp) or (kind == "ulysses" and 32 % (tp * cp))
        return
    est = estimate(L8B, H100, cfg)
    assert est.step_time_s > 0 and est.breakdown["cp_comm_s"] >= 0
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s, rel=1e-9)


# ---------------------------------------------------------------------------------------------------------------
# Published long-context configurations
# ---------------------------------------------------------------------------------------------------------------
def test_llama3_405b_cp16_published_config():
    """Dubey et al. 2024 (Llama 3), Table 4: 405B at 131072 tokens on 16384 H100s with TP 8, CP 16, PP 16, DP 8
    reached 38% BF16 MFU. The ring K/V transfer (4 MiB over the NIC) hides under the 8192-token block attention;
    the estimate fits in memory. Counting only the unmasked half of the attention FLOPs (what a causal flash
    kernel executes) the MFU lands close to the published figure; the full-square (Megatron Eq. 7) count reads
    higher, since at 128K the attention scores are most of the work."""
    run = next(r for r in load_runs() if r["id"] == "llama3-405b-16384gpu-cp16-s131072")  # held-out row
    conf = dict(run["config"], layers_per_stage=tuple(run["config"]["layers_per_stage"]))
    cfg = RunConfig(**conf)
    assert (cfg.tp, cfg.cp, cfg.pp, cfg.dp, cfg.seq_len) == (8, 16, 16, 8, 131072)
    est = estimate(L405B, H100, cfg)
    assert est.fits
    # the transfer hides; what stays is its interference with the attention it hides under, a sliver of the step
    assert 0.0 < est.breakdown["cp_comm_s"] < 0.01 * est.step_time_s
    half = model_flops_per_step(L405B, 128, 131072, causal_half=True) / model_flops_per_step(L405B, 128, 131072)
    assert est.mfu * half == pytest.approx(0.38, rel=0.25)


def test_one_million_tokens_llama_8b_fits_and_is_attention_bound():
    """The examples' case: Llama-3.1-8B at 1M tokens per sequence."""
    cfg = RunConfig(num_gpus=256, tp=8, cp=32, global_batch_size=1, seq_len=2**20, recompute="full")
    est = estimate(L8B, H100, cfg)
    assert est.fits
    assert est.breakdown["cp_comm_s"] < 0.05 * est.step_time_s


def test_estimate_cli_takes_cp_kind():
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus",
                                 "32", "--cp", "32", "--cp-kind", "ulysses", "--global-batch", "1", "--seq-len",
                                 "262144", "--recompute", "full", "--json"])
    assert r.exit_code == 0, r.output
    assert '"cp_kind": "ulysses"' in r.stdout
    bad = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus",
                                   "64", "--cp", "64", "--cp-kind", "ulysses", "--global-batch", "1", "--seq-len",
                                   "262144"])
    assert bad.exit_code == 2 and "Ulysses" in bad.output


@given(tp=st.sampled_from([1, 2, 8]), cp=st.sampled_from([1, 2, 16]), ep=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 3]), kind=st.sampled_from(["ring", "ulysses"]),
       rec=st.sampled_from(["none", "selective", "full"]), moe=st.booleans())
@settings(max_examples=120, deadline=None)
def test_per_layer_cache_matches_the_uncached_layer_cost(tp, cp, ep, pp, zero, kind, rec, moe):
    """step._layer_cost is memoized on the knobs a layer depends on (and primed by the search from a batch); the
    result must not change."""
    from planner.cost.step import LAYER_COSTS, _floats, _layer_cost, batch_costs, layer_costs
    model = load_model("mixtral-8x7b")
    gpus = tp * cp * pp * 8
    cfg = RunConfig(num_gpus=gpus, tp=tp, cp=cp, pp=pp, ep=ep, cp_kind=kind, zero_stage=zero, recompute=rec,
                    seq_len=32768, global_batch_size=64, sequence_parallel=tp > 1 or zero == 3)
    groups = comm.groups_for(H100, tp, cp, cfg.dp, pp, ep)
    uncached = _floats(layer_costs(model, H100, cfg, groups, model.layer_kinds[moe]))
    LAYER_COSTS.clear()
    assert _layer_cost(model, H100, cfg, groups, moe) == uncached
    assert _layer_cost(model, H100, cfg, groups, moe) == uncached  # from the memo
    # seeded from a batch holding it among others
    from planner.specs.config import ConfigBatch
    LAYER_COSTS.clear()
    LAYER_COSTS.seed(model, H100, cfg, batch_costs(model, H100, ConfigBatch.of([cfg.with_(micro_batch_size=3), cfg])),
                     1)
    primed = _layer_cost(model, H100, cfg, groups, moe)
    for f in dataclasses.fields(primed):
        assert getattr(primed, f.name) == pytest.approx(getattr(uncached, f.name), rel=1e-12, abs=0), f.name
    other = cfg.with_(micro_batch_size=2, cp_kind="ring" if kind == "ulysses" else "ulysses")
    batch = ConfigBatch.of([other, cfg])
    bgroups = comm.groups_for(H100, batch.tp, batch.cp, cfg.dp, pp, batch.ep)
    many = layer_costs(model, H100, batch, bgroups, model.layer_kinds[moe])
    one = _layer_cost(model, H100, cfg, groups, moe)
    for f in dataclasses.fields(one):
        assert np.broadcast_to(getattr(many, f.name), (2,))[1] == pytest.approx(getattr(one, f.name), rel=1e-12,
                                                                               abs=0), f.name
