"""The typer application and what every command shares: error handling, loaders, the console."""

from __future__ import annotations

import functools
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import typer
from rich.console import Console

from planner.errors import PlannerError

app = typer.Typer(
    name="planner",
    help="Plan how to parallelize LLM training: cost model, search, launcher configs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        from planner import __version__
        typer.echo(f"planner {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show Python tracebacks on errors."),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the planner's version and exit.")) -> None:
    state["debug"] = debug


def console() -> Console:
    """The terminal's width; 160 columns when stdout is not a terminal, unless COLUMNS says otherwise."""
    import os
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


def err(message: str) -> None:
    """One line on stderr."""
    typer.echo(message, err=True)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn PlannerError into a one-line message and its exit code; never show a traceback unless --debug."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except PlannerError as e:
            if state["debug"]:
                traceback.print_exc()
            err(f"error: {e}")
            if kwargs.get("json_out"):  # --json: the same error as one object on stdout, for scripts
                typer.echo(json_error(e))
            raise typer.Exit(e.exit_code)
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(130)
        except Exception as e:  # a bug of ours: say so, briefly
            if state["debug"]:
                traceback.print_exc()
            err(f"internal error: {e.__class__.__name__}: {e} (rerun with --debug for the traceback and report it)")
            raise typer.Exit(3)

    return wrapper


def json_error(e: PlannerError) -> str:
    """A PlannerError as the JSON object ``--json`` prints: ``feasible`` false for a well-formed request nothing
    satisfies (exit 1), the message, where (option or file, field) and the fix."""
    import json

    from planner.errors import InfeasibleError

    body = {"message": e.reason, "source": e.source, "field": e.field, "fix": e.fix, "exit_code": e.exit_code}
    out: dict[str, Any] = {"error": body}
    if isinstance(e, InfeasibleError):
        out = {"feasible": False, **out}
    return json.dumps(out)


def choice(value: str, allowed: tuple[str, ...] | list[str], option: str) -> str:
    if value not in allowed:
        raise PlannerError(f"unknown value {value!r}", source=option, fix=f"use one of: {', '.join(allowed)}")
    return value


def positive(value: int | float, option: str) -> None:
    if value is None or value < 1:
        raise PlannerError(f"must be >= 1, got {value}", source=option)


def int_set(value: str | None, option: str, minimum: int = 1) -> tuple[int, ...] | None:
    """A search constraint given as one integer or a comma list (``--tp 8``, ``--pp 4,8``); None when not given."""
    if value is None:
        return None
    out = []
    for v in (x.strip() for x in value.split(",")):
        try:
            n = int(v)
        except ValueError:
            raise PlannerError(f"not an integer: '{v}'", source=option, fix="one value or a comma list, e.g. 4,8")
        if n < minimum:
            raise PlannerError(f"must be >= {minimum}, got {n}", source=option)
        out.append(n)
    return tuple(sorted(set(out)))


def name_set(value: str | None, allowed: tuple[str, ...] | list[str], option: str) -> tuple[str, ...] | None:
    """A comma list of names, each one of ``allowed``; None when not given."""
    if value is None:
        return None
    names = tuple(dict.fromkeys(x.strip() for x in value.split(",")))
    for name in names:
        choice(name, allowed, option)
    return names


def search_constraints(tp: str | None, pp: str | None, cp: str | None, ep: str | None, vpp: str | None,
                       micro_batch: str | None, schedules: str | None, zero: str | None,
                       recompute: str | None, etp: str | None = None, dp_shard: str | None = None):
    """``planner.search.space.Constraints`` from the CLI's constraint options, or None when none is given."""
    from planner.cost.schedule import SCHEDULES
    from planner.search.space import Constraints
    from planner.specs.config import RECOMPUTE_MODES, ZERO_STAGES

    zeros = int_set(zero, "--zero", minimum=0)
    if zeros is not None and not set(zeros) <= set(ZERO_STAGES):
        raise PlannerError(f"unknown ZeRO stage in '{zero}'", source="--zero",
                           fix=f"use stages of: {', '.join(map(str, ZERO_STAGES))}")
    c = Constraints(tp=int_set(tp, "--tp"), pp=int_set(pp, "--pp"), cp=int_set(cp, "--cp"), ep=int_set(ep, "--ep"),
                    vpp=int_set(vpp, "--vpp"), micro_batch=int_set(micro_batch, "--micro-batch"),
                    etp=int_set(etp, "--etp"),
                    schedules=name_set(schedules, tuple(SCHEDULES), "--schedules"), zero=zeros,
                    recompute=name_set(recompute, RECOMPUTE_MODES, "--recompute"), dp_shard=dp_shard_set(dp_shard))
    return c if c.describe() else None


def dp_shard_set(value: str | None) -> tuple[int, ...] | None:
    """``--dp-shard``: HSDP shard sizes (integers >= 2) and/or ``none`` (ZeRO over all of DP), as a tuple with 0
    for none; None when not given."""
    if value is None:
        return None
    parts = [x.strip() for x in value.split(",")]
    sizes = int_set(",".join(x for x in parts if x.lower() != "none"), "--dp-shard", minimum=2) \
        if any(x.lower() != "none" for x in parts) else ()
    return tuple(sorted(set(sizes) | ({0} if any(x.lower() == "none" for x in parts) else set())))


#: help texts of the search constraints (``plan`` and ``sweep``, which take them as ``CONSTRAINT_OPTIONS``)
CONSTRAINT_HELP = {
    "tp": "Allowed TP degrees: one value or a comma list (default: every valid one)",
    "pp": "Allowed PP degrees (value or comma list)",
    "cp": "Allowed CP degrees (value or comma list)",
    "ep": "Allowed EP degrees (value or comma list)",
    "vpp": "Allowed virtual stages per pipeline rank (value or comma list; 1 = none)",
    "etp": "Allowed expert tensor-parallel degrees of MoE layers (the search tries TP and 1)",
    "micro_batch": "Allowed micro-batch sizes (value or comma list)",
    "schedules": "Allowed pipeline schedules, comma list (`planner list schedules`)",
    "zero": "Allowed ZeRO stages, comma list of 0-3",
    "dp_shard": "HSDP shard sizes in data-parallel ranks (value or comma list; `none` = ZeRO over all of DP). "
                "Default: none, and shard groups filling 1, 2, 4 or 8 nodes where the stack runs HSDP",
    "recompute": "Allowed recomputation modes, comma list of none, selective, full",
}

#: the search constraints as typer options, shared by ``plan`` and ``sweep`` (parameter name -> option)
CONSTRAINT_OPTIONS = {name: typer.Option(None, "--" + name.replace("_", "-"), help=text)
                      for name, text in CONSTRAINT_HELP.items()}


#: the run's own options (the request's, held fixed in every configuration a search ranks) as typer options, shared
#: by ``estimate``, ``plan`` and ``sweep`` (parameter name -> option); :func:`run_option_fields` checks them
RUN_OPTIONS = {
    "adam_moments": typer.Option("fp32", "--adam-moments",
                                 help="Dtype of Adam's two moments: fp32 | bf16 (Megatron-Core's precision-aware "
                                      "optimizer: --use-precision-aware-optimizer --exp-avg-dtype bf16 "
                                      "--exp-avg-sq-dtype bf16); the fp32 master weights stay. Not searched"),
    "act_fp8_store": typer.Option(False, "--activation-fp8-input-store/--no-activation-fp8-input-store",
                                  help="SwiGLU activations keep their input for backward in fp8 instead of bf16 "
                                       "(Megatron-Core activation_func_fp8_input_store; Megatron-Bridge model "
                                       "config). Not searched"),
    "moe_load_factor": typer.Option(1.0, "--moe-load-factor",
                                    help="MoE: the busiest expert-parallel rank's routed tokens over the mean (1: "
                                         "balanced, as benchmarks force it; a dropless run's data is above; a "
                                         "capacity factor with padding: that factor). Not searched"),
    "comm_reserved_sms": typer.Option(0, "--comm-reserved-sms",
                                      help="SMs the stack's communication kernels hold through the step, a static "
                                           "partition (DeepSeek-V3's DualPipe: 20 of the H800's 132); every compute "
                                           "kernel runs on the rest. 0: kernels share the SMs. Needs the profile's "
                                           "gpu.sm_count. Not searched"),
}


def run_option_fields(adam_moments: str, act_fp8_store: bool, moe_load_factor: float, stack: Any,
                      gated_mlp: bool = True, comm_reserved_sms: int = 0) -> dict[str, Any]:
    """The RunConfig fields of :data:`RUN_OPTIONS`' values (the names ``SearchSpace`` and ``plan_for_launcher``
    take too), each refused in one line naming its option where the stack (None: ``--stack any``) or the model
    cannot run it."""
    from planner.specs.config import comm_reserved_sms_value, moe_load_factor_value
    from planner.specs.stack import activation_fp8_input_store, adam_moment_bytes

    return {"adam_moment_bytes": adam_moment_bytes(adam_moments, stack),
            "activation_fp8_input_store": activation_fp8_input_store(act_fp8_store, stack, gated_mlp),
            "moe_load_factor": moe_load_factor_value(moe_load_factor),
            "comm_reserved_sms": comm_reserved_sms_value(comm_reserved_sms)}


def check_writable(path: Path, option: str) -> None:
    """A file the command will write at the end: its folder exists and takes files, and it is not a folder."""
    import os

    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise PlannerError("is a directory", source=option, field=str(path), fix="pass a file path")
    if not parent.is_dir():
        raise PlannerError(f"no such directory: {parent}", source=option, field=str(path),
                           fix="create the directory first or pass another path")
    if not os.access(parent, os.W_OK) or path.exists() and not os.access(path, os.W_OK):
        raise PlannerError("not writable", source=option, field=str(path), fix="pass a writable path")
