"""Fit the few profile parameters the modern validation set determines, and report how well they generalize.

    python -m planner.validation.fit            # print the fits, in-sample and leave-one-source-out errors
    python -m planner.validation.fit --write    # and store each fitted value, with its rows, in the profiles

One parameter per (GPU, precision): the fraction of the bf16 GEMM efficiency (at equal duration) that the narrow
format's GEMMs reach (``GPU.low_precision_gemm_efficiency``). Physically: FP8 tensor-core GEMMs run at twice the
rate, so the same per-kernel overheads (tile quantization, epilogue, scaling-factor loads, launch) weigh twice as
much. It is fitted on the dense rows of that GPU and precision only, where the linear layers' GEMMs are most of the
step; MoE rows (all-to-all, grouped GEMMs: issue 10) are left out of the fit. The fit minimizes the mean absolute
relative error of tokens/s per GPU over a grid of ratios. Leave-one-source-out: for each source (framework
release) the ratio is refit without its rows and the left-out rows are scored with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, replace

import numpy as np

from planner.specs.hardware import hardware_profiles_dir, load_cluster
from planner.validation.compare import evaluate_modern_run, load_modern_runs

#: (profile fitted, precision, profiles of the same die that carry the value unfitted)
TARGETS = (("h100-80gb-sxm", "fp8", ("h200-141gb-sxm", "h800-80gb-sxm")),
           ("b200-180gb", "fp8", ("gb200-nvl72",)),
           ("b200-180gb", "mxfp8", ("gb200-nvl72",)))
#: ratios tried (the grid's step is the fit's resolution)
GRID = np.round(np.arange(0.50, 1.0001, 0.005), 3)


@dataclass(frozen=True)
class Fit:
    profile: str
    precision: str
    value: float
    rows: tuple[str, ...]
    in_sample: tuple[float, ...]  # signed errors of the fitting rows at the fitted value
    loso: dict[str, tuple[float, ...]]  # per left-out source: its rows' errors with the ratio refit without them


def _with_ratio(cluster, precision: str, ratio: float):
    ratios = dict(cluster.gpu.low_precision_gemm_efficiency)
    ratios[precision] = float(ratio)
    return replace(cluster, gpu=replace(cluster.gpu, low_precision_gemm_efficiency=tuple(sorted(ratios.items()))))


def _errors(runs: list[dict], cluster, precision: str, ratio: float) -> list[float]:
    c = _with_ratio(cluster, precision, ratio)
    return [evaluate_modern_run(r, cluster=c).error for r in runs]


def _best(runs: list[dict], cluster, precision: str) -> float:
    scores = [statistics.mean(abs(e) for e in _errors(runs, cluster, precision, x)) for x in GRID]
    return float(GRID[int(np.argmin(scores))])


def fitting_rows(profile: str, precision: str) -> list[dict]:
    """The dense rows of this GPU and precision (the rows the parameter is fitted on)."""
    from planner.validation.compare import modern_model_ref
    from planner.specs.model import load_model

    return [r for r in load_modern_runs() if r["cluster"] == profile and r["layout"]["precision"] == precision
            and not load_model(modern_model_ref(r)).is_moe]


def source_of(run: dict) -> str:
    """The source a row comes from, for leave-one-source-out: its framework release."""
    return run["framework"].split(" (")[0]


def fit(profile: str, precision: str) -> Fit:
    runs = fitting_rows(profile, precision)
    cluster = load_cluster(profile)
    value = _best(runs, cluster, precision)
    loso = {}
    for src in sorted({source_of(r) for r in runs}):
        rest = [r for r in runs if source_of(r) != src]
        if not rest:
            continue
        left = [r for r in runs if source_of(r) == src]
        loso[src] = tuple(_errors(left, cluster, precision, _best(rest, cluster, precision)))
    return Fit(profile, precision, value, tuple(r["id"] for r in runs),
               tuple(_errors(runs, cluster, precision, value)), loso)


def _pct(errors) -> str:
    errors = list(errors)
    return f"mean {100 * statistics.mean(abs(e) for e in errors):.1f}%, max {100 * max(abs(e) for e in errors):.1f}%"


def write(f: Fit, carried_to: tuple[str, ...]) -> None:
    """Store the fitted value and its provenance in the profile (and, marked unfitted, in the same-die ones)."""
    loso_all = [e for errs in f.loso.values() for e in errs]
    entry = {"value": f.value, "fitted_on": list(f.rows),
             "method": "planner/validation/fit.py: grid over [0.50, 1.00] step 0.005, least mean |error| of tokens/s "
                       "per GPU on these rows",
             "in_sample": _pct(f.in_sample),
             "leave_one_source_out": _pct(loso_all) if loso_all else "one source only: no left-out check"}
    for name in (f.profile,) + carried_to:
        path = hardware_profiles_dir() / f"{name}.json"
        data = json.loads(path.read_text())
        e = dict(entry) if name == f.profile else {
            "value": f.value, "carried_from": f.profile,
            "why": f"same die and tensor cores as {f.profile}; not fitted on this GPU's runs"}
        data["gpu"].setdefault("low_precision_gemm_efficiency", {})[f.precision] = e
        path.write_text(json.dumps(data, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="store the fitted values in hardware_profiles/")
    args = ap.parse_args()
    for profile, precision, carried in TARGETS:
        f = fit(profile, precision)
        print(f"{profile} {precision}: gemm efficiency ratio {f.value:.3f} on {len(f.rows)} rows "
              f"({', '.join(f.rows)})")
        print(f"  in-sample: {_pct(f.in_sample)}")
        for src, errs in f.loso.items():
            print(f"  left out {src}: {', '.join(f'{100 * e:+.1f}%' for e in errs)}")
        if args.write:
            write(f, carried)


if __name__ == "__main__":
    main()
