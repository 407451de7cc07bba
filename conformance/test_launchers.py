"""Every export of a spread of plans, loaded by the launcher's own parser and validator (issue 11).

Runs in the environment `.ci/run` builds from `conformance/requirements.txt` (DeepSpeed, torchtitan and the torch they
need), not in the main suite: `python -m pytest -q -p no:cacheprovider conformance` there. No GPU and no process
group: DeepSpeed's config is read as rank 0 of the plan's data-parallel group would read it; torchtitan's parallel
degrees are checked against the plan's world size by ParallelDims itself.
"""

from __future__ import annotations

import json

import pytest

from planner.errors import PlannerError
from planner.export import deepspeed as ds_export
from planner.export import emit, plan_for_launcher
from planner.export import torchtitan as tt_export
from planner.plan import config_fields
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model

#: searched requests (model, cluster, GPUs, global batch, sequence), each planned for the launcher itself
SEARCHED = [("llama-3.1-8b", "h100-80gb-sxm", 16, 64, 4096), ("llama-3.1-70b", "h100-80gb-sxm", 64, 512, 8192),
            ("gpt3-175b", "a100-80gb-sxm", 1024, 1536, 2048), ("mixtral-8x7b", "h100-80gb-sxm", 64, 256, 4096),
            ("llama-3.1-405b", "h100-80gb-sxm", 2048, 1024, 8192)]
#: hand-written layouts that reach the corners: ZeRO 0-3, context parallelism of each kind, virtual stages, every
#: schedule torchtitan runs, uneven splits, recomputation modes, expert parallelism
CONFIGS = [
    dict(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=64, zero_stage=0),
    dict(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=64, zero_stage=2),
    dict(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=64, zero_stage=3, recompute="full"),
    dict(model="llama-3.1-70b", num_gpus=64, tp=4, pp=2, global_batch_size=128, micro_batch_size=2, zero_stage=1),
    dict(model="llama-3.1-70b", num_gpus=64, tp=8, cp=2, cp_kind="ulysses", global_batch_size=32, seq_len=16384),
    dict(model="llama-3.1-70b", num_gpus=64, tp=8, cp=2, cp_kind="ring", global_batch_size=32, seq_len=16384),
    dict(model="llama-3.1-8b", num_gpus=32, pp=4, vpp=2, global_batch_size=64, schedule="interleaved-1f1b"),
    dict(model="llama-3.1-8b", num_gpus=32, pp=4, vpp=2, global_batch_size=64, schedule="bfs", zero_stage=3),
    dict(model="llama-3.1-8b", num_gpus=32, pp=4, vpp=2, global_batch_size=64, schedule="zbv"),
    dict(model="llama-3.1-8b", num_gpus=32, pp=4, vpp=2, global_batch_size=64, schedule="dualpipev"),
    dict(model="mixtral-8x7b", num_gpus=64, pp=2, vpp=2, ep=8, global_batch_size=128, schedule="dualpipev",
         recompute="none", ep_comm_overlap=True),
    dict(model="llama-3.1-8b", num_gpus=32, pp=4, global_batch_size=64, schedule="zb-h1"),
    dict(model="llama-3.1-8b", num_gpus=32, pp=4, global_batch_size=64, schedule="gpipe"),
    dict(model="llama-3.1-8b", num_gpus=32, pp=4, global_batch_size=64, schedule="1f1b", recompute="full",
         recompute_num_layers=2),
    dict(model="llama-3.1-405b", num_gpus=2048, tp=8, pp=16, global_batch_size=1024, seq_len=8192,
         layers_per_stage=(7,) + (8,) * 14 + (7,)),
    dict(model="mixtral-8x7b", num_gpus=64, tp=2, ep=8, global_batch_size=64, seq_len=4096),
    dict(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=64, zero_stage=3, recompute="full",
         sequence_parallel=True, dp_shard=4),
]


def _plan(spec: dict) -> dict:
    from dataclasses import asdict
    spec = dict(spec)
    model = load_model(spec.pop("model"))
    cfg = RunConfig(**spec)
    return json.loads(json.dumps({"schema_version": "1.0", "model": model.name, "cluster": "h100-80gb-sxm",
                                  **config_fields(model, cfg), "model_spec": asdict(model)}))


def _plans(target: str) -> list[tuple[str, dict]]:
    out = []
    for model, cluster, gpus, batch, seq in SEARCHED:
        plan = plan_for_launcher(load_model(model), load_cluster(cluster), gpus, batch, seq, target)
        out.append((f"searched-{model}-{gpus}", json.loads(plan.to_json())))
    for i, spec in enumerate(CONFIGS):
        out.append((f"config-{i}-{spec['model']}", _plan(spec)))
    return out


# ----- DeepSpeed ----------------------------------------------------------------------------------------------
class _DataParallel:
    """What DeepSpeedConfig asks of Megatron-DeepSpeed's mpu: the data-parallel world size (DP; Ulysses' CP ranks
    are sequence parallel, outside it)."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.mark.parametrize("name, plan", _plans("deepspeed"), ids=lambda x: x if isinstance(x, str) else "")
def test_deepspeed_reads_every_export(name, plan, monkeypatch):
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        config = json.loads(emit(plan, "deepspeed"))
    except PlannerError as e:
        assert "deepspeed cannot run this plan" in str(e)  # refused with the reason: fine, and never for searched
        assert not name.startswith("searched"), e
        return
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
    par, batch = plan["parallelism"], plan["batch"]
    ds = DeepSpeedConfig(config, mpu=_DataParallel(par["dp"]))
    assert ds.train_batch_size == batch["global_batch_size"]
    assert ds.train_micro_batch_size_per_gpu == batch["micro_batch_size"]
    assert ds.gradient_accumulation_steps == batch["num_microbatches"]
    assert ds.zero_optimization_stage == par["zero_stage"]
    assert ds.bfloat16_config.enabled == (plan["options"]["precision"] == "bf16")
    note = ds_export.notes(plan)[0]
    assert ("--no-pipeline-parallel" in note) == (par["pp"] == 1)


# ----- torchtitan ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, plan", _plans("torchtitan"), ids=lambda x: x if isinstance(x, str) else "")
def test_torchtitan_reads_every_export(name, plan, tmp_path):
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims

    try:
        text = emit(plan, "torchtitan")
    except PlannerError as e:
        assert "torchtitan cannot run this plan" in str(e)
        assert not name.startswith("searched"), e
        return
    path = tmp_path / "job.toml"
    path.write_text(text)
    job = ConfigManager().parse_args(["--job.config_file", str(path)])
    par, batch = plan["parallelism"], plan["batch"]
    p = job.parallelism
    # the degrees multiply to the plan's GPUs, as ParallelDims checks at start-up
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=plan["num_gpus"])
    assert (dims.tp, dims.pp, dims.cp) == (par["tp"], par["pp"], par["cp"])
    assert dims.dp_replicate * dims.dp_shard == par["dp"]
    assert job.training.global_batch_size == batch["global_batch_size"] and job.training.seq_len == batch["seq_len"]
    # torchtitan: local_batch_size per data-parallel rank per forward; without PP the rest of the global batch is
    # gradient accumulation (global / (local x DP) steps), with PP it is split into pipeline micro-batches
    local = job.training.local_batch_size
    if par["pp"] == 1:
        assert local == batch["micro_batch_size"]
        assert batch["global_batch_size"] // (local * par["dp"]) == batch["num_microbatches"]
    else:
        assert local == batch["micro_batch_size"] * batch["num_microbatches"]
    if par["pp"] > 1:
        get_schedule_class(p.pipeline_parallel_schedule)  # a schedule torch.distributed.pipelining has
        assert p.pipeline_parallel_microbatch_size == batch["micro_batch_size"]
        parts = p.module_fqns_per_model_part
        assert len(parts) == par["pp"] * par["vpp"]
        layers = [sum(1 for m in part if m.startswith("layers.")) for part in parts]
        assert layers == plan["layers_per_stage"]
    assert job.activation_checkpoint.mode in ("none", "selective", "full")
    assert tt_export.sections(plan)["parallelism"]["tensor_parallel_degree"] == par["tp"]
