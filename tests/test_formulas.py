"""Every formula of the foundation pinned to a published number."""

import pytest

from planner.cost import comm
from planner.cost.compute import (gpt_full_recompute_flops_eq3, gpt_model_flops_eq7, gpt_selective_hardware_flops_eq8,
                                  model_flops_per_step)
from planner.cost.memory import (activation_bytes_per_layer, active_params, gpt_params_eq2, korthikanti_table2,
                                 model_state_bytes, StageParams, total_params)
from planner.specs.config import RunConfig
from planner.specs.collectives import IDEAL_COLLECTIVES
from planner.specs.hardware import Cluster, Link, load_cluster
from planner.specs.model import DENSE_LAYER, load_model, model_from_config


def gpt(h, L, a, V=51200, s=2048):
    return model_from_config({"model_type": "gpt2", "n_embd": h, "n_layer": L, "n_head": a, "vocab_size": V,
                              "n_positions": s})


# ---- parameters -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,published", [
    ("llama-3.1-8b", 8_030_261_248),     # HF model card / safetensors index total
    ("llama-3.1-70b", 70_553_706_496),
    ("llama-3.1-405b", 405_853_388_800),
])
def test_llama_parameter_counts_match_published(name, published):
    assert total_params(load_model(name)) == published


@pytest.mark.parametrize("h,L,a,published_b", [
    (6144, 48, 64, 22.0), (12288, 96, 96, 175.0), (20480, 105, 128, 529.6), (25600, 128, 160, 1008.0),
    (2304, 24, 24, 1.7), (8192, 48, 64, 39.1), (16384, 96, 128, 310.1),
])
def test_gpt_parameters_follow_eq2_and_the_published_sizes(h, L, a, published_b):
    m = gpt(h, L, a)
    n = total_params(m, 2048)
    # Eq. 2 leaves out the final LayerNorm (2h parameters); everything else is the same count
    assert n - 2 * h == pytest.approx(gpt_params_eq2(L, h, 51200, 2048), rel=1e-12)
    assert n / 1e9 == pytest.approx(published_b, rel=0.03)


def test_mixtral_active_vs_total_parameters():
    m = load_model("mixtral-8x7b")
    assert total_params(m) / 1e9 == pytest.approx(46.7, abs=0.05)
    assert active_params(m) / 1e9 == pytest.approx(12.9, abs=0.05)


# ---- activations: Korthikanti et al. 2022 Table 2 -----------------------------------------------------------------
@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("b,s", [(1, 2048), (4, 2048), (2, 4096)])
def test_activation_bytes_reduce_to_table2_for_gpt(t, b, s):
    h, a = 6144, 64
    m = gpt(h, 48, a, s=s)

    def act(sp, rec):
        cfg = RunConfig(num_gpus=t, tp=t, micro_batch_size=b, seq_len=s, sequence_parallel=sp, recompute=rec,
                        flash_attention=False)
        return activation_bytes_per_layer(m, cfg)

    assert act(False, "none") == pytest.approx(korthikanti_table2(s, b, h, a, t, "tp"))
    assert act(True, "none") == pytest.approx(korthikanti_table2(s, b, h, a, t, "tp_sp"))
    assert act(False, "selective") == pytest.approx(korthikanti_table2(s, b, h, a, t, "tp_selective"))
    assert act(True, "selective") == pytest.approx(korthikanti_table2(s, b, h, a, t, "tp_sp_selective"))
    assert act(False, "full") == pytest.approx(korthikanti_table2(s, b, h, a, t, "full"))
    if t == 1:
        assert act(False, "none") == pytest.approx(s * b * h * (34 + 5 * a * s / h))


def test_korthikanti_table3_memory_175b_first_stage():
    """Korthikanti Sec. 4.2.3: 175B, TP 8 PP 8, s 2048, b 1: first-stage activations with TP+SP+selective are
    (s b h L / t) * 34 over the p in-flight micro-batches (L/p layers each), i.e. 34 s b h L / t bytes."""
    s, b, h, L, t = 2048, 1, 12288, 96, 8
    m = gpt(h, L, 96)
    cfg = RunConfig(num_gpus=64, tp=t, pp=8, micro_batch_size=b, seq_len=s, sequence_parallel=True,
                    recompute="selective", flash_attention=False)
    per_layer = activation_bytes_per_layer(m, cfg)
    assert per_layer * (L // 8) * 8 == pytest.approx(34 * s * b * h * L / t)
    # 34 * 2048 * 12288 * 96 / 8 bytes = 9.6 GiB
    assert per_layer * L / 2**30 == pytest.approx(9.56, abs=0.01)


# ---- FLOPs: Narayanan Eq. 3, Korthikanti Eq. 7 / 8 and the published MFU / HFU -------------------------------------
@pytest.mark.parametrize("h,L,a", [(6144, 48, 64), (12288, 96, 96), (20480, 105, 128), (25600, 128, 160)])
def test_model_flops_equal_eq7_for_gpt(h, L, a):
    m = gpt(h, L, a)
    assert model_flops_per_step(m, 64, 2048) == pytest.approx(gpt_model_flops_eq7(64, 2048, L, h, 51200), rel=1e-12)


@pytest.mark.parametrize("h,L,gpus,B,t_s,mfu,hfu", [
    (6144, 48, 8, 4, 1.10, 0.415, 0.437),
    (12288, 96, 64, 64, 13.75, 0.514, 0.528),
    (20480, 105, 280, 280, 37.83, 0.560, 0.570),
    (25600, 128, 512, 512, 71.49, 0.563, 0.570),
])
def test_eq7_eq8_reproduce_korthikanti_table5_mfu_hfu(h, L, gpus, B, t_s, mfu, hfu):
    peak = 312e12
    assert gpt_model_flops_eq7(B, 2048, L, h, 51200) / (t_s * gpus * peak) == pytest.approx(mfu, abs=0.004)
    assert gpt_selective_hardware_flops_eq8(B, 2048, L, h, 51200) / (t_s * gpus * peak) == pytest.approx(hfu, abs=0.004)


def test_eq3_is_eq7_plus_one_forward_of_the_layers():
    """Eq. 3 (full recompute) = Eq. 7 + one more forward of the transformer layers (not of the LM head, 6BshV)."""
    B, s, L, h, V = 8, 2048, 24, 2304, 51200
    eq7 = gpt_model_flops_eq7(B, s, L, h, V)
    head = 6 * B * s * h * V
    assert gpt_full_recompute_flops_eq3(B, s, L, h, V) == pytest.approx(eq7 + (eq7 - head) / 3, rel=1e-12)


# ---- model states: ZeRO ------------------------------------------------------------------------------------------
def test_zero_paper_7_5b_on_64_gpus():
    """Rajbhandari et al. 2020 Fig. 1: 7.5B parameters, Nd = 64: 120 GB baseline, 31.4 GB P_os, 16.6 GB P_os+g,
    1.9 GB P_os+g+p."""
    p = StageParams(dense=7.5e9, expert=0.0, largest_layer=0.0)
    gb = [sum(model_state_bytes(p, z, 64, 64).values()) / 1e9 for z in (0, 1, 2, 3)]
    assert gb == pytest.approx([120.0, 31.4, 16.6, 1.875], abs=0.1)


def test_sharded_gradients_under_pipeline_stages_stay_unsharded_in_the_reduce_dtype():
    """FSDP2 under torch.distributed.pipelining (the stacks that shard gradients with PP: torchtitan, NeMo AutoModel)
    syncs gradients only at the last micro-batch and accumulates them unsharded in the reduce dtype: the ZeRO paper's
    7.5B on 64 GPUs with fp32 reduction holds 30 GB of gradients at ZeRO-2 / 3 under pipeline stages where it holds
    0.47 GB without; weights, optimizer states and ZeRO-0 / 1 are unchanged."""
    p = StageParams(dense=7.5e9, expert=0.0, largest_layer=0.0)
    for z in (0, 1, 2, 3):
        flat = model_state_bytes(p, z, 64, 64, grad_bytes=4)
        piped = model_state_bytes(p, z, 64, 64, grad_bytes=4, pipelined=True, accumulated_grad_bytes=4)
        assert piped["weights"] == flat["weights"] and piped["optimizer"] == flat["optimizer"]
        assert piped["gradients"] == pytest.approx(30e9 if z >= 2 else flat["gradients"])
    assert model_state_bytes(p, 2, 64, 64, grad_bytes=4)["gradients"] == pytest.approx(30e9 / 64)


# ---- collectives -------------------------------------------------------------------------------------------------
def _toy_cluster(intra_gb_s=100.0, inter_gb_s=10.0, gpn=8):
    a100 = load_cluster("a100-80gb-sxm")
    return Cluster("toy", a100.gpu, gpn, Link("nv", intra_gb_s * 1e9, 0.0, 1.0), Link("ib", inter_gb_s * 1e9, 0.0, 1.0),
                   collectives=IDEAL_COLLECTIVES)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_collectives_inside_a_node(n):
    c = _toy_cluster()
    g = comm.place_group(n, 1, 8)
    M = 1e9
    assert not g.spans_nodes
    assert comm.all_reduce_s(c, g, M) == pytest.approx(2 * (n - 1) / n * M / 100e9)
    assert comm.reduce_scatter_s(c, g, M) == pytest.approx((n - 1) / n * M / 100e9)
    assert comm.all_gather_s(c, g, M) == pytest.approx((n - 1) / n * M / 100e9)
    assert comm.all_to_all_s(c, g, M) == pytest.approx((n - 1) / n * M / 100e9)


def test_group_spanning_nodes_is_limited_by_the_nic():
    c = _toy_cluster()
    M = 1e9
    one_per_node = comm.place_group(16, 8, 8)  # DP group with TP 8 inside the node: one member per node
    assert one_per_node.spans_nodes and one_per_node.members_per_node == 1
    assert comm.all_reduce_s(c, one_per_node, M) == pytest.approx(2 * 15 / 16 * M / 10e9)
    four_per_node = comm.place_group(16, 2, 8)  # 4 members per node: 4 NICs' worth of ring bandwidth
    assert comm.all_reduce_s(c, four_per_node, M) == pytest.approx(2 * 15 / 16 * M / 40e9)
    assert comm.p2p_s(c, True, M) == pytest.approx(M / 10e9)
    assert comm.p2p_s(c, False, M) == pytest.approx(M / 100e9)


def test_collective_latency_is_nccls_tuner_composition():
    """NCCL v2.30 src/graph/tuning.cc: a tiny all-reduce costs the fastest protocol's base latency plus its hop
    latencies. 8 ranks in a node: ring LL, 6.6 + 2*7*0.6 = 15.0 us. 16 ranks on 2 nodes: tree LL,
    6.8 + 2*(7*0.6 + log2(2)*5.0) = 25.2 us (the ring's 6.6 + 2*14*0.6 + 2*1*2.7 = 28.8 us loses)."""
    a100 = load_cluster("a100-80gb-sxm")
    c = Cluster("toy", a100.gpu, 8, Link("nv", 1e15, 5e-6, 1.0), Link("ib", 1e15, 1e-5, 1.0))
    assert comm.all_reduce_s(c, comm.place_group(8, 1, 8), 1.0) == pytest.approx(15.0e-6, rel=1e-6)
    assert comm.all_reduce_s(c, comm.place_group(16, 1, 8), 1.0) == pytest.approx(25.2e-6, rel=1e-6)
    # reduce-scatter over 16 ranks on 2 nodes, ring LL: 6.6 + 14*0.6 + 1*2.7 = 17.7 us
    assert comm.reduce_scatter_s(c, comm.place_group(16, 1, 8), 1.0) == pytest.approx(17.7e-6, rel=1e-6)
    # one rank per node: the network hops take the tree's latency (5.0 us for LL): 6.6 + 3*5.0 = 21.6 us
    assert comm.reduce_scatter_s(c, comm.place_group(4, 8, 8), 1.0) == pytest.approx(21.6e-6, rel=1e-6)
    # point-to-point keeps the link's own message latency
    assert comm.p2p_s(c, True, 1.0) == pytest.approx(1e-5, rel=1e-6)


@pytest.mark.parametrize("tp,cp,dp,pp,crosses", [
    (1, 1, 1, 8, False),   # the whole pipeline inside one node
    (2, 1, 2, 2, False),   # 8 GPUs: one node
    (1, 1, 1, 16, True),   # stage 7 -> 8 crosses to the next node
    (2, 1, 2, 4, True),    # stride 4: stages 0,1 on node 0, stages 2,3 on node 1
    (8, 1, 1, 2, True),
])
def test_pipeline_link_is_the_nic_once_the_pipeline_spans_nodes(tp, cp, dp, pp, crosses):
    """Every rank's send is costed alike, so the pipeline's slowest hop sets the link (as for the CP ring): the NIC
    as soon as one pair of consecutive stages sits on different nodes."""
    c = _toy_cluster()
    assert bool(comm.groups_for(c, tp, cp, dp, pp).pp_spans_nodes) is crosses


def test_tp_overlap_hides_the_backward_all_gathers_of_the_row_parallel_layers():
    """With sequence parallelism each block's row-parallel layer (attention output, second MLP) all-gathers its
    output gradient in backward. Without TP overlap those gathers are exposed; Megatron's --tp-comm-overlap runs them
    as ring exchanges inside the layers' dgrad GEMMs (Transformer Engine userbuffers' proj_dgrad / fc2_dgrad,
    RingExchangeOverlapCfg in Megatron-Bridge's comm_overlap.py), which leaves only the overlap's interference, and
    only up to the GEMMs' time."""
    from planner.cost.step import tp_layer_comm_s

    model, cluster = load_model("llama-3.1-70b"), load_cluster("h100-80gb-sxm")
    cfg = RunConfig(num_gpus=8, tp=8, global_batch_size=8, seq_len=8192, sequence_parallel=True)
    group = comm.groups_for(cluster, 8, 1, 1, 1).tp
    ag = float(comm.all_gather_s(cluster, group, cfg.tokens_per_rank * model.hidden_size * 2))
    rs = float(comm.reduce_scatter_s(cluster, group, cfg.tokens_per_rank * model.hidden_size * 2))
    intf = cluster.gpu.comm_overlap_interference
    long = [(1.0, 1.0), (1.0, 1.0)]  # each block's column / row GEMMs longer than any collective
    _, bwd_plain = tp_layer_comm_s(model, cluster, cfg.with_(tp_comm_overlap=False), group, long)
    _, bwd_overlap = tp_layer_comm_s(model, cluster, cfg.with_(tp_comm_overlap=True), group, long)
    assert float(bwd_plain) == pytest.approx(2 * ag + (2 * ag + 2 * rs) * intf, rel=1e-12)
    assert float(bwd_overlap) == pytest.approx((4 * ag + 2 * rs) * intf, rel=1e-12)
    # one block's row-parallel GEMM half its gather: half of that gather sticks out
    _, short = tp_layer_comm_s(model, cluster, cfg.with_(tp_comm_overlap=True), group, [(1.0, 0.5 * ag), (1.0, 1.0)])
    assert float(short) == pytest.approx(0.5 * ag + (3.5 * ag + 2 * rs) * intf, rel=1e-12)


def test_tp_overlap_pairs_each_collective_with_its_own_gemm():
    """Transformer Engine's userbuffers hide the all-gather under the column-parallel GEMM that consumes it and the
    reduce-scatter under the row-parallel GEMM that produces it: a long MLP does not hide the attention block's
    collectives. Llama 3.1 405B on 8 H100 with SP, fp8, 4,096 tokens a micro-batch (the CP 2 shard of an 8K
    sequence, as Megatron-Bridge's H100 recipe runs it): the qkv and output projections are shorter than their
    0.35 ms gather and scatter, so part of each sticks out, where pooling every GEMM of the layer would have hidden
    them all."""
    from planner.cost.compute import layer_ops, tp_overlap_windows
    from planner.cost.data_parallel import exposed_s
    from planner.cost.step import tp_layer_comm_s

    model, cluster = load_model("llama-3.1-405b"), load_cluster("h100-80gb-sxm")
    cfg = RunConfig(num_gpus=8, tp=8, global_batch_size=8, seq_len=4096, sequence_parallel=True,
                    tp_comm_overlap=True, precision="fp8")
    group = comm.groups_for(cluster, 8, 1, 1, 1).tp
    msg = cfg.tokens_per_rank * model.hidden_size * 2  # the micro-batch's activation, bf16
    assert float(comm.all_gather_s(cluster, group, msg)) == pytest.approx(0.35e-3, rel=0.01)
    ag, rs = (float(f(cluster, group, msg)) for f in (comm.all_gather_s, comm.reduce_scatter_s))
    (qkv, proj), (fc1, fc2) = [tuple(float(x) for x in w) for w in
                               tp_overlap_windows(layer_ops(model, cfg), cluster.gpu, DENSE_LAYER)]
    assert qkv < ag and proj < rs and fc1 > ag and fc2 > rs  # the attention block's GEMMs are the short ones
    intf = cluster.gpu.comm_overlap_interference
    fwd, _ = tp_layer_comm_s(model, cluster, cfg, group, [(qkv, proj), (fc1, fc2)])
    by_hand = exposed_s(ag, qkv, intf) + exposed_s(rs, proj, intf) + (ag + rs) * intf
    assert float(fwd) == pytest.approx(by_hand, rel=1e-12)
    pooled = exposed_s(2 * (ag + rs), qkv + proj + fc1 + fc2, intf)  # what pooling all the layer's GEMMs gives
    assert float(fwd) > pooled * 1.4


def test_qk_norm_reads_and_writes_queries_and_keys_and_keeps_its_inputs():
    """Qwen3's QK-norm (Megatron-Core q_layernorm / k_layernorm): per token and layer an RMSNorm pass over this TP
    rank's queries and keys, (q + kv) / t elements read and written in bf16 (4 B each way), twice that in backward,
    and its inputs kept for backward, 2 (q + kv) / t bytes; none for a model without one (Llama)."""
    from dataclasses import replace
    from pathlib import Path

    from planner.cost.compute import elementwise_ops
    from planner.cost.memory import activation_bytes_per_layer

    qwen = load_model(str(Path(__file__).parents[1] / "planner/validation/models/qwen3-235b-a22b.json"))
    assert qwen.qk_norm == "head"
    cfg = RunConfig(num_gpus=8, tp=2, global_batch_size=8, seq_len=4096, sequence_parallel=True)
    q, kv, t, T = qwen.q_dim, qwen.kv_dim, 2, cfg.tokens_per_rank
    op = {o.name: o for o in elementwise_ops(qwen, cfg, DENSE_LAYER)}["qk_norm"]
    assert float(op.hbm_bytes) == 2 * T * 2 * (q + kv) / t and op.bwd_ratio == 2.0
    assert "qk_norm" not in {o.name for o in elementwise_ops(load_model("llama-3.1-8b"), cfg, DENSE_LAYER)}
    plain = replace(qwen, qk_norm="")
    extra = activation_bytes_per_layer(qwen, cfg, "none") - activation_bytes_per_layer(plain, cfg, "none")
    assert float(extra) == T * 2 * (q + kv) / t


def test_the_device_gemm_benchmark_times_the_cost_models_gemms():
    """benchmarks/device_gemm_shapes.py (run on a lent GPU) times a layer's GEMMs at the shapes the cost model prices:
    its forward GEMMs hold the FLOPs of compute.layer_ops' GEMMs and the LM head's, and its prediction is the
    profile curve the model reads (Megatron-Core weak-scaling 1.7B, TP 1, 4,096 tokens: QKV 4096 x 2048 x 6144)."""
    import importlib.util
    from pathlib import Path

    from planner.cost.compute import head_ops, layer_ops
    from planner.specs.config import RunConfig
    from planner.specs.hardware import load_cluster

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "device_gemm_shapes.py"
    spec = importlib.util.spec_from_file_location("device_gemm_shapes", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = bench.load("megatron-ws-gpt-1.7b")
    gemms = bench.layer_gemms(model, 1, 4096)
    assert gemms[0] == ("qkv_proj", 4096, 2048, 6144)
    cfg = RunConfig(num_gpus=1, seq_len=4096, global_batch_size=1, precision="bf16")
    model_flops = sum(float(o.flops) for o in layer_ops(model, cfg) + head_ops(model, cfg)
                      if o.kind == "gemm" and o.name != "attention_core_unfused")
    assert sum(2.0 * m * k * n for _, m, k, n in gemms) == pytest.approx(model_flops)
    assert [p[0] for p in bench.passes(4096, 2048, 6144)] == ["fwd", "dgrad", "wgrad"]
    gpu = load_cluster("h100-80gb-sxm").gpu
    assert float(gpu.matmul_efficiency(2.0 * 4096 * 2048 * 6144)) == pytest.approx(0.598, abs=0.001)
