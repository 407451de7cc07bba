"""Bad input through the command line: every case exits with the documented code (2 usage, 1 infeasible), names the
file or option and the field, says what would be valid, and never shows a Python traceback.

Each case is (command line, expected exit code, fragments the error output must contain). ``{name}`` in a command
line is replaced by the path of a fixture file of that name (written below); ``{name}`` in a fragment likewise, so
the check "the message names the file" is literal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.specs.hardware import hardware_profiles_dir
from planner.specs.model import model_specs_dir

L8B = json.loads((model_specs_dir() / "llama-3.1-8b.json").read_text())
H100 = json.loads((hardware_profiles_dir() / "h100-80gb-sxm.json").read_text())
EST = ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm"]


def _with(doc: dict, path: str, value) -> dict:
    """A copy of ``doc`` with the field at dotted ``path`` set to ``value`` (deleted when value is ``...``)."""
    doc = json.loads(json.dumps(doc))
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node[p]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


#: fixture files: name -> text
FILES: dict[str, str] = {
    "truncated.json": json.dumps(L8B)[:57],
    "list.json": "[1, 2, 3]",
    "unknown_type.json": json.dumps(_with(L8B, "model_type", "mamba")),
    "negative_hidden.json": json.dumps(_with(L8B, "hidden_size", -4096)),
    "zero_layers.json": json.dumps(_with(L8B, "num_hidden_layers", 0)),
    "no_vocab.json": json.dumps(_with(L8B, "vocab_size", ...)),
    "string_heads.json": json.dumps(_with(L8B, "num_attention_heads", "32")),
    "kv_heads.json": json.dumps(_with(L8B, "num_key_value_heads", 5)),
    "hidden_heads.json": json.dumps(_with(_with(L8B, "hidden_size", 4000), "num_attention_heads", 48)),
    "nan_hidden.json": json.dumps(_with(L8B, "hidden_size", math.nan)),
    "huge_vocab.json": json.dumps(_with(L8B, "vocab_size", 10**30)),
    "float_layers.json": json.dumps(_with(L8B, "num_hidden_layers", 31.5)),
    "profile_truncated.json": json.dumps(H100)[:100],
    "profile_no_hbm.json": json.dumps(_with(H100, "gpu.hbm_gib", ...)),
    "profile_neg_bw.json": json.dumps(_with(H100, "inter_node.bandwidth_gb_s", -50)),
    "profile_eff.json": json.dumps(_with(H100, "node.intra_node.efficiency", 1.5)),
    "profile_gpn.json": json.dumps(_with(H100, "node.gpus_per_node", 0)),
    "profile_curve.json": json.dumps(_with(H100, "gpu.matmul_efficiency.points", [[10, 0.5], [1, 0.4]])),
    "profile_max16.json": json.dumps(_with(H100, "max_gpus", 16)),
    "profile_string_tflops.json": json.dumps(_with(H100, "gpu.peak_bf16_tflops", "989")),
}

CASES: list[tuple[str, list[str], int, list[str]]] = [
    # ---- model spec / config.json -----------------------------------------------------------------------------
    ("missing model file", ["estimate", "--model", "{dir}/nope/config.json", "--cluster", "h100-80gb-sxm", "--gpus",
                            "8", "--global-batch", "64"], 2, ["{dir}/nope/config.json", "file not found"]),
    ("truncated config.json", ["estimate", "--model", "{truncated.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                               "--global-batch", "64"], 2, ["{truncated.json}", "invalid JSON", "line 1 column"]),
    ("config.json not an object", ["estimate", "--model", "{list.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                                   "--global-batch", "64"], 2, ["{list.json}", "JSON object"]),
    ("unknown model_type", ["estimate", "--model", "{unknown_type.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "64"], 2, ["{unknown_type.json}", "model_type", "'mamba'", "llama"]),
    ("negative hidden_size", ["estimate", "--model", "{negative_hidden.json}", "--cluster", "h100-80gb-sxm", "--gpus",
                              "8", "--global-batch", "64"], 2, ["{negative_hidden.json}", "hidden_size", ">= 1"]),
    ("zero layers", ["estimate", "--model", "{zero_layers.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                     "--global-batch", "64"], 2, ["{zero_layers.json}", "num_hidden_layers", ">= 1"]),
    ("missing vocab_size", ["estimate", "--model", "{no_vocab.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "64"], 2, ["{no_vocab.json}", "vocab_size", "missing"]),
    ("heads as a string", ["estimate", "--model", "{string_heads.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                           "--global-batch", "64"], 2, ["{string_heads.json}", "num_attention_heads", "integer"]),
    ("heads not divisible by KV heads", ["estimate", "--model", "{kv_heads.json}", "--cluster", "h100-80gb-sxm",
                                         "--gpus", "8", "--global-batch", "64"],
     2, ["{kv_heads.json}", "num_key_value_heads", "32", "5"]),
    ("hidden not divisible by heads", ["estimate", "--model", "{hidden_heads.json}", "--cluster", "h100-80gb-sxm",
                                       "--gpus", "8", "--global-batch", "64"],
     2, ["{hidden_heads.json}", "num_attention_heads", "4000", "head_dim"]),
    ("NaN hidden_size", ["estimate", "--model", "{nan_hidden.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                         "--global-batch", "64"], 2, ["{nan_hidden.json}", "hidden_size", "integer", "nan"]),
    ("absurd vocab_size", ["estimate", "--model", "{huge_vocab.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                           "--global-batch", "64"], 2, ["{huge_vocab.json}", "vocab_size", "<="]),
    ("fractional layers", ["estimate", "--model", "{float_layers.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                           "--global-batch", "64"], 2, ["{float_layers.json}", "num_hidden_layers", "31.5"]),
    ("unknown model name", ["estimate", "--model", "llama-9b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                            "--global-batch", "64"], 2, ["--model", "'llama-9b'", "llama-3.1-8b"]),
    ("model path is a directory", ["estimate", "--model", "{dir}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                                   "--global-batch", "64"], 2, ["{dir}", "directory"]),
    # ---- hardware profile ---------------------------------------------------------------------------------------
    ("unknown cluster name", ["estimate", "--model", "llama-3.1-8b", "--cluster", "h999", "--gpus", "8",
                              "--global-batch", "64"], 2, ["--cluster", "'h999'", "h100-80gb-sxm"]),
    ("missing profile file", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{dir}/gone.json", "--gpus", "8",
                              "--global-batch", "64"], 2, ["{dir}/gone.json", "file not found"]),
    ("truncated profile", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{profile_truncated.json}", "--gpus",
                           "8", "--global-batch", "64"], 2, ["{profile_truncated.json}", "invalid JSON"]),
    ("profile without HBM size", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{profile_no_hbm.json}",
                                  "--gpus", "8", "--global-batch", "64"],
     2, ["{profile_no_hbm.json}", "gpu.hbm_gib", "missing"]),
    ("negative bandwidth", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{profile_neg_bw.json}", "--gpus",
                            "8", "--global-batch", "64"],
     2, ["{profile_neg_bw.json}", "inter_node.bandwidth_gb_s", "> 0"]),
    ("efficiency above 1", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{profile_eff.json}", "--gpus", "8",
                            "--global-batch", "64"], 2, ["{profile_eff.json}", "node.intra_node.efficiency", "<= 1"]),
    ("zero GPUs per node", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{profile_gpn.json}", "--gpus", "8",
                            "--global-batch", "64"], 2, ["{profile_gpn.json}", "node.gpus_per_node", "positive"]),
    ("unsorted efficiency curve", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{profile_curve.json}",
                                   "--gpus", "8", "--global-batch", "64"],
     2, ["{profile_curve.json}", "gpu.matmul_efficiency.points", "sorted"]),
    ("TFLOP/s as a string", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{profile_string_tflops.json}",
                             "--gpus", "8", "--global-batch", "64"],
     2, ["{profile_string_tflops.json}", "gpu.peak_bf16_tflops", "number"]),
    ("more GPUs than the cluster has", ["estimate", "--model", "llama-3.1-8b", "--cluster", "{profile_max16.json}",
                                        "--gpus", "32", "--global-batch", "64"], 2, ["--gpus", "at most 16"]),
    # ---- sizes ---------------------------------------------------------------------------------------------------
    ("zero GPUs", EST + ["--gpus", "0", "--global-batch", "64"], 2, ["--gpus", ">= 1", "0"]),
    ("negative GPUs", EST + ["--gpus", "-8", "--global-batch", "64"], 2, ["--gpus", ">= 1", "-8"]),
    ("zero global batch", EST + ["--gpus", "8", "--global-batch", "0"], 2, ["--global-batch", ">= 1"]),
    ("zero micro-batch", EST + ["--gpus", "8", "--global-batch", "64", "--micro-batch", "0"],
     2, ["--micro-batch", ">= 1"]),
    ("negative sequence length", EST + ["--gpus", "8", "--global-batch", "64", "--seq-len", "-2048"],
     2, ["--seq-len", ">= 1"]),
    ("zero TP", EST + ["--gpus", "8", "--global-batch", "64", "--tp", "0"], 2, ["--tp", ">= 1"]),
    ("GPUs not a number", EST + ["--gpus", "eight", "--global-batch", "64"], 2, ["--gpus", "integer"]),
    ("missing --gpus", EST + ["--global-batch", "64"], 2, ["--gpus", "Missing"]),
    ("unknown option", EST + ["--gpus", "8", "--global-batch", "64", "--tpp", "2"], 2, ["--tpp"]),
    # ---- validity rules ------------------------------------------------------------------------------------------
    ("heads not divisible by TP", EST + ["--gpus", "24", "--tp", "3", "--global-batch", "64"],
     2, ["--tp", "32 attention heads", "tp=3", "use tp in {1, 2, 4, 8}"]),
    ("TP larger than a node", EST + ["--gpus", "16", "--tp", "16", "--global-batch", "64"],
     2, ["--tp", "larger than a node", "tp <= 8"]),
    ("GPUs not divisible by the degrees", EST + ["--gpus", "12", "--tp", "8", "--global-batch", "64"],
     2, ["--gpus", "12", "tp*pp*cp = 8", "multiple of 8"]),
    ("global batch not divisible by DP x micro", EST + ["--gpus", "8", "--global-batch", "60", "--micro-batch", "4"],
     2, ["--global-batch", "60", "dp*micro_batch = 8*4", "multiple of 32 (e.g. 32 or 64)"]),
    ("more stages than layers", EST + ["--gpus", "64", "--pp", "64", "--global-batch", "64"],
     2, ["--pp", "32 layers", "64 stages", "pp*vpp <= 32"]),
    ("unknown schedule", EST + ["--gpus", "8", "--global-batch", "64", "--schedule", "zb"],
     2, ["--schedule", "'zb'", "1f1b", "interleaved-1f1b"]),
    ("virtual stages with plain 1F1B", EST + ["--gpus", "16", "--pp", "2", "--vpp", "2", "--global-batch", "64"],
     2, ["--schedule", "vpp"]),
    ("interleaved micro-batches not a multiple of PP", EST + ["--gpus", "8", "--pp", "4", "--vpp", "2", "--schedule",
                                                              "interleaved-1f1b", "--global-batch", "6"],
     2, ["--schedule", "multiple of pp"]),
    ("unknown recompute mode", EST + ["--gpus", "8", "--global-batch", "64", "--recompute", "some"],
     2, ["--recompute", "'some'", "selective"]),
    ("unknown ZeRO stage", EST + ["--gpus", "8", "--global-batch", "64", "--zero", "4"], 2, ["--zero", "0, 1, 2 or 3"]),
    ("CP does not split the sequence", EST + ["--gpus", "24", "--cp", "3", "--global-batch", "64", "--seq-len",
                                              "4096"], 2, ["--cp", "4096", "2*cp = 6"]),
    ("Ulysses heads not divisible", EST + ["--gpus", "64", "--cp", "64", "--cp-kind", "ulysses", "--global-batch",
                                           "1", "--seq-len", "262144"], 2, ["--cp", "Ulysses", "32"]),
    ("unknown CP kind", EST + ["--gpus", "8", "--global-batch", "64", "--cp-kind", "star"],
     2, ["--cp-kind", "'star'", "ring"]),
    ("expert parallelism on a dense model", EST + ["--gpus", "64", "--ep", "8", "--global-batch", "64"],
     2, ["--ep", "mixture-of-experts"]),
    # ---- other commands ------------------------------------------------------------------------------------------
    ("list: unknown kind", ["list", "gpus"], 2, ["'gpus'", "models", "clusters", "schedules"]),
    ("export: missing plan file", ["export", "{dir}/missing-plan.json", "--to", "megatron"],
     2, ["{dir}/missing-plan.json", "file not found"]),
    ("export: truncated plan", ["export", "{truncated.json}", "--to", "megatron"], 2, ["{truncated.json}", "JSON"]),
    ("export: unknown launcher", ["export", "{plan.json}", "--to", "slurm"], 2, ["--to", "'slurm'", "megatron"]),
    ("export: not a plan", ["export", "{no_parallelism.json}", "--to", "torchtitan"],
     2, ["{no_parallelism.json}", "parallelism"]),
    ("export: JSON array", ["export", "{list.json}", "--to", "deepspeed"], 2, ["{list.json}", "object"]),
    ("export: unwritable --out", ["export", "{plan.json}", "--to", "megatron", "--out", "{dir}/no/such/dir/x.sh"],
     2, ["{dir}/no/such/dir/x.sh", "--out"]),
    ("explain: missing plan file", ["explain", "{dir}/nothing.json"], 2, ["{dir}/nothing.json", "file not found"]),
    ("explain: not a plan", ["explain", "{no_parallelism.json}"], 2, ["{no_parallelism.json}", "parallelism"]),
    ("export: hand-edited inconsistent plan", ["export", "{inconsistent.json}", "--to", "nemo"],
     2, ["{inconsistent.json}", "parallelism", "num_gpus = 16"]),
    ("explain: hand-edited inconsistent plan", ["explain", "{inconsistent.json}"],
     2, ["{inconsistent.json}", "parallelism", "num_gpus = 16"]),
    ("explain: zero width", ["explain", "{plan.json}", "--width", "0"], 2, ["--width", ">= 1"]),
    ("sweep: GPU list with a typo", ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus",
                                     "8,abc", "--global-batch", "64"], 2, ["--gpus", "'abc'"]),
    ("sweep: zero global batch", ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                                  "--global-batch", "0"], 2, ["--global-batch", ">= 1"]),
    ("sweep: negative top-k", ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                               "--global-batch", "64", "--top-k", "-1"], 2, ["--top-k", "must be >=", "got -1"]),
    ("sweep: zero jobs", ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                          "--global-batch", "64", "--jobs", "0"], 2, ["--jobs", ">= 1"]),
    ("sweep: no model", ["sweep", "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "64"],
     2, ["--model"]),
    ("sweep: unknown model", ["sweep", "--model", "nomodel", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                              "--global-batch", "64", "--jobs", "1"], 2, ["--model", "'nomodel'"]),
]

#: ``plan`` (the search): run only once the command is registered
PLAN = ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm"]
PLAN_CASES: list[tuple[str, list[str], int, list[str]]] = [
    ("plan: zero GPUs", PLAN + ["--gpus", "0", "--global-batch", "64"], 2, ["--gpus", ">= 1"]),
    ("plan: zero global batch", PLAN + ["--gpus", "8", "--global-batch", "0"], 2, ["--global-batch", ">= 1"]),
    ("plan: negative sequence length", PLAN + ["--gpus", "8", "--global-batch", "64", "--seq-len", "-1"],
     2, ["--seq-len", ">= 1"]),
    ("plan: unknown model", ["plan", "--model", "gpt-5", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                             "--global-batch", "64"], 2, ["--model", "'gpt-5'"]),
    ("plan: unknown cluster", ["plan", "--model", "llama-3.1-8b", "--cluster", "tpu-v5", "--gpus", "8",
                               "--global-batch", "64"], 2, ["--cluster", "'tpu-v5'"]),
    ("plan: truncated config.json", ["plan", "--model", "{truncated.json}", "--cluster", "h100-80gb-sxm", "--gpus",
                                     "8", "--global-batch", "64"], 2, ["{truncated.json}", "invalid JSON"]),
    ("plan: model fits on no plan", ["plan", "--model", "llama-3.1-405b", "--cluster", "h100-80gb-sxm", "--gpus",
                                     "8", "--global-batch", "64"], 1, ["llama-3.1-405b", "needs at least", "GiB", "--gpus"]),
    ("plan: sequence beyond any plan", PLAN + ["--gpus", "8", "--global-batch", "8", "--seq-len", str(2**24)],
     1, ["--seq-len"]),
    ("plan: unknown objective", PLAN + ["--gpus", "8", "--global-batch", "64", "--objective", "cost"],
     2, ["--objective", "'cost'", "time", "memory"]),
    ("plan: negative --top", PLAN + ["--gpus", "8", "--global-batch", "64", "--top", "-1"], 2, ["--top", ">= 0"]),
    ("plan: zero memory cap", PLAN + ["--gpus", "8", "--global-batch", "64", "--max-memory-gib", "0"],
     2, ["--max-memory-gib", "> 0"]),
    ("plan: NaN memory cap", PLAN + ["--gpus", "8", "--global-batch", "64", "--max-memory-gib", "nan"],
     2, ["--max-memory-gib", "> 0"]),
    ("plan: memory cap nothing fits under", PLAN + ["--gpus", "8", "--global-batch", "64", "--max-memory-gib", "0.5"],
     1, ["0.5 GiB per GPU", "needs at least", "--max-memory-gib"]),
    ("plan: --out without --emit", PLAN + ["--gpus", "8", "--global-batch", "64", "--out", "{dir}/x.sh"],
     2, ["--out", "--emit"]),
    ("plan: unknown launcher", PLAN + ["--gpus", "8", "--global-batch", "64", "--emit", "slurm"],
     2, ["--emit", "'slurm'", "megatron"]),
    ("plan: --emit and --json both on stdout", PLAN + ["--gpus", "8", "--global-batch", "64", "--emit", "megatron",
                                                      "--json"], 2, ["--emit", "--out"]),
    ("plan: unwritable --out", PLAN + ["--gpus", "8", "--global-batch", "64", "--emit", "megatron", "--out",
                                       "{dir}/no/such/dir/x.sh"], 2, ["{dir}/no/such/dir/x.sh"]),
    ("plan: more GPUs than the batch has sequences", PLAN + ["--gpus", "100000", "--global-batch", "64"],
     1, ["100000 GPUs", "global batch 64", "not divisible"]),
    ("plan: MoE far too big for its GPUs", ["plan", "--model", "mixtral-8x7b", "--cluster", "a100-80gb-sxm", "--gpus",
                                            "2", "--global-batch", "2"], 1, ["mixtral-8x7b", "needs at least",
                                                                             "--gpus 16"]),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("bad-inputs")
    paths = {"dir": str(d)}
    for name, text in FILES.items():
        (d / name).write_text(text)
        paths[name] = str(d / name)
    r = CliRunner().invoke(app, EST + ["--gpus", "8", "--global-batch", "64", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    (d / "plan.json").write_text(r.stdout)
    paths["plan.json"] = str(d / "plan.json")
    (d / "no_parallelism.json").write_text(json.dumps({k: v for k, v in plan.items() if k != "parallelism"}))
    paths["no_parallelism.json"] = str(d / "no_parallelism.json")
    (d / "inconsistent.json").write_text(json.dumps(dict(plan, num_gpus=16)))  # edited by hand: dp still 8
    paths["inconsistent.json"] = str(d / "inconsistent.json")
    return paths


def _fill(s: str, files: dict[str, str]) -> str:
    for name, path in files.items():
        s = s.replace("{" + name + "}", path)
    return s


def _run(args: list[str], files: dict[str, str]):
    return CliRunner().invoke(app, [_fill(a, files) for a in args])


def _check(result, code: int, fragments: list[str], files: dict[str, str]) -> None:
    out = result.output  # stdout and stderr together
    assert "Traceback" not in out and "internal error" not in out, out
    # an exception that escaped the command would be kept by the runner instead of being turned into an exit code
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == code, f"exit {result.exit_code}, expected {code}: {out}"
    err = result.stderr
    assert err.strip(), "no error message on stderr"
    ours = [line for line in err.splitlines() if line.startswith("error: ")]
    if ours:  # the planner's own errors: one line holds the whole message (click's usage errors use a box)
        assert len(ours) == 1, err
        err = ours[0]
    for frag in fragments:
        assert _fill(frag, files) in err, f"{_fill(frag, files)!r} not in: {err}"


def test_enough_cases() -> None:
    """Acceptance: at least 20 bad-input cases through the CLI runner (the plan cases come on top)."""
    assert len(CASES) >= 20
    assert len({name for name, *_ in CASES + PLAN_CASES}) == len(CASES) + len(PLAN_CASES)


@pytest.mark.parametrize("name,args,code,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_input(files: dict[str, str], name: str, args: list[str], code: int, fragments: list[str]) -> None:
    _check(_run(args, files), code, fragments, files)


@pytest.mark.parametrize("name,args,code,fragments", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_bad_input_plan(files: dict[str, str], name: str, args: list[str], code: int, fragments: list[str]) -> None:
    _check(_run(args, files), code, fragments, files)


def test_error_message_is_one_line_with_file_and_field(files: dict[str, str]) -> None:
    r = _run(["estimate", "--model", "{negative_hidden.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
              "--global-batch", "64"], files)
    assert r.stderr == f"error: {files['negative_hidden.json']}: hidden_size: must be >= 1, got -4096\n"
    assert r.stdout == ""


def test_debug_shows_the_traceback(files: dict[str, str]) -> None:
    """``--debug`` is the one way to see a traceback (which also shows the checks above can fail)."""
    r = _run(["--debug", "estimate", "--model", "{truncated.json}", "--cluster", "h100-80gb-sxm", "--gpus", "8",
              "--global-batch", "64"], files)
    assert r.exit_code == 2
    assert "Traceback" in r.stderr and "invalid JSON" in r.stderr


def test_valid_input_still_works(files: dict[str, str]) -> None:
    """The fixtures are bad only where intended: the unmodified files run."""
    for name, doc in (("ok_model.json", L8B), ("ok_profile.json", H100)):
        Path(files["dir"], name).write_text(json.dumps(doc))
    r = _run(["estimate", "--model", "{dir}/ok_model.json", "--cluster", "{dir}/ok_profile.json", "--gpus", "8",
              "--global-batch", "64"], files)
    assert r.exit_code == 0, r.output


def test_hugging_face_model_directory_is_read(files: dict[str, str]) -> None:
    """A model directory with a config.json (how HF checkpoints come) is read; one without it is a clear error."""
    hf = Path(files["dir"], "hf-model")
    hf.mkdir(exist_ok=True)
    (hf / "config.json").write_text(json.dumps({k: v for k, v in L8B.items() if k != "name"}))
    r = _run(["estimate", "--model", str(hf), "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch", "64",
              "--json"], files)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"] == "hf-model"
    empty = Path(files["dir"], "empty-model")
    empty.mkdir(exist_ok=True)
    _check(_run(["estimate", "--model", str(empty), "--cluster", "h100-80gb-sxm", "--gpus", "8", "--global-batch",
                 "64"], files), 2, [str(empty), "directory"], files)


@pytest.mark.parametrize("extra,needle", [
    (["--objective", "cost"], "--objective"),
    (["--max-memory-gib", "-1"], "--max-memory-gib"),
])
def test_sweep_rejects_bad_search_options_before_running(extra, needle):
    r = CliRunner().invoke(app, ["sweep", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "8",
                                 "--global-batch", "64", *extra])
    assert r.exit_code == 2
    assert needle in r.stderr and "Traceback" not in r.output


def test_export_and_explain_refuse_a_plan_file_that_breaks_a_rule(tmp_path):
    r = CliRunner().invoke(app, ["estimate", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "24",
                                 "--tp", "8", "--global-batch", "24", "--json"])
    d = json.loads(r.stdout)
    d["parallelism"].update(tp=3, dp=8)
    d["batch"]["num_microbatches"] = 3  # consistent arithmetic, but 32 heads do not split over tp 3
    f = tmp_path / "edited.json"
    f.write_text(json.dumps(d))
    for args in (["export", str(f), "--to", "megatron"], ["explain", str(f)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, args
        assert "parallelism.tp" in r.stderr and str(f) in r.stderr and "Traceback" not in r.output


def test_plan_with_no_layout_dividing_the_batch_suggests_a_gpu_count_that_works():
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "100000",
                                 "--global-batch", "64"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    suggested = int(r.stderr.split("use --gpus ")[1].split(",")[0])
    assert suggested != 100000
    ok = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus",
                                  str(suggested), "--global-batch", "64", "--json"])
    assert ok.exit_code == 0, ok.output


def test_plan_with_a_huge_batch_no_layout_divides_answers_at_once():
    """The suggestion for a batch no layout divides lists the batch's divisors in O(sqrt(batch)), not by trying
    every integer up to it (a 9-digit batch took minutes)."""
    import time

    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "4096",
                                 "--global-batch", "100000007", "--seq-len", "2050"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "use --gpus 256" in r.stderr
    assert time.perf_counter() - t0 < 5.0


@pytest.mark.parametrize("field,value", [("experts_per_token", 0), ("first_k_dense_layers", 1000),
                                         ("kv_lora_rank", 64)])
def test_export_and_explain_refuse_a_plan_whose_model_spec_a_config_json_could_not_give(tmp_path, field, value):
    """A plan's model_spec passes the same cross-field checks as a config.json (validate_model): an MoE model
    without routed experts per token, more dense layers than layers, MLA without its head sizes."""
    r = CliRunner().invoke(app, ["estimate", "--model", "mixtral-8x7b", "--cluster", "h100-80gb-sxm", "--gpus", "16",
                                 "--tp", "2", "--ep", "8", "--global-batch", "64", "--seq-len", "4096", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    d["model_spec"][field] = value
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    for args in (["export", str(f), "--to", "megatron"], ["explain", str(f)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "model_spec" in r.stderr and str(f) in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize("option,value", [("--global-batch", str(10**20)), ("--gpus", str(10**20))])
def test_plan_refuses_sizes_no_run_has_instead_of_walking_their_divisors(option, value):
    """The search walks divisors of the GPU count and of the batch (O(sqrt n) each): a 20-digit value would run
    for hours; it is refused at once, like a config.json shape above int32."""
    import time

    args = {"--gpus": "8", "--global-batch": "64"}
    args[option] = value
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm",
                                 *(x for kv in args.items() for x in kv)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert option in r.stderr and "2147483647" in r.stderr
    assert time.perf_counter() - t0 < 5.0
