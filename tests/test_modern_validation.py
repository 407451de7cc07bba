"""The modern public validation set (issue 9): every row carries its source and quoted figures, is reproduced by
its own `planner estimate` command, and is scored per group by `planner validate`."""

from __future__ import annotations

import json
import shlex
import statistics

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.validation.compare import GROUPS, load_modern_runs, validate_modern

RUNS = load_modern_runs()
ROWS = {r.id: r for r in validate_modern()}
RUN_BY_ID = {r["id"]: r for r in RUNS}


def test_every_row_names_its_source_quote_and_assumptions():
    assert len(RUNS) >= 30
    for run in RUNS:
        assert run["source"] and run["quote"] and isinstance(run["assumed"], list), run["id"]
        assert run["measured_tokens_per_s_per_gpu"] > 0 and run["measured"]["value"] > 0
        assert run["layout"]["precision"] in ("bf16", "fp8", "mxfp8")
    # what the set covers: H100, H800, B200; bf16 and fp8; dense and MoE; 4K to 64K tokens
    assert {r["gpu"] for r in RUNS} >= {"H100", "H800", "B200"}
    assert {r["layout"]["seq_len"] for r in RUNS} >= {4096, 8192, 65536}


@pytest.mark.parametrize("run_id", sorted(ROWS))
def test_each_row_is_reproduced_by_its_printed_command(run_id):
    """`planner validate --show-commands` prints a command per row; through the CLI it gives the same tokens/s per
    GPU and peak memory as the validation (or, for a layout a validity rule refuses, that rule's one-line error)."""
    row = ROWS[run_id]
    args = shlex.split(row.command)[1:] + ["--json"]
    r = CliRunner().invoke(app, args)
    if row.estimated is None:
        assert r.exit_code == 2 and row.cannot_express.split(":", 1)[1].strip()[:30] in r.output
        return
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["estimate"]["tokens_per_s"] / d["num_gpus"] == pytest.approx(row.estimated, rel=1e-12)
    assert d["estimate"]["peak_memory_gib"] == pytest.approx(row.peak_memory_gib, rel=1e-9)


def test_validate_reports_every_group_and_the_rows_it_cannot_express():
    r = CliRunner().invoke(app, ["validate", "--set", "modern", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)["modern"]
    assert set(rep["groups"]) == set(GROUPS)
    assert rep["overall"]["rows"] + rep["cannot_express"] == len(RUNS)
    assert all(rep["groups"][g]["rows"] >= 1 for g in GROUPS)
    bad = CliRunner().invoke(app, ["validate", "--set", "newest"])
    assert bad.exit_code == 2 and "--set" in bad.output


def test_modern_accuracy_does_not_regress():
    """Where the model stands on current stacks (README, 'Accuracy'): a guard against regressions, not the target
    (issue 9 asks for 6% mean / 15% max; the MoE rows, fine-grained experts at small micro-batches above all, are
    far from it)."""
    scored = [r for r in ROWS.values() if r.estimated is not None]
    assert len(scored) == len(RUNS) >= 30
    # the dense rows of the releases the kernel tables describe (NeMo 24.03's held-out rows: their own test)
    dense = [abs(r.error) for r in scored if "MoE" not in r.groups and not RUN_BY_ID[r.id].get("held_out")]
    assert sum(dense) / len(dense) < 0.08 and max(dense) < 0.30
    dense_bf16 = [abs(r.error) for r in scored if "dense bf16" in r.groups]
    assert max(dense_bf16) < 0.30
    # the large Megatron-Core weak-scaling runs, where the 2021-22 A100 physics carries over
    assert abs(ROWS["MLM-WS-177B"].error) < 0.03 and abs(ROWS["MLM-WS-462B"].error) < 0.03


def test_the_weak_scaling_rows_held_out_of_the_shared_set():
    """The four rows of Megatron-LM's weak-scaling table (images/model_table.png, Megatron-Core r0.8.0, H100 bf16)
    that the shared reference leaves out, added as a check no fit takes: 16B (TP 4, 4 micro-batches), 70B, 119B and
    314B (TP 8 with PP 2, 4 and 8). Their throughput is the table's TFLOP/s through Megatron r0.8.0's FLOP count
    (its 16B row: 489.1 TFLOP/s = 4,820.2 tokens/s/GPU); the model is within 7% on each (2026-12-06)."""
    ids = ("MLM-WS-16B", "MLM-WS-70B", "MLM-WS-119B", "MLM-WS-314B")
    assert all(RUN_BY_ID[k]["held_out"] for k in ids)
    assert RUN_BY_ID["MLM-WS-16B"]["measured_tokens_per_s_per_gpu"] == pytest.approx(4820.2, abs=0.1)
    for k in ids:
        assert abs(ROWS[k].error) < 0.07, k
    # the small rows with four micro-batches stay the group's outliers, in opposite directions (README)
    assert ROWS["MLM-WS-1.7B"].error > 0.10 and ROWS["MLM-WS-32B"].error < -0.15


@pytest.mark.parametrize("profile,precision", [("h100-80gb-sxm", "fp8"), ("b200-180gb", "fp8"),
                                               ("b200-180gb", "mxfp8")])
def test_the_fitted_profile_values_are_what_the_fit_computes(profile, precision):
    """A fitted parameter is data with its rows: the profile's stored value and rows are the fit's output
    (``python -m planner.validation.fit --write``), and the leave-one-source-out check stays near the in-sample
    error where there is more than one source."""
    from planner.specs.hardware import hardware_profiles_dir
    from planner.validation.fit import fit

    stored = json.loads((hardware_profiles_dir() / f"{profile}.json").read_text())["gpu"][
        "low_precision_gemm_efficiency"][precision]
    f = fit(profile, precision)
    assert stored["value"] == f.value and stored["fitted_on"] == list(f.rows)
    assert 0.5 < f.value < 1.0  # fp8 kernels reach less of their (twice higher) peak than bf16's
    assert sum(abs(e) for e in f.in_sample) / len(f.in_sample) < 0.08 and max(abs(e) for e in f.in_sample) < 0.18
    left_out = [e for errs in f.loso.values() for e in errs]
    if left_out:
        assert sum(abs(e) for e in left_out) / len(left_out) < 0.10 and max(abs(e) for e in left_out) < 0.18


def test_fp8_group_after_the_fit():
    """Dense fp8 rows: those without context parallelism (the GEMM ratios' fitting rows, their B200 / GB200 checks
    and NeMo 24.03's 4K-16K rows) within 4% on average and 12% at most (the worst, Megatron-Bridge 26.02's GB200
    Llama 3 70B mxfp8 at +11%: that container ran each dense recipe 3-8% slower than 26.02.01 did, 2026-12-06, which
    one number per GPU and precision cannot follow). Megatron-Bridge 25.09's GB200 Llama 3.1 405B (TP 2 with
    Megatron FSDP over 64 GPUs of two NVL72 racks, 95 of its 126 layers' activations offloaded to the host) was the
    exception at +18%, then +10%, until the FSDP collectives across the two racks drew the 8.6 NICs' worth NCCL
    measures there rather than all 72 (coreweave/nccl-tests README.md; 2026-12-06, the session after Blackwell
    Ultra): +6.6%. With ring CP, the current releases' H100 rows' own residual (+6% to +17%), which no fitted number
    absorbs, and NeMo 25.04's B200 long-context rows (+7% at 32K to +13% at 1M tokens, attention from the table fitted
    on cuDNN 9.10's published speeds), below 20%; NeMo 24.03's CP rows (cuDNN 9.0, whose rate is fitted) within 3%."""
    dense = [r for r in ROWS.values() if r.estimated is not None and "fp8" in r.groups and "MoE" not in r.groups
             and not RUN_BY_ID[r.id].get("held_out")]
    plain = [abs(r.error) for r in dense if "context parallel" not in r.groups]
    ring = [abs(r.error) for r in dense if "context parallel" in r.groups]
    old_kernel = [abs(r.error) for r in dense if "context parallel" in r.groups and r.id.startswith("NeMo2403")]
    assert sum(plain) / len(plain) < 0.04 and max(plain) < 0.12
    assert 0.05 < ROWS["MB2509-GB200-Llama3.1-405B"].error < 0.08
    assert len(ring) == 21 and max(ring) < 0.20 and len(old_kernel) == 6 and max(old_kernel) < 0.03


def test_error_bands_are_the_validation_residuals_and_estimates_carry_theirs():
    """Issue 9, 'say how sure it is': the shipped bands are what the validation sets give now (regenerate with
    `python -m planner.validation.bands --write`), an estimate carries its cell's band or the nearest coarser one,
    and a plan says whether its runner-up is within it."""
    from planner.validation.bands import BANDS_FILE, band_for, compute_bands

    stored = json.loads(BANDS_FILE.read_text())
    assert stored["bands"] == compute_bands()["bands"]
    # a row a fitted value is chosen on enters its band at the value refit without its release (one-source fits:
    # without the row): the H100 fp8 MoE cell holds the 25.11 Qwen3-30B row at its left-out error (-17.7%, refit on
    # the 25.11 Qwen3-235B row alone; +53.6% while the 26.02 rows shared the release's fit, until 2026-12-08), not
    # its in-sample one (-0.7%)
    from planner.validation.fit import cross_validated_errors
    assert cross_validated_errors()["MB2511-H100-Qwen3-30B-fp8"] == pytest.approx(-0.177, abs=0.01)
    assert abs(ROWS["MB2511-H100-Qwen3-30B-fp8"].error) < 0.02
    moe = band_for("NVIDIA H100 80GB SXM5", "fp8", moe=True)
    cell = [i for b in stored["bands"] if (b["gpu"], b["precision"], b["kind"]) == ("H100 / H200 / H800", "fp8", "MoE")
            for i in b["rows"]]
    in_sample = statistics.mean(abs(ROWS[i].error) for i in cell)
    left_out = statistics.mean(abs(cross_validated_errors().get(i, ROWS[i].error)) for i in cell)
    assert moe.mean_abs_error == pytest.approx(left_out, abs=1e-3) and moe.mean_abs_error > in_sample + 0.01
    exact = band_for("NVIDIA H100 80GB SXM5", "fp8", moe=False)
    # 2 H200 rows, the 12 of torchtitan's Grand Teton H100s (h100-96gb-hbm2e) without CP and, since 2026-12-07, the
    # seven Nemotron-H 56B rows (a hybrid without experts)
    assert exact.exact and exact.rows == 33 and exact.label == "H100 / H200 / H800, fp8, dense"
    # the H100 fp8 dense rows with ring CP (6 of current releases, 6-16% optimistic, NeMo 24.03's six, and the six
    # of torchtitan's CP tables, 7-33%) have their own, wider band
    with_cp = band_for("NVIDIA H100 80GB SXM5", "fp8", moe=False, cp=True)
    assert with_cp.exact and with_cp.rows == 18 and with_cp.mean_abs_error > 2 * exact.mean_abs_error
    # one bf16 CP row on H100 (NeMo AutoModel's Llama 3.1 70B, FSDP2 with CP 2) is its cell; none with MoE and
    # CP: the family and precision's pooled band
    assert band_for("NVIDIA H100 80GB SXM5", "bf16", moe=False, cp=True).rows == 1
    # every published CP run is ring attention: an estimate with Ulysses CP gets the nearest band, marked not its kind
    ulysses = band_for("NVIDIA B200", "fp8", moe=False, cp=True, cp_kind="ulysses")
    assert not ulysses.exact and ulysses.label == "B200, fp8"
    assert not band_for("NVIDIA H100 80GB SXM5", "bf16", moe=True, cp=True).exact
    # no published vision-language run is in the set: such an estimate gets the nearest band, marked not its kind
    vlm = band_for("NVIDIA H100 80GB SXM5", "bf16", moe=False, vision=True)
    assert not vlm.exact and vlm.label == "H100 / H200 / H800, 16-bit"
    assert band_for("NVIDIA A100 80GB SXM4", "bf16", moe=False).mean_abs_error < 0.04
    coarse = band_for("NVIDIA H800", "bf16", moe=True)
    assert coarse.rows >= 1
    mi300 = band_for("AMD Instinct MI300X", "bf16", moe=False)
    assert not mi300.exact and mi300.label.startswith(("any GPU", "every"))
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--cluster", "h100-80gb-sxm", "--gpus", "16",
                                 "--global-batch", "64", "--seq-len", "8192", "--precision", "fp8", "--json"])
    assert r.exit_code == 0, r.output
    acc = json.loads(r.stdout)["accuracy"]
    # Llama's own 25 runs of the cell (the 26th is NeMo 24.07's GPT-3 175B; 12 are torchtitan's Grand Teton rows)
    assert acc["group"] == "H100 / H200 / H800, fp8, dense, llama runs" and acc["rows"] == 25
    assert isinstance(acc["runner_up_within_band"], bool)
    from planner.schema import validate_plan_json
    validate_plan_json(json.loads(r.stdout), "plan")


def test_published_layouts_fit_by_the_memory_model():
    """Every modern row ran, so the memory model should let it run, and it does. The last one to fit was
    DeepSeek-V3's report layout under DualPipe (two copies of each stage's weights and gradients, PP + 1
    stage-micro-batches in flight): 6% over with its gradients in fp32 and Adam moments in BF16 (Sec. 3.3.2), 0.8%
    over once the SwiGLU output is recomputed from its cached input (Sec. 3.3.3 item (2): moe_act), and within the
    limit at 90% once that cached input is kept in FP8 as the report keeps it (Megatron-Core's SwiGLU fp8 input
    store); its attention outputs in E5M6 (item (1)) are still counted in bf16. Its weights are bf16 alone
    (te_quantized_weights false: DeepSeek's framework names no fp8 weight copy).
    On GB200 (184 GiB, 180 usable: NVIDIA's MIG listings, hardware_profiles/gb200-nvl72.json) the Llama 3 70B preset,
    which offloads 40 layers' activations to the Grace CPU (cpu_offloading_num_layers=40, Megatron-Bridge @
    00b7660b, scripts/performance/configs/llama/llama3_workload_base_configs.py), peaks at 178 GiB: it did not
    fit while the profile read the datasheet's 186 GB as 173 GiB (322 GiB before offloading was modelled). The 405B
    fp8 layout (TP 4, PP 16, VPP 4) of 25.11 and 26.06 was 3% over while its weights were counted in bf16; with
    --fp8-param-gather Megatron-Core keeps them as fp8 tensors, 1 B on Blackwell (memory.held_linear_weight_bytes).
    One row is over, by 1.8%: NeMo AutoModel's DeepSeek-V3 on 256 H100 (PP 4, FSDP2 holding its weights across the
    step), since FSDP2 under torch.distributed.pipelining is priced holding its gradients unsharded in fp32 until
    the last micro-batch (memory.model_state_bytes, 2026-12-07: +21 GiB of dense gradients on its first stage, which
    also holds its experts' states whole, EP 64 leaving one expert-data-parallel rank): within the memory model's
    error, where without that rule a torchtitan plan under pipeline stages could be tens of GiB short.
    Pinned so a memory change that rejects more real runs shows."""
    rows = validate_modern()
    assert [r.id for r in rows if r.fits is False] == ["AM-H100-DeepSeekV3-256-FSDP2-PP4"]
    over = next(r for r in rows if r.fits is False)
    assert over.peak_memory_gib / over.memory_limit_gib < 1.02
    peak = {r.id: r.peak_memory_gib / r.memory_limit_gib for r in rows}
    assert 0.85 < peak["DSV3-report-H800"] < 0.95
    assert 0.95 < peak["MB2511-GB200-Llama3-70B-fp8"] <= 1.0
    assert 0.9 < peak["MB2511-GB200-Llama3.1-405B-fp8"] < 0.95 and 0.9 < peak["MB2606-GB200-Llama3.1-405B-fp8"] < 0.95


def _stored_call(profile: str, precision: str, stack: str, alltoall: bool = False) -> dict:
    """A fitted expert GEMM issue time as stored: in the hardware profile for the default stack (the all-to-all
    dispatcher's sync time apart), in the stack file for another release."""
    from planner.specs.hardware import hardware_profiles_dir
    from planner.specs.stack import DEFAULT_STACK, stacks_dir

    if stack == DEFAULT_STACK:
        return json.loads((hardware_profiles_dir() / f"{profile}.json").read_text())["gpu"][
            "expert_alltoall_sync_us" if alltoall else "expert_gemm_call_us"][precision]
    return json.loads((stacks_dir() / f"{stack}.json").read_text())["expert_gemm_call_us"][profile][precision]


def test_the_fitted_expert_issue_times_are_what_the_fit_computes():
    """The expert GEMM issue time is data with its rows, like the GEMM ratio, one value per (GPUs, precision, stack
    release): each store holds the fit's value and rows, and the estimate of a row uses its release's."""
    from planner.validation.fit import ALLTOALL, CALL_TARGETS, call_param, fit_call

    assert len(CALL_TARGETS) == 6
    for profiles, precision, _, stack, dispatchers in CALL_TARGETS:
        f = fit_call(profiles, precision, stack, dispatchers)
        grid = call_param(dispatchers).grid
        assert f.rows and grid[1] <= f.value < grid[-1], (profiles, stack, dispatchers)  # inside the grid
        for profile in profiles:
            stored = _stored_call(profile, precision, stack, dispatchers == ALLTOALL)
            assert stored["value"] == f.value and stored["fitted_on"] == list(f.rows)


def test_what_the_issue_time_fits_explain_and_what_they_do_not():
    """Measured 2026-12-05 (README, 'expert GEMM issue time'). The release effect: the same Qwen3-30B-A3B layout on
    16 H100 ran 5,113 tokens/s/GPU in the 26.02 container and 9,058 in 26.02.01, and the fits say so (H100 fp8
    250 us for 25.11 / 26.02, 95 us since; Blackwell mxfp8 65 us, 50 us since (70 / 55 before Blackwell's bf16 curve
    took the training-step ratio and GB200's GEMMs B200's rate, 2026-12-06, later; 45 us: 30 while DeepEP / HybridEP
    inside a node were priced as the plain all-to-all (2026-12-06: a token goes once to each distinct rank, which
    shortens the two current-release Blackwell rows' all-to-alls and leaves the issue time more of their step), 40
    before Blackwell's attention table was fitted on cuDNN's published speeds). Blackwell's 25.11 value holds across
    model families (6 rows; refit without DeepSeek or without Qwen3, the left-out rows stay within 14%: 13.1% since the
    B200 DeepSeek-V3 row runs its recipe's pipeline layout, 2026-12-06). On H100 the
    rows that ran 16 local experts with the all-to-all overlap at micro-batch 1 came out 30-41% slow while the EP 16
    rows of 26.04.01 / 26.06 (8 local experts, no overlap) sat within 2%: the measured throughputs do not scale with
    the local experts' count as per-expert issue alone would. The overlap pairs micro-batches, so the paired one's
    kernels fill the host's issue gaps (compute.PassTimes.paired_scale, 2026-12-06): the current release's H100 fit
    moves 95 -> 90 us, in-sample 8.7% / 29.1% -> 2.7% / 4.0%, each source left out 20.5% / 29.1% -> 3.8% / 6.9%, and
    the 26.02.01 row -29% -> -2%; in the 25.11 containers the overlap added host work instead (Megatron-Bridge PR
    1760 turned it off for that), so their stack keeps the per-op issue. The 26.02 row stayed 41% slow until
    2026-12-08, when the all-to-all dispatcher's cost became the same per-expert calls plus a sync time per GEMM pass
    (below), and H100's two 26.02 rows, both on that dispatcher, took the current release's path."""
    from planner.validation.fit import ALLTOALL, OTHERS, fit_call, source_of

    old_bw = fit_call(("b200-180gb", "gb200-nvl72"), "mxfp8", "megatron-core-25.11")
    assert old_bw.value == 65 and len(old_bw.rows) == 11 and len(old_bw.lomo) == 2
    left_out = [e for errs in old_bw.lomo.values() for e in errs]
    assert max(abs(e) for e in left_out) < 0.14
    # the current release's Blackwell value on fifteen rows of two families and three releases (2026-12-06: 45 us on
    # two rows, each family left out 68% off, before the Qwen3 and DeepSeek-V3 rows of 26.02.01-26.04.01): each release
    # and each family left out within 14%
    new_bw = fit_call(("b200-180gb", "gb200-nvl72"), "mxfp8", dispatchers=OTHERS)
    assert new_bw.value == 50 and new_bw.value < old_bw.value and len(new_bw.rows) == 15
    assert max(abs(e) for groups in (new_bw.loso, new_bw.lomo) for errs in groups.values() for e in errs) < 0.14
    new_h = fit_call(("h100-80gb-sxm",), "fp8", dispatchers=OTHERS)
    old_h = fit_call(("h100-80gb-sxm",), "fp8", "megatron-core-25.11")
    # 95 us since the H100 fp8 GEMM ratio took Megatron-Bridge 26.02-26.04.01's Llama 3 70B rows (0.925 -> 0.935,
    # 2026-12-06): the expert GEMMs themselves run a little faster, the host's issue takes the difference
    assert (new_h.value, old_h.value) == (95, 250)
    assert old_h.rows == ("MB2511-H100-Qwen3-235B", "MB2511-H100-Qwen3-30B-fp8")
    err = dict(zip(new_h.rows, new_h.in_sample)) | dict(zip(old_h.rows, old_h.in_sample))
    assert abs(err["MB260401-H100-Qwen3-30B-fp8"]) < 0.03 and abs(err["MB2606-H100-Qwen3-30B-fp8"]) < 0.03
    # the 26.02.01 row, PP 2 with the overlap at micro-batch 1, -2% at 90 us and -7% at 95 us
    assert abs(err["MB260201-H100-Qwen3-30B-fp8"]) < 0.075
    left_out = {i: e for source, errs in new_h.loso.items()
                for i, e in zip([i for i in new_h.rows if source_of(RUN_BY_ID[i]) == source], errs)}
    assert len(new_h.rows) == 5 and max(abs(e) for e in left_out.values()) < 0.08
    # 2026-12-06: on H100 the slow issue follows the dispatcher, not the release. The current containers' Qwen3-235B
    # layout (TP 2, EP 32 over 8 nodes, four local experts) runs Megatron-Core's all-to-all dispatcher; the 26.02
    # container, which had no DeepEP (known issue), ran it at the 26.02.01 speed (1,633 vs 1,611 tokens/s/GPU) while
    # the Qwen3-30B layout whose recipe asks for DeepEP sped up 1.77x. At the flex dispatcher's 90 us its 26.02.01 to
    # 26.04.01 rows came out 13-20% fast; with a per-call time of the all-to-all dispatcher's own (285 us, its host
    # sync draining the paired micro-batch) they fit within 5%, but that per-call form put the 26.02 Qwen3-30B row
    # (16 local experts, the 235B's four) 41-47% slow. Since 2026-12-08 the dispatcher's layers take the flex
    # dispatcher's per-expert calls plus a sync time per GEMM pass, whatever the local experts (760 us: four calls
    # of 285 us are four of 95 plus 760), fitted on the five H100 rows of that dispatcher; the 26.02 release left out,
    # its Qwen3-30B row reads -6.9% at the value the three later releases give
    a2a_h = fit_call(("h100-80gb-sxm",), "fp8", dispatchers=ALLTOALL)
    assert a2a_h.rows == ("MB2602-H100-Qwen3-235B", "MB260201-H100-Qwen3-235B", "MB2604-H100-Qwen3-235B",
                          "MB260401-H100-Qwen3-235B", "MB2602-H100-Qwen3-30B-fp8")
    assert a2a_h.value == 760 and max(abs(e) for e in a2a_h.in_sample) < 0.07
    assert max(abs(e) for errs in a2a_h.loso.values() for e in errs) < 0.07
    assert -0.08 < a2a_h.loso["Megatron-Bridge 26.02"][1] < -0.06
    assert ROWS["MB2602-H100-Qwen3-235B"].measured == pytest.approx(ROWS["MB260201-H100-Qwen3-235B"].measured, rel=0.02)
    assert all(RUN_BY_ID[i]["layout"].get("ep_dispatcher", "alltoall") == "alltoall" for i in old_h.rows)
    # on B200 the same: the all-to-all layout of Qwen3-235B ran 3,805 tokens/s/GPU in 26.02 and 3,776 in 26.04.01
    a2a_b = fit_call(("b200-180gb", "gb200-nvl72"), "mxfp8", dispatchers=ALLTOALL)
    assert a2a_b.rows == ("MB260401-B200-Qwen3-235B-mxfp8",) and a2a_b.value == 160
    assert ROWS["MB2602-B200-Qwen3-235B-mxfp8"].measured == pytest.approx(
        ROWS["MB260401-B200-Qwen3-235B-mxfp8"].measured, rel=0.01)


def test_fine_grained_moe_rows_after_the_expert_issue_fit():
    """The rows with 16-32 small local experts per GPU, 2-3x off before the issue time was modelled (estimated
    25,855 vs 9,299 tokens/s for Qwen3-30B-A3B on 8 B200), within 15% now."""
    for run_id in ("MB2511-B200-Qwen3-30B-mxfp8", "MB2511-GB200-Qwen3-30B-mxfp8", "MB2511-B200-Qwen3-235B-mxfp8",
                   "MB2511-B200-DeepSeekV3-mxfp8", "MB2511-H100-Qwen3-30B-fp8"):
        assert abs(ROWS[run_id].error) < 0.15, run_id


def test_nemo_24_03_long_sequence_rows_on_h100():
    """NeMo's long-sequence page, Llama 2 7B in fp8 on H100 (NeMo 24.03.01, 4K to 1M tokens, TP 1-8, PP 1-2, CP up
    to 32), converted with NeMo's FLOP count of the commit that published it. The container ran cuDNN 9.0's fused
    attention (Transformer Engine 1.4 picks it on sm90), older than any published cuDNN table. At the mid-2024 cuDNN
    table the model was optimistic on all nine, from +9% at 4K to +37% at 1M, and the gap grows with the attention's
    share of the step: every row needs its attention about 1.45x slower (1.39-1.52) whatever its length, TP, PP or
    CP, so the gap is the kernel, not the ring or the GEMMs. At FlashAttention-2's table the rows read 2-14% slow,
    also growing with length: cuDNN 9.0 sits between the two, as Transformer Engine's notes put it (20-50% ahead of
    flash-attn 2.4.2 on Hopper). Priced as FlashAttention-2's table at one fitted rate (hardware profile
    ``cudnn-9.0``, planner.validation.fit KERNEL_TARGETS), all nine sit within 3%, each row left out too (2026-12-06;
    held out of every fit before)."""
    from planner.specs.hardware import load_cluster
    from planner.validation.compare import evaluate_modern_run
    from planner.validation.fit import fit_kernel

    runs = [r for r in RUNS if r["id"].startswith("NeMo2403-H100-Llama2-7B-")]
    assert len(runs) == 9 and all(r["layout"]["attention_kernel"] == "cudnn-9.0" for r in runs)
    f = fit_kernel("h100-80gb-sxm", "cudnn-9.0", "flash-attention-2")
    stored = [k for k in load_cluster("h100-80gb-sxm").gpu.other_attention_kernels if k.name == "cudnn-9.0"]
    assert stored and 1.05 < f.value < 1.5 and set(f.rows) == {r["id"] for r in runs}
    assert max(abs(ROWS[r["id"]].error) for r in runs) < 0.03
    assert max(abs(e) for errs in f.loro.values() for e in errs) < 0.035 and not f.loso  # one source

    def errors(kernel):
        out = {}
        for r in runs:
            other = json.loads(json.dumps(r))
            other["layout"]["attention_kernel"] = kernel
            out[r["id"]] = evaluate_modern_run(other).error
        return out

    newer, fa2 = errors("cudnn"), errors("flash-attention-2")
    assert all(newer[i] > 0.05 for i in newer) and newer["NeMo2403-H100-Llama2-7B-1M"] > 0.3
    assert all(fa2[i] < 0 for i in fa2) and fa2["NeMo2403-H100-Llama2-7B-1M"] < fa2["NeMo2403-H100-Llama2-7B-4K"]


def test_what_the_gpt_oss_rows_miss():
    """What the model still misses on GPT-OSS-120B (``compare.missing_time``: measured step less estimated step;
    analysis/missing_time_forms.py) since Megatron-Core's biased grouped weight gradients are priced (2026-12-07,
    ``biased_grouped_wgrad_factor`` of stacks/megatron-core.json; before, every Blackwell 4K row lacked 0.65-0.78 us
    per token and layer and H100's 1.36-1.50 us, about twice: a device cost following the GPU's GEMM rate). Now the
    B200 / GB200 4K rows lack -0.03 to +0.18 us, H100's four -0.13 to -0.28 us (3-6% slow: one factor for every GPU
    fits Blackwell's rows best), Blackwell Ultra's six (held out) -0.07 to -0.13 us, and the 25.11 GB200 row at 8K
    reads -7% (the factor fitted on 4K rows, with no term for the sequence length). The 25.11 B200 row, read with its
    recipe's layout (EP 64, layernorm and moe_act recomputed) since 2026-12-07, lacks nothing (+0.02 s a step), where
    its table's EP 8 without recompute left it 1.2 s short (+44%)."""
    from planner.validation.compare import missing_time

    assert abs(missing_time(RUN_BY_ID["MB2511-B200-GPT-OSS-120B-bf16"]).step_s) < 0.1
    oss = [r for r in RUNS if "GPT-OSS" in r["id"] and r["id"].startswith("MB")]
    assert len(oss) == 20
    bands = {"h100-80gb-sxm": (-0.30e-6, -0.12e-6), "gb300-nvl72": (-0.14e-6, -0.10e-6),
             "b300-288gb": (-0.10e-6, -0.05e-6)}
    for r in oss:
        if r["id"] == "MB2511-GB200-GPT-OSS-120B-bf16":
            continue
        lo, hi = bands.get(r["cluster"], (-0.05e-6, 0.2e-6))
        assert lo < missing_time(r).per_token_layer_s < hi, r["id"]
    assert -0.08 < ROWS["MB2511-GB200-GPT-OSS-120B-bf16"].error < -0.05
    assert abs(ROWS["MB2511-B200-GPT-OSS-120B-bf16"].error) < 0.02


def test_validate_reports_in_sample_and_out_of_sample_rows_apart():
    """`planner validate --set modern` keeps the rows a fitted value is fitted on (the GEMM ratios' and the expert
    issue times' rows, `fit.fitted_row_ids`) apart from all the others, per row and in two summaries: a reader sees
    how far the model is off where nothing was chosen to match (2026-12-06: 24 rows at 4.8% mean, 58 at 16.4%)."""
    from planner.validation.fit import call_fitting_rows, fitted_row_ids, fitting_rows

    fitted = fitted_row_ids()
    assert {r["id"] for r in fitting_rows("h100-80gb-sxm", "fp8")} <= fitted
    assert {r["id"] for r in call_fitting_rows(("h100-80gb-sxm",), "fp8")} <= fitted
    assert not any(RUN_BY_ID[k].get("held_out") for k in fitted)
    r = CliRunner().invoke(app, ["validate", "--set", "modern", "--json"])
    rep = json.loads(r.stdout)["modern"]
    assert {row["id"] for row in rep["rows"] if row["in_sample"]} == set(fitted)
    assert rep["in_sample"]["rows"] + rep["out_of_sample"]["rows"] == rep["overall"]["rows"]
    assert rep["in_sample_left_out"]["rows"] == rep["in_sample"]["rows"]
    assert rep["in_sample_left_out"]["max_abs_error"] == pytest.approx(0.177, abs=0.01)  # 25.11 H100 Qwen3-30B
    out = [abs(row["error"]) for row in rep["rows"] if not row["in_sample"] and row["error"] is not None]
    assert rep["out_of_sample"]["mean_abs_error"] == pytest.approx(sum(out) / len(out))
    table = CliRunner().invoke(app, ["validate", "--set", "modern"])
    assert "out of sample" in table.output and "in sample" in table.output


def test_a_plan_says_when_its_runner_up_is_a_run_of_another_kind():
    """The bands carry the rows' mean signed error (which way the model errs on such runs), and a plan whose runner-
    up is a run of another kind (here: the winner with ring CP, the runner-up without) carries both bands and says
    how the model reads each kind: on H100 fp8 the CP rows read fast (+5.5% signed, 6.2% mean |error|: the current
    releases' rows +6% to +17%, NeMo 24.03's within 3% either way), the others within a few percent."""
    from planner.cli.plan import tie_note
    from planner.validation.bands import BANDS_FILE, band_for
    from planner.validation.fit import cross_validated_errors

    left_out = cross_validated_errors()
    for c in json.loads(BANDS_FILE.read_text())["bands"]:
        if all(i in ROWS for i in c["rows"]):  # a modern cell: its rows' signed errors, fitted rows left out
            errs = [left_out.get(i, ROWS[i].error) for i in c["rows"]]
            assert c["mean_signed_error"] == pytest.approx(statistics.mean(errs), abs=1e-4)
    cp = band_for("NVIDIA H100 80GB SXM5", "fp8", moe=False, cp=True)
    assert cp.mean_signed_error > 0.8 * cp.mean_abs_error  # such rows read fast
    args = ["plan", "--model", "llama-3.1-70b", "--cluster", "h100-80gb-sxm", "--gpus", "64", "--global-batch", "128",
            "--seq-len", "8192", "--precision", "fp8", "--stack", "torchtitan", "--cp", "1,2", "--top", "8",
            "--pp", "2", "--schedules", "zbv"]
    r = CliRunner().invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    first, second = d["parallelism"]["cp"], d["alternatives"][0]["parallelism"]["cp"]
    acc = d["accuracy"]
    # 2026-12-07: TP4 PP2 DP4 CP2 ahead of TP4 PP2 DP8 by 0.7% under ZB-V (2026-12-06, with any PP and schedule,
    # TP2 PP4 DP4 CP2 led by 1.6%: a ZeRO-2 / 3 plan whose gradients under pipeline stages are now held unsharded)
    assert (first, second) == (2, 1)
    assert acc["group"] == "H100 / H200 / H800, fp8, dense with CP, llama runs"  # the cell's are all Llama's
    assert acc["runner_up"]["group"] == "H100 / H200 / H800, fp8, dense, llama runs"
    from planner.schema import validate_plan_json
    validate_plan_json(d, "plan")
    note_acc = {"group": "a", "mean_abs_error": 0.25, "mean_signed_error": 0.25,
                "runner_up": {"group": "b", "mean_abs_error": 0.07, "mean_signed_error": 0.05}}

    class _Est:
        def __init__(self, s):
            self.step_time_s = s

    class _Alt:
        estimate = _Est(1.02)

    class _Plan:
        estimate = _Est(1.0)
        alternatives = [_Alt()]

    note = tie_note(_Plan(), note_acc)
    assert "inside the model's ±25.0%" in note and "like #1 (a) +25.0%" in note and "like #2 (b) +5.0% (±7.0%)" in note


def test_the_old_containers_gaps_follow_their_attention():
    """compare.attention_gap (analysis/attention_share_gaps.py): at the H100 cuDNN table NeMo 24.03's nine rows
    need one attention slowdown, 1.39-1.52x, from 4K (attention 17% of the step) to 1M tokens (86%), TP 1-8, PP 1-2,
    CP 1-32: the kernel, not the GEMMs (their k would fall as attention grows) nor the ring (it would grow with CP).
    NeMo 25.04's B200 rows with ring CP 2-16 need 1.13-1.16x at every CP degree and link (README)."""
    from planner.validation.compare import attention_gap

    old = []
    for run in RUNS:
        if run["id"].startswith("NeMo2403-H100-Llama2-7B-"):
            other = json.loads(json.dumps(run))
            other["layout"]["attention_kernel"] = "cudnn"
            old.append(attention_gap(other))
    assert len(old) == 9 and min(a for _, a, _ in old) < 0.2 and max(a for _, a, _ in old) > 0.8
    assert all(1.35 < k < 1.55 for _, _, k in old)
    ring = [attention_gap(r) for r in RUNS if r["id"].startswith("NeMo2504-B200-") and r["layout"].get("cp", 1) > 1]
    assert len(ring) == 6 and all(1.1 < k < 1.2 for _, _, k in ring)


def test_the_gap_analysis_scripts_run():
    """analysis/missing_time_forms.py and analysis/attention_share_gaps.py run from a checkout and print, per
    selected row, what their docstrings say (one row each, so that the scripts do not rot)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    forms = subprocess.run([sys.executable, "analysis/missing_time_forms.py", "MB2511-GB200-GPT-OSS"], cwd=root,
                           capture_output=True, text=True, check=True).stdout
    assert forms.count("\n") == 1 and "error   -6.7%" in forms and "lacks -0.74 s a step" in forms
    gaps = subprocess.run([sys.executable, "analysis/attention_share_gaps.py", "NeMo2403-H100-Llama2-7B-1M"],
                          cwd=root, capture_output=True, text=True, check=True).stdout
    assert gaps.count("\n") == 1 and "needs" in gaps


def test_a_model_family_with_runs_of_its_own_in_a_cell_gets_its_own_band():
    """'Runs like this one' within a cell are first the model's own family (its ``model_type``) where it has at least
    bands.FAMILY_MIN_ROWS published runs there: GPT-OSS on B200 in bf16 takes its ten rows' band (+1.6% since its
    25.11 row runs its recipe's layout, 2026-12-07; +4.7% with that row read +44%, since the biased grouped weight
    gradients of the same day; +60% before, +81% before 2026-12-06, later), not the cell's mix with DeepSeek-V3 and
    Qwen3-235B; DeepSeek-V3 there, one run, takes the cell's; Qwen3 on Blackwell in fp8 its own 23 rows (about
    4%), where the cell, with Nemotron 3 Nano's six (+30%), read 8.4% (2026-12-06); since the Mamba-2 SSD kernels'
    rate (2026-12-07) Nemotron's six read 1.9% and the cell 4.6%: each family still its own band."""
    from planner.validation.bands import FAMILY_MIN_ROWS, band_for

    assert FAMILY_MIN_ROWS == 3
    oss = band_for("NVIDIA B200", "bf16", moe=True, model_type="gpt_oss")
    cell = band_for("NVIDIA B200", "bf16", moe=True, model_type="deepseek_v3")
    assert oss.exact and oss.rows == 10 and "gpt_oss runs" in oss.label and 0.0 < oss.mean_signed_error < 0.03
    assert oss.mean_abs_error < 0.05
    assert cell.rows == 12 and cell.label == "B200, 16-bit, MoE" and cell.mean_abs_error < 0.08
    qwen = band_for("NVIDIA GB200", "mxfp8", moe=True, model_type="qwen3_moe")
    mixed = band_for("NVIDIA GB200", "mxfp8", moe=True)
    nano = band_for("NVIDIA GB200", "mxfp8", moe=True, model_type="nemotron_h")
    assert qwen.rows == 23 and "qwen3_moe runs" in qwen.label and qwen.mean_abs_error < 0.06
    assert nano.rows == 6 and "nemotron_h runs" in nano.label and nano.mean_abs_error < 0.03
    assert mixed.rows == 44 and nano.mean_abs_error < qwen.mean_abs_error < mixed.mean_abs_error < 0.06
    from planner.validation.compare import modern_model_ref

    model = modern_model_ref({"model": "models/gpt-oss-120b.json"})
    r = CliRunner().invoke(app, ["estimate", "--model", model, "--cluster",
                                 "b200-180gb", "--gpus", "64", "--global-batch", "1280", "--micro-batch", "4",
                                 "--seq-len", "4096", "--ep", "8", "--precision", "bf16", "--json"])
    assert r.exit_code == 0, r.output
    acc = json.loads(r.stdout)["accuracy"]
    assert acc["group"] == "B200, 16-bit, MoE, gpt_oss runs" and acc["rows"] == 10


def test_validate_reports_accuracy_per_model_family():
    """`planner validate --set modern` reports each model family (the config's model_type) apart, in the terminal and
    under ``model_families`` in JSON, so a family the model misses does not hide in the mean: GPT-OSS's 14 rows read
    72% (2026-12-06; 55% since Blackwell's GEMM curves and the experts' unfused bias, the session after; 16 rows with
    the HGX B300's two, 55%) where Llama's 65 read 5% (73 with GB300's, 5.4%; 82 with the rest of GB300's, 6.0%),
    Qwen3's and DeepSeek-V3's 5%. Since Megatron-Core's biased grouped weight gradients are priced and AutoModel's
    two GPT-OSS rows are in (2026-12-07), GPT-OSS's 22 read 7.3% and Nemotron 3 Nano's 17 (25%) were the family the
    mean would hide; since the Mamba-2 SSD kernels' rate (the same day) the nemotron_h family's 24 (with Nemotron-H
    56B's seven) read 5.1%. Llama's 108 read 7.1% with torchtitan's 24 Grand Teton rows (11.3%: CP and interleaved
    PP), 5.6% since GB300's own GEMM ratios."""
    r = CliRunner().invoke(app, ["validate", "--set", "modern", "--json"])
    assert r.exit_code == 0, r.output
    fams = json.loads(r.stdout)["modern"]["model_families"]
    assert sum(f["rows"] for f in fams.values()) == json.loads(r.stdout)["modern"]["overall"]["rows"]
    assert fams["gpt_oss"]["rows"] == 22 and fams["gpt_oss"]["mean_abs_error"] < 0.08
    assert fams["nemotron_h"]["rows"] == 24 and fams["nemotron_h"]["mean_abs_error"] < 0.06
    assert fams["llama"]["mean_abs_error"] < 0.075 and fams["qwen3_moe"]["mean_abs_error"] < 0.06
    # DeepSeek-V3's 24 at 6.1% since AutoModel's two pipeline rows are written as the ZeRO-2 they ran (2026-12-07)
    assert fams["deepseek_v3"]["mean_abs_error"] < 0.065
    text = CliRunner().invoke(app, ["validate", "--set", "modern"]).output
    assert "accuracy per model family" in text and "gpt_oss" in text


def test_blackwell_gemm_curves_stand_on_the_same_footing_as_hopper_and_gb200_runs_at_b200_rate():
    """Every profile's GEMM curve is a large-GEMM level times the A100 fit's training-step ratio (0.771 / 0.87 =
    0.886; MI300X's too, with no published run to check it); B200's level is the published cuBLAS 0.74 of its bf16
    peak, so its plateau is 0.656 (2026-12-06: it had kept 0.74, which the Blackwell fp8 ratios absorbed while its
    bf16 rows read fast). GB200, the same die at an 11% higher datasheet peak, runs its GEMMs at B200's rate: the
    archive's same-layout pairs of Megatron-Bridge 25.11 (Llama 3 8B on 8 GPUs) ran 1.029x (fp8) and 1.009x (mxfp8)
    B200's tokens/s on GB200, which the model now reads within 2.5 points (it read 1.094x at the datasheet ratio)."""
    from planner.specs.hardware import load_cluster

    h100, b200, gb200, mi300x = (load_cluster(n).gpu for n in ("h100-80gb-sxm", "b200-180gb", "gb200-nvl72",
                                                                "mi300x-192gb"))
    big = 1e16  # a GEMM on the curve's plateau
    assert h100.matmul_efficiency(big) == pytest.approx(0.79 * 0.886, abs=0.001)
    assert b200.matmul_efficiency(big) == pytest.approx(0.74 * 0.886, abs=0.001)
    assert mi300x.matmul_efficiency(big) == pytest.approx(0.58 * 0.886, abs=0.001)  # hipBLASLt's level, unchecked
    for flops in (1e9, 1e11, 1e13, big):  # the same achieved rate on both Blackwell profiles, whatever the size
        assert gb200.peak_flops * gb200.matmul_efficiency(flops) == pytest.approx(
            b200.peak_flops * b200.matmul_efficiency(flops), rel=0.005)  # points rounded to 3 decimals
    rows = {r.id: r for r in validate_modern([RUN_BY_ID[i] for i in (
        "MB2511-B200-Llama3-8B-fp8", "MB2511-GB200-Llama3-8B-fp8",
        "MB2511-B200-Llama3-8B-mxfp8", "MB2511-GB200-Llama3-8B-mxfp8")])}
    for precision in ("fp8", "mxfp8"):
        b, g = rows[f"MB2511-B200-Llama3-8B-{precision}"], rows[f"MB2511-GB200-Llama3-8B-{precision}"]
        assert RUN_BY_ID[b.id]["layout"] == RUN_BY_ID[g.id]["layout"]
        measured, modelled = g.measured / b.measured, g.estimated / b.estimated
        assert measured < 1.03 and abs(modelled - measured) < 0.025, (precision, measured, modelled)


def test_blackwell_ultra_fits_its_own_fp8_gemm_ratios_and_its_other_rows_check_them():
    """The 37 GB300 rows (and nine HGX B300 ones) of Megatron-Bridge 26.02-26.06.01 (docs/performance-summary-archive.md
    @ 067f987d; presets at v0.3.0-v0.5.1). GB300 carried B200's values until 2026-12-07; its dense rows then read
    7-17% slow, and GB300 ran Llama 3 70B's fp8 layout 1.20-1.27x GB200's speed in four releases where those values
    said 1.11x. Its own fp8 / mxfp8 GEMM ratios are now fitted on its dense rows without context parallelism (11:
    1.09 and 1.005 where B200 has 0.865 and 0.84), and the other 26 check them: the transformer MoE rows within 10%
    (DeepSeek-V3 -6% to 0%, Qwen3 -1% to +9%, were -14% to +6%), Llama 3.1 405B with CP 2 (6 rows) +2% to +7% (were
    -7% to -14%), GPT-OSS in bf16 (no ratio applies) unmoved at -9% to -11% (-7% to -8% since the biased grouped
    weight-gradient factor's refit without the misread 25.11 B200 row, 2026-12-07; the HGX B300's two -4%), and
    Nemotron 3 Nano faster still than it
    ran (+33% to +45%: the hybrid's own gap; since the Mamba-2 SSD kernels' rate, the same day, -3% to +6%, and the
    HGX B300's two +1% / +3%). The HGX B300 (1.1 kW) keeps B200's values."""
    from planner.specs.hardware import load_cluster
    from planner.validation.fit import fitted_row_ids, fitting_rows

    gb300 = {i: r for i, r in ROWS.items() if RUN_BY_ID[i]["cluster"] == "gb300-nvl72"}
    assert len(gb300) == 37 and all(r.estimated is not None for r in gb300.values())
    fitted = {r["id"] for p in ("fp8", "mxfp8") for r in fitting_rows("gb300-nvl72", p)}
    assert len(fitted) == 11 and set(gb300) & fitted_row_ids() == fitted
    assert all("Llama" in i and not RUN_BY_ID[i].get("held_out") for i in fitted)
    assert all("B300 / GB300" in r.groups for r in gb300.values())
    assert all(RUN_BY_ID[i].get("held_out") for i in set(gb300) - fitted)
    ratios = dict(load_cluster("gb300-nvl72").gpu.low_precision_gemm_efficiency)
    assert ratios == {"fp8": pytest.approx(1.09), "mxfp8": pytest.approx(1.005)}
    assert all(abs(gb300[i].error) < 0.05 for i in fitted)
    checks = {i: r.error for i, r in gb300.items() if i not in fitted}
    for key, lo, hi, n in (("Qwen3", -0.02, 0.10, 8), ("DeepSeekV3", -0.07, 0.0, 4), ("Llama3.1-405B", 0.02, 0.07, 6),
                           ("GPT-OSS", -0.085, -0.065, 4), ("Nemotron3Nano", -0.04, 0.06, 4)):
        errs = [e for i, e in checks.items() if key in i]
        assert len(errs) == n and all(lo < e < hi for e in errs), (key, errs)
    # the HGX B300 (B200's datasheet rates and GEMM ratios, Blackwell Ultra's attention): nine MoE rows; the
    # transformer ones hold but for Qwen3-235B in 26.04.01, 22% faster than in 26.04 on the same preset (a release's
    # gain the model lacks)
    assert dict(load_cluster("b300-288gb").gpu.low_precision_gemm_efficiency) == \
        dict(load_cluster("b200-180gb").gpu.low_precision_gemm_efficiency)
    b300 = {i: r for i, r in ROWS.items() if RUN_BY_ID[i]["cluster"] == "b300-288gb"}
    assert len(b300) == 9 and not set(b300) & fitted_row_ids()
    assert all("B300 / GB300" in r.groups and RUN_BY_ID[i].get("held_out") for i, r in b300.items())
    for key, lo, hi in (("DeepSeekV3", -0.02, 0.03), ("Qwen3-30B", 0.02, 0.06),
                        ("MB2604-B300-Qwen3-235B", 0.02, 0.07), ("MB260401-B300-Qwen3-235B", -0.17, -0.12),
                        ("Nemotron3Nano", 0.0, 0.04), ("GPT-OSS", -0.05, -0.03)):
        errs = [r.error for i, r in b300.items() if key in i]
        assert errs and all(lo < e < hi for e in errs), (key, errs)
    # the same DeepSeek-V3 preset on both (26.04: PP 16, EP 8): B300 ran 1.11x B200, the model says 1.04x
    pair = [ROWS[f"MB2604-{g}-DeepSeekV3-mxfp8"] for g in ("B300", "B200")]
    assert 1.10 < pair[0].measured / pair[1].measured < 1.12 and 1.03 < pair[0].estimated / pair[1].estimated < 1.06
    for rel in ("2602", "260201", "2604", "260401"):  # the same layout on GB300 and GB200, now fitted
        same_layout = (RUN_BY_ID[f"MB{rel}-GB300-Llama3-70B-fp8"]["measured_tokens_per_s_per_gpu"]
                       / RUN_BY_ID[f"MB{rel}-GB200-Llama3-70B-fp8"]["measured_tokens_per_s_per_gpu"])
        model = ROWS[f"MB{rel}-GB300-Llama3-70B-fp8"].estimated / ROWS[f"MB{rel}-GB200-Llama3-70B-fp8"].estimated
        assert 1.19 < same_layout < 1.28 and abs(model - same_layout) < 0.07


def test_a_narrow_gemm_ratio_may_pass_one_but_not_the_narrow_peak(tmp_path):
    """A profile's fp8 GEMM ratio may exceed 1 where its bf16 curve is carried (GB300's 1.09), never so far that the
    ratio times the curve's top efficiency passes the narrow format's peak: refused in one line naming the field."""
    import json

    from planner.errors import PlannerError
    from planner.specs.hardware import hardware_profiles_dir, load_cluster

    data = json.loads((hardware_profiles_dir() / "gb300-nvl72.json").read_text())
    top = max(e for _, e in data["gpu"]["matmul_efficiency"]["points"])
    assert load_cluster("gb300-nvl72").gpu.gemm_efficiency_ratio("fp8") * top <= 1
    data["gpu"]["low_precision_gemm_efficiency"]["fp8"]["value"] = 1.01 / top
    path = tmp_path / "too-fast.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlannerError, match=r"low_precision_gemm_efficiency\.fp8"):
        load_cluster(str(path))
