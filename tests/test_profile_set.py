"""Validation rows on clusters whose network differs from a shipped profile's (``profile_set`` in a row,
``planner estimate --profile-set PATH=VALUE``), and the public FSDP rows that need it: fms-fsdp's Llama 2 7B HSDP
benchmark on 128 A100 with 400 Gb/s per node and 96 H100 with 800 Gb/s per node."""

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.validation.compare import evaluate_modern_run, load_modern_runs, row_cluster

FMS = {r["id"]: r for r in load_modern_runs() if r["id"].startswith("FMS-")}


def test_rows_run_on_the_network_their_source_states():
    """A row's profile_set replaces the profile's numbers it names (50 and 100 Gb/s per GPU here), nothing else."""
    a100, h100 = row_cluster(FMS["FMS-A100-Llama2-7B-HSDP"]), row_cluster(FMS["FMS-H100-Llama2-7B-HSDP"])
    assert a100.inter_node.bandwidth_bytes_per_s == pytest.approx(6.25e9)
    assert h100.inter_node.bandwidth_bytes_per_s == pytest.approx(12.5e9)
    from planner.specs.hardware import load_cluster
    assert h100.gpu == load_cluster("h100-80gb-sxm").gpu


def test_fms_fsdp_hsdp_rows():
    """HSDP (FSDP inside each node, replicas across nodes), no recomputation, compiled: the A100 row -3.1%, the H100
    row +11.1% (2026-12-06; both out of sample). The command each prints reproduces its estimate."""
    rows = {k: evaluate_modern_run(r) for k, r in FMS.items()}
    assert rows["FMS-A100-Llama2-7B-HSDP"].error == pytest.approx(-0.0309, abs=0.003)
    assert rows["FMS-H100-Llama2-7B-HSDP"].error == pytest.approx(0.1108, abs=0.003)
    for row in rows.values():
        assert "FSDP / ZeRO-2/3" in row.groups and "--dp-shard 8" in row.command and "--profile-set" in row.command
        args = row.command.split()[1:] + ["--json"]
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 0, out.output
        gpus = int(args[args.index("--gpus") + 1])
        assert json.loads(out.stdout)["estimate"]["tokens_per_s"] / gpus == pytest.approx(row.estimated, rel=1e-9)


@pytest.mark.parametrize("value,match", [("inter_node.bandwidth_gb_s", "PATH=VALUE"),
                                         ("inter_node.bandwidth_gb_s=-1", "positive"),
                                         ("gpu.no_such_field=3", "no numeric field")])
def test_profile_set_errors_name_the_option(value, match):
    out = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus",
                                   "8", "--global-batch", "8", "--profile-set", value])
    assert out.exit_code != 0 and "--profile-set" in out.output and match in out.output
    assert "Traceback" not in out.output


def test_a_slower_network_slows_an_hsdp_step():
    """The replicas' gradient all-reduce crosses the nodes: at an eighth of the network the HSDP step is longer."""
    base = ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--stack", "torchtitan", "--gpus",
            "64", "--global-batch", "128", "--micro-batch", "2", "--seq-len", "4096", "--zero", "3", "--dp-shard", "8",
            "--recompute", "none", "--json"]
    fast = json.loads(CliRunner().invoke(app, base).stdout)["estimate"]["breakdown"]["dp_comm_s"]
    slow = json.loads(CliRunner().invoke(app, base + ["--profile-set", "inter_node.bandwidth_gb_s=6.25"]).stdout)
    assert slow["estimate"]["breakdown"]["dp_comm_s"] > fast
    assert slow["cluster"].endswith("[inter_node.bandwidth_gb_s=6.25]")


def test_plan_takes_it_and_its_plan_round_trips(tmp_path):
    """plan searches on the changed profile (a thin network keeps TP inside the node: an 8-way TP plan where the
    profile's network gives pure data parallelism), records the variant's name, and that name loads the variant
    again, so replan and export read the plan back."""
    from planner.specs.hardware import load_cluster
    base = ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "64", "--global-batch", "128",
            "--seq-len", "4096", "--stack", "torchtitan", "--json"]
    thin = CliRunner().invoke(app, base + ["--profile-set", "inter_node.bandwidth_gb_s=6.25"])
    wide = json.loads(CliRunner().invoke(app, base).stdout)
    d = json.loads(thin.stdout)
    assert d["cluster"] == "h100-80gb-sxm[inter_node.bandwidth_gb_s=6.25]"
    assert d["parallelism"]["tp"] > wide["parallelism"]["tp"] == 1
    assert load_cluster(d["cluster"]).inter_node.bandwidth_bytes_per_s == pytest.approx(6.25e9)
    plan = tmp_path / "plan.json"
    plan.write_text(thin.stdout)
    replan = CliRunner().invoke(app, ["replan", str(plan), "--gpus", "56"])
    assert replan.exit_code == 0, replan.output
    assert CliRunner().invoke(app, ["export", str(plan), "--to", "torchtitan"]).exit_code == 0


@pytest.mark.parametrize("value", [12.5, 12.3456789, 0.1 + 0.2, 400.0, 3e-5])
def test_a_variant_name_loads_the_very_variant(value):
    """A variant's name spells each replaced number so that it reads back as the same float (six significant digits
    would turn 12.3456789 into 12.3457): load_cluster of the name gives the cluster cluster_variant built, equal
    field by field; integers print without a decimal point."""
    from planner.specs.hardware import cluster_variant, load_cluster

    changed = {"inter_node.bandwidth_gb_s": value, "node.gpus_per_node": 4}
    made = cluster_variant("h100-80gb-sxm", changed)
    assert made.name.endswith("node.gpus_per_node=4]") and "4.0" not in made.name
    again = load_cluster(made.name)
    assert again == made
    assert again.inter_node.bandwidth_bytes_per_s == value * 1e9


def test_no_values_is_the_profile_itself():
    """cluster_variant without values is load_cluster (the estimate, plan and validation paths call it either way)."""
    from planner.specs.hardware import cluster_variant, load_cluster

    assert cluster_variant("h100-80gb-sxm", {}) == load_cluster("h100-80gb-sxm")
    assert cluster_variant("h100-80gb-sxm", {}).name == "h100-80gb-sxm"
