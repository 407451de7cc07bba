"""Launcher-ready configurations from a plan: Megatron-LM arguments, torchtitan 0.2 TOML and 0.3 Python config,
DeepSpeed JSON, Megatron-Bridge (NeMo).

``emit(plan, target)`` returns the file text; ``export(plan, target)`` also returns the notes a user must read
(what the file leaves out, how a knob was mapped) and the usual file suffix. ``plan`` is a ``planner.plan.Plan``
or its JSON dict. A launcher that cannot run something the plan uses raises ``PlannerError`` instead of
emitting a configuration that would run differently from the estimate; ``plan_for_launcher`` searches only what
a launcher can run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from planner.errors import PlannerError

#: target name -> (module, file suffix)
_TARGETS = {
    "megatron": ("planner.export.megatron", ".sh"),
    "torchtitan": ("planner.export.torchtitan", ".toml"),
    "torchtitan-0.3": ("planner.export.torchtitan03", ".py"),
    "deepspeed": ("planner.export.deepspeed", ".json"),
    "nemo": ("planner.export.nemo", ".py"),
}
TARGETS: tuple[str, ...] = tuple(_TARGETS)


@dataclass(frozen=True)
class Export:
    target: str
    text: str
    notes: tuple[str, ...]
    suffix: str


#: the launchers that train hybrid (Mamba / attention / MLP / MoE) layer patterns: Megatron-LM's pretrain_hybrid.py
#: and Megatron-Bridge's HybridModelProvider recipes (Nemotron-H, Nemotron 3); torchtitan and DeepSpeed have no
#: Mamba layer
HYBRID_TARGETS = ("megatron", "nemo")
HYBRID_REFUSAL = ("a hybrid Mamba / attention model (only Megatron-LM's pretrain_hybrid.py and Megatron-Bridge's "
                  "hybrid recipes train one)")
HYBRID_FIX = "export to megatron or nemo"


def target_module(target: str, option: str = "--to"):
    """The exporter module of a target (its RELEASE, FORMAT, CHECKED_BY, render, notes)."""
    if target not in _TARGETS:
        raise PlannerError(f"unknown launcher '{target}'", source=option, fix=f"use one of: {', '.join(TARGETS)}")
    return importlib.import_module(_TARGETS[target][0])


def export(plan: Any, target: str, *, source: str = "<plan>", option: str = "--to") -> Export:
    mod = target_module(target, option)
    from planner.export._common import read_plan, unsupported

    view = read_plan(plan, source)
    if view.model is not None and view.model.vision_layers:
        raise unsupported(target, "a vision encoder in front of the language model (the exporters write language-model "
                                  "launch configs; Megatron-LM trains LLaVA-style models through examples/multimodal, "
                                  "Megatron-Bridge through its VLM recipes)",
                          "use the plan's degrees and layer split by hand in the multimodal launcher")
    if view.model is not None and view.model.layer_pattern and target not in HYBRID_TARGETS:
        raise unsupported(target, HYBRID_REFUSAL, HYBRID_FIX)
    if target != "megatron" and view.hybrid_cp_max_per_rank is not None:
        raise unsupported(target, "Megatron-Core's hybrid (dynamic) context parallelism (--hybrid-context-parallel; "
                                  "the planner writes it for Megatron-LM only)",
                          "export to megatron, or plan without --dynamic-cp")
    pools = plan.get("pools") if isinstance(plan, dict) else None
    if pools and target != "megatron":
        raise unsupported(target, "a pipeline over several GPU pools (per-stage layer counts for GPUs of different "
                                  "speeds, ranks ordered pool by pool); the planner writes it for Megatron-LM, whose "
                                  "--pipeline-model-parallel-layout takes any split",
                          "export to megatron")
    text = mod.render(plan, source)
    notes = tuple(mod.notes(plan, source))
    if pools:
        notes += tuple(f"ranks {p['ranks'][0] * p['stage_gpus']}-{(p['ranks'][-1] + 1) * p['stage_gpus'] - 1}: pool "
                       f"{p['name']} ({p['gpus']} x {p['gpu']}, pipeline ranks {p['ranks'][0]}-{p['ranks'][-1]}); list "
                       f"its nodes in this order in the hostfile / SLURM node list" for p in pools["pools"])
    return Export(target=target, text=text, notes=notes, suffix=_TARGETS[target][1])


def emit(plan: Any, target: str, *, source: str = "<plan>", option: str = "--to") -> str:
    """The launcher file for ``plan`` as text (see ``TARGETS``)."""
    return export(plan, target, source=source, option=option).text


from planner.export.spaces import launcher_spaces, plan_for_launcher, stack_spaces, stack_target  # noqa: E402  (needs TARGETS)

__all__ = ["TARGETS", "Export", "emit", "export", "launcher_spaces", "plan_for_launcher", "stack_spaces", "stack_target",
           "target_module"]
