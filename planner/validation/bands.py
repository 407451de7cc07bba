"""How sure an estimate is: the error the model makes on published runs like it.

    python -m planner.validation.bands           # print the bands from the validation sets
    python -m planner.validation.bands --write   # store them in error_bands.json (what estimates read)

A band is the mean absolute error (and, beside it, the mean signed error: whether the model reads such runs too fast
or too slow) of one cell of the validation residuals, each row a fitted value is chosen on scored at that value
refit without the row's source (``fit.cross_validated_errors``: the error a run of an unseen release meets; in a fit
of one source, at the value refit without the row; a row alone in its fit keeps its own): GPU family (A100: the
papers' set; H100 / H200 / H800; B200 / GB200), GEMM precision class (16-bit or 8-bit), dense or MoE, and with or
without context parallelism (the H100 rows with ring CP are 7-17% optimistic where those without are within 4%: a
plan with CP should not borrow the others' band), Ulysses CP a kind of its own (no published run has it: such a plan
gets the nearest coarser band, marked as not its kind). An estimate takes the band of its cell, or of the nearest
coarser cell that has rows (GPU family and precision, then precision and kind, then every modern row), and says
which it took. Within its own cell, a model family (the config's ``model_type``) with at least
:data:`FAMILY_MIN_ROWS` published runs there is a band of its own: an estimate of GPT-OSS on B200 in bf16 takes
GPT-OSS's rows of that cell, not the cell's mix, and a DeepSeek-V3 estimate in the same cell, whose family has fewer
runs there, takes the cell's. The bands are data computed from the sets (a test recomputes them), so they move when
the model or the sets do.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

BANDS_FILE = Path(__file__).with_name("error_bands.json")
#: published runs of one model family in one cell that make a band of their own (fewer: the cell's band stands)
FAMILY_MIN_ROWS = 3


@dataclass(frozen=True)
class Band:
    label: str  # which rows: e.g. "H100 / H200 / H800, fp8, dense"
    mean_abs_error: float
    rows: int
    exact: bool  # the estimate's own cell (False: a coarser one, or none of this GPU)
    #: the rows' mean signed error (estimated over measured, less 1): > 0 where the model reads such runs too fast
    mean_signed_error: float = 0.0

    def to_dict(self) -> dict:
        return {"group": self.label, "mean_abs_error": self.mean_abs_error, "rows": self.rows,
                "same_kind_of_run": self.exact, "mean_signed_error": self.mean_signed_error}


def gpu_family(gpu_name: str) -> str | None:
    name = gpu_name.upper()
    for key, family in (("A100", "A100"), ("H100", "H100 / H200 / H800"), ("H200", "H100 / H200 / H800"),
                        ("H800", "H100 / H200 / H800"), ("GB200", "B200"), ("B200", "B200"),
                        ("GB300", "B300 / GB300"), ("B300", "B300 / GB300")):
        if key in name:
            return family
    return None


def precision_class(precision: str) -> str:
    return "fp8" if precision in ("fp8", "mxfp8") else "16-bit"


def kind_label(moe: bool, cp: bool, cp_kind: str = "ring", vision: bool = False) -> str:
    """A band cell's kind: dense or MoE, with context parallelism or not; Ulysses CP (all-to-alls of heads, no ring)
    is a kind of its own, so an estimate of it never borrows the ring rows' band as "runs like this one", and so is a
    model with a vision encoder (LLaVA, Llama 3.2 Vision), of which no published run is in the validation set."""
    kind = ("MoE" if moe else "dense") + ((" with Ulysses CP" if cp_kind == "ulysses" else " with CP") if cp else "")
    return kind + (" vision-language" if vision else "")


def _summary(errors: list[float]) -> dict:
    return {"mean_abs_error": round(statistics.mean(abs(e) for e in errors), 4),
            "mean_signed_error": round(statistics.mean(errors), 4)}


def compute_bands() -> dict:
    """Every cell's rows and mean |error|, from the papers' set and the modern set, and within a cell each model
    family (``model_type``) with at least :data:`FAMILY_MIN_ROWS` modern rows there."""
    from planner.validation.compare import load_modern_runs, validate, validate_modern
    from planner.validation.fit import cross_validated_errors

    cells: dict[tuple[str, str, str], list[tuple[str, float]]] = {}
    for row in validate():
        if row.heldout:
            continue  # the held-out Llama 3 rows check generalization; they are not a band
        cells.setdefault(("A100", "16-bit", "dense"), []).append((row.id, row.error))
    runs = {r["id"]: r for r in load_modern_runs()}
    left_out = cross_validated_errors()
    families: dict[tuple[str, str, str], dict[str, list[tuple[str, float]]]] = {}
    for row in validate_modern():
        if row.estimated is None:
            continue
        run = runs[row.id]
        moe = "MoE" if "MoE" in row.groups else "dense"  # compare.row_groups: the model has routed experts
        kind = kind_label(moe == "MoE", "context parallel" in row.groups, run["layout"].get("cp_kind", "ring"))
        key = (gpu_family(run["gpu"]) or run["gpu"], precision_class(run["layout"]["precision"]), kind)
        error = left_out.get(row.id, row.error)
        cells.setdefault(key, []).append((row.id, error))
        families.setdefault(key, {}).setdefault(row.model_type, []).append((row.id, error))
    out = []
    for k, v in sorted(cells.items()):
        band = {"gpu": k[0], "precision": k[1], "kind": k[2], "rows": [i for i, _ in v], **_summary([e for _, e in v])}
        own = {t: {"rows": [i for i, _ in f], **_summary([e for _, e in f])}
               for t, f in sorted(families.get(k, {}).items()) if len(f) >= FAMILY_MIN_ROWS}
        out.append({**band, **({"model_families": own} if own else {})})
    return {"bands": out}


def _load() -> list[dict]:
    return json.loads(BANDS_FILE.read_text())["bands"]


def band_for(gpu_name: str, precision: str, moe: bool, cp: bool = False, cp_kind: str = "ring",
             vision: bool = False, model_type: str = "") -> Band:
    """The band of an estimate of a run on this GPU at this precision, dense or MoE, with context parallelism (CP
    > 1, of ``cp_kind``: ring or ulysses) or not, of a model with a vision encoder (``vision``) or not; the band of
    the model's own family (``model_type``) in that cell where it has one."""
    bands = _load()
    family, prec, kind = gpu_family(gpu_name), precision_class(precision), kind_label(moe, cp, cp_kind, vision)
    cell = [b for b in bands if (b["gpu"], b["precision"], b["kind"]) == (family, prec, kind)]
    own = [b["model_families"][model_type] for b in cell if model_type in b.get("model_families", {})]
    if own:
        return Band(f"{family}, {prec}, {kind}, {model_type} runs", own[0]["mean_abs_error"], len(own[0]["rows"]),
                    True, own[0]["mean_signed_error"])

    def pooled(cells: list[dict], label: str, exact: bool) -> Band | None:
        if not cells:
            return None
        n = sum(len(c["rows"]) for c in cells)
        mean = sum(c["mean_abs_error"] * len(c["rows"]) for c in cells) / n
        signed = sum(c["mean_signed_error"] * len(c["rows"]) for c in cells) / n
        return Band(label, round(mean, 4), n, exact, round(signed, 4))

    modern = [b for b in bands if b["gpu"] != "A100"]
    for cells, label, exact in (
            (cell, f"{family}, {prec}, {kind}", True),
            ([b for b in bands if (b["gpu"], b["precision"]) == (family, prec)], f"{family}, {prec}", False),
            ([b for b in modern if b["precision"] == prec and b["kind"] == kind], f"any GPU, {prec}, {kind}", False),
            (modern, "every modern run", False)):
        band = pooled(cells, label, exact)
        if band is not None:
            return band
    raise ValueError("no validation bands")  # the shipped file always has rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"store the bands in {BANDS_FILE.name}")
    args = ap.parse_args()
    data = compute_bands()
    for b in data["bands"]:
        print(f"{b['gpu']:12s} {b['precision']:7s} {b['kind']:14s} {len(b['rows']):2d} rows  "
              f"mean |error| {100 * b['mean_abs_error']:.1f}%, mean error {100 * b['mean_signed_error']:+.1f}%")
    if args.write:
        data["generated_by"] = "python -m planner.validation.bands --write"
        BANDS_FILE.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
