"""``planner plan`` through the CLI runner: JSON shape, terminal view, caps, objectives, errors, --emit."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.schema import validate_plan_json

runner = CliRunner()
BASE = ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16", "--global-batch", "64",
        "--seq-len", "4096"]


@pytest.fixture(scope="module")
def plan_json() -> dict:
    r = runner.invoke(app, BASE + ["--json", "--timings", "--top", "2"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_json_has_the_estimate_fields_plus_alternatives_and_search(plan_json):
    d = plan_json
    validate_plan_json(d)
    assert set(d["parallelism"]) >= {"tp", "pp", "dp", "cp", "vpp", "sequence_parallel", "zero_stage"}
    assert set(d["batch"]) == {"global_batch_size", "micro_batch_size", "num_microbatches", "seq_len"}
    assert d["parallelism"]["tp"] * d["parallelism"]["pp"] * d["parallelism"]["dp"] * d["parallelism"]["cp"] == 16
    assert d["batch"]["global_batch_size"] == 64 and d["batch"]["seq_len"] == 4096
    assert sum(d["layers_per_stage"]) == 32
    assert d["estimate"]["fits"] is True
    assert len(d["alternatives"]) == 2
    times = [d["estimate"]["step_time_s"]] + [a["estimate"]["step_time_s"] for a in d["alternatives"]]
    assert times == sorted(times)
    s = d["search"]
    assert s["candidates"] > 10_000 and s["exact_evaluations"] >= 1 and s["time_s"] > 0
    assert s["candidates"] >= s["pruned_by_memory_bound"] + s["pruned_by_objective_bound"] + s["exact_evaluations"] - \
        s.get("partitions_tried", 0)
    assert s["bound_violations"] == 0 and s["objective"] == "time"


def test_json_configuration_reestimates_identically(plan_json):
    """The best plan is an ordinary configuration: `planner estimate` with its knobs gives the same step time."""
    d = plan_json
    p, b = d["parallelism"], d["batch"]
    if d["recompute"].get("layers_per_stage") is not None or len(set(d["layers_per_stage"])) > 1:
        pytest.skip("uneven partitions are not expressible with estimate's options")
    args = ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16",
            "--global-batch", "64", "--seq-len", "4096", "--tp", str(p["tp"]), "--pp", str(p["pp"]),
            "--cp", str(p["cp"]), "--vpp", str(p["vpp"]), "--micro-batch", str(b["micro_batch_size"]),
            "--recompute", d["recompute"]["mode"], "--zero", str(p["zero_stage"]), "--schedule", d["schedule"],
            "--sequence-parallel" if p["sequence_parallel"] else "--no-sequence-parallel", "--json"]
    if p["cp"] > 1:
        args += ["--cp-kind", p["cp_kind"]]
    if d["recompute"]["num_layers"] is not None:
        args += ["--recompute-num-layers", str(d["recompute"]["num_layers"])]
    r = runner.invoke(app, args)
    if r.exit_code == 2 and "No such option" in r.output:
        pytest.skip("estimate lacks an option this plan uses")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["estimate"]["step_time_s"] == pytest.approx(d["estimate"]["step_time_s"], rel=1e-12)


def test_terminal_view_ranks_plans_and_explains_the_winner():
    r = runner.invoke(app, BASE + ["--top", "3"])
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "Top plans by step time" in out and "Why #1:" in out and "searched" in out
    assert "slower per step" in out
    for rank in ("1", "2", "3", "4"):
        assert f"│ {rank} │" in out


def test_memory_objective_and_cap():
    r = runner.invoke(app, BASE + ["--json", "--objective", "memory", "--top", "1"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["estimate"]["peak_memory_gib"] <= d["alternatives"][0]["estimate"]["peak_memory_gib"]
    r = runner.invoke(app, BASE + ["--json", "--max-memory-gib", "30", "--top", "3"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    for p in [d] + d["alternatives"]:
        assert p["estimate"]["peak_memory_gib"] <= 30


def test_infeasible_request_exits_1_with_the_nearest_fix():
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-405b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "8", "--seq-len", "8192"])
    assert r.exit_code == 1
    assert "Traceback" not in r.output
    assert "needs at least" in r.stderr and "--gpus" in r.stderr


def test_emit_writes_a_launcher_config(tmp_path):
    out = tmp_path / "megatron.sh"
    r = runner.invoke(app, BASE + ["--emit", "megatron", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "--tensor-model-parallel-size" in out.read_text()
    assert "Top plans" in r.stdout


@pytest.mark.parametrize("extra,source", [
    (["--objective", "speed"], "--objective"),
    (["--top", "-1"], "--top"),
    (["--max-memory-gib", "0"], "--max-memory-gib"),
    (["--out", "x.sh"], "--out"),
    (["--json", "--emit", "megatron"], "--emit"),
])
def test_bad_options_are_usage_errors(extra, source):
    r = runner.invoke(app, BASE + extra)
    assert r.exit_code == 2, r.output
    assert source in r.stderr and "Traceback" not in r.output
