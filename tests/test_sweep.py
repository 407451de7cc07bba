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


# ---- hardware co-design (issue 15): varied profiles, prices, a token budget ----------------------------------------
def test_vary_sweeps_every_combination_with_a_column_per_field():
    df = planner.sweep(["llama-3.1-8b", "llama-3.1-70b"], ["h100-80gb-sxm", "a100-80gb-sxm"], [8, 16], [64], [2048],
                       processes=1, search=pure_dp_search,
                       vary={"gpu.hbm_gib": [80, 141], "inter_node.bandwidth_gb_s": [25, 100]})
    assert len(df) == 2 * 2 * 4 * 2
    cols = list(df.columns)
    assert cols[cols.index("seq_len") + 1:cols.index("seq_len") + 3] == ["gpu.hbm_gib", "inter_node.bandwidth_gb_s"]
    # the cluster name carries its changes, and the columns match it row by row (the product order)
    for r in df.itertuples(index=False):
        assert f"gpu.hbm_gib={getattr(r, '_5'):g}" in r.cluster and f"bandwidth_gb_s={getattr(r, '_6'):g}" in r.cluster
    # the usable memory is the varied HBM less the profile's reserve: 61 GiB more at 141 than at 80, per profile
    limits = df.groupby([df.cluster.str.split("[").str[0], "gpu.hbm_gib"]).memory_limit_gib.first().unstack()
    assert (limits[141] - limits[80]).round(6).tolist() == [61.0, 61.0]


def test_varied_profile_changes_what_the_cost_model_reads():
    from planner.specs.hardware import cluster_variant, load_cluster
    base = load_cluster("h100-80gb-sxm")
    v = cluster_variant("h100-80gb-sxm", {"gpu.hbm_gib": 141, "node.gpus_per_node": 72,
                                          "node.inter_node.bandwidth_gb_s": 100})
    assert v.gpu.hbm_bytes == pytest.approx(141 * 1024**3) and v.gpus_per_node == 72
    assert v.inter_node.bandwidth_bytes_per_s == pytest.approx(2 * base.inter_node.bandwidth_bytes_per_s)
    assert v.gpu.peak_flops == base.gpu.peak_flops and v.name.startswith("h100-80gb-sxm[")
    with pytest.raises(PlannerError) as e:
        cluster_variant("h100-80gb-sxm", {"gpu.hbm": 80})
    assert e.value.source == "--vary" and "gpu.hbm_gib" in e.value.fix
    with pytest.raises(PlannerError) as e:  # the profile's own checks still apply
        cluster_variant("h100-80gb-sxm", {"node.gpus_per_node": 7.5})
    assert "gpus_per_node" in str(e.value)


def test_more_memory_or_a_faster_network_never_makes_the_best_plan_slower():
    df = planner.sweep("llama-3.1-70b", "h100-80gb-sxm", [64], [128], [8192], processes=1,
                       vary={"gpu.hbm_gib": [60, 80, 141], "inter_node.bandwidth_gb_s": [12.5, 50]})
    heat = df.pivot(index="gpu.hbm_gib", columns="inter_node.bandwidth_gb_s", values="step_time_s")
    assert (heat.diff(axis=0).dropna() <= 1e-9).all().all() and (heat.diff(axis=1).dropna(axis=1) <= 1e-9).all().all()
    assert heat.iloc[0, 0] > heat.iloc[-1, -1]  # and here they do help


def test_cost_columns_by_hand():
    df = planner.sweep("llama-3.1-8b", ["h100-80gb-sxm", "a100-80gb-sxm"], 8, 64, 4096, processes=1,
                       search=pure_dp_search, prices={"h100-80gb-sxm": 3.0}, train_tokens=1e12)
    h100, a100 = df.iloc[0], df.iloc[1]
    assert h100.price_per_gpu_hour_usd == 3.0
    assert h100.cost_per_million_tokens_usd == pytest.approx(3.0 * 8 / 3600 / h100.tokens_per_s * 1e6)
    assert h100.time_to_train_days == pytest.approx(1e12 / h100.tokens_per_s / 86400)
    assert h100.cost_to_train_usd == pytest.approx(3.0 * 8 * h100.time_to_train_days * 24)
    assert pd.isna(a100.price_per_gpu_hour_usd) and pd.isna(a100.cost_per_million_tokens_usd)
    assert a100.time_to_train_days == pytest.approx(1e12 / a100.tokens_per_s / 86400)
    one = planner.sweep("llama-3.1-8b", "a100-80gb-sxm", 8, 64, 4096, processes=1, search=pure_dp_search, prices=2)
    assert one.iloc[0].price_per_gpu_hour_usd == 2.0


def test_a_profiles_price_is_read_and_checked(tmp_path):
    import json

    from planner.specs.hardware import hardware_profiles_dir, load_cluster
    data = json.loads((hardware_profiles_dir() / "h100-80gb-sxm.json").read_text())
    data["price_per_gpu_hour_usd"] = 2.25
    path = tmp_path / "priced.json"
    path.write_text(json.dumps(data))
    assert load_cluster(str(path)).price_per_gpu_hour_usd == 2.25
    df = planner.sweep("llama-3.1-8b", str(path), 8, 64, 4096, processes=1, search=pure_dp_search)
    assert df.iloc[0].price_per_gpu_hour_usd == 2.25
    data["price_per_gpu_hour_usd"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(PlannerError) as e:
        load_cluster(str(path))
    assert e.value.field == "price_per_gpu_hour_usd"


def test_cli_codesign_sweep(tmp_path):
    out = tmp_path / "codesign.csv"
    r = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "64", "--seq-len", "4096", "--vary", "gpu.hbm_gib=80,141",
                            "--vary", "node.gpus_per_node=8,72", "--price-per-gpu-hour", "h100-80gb-sxm=2.5",
                            "--train-tokens", "15e12", "--csv", str(out), "--jobs", "1"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    df = pd.read_csv(out)
    assert len(df) == 4 and set(df["node.gpus_per_node"]) == {8, 72}
    assert df.cost_per_million_tokens_usd.notna().all() and df.time_to_train_days.notna().all()
    assert "tokens" in r.output and "$" in r.output  # the table's cost column
    assert "h100-80gb-sxm[gpu.hbm_gib=141" in r.output.replace("\n", "").replace("│", "").replace(" ", "")


@pytest.mark.parametrize("extra,needle", [
    (["--vary", "gpu.hbm=80"], "gpu.hbm_gib"),
    (["--vary", "gpu.hbm_gib"], "PATH=VALUES"),
    (["--vary", "gpu.hbm_gib=eighty"], "not a number"),
    (["--price-per-gpu-hour", "-2"], "positive"),
    (["--price-per-gpu-hour", "h100=x"], "not a number"),
    (["--train-tokens", "0"], "--train-tokens"),
])
def test_cli_codesign_errors_name_the_option(extra, needle):
    r = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "64", *extra])
    assert r.exit_code != 0 and needle in r.output and "Traceback" not in r.output


# ---- the dask backend (issue 15): the same frame as the process pool, rows kept as they finish -------------------
DASK_ARGS = (["llama-3.1-8b"], ["h100-80gb-sxm", "a100-80gb-sxm"], [8, 16], [64], [2048, 4096])


def test_dask_backend_gives_the_process_pools_frame_on_a_local_cluster_and_a_scheduler():
    from distributed import LocalCluster  # in the test install: a missing one fails, never skips

    pool = planner.sweep(*DASK_ARGS, processes=2)
    seen = []
    local = planner.sweep(*DASK_ARGS, processes=2, backend="dask", on_row=lambda i, row: seen.append(i))
    pd.testing.assert_frame_equal(pool, local)
    assert sorted(seen) == list(range(len(pool)))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        remote = planner.sweep(*DASK_ARGS, backend="dask", scheduler=cluster.scheduler_address)
    pd.testing.assert_frame_equal(pool, remote)


def test_backend_errors():
    with pytest.raises(PlannerError) as e:
        planner.sweep(*DASK_ARGS, backend="ray")
    assert e.value.source == "--backend"
    with pytest.raises(PlannerError) as e:
        planner.sweep(*DASK_ARGS, scheduler="tcp://127.0.0.1:8786")
    assert e.value.source == "--scheduler"


def test_cli_keeps_finished_rows_when_a_sweep_fails(tmp_path, monkeypatch):
    calls = []
    real = sweep_module.run_scenario

    def failing(job):
        if len(calls) == 3:
            raise RuntimeError("node lost")
        calls.append(job)
        return real(job)

    monkeypatch.setattr(sweep_module, "run_scenario", failing)
    out = tmp_path / "rows.csv"
    r = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm,a100-80gb-sxm",
                            "--gpus", "8,16", "--global-batch", "64", "--jobs", "1", "--csv", str(out)])
    assert r.exit_code != 0 and "kept the 3 finished rows" in r.output
    kept = pd.read_csv(tmp_path / "rows.csv.partial")
    assert kept["index"].tolist() == [0, 1, 2] and kept.feasible.all() and not out.exists()
    monkeypatch.setattr(sweep_module, "run_scenario", real)
    r = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm,a100-80gb-sxm",
                            "--gpus", "8,16", "--global-batch", "64", "--jobs", "1", "--csv", str(out),
                            "--backend", "dask"])
    assert r.exit_code == 0, r.output
    assert len(pd.read_csv(out)) == 4 and not (tmp_path / "rows.csv.partial").exists()


def test_sweep_takes_the_runs_optimizer_moments_and_swiglu_store():
    """--adam-moments and --activation-fp8-input-store reach every scenario's search (fewer bytes: a lower peak on
    the same best layout, or another layout that fits; the store's casts cost a few percent of the step); a stack
    that cannot run them fails once, and a model without gated MLPs keeps its row with the reason."""
    kw = dict(processes=1, precision="fp8")
    base = planner.sweep("llama-3.1-8b", "h100-80gb-sxm", 8, 64, 8192, **kw).iloc[0]
    lean = planner.sweep("llama-3.1-8b", "h100-80gb-sxm", 8, 64, 8192, adam_moments="bf16",
                         activation_fp8_input_store=True, **kw).iloc[0]
    assert base.feasible and lean.feasible
    assert base.step_time_s < lean.step_time_s <= base.step_time_s * 1.05
    same_layout = all(base[c] == lean[c] for c in ("tp", "pp", "cp", "micro_batch_size", "zero_stage", "recompute"))
    assert lean.peak_memory_gib < base.peak_memory_gib or not same_layout
    with pytest.raises(PlannerError, match="torchtitan"):
        planner.sweep("llama-3.1-8b", "h100-80gb-sxm", 8, 64, 8192, stack="torchtitan", adam_moments="bf16",
                      processes=1)
    gelu = planner.sweep("gpt3-175b", "h100-80gb-sxm", 64, 64, 2048, activation_fp8_input_store=True,
                         processes=1).iloc[0]
    assert not gelu.feasible and "SwiGLU only" in gelu.error
    r = runner.invoke(app, ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "64", "--seq-len", "8192", "--adam-moments", "fp16"])
    assert r.exit_code == 2 and "--adam-moments" in r.output
