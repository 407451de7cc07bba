"""Training stacks as data: what software runs the job, the runtime options it sets, and what it can run.

A stack file (``stacks/*.json``, or a path) names the launcher it exports to, the runtime options it runs with by
default (``options``: fused attention, overlap of gradient reduction and parameter gather, TP communication overlap,
gradient-reduction dtype) and what it can run (``runs``: pipeline schedules, ZeRO stages, context-parallel kinds,
TP communication overlap, the ZeRO stages HSDP runs with), each with its source. ``planner estimate --stack S``
takes S's options unless a flag overrides one; ``planner plan --stack S`` searches exactly what S runs
(``planner.export.stack_spaces``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.specs.config import (ADAM_MOMENT_DTYPES, CP_KINDS, DEFAULT_RECOMPUTE_MODULES, EP_DISPATCHERS, ZERO_STAGES,
                                   RunConfig, canonical_recompute_modules)
from planner.specs.hardware import ATTENTION_KERNELS, Cluster, expert_call_times, refuse_retired_alltoall_key
from planner.specs.model import _data_dir, _resolve, read_json_file

#: the stack a command uses when none is given: what NeMo and Megatron-Bridge recipes run
DEFAULT_STACK = "megatron-core"
#: --grad-reduce-dtype values and the bytes per element they mean
GRAD_REDUCE_DTYPES = {"bf16": 2, "fp32": 4}
#: the option fields of a stack file (``attention_kernel`` optional: "" = each profile's default table)
OPTION_KEYS = ("flash_attention", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
               "grad_reduce_dtype", "attention_kernel", "per_expert_gemm_calls", "moe_overlap_fills_issue_gaps",
               "fp8_param_gather",
               "te_quantized_weights", "grads_in_reduce_dtype", "recompute_fused_attention", "overlap_p2p_comm",
               "ep_dispatcher", "recompute_modules")
#: the options a stack decides that a search holds fixed (of ``config.FIXED_FIELDS``; the run's precision, the
#: recompute and offload modules and the data's packing are the request's)
STACK_FIXED_FIELDS = ("attention_kernel", "per_expert_gemm_calls", "moe_overlap_fills_issue_gaps", "fp8_param_gather",
                      "te_quantized_weights",
                      "grads_in_reduce_dtype", "recompute_fused_attention", "overlap_p2p_comm")
#: the launcher a stack's plans are exported to, and the stack a launcher implies when none is given
LAUNCHER_STACKS = {"megatron": "megatron-core", "nemo": "megatron-core", "torchtitan": "torchtitan",
                   "torchtitan-0.3": "torchtitan",
                   "deepspeed": "deepspeed"}
#: the --stack value of plan / sweep that searches everything the cost model knows, whatever runs it
ANY_STACK = "any"


def stack_name_for(stack: str | None, launcher: str | None) -> str:
    """The stack a search runs under: the one named (``ANY_STACK`` included), else the launcher's, else
    ``DEFAULT_STACK``."""
    if stack is not None:
        return stack
    return LAUNCHER_STACKS.get(launcher, DEFAULT_STACK) if launcher is not None else DEFAULT_STACK


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    launcher: str
    flash_attention: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: bool
    grad_reduce_bytes: int
    schedules: tuple[str, ...]
    zero_stages: tuple[int, ...]
    cp_kinds: tuple[str, ...]
    tp_comm_overlap_choices: tuple[bool, ...]
    source: str = ""
    #: whether it can overlap the MoE all-to-alls batch-wise (``runs.ep_comm_overlap``; absent: no)
    ep_comm_overlap_choices: tuple[bool, ...] = (False,)
    #: the ZeRO stages it runs HSDP with (``runs.hsdp_zero_stages``; absent or empty: no HSDP)
    hsdp_zero_stages: tuple[int, ...] = ()
    #: the fused attention kernel it runs (``options.attention_kernel``, ``hardware.ATTENTION_KERNELS``; "" = each
    #: profile's default table). A profile without that kernel's table prices the default one
    attention_kernel: str = ""
    #: whether it issues grouped expert GEMMs one local expert at a time (``options.per_expert_gemm_calls``;
    #: absent: true, as Megatron-Core with Transformer Engine does)
    per_expert_gemm_calls: bool = True
    #: whether, under its batch-level MoE overlap, the paired micro-batch's kernels fill the host's per-expert issue
    #: gaps (``options.moe_overlap_fills_issue_gaps``; absent: true, the current Megatron-Core)
    moe_overlap_fills_issue_gaps: bool = True
    #: whether its fp8 runs keep and all-gather the linear weights in fp8 (``options.fp8_param_gather``; absent:
    #: false)
    fp8_param_gather: bool = False
    #: whether its fp8 / mxfp8 linear layers hold their weights as Transformer Engine modules do (quantized
    #: parameters with fp8_param_gather, else a quantized copy kept across micro-batches;
    #: ``options.te_quantized_weights``; absent: false, bf16 weights quantized per use)
    te_quantized_weights: bool = False
    #: the Adam moment dtypes it runs (``runs.adam_moments``, names of ``config.ADAM_MOMENT_DTYPES``; absent: fp32)
    adam_moments: tuple[str, ...] = ("fp32",)
    #: whether it can keep the SwiGLU inputs in fp8 for backward (``runs.activation_fp8_input_store``; absent: no)
    activation_fp8_input_store_runs: bool = False
    #: whether its gradient buffer has the reduction's dtype (``options.grads_in_reduce_dtype``; absent: true, as
    #: Megatron-Core's main_grad)
    grads_in_reduce_dtype: bool = True
    #: whether its selective recomputation of "core_attn" re-runs the fused attention kernel
    #: (``options.recompute_fused_attention``; absent: true, Megatron-Core's checkpoint_core_attention)
    recompute_fused_attention: bool = True
    #: whether its interleaved pipeline posts sends asynchronously under the next chunk's compute
    #: (``options.overlap_p2p_comm``; absent: true, Megatron-Core's default with virtual stages)
    overlap_p2p_comm: bool = True
    #: its MoE token dispatcher (``options.ep_dispatcher``, ``config.EP_DISPATCHERS``; absent: "alltoall",
    #: Megatron-Core's all-to-all dispatcher): what an estimate runs unless ``--ep-dispatcher`` says otherwise
    ep_dispatcher: str = "alltoall"
    #: the dispatchers its plans may use (``runs.ep_dispatchers``; absent: the option's alone): a search holds
    #: each where an EP group spans nodes (``planner.search.space``)
    ep_dispatcher_choices: tuple[str, ...] = ("alltoall",)
    #: the expert GEMM issue times of this stack's release where they differ from the hardware profiles' (which
    #: hold the current megatron-core release's): (profile name, ((precision, seconds), ...)), from the file's
    #: ``expert_gemm_call_us`` (fitted values, with the rows they were fitted on: planner/validation/fit.py)
    expert_gemm_call_s: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    #: the time a grouped expert GEMM pass after Megatron-Core's all-to-all dispatcher adds to its calls
    #: (``expert_alltoall_sync_us``, ``hardware.GPU.expert_alltoall_sync_s``), where the release gives it
    expert_alltoall_sync_s: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    #: what its selective recomputation redoes unless ``--recompute-modules`` says otherwise
    #: (``options.recompute_modules``, ``config.RECOMPUTE_MODULES``; absent: Megatron-Core's default, core_attn;
    #: torchtitan: the per-op policy of the release its launcher writes, "op_sac_v02")
    recompute_modules: str = DEFAULT_RECOMPUTE_MODULES
    #: how many times longer its 16-bit grouped expert GEMMs' weight gradients run where its grouped linear layer
    #: applies the experts' bias (``biased_grouped_wgrad_factor``: a fitted value, with its rows;
    #: ``hardware.GPU.biased_grouped_wgrad_factor``); absent: 1
    biased_grouped_wgrad_factor: float = 1.0

    def on_cluster(self, cluster: Cluster) -> Cluster:
        """``cluster`` as this stack runs on it: the profile's expert GEMM issue times, with this stack's where it
        names the profile (a release whose host path issues expert GEMMs at another rate), and this stack's biased
        grouped weight-gradient factor. A precision the stack gives a per-call time for takes it after every
        dispatcher with no all-to-all sync time on top, unless the stack also gives that."""
        if self.biased_grouped_wgrad_factor != cluster.gpu.biased_grouped_wgrad_factor:
            cluster = replace(cluster, gpu=replace(cluster.gpu,
                                                   biased_grouped_wgrad_factor=self.biased_grouped_wgrad_factor))
        general = dict(self.expert_gemm_call_s).get(cluster.name, ())
        apart = dict(self.expert_alltoall_sync_s).get(cluster.name, ())
        if not general and not apart:
            return cluster
        calls, sync = dict(cluster.gpu.expert_gemm_call_s), dict(cluster.gpu.expert_alltoall_sync_s)
        calls.update(general)
        for precision, _ in general:
            sync.pop(precision, None)
        sync.update(apart)
        return replace(cluster, gpu=replace(cluster.gpu, expert_gemm_call_s=tuple(sorted(calls.items())),
                                            expert_alltoall_sync_s=tuple(sorted(sync.items()))))

    def fixed_options(self) -> dict[str, Any]:
        """The options of ``config.FIXED_FIELDS`` this stack decides (a search holds them in every row):
        :data:`STACK_FIXED_FIELDS`, by name."""
        return {f: getattr(self, f) for f in STACK_FIXED_FIELDS}

    def options(self) -> dict[str, Any]:
        """The RunConfig runtime options this stack runs with."""
        return {"flash_attention": self.flash_attention, "overlap_grad_reduce": self.overlap_grad_reduce,
                "overlap_param_gather": self.overlap_param_gather, "tp_comm_overlap": self.tp_comm_overlap,
                "grad_reduce_bytes": self.grad_reduce_bytes, "ep_dispatcher": self.ep_dispatcher,
                **self.fixed_options()}

    def apply(self, cfg: RunConfig, **overrides: Any) -> RunConfig:
        """``cfg`` with the stack's runtime options, then the given overrides (None: keep the stack's); TP overlap
        only where it can run (TP > 1 with sequence parallelism, Megatron-Core's rule)."""
        opts = self.options()
        opts.update({k: v for k, v in overrides.items() if v is not None})
        if "tp_comm_overlap" not in overrides or overrides["tp_comm_overlap"] is None:
            opts["tp_comm_overlap"] = opts["tp_comm_overlap"] and cfg.tp > 1 and cfg.sequence_parallel
        return cfg.with_(**opts)


def adam_moment_bytes(name: str, stack: "Stack | None", option: str = "--adam-moments") -> int:
    """The bytes of Adam's moments a ``--adam-moments`` value asks for, refused (one line naming the option and the
    stack) where the stack does not run it; ``stack`` None: any the cost model knows (``--stack any``)."""
    if name not in ADAM_MOMENT_DTYPES:
        raise PlannerError(f"unknown Adam moment dtype '{name}'", source=option,
                           fix=f"use one of: {', '.join(ADAM_MOMENT_DTYPES)}")
    if stack is not None and name not in stack.adam_moments:
        raise PlannerError(f"stack {stack.name} keeps Adam's moments in {', '.join(stack.adam_moments)} only",
                           source=option, fix="drop it, or use --stack megatron-core (its precision-aware optimizer)")
    return ADAM_MOMENT_DTYPES[name]


def activation_fp8_input_store(on: bool, stack: "Stack | None", gated_mlp: bool = True,
                               option: str = "--activation-fp8-input-store") -> bool:
    """The request's SwiGLU fp8 input store, refused (one line naming the option) where the model's MLPs are not
    gated (Megatron-Core: "supported only for SwiGLU", transformer_config.py) or the stack does not run it;
    ``stack`` None: any stack (``--stack any``)."""
    if on and not gated_mlp:
        raise PlannerError("the model's MLPs are not gated: Megatron-Core stores the activation input in fp8 for "
                           "SwiGLU only", source=option, fix="drop it")
    if on and stack is not None and not stack.activation_fp8_input_store_runs:
        raise PlannerError(f"stack {stack.name} keeps the SwiGLU inputs in bf16 (no fp8 input store)",
                           source=option, fix="drop it, or use --stack megatron-core (activation_func_fp8_input_store)")
    return bool(on)


def stacks_dir() -> Path:
    return _data_dir("stacks")


def shipped_stacks() -> list[str]:
    return sorted(p.stem for p in stacks_dir().glob("*.json"))


def load_stack(name_or_path: str) -> Stack:
    path = _resolve(name_or_path, stacks_dir(), "--stack", "stack",
                    f"use a stack file path or one of: {', '.join(shipped_stacks())}")
    return stack_from_dict(read_json_file(path, "stack"), source=str(path))


def _bool(d: dict, key: str, source: str, section: str, default: bool | None = None) -> bool:
    """A true / false field; ``default`` where the field may be absent (None: required)."""
    if default is not None and key not in d:
        return default
    v = d.get(key)
    if not isinstance(v, bool):
        raise PlannerError(f"must be true or false, got {v!r}", source=source, field=f"{section}.{key}")
    return v


def _list(d: dict, key: str, allowed: tuple | None, source: str, kind: type = str) -> tuple:
    """A list field of ``runs``; ``allowed`` None: any values of ``kind`` (checked where they are used)."""
    v = d.get(key)
    if not isinstance(v, list) or any(type(x) is not kind or (allowed is not None and x not in allowed) for x in v):
        what = ", ".join(map(str, allowed)) if allowed is not None else f"{kind.__name__} values"
        raise PlannerError(f"must be a list of {what}", source=source, field=f"runs.{key}")
    return tuple(v)


def _issue_times(data: dict, key: str, source: str) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """A stack file's expert GEMM issue times by profile (``expert_gemm_call_us``, or the all-to-all dispatcher's
    ``expert_alltoall_sync_us``): {profile: {precision: {"value": microseconds}}}, in seconds."""
    calls = data.get(key, {})
    if not isinstance(calls, dict) or not all(isinstance(v, dict) for v in calls.values()):
        raise PlannerError("must be an object of {profile: {precision: {\"value\": microseconds}}}", source=source,
                           field=key)
    return tuple((str(name), expert_call_times(v, source, f"{key}.{name}")) for name, v in calls.items())


#: the largest slowdown factor a stack file may state (a larger one is a typing error, not a kernel)
MAX_STACK_FACTOR = 100.0


def _fitted_factor(data: dict, key: str, source: str) -> float:
    """A stack file's fitted factor ``{key: {"value": x, ...provenance}}``, x in [1, MAX_STACK_FACTOR]; absent: 1."""
    entry = data.get(key)
    if entry is None:
        return 1.0
    value = entry.get("value") if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= value <= MAX_STACK_FACTOR:
        raise PlannerError(f"must be an object with a \"value\" from 1 to {MAX_STACK_FACTOR:g}, got {entry!r:.60}",
                           source=source, field=key, fix="write the fitted factor, e.g. {\"value\": 7.0}")
    return float(value)


def _recompute_modules(opts: dict, source: str) -> str:
    """``options.recompute_modules`` (absent: core_attn) in canonical form, refused with field and fix otherwise."""
    value = opts.get("recompute_modules", DEFAULT_RECOMPUTE_MODULES)
    try:
        canonical = canonical_recompute_modules(value) if isinstance(value, str) else None
    except ValueError as e:
        raise PlannerError(str(e), source=source, field="options.recompute_modules") from None
    if canonical is None or canonical != value:
        raise PlannerError(f"{value!r} is not a canonical comma list of recompute modules", source=source,
                           field="options.recompute_modules", fix=f"write {canonical or DEFAULT_RECOMPUTE_MODULES!r}")
    return value


def stack_from_dict(data: Any, *, source: str = "<stack>") -> Stack:
    """A stack from its JSON. Names that belong to later layers (schedules, the launcher) are checked where they
    are used (``planner.export.stack_spaces``), so that specs depend on nothing above them."""
    if not isinstance(data, dict):
        raise PlannerError("top level must be a JSON object", source=source, fix="see stacks/*.json")
    opts, runs = data.get("options"), data.get("runs")
    if not isinstance(opts, dict):
        raise PlannerError("missing or not an object", source=source, field="options")
    if not isinstance(runs, dict):
        raise PlannerError("missing or not an object", source=source, field="runs")
    launcher = data.get("launcher")
    if not isinstance(launcher, str):
        raise PlannerError(f"must be a launcher name, got {launcher!r}", source=source, field="launcher")
    dtype = opts.get("grad_reduce_dtype")
    if dtype not in GRAD_REDUCE_DTYPES:
        raise PlannerError(f"must be one of {', '.join(GRAD_REDUCE_DTYPES)}, got {dtype!r}", source=source,
                           field="options.grad_reduce_dtype")
    schedules = _list(runs, "schedules", None, source)
    if not schedules:
        raise PlannerError("needs at least one schedule", source=source, field="runs.schedules")
    zero_stages = _list(runs, "zero_stages", ZERO_STAGES, source, int)
    if not zero_stages:
        raise PlannerError("needs at least one ZeRO stage", source=source, field="runs.zero_stages")
    kernel = opts.get("attention_kernel", "")
    if kernel not in ("",) + ATTENTION_KERNELS:
        raise PlannerError(f"unknown attention kernel {kernel!r}", source=source, field="options.attention_kernel",
                           fix=f"use one of: {', '.join(ATTENTION_KERNELS)}")
    dispatcher = opts.get("ep_dispatcher", "alltoall")
    if dispatcher not in EP_DISPATCHERS:
        raise PlannerError(f"unknown MoE token dispatcher {dispatcher!r}", source=source, field="options.ep_dispatcher",
                           fix=f"use one of: {', '.join(EP_DISPATCHERS)}")
    dispatchers = _list(runs, "ep_dispatchers", EP_DISPATCHERS, source) if "ep_dispatchers" in runs else (dispatcher,)
    if dispatcher not in dispatchers:
        raise PlannerError(f"the stack's options.ep_dispatcher {dispatcher!r} is not among its runs.ep_dispatchers",
                           source=source, field="runs.ep_dispatchers", fix=f"add {dispatcher!r} to the list")
    refuse_retired_alltoall_key(data, source, "")
    call_s, sync_s = (_issue_times(data, key, source) for key in ("expert_gemm_call_us", "expert_alltoall_sync_us"))
    wgrad_factor = _fitted_factor(data, "biased_grouped_wgrad_factor", source)
    tpo_choices = _list(runs, "tp_comm_overlap", (True, False), source, bool)
    tpo = _bool(opts, "tp_comm_overlap", source, "options")
    if tpo and True not in tpo_choices:
        raise PlannerError("the stack sets tp_comm_overlap but its runs.tp_comm_overlap does not allow it",
                           source=source, field="options.tp_comm_overlap")
    return Stack(
        name=str(data.get("name", Path(source).stem)), description=str(data.get("description", "")),
        launcher=launcher, flash_attention=_bool(opts, "flash_attention", source, "options"),
        overlap_grad_reduce=_bool(opts, "overlap_grad_reduce", source, "options"),
        overlap_param_gather=_bool(opts, "overlap_param_gather", source, "options"), tp_comm_overlap=tpo,
        grad_reduce_bytes=GRAD_REDUCE_DTYPES[dtype], schedules=schedules, zero_stages=zero_stages,
        cp_kinds=_list(runs, "cp_kinds", CP_KINDS, source) if runs.get("cp_kinds") else (),
        tp_comm_overlap_choices=tpo_choices or (False,), source=str(data.get("options_source", "")),
        ep_comm_overlap_choices=(_list(runs, "ep_comm_overlap", (True, False), source, bool) or (False,))
        if "ep_comm_overlap" in runs else (False,),
        hsdp_zero_stages=_list(runs, "hsdp_zero_stages", tuple(z for z in ZERO_STAGES if z >= 1), source, int)
        if "hsdp_zero_stages" in runs else (),
        attention_kernel=kernel,
        per_expert_gemm_calls=_bool(opts, "per_expert_gemm_calls", source, "options", default=True),
        moe_overlap_fills_issue_gaps=_bool(opts, "moe_overlap_fills_issue_gaps", source, "options", default=True),
        fp8_param_gather=_bool(opts, "fp8_param_gather", source, "options", default=False),
        te_quantized_weights=_bool(opts, "te_quantized_weights", source, "options", default=False),
        grads_in_reduce_dtype=_bool(opts, "grads_in_reduce_dtype", source, "options", default=True),
        adam_moments=_list(runs, "adam_moments", tuple(ADAM_MOMENT_DTYPES), source) if runs.get("adam_moments")
        else ("fp32",),
        activation_fp8_input_store_runs=_bool(runs, "activation_fp8_input_store", source, "runs", default=False),
        recompute_fused_attention=_bool(opts, "recompute_fused_attention", source, "options", default=True),
        overlap_p2p_comm=_bool(opts, "overlap_p2p_comm", source, "options", default=True),
        ep_dispatcher=dispatcher, expert_gemm_call_s=call_s, expert_alltoall_sync_s=sync_s,
        ep_dispatcher_choices=dispatchers, recompute_modules=_recompute_modules(opts, source),
        biased_grouped_wgrad_factor=wgrad_factor)
