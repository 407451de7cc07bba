"""The CLI a user expects (issue 11): search constraints on `plan` and `sweep`, machine-readable failures under
`--json`, `estimate --require-fit`, `--version`, the model's parameter counts, warnings, and tables that stay
readable on an 80-column terminal."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner import __version__
from planner.cli import app
from planner.schema import validate_plan_json

RUNNER = CliRunner()
PLAN_70B = ["plan", "--model", "llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "256", "--global-batch", "512",
            "--seq-len", "8192"]


def run(args, **kw):
    return RUNNER.invoke(app, args, **kw)


def test_plan_keeps_to_the_given_degrees_schedules_zero_stages_and_recomputation():
    r = run(PLAN_70B + ["--tp", "8", "--pp", "1,2", "--schedules", "1f1b,interleaved-1f1b", "--zero", "1",
                        "--recompute", "none,selective", "--json", "--top", "5"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    for p in [d] + d["alternatives"]:
        par = p["parallelism"]
        assert par["tp"] == 8 and par["pp"] in (1, 2) and par["zero_stage"] == 1
        assert p["schedule"] in ("1f1b", "interleaved-1f1b") and p["recompute"]["mode"] in ("none", "selective")
    validate_plan_json(d, "plan")


def test_micro_batch_vpp_and_ep_constraints():
    r = run(["plan", "--model", "mixtral-8x7b", "--cluster", "h100-80gb-sxm", "--gpus", "64", "--global-batch", "256",
             "--seq-len", "4096", "--ep", "8", "--micro-batch", "2", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["parallelism"]["ep"] == 8 and d["batch"]["micro_batch_size"] == 2
    r = run(PLAN_70B + ["--pp", "4", "--vpp", "5", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["parallelism"]["pp"] == 4 and d["parallelism"]["vpp"] == 5


def test_constraints_a_stack_cannot_run_or_that_leave_nothing_are_one_line_errors():
    r = run(PLAN_70B + ["--schedules", "zbv"])  # megatron-core runs 1F1B and interleaved only
    assert r.exit_code == 2 and "--schedules" in r.output and "1f1b" in r.output
    assert "Traceback" not in r.output
    r = run(PLAN_70B + ["--schedules", "zbv", "--stack", "any", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["schedule"] == "zbv"
    r = run(PLAN_70B + ["--tp", "3"])
    assert r.exit_code == 1 and "within the constraints" in r.output and "TP 1,2,4,8" in r.output
    for bad, option in ((["--tp", "x"], "--tp"), (["--zero", "4"], "--zero"), (["--recompute", "some"], "--recompute"),
                        (["--schedules", "gpipe2"], "--schedules"), (["--pp", "0"], "--pp")):
        r = run(PLAN_70B + bad)
        assert r.exit_code == 2 and option in r.output, (bad, r.output)


def test_sweep_takes_the_same_constraints_and_checks_its_csv_path_first(tmp_path):
    r = run(["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16,32", "--global-batch",
             "64", "--tp", "2", "--schedules", "1f1b", "--csv", str(tmp_path / "out.csv"), "--quiet"])
    assert r.exit_code == 0, r.output
    rows = (tmp_path / "out.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",2," in row for row in rows[1:])  # tp column
    # a CSV that cannot be written fails before the first scenario, in well under a search's time
    r = run(["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16", "--global-batch", "64",
             "--csv", str(tmp_path / "missing" / "out.csv")])
    assert r.exit_code == 2 and "--csv" in r.output and "no such directory" in r.output
    r = run(["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16", "--global-batch", "64",
             "--schedules", "zbv"])
    assert r.exit_code == 2 and "--schedules" in r.output


def test_infeasible_plan_under_json_prints_a_json_object_and_exits_1():
    r = run(["plan", "--model", "llama-3.1-405b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "8",
             "--json"])
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["feasible"] is False and d["error"]["exit_code"] == 1
    assert "fits" in d["error"]["message"] and "--gpus" in d["error"]["fix"]
    # bad input under --json: an error object too, exit 2, no "feasible"
    r = run(["plan", "--model", "llama-3.1-405b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "8",
             "--precision", "fp4", "--json"])
    assert r.exit_code == 2
    d = json.loads(r.stdout)
    assert "feasible" not in d and d["error"]["source"] == "--precision"


def test_estimate_require_fit_exits_1_when_the_configuration_does_not_fit():
    base = ["estimate", "--model", "llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch",
            "8", "--json"]
    r = run(base)
    assert r.exit_code == 0 and json.loads(r.stdout)["estimate"]["fits"] is False
    r = run(base + ["--require-fit"])
    assert r.exit_code == 1 and "--require-fit" in r.output
    assert json.loads(r.stdout)["estimate"]["fits"] is False  # the estimate is still printed
    ok = run(["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch",
              "8", "--require-fit"])
    assert ok.exit_code == 0, ok.output


def test_version_everywhere():
    r = run(["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"planner {__version__}"
    r = run(["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "8",
             "--json"])
    d = json.loads(r.stdout)
    assert d["planner_version"] == __version__
    validate_plan_json(d, "estimate")


@pytest.mark.parametrize("model, total_b, active_b", [
    ("llama-3.1-8b", 8.03, None),  # Meta model card: 8.03B
    ("llama-3.1-405b", 405.85, None),  # 405.85B (HF safetensors total)
    ("mixtral-8x7b", 46.7, 12.9),  # Jiang et al. 2024: 46.7B total, 12.9B active
    ("deepseek-v3", 671, 37),  # DeepSeek-V3 report: 671B total, 37B activated
])
def test_json_and_terminal_carry_the_model_parameter_counts(model, total_b, active_b):
    r = run(["estimate", "--model", model, "--cluster", "h100-80gb-sxm", "--gpus", "64", "--global-batch", "64",
             "--json"])
    d = json.loads(r.stdout)
    assert d["model_params"]["total"] / 1e9 == pytest.approx(total_b, rel=0.02)
    if active_b is None:
        assert d["model_params"]["active"] == d["model_params"]["total"]
    else:
        assert d["model_params"]["active"] / 1e9 == pytest.approx(active_b, rel=0.03)
    text = run(["estimate", "--model", model, "--cluster", "h100-80gb-sxm", "--gpus", "64", "--global-batch", "64"])
    assert "B params" in text.stdout and (active_b is None or "active per token" in text.stdout)


def test_a_sequence_beyond_the_models_positions_is_warned_about_and_mfu_says_how_it_counts():
    r = run(["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "64", "--global-batch",
             "64", "--seq-len", "262144", "--cp", "32", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert any("131072" in w for w in d["warnings"]) and "warning:" in r.stderr
    assert d["estimate"]["mfu_attention"].startswith("full s x s square")
    plain = run(["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch",
                 "8", "--json"])
    assert "warnings" not in json.loads(plain.stdout) and "warning" not in plain.stderr


def _readable_at_80(out: str) -> None:
    """No cell cut to '…', no line wider than 80, and no table cropped at the edge (every table line ends in its
    right border)."""
    assert "…" not in out, out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    for line in lines:
        if line[:1] in "┏┃┡│└┢┣├" and line.rstrip():
            assert line.rstrip()[-1] in "┓┃┩│┘┪┫┤", line


@pytest.mark.parametrize("args", [
    PLAN_70B,
    ["plan", "--model", "deepseek-v3", "--cluster", "h800-80gb-sxm", "--gpus", "2048", "--global-batch", "4096",
     "--seq-len", "4096", "--stack", "any"],
    ["estimate", "--model", "llama-3.1-405b", "--cluster", "h100-80gb-sxm", "--gpus", "2048", "--global-batch",
     "1024", "--tp", "8", "--pp", "16", "--vpp", "4", "--seq-len", "8192", "--schedule", "interleaved-1f1b"],
    ["sweep", "--model", "llama-3.1-8b,llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "64",
     "--global-batch", "128"],
    ["validate", "--set", "all"],
    ["list", "models"], ["list", "clusters"], ["list", "stacks"], ["list", "launchers"],
])
def test_tables_read_at_80_columns_without_a_cut_number(args):
    """Issue 11: at 80 columns no cell is cut to '…' (text wraps, numbers keep their width)."""
    r = run(args, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    _readable_at_80(r.stdout)


def test_explain_reads_at_80_columns(tmp_path):
    r = run(PLAN_70B + ["--json"])
    path = tmp_path / "plan.json"
    path.write_text(r.stdout)
    r = run(["explain", str(path)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    _readable_at_80(r.stdout)


def test_list_launchers_names_the_releases_the_conformance_check_installs():
    """`planner list launchers` says which release each exporter targets; for the launchers checked by their own
    parsers that is the version conformance/requirements.txt pins."""
    from pathlib import Path

    r = run(["list", "launchers", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert set(rows) == {"megatron", "torchtitan", "torchtitan-0.3", "deepspeed", "nemo"}

    def pins(folder: str) -> dict[str, str]:
        return dict(line.split("#")[0].strip().split("==") for line in
                    (Path(__file__).parents[1] / folder / "requirements.txt").read_text().splitlines()
                    if "==" in line.split("#")[0])
    assert pins("conformance")["deepspeed"] in rows["deepspeed"]["release"]
    assert pins("conformance")["torchtitan"] in rows["torchtitan"]["release"]
    assert pins("conformance_tt03")["torchtitan"] in rows["torchtitan-0.3"]["release"]
    assert "conformance" in rows["deepspeed"]["checked_by"] and "Megatron-Bridge" in rows["nemo"]["release"]


def test_the_accuracy_line_reads_for_both_kinds_of_band():
    from planner.cli.render import accuracy_line

    same = {"same_kind_of_run": True, "group": "H100 / H200 / H800, fp8, dense", "rows": 4, "mean_abs_error": 0.019}
    assert accuracy_line(same) == ("model accuracy on published runs like this one (H100 / H200 / H800, fp8, dense, "
                                   "4 rows): ±1.9% mean error in throughput")
    assert accuracy_line({**same, "same_kind_of_run": False}).startswith(
        "model accuracy on the nearest published runs (H100 / H200 / H800, fp8, dense, 4 rows)")
    assert accuracy_line(None) == ""
