"""Reproducibility: the same input gives byte-identical JSON, for ``estimate --json`` and ``plan --json``.

Checked in one process (with the cost model's cache cleared between runs), across processes with different hash
seeds (set and dict iteration order must not leak into the output), and across equivalent spellings of the same
input (option order, a shipped name versus its file path). For the search, ties must break the same way whatever
``--top`` asks for.

Known gap: ``plan --json`` carries the search's wall-clock statistics (``search.time_s``, ``search.cpu_s``,
``search.candidates_per_s``), so two runs differ in those three numbers. The tests below compare everything else
byte for byte, check that nothing but those keys differs, and keep a strict expected-failure test for full byte
identity that will report when the statistics leave the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost import step as step_mod
from planner.specs.model import model_specs_dir

ESTIMATE = ["estimate", "--model", "llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "64", "--tp", "4",
            "--pp", "4", "--vpp", "2", "--schedule", "interleaved-1f1b", "--global-batch", "128", "--seq-len", "4096",
            "--json"]
ESTIMATE_MOE = ["estimate", "--model", "mixtral-8x7b", "--cluster", "h100-80gb-sxm", "--gpus", "64", "--tp", "2",
                "--ep", "8", "--global-batch", "256", "--seq-len", "4096", "--json"]
PLAN = ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "64",
        "--top", "3", "--json"]


from planner.plan import TIMING_KEYS as WALL_CLOCK_KEYS  # search statistics that measure the machine


def _invoke(args: list[str]) -> str:
    step_mod._estimate_cached.cache_clear()
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.stdout


def _subprocess(args: list[str], hash_seed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    r = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def plan_runs() -> tuple[str, str]:
    """Two independent in-process runs of the same ``plan --json`` (searches cost seconds: shared by the tests)."""
    return _invoke(PLAN), _invoke(PLAN)


@pytest.mark.parametrize("args", [ESTIMATE, ESTIMATE_MOE], ids=["estimate", "estimate-moe"])
def test_same_input_same_bytes_in_process(args: list[str]) -> None:
    first = _invoke(args)
    assert json.loads(first)["schema_version"]
    for _ in range(2):
        assert _invoke(args) == first


def test_plan_same_bytes_in_process(plan_runs: tuple[str, str]) -> None:
    first, again = plan_runs
    assert json.loads(first)["schema_version"] and json.loads(first)["alternatives"]
    assert again == first
    assert first == json.dumps(json.loads(first), indent=2, sort_keys=True) + "\n"  # canonical as printed


def test_estimate_same_bytes_across_processes_and_hash_seeds() -> None:
    outputs = {_subprocess(ESTIMATE, seed) for seed in ("0", "12345")}
    assert outputs == {_invoke(ESTIMATE)}


def test_plan_same_bytes_across_processes_and_hash_seeds(plan_runs: tuple[str, str]) -> None:
    outputs = {_subprocess(PLAN, seed) for seed in ("0", "12345")}
    assert outputs == {plan_runs[0]}


def test_plan_json_is_byte_identical_including_search_statistics(plan_runs: tuple[str, str]) -> None:
    assert plan_runs[0] == plan_runs[1]
    assert not set(json.loads(plan_runs[0])["search"]) & set(WALL_CLOCK_KEYS)


def test_plan_timings_flag_adds_the_wall_clock_statistics() -> None:
    d = json.loads(_invoke(PLAN + ["--timings"]))
    assert set(WALL_CLOCK_KEYS) <= set(d["search"])
    assert d["search"]["time_s"] > 0


def test_json_is_canonical() -> None:
    """Keys sorted at every level, two-space indent, one trailing newline: re-serializing changes nothing."""
    out = _invoke(ESTIMATE)
    assert out == json.dumps(json.loads(out), indent=2, sort_keys=True) + "\n"


def test_equivalent_spellings_give_the_same_bytes() -> None:
    """Option order and shipped name vs. file path do not change the output."""
    base = _invoke(ESTIMATE)
    reordered = ESTIMATE[:1] + ["--json", "--seq-len", "4096", "--global-batch", "128", "--schedule",
                                "interleaved-1f1b", "--vpp", "2", "--pp", "4", "--tp", "4", "--gpus", "64",
                                "--cluster", "h100-80gb-sxm", "--model", "llama-3.1-70b"]
    assert _invoke(reordered) == base
    by_path = [str(model_specs_dir() / "llama-3.1-70b.json") if a == "llama-3.1-70b" else a for a in ESTIMATE]
    assert _invoke(by_path) == base


def test_plan_ties_break_the_same_way_whatever_top(plan_runs: tuple[str, str]) -> None:
    """The best plan does not depend on how many runners-up are kept (``--top``), and the alternatives of a longer list
    start with those of a shorter one (a stable total order, not an accident of heap order)."""
    one = json.loads(_invoke(PLAN + ["--top", "1"]))  # the last --top wins
    five = json.loads(_invoke(PLAN + ["--top", "5"]))
    three = json.loads(plan_runs[0])
    strip = ("alternatives", "search")
    assert {k: v for k, v in one.items() if k not in strip} == {k: v for k, v in five.items() if k not in strip}

    def configs(d):
        return [json.dumps({k: a[k] for k in ("parallelism", "batch", "schedule", "recompute", "layers_per_stage")},
                           sort_keys=True) for a in d.get("alternatives", [])]

    assert len(configs(three)) == 3 and len(configs(five)) == 5 and configs(one) == configs(three)[:1]
    assert configs(five)[:len(configs(three))] == configs(three)
