"""``planner list models|clusters|schedules``."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from planner.cli import app
from planner.cost.schedule import SCHEDULES
from planner.specs.hardware import shipped_clusters
from planner.specs.model import shipped_models

runner = CliRunner()


def listed(kind: str) -> list[dict]:
    res = runner.invoke(app, ["list", kind, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_list_models_shows_every_shipped_spec():
    rows = listed("models")
    assert [r["name"] for r in rows] == shipped_models()
    assert not [r for r in rows if "error" in r]
    by_name = {r["name"]: r for r in rows}
    assert abs(by_name["gpt3-175b"]["params_b"] - 175) < 1.5  # Brown et al. 2020: 175B
    assert abs(by_name["llama-3.1-405b"]["params_b"] - 405) < 2
    assert by_name["llama-3.1-405b"]["layers"] == 126 and by_name["llama-3.1-405b"]["kv_heads"] == 8


def test_list_clusters_shows_every_profile():
    from planner.specs.pools import shipped_pooled_clusters

    rows = listed("clusters")
    assert [r["name"] for r in rows] == shipped_clusters() + shipped_pooled_clusters()
    mixed = {r["name"]: r for r in rows}["h100-a100-4+4-nodes"]
    assert mixed["max_gpus"] == 64 and [p["profile"] for p in mixed["pools"]] == ["h100-80gb-sxm", "a100-80gb-sxm"]
    h100 = {r["name"]: r for r in rows}["h100-80gb-sxm"]
    assert h100["bf16_tflops"] == 989 and h100["gpus_per_node"] == 8


def test_list_schedules_names_launchers():
    rows = listed("schedules")
    assert [r["name"] for r in rows] == list(SCHEDULES)
    by_name = {r["name"]: r for r in rows}
    assert "megatron" in by_name["1f1b"]["launchers"] and "deepspeed" in by_name["1f1b"]["launchers"]
    assert "Interleaved1F1B" in by_name["interleaved-1f1b"]["launchers"]
    assert "megatron" not in by_name["gpipe"]["launchers"]


def test_list_tables_and_bad_kind():
    for kind in ("models", "clusters", "schedules"):
        res = runner.invoke(app, ["list", kind])
        assert res.exit_code == 0 and f"Shipped {kind}" in res.stdout
    assert "llama-3.1-8b" in runner.invoke(app, ["list", "models"]).stdout
    res = runner.invoke(app, ["list", "gpus"])
    assert res.exit_code == 2 and "unknown value 'gpus'" in res.stderr
