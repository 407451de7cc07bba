"""``planner validate``: the public validation set, measured vs estimated."""

from __future__ import annotations

import statistics

from rich.table import Table

from planner.cli.app import app, console, handle_errors
from planner.validation import validate as run_validation


@app.command()
@handle_errors
def validate() -> None:
    """Compare the cost model with published Megatron-LM runs (Korthikanti 2022 Table 5, Narayanan 2021 Table 1)."""
    rows = run_validation()
    con = console()
    for table in sorted({r.table for r in rows}, reverse=True):
        rs = [r for r in rows if r.table == table]
        t = Table(title=table)
        for col in ("run", "metric", "measured", "estimated", "error"):
            t.add_column(col, justify="right" if col != "run" else "left")
        for r in rs:
            t.add_row(r.id, r.metric, f"{r.measured:.2f}", f"{r.estimated:.2f}", f"{100 * r.error:+.1f}%")
        errs = [abs(r.error) for r in rs]
        con.print(t)
        con.print(f"{table}: mean |error| {100 * statistics.mean(errs):.2f}%, max |error| {100 * max(errs):.2f}%")
