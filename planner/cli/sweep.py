"""``planner sweep``: the best plan for every combination of models, clusters, GPU counts, batches and lengths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from planner.cli.app import (CONSTRAINT_OPTIONS, RUN_OPTIONS, app, choice, check_writable, console, err,
                              handle_errors, run_option_fields, search_constraints)
from planner.cli.render import add_columns
from planner.errors import PlannerError

#: rows printed in the terminal table; the CSV holds them all
MAX_TABLE_ROWS = 50


def split_values(values: list[str] | None, option: str) -> list[str]:
    """Repeated options and comma-separated lists, both: ``--gpus 64,128 --gpus 256``."""
    out = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    if not out:
        raise PlannerError("needs at least one value", source=option)
    return out


class PartialCSV:
    """Rows written as the sweep finishes them (``index`` = the scenario's row in the final CSV, then the row's
    fields; a header before the first), flushed each time: what a failed sweep leaves behind."""

    def __init__(self, path: Path):
        self.path, self.count, self._file, self._writer = path, 0, None, None

    def write(self, index: int, row: dict) -> None:
        import csv as csv_module

        if self._file is None:
            self._file = self.path.open("w", newline="")
            self._writer = csv_module.DictWriter(self._file, fieldnames=["index", *row])
            self._writer.writeheader()
        self._writer.writerow({"index": index, **row})
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _number(text: str, option: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise PlannerError(f"not a number: '{text}'", source=option, fix=what) from None
    if not value > 0 or value != value or value == float("inf"):
        raise PlannerError(f"must be a positive number, got {text}", source=option, fix=what)
    return value


def vary_values(items: list[str] | None) -> dict[str, list[float]]:
    """``--vary PATH=V1,V2`` (repeatable) as {path: [values]}."""
    out: dict[str, list[float]] = {}
    for item in items or []:
        path, sep, values = item.partition("=")
        if not sep or not path.strip() or not values.strip():
            raise PlannerError(f"not PATH=VALUES: '{item}'", source="--vary", fix="e.g. gpu.hbm_gib=80,141,192")
        if path.strip() in out:
            raise PlannerError(f"'{path.strip()}' given twice", source="--vary", fix="one --vary per field")
        out[path.strip()] = [_number(v.strip(), "--vary", "e.g. gpu.hbm_gib=80,141,192")
                             for v in values.split(",") if v.strip()]
    return out


def price_values(text: str | None) -> float | dict[str, float] | None:
    """``--price-per-gpu-hour``: one number, or CLUSTER=PRICE pairs."""
    if text is None:
        return None
    what = "one number (2.5) or CLUSTER=PRICE pairs (h100-80gb-sxm=2.5,b200-180gb=5)"
    if "=" not in text:
        return _number(text.strip(), "--price-per-gpu-hour", what)
    out = {}
    for pair in text.split(","):
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise PlannerError(f"not CLUSTER=PRICE: '{pair}'", source="--price-per-gpu-hour", fix=what)
        out[name.strip()] = _number(value.strip(), "--price-per-gpu-hour", what)
    return out


def int_values(values: list[str] | None, option: str) -> list[int]:
    out = []
    for v in split_values(values, option):
        try:
            n = int(v)
        except ValueError:
            raise PlannerError(f"not an integer: '{v}'", source=option, fix="e.g. 64,128,256")
        if n < 1:
            raise PlannerError(f"must be >= 1, got {n}", source=option)
        out.append(n)
    return out


def result_table(df: Any) -> Table:
    t = Table(title=f"Best plan per scenario ({len(df)} scenarios, {int(df['feasible'].sum())} feasible)")
    priced = "cost_per_million_tokens_usd" in df and df["cost_per_million_tokens_usd"].notna().any()
    add_columns(t, ("scenario", "layout", "schedule, recompute, ZeRO", "step s", "MFU", "GiB") +
                (("$ per M tokens",) if priced else ()), text=("scenario", "layout", "schedule, recompute, ZeRO"))
    for r in df.head(MAX_TABLE_ROWS).itertuples(index=False):
        scenario = escape(f"{r.model} on {r.num_gpus} x {r.cluster}, batch {r.global_batch_size}, seq {r.seq_len}")
        if not r.feasible:
            t.add_row(scenario, f"[red]{r.error}[/]", "", "", "", "", *([""] if priced else []))
            continue
        layout = [f"{name}{int(getattr(r, col))}" for name, col in (("TP", "tp"), ("PP", "pp"), ("DP", "dp"),
                                                                   ("CP", "cp"), ("EP", "ep"), ("VPP", "vpp"))
                  if col == "dp" or int(getattr(r, col)) > 1]
        layout.append(f"mb{int(r.micro_batch_size)}")
        hsdp = f" HSDP {int(r.dp_shard)}x{int(r.dp) // int(r.dp_shard)}" if r.dp_shard == r.dp_shard and \
            r.dp_shard is not None else ""  # NaN (pandas' None) is not equal to itself
        t.add_row(scenario, " ".join(layout), f"{r.schedule}, {r.recompute}, ZeRO-{int(r.zero_stage)}{hsdp}",
                  f"{r.step_time_s:.3f}", f"{100 * r.mfu:.1f}%", f"{r.peak_memory_gib:.1f}",
                  *([f"{r.cost_per_million_tokens_usd:.3f}"] if priced else []))
    return t


def _sweep_stack(stack: str | None, launcher: str | None) -> str | None:
    """The stack the sweep's searches run under (``specs.stack.stack_name_for``); None for ``ANY_STACK``."""
    from planner.specs.stack import ANY_STACK, stack_name_for
    name = stack_name_for(stack, launcher)
    return None if name == ANY_STACK else name


@app.command()
@handle_errors
def sweep(
    model: list[str] = typer.Option(None, "--model", help="Model name or config.json (repeat, or comma-separate)"),
    cluster: list[str] = typer.Option(None, "--cluster", help="Hardware profile name or path (repeat / commas)"),
    gpus: list[str] = typer.Option(None, "--gpus", help="GPU counts, e.g. 64,128,256"),
    global_batch: list[str] = typer.Option(None, "--global-batch", help="Global batch sizes in sequences"),
    seq_len: list[str] = typer.Option(["2048"], "--seq-len", help="Sequence lengths in tokens"),
    objective: str = typer.Option("time", "--objective", help="What the search optimizes (see `planner plan`)"),
    top_k: int = typer.Option(0, "--top-k", help="Runner-up plans each search keeps (the best is reported)"),
    max_memory_gib: float = typer.Option(None, "--max-memory-gib", help="Memory cap per GPU in GiB"),
    launcher: str = typer.Option(None, "--launcher", help="Only plans this launcher runs: megatron | torchtitan | "
                                                          "deepspeed | nemo"),
    precision: str = typer.Option("bf16", "--precision", help="GEMM precision: bf16 | fp16 | fp8 | mxfp8"),
    adam_moments: str = RUN_OPTIONS["adam_moments"], moe_load_factor: float = RUN_OPTIONS["moe_load_factor"],
    act_fp8_store: bool = RUN_OPTIONS["act_fp8_store"], comm_reserved_sms: int = RUN_OPTIONS["comm_reserved_sms"],
    stack: str = typer.Option(None, "--stack", help="Training stack (default megatron-core, or --launcher's; 'any': "
                                                    "everything the model knows)"),
    jobs: int = typer.Option(None, "--jobs", help="Worker processes (default: all cores for large sweeps)"),
    csv: Path = typer.Option(None, "--csv", help="Write every row to this CSV file"),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar and no table (with --csv)"),
    vary: list[str] = typer.Option(None, "--vary", help="Hardware co-design: a profile field and its values, e.g. "
                                                        "gpu.hbm_gib=80,141,192 or node.gpus_per_node=8,72 "
                                                        "(repeat for more fields; every combination is swept)"),
    price: str = typer.Option(None, "--price-per-gpu-hour", help="Dollars per GPU-hour: one number, or "
                                                                 "CLUSTER=PRICE pairs (default: the profile's "
                                                                 "price_per_gpu_hour_usd)"),
    train_tokens: float = typer.Option(None, "--train-tokens", help="A token budget (e.g. 15e12): adds the days "
                                                                    "and dollars to train on it"),
    backend: str = typer.Option("process", "--backend", help="Where scenarios run: process (a local pool) or dask "
                                                             "(dask.distributed: a local cluster of --jobs workers, "
                                                             "or --scheduler)"),
    scheduler: str = typer.Option(None, "--scheduler", help="With --backend dask: a running scheduler's address "
                                                            "(tcp://host:8786)"),
    tp: str = CONSTRAINT_OPTIONS["tp"], pp: str = CONSTRAINT_OPTIONS["pp"], cp: str = CONSTRAINT_OPTIONS["cp"],
    ep: str = CONSTRAINT_OPTIONS["ep"], vpp: str = CONSTRAINT_OPTIONS["vpp"], etp: str = CONSTRAINT_OPTIONS["etp"],
    dp_shard: str = CONSTRAINT_OPTIONS["dp_shard"],
    micro_batch: str = CONSTRAINT_OPTIONS["micro_batch"], schedules: str = CONSTRAINT_OPTIONS["schedules"],
    zero: str = CONSTRAINT_OPTIONS["zero"], recompute: str = CONSTRAINT_OPTIONS["recompute"],
) -> None:
    """Sweep scenarios (Cartesian product of the options) and report the best plan of each, e.g.
    ``planner sweep --model llama-3.1-70b --cluster h100-80gb-sxm,a100-80gb-sxm --gpus 64,128 --global-batch 512
    --seq-len 4096,8192 --csv out.csv``."""
    from planner.search.engine import check_search_options
    from planner.sweep import sweep as run_sweep

    models = split_values(model, "--model")
    clusters = split_values(cluster, "--cluster")
    counts = int_values(gpus, "--gpus")
    batches = int_values(global_batch, "--global-batch")
    lengths = int_values(seq_len, "--seq-len")
    if top_k < 0:
        raise PlannerError(f"must be >= 0, got {top_k}", source="--top-k")
    check_search_options(objective, top_k, max_memory_gib)
    if jobs is not None and jobs < 1:
        raise PlannerError(f"must be >= 1, got {jobs}", source="--jobs")
    if quiet and csv is None:
        raise PlannerError("--quiet without --csv would print nothing", source="--quiet", fix="add --csv FILE")
    if csv is not None:
        check_writable(csv, "--csv")  # before the work, not after it
    from planner.specs.stack import load_stack
    sweep_stack = _sweep_stack(stack, launcher)
    # named as the command line names them, before the work
    run_option_fields(adam_moments, act_fp8_store, moe_load_factor,
                      load_stack(sweep_stack) if sweep_stack is not None else None, comm_reserved_sms=comm_reserved_sms)
    constraints = search_constraints(tp, pp, cp, ep, vpp, micro_batch, schedules, zero, recompute, etp,
                                     dp_shard)
    varied = vary_values(vary)
    prices = price_values(price)
    if train_tokens is not None and not train_tokens > 0:
        raise PlannerError(f"must be > 0, got {train_tokens:g}", source="--train-tokens")
    n_variants = 1
    for values in varied.values():
        n_variants *= len(values)
    if varied:  # a bad field or value fails here, before the progress bar
        from planner.sweep import hardware_variants
        hardware_variants(clusters, varied)
    total = len(models) * len(clusters) * n_variants * len(counts) * len(batches) * len(lengths)
    progress = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=Console(stderr=True), disable=quiet)
    from planner.sweep import BACKENDS
    choice(backend, BACKENDS, "--backend")
    if scheduler is not None and backend != "dask":
        raise PlannerError("a scheduler address needs the dask backend", source="--scheduler", fix="add --backend dask")
    partial = stream = None
    if csv is not None:  # rows are kept as they finish, so a failure part-way loses none of them
        partial = csv.with_name(csv.name + ".partial")
        stream = PartialCSV(partial)
    with progress:
        task = progress.add_task("sweep", total=total)
        try:
            df = run_sweep(models, clusters, counts, batches, lengths, top_k=top_k, objective=objective,
                           max_memory_gib=max_memory_gib, launcher=launcher, precision=precision,
                           stack=sweep_stack, processes=jobs, constraints=constraints,
                           vary=varied or None, prices=prices, train_tokens=train_tokens, backend=backend,
                           scheduler=scheduler, on_row=stream.write if stream is not None else None,
                           adam_moments=adam_moments, activation_fp8_input_store=act_fp8_store,
                           moe_load_factor=moe_load_factor, comm_reserved_sms=comm_reserved_sms,
                           progress=lambda done, _total: progress.update(task, completed=done))
        except BaseException:
            if stream is not None and stream.count:
                err(f"kept the {stream.count} finished rows in {partial}")
            raise
        finally:
            if stream is not None:
                stream.close()
    if csv is not None:
        try:
            df.to_csv(csv, index=False)
        except OSError as e:
            raise PlannerError(f"cannot write: {e.strerror or e}", source=str(csv), fix="pass a writable path")
        partial.unlink(missing_ok=True)
        err(f"wrote {len(df)} rows to {csv}")
    if not quiet:
        console().print(result_table(df))
        if len(df) > MAX_TABLE_ROWS:
            err(f"showing {MAX_TABLE_ROWS} of {len(df)} rows" + (f"; all are in {csv}" if csv else "; use --csv"))
