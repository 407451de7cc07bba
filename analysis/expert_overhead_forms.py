"""Which form of the MoE expert overhead do the published rows support: time per host call, or time per routed copy?

An accuracy experiment, not part of the model. The shipped model (planner/cost/compute.py, ``pass_times``) prices the
host path of Megatron-Core's grouped expert GEMM as an issue time per local expert and GEMM, taken as a floor under
the GEMM's device time (``max``), fitted per (GPU, stack, precision) by planner/validation/fit.py. The alternative
here keeps the fit, the rows, the grid search and the left-out checks, and changes only the form: a time per routed
token copy and GEMM (forward; twice that in backward), added to the GEMM. Both forms have one fitted number per
(GPU, stack, precision).

    python analysis/expert_overhead_forms.py call   # the shipped form, refit: values and errors per target
    python analysis/expert_overhead_forms.py copy   # the per-copy form, refit the same way
    python analysis/expert_overhead_forms.py set    # the whole modern set, per-copy on Hopper (the values 'copy'
                                                    # prints for H100), the shipped per-call form elsewhere

Each mode runs in its own process: the step cache keys on configurations and profiles, not on the patched form.
The per-copy form replaces the functions it changes in the running process only (the experiment's scaffolding; the
model itself never does this).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

import numpy as np

import planner.cost.compute as compute
import planner.cost.step as step
import planner.validation.fit as fit
from planner.validation.compare import evaluate_modern_run, load_modern_runs, row_cluster, row_stack

#: copies per unit of the fitted value: a value of x "microseconds per call" means x ns per routed copy
COPIES_PER_UNIT = 1000.0
#: the per-copy values the 'copy' mode fits for H100 fp8 (2026-12-05): Megatron-Core current, its 25.11 release
HOPPER_NS_PER_COPY = {"megatron-core": 18.0, "megatron-core-25.11": 56.0}
HOPPER = ("h100-80gb-sxm", "h200-141gb-sxm")

_shipped_ffn_ops = compute.ffn_ops
_shipped_pass_times = compute.pass_times


def ffn_ops_per_copy(model, cfg, moe):
    """The shipped feed-forward ops, the expert GEMMs' ``expert_calls`` replaced by their routed copies (in units of
    COPIES_PER_UNIT) where the stack loops over experts: every copy this GPU computes passes each expert GEMM once."""
    ops = _shipped_ffn_ops(model, cfg, moe)
    if not moe:
        return ops
    copies = cfg.tokens_per_rank * model.experts_per_token * compute.expert_tp_token_share(cfg)
    units = np.where(np.asarray(cfg.per_expert_gemm_calls, dtype=bool), copies / COPIES_PER_UNIT, 0.0)
    return [replace(op, expert_calls=units) if op.name in ("experts_in", "experts_out") else op for op in ops]


def pass_times_additive(ops, gpu, modules=""):
    """``compute.pass_times`` with the expert overhead added to the GEMM's time instead of taken as a floor."""
    fwd = bwd_in = bwd_w = sel = kernels = issued = 0.0
    for op in ops:
        tf = compute.op_time_s(op, gpu)
        tb = compute.op_bwd_time_s(op, gpu, tf)
        kernels = kernels + tf + tb
        if np.any(op.expert_calls) and (gpu.expert_gemm_call_s or gpu.expert_alltoall_sync_s):
            extra = gpu.expert_issue_s(op.precision, op.expert_calls, op.expert_alltoall)
            issued = issued + (1.0 + compute.GEMM_BWD_RATIO) * extra
            tf, tb = tf + extra, tb + compute.GEMM_BWD_RATIO * extra
        fwd = fwd + tf
        bwd_w = bwd_w + tb * op.weight_grad_fraction
        bwd_in = bwd_in + tb * (1.0 - op.weight_grad_fraction)
        sel = sel + tf * compute.recomputed(op, modules)
    # the device's kernels and the per-copy work, for the paired micro-batch's share (PassTimes.paired_scale): the
    # per-copy time is device work here, so a paired micro-batch cannot hide it; the pass pair takes their sum
    return compute.PassTimes(fwd, bwd_in, bwd_w, sel, kernels + issued, 0.0)


def use_per_copy(on: bool) -> None:
    compute.ffn_ops = ffn_ops_per_copy if on else _shipped_ffn_ops
    compute.pass_times = step.pass_times = pass_times_additive if on else _shipped_pass_times


def refit(per_copy: bool) -> None:
    use_per_copy(per_copy)
    if per_copy:  # ns per copy: a finer grid than the per-call one (the all-to-all sync stays a time per pass)
        fit.CALL = fit._Param("expert_gemm_call_s", np.arange(0.0, 100.0001, 1.0), 1e-6)
    for profiles, precision, _carried, stack, dispatchers in fit.CALL_TARGETS:
        f = fit.fit_call(profiles, precision, stack, dispatchers)
        loso = [e for v in f.loso.values() for e in v]
        lomo = [e for v in f.lomo.values() for e in v]
        unit = "us per pass (all-to-all sync)" if dispatchers == fit.ALLTOALL else \
            "ns per copy" if per_copy else "us per call"
        print(f"{f.profile} {precision} ({stack}, {dispatchers}): {f.value:g} {unit}; "
              f"in-sample {fit._pct(f.in_sample)}; "
              f"left-out source {fit._pct(loso) if loso else '-'}; left-out model family {fit._pct(lomo) if lomo else '-'}")
        print("   " + ", ".join(f"{r} {100 * e:+.1f}%" for r, e in zip(f.rows, f.in_sample)))


def whole_set() -> None:
    rows = {r["id"]: r for r in load_modern_runs()}
    errs = {}
    for rid, r in rows.items():
        hopper = r["cluster"] in HOPPER and row_stack(r) in HOPPER_NS_PER_COPY
        use_per_copy(hopper)
        cluster = row_cluster(r)
        if hopper:  # one per-copy value after every dispatcher, no all-to-all sync on top
            cluster = fit.CALL.apply(cluster, "fp8", HOPPER_NS_PER_COPY[row_stack(r)])
            cluster = fit.SYNC.apply(cluster, "fp8", 0.0)
        errs[rid] = evaluate_modern_run(r, cluster=cluster).error

    def group(name, keep):
        a = [abs(e) for k, e in errs.items() if keep(rows[k])]
        print(f"{name}: {len(a)} rows, mean {100 * statistics.mean(a):.1f}%, median {100 * statistics.median(a):.1f}%, "
              f"max {100 * max(a):.1f}%")

    group("all", lambda r: True)
    group("all without GPT-OSS", lambda r: "GPT-OSS" not in r["id"])
    group("MoE", fit._is_moe)
    group("MoE without GPT-OSS", lambda r: fit._is_moe(r) and "GPT-OSS" not in r["id"])
    group("fp8", lambda r: r["layout"]["precision"] in ("fp8", "mxfp8"))
    group("H100 / H800", lambda r: r["cluster"].startswith(("h100", "h800")))
    for rid, e in errs.items():
        if rows[rid]["cluster"] in HOPPER and fit._is_moe(rows[rid]):
            print(f"   {rid} {100 * e:+.1f}%")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "call":
        refit(False)
    elif mode == "copy":
        refit(True)
    elif mode == "set":
        whole_set()
    else:
        sys.exit("usage: python analysis/expert_overhead_forms.py call|copy|set")
