"""``planner estimate``: evaluate one given configuration."""

from __future__ import annotations

import typer

from planner.cli.app import app, choice, console, handle_errors
from planner.cli.render import print_estimate
from planner.cost.schedule import SCHEDULES
from planner.cost.step import estimate as estimate_config
from planner.errors import PlannerError
from planner.plan import dumps, plan_dict
from planner.specs.config import CP_KINDS, RECOMPUTE_MODES, RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model


@app.command()
@handle_errors
def estimate(
    model: str = typer.Option(..., "--model", help="Shipped model name (see `planner list models`) or a HF config.json"),
    cluster: str = typer.Option(..., "--cluster", help="Shipped hardware profile name or a profile JSON path"),
    gpus: int = typer.Option(..., "--gpus", help="Total GPUs"),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree"),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree"),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree"),
    cp_kind: str = typer.Option("ring", "--cp-kind", help="Context parallelism: ring (Megatron CP) | ulysses"),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree (MoE models; divides DP x CP)"),
    vpp: int = typer.Option(1, "--vpp", help="Virtual pipeline stages (model chunks) per pipeline rank"),
    global_batch: int = typer.Option(..., "--global-batch", help="Global batch size in sequences"),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Micro-batch size in sequences"),
    seq_len: int = typer.Option(2048, "--seq-len", help="Sequence length in tokens"),
    recompute: str = typer.Option("selective", "--recompute", help="none | selective | full"),
    sequence_parallel: bool = typer.Option(True, "--sequence-parallel/--no-sequence-parallel"),
    zero: int = typer.Option(1, "--zero", help="ZeRO stage 0 | 1 | 2 | 3"),
    schedule: str = typer.Option("1f1b", "--schedule", help="Pipeline schedule (see `planner list schedules`)"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables"),
) -> None:
    """Estimate step time, throughput, MFU and per-stage memory of one configuration (DP = gpus / (tp*pp*cp))."""
    choice(recompute, RECOMPUTE_MODES, "--recompute")
    choice(schedule, tuple(SCHEDULES), "--schedule")
    choice(cp_kind, CP_KINDS, "--cp-kind")
    if zero not in (0, 1, 2, 3):
        raise PlannerError(f"unknown ZeRO stage {zero}", source="--zero", fix="use 0, 1, 2 or 3")
    for name, value in (("--gpus", gpus), ("--tp", tp), ("--pp", pp), ("--cp", cp), ("--ep", ep), ("--vpp", vpp),
                        ("--global-batch", global_batch), ("--micro-batch", micro_batch), ("--seq-len", seq_len)):
        if value < 1:
            raise PlannerError(f"must be >= 1, got {value}", source=name)
    spec = load_model(model)
    hw = load_cluster(cluster)
    cfg = RunConfig(num_gpus=gpus, tp=tp, pp=pp, cp=cp, cp_kind=cp_kind, ep=ep, vpp=vpp, global_batch_size=global_batch,
                    micro_batch_size=micro_batch, seq_len=seq_len, recompute=recompute,
                    sequence_parallel=sequence_parallel and tp > 1, zero_stage=zero, schedule=schedule)
    est = estimate_config(spec, hw, cfg)
    if json_out:
        typer.echo(dumps(plan_dict(spec, hw.name, cfg, est)), nl=False)
        return
    print_estimate(console(), est, cfg, f"{spec.name} on {gpus} x {hw.gpu.name} ({hw.name})")
