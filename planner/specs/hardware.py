"""Hardware as small composable parts: a GPU (processor + memory), the link inside a node, the network between
nodes, and a cluster that puts them together. Profiles are data files in ``hardware_profiles/``; this module only
reads them. Units in the files carry their unit in the key (``_tflops``, ``_gb_s``, ``_us``, ``_gib``); the
dataclasses hold SI units (FLOP/s, bytes, bytes/s, seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import PlannerError
from planner.specs.collectives import DEFAULT_COLLECTIVE_LIBRARY, CollectiveLibrary, load_collective_library
from planner.specs.config import per_precision
from planner.specs.model import MAX_CONFIG_INT, _data_dir, _resolve, read_json_file

#: GEMM precisions narrower than bf16 a profile may give a dense peak for (``peak_<name>_tflops``)
LOW_PRECISIONS = ("fp16", "fp8", "mxfp8")
GIB = 1024**3
GB = 1e9
TFLOPS = 1e12
US = 1e-6
#: largest number accepted in a profile, in the unit its key names: no real TFLOP/s, GiB, GB/s, TB/s or us value
#: comes near it, and larger ones overflow to infinity once converted to SI units
MAX_PROFILE_NUMBER = 1e12
#: smallest positive number accepted where a field must be positive: no real peak, bandwidth or efficiency comes
#: near it, and smaller ones make a step time overflow to infinity
MIN_PROFILE_NUMBER = 1e-6


@dataclass(frozen=True)
class EfficiencyCurve:
    """Achieved fraction of peak FLOP/s as a function of one GEMM's FLOPs (piecewise linear in log10(flops))."""

    log10_flops: tuple[float, ...]
    efficiency: tuple[float, ...]

    @cached_property
    def _points(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.log10_flops, dtype=float), np.asarray(self.efficiency, dtype=float)

    def __call__(self, flops):
        """Efficiency at ``flops`` (a number or an array of them): linear in log10(flops) between the points, flat
        outside them (and the first point's value for no FLOPs)."""
        xs, es = self._points
        flops = np.asarray(flops, dtype=float)
        x = np.log10(np.where(flops > 0, flops, 10.0 ** xs[0]))
        return np.interp(x, xs, es)


#: the attention kernels a stack or ``--attention-kernel`` can name, as profiles' tables are keyed: cuDNN's fused
#: attention (Transformer Engine's FusedAttention; PyTorch SDPA's cuDNN backend), FlashAttention-2 (the flash-attn 2
#: package; PyTorch SDPA's flash backend), FlashAttention-3 (flash-attn's Hopper kernels)
ATTENTION_KERNELS = ("cudnn", "cudnn-9.0", "flash-attention-2", "flash-attention-3")


@dataclass(frozen=True)
class AttentionKernel:
    """A fused attention kernel's speed as a function of its shape (FlashAttention's tiling: Dao 2023, Sec. 3.1;
    Shah et al. 2024, Sec. 3): queries in tiles of ``tile_tokens`` rows, each query tile walks the key tiles it
    attends; a tile of keys costs one unit at the head dimension's plateau rate, a query-tile row pays a fixed
    ``row_overhead_tiles`` (loading Q, the softmax epilogue, writing O and its log-sum-exp), and a tile cut by a
    mask (the causal diagonal, a sliding window's edge) ``masked_tile_extra`` more. Per direction (forward,
    backward) and head dimension (``head_dims``, interpolated in log2 between them, flat outside), fitted on the
    kernel's published speed (``planner/validation/attention_kernels.json``, ``planner.validation.attention_fit``);
    the profile lists the rows. ``end_to_end_ratio`` carries a kernel benchmark into a training step (the same
    ratio of fitted to raw plateau as the GPU's GEMM curve). ``causal_plateau_ratio``: the rate of a causal call's
    full tiles relative to an unmasked call's (published causal kernels top out 5-10% below their unmasked speed
    at 16K tokens, where the diagonal is under 1% of the tiles: query-tile rows of unequal length finish unevenly
    and every tile runs the mask's bound checks); fitted with ``masked_tile_extra`` on the causal rows. ``name``:
    the kernel's id (``ATTENTION_KERNELS``), which a stack or ``--attention-kernel`` selects."""

    name: str
    tile_tokens: float
    head_dims: tuple[float, ...]
    fwd_plateau_flops: tuple[float, ...]
    fwd_row_overhead_tiles: tuple[float, ...]
    bwd_plateau_flops: tuple[float, ...]
    bwd_row_overhead_tiles: tuple[float, ...]
    masked_tile_extra: float
    end_to_end_ratio: float
    causal_plateau_ratio: float = 1.0

    def _at(self, values: tuple[float, ...], head_dim):
        return np.interp(np.log2(np.asarray(head_dim, dtype=float)), np.log2(np.asarray(self.head_dims)),
                         np.asarray(values, dtype=float))

    def plateau_flops(self, head_dim, backward: bool = False):
        """FLOP/s the kernel reaches on long, unmasked rows at ``head_dim`` (times the end-to-end ratio)."""
        return self._at(self.bwd_plateau_flops if backward else self.fwd_plateau_flops, head_dim) * \
            self.end_to_end_ratio

    def row_overhead_tiles(self, head_dim, backward: bool = False):
        return self._at(self.bwd_row_overhead_tiles if backward else self.fwd_row_overhead_tiles, head_dim)


def derived_attention_kernel(base: AttentionKernel, name: str, rate_ratio: float) -> AttentionKernel:
    """Kernel ``name``: another release of an attention kernel that walks the same tiles as ``base`` (the same
    tile, row and masked-tile costs, Dao 2023 Sec. 3.1) at ``rate_ratio`` times its plateau rates. A profile gives
    one where no published benchmark of that release exists but the runs that used it pin its speed against a
    table that has one (``gpu.other_attention_kernels`` entries with ``scaled_from``; the ratio is fitted by
    ``planner.validation.fit``)."""
    return replace(base, name=name, fwd_plateau_flops=tuple(v * rate_ratio for v in base.fwd_plateau_flops),
                   bwd_plateau_flops=tuple(v * rate_ratio for v in base.bwd_plateau_flops))


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    matmul_efficiency: EfficiencyCurve
    attention_efficiency: float  # fraction of peak reached by the fused attention kernel (score + value GEMMs)
    memory_bound_efficiency: float  # fraction of HBM bandwidth reached by elementwise / norm kernels
    memory_reserve_bytes: float  # CUDA context, NCCL buffers, allocator fragmentation
    #: fraction of an overlapped collective's duration that still lands on the compute stream (SMs the
    #: communication kernels take from the concurrent GEMM)
    comm_overlap_interference: float = 0.0
    #: dense tensor-core FLOP/s of the narrower GEMM precisions the GPU has ("fp16", "fp8", "mxfp8"); bf16 is
    #: ``peak_flops``
    peak_flops_low_precision: tuple[tuple[str, float], ...] = ()
    #: fraction of its bf16 GEMM efficiency (at the same duration) a narrower precision's GEMMs reach: fitted per
    #: GPU and precision on public runs (the profile lists them); 1 where not fitted; above 1 where the bf16 curve is
    #: carried from another part and this one's narrow GEMMs outrun it (never past the narrow peak)
    low_precision_gemm_efficiency: tuple[tuple[str, float], ...] = ()
    #: per GEMM precision, the time the training stack takes to issue one expert's GEMM of a grouped expert GEMM
    #: (Transformer Engine's GroupedLinear quantizes and calls one GEMM per local expert): the GPU waits when the
    #: expert GEMMs are shorter. Fitted per profile and precision on public MoE runs of the flex dispatcher (DeepEP,
    #: HybridEP; the profile lists them); 0 where not fitted (never launch-bound)
    expert_gemm_call_s: tuple[tuple[str, float], ...] = ()
    #: per GEMM precision, the host time a grouped expert GEMM pass after Megatron-Core's all-to-all dispatcher adds
    #: to its per-expert calls: the dispatcher's host sync on the token counts before its all-to-all empties the
    #: GPU's queue, so what the host issues from there to the expert GEMMs (permutation, the all-to-all, the
    #: chunk sort, the quantization) runs on an idle GPU, once a pass whatever the local experts
    #: (``compute.Op.expert_alltoall``). Fitted on the public MoE runs of that dispatcher (the profile lists them);
    #: 0 where not given
    expert_alltoall_sync_s: tuple[tuple[str, float], ...] = ()
    #: the fused attention kernel's speed by shape (:class:`AttentionKernel`): the one the default stack runs on this
    #: GPU; None: ``attention_efficiency`` for every shape (profiles without a kernel table)
    attention_kernel: AttentionKernel | None = None
    #: tables of other kernels this GPU runs (``gpu.other_attention_kernels``), selected by name
    #: (:meth:`attention_table`)
    other_attention_kernels: tuple[AttentionKernel, ...] = ()
    #: whether the GPU's per-tensor fp8 GEMMs take only the TN layout, so that a quantized tensor used on both sides
    #: of backward is kept with an fp8 transpose beside its data (Hopper and Ada: Transformer Engine's
    #: ``is_non_tn_fp8_gemm_supported`` is false below compute capability 10.0; Blackwell takes any layout)
    fp8_gemm_tn_only: bool = True
    #: streaming multiprocessors (compute units) of one GPU, what a stack that reserves some for its communication
    #: kernels leaves the rest of to compute (``RunConfig.comm_reserved_sms``); 0: not given by the profile
    sm_count: int = 0
    #: how many times longer than the GEMM curve prices them the weight-gradient GEMMs of a 16-bit grouped expert
    #: GEMM run where the stack's grouped linear layer applies the experts' bias itself and fuses its gradient into
    #: them (``compute.Op.biased_grouped_wgrad``); a stack's fitted value (``Stack.on_cluster``), never a profile's:
    #: 1 where the stack has no such path
    biased_grouped_wgrad_factor: float = 1.0
    #: fraction of the datasheet tensor-core rate (``peak_flops`` and the narrower precisions' peaks, the attention
    #: tables' plateaus) the part sustains under its power limit: 1 for a part run at its rated TDP; a power-capped
    #: part's value is fitted on its public runs (``gpu.sustained_tensor_ratio``, the profile lists them). MFU stays
    #: quoted against the datasheet peak
    sustained_tensor_ratio: float = 1.0
    #: FLOP/s the Mamba-2 SSD kernels (mamba_ssm's Triton chunked-scan kernels, which Megatron-Core and Hugging Face
    #: models call) sustain on their small matmuls, a fitted value (``gpu.ssd_scan_tflops``, the profile lists its
    #: rows); 0: not given, the scan is priced by its roofline (:func:`planner.cost.compute.scan_time_s`)
    ssd_scan_flops: float = 0.0

    def attention_kernel_names(self) -> tuple[str, ...]:
        """The kernels this profile has a table for, the default first."""
        return tuple(k.name for k in ((self.attention_kernel,) if self.attention_kernel else ()) +
                     self.other_attention_kernels)

    def attention_table(self, name: str = ""):
        """The table of kernel ``name`` (a stack's or ``--attention-kernel``'s choice); the default table where
        ``name`` is empty or the profile has no table for it (the CLI refuses an explicit name it lacks)."""
        for k in self.other_attention_kernels:
            if k.name == name:
                return k
        return self.attention_kernel

    def attention_kernel_priced(self, name: str = "") -> str | None:
        """The name of the table that prices attention when ``name`` is asked for (None: the single
        ``attention_efficiency``)."""
        table = self.attention_table(name)
        return table.name if table is not None else None

    def precisions(self) -> tuple[str, ...]:
        """The GEMM precisions this GPU runs: bf16 and those its profile gives a peak for."""
        return ("bf16",) + tuple(name for name, _ in self.peak_flops_low_precision)

    def tensor_speedup(self, precision):
        """Dense tensor-core FLOP/s of ``precision`` (a name, or an array of names) over bf16's: 1 for bf16, NaN
        for a precision the GPU lacks (``planner.cost.validity`` refuses those first)."""
        return per_precision(precision, (("bf16", 1.0),) + tuple(
            (name, flops / self.peak_flops) for name, flops in self.peak_flops_low_precision), np.nan)

    def gemm_efficiency_ratio(self, precision):
        """:attr:`low_precision_gemm_efficiency` of ``precision`` (names or an array of them), 1 where none."""
        return per_precision(precision, self.low_precision_gemm_efficiency, 1.0)

    def expert_call_s(self, precision):
        """:attr:`expert_gemm_call_s` of ``precision`` (names or an array of them), 0 where none."""
        return per_precision(precision, self.expert_gemm_call_s, 0.0)

    def expert_issue_s(self, precision, calls, alltoall=False):
        """Host time to issue one pass of a grouped expert GEMM of ``calls`` per-expert GEMMs (0: one kernel, never
        host-bound): ``calls`` x :meth:`expert_call_s` (Transformer Engine's GroupedLinear, one quantize-and-GEMM
        call per local expert), plus :attr:`expert_alltoall_sync_s` of the precision where ``alltoall`` (the GEMM
        follows Megatron-Core's all-to-all dispatcher, whose host waits on the token counts before its all-to-all:
        megatron/core/transformer/moe/token_dispatcher.py, cuda_sync_point "before_ep_alltoall"; flags or arrays)."""
        calls = np.asarray(calls, dtype=float)
        sync = per_precision(precision, self.expert_alltoall_sync_s, 0.0)
        return calls * self.expert_call_s(precision) + np.where(np.asarray(alltoall, dtype=bool) & (calls > 0),
                                                                 sync, 0.0)

    @property
    def tensor_flops(self) -> float:
        """The dense bf16 tensor-core FLOP/s the GPU sustains: the datasheet ``peak_flops`` times
        :attr:`sustained_tensor_ratio` (the rate every GEMM, scan and attention kernel is priced from)."""
        return self.peak_flops * self.sustained_tensor_ratio

    @property
    def usable_memory_bytes(self) -> float:
        """What a plan may use per GPU: HBM less the reserve (a plan fits when every rank's peak is at most this)."""
        return self.hbm_bytes - self.memory_reserve_bytes


@dataclass(frozen=True)
class Link:
    """One class of interconnect, seen from one GPU: bandwidth per direction, per-message latency, and the fraction
    of the wire bandwidth that ring collectives reach (NCCL bus bandwidth / link bandwidth)."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    efficiency: float
    #: all-reduce bus bandwidth of NVLink SHARP (NVSwitch multicast and in-switch reduction) inside the node, as
    #: nccl-tests report it; 0 where the switch has none (then rings and trees only)
    nvls_bus_bandwidth_bytes_per_s: float = 0.0
    #: (a NIC link) the most NICs' worth of bandwidth a ring or tree crossing nodes draws from one node, NCCL's
    #: channels x their per-channel rate in units of this NIC; 0: one NIC per member, no limit (an 8-GPU node's
    #: rings use its 8). A 72-GPU NVLink domain leaves it through far fewer NICs than it has
    max_nics_per_collective: float = 0.0

    @property
    def bus_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency


@dataclass(frozen=True)
class Cluster:
    name: str
    gpu: GPU
    gpus_per_node: int
    intra_node: Link  # NVLink / NVSwitch / Infinity Fabric, per GPU
    inter_node: Link  # the GPU's NIC share (InfiniBand / RoCE), per GPU
    max_gpus: int = 0  # 0 = unbounded
    source: str = ""
    #: the collective library's own cost model (NCCL's tuner constants), ``collectives/*.json``
    collectives: CollectiveLibrary = field(default_factory=load_collective_library)
    #: one GPU's link to host memory, per direction (PCIe, NVLink-C2C); 0 where the profile gives none
    host_link_bytes_per_s: float = 0.0
    #: what one GPU-hour costs (``price_per_gpu_hour_usd``, the user's own figure: prices are contracts, not
    #: hardware); None where the profile gives none
    price_per_gpu_hour_usd: float | None = None


def hardware_profiles_dir() -> Path:
    return _data_dir("hardware_profiles")


#: where a profile's format is documented: the shipped profiles themselves (every field carries its unit)
_FORMAT_FIX = "see a shipped profile for the format: `planner list clusters`, files in hardware_profiles/"


def shipped_clusters() -> list[str]:
    return sorted(p.stem for p in hardware_profiles_dir().glob("*.json"))


def _profile_path(name_or_path: str) -> Path:
    """The file of a shipped profile name or a profile path (``--cluster``)."""
    return _resolve(name_or_path, hardware_profiles_dir(), "--cluster", "cluster",
                    f"use a profile path or one of: {', '.join(shipped_clusters())}")


def load_cluster(name_or_path: str) -> Cluster:
    """Load a shipped profile by name or a profile JSON file by path; a name :func:`cluster_variant` gave
    ("h100-80gb-sxm[inter_node.bandwidth_gb_s=12.5]", as a plan JSON records it) loads that variant again."""
    variant = _parse_variant_name(name_or_path)
    if variant is not None:
        return cluster_variant(*variant, "cluster")
    path = _profile_path(name_or_path)
    return cluster_from_dict(read_json_file(path, "hardware profile"), source=str(path), default_name=path.stem)


#: a profile field a co-design sweep may set although the profile lacks it
SETTABLE_ABSENT_FIELDS = ("price_per_gpu_hour_usd",)


def numeric_fields(data: Any, prefix: str = "") -> list[str]:
    """The paths ("gpu.hbm_gib") of a profile's numeric fields, the ones a co-design sweep can vary."""
    out = []
    for key, value in (data.items() if isinstance(data, dict) else ()):
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out += numeric_fields(value, path + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(path)
    return out


def _variant_value(value: float) -> str:
    """A replaced value as a variant's name spells it: an integer without a decimal point, any other number in
    Python's shortest spelling that reads back as the same float (``repr``), so the name loads the very variant."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def _variant_name(base: str, values: dict[str, float]) -> str:
    """The name :func:`cluster_variant` gives a profile with ``values`` replaced: "base[path=value,...]"."""
    return f"{base}[" + ",".join(f"{k}={_variant_value(v)}" for k, v in values.items()) + "]"


def _parse_variant_name(name: str) -> tuple[str, dict[str, float]] | None:
    """(base, values) of a name :func:`_variant_name` wrote, else None."""
    base, bracket, rest = name.partition("[")
    if not (bracket and rest.endswith("]") and base):
        return None
    values = {}
    for item in rest[:-1].split(","):
        key, _, value = item.partition("=")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            return None
    return base, values


def cluster_variant(name_or_path: str, values: dict[str, float], option: str = "--vary") -> Cluster:
    """A shipped profile (or a profile file) with numeric fields replaced, for hardware co-design sweeps
    (Calculon's question: which machine trains this model best). ``values`` maps a field's path in the profile
    JSON ("gpu.hbm_gib", "node.gpus_per_node", "inter_node.bandwidth_gb_s") to its value, in the unit its key
    names; the result is checked like any profile and named after the changes. No values: the profile itself
    (:func:`load_cluster`)."""
    import copy

    if not values:
        return load_cluster(name_or_path)
    path = _profile_path(name_or_path)
    data = copy.deepcopy(read_json_file(path, "hardware profile"))
    for key, value in values.items():
        # the NIC link sits at the profile's top level; "node.inter_node..." (where one might look for it) means it
        parts, d = (key[len("node."):] if key.startswith("node.inter_node.") else key).split("."), data
        for part in parts[:-1]:
            d = d.get(part) if isinstance(d, dict) else None
        known = isinstance(d, dict) and (isinstance(d.get(parts[-1]), (int, float)) and
                                         not isinstance(d.get(parts[-1]), bool) or key in SETTABLE_ABSENT_FIELDS)
        if not known:
            fields_ = numeric_fields(data)
            raise PlannerError(f"profile {path.stem} has no numeric field '{key}'", source=option, field=key,
                               fix=f"use a path of the profile's numbers, e.g. {', '.join(fields_[:6])} "
                                   f"(all {len(fields_)}: see hardware_profiles/{path.stem}.json)")
        d[parts[-1]] = int(value) if isinstance(d.get(parts[-1]), int) and float(value).is_integer() else value
    data["name"] = _variant_name(data.get("name", path.stem), values)
    return cluster_from_dict(data, source=f"{path} with {option} " +
                             " ".join(f"{k}={_variant_value(v)}" for k, v in values.items()), default_name=path.stem)


def _flag(d: dict, key: str, source: str, section: str, *, default: bool) -> bool:
    """A true/false field of a profile section; ``default`` where absent."""
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise PlannerError(f"must be true or false, got {value!r}", source=source, field=f"{section}.{key}",
                           fix="write true or false")
    return value


def _num(d: Any, key: str, source: str, section: str, *, positive: bool = True, maximum: float | None = None,
         default: float | None = None) -> float:
    if not isinstance(d, dict):
        raise PlannerError("must be an object", source=source, field=section, fix=_FORMAT_FIX)
    where = f"{section}.{key}" if section else key  # the field's path in the profile
    if key not in d:
        if default is not None:
            return default
        raise PlannerError("missing required field", source=source, field=where,
                           fix=_FORMAT_FIX)
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            isinstance(value, float) and not math.isfinite(value):
        raise PlannerError(f"must be a number, got {value!r}", source=source, field=where)
    if abs(value) > MAX_PROFILE_NUMBER:
        raise PlannerError(f"must be <= {MAX_PROFILE_NUMBER:g}, got {value!r:.40}", source=source,
                           field=where, fix="values are in the unit the key names (TFLOP/s, GiB, GB/s)")
    if positive and value <= 0 or not positive and value < 0:
        raise PlannerError(f"must be {'> 0' if positive else '>= 0'}, got {value}", source=source,
                           field=where)
    if positive and value < MIN_PROFILE_NUMBER:
        raise PlannerError(f"must be >= {MIN_PROFILE_NUMBER:g}, got {value!r:.40}", source=source,
                           field=where, fix="values are in the unit the key names (TFLOP/s, GiB, GB/s)")
    if maximum is not None and value > maximum:
        raise PlannerError(f"must be <= {maximum}, got {value}", source=source, field=where)
    return float(value)


def _link(d: Any, source: str, section: str) -> Link:
    if not isinstance(d, dict):
        raise PlannerError("missing or not an object", source=source, field=section, fix=_FORMAT_FIX)
    return Link(
        name=str(d.get("name", section)),
        bandwidth_bytes_per_s=_num(d, "bandwidth_gb_s", source, section) * GB,
        latency_s=_num(d, "latency_us", source, section, positive=False) * US,
        efficiency=_num(d, "efficiency", source, section, maximum=1.0),
        nvls_bus_bandwidth_bytes_per_s=_num(d, "nvls_bus_bandwidth_gb_s", source, section, positive=False,
                                            default=0.0) * GB,
        max_nics_per_collective=_num(d, "max_nics_per_collective", source, section, positive=False, default=0.0),
    )


def _curve(d: Any, source: str, section: str) -> EfficiencyCurve:
    pts = d.get("points") if isinstance(d, dict) else None
    if not isinstance(pts, list) or not pts:
        raise PlannerError("needs a non-empty list \"points\" of [gemm_gflop, efficiency]", source=source,
                           field=section)
    xs, ys = [], []
    for i, p in enumerate(pts):
        if (not isinstance(p, list) or len(p) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                              for v in p) or not 0 < p[0] <= MAX_PROFILE_NUMBER or not MIN_PROFILE_NUMBER <= p[1] <= 1):
            raise PlannerError(f"point {i} must be [gemm_gflop > 0, efficiency in (0, 1]], got {p!r}",
                               source=source, field=f"{section}.points")
        xs.append(math.log10(p[0] * 1e9))
        ys.append(float(p[1]))
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise PlannerError("points must be sorted by increasing gemm_gflop", source=source, field=f"{section}.points")
    return EfficiencyCurve(tuple(xs), tuple(ys))


def _list(d: dict, key: str, source: str, section: str, n: int | None = None) -> tuple[float, ...]:
    """A list of positive numbers (``n`` of them where given) at ``section.key``."""
    values = d.get(key)
    where = f"{section}.{key}"
    if not isinstance(values, list) or not values or n is not None and len(values) != n:
        raise PlannerError(f"must be a list of {n or 'one or more'} numbers", source=source, field=where,
                           fix=_FORMAT_FIX)
    return tuple(_num({key: v}, key, source, section) for v in values)


def _attention_kernel(d: Any, source: str, section: str = "gpu.attention_kernel") -> AttentionKernel | None:
    """``gpu.attention_kernel``: the fused attention kernel's fitted speed by shape (:class:`AttentionKernel`)."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise PlannerError("must be an object", source=source, field=section, fix=_FORMAT_FIX)
    dims = _list(d, "head_dims", source, section)
    if any(b <= a for a, b in zip(dims, dims[1:])):
        raise PlannerError("must increase", source=source, field=f"{section}.head_dims")
    passes = {}
    for name in ("forward", "backward"):
        part = d.get(name)
        if not isinstance(part, dict):
            raise PlannerError("missing or not an object", source=source, field=f"{section}.{name}",
                               fix=_FORMAT_FIX)
        passes[name] = (tuple(v * TFLOPS for v in _list(part, "plateau_tflops", source, f"{section}.{name}",
                                                        len(dims))),
                        _list(part, "row_overhead_tiles", source, f"{section}.{name}", len(dims)))
    return AttentionKernel(
        name=str(d.get("kernel", "attention kernel")),
        tile_tokens=_num(d, "tile_tokens", source, section),
        head_dims=dims,
        fwd_plateau_flops=passes["forward"][0], fwd_row_overhead_tiles=passes["forward"][1],
        bwd_plateau_flops=passes["backward"][0], bwd_row_overhead_tiles=passes["backward"][1],
        masked_tile_extra=_num(d, "masked_tile_extra", source, section, positive=False),
        end_to_end_ratio=_num(d, "end_to_end_ratio", source, section, maximum=1.0),
        causal_plateau_ratio=_num(d, "causal_plateau_ratio", source, section, maximum=1.0, default=1.0),
    )


def _other_attention_kernels(d: Any, source: str, default: AttentionKernel | None = None) \
        -> tuple[AttentionKernel, ...]:
    """``gpu.other_attention_kernels``: a list of further kernel tables (each as ``gpu.attention_kernel``), or of
    releases derived from one (``{"kernel", "scaled_from", "rate_ratio": {"value"}}``,
    :func:`derived_attention_kernel`) of a table the profile has (``default``, the profile's own, or a listed one)."""
    if d is None:
        return ()
    if not isinstance(d, list):
        raise PlannerError("must be a list of kernel tables", source=source, field="gpu.other_attention_kernels",
                           fix=_FORMAT_FIX)
    for i, k in enumerate(d):  # each entry a table: _attention_kernel reads an absent one as "none"
        if not isinstance(k, dict):
            raise PlannerError("must be a kernel table (an object)", source=source,
                               field=f"gpu.other_attention_kernels[{i}]", fix=_FORMAT_FIX)
    tables = {i: _attention_kernel(k, source, f"gpu.other_attention_kernels[{i}]")
              for i, k in enumerate(d) if "scaled_from" not in k}
    by_name = {k.name: k for k in ((default,) if default else ()) + tuple(tables.values())}
    for i, k in enumerate(d):
        if i in tables:
            continue
        section = f"gpu.other_attention_kernels[{i}]"
        name = k["scaled_from"]
        base = by_name.get(name) if isinstance(name, str) else None
        if base is None:
            raise PlannerError(f"scaled_from names no kernel table of this profile: {name!r}",
                               source=source, field=f"{section}.scaled_from",
                               fix=f"use one of: {', '.join(by_name) or '(none: add a table first)'}")
        ratio = k.get("rate_ratio")
        if not isinstance(ratio, dict):
            raise PlannerError("missing or not an object", source=source, field=f"{section}.rate_ratio",
                               fix='e.g. {"value": 1.15, "fitted_on": [...]}')
        tables[i] = derived_attention_kernel(base, str(k.get("kernel", "attention kernel")),
                                             _num(ratio, "value", source, f"{section}.rate_ratio"))
    return tuple(tables[i] for i in range(len(d)))


def _fitted_scalar(d: Any, source: str, key: str, *, default: float, example: str,
                   maximum: float | None = None) -> float:
    """A fitted GPU number, ``gpu.<key>``: {"value": number, ...provenance} (the value with the rows it was fitted
    on), refused in one line naming the field unless an object with a positive value (at most ``maximum``);
    absent: ``default``."""
    if d is None:
        return default
    if not isinstance(d, dict):
        raise PlannerError("must be an object", source=source, field=f"gpu.{key}",
                           fix=f'e.g. {{"value": {example}, "fitted_on": [...]}}, or leave the field out')
    return _num(d, "value", source, f"gpu.{key}", maximum=maximum)


def _sustained_ratio(d: Any, source: str) -> float:
    """``gpu.sustained_tensor_ratio``: a fraction in (0, 1]; absent: 1 (the part runs at its datasheet rate)."""
    return _fitted_scalar(d, source, "sustained_tensor_ratio", default=1.0, example="0.82", maximum=1.0)


def _ssd_rate(d: Any, source: str) -> float:
    """``gpu.ssd_scan_tflops``: TFLOP/s, returned in FLOP/s; absent: 0 (the SSD scan at its roofline)."""
    return _fitted_scalar(d, source, "ssd_scan_tflops", default=0.0, example="30") * TFLOPS


def _ratios(d: Any, source: str, curve: EfficiencyCurve) -> tuple[tuple[str, float], ...]:
    """``gpu.low_precision_gemm_efficiency``: {precision: {"value": ratio > 0, ...provenance}}, refused where the
    ratio times the GEMM curve's top efficiency passes 1 (narrow GEMMs above their own peak). A ratio may pass 1
    where the profile's bf16 curve is another die's (a profile that carries it): its narrow GEMMs may outrun it."""
    ratios = _per_precision(d, source, "gpu.low_precision_gemm_efficiency", maximum=None)
    top = max(curve.efficiency)
    for name, ratio in ratios:
        if not 0 < ratio * top <= 1:
            raise PlannerError(f"{ratio:g} times the GEMM curve's top efficiency {top:g} is outside (0, 1]",
                               source=source, field=f"gpu.low_precision_gemm_efficiency.{name}",
                               fix=f"give a ratio in (0, {1 / top:.3f}]")
    return ratios


def expert_call_times(d: Any, source: str, section: str) -> tuple[tuple[str, float], ...]:
    """An expert GEMM issue-time section (``expert_gemm_call_us``, ``expert_alltoall_sync_us``, in a profile's
    ``gpu`` or a stack file by profile): {precision: {"value": microseconds, ...provenance}}, in seconds."""
    return _per_precision(d, source, section, maximum=None, scale=US, precisions=("bf16",) + LOW_PRECISIONS)


#: the all-to-all dispatcher's issue-time key before 2026-12-08: a per-expert-call time, now the per-call time of
#: every dispatcher plus ``expert_alltoall_sync_us``; a file that still has it is refused, not misread
RETIRED_ALLTOALL_KEY = "expert_gemm_call_us_alltoall"


def refuse_retired_alltoall_key(d: dict, source: str, section: str) -> None:
    """Refuse (one line naming the field) a profile's ``gpu`` or a stack file that still gives
    :data:`RETIRED_ALLTOALL_KEY`."""
    if RETIRED_ALLTOALL_KEY in d:
        raise PlannerError("the all-to-all dispatcher's per-call issue time is retired: its layers now take the "
                           "per-call time of every dispatcher plus a time per GEMM pass", source=source,
                           field=f"{section}{RETIRED_ALLTOALL_KEY}",
                           fix="give expert_alltoall_sync_us (refit with python -m planner.validation.fit)")


def _per_precision(d: Any, source: str, section: str, *, maximum: float | None, scale: float = 1.0,
                   precisions: tuple[str, ...] = LOW_PRECISIONS) -> tuple[tuple[str, float], ...]:
    """A fitted per-precision section: {precision: {"value": number, ...provenance}}."""
    if d is None:
        return ()
    if not isinstance(d, dict):
        raise PlannerError("must be an object of {precision: {\"value\": number}}", source=source, field=section)
    out = []
    for name, entry in d.items():
        if name not in precisions:
            raise PlannerError(f"unknown precision '{name}'", source=source, field=section,
                               fix=f"use one of: {', '.join(precisions)}")
        out.append((name, _num(entry, "value", source, f"{section}.{name}", positive=maximum is not None,
                               maximum=maximum) * scale))
    return tuple(out)


def _int(section: dict, key: str, source: str, field: str, *, minimum: int, default: int | None = None,
         fix: str = "") -> int:
    """An integer field of a profile section (``default`` where absent, required where None), refused in one line
    unless a JSON integer from ``minimum`` (0 or 1) to MAX_CONFIG_INT."""
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_CONFIG_INT:
        kind = "a positive" if minimum else "a non-negative"
        raise PlannerError(f"must be {kind} integer (at most {MAX_CONFIG_INT}), got {value!r}", source=source,
                           field=field, fix=fix)
    return value


def cluster_from_dict(data: Any, *, source: str = "<profile>", default_name: str = "cluster") -> Cluster:
    if not isinstance(data, dict):
        raise PlannerError("top level must be a JSON object", source=source, fix=_FORMAT_FIX)
    g = data.get("gpu")
    if not isinstance(g, dict):
        raise PlannerError("missing or not an object", source=source, field="gpu", fix=_FORMAT_FIX)
    refuse_retired_alltoall_key(g, source, "gpu.")
    default_kernel = _attention_kernel(g.get("attention_kernel"), source)
    curve = _curve(g.get("matmul_efficiency"), source, "gpu.matmul_efficiency")
    gpu = GPU(
        name=str(g.get("name", default_name)),
        peak_flops=_num(g, "peak_bf16_tflops", source, "gpu") * TFLOPS,
        hbm_bytes=_num(g, "hbm_gib", source, "gpu") * GIB,
        hbm_bandwidth_bytes_per_s=_num(g, "hbm_bandwidth_tb_s", source, "gpu") * 1e12,
        matmul_efficiency=curve,
        attention_efficiency=_num(g, "attention_efficiency", source, "gpu", maximum=1.0),
        memory_bound_efficiency=_num(g, "memory_bound_efficiency", source, "gpu", maximum=1.0),
        memory_reserve_bytes=_num(g, "memory_reserve_gib", source, "gpu", positive=False) * GIB,
        comm_overlap_interference=_num(g, "comm_overlap_interference", source, "gpu", positive=False, maximum=1.0,
                                       default=0.0),
        peak_flops_low_precision=tuple((name, _num(g, f"peak_{name}_tflops", source, "gpu") * TFLOPS)
                                       for name in LOW_PRECISIONS if f"peak_{name}_tflops" in g),
        low_precision_gemm_efficiency=_ratios(g.get("low_precision_gemm_efficiency"), source, curve),
        expert_gemm_call_s=expert_call_times(g.get("expert_gemm_call_us"), source, "gpu.expert_gemm_call_us"),
        expert_alltoall_sync_s=expert_call_times(g.get("expert_alltoall_sync_us"), source,
                                                 "gpu.expert_alltoall_sync_us"),
        attention_kernel=default_kernel,
        other_attention_kernels=_other_attention_kernels(g.get("other_attention_kernels"), source, default_kernel),
        fp8_gemm_tn_only=_flag(g, "fp8_gemm_tn_only", source, "gpu", default=True),
        sm_count=_int(g, "sm_count", source, "gpu.sm_count", minimum=0, default=0,
                      fix="give the GPU's SM count (e.g. 132 for H100 SXM5) or leave the field out"),
        sustained_tensor_ratio=_sustained_ratio(g.get("sustained_tensor_ratio"), source),
        ssd_scan_flops=_ssd_rate(g.get("ssd_scan_tflops"), source),
    )
    node = data.get("node")
    if not isinstance(node, dict):
        raise PlannerError("missing or not an object", source=source, field="node", fix=_FORMAT_FIX)
    gpn = _int(node, "gpus_per_node", source, "node.gpus_per_node", minimum=1)
    max_gpus = _int(data, "max_gpus", source, "max_gpus", minimum=0, default=0)
    return Cluster(
        name=str(data.get("name", default_name)), gpu=gpu, gpus_per_node=gpn,
        intra_node=_link(node.get("intra_node"), source, "node.intra_node"),
        inter_node=_link(data.get("inter_node"), source, "inter_node"),
        max_gpus=max_gpus, source=str(data.get("source", "")),
        collectives=load_collective_library(_library_name(data, source)),
        host_link_bytes_per_s=(_num(data["host_link"], "bandwidth_gb_s", source, "host_link") * GB
                               if "host_link" in data else 0.0),
        price_per_gpu_hour_usd=(_num(data, "price_per_gpu_hour_usd", source, "")
                                if "price_per_gpu_hour_usd" in data else None),
    )


def _library_name(data: dict, source: str) -> str:
    name = data.get("collective_library", DEFAULT_COLLECTIVE_LIBRARY)
    if not isinstance(name, str):
        raise PlannerError(f"must be a library name or path, got {name!r}", source=source,
                           field="collective_library", fix="e.g. \"nccl-2.30\" (files in collectives/)")
    return name


def check_attention_kernel(gpu: GPU, profile: str, name: str, option: str = "--attention-kernel") -> None:
    """Refuse an explicitly named attention kernel that is unknown, or that ``profile`` (whose GPU is ``gpu``) has
    kernel tables but none for (a stack's choice instead falls back to the profile's default table)."""
    if name not in ATTENTION_KERNELS:
        raise PlannerError(f"unknown attention kernel '{name}'", source=option,
                           fix=f"use one of: {', '.join(ATTENTION_KERNELS)}")
    names = gpu.attention_kernel_names()
    if names and name not in names:
        raise PlannerError(f"profile {profile} has no table for attention kernel '{name}'", source=option,
                           fix=f"use one of its kernels ({', '.join(names)}), or add the table to "
                               f"gpu.other_attention_kernels (python -m planner.validation.attention_fit)")
