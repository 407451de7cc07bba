"""`planner estimate` through typer's runner."""

import json

import pytest

from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
BASE = ["estimate", "--model", "gpt3-175b", "--cluster", "a100-80gb-sxm", "--gpus", "1024", "--tp", "8", "--pp", "8",
        "--global-batch", "1536", "--micro-batch", "1", "--seq-len", "2048"]


def test_estimate_json_has_the_documented_fields():
    r = runner.invoke(app, BASE + ["--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    est = d["estimate"]
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_gib", "fits", "breakdown"):
        assert key in est
    assert d["parallelism"] == {"tp": 8, "pp": 8, "dp": 16, "cp": 1, "ep": 1, "vpp": 1, "sequence_parallel": True,
                                "zero_stage": 1, "cp_kind": "ring", "etp": 8, "dp_shard": None}
    assert d["batch"] == {"global_batch_size": 1536, "micro_batch_size": 1, "num_microbatches": 96, "seq_len": 2048}
    assert d["schema_version"]
    # the breakdown adds up to the step time
    assert sum(est["breakdown"].values()) == pytest.approx(est["step_time_s"], rel=1e-9)
    # throughput and MFU are consistent with the step time
    assert est["tokens_per_s"] * est["step_time_s"] == pytest.approx(1536 * 2048, rel=1e-9)
    assert 0.2 < est["mfu"] < 0.7


def test_estimate_table_output():
    r = runner.invoke(app, BASE + ["--schedule", "interleaved-1f1b", "--vpp", "3", "--recompute", "full"])
    assert r.exit_code == 0, r.output
    assert "Step time breakdown" in r.stdout and "pipeline bubble" in r.stdout
    assert "Per pipeline rank" in r.stdout


def test_estimate_rejects_an_invalid_degree_with_one_line():
    r = runner.invoke(app, BASE[:-2] + ["2048", "--tp", "3"])
    assert r.exit_code == 2
    assert "Traceback" not in r.output


def test_validate_command_prints_errors():
    r = runner.invoke(app, ["validate"])
    assert r.exit_code == 0, r.output
    assert "korthikanti2022_table5: mean |error|" in r.stdout


def test_layers_per_stage_takes_megatrons_layout_string():
    """Issue 9: `estimate` expresses every layout a plan holds, also as Megatron's --pipeline-model-parallel-layout
    (the exporter's own strings parse back to the same split)."""
    from planner.export.megatron import layout_string
    from planner.specs.config import parse_megatron_layout

    split = (1,) + (2,) * 62 + (1,)
    assert parse_megatron_layout(layout_string(split)) == split
    assert parse_megatron_layout("Et*3|(tt|)*29,m|L") == (3,) + (2,) * 29 + (0, 0)
    base = ["estimate", "--model", "llama-3.1-405b", "--cluster", "h100-80gb-sxm", "--gpus", "1024", "--tp", "8",
            "--pp", "8", "--vpp", "8", "--schedule", "interleaved-1f1b", "--global-batch", "512", "--seq-len",
            "8192", "--json"]
    by_list = json.loads(runner.invoke(app, base + ["--layers-per-stage", ",".join(map(str, split))]).stdout)
    by_layout = json.loads(runner.invoke(app, base + ["--layers-per-stage", "Et|(tt|)*62tL"]).stdout)
    assert by_layout["layers_per_stage"] == list(split)
    assert by_layout["estimate"]["step_time_s"] == by_list["estimate"]["step_time_s"]
    bad = runner.invoke(app, base + ["--layers-per-stage", "t|E(tt|)*62tL"])
    assert bad.exit_code == 2 and "--layers-per-stage" in bad.stderr and "Traceback" not in bad.output
