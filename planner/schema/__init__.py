"""JSON Schema (draft 2020-12) of the plan / estimate JSON, shipped inside the package.

``plan.schema.json`` describes what :func:`planner.plan.plan_dict` produces (``planner plan --json``,
``planner estimate --json``), including ``alternatives`` and ``search`` when present. ``validate_plan_json`` checks a
parsed document against it, and the relations between fields the schema cannot express, and raises a one-line
``PlannerError`` naming the first offending field.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

from planner.errors import PlannerError

SCHEMA_FILE = "plan.schema.json"


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    """The plan JSON Schema as a dict (read once from the package)."""
    return json.loads(resources.files(__name__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    schema = plan_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _where(path: Any) -> str:
    """JSON path of an error location, ``estimate.stages[0].fwd_s`` style ('$' for the document itself)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "$"


def plan_json_errors(d: Any) -> list[str]:
    """Every schema violation of a parsed plan document, as ``"<json path>: <message>"``, in a stable order."""
    errors = sorted(_validator().iter_errors(d), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return [f"{_where(e.absolute_path)}: {e.message}" for e in errors]


def plan_consistency_errors(d: dict[str, Any], prefix: str = "") -> list[str]:
    """Relations between fields a JSON Schema cannot express, for a document that already matches the schema:
    the degrees multiply to the GPU count, the batch splits into the stated micro-batches, one layer count per
    model chunk (summing to the model's layers when the spec is present). Same ``"<json path>: <message>"`` form."""
    out = []
    par, batch = d["parallelism"], d["batch"]
    where = (lambda field: f"{prefix}.{field}" if prefix else field)
    if par["tp"] * par["pp"] * par["cp"] * par["dp"] != d["num_gpus"]:
        out.append(f"{where('parallelism')}: tp*pp*cp*dp = {par['tp']}*{par['pp']}*{par['cp']}*{par['dp']} is not "
                   f"num_gpus = {d['num_gpus']}")
    if par["dp"] * batch["micro_batch_size"] * batch["num_microbatches"] != batch["global_batch_size"]:
        out.append(f"{where('batch')}: dp*micro_batch_size*num_microbatches = {par['dp']}*"
                   f"{batch['micro_batch_size']}*{batch['num_microbatches']} is not global_batch_size = "
                   f"{batch['global_batch_size']}")
    chunks = par["pp"] * par["vpp"]
    if len(d["layers_per_stage"]) != chunks:
        out.append(f"{where('layers_per_stage')}: {len(d['layers_per_stage'])} entries, expected pp*vpp = {chunks}")
    elif "model_spec" in d and sum(d["layers_per_stage"]) != d["model_spec"]["num_layers"]:
        out.append(f"{where('layers_per_stage')}: sums to {sum(d['layers_per_stage'])}, the model has "
                   f"{d['model_spec']['num_layers']} layers")
    rec = d["recompute"].get("layers_per_stage")
    if rec is not None and len(rec) != chunks:
        out.append(f"{where('recompute.layers_per_stage')}: {len(rec)} entries, expected pp*vpp = {chunks}")
    for i, alt in enumerate(d.get("alternatives", [])):
        out += plan_consistency_errors(alt, where(f"alternatives[{i}]"))
    return out


def validate_plan_json(d: Any, source: str = "<plan>") -> None:
    """Raise ``PlannerError`` (exit code 2) naming the source and the first offending field if ``d`` is not a plan
    document of this schema version, or if its fields contradict each other (``plan_consistency_errors``)."""
    known = plan_schema()["$defs"]["plan"]["properties"]["schema_version"]["const"]
    if isinstance(d, dict) and "schema_version" in d and d["schema_version"] != known:
        raise PlannerError(f"schema_version {d['schema_version']!r} is not supported (this planner reads {known!r})",
                           source=source, field="schema_version",
                           fix="re-create the plan with this version of `planner plan --json`")
    errors = sorted(_validator().iter_errors(d), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if errors:
        e = errors[0]
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise PlannerError(f"does not match the plan schema: {e.message[:200]}{more}", source=source,
                           field=_where(e.absolute_path) if e.absolute_path else None,
                           fix="pass a file written by `planner plan --json` or `planner estimate --json`")
    problems = plan_consistency_errors(d)
    if problems:
        field, _, message = problems[0].partition(": ")
        raise PlannerError(f"inconsistent plan: {message}", source=source, field=field,
                           fix="an edited plan must keep its derived fields in step; re-create it with "
                               "`planner plan --json` or `planner estimate --json`")
    rule = plan_rule_error(d)
    if rule:
        field, message = rule
        raise PlannerError(f"breaks a validity rule: {message}", source=source, field=field,
                           fix="re-create the plan with `planner plan --json` or `planner estimate --json`")


#: config_problems names options the way the CLI spells them; in a plan file they are these JSON fields
_RULE_FIELDS = {
    "tp": "parallelism.tp", "pp": "parallelism.pp", "cp": "parallelism.cp", "ep": "parallelism.ep",
    "vpp": "parallelism.vpp", "etp": "parallelism.etp", "zero": "parallelism.zero_stage", "gpus": "num_gpus", "num_gpus": "num_gpus",
    "global-batch": "batch.global_batch_size", "global_batch_size": "batch.global_batch_size",
    "micro_batch_size": "batch.micro_batch_size", "seq_len": "batch.seq_len", "recompute": "recompute.mode",
    "recompute_layers_per_stage": "recompute.layers_per_stage", "precision": "options.precision",
    "tp_comm_overlap": "options.tp_comm_overlap", "grad_reduce_bytes": "options.grad_reduce_bytes",
}


def plan_rule_error(d: dict[str, Any]) -> tuple[str, str] | None:
    """The first validity rule (``planner.cost.validity.config_problems``) the plan's configuration breaks, as
    (JSON field, message), or None. Needs the plan's ``model_spec`` and a cluster this planner knows; without them
    the rules that need them cannot be checked here (``explain`` re-estimates and checks them then)."""
    from planner.cost.validity import config_problems
    from planner.plan import config_from_dict, model_from_plan_dict
    from planner.specs.hardware import load_cluster

    if "model_spec" not in d:
        return None
    try:
        cluster = load_cluster(str(d["cluster"]))
    except PlannerError:
        return None
    try:
        model = model_from_plan_dict(d)
    except PlannerError as e:
        return "model_spec", e.reason
    problems = config_problems(model, cluster, config_from_dict(d))
    if not problems:
        return None
    option, message = problems[0]
    return _RULE_FIELDS.get(option, option), message


__all__ = ["SCHEMA_FILE", "plan_schema", "plan_json_errors", "plan_consistency_errors", "plan_rule_error",
           "validate_plan_json"]
