"""Should Blackwell's attention end-to-end ratio be fitted on its training rows? Measured: no (2026-12-06).

An accuracy experiment, not part of the model. The B200 / GB200 profiles carry H100's end-to-end ratio (0.886: the
share of a kernel benchmark's speed a training step reaches, taken from H100's GEMM curve) into their cuDNN attention
table. NeMo 25.04's long-context B200 rows (Llama 3 8B, 32K to 1M tokens, ring CP 2-16) sit 8-14% above their
measurements with it, rising with the attention's share of the step, while its 8K and 16K rows sit within 3%. The
candidate cause: a training step's attention runs below the benchmark's speed (cuDNN 9.10.2, batch 1, a few calls).
This script fits that ratio jointly with the GEMM ratios the way planner/validation/fit.py fits them (same grid, same
objective, the GEMM ratios on their own rows: each precision's dense rows without CP), by coordinate descent from
0.886, on all the B200 profile's dense rows; then scores

* each source left out (its rows at the values refit without it), and
* the GB200 dense rows, which no fit uses (the same die: they carry B200's values).

    python analysis/blackwell_attention_ratio.py

What it printed (2026-12-06): attention 0.765 with GEMM ratios fp8 0.825 / mxfp8 0.795 (5 passes); in-sample 2.7%
mean, 12.5% max (the 405B rows with CP 2 go from +5.4% / +8.3% to +10.4% / +12.5%: the higher GEMM ratios the
8K rows then want make every GEMM-bound row faster); without NeMo 25.04's rows the other sources leave the ratio at
0.885 and NeMo's come back at +8.5% to +13.8%, as before: the ratio is that one source's alone. The GB200 checks get
worse (Llama 3.1 405B +3.4% -> +8.7%, +4.1% -> +8.6% and -0.3% -> +4.8%; Llama 3 70B +1.2% -> +3.5%). So the
profiles keep the carried ratio; what NeMo 25.04's long rows miss is not established (its container's cuDNN is older
than the 9.10.2 the table is fitted on; ring CP's own residual, which the H100 rows with CP show at 8K, is the other
suspect).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np

from planner.validation.compare import evaluate_modern_run, load_modern_runs, row_cluster
from planner.validation.fit import GRID, _is_moe, fitting_rows, source_of

PROFILE, PRECISIONS, CHECKED = "b200-180gb", ("fp8", "mxfp8"), "gb200-nvl72"
#: the ratio the profiles carry (attention_fit.END_TO_END), the descent's start
START = 0.886
MAX_PASSES = 8


def dense_rows(profile: str) -> list[dict]:
    return [r for r in load_modern_runs() if r["cluster"] == profile and r["layout"]["precision"] in PRECISIONS
            and not _is_moe(r) and not r.get("held_out")]


def cluster_at(run: dict, values: dict[str, float]):
    """The row's profile with the attention ratio (every table) and the GEMM ratios of ``values`` set."""
    gpu = row_cluster(run).gpu
    att = values["attention"]
    gemm = dict(gpu.low_precision_gemm_efficiency)
    gemm.update({p: v for p, v in values.items() if p != "attention"})
    gpu = replace(gpu, low_precision_gemm_efficiency=tuple(sorted(gemm.items())),
                  attention_kernel=replace(gpu.attention_kernel, end_to_end_ratio=att),
                  other_attention_kernels=tuple(replace(k, end_to_end_ratio=att) for k in gpu.other_attention_kernels))
    return replace(row_cluster(run), gpu=gpu)


def errors(runs: list[dict], values: dict[str, float]) -> list[float]:
    return [evaluate_modern_run(r, cluster=cluster_at(r, values)).error for r in runs]


def grid_best(runs: list[dict], values: dict[str, float], key: str) -> float:
    scores = [statistics.mean(abs(e) for e in errors(runs, {**values, key: float(x)})) for x in GRID]
    return float(GRID[int(np.argmin(scores))])


def gemm_rows(rows: list[dict], precision: str) -> list[dict]:
    """Those of ``rows`` the shipped fit fits ``precision``'s GEMM ratio on (fit.fitting_rows)."""
    ids = {r["id"] for r in fitting_rows(PROFILE, precision)}
    return [r for r in rows if r["id"] in ids]


def descend(rows: list[dict]) -> tuple[dict[str, float], int]:
    """Each pass: every GEMM ratio on its rows, then the attention ratio on all rows, each over the whole grid with
    the others held; stop at the first pass that changes nothing."""
    values = {"attention": START}
    for n in range(1, MAX_PASSES + 1):
        before = dict(values)
        for p in PRECISIONS:
            if gemm_rows(rows, p):
                values[p] = grid_best(gemm_rows(rows, p), values, p)
        values["attention"] = grid_best(rows, values, "attention")
        if values == before:
            return values, n
    return values, MAX_PASSES


def _show(runs: list[dict], errs: list[float], before: list[float]) -> None:
    for r, e, b in zip(runs, errs, before):
        print(f"  {r['id']:36} {100 * b:+6.1f}% -> {100 * e:+6.1f}%")


def main() -> None:
    rows = dense_rows(PROFILE)
    values, passes = descend(rows)
    print(f"{PROFILE}: " + ", ".join(f"{k} {v:.3f}" for k, v in values.items()) + f" ({passes} passes)")
    shipped = [evaluate_modern_run(r).error for r in rows]
    fitted = errors(rows, values)
    _show(rows, fitted, shipped)
    print(f"  in-sample: mean {100 * statistics.mean(map(abs, fitted)):.1f}%, max {100 * max(map(abs, fitted)):.1f}%")
    for src in sorted({source_of(r) for r in rows}):
        rest, out = [r for r in rows if source_of(r) != src], [r for r in rows if source_of(r) == src]
        refit, _ = descend(rest)
        scored = [r for r in out if r["layout"]["precision"] in refit]
        print(f"  left out {src}: refit " + ", ".join(f"{k} {v:.3f}" for k, v in refit.items()) + "; " +
              ", ".join(f"{100 * e:+.1f}%" for e in errors(scored, refit)))
    checks = dense_rows(CHECKED)
    print(f"{CHECKED} (checks, never fitted), shipped -> with the fitted values:")
    _show(checks, errors(checks, values), [evaluate_modern_run(r).error for r in checks])


if __name__ == "__main__":
    main()
