"""Fit the few profile parameters the modern validation set determines, and report how well they generalize.

    python -m planner.validation.fit            # print the fits, in-sample and leave-one-source-out errors
    python -m planner.validation.fit --write    # and store each fitted value, with its rows, in the profiles

One parameter per (GPU, precision): the fraction of the bf16 GEMM efficiency (at equal duration) that the narrow
format's GEMMs reach (``GPU.low_precision_gemm_efficiency``). Physically: FP8 tensor-core GEMMs run at twice the
rate, so the same per-kernel overheads (tile quantization, epilogue, scaling-factor loads, launch) weigh twice as
much. It is fitted on the dense rows of that GPU and precision only, where the linear layers' GEMMs are most of the
step; MoE rows (all-to-all, grouped GEMMs: issue 10) and rows with context parallelism (ring attention's own
residual on H100) are left out of the fit. The fit minimizes the mean absolute
relative error of tokens/s per GPU over a grid of ratios. Leave-one-source-out: for each source (framework
release) the ratio is refit without its rows and the left-out rows are scored with it.

One parameter per derived attention-kernel release (:data:`KERNEL_TARGETS`): the speed of a kernel release no
published benchmark describes, as a ratio to a table that has one (``hardware.derived_attention_kernel``), fitted
on the rows that ran it. Where those rows come from one source, each row is also scored at the ratio refit without
it (leave one row out): the only refit one source allows.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from planner.cost.compute import alltoall_dispatch, biased_grouped_wgrad
from planner.specs.hardware import derived_attention_kernel, hardware_profiles_dir
from planner.specs.stack import DEFAULT_STACK, stacks_dir
from planner.validation.compare import evaluate_modern_run, load_modern_runs, modern_config, row_cluster, row_stack

#: (profile fitted, precision, profiles of the same die that carry the value unfitted)
TARGETS = (("h100-80gb-sxm", "fp8", ("h200-141gb-sxm", "h800-80gb-sxm", "h100-96gb-hbm2e")),
           ("b200-180gb", "fp8", ("gb200-nvl72", "b300-288gb")),
           ("b200-180gb", "mxfp8", ("gb200-nvl72", "b300-288gb")),
           ("gb300-nvl72", "fp8", ()),
           ("gb300-nvl72", "mxfp8", ()))
#: profiles that carry another die's values (:data:`TARGETS`, :data:`CALL_TARGETS`), and why: Blackwell Ultra (GB300,
#: B300) is another die than B200's, whose values it carries until runs of its own are fitted (GB300's GEMM ratios
#: are, on its dense rows: :data:`RATIO_NOTES`)
NOT_SAME_DIE = {name: "Blackwell Ultra (the B300 die, not B200's)" for name in ("gb300-nvl72", "b300-288gb")}
#: shares of a datasheet rate tried (the grid's step is the fit's resolution)
GRID = np.round(np.arange(0.50, 1.0001, 0.005), 3)
#: GEMM-efficiency ratios tried: past 1 too, for a part whose bf16 curve is carried from another (the profile
#: loader keeps the ratio times the curve's top under the narrow peak)
RATIO_GRID = np.round(np.arange(0.50, 1.2001, 0.005), 3)
#: what a fitted ratio stands for where it is not the narrow format's own overheads alone, as the profile says
RATIO_NOTES = {
    "gb300-nvl72": "a ratio above B200's (0.865 / 0.84) and above 1: GB300 carries B200's bf16 GEMM curve at its "
                   "datasheet rate (the same dense BF16 / FP8 rate as GB200), and its own fp8 GEMMs outrun it. Its "
                   "rows say so where the layout is GB200's: Llama 3 70B's fp8 preset (Megatron FSDP over 64 GPUs) ran "
                   "1.20-1.27x GB200's speed in four releases where the carried values gave 1.11x. Consistent with "
                   "its power limit (1.4 kW a GPU, GB200 1.2 kW, B200 1.0 kW: narrow-format tensor-core GEMMs are "
                   "the kernels a power limit clocks down first), not shown by a GEMM benchmark (the public maxima "
                   "found are bf16 and put GB300 no faster than GB200); HGX B300 (1.1 kW) keeps B200's values, on "
                   "which its mxfp8 transformer MoE rows read -15% to +4%",
}

#: expert GEMM issue time (``GPU.expert_gemm_call_s``): (profiles fitted together, precision, profiles that carry
#: the value unfitted, stack, rows by dispatcher). The Blackwell pair shares one value: the same Megatron-Core /
#: Transformer Engine path issues the expert GEMMs on either host; H800 does not carry H100's value: its one MoE row
#: runs DeepSeek's own HAI-LLM, not that path; bf16 is not fitted: its only MoE rows that the value moves are
#: GPT-OSS's, whose gap has causes the model lacks (attention sinks, the biased experts' host loop, the clamped
#: activation; README).
#: Each stack release is fitted on the rows that ran it: megatron-core's values (the current release, in the hardware
#: profiles) on the rows of the other containers, megatron-core-25.11's (in its stack file) on the NeMo 25.11 rows and
#: Blackwell's 26.02 rows, whose dropless path issued expert GEMMs more slowly (stacks/megatron-core-25.11.json says
#: how that was established). The current release's rows split by dispatcher: :data:`OTHERS` (the flex dispatcher's
#: DeepEP and HybridEP, and rows without expert parallelism) fit the per-call time, ``GPU.expert_gemm_call_s``;
#: :data:`ALLTOALL` (Megatron-Core's all-to-all dispatcher) fit, at that per-call time, what the dispatcher's host
#: sync adds per GEMM pass, ``GPU.expert_alltoall_sync_s`` (so an ALLTOALL target follows its OTHERS target). The
#: same containers ran the all-to-all layouts no faster in 26.02.01-26.04.01 than in 26.02 while the flex layouts
#: sped up (README, "The expert issue time follows the dispatcher")
ALLTOALL, OTHERS, EVERY = "alltoall", "others", "every"
CALL_TARGETS = ((("b200-180gb", "gb200-nvl72"), "mxfp8", ("gb300-nvl72", "b300-288gb"), DEFAULT_STACK, OTHERS),
                (("b200-180gb", "gb200-nvl72"), "mxfp8", ("gb300-nvl72", "b300-288gb"), DEFAULT_STACK, ALLTOALL),
                (("h100-80gb-sxm",), "fp8", ("h200-141gb-sxm", "h100-96gb-hbm2e"), DEFAULT_STACK, OTHERS),
                (("h100-80gb-sxm",), "fp8", ("h200-141gb-sxm", "h100-96gb-hbm2e"), DEFAULT_STACK, ALLTOALL),
                (("b200-180gb", "gb200-nvl72"), "mxfp8", (), "megatron-core-25.11", EVERY),
                (("h100-80gb-sxm",), "fp8", (), "megatron-core-25.11", EVERY))
#: issue times tried, microseconds per expert GEMM
CALL_GRID_US = np.arange(0.0, 400.0001, 5.0)
#: all-to-all sync times tried, microseconds per grouped expert GEMM pass
SYNC_GRID_US = np.arange(0.0, 4000.0001, 20.0)

#: attention-kernel releases priced as another table's shape at a fitted rate (``gpu.other_attention_kernels``
#: entries with ``scaled_from``): (profile, kernel, the table it is scaled from). cuDNN 9.0, the fused attention of
#: the NeMo 24.03 container (Transformer Engine 1.4 selects it on sm90), predates every published cuDNN table the
#: profile has (mid-2024 and later); Transformer Engine's own notes for that release put it 20-50% ahead of
#: flash-attn 2.4.2 on Hopper (docs/examples/attention/attention.ipynb at v1.7-v1.8), so it is scaled from the
#: FlashAttention-2 table (Shah et al. 2024's FlashAttention-2 bars)
KERNEL_TARGETS = (("h100-80gb-sxm", "cudnn-9.0", "flash-attention-2"),)
#: rate ratios tried
KERNEL_GRID = np.round(np.arange(1.0, 2.0001, 0.01), 2)

#: the stacks whose 16-bit grouped expert GEMMs take Transformer Engine's biased path (Megatron-Core's
#: TEGroupedMLP: GroupedLinear applies the first GEMM's bias and fuses its gradient into the weight-gradient GEMMs),
#: fitted together on the rows with biased experts they ran (``Stack.biased_grouped_wgrad_factor``); the same
#: Transformer Engine path in every release these rows ran, so one value, stored in each stack's file
WGRAD_STACKS = ("megatron-core", "megatron-core-25.11")
#: weight-gradient slowdowns tried
WGRAD_GRID = np.round(np.arange(1.0, 15.0001, 0.1), 2)

#: power-capped parts whose sustained tensor rate (``GPU.sustained_tensor_ratio``) is fitted, each on its rows that
#: isolate the GPU's rate: one-dimensional FSDP (no tensor, pipeline or context parallelism), dense
SUSTAIN_TARGETS = ("h100-96gb-hbm2e",)
#: the profile whose hybrid rows without expert layers fit the Mamba-2 SSD kernels' rate (``GPU.ssd_scan_flops``),
#: and the profiles that carry it, each with why: mamba_ssm's Triton SSD kernels run small tiles on CUDA cores' and
#: tensor cores' generic paths, so their rate is not the tensor cores' (the carried value's rows check it)
SSD_TARGET = "h100-80gb-sxm"
SSD_CARRIED = {**{name: "same GH100 die" for name in ("h200-141gb-sxm", "h800-80gb-sxm", "h100-96gb-hbm2e")},
               **{name: "Blackwell: the same Triton kernels, whose rate the tensor cores' does not set; its Nemotron 3 "
                        "Nano rows check the carried value" for name in ("b200-180gb", "gb200-nvl72", "b300-288gb",
                                                                       "gb300-nvl72")}}
SSD_SOURCE = ("mamba_ssm's chunked SSD (mamba_ssm/ops/triton/ssd_combined.py: five Triton kernels forward, eleven "
              "backward, which Megatron-Core's MambaMixer and Hugging Face's Nemotron-H call) over 64-256-token "
              "chunks: small matmul tiles between exponentials, cumulative sums and fp32 state passing, far from a "
              "GEMM's rate or the bytes' roofline. Fitted on a dense hybrid (Mamba-2, MLP and attention layers, no "
              "experts), so no expert GEMM issue time or all-to-all trades against it")
#: what the fitted value stands for, as the profile says
SUSTAIN_SOURCES = {
    "h100-96gb-hbm2e": "the torchtitan benchmarks ran these GPUs at 'the default 500W power limit, although tuning it "
                       "up to 700W TDP can potentially provide further speedups' and read their MFU against the SXM "
                       "peak knowing 'the actual peak TFLOPs number is between SXM and NVL, and we don't know its "
                       "exact value' (github pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md): the SMs "
                       "clock down to hold 500 W under tensor-core load, so every GEMM and attention kernel runs at "
                       "this share of the datasheet rate; HBM and links are not scaled",
}


@dataclass(frozen=True)
class Fit:
    profile: str
    precision: str
    value: float
    rows: tuple[str, ...]
    in_sample: tuple[float, ...]  # signed errors of the fitting rows at the fitted value
    loso: dict[str, tuple[float, ...]]  # per left-out source: its rows' errors with the ratio refit without them
    #: per left-out model family (expert-call fits): its rows' errors with the value refit without them
    lomo: dict[str, tuple[float, ...]] = field(default_factory=dict)
    #: the stack whose rows the value was fitted on (expert-call fits; the default stack's values live in the profiles)
    stack: str = DEFAULT_STACK
    #: which dispatcher's rows (expert-call fits: :data:`ALLTOALL`, :data:`OTHERS` or :data:`EVERY`)
    dispatchers: str = EVERY
    #: per left-out row (kernel-ratio fits, whose rows may be one source's): its error with the value refit without it
    loro: dict[str, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Param:
    """A fitted per-precision GPU parameter: its ``GPU`` field, the grid tried and the grid's unit in SI."""

    field: str
    grid: np.ndarray
    unit: float = 1.0

    def apply(self, cluster, precision: str, value: float):
        """``cluster`` with this field of ``precision`` set to ``value`` (in the grid's unit)."""
        values = dict(getattr(cluster.gpu, self.field))
        values[precision] = float(value) * self.unit
        return replace(cluster, gpu=replace(cluster.gpu, **{self.field: tuple(sorted(values.items()))}))


@dataclass(frozen=True)
class _KernelParam:
    """A derived attention-kernel release's rate ratio (:data:`KERNEL_TARGETS`): ``kernel`` as ``base``'s table at a
    trial ratio (precision-independent: attention runs in bf16)."""

    kernel: str
    base: str
    grid: np.ndarray = field(default_factory=lambda: KERNEL_GRID)

    def apply(self, cluster, precision: str, value: float):
        gpu = cluster.gpu
        base = gpu.attention_table(self.base)
        if base is None or base.name != self.base:
            raise ValueError(f"profile {cluster.name} has no {self.base} table to derive {self.kernel} from")
        others = tuple(k for k in gpu.other_attention_kernels if k.name != self.kernel)
        derived = derived_attention_kernel(base, self.kernel, float(value))
        return replace(cluster, gpu=replace(gpu, other_attention_kernels=others + (derived,)))


@dataclass(frozen=True)
class _GpuScalar:
    """A fitted GPU number of one value for every precision: the row's cluster (as its stack runs there) with
    ``GPU.<field>`` at a trial value (in the grid's unit; ``unit`` converts it to SI)."""

    field: str
    grid: np.ndarray
    unit: float = 1.0

    def apply(self, cluster, precision: str, value: float):
        return replace(cluster, gpu=replace(cluster.gpu, **{self.field: float(value) * self.unit}))


#: the stacks' biased grouped weight-gradient factor (:data:`WGRAD_STACKS`; the path exists in 16-bit only, where
#: the rows ran)
WGRAD = _GpuScalar("biased_grouped_wgrad_factor", WGRAD_GRID)
#: a power-capped part's sustained share of its datasheet tensor rate (:data:`SUSTAIN_TARGETS`; the clock every
#: tensor-core kernel runs at), on the GEMM ratios' grid
SUSTAIN = _GpuScalar("sustained_tensor_ratio", GRID)
#: the Mamba-2 SSD kernels' sustained FLOP rate (:data:`SSD_TARGET`), TFLOP/s tried
SSD = _GpuScalar("ssd_scan_flops", np.arange(5.0, 200.0001, 1.0), unit=1e12)


RATIO = _Param("low_precision_gemm_efficiency", RATIO_GRID)
CALL = _Param("expert_gemm_call_s", CALL_GRID_US, 1e-6)
SYNC = _Param("expert_alltoall_sync_s", SYNC_GRID_US, 1e-6)


def call_param(dispatchers: str) -> _Param:
    """The GPU field a :data:`CALL_TARGETS` entry fits: the all-to-all dispatcher's sync time, or the per-call time."""
    return SYNC if dispatchers == ALLTOALL else CALL


def _errors(runs: list[dict], param: _Param, precision: str, value: float) -> list[float]:
    """Signed errors of ``runs``, each on its own profile with ``param`` set to ``value``."""
    return [evaluate_modern_run(r, cluster=param.apply(row_cluster(r), precision, value)).error for r in runs]


def _best(runs: list[dict], param: _Param, precision: str) -> float:
    scores = [statistics.mean(abs(e) for e in _errors(runs, param, precision, x)) for x in param.grid]
    return float(param.grid[int(np.argmin(scores))])


def _left_out(runs: list[dict], key, param: _Param, precision: str) -> dict[str, tuple[float, ...]]:
    """Per group of ``key`` (a source, a model family): its rows' errors at the value refit on the other rows
    (groups whose removal leaves nothing are skipped)."""
    out = {}
    for k in sorted({key(r) for r in runs}):
        rest = [r for r in runs if key(r) != k]
        if rest:
            out[k] = tuple(_errors([r for r in runs if key(r) == k], param, precision, _best(rest, param, precision)))
    return out


@functools.lru_cache(maxsize=None)
def _model(ref: str):
    """The model a row's ``--model`` names, read once (a frozen spec) however many row filters ask."""
    from planner.specs.model import load_model

    return load_model(ref)


def _row_model(run: dict):
    from planner.validation.compare import modern_model_ref

    return _model(modern_model_ref(run))


def _is_moe(run: dict) -> bool:
    return _row_model(run).is_moe


def _is_hybrid(run: dict) -> bool:
    return bool(_row_model(run).mamba_heads)


def fitting_rows(profile: str, precision: str) -> list[dict]:
    """The dense rows of this GPU and precision without context parallelism (the rows the GEMM-efficiency ratio is
    fitted on), held-out rows (``held_out``: checks of a layer model with no fitted number of its own) aside. Rows
    with CP are checks, not fitting rows: on H100 they carry a residual of their own (+10-15% where the rows without
    CP sit within 5%, README), which a GEMM ratio must not absorb. Nor are rows whose attention kernel's speed is
    itself fitted (:data:`KERNEL_TARGETS`: NeMo 24.03's cuDNN 9.0), nor hybrid rows, whose Mamba-2 SSD kernels' rate
    is fitted on them (:func:`ssd_fitting_rows`): the two values would trade against each other."""
    derived = {kernel for _, kernel, _ in KERNEL_TARGETS}
    return [r for r in load_modern_runs() if r["cluster"] == profile and r["layout"]["precision"] == precision
            and not _is_moe(r) and not r.get("held_out") and r["layout"].get("cp", 1) == 1
            and r["layout"].get("attention_kernel", "") not in derived and not _is_hybrid(r)]


def runs_alltoall(run: dict) -> bool:
    """Whether a row's expert GEMMs follow Megatron-Core's all-to-all dispatcher, as the cost model marks them
    (``compute.alltoall_dispatch`` of its layout)."""
    return bool(alltoall_dispatch(modern_config(run)))


def call_fitting_rows(profiles: tuple[str, ...], precision: str, stack: str = DEFAULT_STACK,
                      dispatchers: str = EVERY) -> list[dict]:
    """The MoE rows of these GPUs and precision that ran ``stack`` (the rows its expert GEMM issue time is fitted
    on), those of the all-to-all dispatcher only or of the others only where ``dispatchers`` says so, held-out rows
    and rows whose stack runs one grouped kernel (``per_expert_gemm_calls`` false) aside."""
    return [r for r in load_modern_runs() if r["cluster"] in profiles and r["layout"]["precision"] == precision
            and _is_moe(r) and not r.get("held_out") and row_stack(r) == stack
            and r["layout"].get("per_expert_gemm_calls", True)
            and (dispatchers == EVERY or runs_alltoall(r) == (dispatchers == ALLTOALL))]


def kernel_fitting_rows(profile: str, kernel: str) -> list[dict]:
    """The rows of ``profile`` that ran attention-kernel release ``kernel`` (their layout's ``attention_kernel``):
    the rows its rate ratio is fitted on."""
    return [r for r in load_modern_runs() if r["cluster"] == profile and r["layout"].get("attention_kernel") == kernel
            and not r.get("held_out")]


def wgrad_fitting_rows() -> list[dict]:
    """The rows the biased grouped weight-gradient factor is fitted on: the rows of :data:`WGRAD_STACKS` whose
    layout takes Transformer Engine's biased 16-bit grouped path (``compute.biased_grouped_wgrad``: biased experts,
    per-expert GEMM calls, 16-bit; GPT-OSS), held-out rows aside."""
    from planner.specs.model import load_model
    from planner.validation.compare import modern_model_ref

    return [r for r in load_modern_runs() if row_stack(r) in WGRAD_STACKS and not r.get("held_out")
            and bool(biased_grouped_wgrad(load_model(modern_model_ref(r)), modern_config(r)))]


def sustain_fitting_rows(profile: str) -> list[dict]:
    """The rows a power-capped part's sustained tensor rate is fitted on: its dense rows without tensor, pipeline or
    context parallelism (one-dimensional FSDP or DDP: the step is the GPU's kernels and the data-parallel
    collectives hidden under them), held-out rows aside."""
    return [r for r in load_modern_runs() if r["cluster"] == profile and not r.get("held_out") and not _is_moe(r)
            and all(r["layout"].get(k, 1) == 1 for k in ("tp", "pp", "cp"))]


def ssd_fitting_rows(profile: str) -> list[dict]:
    """The rows the Mamba-2 SSD kernels' rate is fitted on: the hybrid rows of ``profile`` without expert layers
    (whose issue times and all-to-alls would trade against it), held-out rows aside."""
    return [r for r in load_modern_runs() if r["cluster"] == profile and not r.get("held_out") and _is_hybrid(r)
            and not _is_moe(r)]


def _fitted_sets() -> list[tuple[list[dict], _Param, str]]:
    """Every fitted value's rows, parameter and precision: :data:`TARGETS`' GEMM ratios, :data:`CALL_TARGETS`'
    expert GEMM issue times, then :data:`KERNEL_TARGETS`' kernel rate ratios (the rows :func:`fit`,
    :func:`fit_call` and :func:`fit_kernel` fit on; a kernel's ratio is the same at every precision, so its rows'
    own)."""
    return [(fitting_rows(profile, precision), RATIO, precision) for profile, precision, _ in TARGETS] + \
        [(call_fitting_rows(profiles, precision, stack, dispatchers), call_param(dispatchers), precision)
         for profiles, precision, _, stack, dispatchers in CALL_TARGETS] + \
        [(kernel_fitting_rows(profile, kernel), _KernelParam(kernel, base), "")
         for profile, kernel, base in KERNEL_TARGETS] + [(wgrad_fitting_rows(), WGRAD, "")] + \
        [(sustain_fitting_rows(profile), SUSTAIN, "") for profile in SUSTAIN_TARGETS] + \
        [(ssd_fitting_rows(SSD_TARGET), SSD, "")]


def fitted_row_ids() -> frozenset[str]:
    """The modern rows some fitted profile or stack value is fitted on: the in-sample rows. Every other row is out
    of sample: no fitted number was chosen to match it."""
    return frozenset(r["id"] for runs, _, _ in _fitted_sets() for r in runs)


@functools.lru_cache(maxsize=1)
def cross_validated_errors() -> dict[str, float]:
    """Each in-sample row's signed error at the value refit without its source (leave one source out, as
    :func:`fit` and :func:`fit_call` report it): the error the model would make on that row had its release never
    been seen. Where a fit's rows all come from one source, each row at the value refit without that row (leave one
    row out, :func:`fit_kernel`'s check); a row alone in its fit is absent (nothing is left to refit on)."""
    out: dict[str, float] = {}
    for runs, param, precision in _fitted_sets():
        group = row_id if len({source_of(r) for r in runs}) == 1 else source_of
        for key, errors in _left_out(runs, group, param, precision).items():
            out.update(zip((r["id"] for r in runs if group(r) == key), errors))
    return out


def row_id(run: dict) -> str:
    """A row's own id, for leave-one-row-out."""
    return run["id"]


def source_of(run: dict) -> str:
    """The source a row comes from, for leave-one-source-out: its framework release."""
    return run["framework"].split(" (")[0]


def family_of(run: dict) -> str:
    """The model family of a row, for leave-one-model-out: its model file without size or release suffixes."""
    return Path(run["model"]).stem.split("-")[0]


def fit(profile: str, precision: str) -> Fit:
    runs = fitting_rows(profile, precision)
    value = _best(runs, RATIO, precision)
    return Fit(profile, precision, value, tuple(r["id"] for r in runs), tuple(_errors(runs, RATIO, precision, value)),
               _left_out(runs, source_of, RATIO, precision))


def fit_call(profiles: tuple[str, ...], precision: str, stack: str = DEFAULT_STACK, dispatchers: str = EVERY) -> Fit:
    """The expert GEMM issue time (microseconds) of these profiles and precision under ``stack`` (after the
    ``dispatchers`` its rows ran), with leave-one-source-out and leave-one-model-family-out errors (each left-out
    group scored at the value refit on the rest)."""
    runs = call_fitting_rows(profiles, precision, stack, dispatchers)
    param = call_param(dispatchers)
    value = _best(runs, param, precision)
    return Fit("+".join(profiles), precision, value, tuple(r["id"] for r in runs),
               tuple(_errors(runs, param, precision, value)), _left_out(runs, source_of, param, precision),
               _left_out(runs, family_of, param, precision), stack, dispatchers)


def _scalar_fit(name: str, label: str, runs: list[dict], param, by_row: bool) -> Fit:
    """One value for every precision (``param``'s) fitted on ``runs``, with leave-one-source-out errors and, where
    ``by_row`` (rows that may all be one source's), leave-one-row-out errors."""
    value = _best(runs, param, "")
    return Fit(name, label, value, tuple(r["id"] for r in runs), tuple(_errors(runs, param, "", value)),
               _left_out(runs, source_of, param, ""), loro=_left_out(runs, row_id, param, "") if by_row else {})


def fit_kernel(profile: str, kernel: str, base: str) -> Fit:
    """The rate ratio of attention-kernel release ``kernel`` over ``base``'s table on ``profile``, with
    leave-one-source-out errors (``loso``) and leave-one-row-out errors (``loro``): its rows may all be one
    source's (a container's table), and leaving one row out is then the only refit."""
    return _scalar_fit(profile, "", kernel_fitting_rows(profile, kernel), _KernelParam(kernel, base), by_row=True)


def fit_wgrad() -> Fit:
    """The biased grouped weight-gradient factor of :data:`WGRAD_STACKS` on :func:`wgrad_fitting_rows`, with
    leave-one-source-out errors (each release's rows at the factor refit without them)."""
    return _scalar_fit("+".join(WGRAD_STACKS), "16-bit", wgrad_fitting_rows(), WGRAD, by_row=False)


def fit_ssd(profile: str = SSD_TARGET) -> Fit:
    """The Mamba-2 SSD kernels' rate (TFLOP/s) on :func:`ssd_fitting_rows`, with leave-one-source-out and
    leave-one-row-out errors (its rows may all be one source's)."""
    return _scalar_fit(profile, "", ssd_fitting_rows(profile), SSD, by_row=True)


def fit_sustain(profile: str) -> Fit:
    """The sustained share of ``profile``'s datasheet tensor rate on :func:`sustain_fitting_rows`, with
    leave-one-source-out and leave-one-row-out errors (its rows may all be one source's)."""
    return _scalar_fit(profile, "", sustain_fitting_rows(profile), SUSTAIN, by_row=True)


def _pct(errors) -> str:
    errors = list(errors)
    return f"mean {100 * statistics.mean(abs(e) for e in errors):.1f}%, max {100 * max(abs(e) for e in errors):.1f}%"


def _provenance(f: Fit, method: str, by_row: bool = False) -> dict:
    """A fitted value as the data files store it: the value, the rows it was fitted on, how, its in-sample errors
    and each source (and, ``by_row``, each row) left out."""
    loso_all = [e for errs in f.loso.values() for e in errs]
    entry = {"value": f.value, "fitted_on": list(f.rows), "method": method, "in_sample": _pct(f.in_sample),
             "leave_one_source_out": _pct(loso_all) if loso_all else "one source only: no left-out check"}
    if by_row:
        loro_all = [e for errs in f.loro.values() for e in errs]
        entry["leave_one_row_out"] = _pct(loro_all) if loro_all else "one row only: no left-out check"
    return entry


def write(f: Fit, carried_to: tuple[str, ...]) -> None:
    """Store the fitted value and its provenance in the profile (and, marked unfitted, in the same-die ones)."""
    entry = _provenance(f, f"planner/validation/fit.py: grid over [{RATIO_GRID[0]:.2f}, {RATIO_GRID[-1]:.2f}] step "
                           "0.005, least mean |error| of tokens/s per GPU on these rows")
    if f.profile in RATIO_NOTES:
        entry["note"] = RATIO_NOTES[f.profile]
    _store(f, _same_die(f, carried_to, "tensor cores"), "low_precision_gemm_efficiency", entry)


def write_call(f: Fit, carried_to: tuple[str, ...]) -> None:
    """Store a fitted expert GEMM issue time (``gpu.expert_gemm_call_us``, or the all-to-all dispatcher's
    ``gpu.expert_alltoall_sync_us``) in the profiles fitted together (and, marked unfitted, in those that carry
    it)."""
    lomo_all = [e for errs in f.lomo.values() for e in errs]
    grid = call_param(f.dispatchers).grid
    what = ", at the per-call time of the rows of the other dispatchers" if f.dispatchers == ALLTOALL else ""
    entry = _provenance(f, f"planner/validation/fit.py: grid over [0, {grid[-1]:.0f}] us step {grid[1] - grid[0]:g}, "
                           "least mean |error| of tokens/s per GPU on these rows (the MoE rows of "
                           + ", ".join(f.profile.split("+")) + " in this precision that ran stack "
                           f"{f.stack}{_DISPATCHER_WORDS[f.dispatchers]}, all with Megatron-Core and Transformer "
                           f"Engine's grouped GEMM{what})")
    entry["leave_one_model_family_out"] = _pct(lomo_all) if lomo_all else "one model family only: no left-out check"
    if f.stack != DEFAULT_STACK:  # another release's value: in its stack file, by profile
        def put(data: dict) -> None:
            for name in f.profile.split("+"):
                data.setdefault("expert_gemm_call_us", {}).setdefault(name, {})[f.precision] = entry

        _update_json(stacks_dir() / f"{f.stack}.json", put)
        return
    _store(f, _same_die(f, carried_to, "host software path (Megatron-Core, Transformer Engine)"),
           "expert_alltoall_sync_us" if f.dispatchers == ALLTOALL else "expert_gemm_call_us", entry)


def write_kernel(f: Fit, kernel: str, base: str) -> None:
    """Store a fitted kernel rate ratio as the ``gpu.other_attention_kernels`` entry of ``kernel`` (replacing it)."""
    entry = {"kernel": kernel, "scaled_from": base,
             "rate_ratio": _provenance(f, "planner/validation/fit.py: grid over [1.00, 2.00] step 0.01, least "
                                          "mean |error| of tokens/s per GPU on these rows (the rows of "
                                          f"{f.profile} that ran {kernel})", by_row=True),
             "source": KERNEL_SOURCES[kernel]}

    def put(data: dict) -> None:
        kernels = [k for k in data["gpu"].get("other_attention_kernels", []) if k.get("kernel") != kernel]
        data["gpu"]["other_attention_kernels"] = kernels + [entry]

    _update_json(hardware_profiles_dir() / f"{f.profile}.json", put)


def write_wgrad(f: Fit) -> None:
    """Store the fitted biased grouped weight-gradient factor, with its rows and checks, in each of
    :data:`WGRAD_STACKS`' files (``biased_grouped_wgrad_factor``)."""
    entry = _provenance(f, "planner/validation/fit.py fit_wgrad: grid over [1, 15] step 0.1, least mean |error| of "
                           "tokens/s per GPU on these rows (the 16-bit MoE rows with biased experts, GPT-OSS, of "
                           "stacks " + ", ".join(WGRAD_STACKS) + "; Blackwell Ultra's rows held out)")

    def put(data: dict) -> None:  # the new fit, keeping the file's hand-written source after its value
        kept = {k: v for k, v in data.get("biased_grouped_wgrad_factor", {}).items() if k == "source"}
        data["biased_grouped_wgrad_factor"] = {"value": entry["value"], **kept, **entry}

    for stack in WGRAD_STACKS:
        _update_json(stacks_dir() / f"{stack}.json", put)


def write_sustain(f: Fit) -> None:
    """Store a fitted sustained tensor rate, with its rows and checks, as the profile's
    ``gpu.sustained_tensor_ratio``."""
    entry = _provenance(f, "planner/validation/fit.py fit_sustain: grid over [0.50, 1.00] step 0.005, least mean "
                           f"|error| of tokens/s per GPU on these rows (the dense rows of {f.profile} without tensor, "
                           "pipeline or context parallelism; its other rows held out)", by_row=True)
    entry["source"] = SUSTAIN_SOURCES[f.profile]

    def put(data: dict) -> None:
        data["gpu"]["sustained_tensor_ratio"] = entry

    _update_json(hardware_profiles_dir() / f"{f.profile}.json", put)


def write_ssd(f: Fit) -> None:
    """Store the fitted SSD kernel rate, with its rows and checks, as ``gpu.ssd_scan_tflops`` of the fitted profile,
    and marked carried, with why, in :data:`SSD_CARRIED`'s."""
    entry = _provenance(f, "planner/validation/fit.py fit_ssd: grid over [5, 200] TFLOP/s step 1, least mean |error| "
                           f"of tokens/s per GPU on these rows (the hybrid rows of {f.profile} without expert layers)",
                        by_row=True)
    entry["source"] = SSD_SOURCE
    _store(f, SSD_CARRIED, "ssd_scan_tflops", entry, per_precision=False)


#: what each derived kernel release is, as its profile entry says
KERNEL_SOURCES = {
    "cudnn-9.0": "cuDNN 9.0's fused flash attention (cuDNN sub-backend 1), as the NeMo 24.03 container ran it: "
                 "Transformer Engine 1.4 selects FusedAttention over FlashAttention on sm90 "
                 "(transformer_engine/pytorch/attention.py @ v1.4, 'Select FusedAttention on sm90'). No benchmark of "
                 "that release is published; Transformer Engine's notes put it 20-50% ahead of flash-attn 2.4.2 on "
                 "Hopper ('As of Transformer Engine 1.7, cuDNN 9.0 and flash-attn 2.4.2 ... cuDNN attention has 20-50% "
                 "advantages on Hopper architectures', docs/examples/attention/attention.ipynb @ v1.7), so it is "
                 "FlashAttention-2's table (tile, row and masked-tile costs) at a rate ratio fitted on the runs that "
                 "used it",
}


#: how a fit's method names the dispatcher its rows ran
_DISPATCHER_WORDS = {EVERY: "", ALLTOALL: " with Megatron-Core's all-to-all dispatcher",
                     OTHERS: " with another dispatcher (DeepEP, HybridEP) or without expert parallelism"}


def _update_json(path: Path, change) -> None:
    """Apply ``change`` (a function that edits the parsed object in place) to the JSON file at ``path``, rewritten
    with two-space indentation as the shipped data files are."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _same_die(f: Fit, carried_to: tuple[str, ...], shared: str) -> dict[str, str]:
    """Why each profile of ``carried_to`` carries ``f``'s value: the same die and ``shared`` part, or the other die
    (:data:`NOT_SAME_DIE`) whose values it carries until its own runs are fitted."""
    return {name: (f"{NOT_SAME_DIE[name]}, carrying the {shared} of {f.profile}" if name in NOT_SAME_DIE else
                   f"same die and {shared} as {f.profile}") for name in carried_to}


def _store(f: Fit, carried: dict[str, str], section: str, entry: dict, per_precision: bool = True) -> None:
    """Store ``entry`` under ``gpu.<section>`` (``.<precision>`` where ``per_precision``) of the profiles fitted
    together, and in each profile of ``carried`` a note naming the fitted profile and why it carries the value."""
    fitted = tuple(f.profile.split("+"))
    for name in fitted + tuple(carried):
        e = dict(entry) if name in fitted else {
            "value": f.value, "carried_from": f.profile, "why": f"{carried[name]}; not fitted on this GPU's runs"}

        def put(data: dict, e=e) -> None:
            if per_precision:
                data["gpu"].setdefault(section, {})[f.precision] = e
            else:
                data["gpu"][section] = e

        _update_json(hardware_profiles_dir() / f"{name}.json", put)


def _report(f: Fit, headline: str, groups: tuple[tuple[str, dict], ...]) -> None:
    """Print one fit: its headline (value and rows), its in-sample errors and each left-out group's."""
    print(f"{headline} on {len(f.rows)} rows ({', '.join(f.rows)})")
    print(f"  in-sample: {_pct(f.in_sample)}")
    for kind, left_out in groups:
        for key, errs in left_out.items():
            print(f"  left out {kind}{key}: {', '.join(f'{100 * e:+.1f}%' for e in errs)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="store the fitted values in hardware_profiles/")
    args = ap.parse_args()
    for profile, precision, carried in TARGETS:
        f = fit(profile, precision)
        _report(f, f"{profile} {precision}: gemm efficiency ratio {f.value:.3f}", (("", f.loso),))
        if args.write:
            write(f, carried)
    for profiles, precision, carried, stack, dispatchers in CALL_TARGETS:
        f = fit_call(profiles, precision, stack, dispatchers)
        which = "" if dispatchers == EVERY else f", {dispatchers} dispatchers"
        what = "all-to-all sync time" if dispatchers == ALLTOALL else "expert GEMM issue time"
        _report(f, f"{f.profile} {precision} ({stack}{which}): {what} {f.value:.0f} us",
                (("source ", f.loso), ("model family ", f.lomo)))
        if args.write:
            write_call(f, carried)
    for profile, kernel, base in KERNEL_TARGETS:
        f = fit_kernel(profile, kernel, base)
        _report(f, f"{profile} {kernel}: rate {f.value:.2f} x {base}'s table", (("source ", f.loso), ("row ", f.loro)))
        if args.write:
            write_kernel(f, kernel, base)
    f = fit_wgrad()
    _report(f, f"{f.profile} {f.precision}: biased grouped weight-gradient factor {f.value:.1f}",
            (("source ", f.loso),))
    if args.write:
        write_wgrad(f)
    f = fit_ssd()
    _report(f, f"{f.profile}: Mamba-2 SSD kernels at {f.value:.0f} TFLOP/s", (("source ", f.loso), ("row ", f.loro)))
    if args.write:
        write_ssd(f)
    for profile in SUSTAIN_TARGETS:
        f = fit_sustain(profile)
        _report(f, f"{profile}: sustained tensor rate {f.value:.3f} of the datasheet's",
                (("source ", f.loso), ("row ", f.loro)))
        if args.write:
            write_sustain(f)


if __name__ == "__main__":
    main()
