"""``planner explain PLAN.json``: per-stage time and memory tables and the step-time bar chart."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cli.explain import bar, stacked_bar, time_components
from planner.cost.step import estimate
from planner.plan import dumps, plan_dict
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model

runner = CliRunner()


@pytest.fixture(scope="module")
def plan() -> dict:
    spec, hw = load_model("llama-3.1-70b"), load_cluster("h100-80gb-sxm")
    cfg = RunConfig(num_gpus=64, tp=8, pp=4, global_batch_size=64, micro_batch_size=1, seq_len=4096)
    return json.loads(dumps(plan_dict(spec, hw.name, cfg, estimate(spec, hw, cfg))))


def run(path, *extra):
    res = runner.invoke(app, ["explain", str(path), *extra], env={"COLUMNS": "200"})
    return res


def test_explain_prints_stage_tables_and_chart(plan, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    res = run(path)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "re-estimated" in out
    assert "Where the step time goes" in out and "Time per pipeline rank" in out and "Peak memory per pipeline" in out
    assert "pipeline bubble" in out and "█" in out
    # one row per pipeline rank in the time table: rank, then its layers (80 layers / 4 stages)
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    time_rows = [r for r in rows if len(r) == 7 and r[1] == "20"]  # rank, layers, fwd, bwd, bwd W, recomp, per mb
    assert [r[:2] for r in time_rows] == [[str(i), "20"] for i in range(4)]
    assert "Exposed communication per pipeline rank" in out
    memory_rows = [r for r in rows if len(r) == 9]
    assert [r[0] for r in memory_rows] == ["0", "1", "2", "3"]
    stages = plan["estimate"]["stages"]
    assert [float(r[7]) for r in memory_rows] == [round(s["peak_memory_gib"], 1) for s in stages]
    assert f"{plan['estimate']['step_time_s']:.3f}" in out


def test_explain_stored_estimate_without_model_spec(plan, tmp_path):
    d = dict(plan)
    d.pop("model_spec")
    d["estimate"] = dict(d["estimate"], step_time_s=123.456)  # only the stored estimate can show this
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    res = run(path)
    assert res.exit_code == 0, res.output
    assert "stored in the plan" in res.stdout and "123.456" in res.stdout
    res = run(path, "--stored")
    assert res.exit_code == 0 and "123.456" in res.stdout


def test_explain_notes_a_changed_estimate(plan, tmp_path):
    d = dict(plan, estimate=dict(plan["estimate"], step_time_s=plan["estimate"]["step_time_s"] * 2))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    res = run(path)
    assert res.exit_code == 0 and "current cost model estimates" in res.stderr


def test_explain_errors(plan, tmp_path):
    assert run(tmp_path / "nope.json").exit_code == 2
    d = dict(plan, cluster="my-own-cluster")
    d.pop("model_spec")
    d["estimate"] = {k: v for k, v in plan["estimate"].items() if k != "stages"}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    res = run(path)
    assert res.exit_code == 2 and "no per-stage estimate" in res.stderr
    path.write_text("[1, 2]")
    assert run(path).exit_code == 2


def test_time_components_add_up_to_the_step(plan):
    est = plan["estimate"]
    parts = time_components(est)
    assert abs(sum(s for _, _, s in parts) - est["step_time_s"]) <= 1e-3 * est["step_time_s"]
    assert parts[0][0] == "compute_s"


def test_bars_scale():
    assert bar(1.0, 10) == "█" * 10
    assert bar(0.5, 10) == "█" * 5
    assert bar(0.05, 10) == "▌"  # half a cell
    assert bar(2.0, 4) == "████"  # clipped
    assert bar(0.0, 10) == ""
    stacked = stacked_bar([(1.0, "red"), (1.0, "blue"), (2.0, "green")], 8.0, 16)
    assert stacked.plain == "█" * 8


def test_every_time_component_has_a_colour():
    """Each step-time component the tables can show (render.TIME_LABELS) has a colour in the terminal chart and
    the HTML page (a component without one made explain fail on distribution-aware plans)."""
    from planner.cli.explain import COLORS
    from planner.cli.html_report import TIME_COLORS
    from planner.cli.render import TIME_LABELS

    assert set(TIME_LABELS) <= set(COLORS) and set(TIME_LABELS) <= set(TIME_COLORS)
