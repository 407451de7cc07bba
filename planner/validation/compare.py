"""Compare the cost model with published measurements (``published_runs.json``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from planner.cost.compute import gpt_full_recompute_flops_eq3, model_flops_per_step
from planner.cost.step import estimate
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import model_from_config

RUNS_FILE = Path(__file__).with_name("published_runs.json")


@dataclass(frozen=True)
class ValidationRow:
    id: str
    table: str
    metric: str
    measured: float
    estimated: float
    heldout: bool = False  # never used to fit a constant

    @property
    def error(self) -> float:
        """Signed relative error (estimated - measured) / measured."""
        return (self.estimated - self.measured) / self.measured


def load_runs(path: Path = RUNS_FILE) -> list[dict]:
    return json.loads(path.read_text())["runs"]


def evaluate_run(run: dict) -> ValidationRow:
    model = model_from_config(run["model"], source=run["id"], default_name=run["model"].get("name", run["id"]))
    cluster = load_cluster(run["cluster"])
    conf = dict(run["config"])
    if conf.get("layers_per_stage") is not None:
        conf["layers_per_stage"] = tuple(conf["layers_per_stage"])
    cfg = RunConfig(**conf)
    est = estimate(model, cluster, cfg)
    metric = run["measured"]["metric"]
    if metric == "step_time_s":
        value = est.step_time_s
    elif metric == "tflops_per_gpu_eq3":
        # Narayanan et al. count Eq. 3 FLOPs (with the recompute forward) per second per GPU
        flops = gpt_full_recompute_flops_eq3(cfg.global_batch_size, cfg.seq_len, model.num_layers,
                                             model.hidden_size, model.vocab_size)
        value = flops / est.step_time_s / cfg.num_gpus / 1e12
    elif metric == "mfu":
        value = est.mfu
    elif metric == "mfu_causal":
        # MFU counting only the unmasked half of causal attention's s^2 FLOPs (the convention under which long-
        # context runs report MFU close to their short-context MFU, as Llama 3's Table 4 does)
        flops = model_flops_per_step(model, cfg.global_batch_size, cfg.seq_len, causal_half=True)
        value = flops / est.step_time_s / (cfg.num_gpus * cluster.gpu.peak_flops)
    else:
        raise ValueError(f"unknown metric {metric}")
    return ValidationRow(run["id"], run["table"], metric, float(run["measured"]["value"]), value,
                         bool(run.get("heldout", False)))


def validate(runs: list[dict] | None = None) -> list[ValidationRow]:
    return [evaluate_run(r) for r in (runs if runs is not None else load_runs())]
