"""The plan JSON Schema: it is a valid draft 2020-12 schema shipped in the package, every JSON the planner prints
validates against it, and documents that are not plans are rejected with a message naming the field."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

import planner.schema
from planner.cli import app
from planner.cost.step import estimate
from planner.errors import PlannerError
from planner.plan import SCHEMA_VERSION, Plan, plan_dict
from planner.schema import plan_consistency_errors, plan_json_errors, plan_schema, validate_plan_json
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model, shipped_models

H100 = load_cluster("h100-80gb-sxm")
L8B = load_model("llama-3.1-8b")

# one estimate --json per kind of configuration the planner prints: plain DP, TP+PP, interleaved, ZeRO-3 with full
# recompute, ring and Ulysses CP, MoE with EP, a GPT with learned positions and biases
ESTIMATE_ARGS = [
    ["--model", "llama-3.1-8b", "--gpus", "8", "--global-batch", "64"],
    ["--model", "llama-3.1-8b", "--gpus", "16", "--tp", "2", "--pp", "2", "--global-batch", "64"],
    ["--model", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--vpp", "2", "--schedule",
     "interleaved-1f1b", "--global-batch", "64", "--seq-len", "4096"],
    ["--model", "llama-3.1-8b", "--gpus", "16", "--zero", "3", "--recompute", "full", "--global-batch", "32",
     "--no-sequence-parallel"],
    ["--model", "llama-3.1-8b", "--gpus", "32", "--tp", "4", "--cp", "4", "--global-batch", "8", "--seq-len",
     "65536"],
    ["--model", "llama-3.1-8b", "--gpus", "32", "--cp", "8", "--cp-kind", "ulysses", "--global-batch", "4",
     "--seq-len", "32768", "--recompute", "full"],
    ["--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--ep", "8", "--global-batch", "256", "--seq-len",
     "4096"],
    ["--model", "gpt3-175b", "--gpus", "1024", "--tp", "8", "--pp", "16", "--global-batch", "1536"],
]


def _estimate_json(args: list[str]) -> dict:
    r = CliRunner().invoke(app, ["estimate", "--cluster", "h100-80gb-sxm", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_schema_is_valid_draft_2020_12_and_shipped_in_the_package() -> None:
    schema = plan_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    # inside the package directory (hatch ships everything under planner/), readable through importlib.resources
    path = Path(planner.schema.__file__).parent / "plan.schema.json"
    assert path.is_file()
    assert json.loads(resources.files("planner.schema").joinpath("plan.schema.json").read_text()) == schema


def test_schema_version_matches_the_code() -> None:
    assert plan_schema()["$defs"]["plan"]["properties"]["schema_version"]["const"] == SCHEMA_VERSION


@pytest.mark.parametrize("args", ESTIMATE_ARGS, ids=lambda a: " ".join(a[1:6]))
def test_estimate_json_validates(args: list[str]) -> None:
    d = _estimate_json(args)
    assert plan_json_errors(d) == []
    validate_plan_json(d)
    assert d["schema_version"] == SCHEMA_VERSION
    assert "stages" in d["estimate"] and "model_spec" in d


def test_plan_with_alternatives_and_search_validates() -> None:
    """The shape ``plan --json`` prints: alternatives without model_spec and stages, and free-form search stats."""
    cfgs = [RunConfig(num_gpus=16, tp=t, pp=p, global_batch_size=64) for t, p in ((2, 1), (1, 2), (2, 2), (4, 1))]
    plans = [Plan(L8B, H100.name, c, estimate(L8B, H100, c)) for c in cfgs]
    best = Plan(L8B, H100.name, cfgs[0], plans[0].estimate, alternatives=tuple(plans[1:]),
                search={"objective": "time", "evaluated": 123, "elapsed_s": 0.5, "optimal": True})
    d = json.loads(best.to_json())
    assert plan_json_errors(d) == []
    assert len(d["alternatives"]) == 3
    assert all("model_spec" not in a and "stages" not in a["estimate"] for a in d["alternatives"])


def test_search_plans_output_validates() -> None:
    from planner.search import search_plans

    plan = search_plans(L8B, H100, 16, 64, 2048, top_k=3)
    d = json.loads(plan.to_json())
    assert plan_json_errors(d) == []


def test_plan_cli_json_validates() -> None:
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16",
                                 "--global-batch", "64", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert plan_json_errors(d) == []


# ----------------------------------------------------------------------------------------------------------------
# The schema rejects what is not a plan
# ----------------------------------------------------------------------------------------------------------------
def _base() -> dict:
    cfg = RunConfig(num_gpus=16, tp=2, pp=2, global_batch_size=64)
    return json.loads(json.dumps(plan_dict(L8B, H100.name, cfg, estimate(L8B, H100, cfg))))


def _set(d: dict, path: str, value) -> dict:
    d = copy.deepcopy(d)
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return d


_DELETE = object()


@pytest.mark.parametrize("path,value,where", [
    ("schema_version", "2.0", "schema_version"),
    ("schema_version", _DELETE, "$"),
    ("num_gpus", 0, "num_gpus"),
    ("num_gpus", "16", "num_gpus"),
    ("parallelism.tp", 1.5, "parallelism.tp"),
    ("parallelism.zero_stage", 4, "parallelism.zero_stage"),
    ("parallelism.cp_kind", "star", "parallelism.cp_kind"),
    ("batch.seq_len", _DELETE, "batch"),
    ("recompute.mode", "most", "recompute.mode"),
    ("estimate.fits", "yes", "estimate.fits"),
    ("estimate.mfu", 1.5, "estimate.mfu"),
    ("estimate.step_time_s", 0, "estimate.step_time_s"),
    ("estimate.breakdown.compute_s", _DELETE, "estimate.breakdown"),
    ("estimate.stages.0.memory_gib.weights", -1, "estimate.stages[0].memory_gib.weights"),
    ("layers_per_stage", [], "layers_per_stage"),
    ("model_spec.hidden_size", 0, "model_spec.hidden_size"),
    ("surprise", 1, "$"),
    ("options.flash_attention", 1, "options.flash_attention"),
])
def test_schema_rejects_malformed_plans(path: str, value, where: str) -> None:
    bad = _set(_base(), path, value)
    errors = plan_json_errors(bad)
    assert errors, f"{path} = {value!r} was accepted"
    assert any(e.startswith(f"{where}: ") for e in errors), errors
    with pytest.raises(PlannerError) as exc:
        validate_plan_json(bad, source="plan.json")
    assert exc.value.exit_code == 2 and "plan.json" in str(exc.value)


def test_validate_plan_json_names_the_field() -> None:
    with pytest.raises(PlannerError) as exc:
        validate_plan_json(_set(_base(), "parallelism.tp", "two"), source="my-plan.json")
    msg = str(exc.value)
    assert msg.startswith("my-plan.json: parallelism.tp: ") and "'two'" in msg and "\n" not in msg
    with pytest.raises(PlannerError):
        validate_plan_json([1, 2, 3])


def test_unknown_schema_version_is_named() -> None:
    with pytest.raises(PlannerError) as exc:
        validate_plan_json(_set(_base(), "schema_version", "2.0"), source="old.json")
    assert str(exc.value).startswith("old.json: schema_version: schema_version '2.0' is not supported")
    assert f"'{SCHEMA_VERSION}'" in str(exc.value)


@pytest.mark.parametrize("name", shipped_models())
def test_every_shipped_model_estimates_to_valid_json(name: str) -> None:
    """model_spec carries every ModelSpec field: each shipped model's fields must have the schema's scalar types."""
    model = load_model(name)
    cfg = RunConfig(num_gpus=8, global_batch_size=8, seq_len=1024)
    d = json.loads(json.dumps(plan_dict(model, H100.name, cfg, estimate(model, H100, cfg))))
    assert plan_json_errors(d) == []


# ----------------------------------------------------------------------------------------------------------------
# Relations the schema cannot express
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path,value,where", [
    ("num_gpus", 32, "parallelism"),  # tp*pp*cp*dp = 16
    ("parallelism.dp", 8, "parallelism"),
    ("parallelism.tp", 3, "parallelism"),
    ("batch.num_microbatches", 3, "batch"),
    ("batch.global_batch_size", 65, "batch"),
    ("layers_per_stage", [16, 16, 0], "layers_per_stage"),  # pp*vpp = 2
    ("layers_per_stage", [16, 17], "layers_per_stage"),  # the model has 32
    ("recompute.layers_per_stage", [1], "recompute.layers_per_stage"),
])
def test_inconsistent_plans_are_rejected(path: str, value, where: str) -> None:
    bad = _set(_base(), path, value)
    assert plan_json_errors(bad) == []  # each field is fine on its own ...
    errors = plan_consistency_errors(bad)  # ... but they contradict each other
    assert errors and errors[0].startswith(f"{where}: "), errors
    with pytest.raises(PlannerError) as exc:
        validate_plan_json(bad, source="edited.json")
    assert str(exc.value).startswith(f"edited.json: {where}: inconsistent plan: ")


def test_consistency_checks_alternatives_and_passes_real_plans() -> None:
    cfgs = [RunConfig(num_gpus=16, tp=t, pp=p, global_batch_size=64) for t, p in ((2, 1), (1, 2))]
    plans = [Plan(L8B, H100.name, c, estimate(L8B, H100, c)) for c in cfgs]
    d = json.loads(Plan(L8B, H100.name, cfgs[0], plans[0].estimate, alternatives=(plans[1],)).to_json())
    assert plan_consistency_errors(d) == []
    for args in ESTIMATE_ARGS:
        assert plan_consistency_errors(_estimate_json(args)) == []
    d["alternatives"][0]["num_gpus"] = 8
    assert plan_consistency_errors(d) == ["alternatives[0].parallelism: tp*pp*cp*dp = 1*2*1*8 is not num_gpus = 8"]


def test_export_and_explain_refuse_an_edited_inconsistent_plan(tmp_path: Path) -> None:
    f = tmp_path / "edited.json"
    f.write_text(json.dumps(_set(_base(), "num_gpus", 32)))
    for args in (["export", str(f), "--to", "megatron"], ["explain", str(f)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and f"{f}: parallelism: inconsistent plan" in r.stderr, r.output
        assert "Traceback" not in r.output
