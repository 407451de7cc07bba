"""Fit each profile's attention-kernel table (``gpu.attention_kernel``) on published kernel speeds, and check it.

    python -m planner.validation.attention_fit            # print the fit and every row's error
    python -m planner.validation.attention_fit --write    # and store the table, with its rows, in the profiles

The kernel model is :func:`planner.cost.compute.attention_work_factor` (tiles of ``TILE_TOKENS`` query rows, a fixed
cost per query-tile row, an extra cost per masked tile) and :func:`planner.cost.compute.causal_rate_ratio` (a causal
call's full tiles at a share of the unmasked rate). Per direction and head dimension, the plateau rate and the
row cost are fitted on the kernel's speed without a mask over 512 to 16K tokens (least squares of the relative
error; the row cost on a grid, the plateau in closed form); the masked-tile cost and the causal rate share, two
numbers per kernel, on the forward speed with a causal mask at head dim 64 (the head-dim-128 causal panel is a
check). Rows marked "check" are never fitted. Each kernel with rows is fitted and stored in the profile: the
kernel its default stack runs as ``gpu.attention_kernel`` (:data:`TARGETS`: Megatron-Core's Transformer Engine
runs cuDNN's fused attention on Hopper), the others as ``gpu.other_attention_kernels`` (a stack or
``--attention-kernel`` selects them). The H100 tables are carried to the profiles of the same die (H200, H800).
Blackwell's published cuDNN speeds are causal only at head dim 128 (cudnn-frontend's SDPA training benchmark on
B200): :func:`fit_causal` fits B200's plateau and row cost per direction on them with the masked-tile cost, the
causal rate share and the head dimensions' ratio of the Hopper table (:data:`BLACKWELL`); GB200, the same die at a
higher datasheet clock, carries B200's table scaled by the two profiles' bf16 peaks, and its own newer cuDNN's speeds
are checks (they run faster still than the scaled table; GB200's GEMM curve, by contrast, runs at B200's rate: the
same layouts published on both show no clock advantage, hardware_profiles/gb200-nvl72.json).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from planner.cost.compute import FLASH_ATTN_BWD_RATIO, AttentionShape, attention_rate_flops, attention_work_factor
from planner.specs.hardware import (TFLOPS, AttentionKernel, derived_attention_kernel, hardware_profiles_dir,
                                    load_cluster)
from planner.validation.compare import relative_error

RUNS_FILE = Path(__file__).with_name("attention_kernels.json")
#: query rows per tile of the fitted kernels: FlashAttention-3's forward tile on Hopper for head dims 64-128
#: (hopper/tile_size.h: kBlockM = 128) and FlashAttention-2's on Ampere (Dao 2023, Sec. 3.3)
TILE_TOKENS = 128
#: row costs tried (tiles), the grid's step is the fit's resolution
ROW_GRID = np.round(np.arange(0.0, 16.0001, 0.01), 2)
MASK_GRID = np.round(np.arange(0.0, 4.0001, 0.02), 2)
CAUSAL_RATIO_GRID = np.round(np.arange(0.80, 1.0001, 0.005), 3)
#: the kernel id (``planner.specs.hardware.ATTENTION_KERNELS``) of each kernel name the published rows use
KERNEL_IDS = {"cuDNN": "cudnn", "FlashAttention-2": "flash-attention-2", "FlashAttention-3": "flash-attention-3"}
#: the shape at which a table's level is stated as one efficiency (the profile's ``attention_efficiency``): a
#: causal, head-dim-128 layer of 4,096 tokens, forward + backward (the shape of most published runs the profiles'
#: single efficiency described)
REFERENCE = {"head_dim": 128, "keys": 4096}
#: (profile, the kernel its table is fitted for, profiles of the same die that carry the table). The kernel is the
#: one the default stack runs there: Transformer Engine's
#: FusedAttention (cuDNN), its choice on Hopper unless FlashAttention-3 is installed beside it
#: (transformer_engine/pytorch/attention/dot_product_attention/utils.py, get_attention_backend)
TARGETS = (("h100-80gb-sxm", "cuDNN", ("h200-141gb-sxm", "h800-80gb-sxm", "h100-96gb-hbm2e")),)
#: what a table carried to a profile of the same die says of it: the speeds at the datasheet clocks, which a
#: power-capped part runs at its ``gpu.sustained_tensor_ratio`` of
SAME_DIE_NOTE = "same GH100 die: not refitted (at the datasheet clocks; a power limit is gpu.sustained_tensor_ratio)"
#: Blackwell: (profile fitted on causal rows, its kernel, the profile whose fitted table lends the costs the causal
#: rows cannot separate, profiles of the same die that carry the table scaled by their bf16 peak)
BLACKWELL = (("b200-180gb", "cuDNN", "h100-80gb-sxm", ("gb200-nvl72", "gb300-nvl72", "b300-288gb")),)
#: Blackwell Ultra: profile -> the Blackwell profile whose speeds its own are measured against. Its doubled softmax
#: exponent units run attention faster than its bf16 peak says; per direction, the geometric mean of its published
#: speed over the other's at the same cuDNN release and shapes (the rows marked "ratio", each naming its pair in
#: ``ratio_to``) scales the table further (:func:`ultra_ratios`)
ULTRA = {"gb300-nvl72": "gb200-nvl72", "b300-288gb": "b200-180gb"}
#: Blackwell Ultra profiles without a measured pair of their own, and the one whose measured gain they carry (the HGX
#: B300 is the GB300's die: the same exponent units over the same tensor cores)
ULTRA_CARRIED = {"b300-288gb": "gb300-nvl72"}
#: the ratio of a training step's attention to the benchmarked kernel per fitted profile: the profile's GEMM curve
#: ratio of fitted plateau to raw cuBLAS plateau (h100-80gb-sxm's matmul_efficiency source: 0.886); B200 carries
#: H100's, as no bf16 training row of B200 fits a GEMM curve of its own (its curve is the published cuBLAS plateau
#: times the same 0.886)
END_TO_END = {"h100-80gb-sxm": 0.886, "b200-180gb": 0.886}


def load_rows(path: Path = RUNS_FILE) -> list[dict]:
    return json.loads(path.read_text())["runs"]


@dataclass(frozen=True)
class KernelFit:
    profile: str
    kernel: AttentionKernel  # end_to_end_ratio 1: the kernel as benchmarked
    rows: tuple[str, ...]


def _shape(row: dict) -> AttentionShape:
    """The row's kernel shape over all its sequence lengths (an array of keys); a row with a ``window`` is a
    sliding-window call (every layer of it windowed)."""
    window = float(row.get("window", 0))
    return AttentionShape(head_dim=row["head_dim"], keys=np.asarray(row["seq_lens"], dtype=float),
                          causal=row["causal"], window=window, window_share=1.0 if window else 0.0)


def predicted_tflops(kernel: AttentionKernel, row: dict) -> np.ndarray:
    """The kernel model's speed at each of ``row``'s sequence lengths, counted as the row counts it (attended
    FLOPs per second)."""
    return attention_rate_flops(kernel, _shape(row), row["direction"] == "backward") / TFLOPS


def _fit_plateau_and_row(row: dict) -> tuple[float, float]:
    """(plateau TFLOP/s, row cost) minimizing the squared relative error of an unmasked row."""
    y = np.asarray(row["tflops"], dtype=float)
    best = None
    for c in ROW_GRID:
        g = 1.0 / attention_work_factor(_shape(row), TILE_TOKENS, c, 0.0)  # speed / plateau
        plateau = float(np.sum(g / y) / np.sum(g * g / (y * y)))
        err = float(np.sum((plateau * g / y - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, plateau, float(c))
    return best[1], best[2]


def kernels(profile: str, rows: list[dict] | None = None) -> list[str]:
    """The kernels with fitting rows on ``profile``, in file order."""
    names = [r["kernel"] for r in (rows if rows is not None else load_rows())
             if r["profile"] == profile and r["use"] == "fit"]
    return list(dict.fromkeys(names))


def fit(profile: str, kernel_name: str, rows: list[dict] | None = None, causal_share: bool = True) -> KernelFit:
    """Fit ``kernel_name``'s table on ``profile``'s fitting rows; ``causal_share=False`` holds causal calls at the
    unmasked rate (the model without :func:`planner.cost.compute.causal_rate_ratio`, for comparison)."""
    rows = [r for r in (rows if rows is not None else load_rows())
            if r["profile"] == profile and r["kernel"] == kernel_name and r["use"] == "fit"]
    open_rows = [r for r in rows if not r["causal"]]
    dims = sorted({r["head_dim"] for r in open_rows})
    table = {}
    for direction in ("forward", "backward"):
        for hd in dims:
            [row] = [r for r in open_rows if r["direction"] == direction and r["head_dim"] == hd]
            table[direction, hd] = _fit_plateau_and_row(row)

    def kernel(mask_extra: float, causal_ratio: float) -> AttentionKernel:
        return AttentionKernel(
            name=KERNEL_IDS[open_rows[0]["kernel"]], tile_tokens=TILE_TOKENS, head_dims=tuple(float(d) for d in dims),
            fwd_plateau_flops=tuple(table["forward", d][0] * TFLOPS for d in dims),
            fwd_row_overhead_tiles=tuple(table["forward", d][1] for d in dims),
            bwd_plateau_flops=tuple(table["backward", d][0] * TFLOPS for d in dims),
            bwd_row_overhead_tiles=tuple(table["backward", d][1] for d in dims),
            masked_tile_extra=mask_extra, end_to_end_ratio=1.0, causal_plateau_ratio=causal_ratio)

    causal = [r for r in rows if r["causal"]]

    def masked_error(dr: tuple[float, float]) -> float:
        return sum(float(np.sum((predicted_tflops(kernel(*dr), r) / np.asarray(r["tflops"]) - 1.0) ** 2))
                   for r in causal)

    d, ratio = min(((float(d), float(r)) for d in MASK_GRID for r in (CAUSAL_RATIO_GRID if causal_share else (1.0,))),
                   key=masked_error) \
        if causal else (0.0, 1.0)
    return KernelFit(profile, kernel(d, ratio), tuple(r["id"] for r in rows))


def fit_causal(profile: str, kernel_name: str, shape: AttentionKernel, rows: list[dict] | None = None) -> KernelFit:
    """Fit ``kernel_name``'s table on ``profile``'s causal fitting rows (one head dimension), the costs they cannot
    separate from ``shape`` (a fitted table of another GPU): the masked-tile cost and the causal rate share, and for
    ``shape``'s other head dimensions their plateau and row cost at ``shape``'s ratio to the fitted head dimension. Per
    direction, the plateau in closed form and the row cost on :data:`ROW_GRID`, least squares of the relative error
    (as :func:`fit` does on unmasked rows)."""
    rows = [r for r in (rows if rows is not None else load_rows())
            if r["profile"] == profile and r["kernel"] == kernel_name and r["use"] == "fit" and r["causal"]]
    [hd] = sorted({r["head_dim"] for r in rows})
    fitted = {}
    for direction in ("forward", "backward"):
        [row] = [r for r in rows if r["direction"] == direction]
        y = np.asarray(row["tflops"], dtype=float)
        best = None
        for c in ROW_GRID:
            g = shape.causal_plateau_ratio / attention_work_factor(_shape(row), TILE_TOKENS, c, shape.masked_tile_extra)
            plateau = float(np.sum(g / y) / np.sum(g * g / (y * y)))
            err = float(np.sum((plateau * g / y - 1.0) ** 2))
            if best is None or err < best[0]:
                best = (err, plateau * TFLOPS, float(c))
        fitted[direction] = best[1:]

    def plateaus(backward: bool) -> tuple[float, ...]:
        # the fitted head dimension's plateau, the others' at the lending table's ratio to it
        value = fitted["backward" if backward else "forward"][0]
        return tuple(value * float(shape.plateau_flops(d, backward) / shape.plateau_flops(hd, backward))
                     for d in shape.head_dims)

    def rows_cost(backward: bool, lent: tuple[float, ...]) -> tuple[float, ...]:
        # the fitted head dimension's row cost, the others' at the lending table's ratio to it
        value = fitted["backward" if backward else "forward"][1]
        at_hd = lent[shape.head_dims.index(hd)]
        return tuple(round(value * c / at_hd, 2) for c in lent)

    kernel = AttentionKernel(
        name=KERNEL_IDS[kernel_name], tile_tokens=TILE_TOKENS, head_dims=shape.head_dims,
        fwd_plateau_flops=plateaus(False), fwd_row_overhead_tiles=rows_cost(False, shape.fwd_row_overhead_tiles),
        bwd_plateau_flops=plateaus(True), bwd_row_overhead_tiles=rows_cost(True, shape.bwd_row_overhead_tiles),
        masked_tile_extra=shape.masked_tile_extra, end_to_end_ratio=1.0,
        causal_plateau_ratio=shape.causal_plateau_ratio)
    return KernelFit(profile, kernel, tuple(r["id"] for r in rows))


def row_errors(kernel: AttentionKernel, row: dict) -> list[float]:
    return [relative_error(e, m) for e, m in zip(predicted_tflops(kernel, row), row["tflops"])]


def reference_efficiency(kernel: AttentionKernel, peak_flops: float) -> float:
    """Useful-FLOP efficiency of forward + backward (1 : 2.5 FLOPs) at :data:`REFERENCE`, causal, no CP."""
    shape = AttentionShape(head_dim=REFERENCE["head_dim"], keys=REFERENCE["keys"], causal=True)
    times = (flops / float(attention_rate_flops(kernel, shape, backward))
             for backward, flops in ((False, 1.0), (True, FLASH_ATTN_BWD_RATIO)))
    return (1.0 + FLASH_ATTN_BWD_RATIO) / sum(times) / peak_flops


def _section(kernel: AttentionKernel, scale: float, ratio: float, provenance: dict,
             bwd_scale: float | None = None) -> dict:
    """A profile's ``attention_kernel`` entry: ``kernel`` at ``scale`` times its plateau rates (``bwd_scale`` for the
    backward's, where it differs)."""
    bwd_scale = scale if bwd_scale is None else bwd_scale
    return {
        "kernel": kernel.name,
        "tile_tokens": kernel.tile_tokens,
        "head_dims": list(kernel.head_dims),
        "forward": {"plateau_tflops": [round(v * scale / TFLOPS, 1) for v in kernel.fwd_plateau_flops],
                    "row_overhead_tiles": list(kernel.fwd_row_overhead_tiles)},
        "backward": {"plateau_tflops": [round(v * bwd_scale / TFLOPS, 1) for v in kernel.bwd_plateau_flops],
                     "row_overhead_tiles": list(kernel.bwd_row_overhead_tiles)},
        "masked_tile_extra": kernel.masked_tile_extra,
        "causal_plateau_ratio": kernel.causal_plateau_ratio,
        "end_to_end_ratio": ratio,
        **provenance,
    }


def _pct(errors) -> str:
    a = np.abs(np.asarray(errors))
    return f"mean {100 * a.mean():.1f}%, max {100 * a.max():.1f}%"


def _check_error(kernel: AttentionKernel, rows: list[dict], profile: str) -> str:
    """The kernel's error on ``profile``'s check rows of its kind ("none" without any)."""
    errs = [e for r in rows if r["profile"] == profile and r["use"] == "check"
            and KERNEL_IDS[r["kernel"]] == kernel.name for e in row_errors(kernel, r)]
    return _pct(errs) if errs else "none"


def _provenance(f: KernelFit, rows: list[dict]) -> dict:
    fitted = [e for r in rows if r["id"] in f.rows for e in row_errors(f.kernel, r)]
    method = ("planner/validation/attention_fit.py: per direction and head dimension, plateau and row cost "
              "least-squares on the unmasked rows; the masked-tile cost and the causal rate share on the causal rows")
    return {"fitted_on": list(f.rows), "method": method, "fit_error": _pct(fitted),
            "independent_check_error": _check_error(f.kernel, rows, f.profile)}


def write(fits: list[KernelFit], default: str, same_die: tuple[str, ...]) -> None:
    """Store ``fits`` (one profile's kernels) in it and the profiles of the same die: the ``default`` kernel's
    table as ``gpu.attention_kernel``, the others as ``gpu.other_attention_kernels``; a same-die profile's entry
    names where it comes from and its error on that profile's own check rows."""
    rows = load_rows()
    [main] = [f for f in fits if f.kernel.name == default]
    others = [f for f in fits if f is not main]
    profile = main.profile
    ratio = END_TO_END[profile]
    for name in (profile,) + same_die:
        path = hardware_profiles_dir() / f"{name}.json"
        data = json.loads(path.read_text())
        gpu = data["gpu"]

        def prov(f: KernelFit) -> dict:
            return _provenance(f, rows) if name == profile else \
                {"carried_from": profile, "note": SAME_DIE_NOTE,
                 "independent_check_error": _check_error(f.kernel, rows, name)}
        gpu["attention_kernel"] = _section(main.kernel, 1.0, ratio, prov(main))
        # releases derived from a table (``scaled_from``: their rate is fitted on training runs, planner.validation.fit)
        derived = [k for k in gpu.get("other_attention_kernels", []) if "scaled_from" in k]
        gpu["other_attention_kernels"] = [_section(f.kernel, 1.0, ratio, prov(f)) for f in others] + derived
        path.write_text(json.dumps(data, indent=2) + "\n")


def _scaled(kernel: AttentionKernel, scale: float, bwd_scale: float | None = None) -> AttentionKernel:
    """``kernel`` at ``scale`` times its plateau rates (the same die at another clock; ``bwd_scale`` for the
    backward's, where it differs)."""
    out = derived_attention_kernel(kernel, kernel.name, scale)
    if bwd_scale is None:
        return out
    return replace(out, bwd_plateau_flops=tuple(v * bwd_scale for v in kernel.bwd_plateau_flops))


def ultra_ratios(profile: str, rows: list[dict]) -> tuple[float, float]:
    """(forward, backward) speed of ``profile``'s attention over that of the profile it is measured against
    (:data:`ULTRA`): per direction, the geometric mean over the "ratio" rows' lengths of row / paired row; (1, 1)
    for a profile without such rows."""
    if profile in ULTRA_CARRIED:
        return ultra_ratios(ULTRA_CARRIED[profile], rows)
    by_id = {r["id"]: r for r in rows}
    logs: dict[bool, list[float]] = {False: [], True: []}
    for r in rows:
        if r["profile"] != profile or r["use"] != "ratio":
            continue
        base = by_id[r["ratio_to"]]
        if base["profile"] != ULTRA[profile] or base["seq_lens"] != r["seq_lens"] or \
                base["direction"] != r["direction"] or base["head_dim"] != r["head_dim"]:
            raise ValueError(f"attention row {r['id']}: ratio_to {base['id']} is not the same shape on "
                             f"{ULTRA[profile]}")
        logs[r["direction"] == "backward"] += list(np.log(np.asarray(r["tflops"], float) /
                                                          np.asarray(base["tflops"], float)))
    return tuple(float(np.exp(np.mean(logs[b]))) if logs[b] else 1.0 for b in (False, True))


def carried_scales(profile: str, lender: str, rows: list[dict]) -> tuple[float, float]:
    """(forward, backward) plateau scale of ``lender``'s fitted table in ``profile``: the two bf16 peaks' ratio,
    times Blackwell Ultra's measured attention gain (:func:`ultra_ratios`)."""
    peak = peak_scale(profile, lender)
    fwd, bwd = ultra_ratios(profile, rows)
    return peak * fwd, peak * bwd


def peak_scale(profile: str, carried_from: str) -> float:
    """The bf16 peak of ``profile`` over that of ``carried_from`` (the same die at another clock)."""
    return load_cluster(profile).gpu.peak_flops / load_cluster(carried_from).gpu.peak_flops


def write_blackwell(f: KernelFit, lender: str, scaled_to: tuple[str, ...]) -> None:
    """Store a :func:`fit_causal` table in its profile, and scaled by the bf16 peak in the same die's profiles,
    with the rows it was fitted on, what it carries from ``lender`` and, per profile, its error on that profile's
    check rows."""
    rows = load_rows()
    ratio = END_TO_END[f.profile]
    fit_err = [e for r in rows if r["id"] in f.rows for e in row_errors(f.kernel, r)]
    for name in (f.profile,) + scaled_to:
        scale, bwd_scale = (1.0, 1.0) if name == f.profile else carried_scales(name, f.profile, rows)
        provenance = {
            "fitted_on": list(f.rows),
            "method": "planner/validation/attention_fit.py fit_causal: per direction, plateau and row cost least-squares "
                      "on the causal rows of head dim 128; the masked-tile cost, the causal rate share and the other "
                      f"head dimensions' ratios of plateau and row cost to head dim 128 carried from {lender}'s fitted "
                      "table",
            "fit_error": _pct(fit_err),
            "independent_check_error": _check_error(_scaled(f.kernel, scale, bwd_scale), rows, name),
            "end_to_end_ratio_source": f"carried from {lender}: no bf16 training row of this GPU fits a GEMM curve"}
        if name in ULTRA:
            base, measured = ULTRA[name], ULTRA_CARRIED.get(name, name)
            fwd_u, bwd_u = ultra_ratios(name, rows)
            provenance["carried_from"] = f.profile
            peaks = peak_scale(name, f.profile)
            provenance["note"] = (
                f"Blackwell Ultra: {base}'s table (the B200 fit scaled by the bf16 peaks, {peaks:.4f}) times the "
                f"measured speed of {measured}'s attention over {ULTRA[measured]}'s at the same cuDNN release and "
                f"shapes, forward {fwd_u:.4f} and backward {bwd_u:.4f} (geometric means over the rows "
                + ", ".join(r["id"] for r in rows if r["profile"] == measured and r["use"] == "ratio")
                + "; planner.validation.attention_fit.ultra_ratios): the doubled softmax exponent units at the same "
                "dense BF16 rate")
        elif name != f.profile:
            provenance["carried_from"] = f.profile
            provenance["note"] = (f"same die: plateaus scaled by the bf16 peaks ({scale:.4f}), which this GPU's own "
                                  "newer cuDNN speeds exceed (the checks); its GEMM curve runs at the lender's rate")
        path = hardware_profiles_dir() / f"{name}.json"
        data = json.loads(path.read_text())
        data["gpu"]["attention_kernel"] = _section(f.kernel, scale, ratio, provenance, bwd_scale)
        data["gpu"].pop("other_attention_kernels", None)
        # the single efficiency (profiles without a table use it) is the table's at the reference shape
        level = reference_efficiency(f.kernel, load_cluster(f.profile).gpu.peak_flops) * ratio
        data["gpu"]["attention_efficiency"] = round(level, 3)
        data["gpu"]["attention_source"] = (
            "the fitted attention_kernel table's useful-FLOP efficiency at a causal head-dim-128 layer of 4,096 tokens, "
            "forward + backward, times its end-to-end ratio (planner/validation/attention_fit.py)")
        path.write_text(json.dumps(data, indent=2) + "\n")


def _print_table(k: AttentionKernel) -> None:
    for i, hd in enumerate(k.head_dims):
        print(f"  head dim {hd:g}: forward {k.fwd_plateau_flops[i] / TFLOPS:.1f} TFLOP/s, row "
              f"{k.fwd_row_overhead_tiles[i]:.2f} tiles; backward {k.bwd_plateau_flops[i] / TFLOPS:.1f}, row "
              f"{k.bwd_row_overhead_tiles[i]:.2f}")


def _print_rows(k: AttentionKernel, rows: list[dict]) -> None:
    for r in rows:
        errs = row_errors(k, r)
        print(f"  {r['id']:32} {r['use']:5} " + " ".join(f"{100 * e:+5.1f}%" for e in errs) + f"   ({_pct(errs)})")


def _print_reference(k: AttentionKernel, profile: str) -> None:
    print(f"  reference efficiency (x end-to-end {END_TO_END[profile]}): "
          f"{reference_efficiency(k, load_cluster(profile).gpu.peak_flops) * END_TO_END[profile]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="store the fitted tables in the profiles")
    args = ap.parse_args()
    rows = load_rows()
    for profile, stored, same_die in TARGETS:
        fits = []
        for name in kernels(profile, rows):
            f = fit(profile, name, rows)
            fits.append(f)
            k = f.kernel
            print(f"{profile}: {k.name}{' (the default table)' if name == stored else ''}, tile "
                  f"{k.tile_tokens:g}, masked-tile extra {k.masked_tile_extra:.2f}, causal rate share "
                  f"{k.causal_plateau_ratio:.3f}")
            _print_table(k)
            _print_rows(k, [r for r in rows if r["profile"] == profile and r["kernel"] == name])
            _print_reference(k, profile)
        if args.write:
            write(fits, KERNEL_IDS[stored], same_die)
    for profile, name, lender, scaled_to in BLACKWELL:
        f = fit_causal(profile, name, fit(lender, name, rows).kernel, rows)
        k = f.kernel
        print(f"{profile}: {k.name} fitted on its causal rows, costs carried from {lender}")
        _print_table(k)
        for other in (profile,) + scaled_to:
            _print_rows(k if other == profile else _scaled(k, *carried_scales(other, profile, rows)),
                        [r for r in rows if r["profile"] == other and r["kernel"] == name and r["use"] != "ratio"])
            if other in ULTRA:
                fwd_u, bwd_u = ultra_ratios(other, rows)
                print(f"  {other}: attention {fwd_u:.4f} x forward, {bwd_u:.4f} x backward of {ULTRA[other]}'s")
        _print_reference(k, profile)
        if args.write:
            write_blackwell(f, lender, scaled_to)


if __name__ == "__main__":
    main()
