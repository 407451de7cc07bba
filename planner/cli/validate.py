"""``planner validate``: the public validation sets, measured vs estimated, per row and per group."""

from __future__ import annotations

import json
import statistics

import typer
from rich.table import Table

from planner.cli.app import app, choice, console, handle_errors
from planner.cli.render import add_columns
from planner.validation import validate as run_validation
from planner.validation.collectives import compare as compare_collectives
from planner.validation.compare import GROUPS, validate_modern

SETS = ("papers", "modern", "collectives", "all")


def _summary(errors: list[float]) -> dict:
    return {"rows": len(errors), "mean_abs_error": statistics.mean(abs(e) for e in errors) if errors else None,
            "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
            "max_abs_error": max(abs(e) for e in errors) if errors else None}


def modern_report(rows) -> dict:
    """Per-row and per-group accuracy of the modern set (rows that cannot be expressed are listed, not scored), and
    apart the rows some fitted value is fitted on (in sample) from the rest (out of sample)."""
    from planner.validation.fit import cross_validated_errors, fitted_row_ids

    scored = [r for r in rows if r.estimated is not None]
    fitted, left_out = fitted_row_ids(), cross_validated_errors()
    return {
        "rows": [{"id": r.id, "framework": r.framework, "groups": list(r.groups), "measured_tokens_per_s_per_gpu":
                  r.measured, "estimated_tokens_per_s_per_gpu": r.estimated,
                  "error": r.error if r.estimated is not None else None, "cannot_express": r.cannot_express or None,
                  "peak_memory_gib": r.peak_memory_gib, "memory_limit_gib": r.memory_limit_gib, "fits": r.fits,
                  "in_sample": r.id in fitted, "source": r.source, "command": r.command} for r in rows],
        "overall": _summary([r.error for r in scored]),
        "groups": {g: _summary([r.error for r in scored if g in r.groups]) for g in GROUPS},
        # per model family (the config's model_type): a family the model misses shows apart from the ones it fits
        "model_families": {t: _summary([r.error for r in scored if r.model_type == t])
                           for t in sorted({r.model_type for r in scored})},
        "in_sample": _summary([r.error for r in scored if r.id in fitted]),
        # the same rows, each at the value refit without its release (a fit of one source: without the row; a row
        # alone in its fit: its own)
        "in_sample_left_out": _summary([left_out.get(r.id, r.error) for r in scored if r.id in fitted]),
        "out_of_sample": _summary([r.error for r in scored if r.id not in fitted]),
        "cannot_express": sum(1 for r in rows if r.estimated is None),
        "do_not_fit": [r.id for r in rows if r.fits is False],
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


@app.command()
@handle_errors
def validate(
    which: str = typer.Option("all", "--set", help="papers (Megatron-LM 2021-22, A100) | modern (current stacks: "
                                                   "H100/H800/B200, bf16/fp8/mxfp8, dense and MoE) | "
                                                   "collectives (published nccl-tests figures) | all"),
    show_commands: bool = typer.Option(False, "--show-commands",
                                       help="Print each modern row's `planner estimate` command"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables"),
) -> None:
    """Compare the cost model with published runs: the papers' set (Korthikanti 2022 Table 5, Narayanan 2021
    Table 1, Llama 3 held out), the modern set (Megatron-Core, NeMo, Megatron-Bridge, DeepSeek-V3) and the collective
    model against published nccl-tests figures, with the error per row, per group and overall."""
    choice(which, SETS, "--set")
    out: dict = {}
    con = None if json_out else console()
    if which in ("papers", "all"):
        rows = run_validation()
        out["papers"] = {}
        for table in sorted({r.table for r in rows}, reverse=True):
            rs = [r for r in rows if r.table == table]
            out["papers"][table] = {"runs": [{"id": r.id, "metric": r.metric, "measured": r.measured,
                                              "estimated": r.estimated, "error": r.error} for r in rs],
                                    **_summary([r.error for r in rs])}
            if con is not None:
                t = Table(title=table)
                add_columns(t, ("run", "metric", "measured", "estimated", "error"), text=("run",))
                for r in rs:
                    t.add_row(r.id, r.metric, f"{r.measured:.2f}", f"{r.estimated:.2f}", f"{100 * r.error:+.1f}%")
                summary = out["papers"][table]
                con.print(t)
                con.print(f"{table}: mean |error| {100 * summary['mean_abs_error']:.2f}%, "
                          f"max |error| {100 * summary['max_abs_error']:.2f}%")
    if which in ("modern", "all"):
        rows = validate_modern()
        report = modern_report(rows)
        out["modern"] = report
        if con is not None:
            t = Table(title="modern public runs: tokens/s per GPU, measured vs estimated for the published layout")
            add_columns(t, ("run", "framework", "groups", "measured", "estimated", "error"),
                        text=("run", "framework", "groups"))
            for r in rows:
                est = f"{r.estimated:,.0f}" if r.estimated is not None else "cannot express"
                err = f"{100 * r.error:+.1f}%" if r.estimated is not None else r.cannot_express
                t.add_row(r.id, r.framework, ", ".join(r.groups), f"{r.measured:,.0f}", est, err)
            con.print(t)
            g = Table(title="modern set: accuracy per group (a row may be in several)")
            add_columns(g, ("group", "rows", "mean |error|", "median |error|", "max |error|"), text=("group",))
            apart = [("in sample: rows a fitted value is fitted on", report["in_sample"]),
                     ("  the same, each refit without its release (or row)", report["in_sample_left_out"]),
                     ("out of sample: all other rows", report["out_of_sample"])]
            for name, s in [("all", report["overall"])] + list(report["groups"].items()) + apart:
                g.add_row(name, str(s["rows"]), _pct(s["mean_abs_error"]), _pct(s["median_abs_error"]),
                          _pct(s["max_abs_error"]))
            con.print(g)
            f = Table(title="modern set: accuracy per model family (the config's model_type)")
            add_columns(f, ("model family", "rows", "mean |error|", "median |error|", "max |error|"),
                        text=("model family",))
            for name, s in report["model_families"].items():
                f.add_row(name, str(s["rows"]), _pct(s["mean_abs_error"]), _pct(s["median_abs_error"]),
                          _pct(s["max_abs_error"]))
            con.print(f)
            if report["do_not_fit"]:
                con.print(f"published runs the memory model says do not fit (they ran): "
                          f"{len(report['do_not_fit'])} of {len(rows)}: " + ", ".join(
                              f"{r.id} ({r.peak_memory_gib:.0f} of {r.memory_limit_gib:.0f} GiB)"
                              for r in rows if r.fits is False))
            if report["cannot_express"]:
                con.print(f"{report['cannot_express']} row(s) cannot be expressed yet (listed above, not scored)")
            if show_commands:
                for r in rows:
                    con.print(f"# {r.id}\n{r.command}", soft_wrap=True)
    if which in ("collectives", "all"):
        rows = compare_collectives()
        out["collectives"] = {"runs": [{"id": r.id, "metric": r.metric, "measured": r.measured,
                                        "estimated": r.estimated, "error": r.error, "source": r.source,
                                        "in_sample": r.in_sample or None}
                                       for r in rows], **_summary([r.error for r in rows])}
        if con is not None:
            t = Table(title="collectives: published nccl-tests figures vs the collective model (NCCL's tuner model)")
            add_columns(t, ("run", "metric", "measured", "estimated", "error", "sets a profile value"),
                        text=("run", "metric", "sets a profile value"))
            for r in rows:
                t.add_row(r.id, r.metric, f"{r.measured:.2f}", f"{r.estimated:.2f}", f"{100 * r.error:+.1f}%",
                          "yes" if r.in_sample else "no: independent check")
            con.print(t)
            summary = out["collectives"]
            con.print(f"collectives: mean |error| {100 * summary['mean_abs_error']:.2f}%, "
                      f"max |error| {100 * summary['max_abs_error']:.2f}%")
    if json_out:
        typer.echo(json.dumps(out, indent=2, sort_keys=True))
