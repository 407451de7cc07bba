"""``planner.sweep``: one row per scenario in product order, infeasible rows kept, process pool == in-process,
and the ``planner sweep`` command with its CSV."""

from __future__ import annotations

import importlib
import time

import pandas as pd
import pytest
from typer.testing import CliRunner

import planner
from planner.cli import app
from planner.cost.step import estimate
from planner.errors import InfeasibleError, PlannerError
from planner.plan import Plan
from planner.specs.config import RunConfig

sweep_module = importlib.import_module("planner.sweep")
runner = CliRunner()


def pure_dp_search(model, cluster, num_gpus, global_batch_size, seq_len, **kw):
    """A stand-in search with a known answer: pure data parallelism, one sequence per micro-batch."""
    if global_batch_size % num_gpus:
        raise InfeasibleError(f"batch {global_batch_size} not divisible by {num_gpus} GPUs")
    cfg = RunConfig(num_gpus=num_gpus, global_batch_size=global_batch_size, seq_len=seq_len, micro_batch_size=1)
    return Plan(model, cluster.name, cfg, estimate(model, cluster, cfg, check=False))


def test_sweep_rows_follow_the_product_order():
    df = planner.sweep(["llama-3.1-8b"], ["h100-80gb-sxm", "a100-80gb-sxm"], [8, 16], [64, 24], [2048, 4096],
                       processes=1, search=pure_dp_search)
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == list(sweep_module.COLUMNS)
    assert len(df) == 2 * 2 * 2 * 2
    expected = [(c, n, b, s) for c in ("h100-80gb-sxm", "a100-80gb-sxm") for n in (8, 16) for b in (64, 24)
                for s in (2048, 4096)]
    assert list(df[["cluster", "num_gpus", "global_batch_size", "seq_len"]].itertuples(index=False, name=None)) \
        == expected
    # 24 sequences on 16 GPUs is infeasible for pure DP: the row stays, with the reason
    bad = df[(df.num_gpus == 16) & (df.global_batch_size == 24)]
    assert len(bad) == 4 and not bad.feasible.any() and bad.error.str.contains("not divisible").all()
    assert bad.step_time_s.isna().all()
    good = df[df.feasible]
    assert (good.dp == good.num_gpus).all() and (good.num_microbatches == good.global_batch_size // good.dp).all()
    assert (good.tokens_per_s_per_gpu * good.num_gpus - good.tokens_per_s).abs().max() < 1e-6


def test_sweep_values_match_a_direct_estimate():
    df = planner.sweep("llama-3.1-8b", "h100-80gb-sxm", 8, 64, 4096, processes=1, search=pure_dp_search)
    from planner.specs.hardware import load_cluster
    from planner.specs.model import load_model
    m, c = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    est = estimate(m, c, RunConfig(num_gpus=8, global_batch_size=64, seq_len=4096), check=False)
    row = df.iloc[0]
    assert row.step_time_s == pytest.approx(est.step_time_s) and row.mfu == pytest.approx(est.mfu)
    assert row.peak_memory_gib == pytest.approx(est.peak_memory_gib)


def test_process_pool_gives_the_same_frame_and_reports_progress():
    args = (["llama-3.1-8b", "llama-3.1-70b"], "h100-80gb-sxm", [8, 16, 32, 64], [64, 96, 128], [2048, 8192])
    seen = []
    parallel = planner.sweep(*args, processes=2, search=pure_dp_search, progress=lambda d, t: seen.append((d, t)))
    serial = planner.sweep(*args, processes=1, search=pure_dp_search)
    pd.testing.assert_frame_equal(parallel, serial)
    assert len(parallel) == 48
    assert seen[-1] == (48, 48) and [d for d, _ in seen] == list(range(1, 49))


def test_sweep_input_errors():
    with pytest.raises(PlannerError, match="unknown model"):
        planner.sweep("no-such-model", "h100-80gb-sxm", 8, 64, 2048, search=pure_dp_search)
    with pytest.raises(PlannerError, match="positive integers"):
        planner.sweep("llama-3.1-8b", "h100-80gb-sxm", [8, 0], 64, 2048, search=pure_dp_search)
    with pytest.raises(PlannerError, match="at least one value"):
        planner.sweep("llama-3.1-8b", [], 8, 64, 2048, search=pure_dp_search)


def test_pareto_front():
    df = pd.DataFrame({"peak_memory_gib": [10, 20, 15, 30, 20], "tokens_per_s": [100, 300, 90, 310, 250]})
    front = sweep_module.pareto_front(df)
    assert list(front.peak_memory_gib) == [10, 20, 30] and list(front.tokens_per_s) == [100, 300, 310]


def test_cli_sweep_writes_csv(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_module, "default_search", pure_dp_search)
    out = tmp_path / "sweep.csv"
    res = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm,a100-80gb-sxm",
                              "--gpus", "8,16", "--gpus", "32", "--global-batch", "64", "--seq-len", "2048",
                              "--jobs", "1", "--csv", str(out)])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    assert len(df) == 6 and list(df.num_gpus) == [8, 16, 32, 8, 16, 32]
    assert "Best plan per scenario (6 scenarios, 6 feasible)" in res.stdout
    assert "wrote 6 rows" in res.stderr


def test_cli_sweep_errors():
    res = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "eight",
                              "--global-batch", "64"])
    assert res.exit_code == 2 and "not an integer: 'eight'" in res.stderr
    res = runner.invoke(app, ["sweep", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "64"])
    assert res.exit_code == 2 and "--model" in res.stderr


def test_sweep_with_the_real_search():
    t0 = time.perf_counter()
    df = planner.sweep("llama-3.1-8b", ["h100-80gb-sxm", "a100-80gb-sxm"], [8, 64], [256], [4096], processes=1)
    elapsed = time.perf_counter() - t0
    assert len(df) == 4 and df.feasible.all()
    assert (df.tp * df.pp * df.cp * df.dp == df.num_gpus).all()
    assert (df.peak_memory_gib <= df.memory_limit_gib).all()
    # H100 is faster than A100 for the same scenario
    h100 = df[df.cluster == "h100-80gb-sxm"].step_time_s.to_numpy()
    a100 = df[df.cluster == "a100-80gb-sxm"].step_time_s.to_numpy()
    assert (h100 < a100).all()
    assert elapsed < 30


def test_sweep_for_a_launcher():
    df = planner.sweep("llama-3.1-70b", "h100-80gb-sxm", [64], [256], [8192], launcher="megatron", processes=1)
    row = df.iloc[0]
    assert row.feasible and (row.pp == 1 or row.schedule in ("1f1b", "interleaved-1f1b"))
    assert row.pp == 1 or row.zero_stage <= 1
    with pytest.raises(PlannerError, match="unknown launcher"):
        planner.sweep("llama-3.1-8b", "h100-80gb-sxm", 8, 64, 2048, launcher="slurm")
    with pytest.raises(PlannerError, match="custom search"):
        planner.sweep("llama-3.1-8b", "h100-80gb-sxm", 8, 64, 2048, launcher="megatron", search=pure_dp_search)
