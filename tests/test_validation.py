"""Accuracy against the public validation set (issue 2 acceptance), measured by running the model."""

import statistics

import pytest

from planner.cost import comm
from planner.cost.step import _layer_cost
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model
from planner.validation import validate


@pytest.fixture(scope="module")
def rows():
    return validate()


def _errors(rows, table):
    return [abs(r.error) for r in rows if r.table == table]


def test_korthikanti_table5_all_eight_iteration_times(rows):
    errs = _errors(rows, "korthikanti2022_table5")
    assert len(errs) == 8
    assert statistics.mean(errs) <= 0.03
    assert max(errs) <= 0.06


def test_narayanan_table1_throughput(rows):
    errs = _errors(rows, "narayanan2021_table1")
    assert len(errs) == 10
    assert statistics.mean(errs) <= 0.05
    assert max(errs) <= 0.10


def test_selective_recompute_is_faster_than_full_as_published(rows):
    by_id = {r.id: r for r in rows}
    for size in ("22B", "175B", "530B", "1T"):
        full = by_id[f"korthikanti-t5-{size}-full"]
        sel = by_id[f"korthikanti-t5-{size}-selective"]
        # Korthikanti et al. report 29-31% shorter iterations with SP + selective recompute
        assert 0.20 <= 1 - sel.estimated / full.estimated <= 0.35


@pytest.mark.parametrize("sp,recompute,fwd_ms,bwd_ms", [
    (False, "none", 7.7, 11.9), (True, "none", 7.2, 11.8), (False, "full", 7.7, 19.5),
    (False, "selective", 7.7, 13.2), (True, "selective", 7.2, 13.1),
])
def test_korthikanti_table4_single_layer_times(sp, recompute, fwd_ms, bwd_ms):
    """Korthikanti Table 4: one 22B layer (TP 8, b 4, s 2048). The A100 profile is scaled for whole iterations
    (see its matmul_efficiency.source), so single-layer kernels come out a few per cent slow: within 12%."""
    model, cluster = load_model("megatron-gpt-22b"), load_cluster("a100-80gb-sxm")
    cfg = RunConfig(num_gpus=8, tp=8, global_batch_size=4, micro_batch_size=4, seq_len=2048, sequence_parallel=sp,
                    recompute=recompute, flash_attention=False, zero_stage=0)
    lc = _layer_cost(model, cluster, cfg, comm.groups_for(cluster, 8, 1, 1, 1), False)
    fwd = lc.fwd_s + lc.tp_fwd_s
    bwd = (lc.bwd_input_s + lc.bwd_weight_s) + lc.tp_bwd_s
    if recompute == "full":
        bwd += fwd
    elif recompute == "selective":
        bwd += lc.selective_recompute_s
    assert fwd * 1e3 == pytest.approx(fwd_ms, rel=0.12)
    assert bwd * 1e3 == pytest.approx(bwd_ms, rel=0.12)


def test_heldout_llama3_rows_stay_within_their_reported_error(rows):
    """Never fitted: guard against silent regressions. The README reports 9.0% mean / 15.0% max on these (2026-12-05:
    7.6 / 13.3 before the interleaved schedule's pipeline sends were priced as overlapped, Megatron-Core's
    overlap_p2p_comm, which moved the 8,192-GPU row from +13.3% to +15.0%; all three rows are optimistic)."""
    held = [r for r in rows if r.heldout]
    assert len(held) == 3 and all(r.table == "heldout_llama3_table4" for r in held)
    errs = [abs(r.error) for r in held]
    assert statistics.mean(errs) <= 0.10
    assert max(errs) <= 0.16


def test_memory_bound_efficiency_is_checked_on_published_norm_kernels():
    """cudnn-frontend's normalization benchmark (github NVIDIA/cudnn-frontend @ df73764, benchmark/norms: RMSNorm
    forward and backward at ten models' shapes, cuDNN 9.19.1), priced as the cost model prices a norm, implies the
    fraction of HBM bandwidth the kernel reached: 0.883 on H200, 0.795 on GB200, within 0.04 of the profiles' 0.85 and
    0.80 (B200 carries GB200's check: the same die). H100 keeps the A100 fit's 0.72 and says so beside it."""
    import json

    from planner.specs.hardware import hardware_profiles_dir, load_cluster
    from planner.validation.memory_check import implied_efficiency, load_rows

    rows = {r["profile"]: r for r in load_rows()}
    assert set(rows) == {"h200-141gb-sxm", "gb200-nvl72"} and all(r["use"] == "check" for r in rows.values())
    assert implied_efficiency(rows["h200-141gb-sxm"]) == pytest.approx(0.883, abs=0.002)
    assert implied_efficiency(rows["gb200-nvl72"]) == pytest.approx(0.795, abs=0.002)
    for name in ("h200-141gb-sxm", "gb200-nvl72"):
        assert abs(load_cluster(name).gpu.memory_bound_efficiency - implied_efficiency(rows[name])) < 0.04
    for name in ("h100-80gb-sxm", "h200-141gb-sxm", "gb200-nvl72", "b200-180gb"):
        source = json.loads((hardware_profiles_dir() / f"{name}.json").read_text())["gpu"]
        assert "memory_kernels.json" in source["memory_bound_efficiency_source"]
