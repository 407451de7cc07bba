"""``planner export PLAN.json --to megatron|torchtitan|deepspeed|nemo [--out FILE]``: a launcher config from a plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from planner.cli.app import app, err, handle_errors
from planner.errors import PlannerError
from planner.export import TARGETS, export as export_plan
from planner.schema import validate_plan_json
from planner.specs.model import read_json_file


def write_export(plan: dict[str, Any], target: str, out: Path | None, *, source: str, option: str) -> None:
    """Render ``plan`` for ``target``; write it to ``out`` (or stdout) and print the notes on stderr.

    Shared with ``planner plan --emit``."""
    result = export_plan(plan, target, source=source, option=option)
    if out is None:
        typer.echo(result.text, nl=False)
    else:
        try:
            out.write_text(result.text)
        except OSError as e:
            raise PlannerError(f"cannot write: {e.strerror or e}", source=str(out),
                               fix="pass a writable path to --out")
        err(f"wrote {target} config to {out}")
    for note in result.notes:
        err(f"note: {note}")


@app.command()
@handle_errors
def export(
    plan_file: Path = typer.Argument(..., help="A plan JSON written by `planner plan --json` (or `estimate --json`)",
                                     show_default=False),
    to: str = typer.Option(..., "--to", help=f"Launcher: {' | '.join(TARGETS)}"),
    out: Path = typer.Option(None, "--out", help="Write the config here instead of stdout"),
) -> None:
    """Turn a saved plan into a launcher config (Megatron-LM args, torchtitan TOML, DeepSpeed JSON, NeMo 2.0)."""
    if to not in TARGETS:
        raise PlannerError(f"unknown launcher '{to}'", source="--to", fix=f"use one of: {', '.join(TARGETS)}")
    plan = read_json_file(plan_file, "plan JSON")
    validate_plan_json(plan, str(plan_file))
    write_export(plan, to, out, source=str(plan_file), option="--to")
