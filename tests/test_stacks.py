"""Training stacks as data (issue 9): what runs the job sets the runtime options and bounds the search, the CLI's
default plan is one its stack can launch, and the 2021-22 papers come out of the CLI with --stack megatron-2021."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.cost.compute import gpt_full_recompute_flops_eq3
from planner.export import megatron, stack_spaces, torchtitan
from planner.specs.model import model_from_config
from planner.specs.stack import DEFAULT_STACK, load_stack, shipped_stacks, stacks_dir
from planner.validation import load_runs

runner = CliRunner()


def test_shipped_stacks_load_and_the_default_is_listed():
    assert set(shipped_stacks()) >= {"megatron-core", "megatron-2021", "torchtitan", "deepspeed"}
    r = runner.invoke(app, ["list", "stacks", "--json"])
    assert r.exit_code == 0
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert f"{DEFAULT_STACK} (default)" in rows
    assert rows[f"{DEFAULT_STACK} (default)"]["dispatchers"] == "alltoall, hybridep"
    assert rows["torchtitan"]["dispatchers"] == "alltoall"
    core = load_stack("megatron-core")
    assert core.tp_comm_overlap and core.grad_reduce_bytes == 4 and core.launcher == "megatron"
    old = load_stack("megatron-2021")
    assert not old.flash_attention and not old.overlap_grad_reduce and not old.cp_kinds


def _cli_args(run: dict, tmp_path) -> list[str]:
    path = tmp_path / f"{run['id']}.json"
    path.write_text(json.dumps(run["model"]))
    c = run["config"]
    args = ["estimate", "--stack", "megatron-2021", "--model", str(path), "--cluster", run["cluster"], "--gpus",
            str(c["num_gpus"]), "--tp", str(c["tp"]), "--pp", str(c["pp"]), "--vpp", str(c.get("vpp", 1)),
            "--global-batch", str(c["global_batch_size"]), "--micro-batch", str(c["micro_batch_size"]),
            "--seq-len", str(c["seq_len"]), "--recompute", c["recompute"], "--zero", str(c["zero_stage"]),
            "--schedule", c["schedule"], "--json"]
    args.append("--sequence-parallel" if c["sequence_parallel"] else "--no-sequence-parallel")
    return args


@pytest.mark.parametrize("table,metric,mean_max,max_max", [
    ("korthikanti2022_table5", "step_time_s", 0.03, 0.06),
    ("narayanan2021_table1", "tflops_per_gpu_eq3", 0.04, 0.08),
])
def test_the_papers_through_the_cli_with_the_2021_stack(table, metric, mean_max, max_max, tmp_path):
    """Issue 9's acceptance: Korthikanti Table 5 within 3% mean / 6% max and Narayanan Table 1 within 4% / 8%,
    through `planner estimate --stack megatron-2021` with nothing but the published layout on the command line."""
    errors = []
    for run in (r for r in load_runs() if r["table"] == table):
        r = runner.invoke(app, _cli_args(run, tmp_path))
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        assert d["stack"] == "megatron-2021" and d["options"]["flash_attention"] is False
        step = d["estimate"]["step_time_s"]
        if metric == "step_time_s":
            value = step
        else:
            m = model_from_config(run["model"])
            c = run["config"]
            value = gpt_full_recompute_flops_eq3(c["global_batch_size"], c["seq_len"], m.num_layers, m.hidden_size,
                                                 m.vocab_size) / step / c["num_gpus"] / 1e12
        errors.append(abs(value - run["measured"]["value"]) / run["measured"]["value"])
    assert statistics.mean(errors) <= mean_max and max(errors) <= max_max


def test_estimate_takes_the_stack_options_and_flags_override_them():
    base = ["estimate", "--model", "llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "64", "--tp", "8",
            "--global-batch", "64", "--seq-len", "4096", "--json"]
    core = json.loads(runner.invoke(app, base).stdout)
    assert core["stack"] == "megatron-core"
    assert core["options"]["tp_comm_overlap"] and core["options"]["grad_reduce_bytes"] == 4
    off = json.loads(runner.invoke(app, base + ["--no-tp-comm-overlap", "--grad-reduce-dtype", "bf16"]).stdout)
    assert not off["options"]["tp_comm_overlap"] and off["options"]["grad_reduce_bytes"] == 2
    assert off["estimate"]["step_time_s"] > core["estimate"]["step_time_s"] * 0.99
    titan = json.loads(runner.invoke(app, base + ["--stack", "torchtitan"]).stdout)
    assert not titan["options"]["tp_comm_overlap"]


def test_the_default_plan_is_one_its_stack_launches():
    args = ["plan", "--model", "llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "64", "--global-batch", "64",
            "--seq-len", "4096", "--top", "2", "--json"]
    d = json.loads(runner.invoke(app, args).stdout)
    assert d["stack"] == "megatron-core"
    for p in [d] + d["alternatives"]:
        assert p["schedule"] in load_stack("megatron-core").schedules
        assert p["options"]["grad_reduce_bytes"] == 4
    megatron.arguments(d)  # not refused
    titan = json.loads(runner.invoke(app, args + ["--stack", "torchtitan"]).stdout)
    assert titan["stack"] == "torchtitan" and titan["schedule"] in load_stack("torchtitan").schedules
    torchtitan.sections(titan)
    anything = json.loads(runner.invoke(app, args + ["--stack", "any"]).stdout)
    assert anything["estimate"]["step_time_s"] <= d["estimate"]["step_time_s"] + 1e-9


def test_emit_implies_the_launchers_stack(tmp_path):
    out = tmp_path / "job.toml"
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16",
                            "--global-batch", "32", "--seq-len", "4096", "--emit", "torchtitan", "--out", str(out),
                            "--json", "--top", "0"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["stack"] == "torchtitan" and out.exists()


def test_a_bad_stack_file_is_one_line_naming_the_field(tmp_path):
    bad = json.loads((stacks_dir() / "megatron-core.json").read_text())
    bad["options"]["grad_reduce_dtype"] = "fp64"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    r = runner.invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "8", "--stack", str(path)])
    assert r.exit_code == 2 and "options.grad_reduce_dtype" in r.stderr and "Traceback" not in r.output
    bad["options"]["grad_reduce_dtype"] = "fp32"
    bad["runs"]["schedules"] = ["1f1b", "pipedream-2bw"]
    path.write_text(json.dumps(bad))
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "8", "--stack", str(path)])
    assert r.exit_code == 2 and "runs.schedules" in r.stderr
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "8", "--stack", "megatron-2077"])
    assert r.exit_code == 2 and "--stack" in r.stderr


def test_stack_spaces_narrow_the_launchers_spaces():
    spaces = stack_spaces(load_stack("megatron-2021"))
    assert all(s.max_cp == 1 and s.flash_attention == (False,) and s.tp_comm_overlap == (False,) for s in spaces)
    assert all(set(s.schedules) <= {"1f1b", "interleaved-1f1b"} and set(s.zero_stages) <= {0, 1} for s in spaces)


@pytest.mark.parametrize("command", [
    ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "8"],
    ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "8"],
    ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "8"],
])
def test_an_empty_stack_is_refused_alike_by_every_command(command):
    r = CliRunner().invoke(app, command + ["--stack", ""])
    assert r.exit_code == 2 and "--stack: empty stack name" in r.output


def test_torchtitan_spaces_hold_only_recompute_counts_it_checkpoints():
    """torchtitan checkpoints every N-th layer (selective_ac_option = N): a partial count k per chunk runs only where
    k divides equal chunks. Llama-3.1-70B with ZeRO-3 on 1024 H100 once chose full recomputation of 14 of 80
    layers, which torchtitan cannot run, and `plan --stack torchtitan` was refused."""
    import numpy as np

    from planner.search.space import REC_FULL_K, build_space, recompute_k
    from planner.specs.hardware import load_cluster
    from planner.specs.model import load_model

    model, cluster = load_model("llama-3.1-70b"), load_cluster("h100-80gb-sxm")
    for space in stack_spaces(load_stack("torchtitan")):
        sp = build_space(model, cluster, 64, 64, 4096, space)
        rows = sp.expand(np.arange(len(sp.groups)))
        part = rows.rec >= REC_FULL_K
        chunk = sp.max_chunk()[rows.group[part]]
        k = recompute_k(rows.rec[part])
        assert part.any() and np.all(chunk % k == 0) and np.all(k < chunk)
        assert np.all(sp.equal_chunks()[rows.group[part]])
        # every divisor is there: a chunk of 40 layers (PP 2) has k = 1, 2, 4, 5, 8, 10, 20
        forty = np.flatnonzero((sp.max_chunk() == 40) & sp.equal_chunks())[0]
        one = sp.expand(np.array([forty]))
        assert sorted(set(recompute_k(one.rec[one.rec >= REC_FULL_K]).tolist())) == [1, 2, 4, 5, 8, 10, 20]
    args = ["plan", "--model", "llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "1024", "--global-batch",
            "1024", "--seq-len", "8192", "--zero", "3", "--stack", "torchtitan", "--json", "--top", "0"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    torchtitan.sections(json.loads(r.stdout))  # not refused


def test_a_stacks_spaces_hold_the_fixed_options_it_decides():
    """The options a stack decides and a search holds fixed (``STACK_FIXED_FIELDS``, a part of the run's
    ``FIXED_FIELDS``) reach every search space of the stack as one value, and a RunConfig the stack applies to."""
    from planner.export.spaces import stack_spaces
    from planner.specs.config import FIXED_FIELDS, RunConfig
    from planner.specs.stack import STACK_FIXED_FIELDS, load_stack, shipped_stacks

    assert set(STACK_FIXED_FIELDS) <= set(FIXED_FIELDS)
    for name in shipped_stacks():
        stack = load_stack(name)
        for space in stack_spaces(stack, None, "bf16"):
            assert {f: getattr(space.fixed, f) for f in STACK_FIXED_FIELDS} == stack.fixed_options(), name
        applied = stack.apply(RunConfig(num_gpus=8))
        assert {f: getattr(applied.fixed, f) for f in STACK_FIXED_FIELDS} == stack.fixed_options(), name


def test_gradients_are_held_in_the_reduction_dtype_where_the_stack_accumulates_them_so():
    """Megatron-Core's main_grad buffer has the reduction's dtype (param_and_grad_buffer.py: grad_dtype =
    torch.float if grad_reduce_in_fp32): 4 bytes per parameter with the default fp32 reduction, 2 with
    --grad-reduce-dtype bf16. torchtitan's FSDP2 keeps fp32 shards that are their own master weights: the ZeRO
    paper's 2 + 2 + 12 = 16 bytes per parameter whatever the reduction."""
    from planner.cost.memory import held_grad_bytes
    from planner.cost.step import estimate
    from planner.specs.config import RunConfig
    from planner.specs.hardware import load_cluster
    from planner.specs.model import load_model

    assert held_grad_bytes(4, True) == 4 and held_grad_bytes(2, True) == 2 and held_grad_bytes(4, False) == 2
    assert load_stack("megatron-core").grads_in_reduce_dtype and not load_stack("torchtitan").grads_in_reduce_dtype
    model, h100 = load_model("llama-3.1-8b"), load_cluster("h100-80gb-sxm")
    base = RunConfig(num_gpus=8, tp=8, seq_len=4096, global_batch_size=16, zero_stage=1)
    mem = {(b, g): estimate(model, h100, base.with_(grad_reduce_bytes=b, grads_in_reduce_dtype=g)).stages[0]
           .memory_bytes["gradients"] for b in (2, 4) for g in (True, False)}
    assert mem[(4, True)] == pytest.approx(2 * mem[(2, True)]) and mem[(4, False)] == mem[(2, True)] == mem[(2, False)]


def test_bf16_adam_moments_save_a_third_of_the_optimizer_states_and_only_megatron_core_runs_them():
    """Mixed-precision Adam keeps fp32 master weights and two moments: 4 + 2 x 4 = 12 bytes per parameter, 4 + 2 x 2 =
    8 with bf16 moments (Megatron-Core's precision-aware optimizer; the DeepSeek-V3 report, Sec. 3.3.2); the step's
    moment traffic halves (42 -> 34 bytes per parameter). Only the stacks whose runs list it take --adam-moments
    bf16; estimate and plan refuse it elsewhere in one line naming the option."""
    from planner.cost.data_parallel import optimizer_step_s
    from planner.cost.memory import optimizer_state_bytes
    from planner.cost.step import estimate
    from planner.specs.config import RunConfig
    from planner.specs.hardware import load_cluster
    from planner.specs.model import load_model

    assert optimizer_state_bytes(4) == 12 and optimizer_state_bytes(2) == 8
    h100 = load_cluster("h100-80gb-sxm")
    assert optimizer_step_s(1e9, h100.gpu, 2) / optimizer_step_s(1e9, h100.gpu, 4) == pytest.approx(34 / 42)
    model = load_model("llama-3.1-8b")
    cfg = RunConfig(num_gpus=8, seq_len=4096, global_batch_size=16, zero_stage=1)
    fp32, bf16 = (estimate(model, h100, cfg.with_(adam_moment_bytes=b)) for b in (4, 2))
    assert fp32.stages[0].memory_bytes["optimizer"] == pytest.approx(1.5 * bf16.stages[0].memory_bytes["optimizer"])
    assert load_stack("megatron-core").adam_moments == ("fp32", "bf16") and load_stack("torchtitan").adam_moments == \
        ("fp32",)
    base = ["--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "16",
            "--seq-len", "4096"]
    for command in ("estimate", "plan"):
        r = runner.invoke(app, [command, *base, "--stack", "torchtitan", "--adam-moments", "bf16"])
        assert r.exit_code == 2 and "--adam-moments" in r.output and "torchtitan" in r.output
        bad = runner.invoke(app, [command, *base, "--adam-moments", "fp16"])
        assert bad.exit_code == 2 and "--adam-moments" in bad.output
    r = runner.invoke(app, ["plan", *base, "--adam-moments", "bf16", "--json", "--top", "0"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["options"]["adam_moment_bytes"] == 2
    assert d["parallelism"]["zero_stage"] >= 1  # the precision-aware optimizer needs the distributed optimizer


def test_estimate_warns_when_the_stack_cannot_launch_the_layout():
    """`planner estimate` prices any layout the cost model knows, and says (stderr, and under --json in
    ``warnings``) when the stack named cannot launch it (export.stack_layout_problem: its schedules, its ZeRO stages
    with pipeline stages, its CP kinds, as its launcher runs them); the estimate itself is the same. Megatron-Core has
    no zero-bubble H2 schedule and no ZeRO-3 with pipeline stages (Megatron FSDP takes none); torchtitan runs FSDP
    under pipeline stages; DeepSpeed's CP is Ulysses only."""
    from planner.export.spaces import stack_layout_problem
    from planner.specs.config import RunConfig

    base = ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16", "--global-batch",
            "64", "--seq-len", "4096", "--json"]
    cases = {("--pp", "2", "--schedule", "zb-h2"): "the zb-h2 schedule",
             ("--pp", "2", "--zero", "3"): "ZeRO-3 with pipeline parallelism (pp=2)",
             ("--pp", "2", "--zero", "3", "--stack", "torchtitan"): None,
             ("--pp", "2"): None,
             ("--cp", "2", "--stack", "deepspeed", "--cp-kind", "ring"): "ring context parallelism",
             ("--cp", "2", "--stack", "deepspeed", "--cp-kind", "ulysses"): None}
    for extra, what in cases.items():
        r = runner.invoke(app, base + list(extra))
        assert r.exit_code == 0, r.output
        notes = [n for n in json.loads(r.stdout).get("warnings", []) if "does not run" in n]
        assert (notes == []) if what is None else (len(notes) == 1 and what in notes[0] and "--stack" in notes[0]), \
            (extra, notes)
    warned = json.loads(runner.invoke(app, base + ["--pp", "2", "--schedule", "zb-h2"]).stdout)
    assert warned["estimate"]["step_time_s"] > 0 and warned["schedule"] == "zb-h2"  # priced as asked
    # every published row runs on its stack but DeepSeek's own DualPipe, which the row prices with Megatron-Core's
    from planner.validation.compare import load_modern_runs, modern_config, row_stack
    flagged = {r["id"] for r in load_modern_runs() if stack_layout_problem(load_stack(row_stack(r)), modern_config(r))}
    assert flagged == {"DSV3-report-H800"}
    assert stack_layout_problem(load_stack("megatron-core"), RunConfig(num_gpus=8, pp=2, zero_stage=1)) is None
