"""Fuzz the spec and profile loaders: random and malformed files must only ever raise ``PlannerError``.

Strategies: random bytes and random JSON documents as whole files; the shipped files truncated at many points; the
shipped files with one field replaced by a hostile value (NaN, infinities, huge or negative numbers, wrong types)
or deleted, at any depth. Whatever the input, ``load_model`` / ``load_cluster`` (and the dict-level
``model_from_config`` / ``cluster_from_dict``) either return a spec or raise ``PlannerError`` naming the file;
a model spec the loader accepts can be estimated (finite numbers or a PlannerError).
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cost.step import estimate
from planner.errors import PlannerError
from planner.specs.config import RunConfig
from planner.specs.hardware import Cluster, cluster_from_dict, hardware_profiles_dir, load_cluster
from planner.specs.model import ModelSpec, load_model, model_from_config, model_specs_dir

#: examples per fuzz test; CI keeps it small, ``PLANNER_FUZZ_EXAMPLES=5000`` digs deeper locally
FUZZ = settings(max_examples=int(os.environ.get("PLANNER_FUZZ_EXAMPLES", "150")), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])

MODEL_FILES = sorted(model_specs_dir().glob("*.json"))
H100 = load_cluster("h100-80gb-sxm")
L8B = load_model("llama-3.1-8b")
PROFILE_FILES = sorted(hardware_profiles_dir().glob("*.json"))

#: values that break naive loaders: non-finite floats, numbers too big for a float, wrong types, empty containers
HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 10**400, -(10**400), 1e308, -1, 0, 0.5, -0.0, True, False,
                     None, "", "8", "NaN", [], {}, [1, 2], {"a": 1}, 2**63, 3.0]),
    st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def _paths(d: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path (dict keys and list indices) inside a JSON document."""
    out = [prefix] if prefix else []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, prefix + (i,))
    return out


def _mutate(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def _loads_or_planner_error(load, arg) -> Any:
    """Call a loader; a PlannerError is fine (and must have a message), anything else fails the test."""
    try:
        return load(arg)
    except PlannerError as e:
        assert str(e).strip(), "PlannerError without a message"
        assert "\n" not in str(e), f"message is not one line: {e!s}"
        return e


def _check_model(result: Any) -> None:
    if isinstance(result, ModelSpec):  # accepted: the shapes the cost model divides by are sane
        assert result.hidden_size >= 1 and result.num_layers >= 1 and result.num_heads >= 1
        assert result.num_kv_heads >= 1 and result.num_heads % result.num_kv_heads == 0
        assert result.vocab_size >= 1 and result.max_seq_len >= 1
        # and the cost model can take it: a one-GPU estimate is finite or a PlannerError, nothing else
        try:
            est = estimate(result, H100, RunConfig(num_gpus=1, global_batch_size=1, seq_len=128))
        except PlannerError:
            return
        assert math.isfinite(est.step_time_s) and est.step_time_s > 0 and math.isfinite(est.peak_memory_bytes)


def _check_cluster(result: Any) -> None:
    if isinstance(result, Cluster):
        gpu = result.gpu
        for v in (gpu.peak_flops, gpu.hbm_bytes, gpu.hbm_bandwidth_bytes_per_s,
                  result.intra_node.bandwidth_bytes_per_s, result.inter_node.bandwidth_bytes_per_s):
            assert math.isfinite(v) and v > 0
        assert 0 < gpu.attention_efficiency <= 1 and 0 < gpu.memory_bound_efficiency <= 1
        assert result.gpus_per_node >= 1
        for flops in (1.0, 1e9, 1e12, 1e18):
            assert 0 < gpu.matmul_efficiency(flops) <= 1
        # and the cost model can take it: two GPUs of it (TP where a node has two, else DP across nodes)
        tp = 2 if result.gpus_per_node >= 2 else 1
        try:
            est = estimate(L8B, result, RunConfig(num_gpus=2, tp=tp, global_batch_size=2, seq_len=128))
        except PlannerError:
            return
        assert math.isfinite(est.step_time_s) and est.step_time_s > 0 and math.isfinite(est.peak_memory_bytes)


# ----------------------------------------------------------------------------------------------------------------
# Whole files
# ----------------------------------------------------------------------------------------------------------------
@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_files(tmp_path: Path, data: bytes) -> None:
    f = tmp_path / "config.json"
    f.write_bytes(data)
    r = _loads_or_planner_error(load_model, str(f))
    assert isinstance(r, PlannerError) and str(f) in str(r)
    r = _loads_or_planner_error(load_cluster, str(f))
    assert isinstance(r, PlannerError) and str(f) in str(r)


@FUZZ
@given(doc=JSON_VALUES)
def test_random_json_documents(tmp_path: Path, doc: Any) -> None:
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(doc))
    _check_model(_loads_or_planner_error(load_model, str(f)))
    _check_cluster(_loads_or_planner_error(load_cluster, str(f)))


@pytest.mark.parametrize("path", MODEL_FILES + PROFILE_FILES, ids=lambda p: p.name)
def test_truncated_shipped_files(tmp_path: Path, path: Path) -> None:
    text = path.read_text().rstrip()  # a cut in trailing whitespace leaves a valid document
    load = load_model if path.parent == model_specs_dir() else load_cluster
    f = tmp_path / path.name
    cuts = sorted({0, 1, len(text) // 3, len(text) // 2, len(text) - 2, len(text) - 1} | set(range(0, len(text), 97)))
    for n in cuts:
        f.write_text(text[:n])
        r = _loads_or_planner_error(load, str(f))
        assert isinstance(r, PlannerError), f"truncated at {n} characters was accepted"
        assert str(f) in str(r)


@pytest.mark.parametrize("name,load", [("no-such-file.json", load_model), ("no/such/dir/x.json", load_cluster),
                                       ("x" * 5000, load_model), ("nul\0byte", load_cluster), ("", load_model),
                                       (".", load_model), ("/", load_cluster), ("/tmp/nul\0byte.json", load_model),
                                       ("/dev/null", load_model), ("/dev/zero", load_cluster)])
def test_unusable_names(name: str, load) -> None:
    """Missing, empty, too long, NUL bytes, directories, devices (/dev/zero would never end: reads are capped)."""
    r = _loads_or_planner_error(load, name)
    assert isinstance(r, PlannerError)


def test_deeply_nested_json(tmp_path: Path) -> None:
    """json.loads raises RecursionError, not JSONDecodeError, on deep nesting: still a PlannerError."""
    f = tmp_path / "deep.json"
    f.write_text("[" * 100_000 + "]" * 100_000)
    for load in (load_model, load_cluster):
        r = _loads_or_planner_error(load, str(f))
        assert isinstance(r, PlannerError) and "nested too deeply" in str(r)


# ----------------------------------------------------------------------------------------------------------------
# One field of a shipped file replaced or deleted
# ----------------------------------------------------------------------------------------------------------------
@FUZZ
@given(data=st.data(), value=HOSTILE, delete=st.booleans())
def test_mutated_model_specs(data: st.DataObject, value: Any, delete: bool) -> None:
    path = data.draw(st.sampled_from(MODEL_FILES))
    doc = json.loads(path.read_text())
    key = data.draw(st.sampled_from(sorted(_paths(doc), key=repr)))
    bad = _mutate(doc, key, value, delete)
    r = _loads_or_planner_error(lambda d: model_from_config(d, source=str(path)), bad)
    _check_model(r)
    if isinstance(r, PlannerError):
        assert str(path) in str(r)


@FUZZ
@given(data=st.data(), value=HOSTILE, delete=st.booleans())
def test_mutated_profiles(data: st.DataObject, value: Any, delete: bool) -> None:
    path = data.draw(st.sampled_from(PROFILE_FILES))
    doc = json.loads(path.read_text())
    key = data.draw(st.sampled_from(sorted(_paths(doc), key=repr)))
    bad = _mutate(doc, key, value, delete)
    r = _loads_or_planner_error(lambda d: cluster_from_dict(d, source=str(path)), bad)
    _check_cluster(r)
    if isinstance(r, PlannerError):
        assert str(path) in str(r)


def test_a_null_kernel_table_is_refused() -> None:
    """What the profile fuzz found (2026-12-05): a null entry in gpu.other_attention_kernels was read as no table
    and crashed later, on its name; it is refused with the field named."""
    path = next(p for p in PROFILE_FILES if "other_attention_kernels" in json.loads(p.read_text())["gpu"])
    bad = _mutate(json.loads(path.read_text()), ("gpu", "other_attention_kernels", 0), None, False)
    r = _loads_or_planner_error(lambda d: cluster_from_dict(d, source=str(path)), bad)
    assert isinstance(r, PlannerError) and r.field == "gpu.other_attention_kernels[0]"


@FUZZ
@given(value=HOSTILE, data=st.data())
def test_mutated_model_file_roundtrip(tmp_path: Path, value: Any, data: st.DataObject) -> None:
    """The same through a file: json.dumps writes NaN / Infinity, which json.loads reads back."""
    path = data.draw(st.sampled_from(MODEL_FILES))
    doc = json.loads(path.read_text())
    key = data.draw(st.sampled_from(sorted(_paths(doc), key=repr)))
    f = tmp_path / "config.json"
    f.write_text(json.dumps(_mutate(doc, key, value, False)))
    _check_model(_loads_or_planner_error(load_model, str(f)))


def test_shipped_files_load() -> None:
    """The unmutated files load (so the mutations above start from valid documents)."""
    for p in MODEL_FILES:
        assert isinstance(load_model(str(p)), ModelSpec)
        assert load_model(p.stem).name == load_model(str(p)).name  # shipped by name, dots included
    for p in PROFILE_FILES:
        assert isinstance(load_cluster(str(p)), Cluster)
        assert load_cluster(p.stem).name == load_cluster(str(p)).name


#: 2**31 - 1, the largest integer a config may hold: as a layer count it once built per-layer tables of 2**31
#: entries (a 24 GB allocation), so it stands here beside the non-numbers
_NUMERIC_HOSTILE = [math.nan, math.inf, -math.inf, 10**400, -(10**400), 1e308, 1e300, 2**31 - 1, -1, 0, 2.5, True,
                    "8", None, [], {}]


@pytest.mark.parametrize("path", MODEL_FILES + PROFILE_FILES, ids=lambda p: p.name)
def test_every_numeric_field_with_every_hostile_value(path: Path) -> None:
    """Exhaustive over the numeric leaves of each shipped file (random sampling above may miss one)."""
    doc = json.loads(path.read_text())
    is_model = path.parent == model_specs_dir()
    for key in _paths(doc):
        leaf = doc
        for k in key:
            leaf = leaf[k]
        if isinstance(leaf, bool) or not isinstance(leaf, (int, float)):
            continue
        for value in _NUMERIC_HOSTILE:
            bad = _mutate(doc, key, value, False)
            if is_model:
                _check_model(_loads_or_planner_error(lambda d: model_from_config(d, source=str(path)), bad))
            else:
                _check_cluster(_loads_or_planner_error(lambda d: cluster_from_dict(d, source=str(path)), bad))
