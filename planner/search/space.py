"""The search space: every combination of knobs ``planner plan`` may choose, enumerated as numpy columns.

Enumeration happens in two levels, both exhaustive:

* *groups*, built in plain Python over the divisor lattice: (TP, CP and its kind, PP, EP, micro-batch size,
  schedule, virtual stages, sequence parallelism). Only divisors are visited and each rule of
  :mod:`planner.cost.validity` about these degrees is applied while walking, so even 10^5 GPUs give a few tens of
  thousands of groups, stored as one numpy array;
* *rows*, the members of a group: one per ZeRO stage (over all of DP, or HSDP's shard groups of whole nodes,
  ``hsdp_shards``) and recomputation variant (none, selective, full on every layer, or full on the first ``k``
  layers of each stage for k = 1 .. layers-per-stage - 1). Rows are built with
  numpy for any set of groups (:meth:`Space.expand`), so the search materializes only the groups it cannot prune
  as a whole.

Every row is one configuration with its layers split evenly over the stages (Megatron's default). No valid
configuration of the space is left out; rows are checked again with ``config_problems`` before they are evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from planner.cost import comm
from planner.cost.moe import undominated_dispatchers
from planner.cost.schedule import SCHEDULES
from planner.cost.validity import hsdp_splits_expert_dp, model_cp_problem, tp_splits_heads, ulysses_problem
from planner.errors import PlannerError
from planner.specs.config import (CP_KINDS, DEFAULT_RECOMPUTE_MODULES, EP_DISPATCHERS, RECOMPUTE_MODES, ZERO_STAGES,
                                  FixedOptions, RunConfig, recompute_module_on)
from planner.specs.hardware import Cluster
from planner.specs.model import ModelSpec

#: recomputation variant codes of the ``rec`` column; codes >= REC_FULL_K mean "full on the first (code - 2)
#: layers of every stage" (Megatron --recompute-method block --recompute-num-layers k)
REC_NONE, REC_SELECTIVE, REC_FULL_ALL, REC_FULL_K = 0, 1, 2, 3
#: virtual-pipeline chunks that may be one layer shorter than the others in the layouts the search holds
UNEVEN_CHUNKS = 3


@dataclass(frozen=True)
class SearchSpace:
    """What the search may vary. Defaults: everything the cost model knows."""

    #: pipeline schedules (GPipe is left out where 1F1B is in: it times the same and holds more, ``group_rows``)
    schedules: tuple[str, ...] = field(default_factory=lambda: tuple(SCHEDULES))
    recompute_modes: tuple[str, ...] = RECOMPUTE_MODES
    zero_stages: tuple[int, ...] = ZERO_STAGES
    cp_kinds: tuple[str, ...] = CP_KINDS
    sequence_parallel: tuple[bool, ...] = (True, False)
    #: try "full on the first k layers of each stage" for every k (else only full on all layers)
    partial_recompute: bool = True
    #: partial recomputation only where the count k divides every model chunk's layers (the chunks equal): the
    #: layouts a launcher that checkpoints every N-th layer can run (torchtitan's selective_ac_option = N)
    recompute_count_divides: bool = False
    #: runtime options. Each value the cost model ranks the same way everywhere (a fused attention kernel, TP
    #: communication overlapped with GEMMs, overlapped DP collectives, bf16 gradient reduction: never slower and
    #: never more memory than the alternative) is the default alone, so the default space has the same optimum
    #: as the one with both values; a launcher or stack that cannot run it narrows the tuple to what it runs, and
    #: a user may widen it to compare. TP overlap applies only to TP > 1 with SP (Megatron-Core's rule).
    flash_attention: tuple[bool, ...] = (True,)
    tp_comm_overlap: tuple[bool, ...] = (True,)
    overlap_grad_reduce: tuple[bool, ...] = (True,)
    overlap_param_gather: tuple[bool, ...] = (True,)
    grad_reduce_bytes: tuple[int, ...] = (2,)
    #: batch-level overlap of the MoE all-to-alls (config.RunConfig.ep_comm_overlap), where it can run: EP > 1,
    #: virtual stages with PP; both values, because Megatron-Core refuses it with full recomputation (those rows
    #: are skipped as invalid) and full recomputation with EP must stay reachable
    ep_comm_overlap: tuple[bool, ...] = (False, True)
    #: virtual-pipeline chunks that may be one layer short (near_even_chunks); 0 where a launcher needs equal ones
    uneven_chunks: int = UNEVEN_CHUNKS
    #: GEMM precision of the linear layers (the run's choice, not searched: config.PRECISIONS)
    precision: str = "bf16"
    #: the attention kernel (config.RunConfig.attention_kernel: the stack's, not searched; "" = the profile's)
    attention_kernel: str = ""
    #: how the stack issues grouped expert GEMMs (config.RunConfig.per_expert_gemm_calls: the stack's, not searched)
    per_expert_gemm_calls: bool = True
    #: the overlap's paired micro-batch fills the issue gaps (config.RunConfig.moe_overlap_fills_issue_gaps: the
    #: stack's)
    moe_overlap_fills_issue_gaps: bool = True
    #: fp8 weights gathered in fp8 (config.RunConfig.fp8_param_gather: the stack's, not searched)
    fp8_param_gather: bool = False
    #: weights held as Transformer Engine holds them in fp8 (config.RunConfig.te_quantized_weights: the stack's)
    te_quantized_weights: bool = True
    #: gradients held in the reduction's dtype (config.RunConfig.grads_in_reduce_dtype: the stack's)
    grads_in_reduce_dtype: bool = True
    #: bytes of each Adam moment (config.RunConfig.adam_moment_bytes: the request's, not searched)
    adam_moment_bytes: int = 4
    #: SwiGLU inputs kept in fp8 (config.RunConfig.activation_fp8_input_store: the request's, not searched)
    activation_fp8_input_store: bool = False
    #: the busiest EP rank's routed load over the mean (config.RunConfig.moe_load_factor: the request's)
    moe_load_factor: float = 1.0
    #: SMs the stack's communication kernels hold through the step (config.RunConfig.comm_reserved_sms: the
    #: request's)
    comm_reserved_sms: int = 0
    #: selective "core_attn" re-runs the fused attention (config.RunConfig.recompute_fused_attention: the stack's)
    recompute_fused_attention: bool = True
    #: what "selective" recomputation redoes (config.RECOMPUTE_MODULES, canonical string; not searched)
    recompute_modules: str = DEFAULT_RECOMPUTE_MODULES
    #: packed variable-length documents: their token-weighted mean length (config.RunConfig.packed_doc_len; the
    #: data's, not searched); 0 = one document per sequence
    packed_doc_len: float = 0.0
    #: and the coefficient of variation of a packed sequence's attention work (config.RunConfig.packed_attention_cv)
    packed_attention_cv: float = 0.0
    #: Megatron-Core fine-grained activation offloading of these module inputs in every row (config.
    #: RunConfig.offload_modules; "" = none): such a space holds no full recomputation (it keeps only layer inputs)
    offload_modules: str = ""
    #: pipeline sends overlapped with compute where the schedule runs it (config.RunConfig.overlap_p2p_comm: the
    #: stack's, not searched)
    overlap_p2p_comm: bool = True
    #: MoE token dispatchers (config.EP_DISPATCHERS; config.RunConfig.ep_dispatcher), searched per EP placement
    #: where one may beat another (planner.cost.moe.undominated_dispatchers). The default: Megatron's all-to-all
    #: and one deduplicating dispatch (HybridEP; DeepEP costs the same)
    ep_dispatchers: tuple[str, ...] = ("alltoall", "hybridep")
    max_tp: int | None = None  # None = one node
    max_cp: int | None = None
    max_pp: int | None = None
    micro_batch_sizes: tuple[int, ...] | None = None  # None = every divisor
    #: degrees a user allows (``planner plan --tp 8 --pp 4,8``); None = every valid one
    tp_values: tuple[int, ...] | None = None
    pp_values: tuple[int, ...] | None = None
    cp_values: tuple[int, ...] | None = None
    ep_values: tuple[int, ...] | None = None
    vpp_values: tuple[int, ...] | None = None
    #: expert tensor-parallel degrees (of TP and 1, the two both Megatron-Core and torchtitan run)
    etp_values: tuple[int, ...] | None = None
    #: HSDP (config.RunConfig.dp_shard) as rows beside plain ZeRO: shard groups that fill this many whole nodes
    #: (TP x CP x dp_shard = nodes x GPUs per node, the NVLink domain and its multiples; FSDP's hybrid sharding
    #: "within a node, replicated across nodes" is 1), replicated over the rest of DP; () = no HSDP
    hsdp_node_spans: tuple[int, ...] = (1, 2, 4, 8)
    #: shard sizes in DP ranks a user asks for (``planner plan --dp-shard``) in place of the node spans
    dp_shard_values: tuple[int, ...] | None = None
    #: whether ZeRO over all of DP (no HSDP) is in the space
    plain_zero: bool = True
    #: the ZeRO stages HSDP runs with (Megatron's distributed-optimizer instances: 1; FSDP2: 1-3)
    hsdp_zero_stages: tuple[int, ...] = (1, 2, 3)

    #: the fields a user's value constraints (``Constraints``) set on a space
    VALUE_FIELDS = ("tp_values", "pp_values", "cp_values", "ep_values", "vpp_values", "micro_batch_sizes",
                    "etp_values")

    @property
    def value_constraints(self) -> tuple:
        return tuple(getattr(self, f) for f in self.VALUE_FIELDS)

    @property
    def fixed(self) -> FixedOptions:
        """The options every row of the space holds (``config.FIXED_FIELDS``), as one value."""
        return FixedOptions.of(self)

    def with_fixed(self, fixed: FixedOptions) -> "SearchSpace":
        """The same space holding ``fixed``'s options (a re-plan keeps the old plan's)."""
        return replace(self, **fixed.as_dict())

    def without_value_constraints(self) -> "SearchSpace":
        """The same space with every degree and micro-batch size free (what would be valid without the user's
        constraints)."""
        return replace(self, **{f: None for f in self.VALUE_FIELDS})


@dataclass(frozen=True)
class Constraints:
    """What a user restricts the search to (``planner plan`` / ``sweep`` options): allowed values of each degree,
    micro-batch size, schedule, ZeRO stage and recomputation mode; None leaves a knob free."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    schedules: tuple[str, ...] | None = None
    zero: tuple[int, ...] | None = None
    recompute: tuple[str, ...] | None = None
    #: HSDP shard sizes in DP ranks, 0 for ZeRO over all of DP (no HSDP)
    dp_shard: tuple[int, ...] | None = None

    def apply(self, space: SearchSpace) -> SearchSpace | None:
        """``space`` narrowed to these values, or None where a set knob leaves it nothing (a schedule, ZeRO stage
        or recomputation mode the space, e.g. a launcher's, does not hold)."""
        def keep(have, want):
            return have if want is None else tuple(x for x in have if x in want)
        narrowed = replace(
            space, schedules=keep(space.schedules, self.schedules), zero_stages=keep(space.zero_stages, self.zero),
            recompute_modes=keep(space.recompute_modes, self.recompute),
            micro_batch_sizes=self.micro_batch if space.micro_batch_sizes is None else
            keep(space.micro_batch_sizes, self.micro_batch),
            tp_values=self.tp, pp_values=self.pp, cp_values=self.cp, ep_values=self.ep, vpp_values=self.vpp,
            etp_values=self.etp)
        if self.dp_shard is not None:
            sizes = tuple(x for x in self.dp_shard if x > 0)
            narrowed = replace(narrowed, dp_shard_values=sizes or None, plain_zero=0 in self.dp_shard,
                               hsdp_node_spans=narrowed.hsdp_node_spans if sizes else ())
            if not sizes:
                narrowed = replace(narrowed, hsdp_zero_stages=())
            elif not narrowed.plain_zero and not set(narrowed.zero_stages) & set(narrowed.hsdp_zero_stages):
                return None
        if not (narrowed.schedules and narrowed.zero_stages and narrowed.recompute_modes):
            return None
        return narrowed

    def narrow(self, spaces: list[SearchSpace], runner: str) -> list[SearchSpace]:
        """The spaces that keep something under these constraints; a one-line error naming the option when a
        schedule, ZeRO stage or recomputation set leaves ``runner`` (a stack or launcher) nothing."""
        if self.dp_shard is not None and any(x > 0 for x in self.dp_shard) and \
                not any(set(s.hsdp_zero_stages) & set(s.zero_stages) for s in spaces):
            raise PlannerError(f"{runner} runs no HSDP", source="--dp-shard",
                               fix="drop --dp-shard, or use a stack that runs it (megatron-core: ZeRO-1 "
                                   "instances; torchtitan: FSDP2)")
        for option, want, have in (("--schedules", self.schedules, {x for s in spaces for x in s.schedules}),
                                   ("--zero", self.zero, {x for s in spaces for x in s.zero_stages}),
                                   ("--recompute", self.recompute, {x for s in spaces for x in s.recompute_modes})):
            if want is not None and not set(want) & have:
                raise PlannerError(f"{runner} runs none of {', '.join(map(str, want))}", source=option,
                                   fix=f"it runs: {', '.join(map(str, sorted(have, key=str)))}")
        out = [n for n in (self.apply(s) for s in spaces) if n is not None]
        if not out:
            raise PlannerError(f"{runner} runs no combination of the given --schedules, --zero and --recompute",
                               source="--schedules", fix="widen one of them")
        return out

    def describe(self) -> str:
        """The constraints as the CLI spells them (for messages)."""
        parts = []
        for option, values in (("--tp", self.tp), ("--pp", self.pp), ("--cp", self.cp), ("--ep", self.ep),
                               ("--vpp", self.vpp), ("--micro-batch", self.micro_batch), ("--etp", self.etp),
                               ("--schedules", self.schedules), ("--zero", self.zero), ("--recompute", self.recompute),
                               ("--dp-shard", self.dp_shard)):
            if values is not None:
                shown = ("none" if v == 0 and option == "--dp-shard" else str(v) for v in values)
                parts.append(f"{option} {','.join(shown)}")
        return " ".join(parts)


def near_even_chunks(num_layers: int, chunks: int, uneven: int = UNEVEN_CHUNKS) -> bool:
    """Whether ``num_layers`` split into ``chunks`` model chunks is a layout people run: equal chunks, or equal chunks
    but for at most ``uneven`` one layer shorter, at the ends, which carry the embedding and the loss (Llama 3 405B's
    1 + 2 x 62 + 1 over 64 chunks; DeepSeek-V3's 61 layers over 32; ``config.even_layer_split`` gives the extra
    layers to the middle chunks)."""
    r = num_layers % chunks
    return r == 0 or r >= chunks - uneven


@lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """Sorted divisors of n."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


#: group columns (int64); "cp_kind" indexes CP_KINDS, "sched" indexes Space.schedules; "etp" the expert tensor-
#: parallel degree (TP, or 1 under MoE parallel folding); the runtime options: "tpo" TP comm overlap, "fa" flash
#: attention, "ogr" / "opg" overlapped grad reduce / param gather (0/1), "grb" bytes per element of the gradient
#: reduction
GROUP_COLS = ("tp", "cp", "cp_kind", "pp", "ep", "etp", "mb", "sched", "vpp", "sp", "tpo", "fa", "ogr", "opg",
              "grb", "epo", "epd")
#: the option columns, after the degree columns, and the RunConfig field each sets ("epd" indexes EP_DISPATCHERS)
OPTION_FIELDS = {"tpo": "tp_comm_overlap", "fa": "flash_attention", "ogr": "overlap_grad_reduce",
                 "opg": "overlap_param_gather", "grb": "grad_reduce_bytes", "epo": "ep_comm_overlap",
                 "epd": "ep_dispatcher"}
G = {name: j for j, name in enumerate(GROUP_COLS)}
#: storage of the group columns: every one is a small count or code (degrees, micro-batch size, indices, 0/1), and
#: products of them stay within a GPU count; int32 halves the memory a million-group space writes and reads
GROUP_DTYPE = np.int32


def group_rows(model: ModelSpec, cluster: Cluster, num_gpus: int, global_batch: int, seq_len: int,
               space: SearchSpace) -> np.ndarray:
    """Every group that passes the degree rules of ``config_problems``, one row of ``GROUP_COLS`` each (int64).

    The walk lists each valid (TP, CP, kind, PP, micro-batch, schedule, VPP) once with the (EP, SP, options)
    tails its degrees allow; the rows, one per tail, are then laid out with numpy in the same order."""
    L = model.num_layers
    max_tp = min(space.max_tp or cluster.gpus_per_node, cluster.gpus_per_node)
    kinds = [k for k in space.cp_kinds if k in CP_KINDS]
    # GPipe times like 1F1B (the same closed form and windows) and holds all m micro-batches against 1F1B's p or
    # fewer: with 1F1B in the space its rows can never be better, so they are not enumerated
    dominated = {"gpipe"} if {"gpipe", "1f1b"} <= set(space.schedules) else set()
    scheds = [SCHEDULES[s] for s in space.schedules]
    sp_opts = sorted({int(x) for x in space.sequence_parallel})
    # runtime options other than TP overlap: the same for every group
    shared_opts = [(int(fa), int(ogr), int(opg), int(grb)) for fa in sorted(set(space.flash_attention), reverse=True)
                   for ogr in sorted(set(space.overlap_grad_reduce), reverse=True)
                   for opg in sorted(set(space.overlap_param_gather), reverse=True)
                   for grb in sorted(set(space.grad_reduce_bytes))]
    tpo_opts = sorted({int(x) for x in space.tp_comm_overlap}, reverse=True)
    epo_opts = sorted({int(x) for x in space.ep_comm_overlap}, reverse=True) if model.is_moe else [0]
    listed = tuple(dict.fromkeys(space.ep_dispatchers))
    first = [EP_DISPATCHERS.index(listed[0])]
    kept_on: dict[tuple, list[int]] = {}  # per EP placement (size, GPUs per node), the dispatchers no other beats
    kept_for: dict[tuple[int, int], list[int]] = {}  # and per (EP, expert TP), looked up once

    def dispatchers(ep, etp):
        """The dispatcher codes of an EP group: those of the space's no other beats at any token count
        (moe.undominated_dispatchers: exact, the rest of a row being the same)."""
        if ep <= 1 or len(listed) == 1 or not model.is_moe:
            return first
        if (ep, etp) not in kept_for:
            g = comm.place_group(ep, etp, cluster.gpus_per_node)  # the EP group as comm.groups_for places it
            key = (int(g.size), int(g.members_per_node))
            if key not in kept_on:
                kept_on[key] = [EP_DISPATCHERS.index(d) for d in undominated_dispatchers(model, cluster, g, listed)]
            kept_for[(ep, etp)] = kept_on[key]
        return kept_for[(ep, etp)]
    heads: list[tuple[int, ...]] = []  # (tp, cp, kind, pp, mb, schedule, vpp, index of its (ep, sp) pairs)
    schedule_runs: dict[tuple[int, int], list[tuple[int, int, bool]]] = {}  # (pp, m) -> (schedule, vpp, no overlap)
    tail_sets: list[list[tuple[int, int]]] = []
    def allowed(value: int, values: tuple[int, ...] | None) -> bool:
        return values is None or value in values

    for tp in divisors(num_gpus):
        if tp > max_tp or not tp_splits_heads(model, tp) or not allowed(tp, space.tp_values):
            continue
        sps = sp_opts if tp > 1 else [0]  # SP is a no-op without TP: one choice, "off"
        for cp in divisors(num_gpus // tp):
            if space.max_cp and cp > space.max_cp or not allowed(cp, space.cp_values):
                continue
            if cp > 1 and seq_len % (2 * cp) or model_cp_problem(model, tp, cp):
                continue
            for kind in (kinds if cp > 1 else kinds[:1]):
                if kind == "ulysses" and ulysses_problem(model, tp, cp):
                    continue
                k_idx = CP_KINDS.index(kind)
                for pp in divisors(num_gpus // (tp * cp)):
                    if pp > L or (space.max_pp and pp > space.max_pp) or not allowed(pp, space.pp_values):
                        continue
                    dp = num_gpus // (tp * cp * pp)
                    if global_batch % dp:
                        continue
                    # (ep, etp) pairs: expert TP = TP with EP dividing DP x CP, or, with TP > 1, expert TP 1 and
                    # EP folded over TP x CP x DP (Megatron-Core's MoE parallel folding; torchtitan's ETP=1)
                    ep_etps = [(1, tp)]
                    if model.is_moe:
                        ep_etps = [(e, x) for x in sorted({tp} | ({1} if tp > 1 else set()), reverse=True)
                                   if allowed(x, space.etp_values)
                                   for e in divisors(tp * cp * dp // x) if model.num_experts % e == 0
                                   and allowed(e, space.ep_values) and (x == tp or e > 1)]
                    elif not allowed(1, space.ep_values):
                        continue
                    mbs = divisors(global_batch // dp)
                    if space.micro_batch_sizes is not None:
                        mbs = [b for b in mbs if b in space.micro_batch_sizes]
                    # virtual stages per schedule: chunks must split the layers evenly (validity)
                    vpps = [([v for v in range(2, L // pp + 1) if near_even_chunks(L, pp * v, space.uneven_chunks)]
                             if pp > 1 else []) if sched.supports_vpp else [1] for sched in scheds]
                    vpps = [[v for v in vs if allowed(v, space.vpp_values)] for vs in vpps]
                    tails = [(ep, etp, sp, tpo) + opts + (epo, epd) for ep, etp in ep_etps for sp in sps
                             # Megatron-Core MoE: EP with TP, and expert TP other than TP, need SP
                             if not ((ep > 1 or etp != tp) and tp > 1 and not sp)
                             for tpo in (tpo_opts if tp > 1 and sp else [0]) for opts in shared_opts
                             for epo in (epo_opts if ep > 1 else [0])
                             for epd in dispatchers(ep, etp)]
                    if not tails:
                        continue
                    tail_id = len(tail_sets)
                    tail_sets.append(tails)
                    # with PP and no virtual stages the all-to-all overlap cannot run (Megatron-Core's rule), but
                    # under a schedule that pairs micro-batches itself (DualPipe's F&B)
                    plain = [t for t in tails if not t[-2]]  # (the all-to-all overlap's column, before "epd")
                    plain_id = len(tail_sets) if len(plain) < len(tails) else tail_id
                    if plain_id != tail_id:
                        tail_sets.append(plain)
                    for mb in mbs:
                        m = global_batch // (dp * mb)
                        key = (pp, m)  # the schedules' rules read only pp, m and v: walk them once per (pp, m)
                        runs = schedule_runs.get(key)
                        if runs is None:
                            runs = schedule_runs[key] = [
                                (s_idx, v, pp > 1 and v <= 1 and not sched.pairs_microbatches)
                                for s_idx, sched in enumerate(scheds) for v in vpps[s_idx]
                                if sched.name not in dominated and not sched.check(pp, m, v)]
                        for s_idx, v, no_overlap in runs:
                            if no_overlap and not plain:
                                continue
                            heads.append((tp, cp, k_idx, pp, mb, s_idx, v, plain_id if no_overlap else tail_id))
    if not heads:
        return np.zeros((0, len(GROUP_COLS)), dtype=GROUP_DTYPE)
    head = np.array(heads, dtype=GROUP_DTYPE)
    n_tails = np.array([len(t) for t in tail_sets], dtype=np.int64)
    offset = np.cumsum(n_tails) - n_tails
    flat_tails = np.array([pair for t in tail_sets for pair in t], dtype=GROUP_DTYPE)
    reps = n_tails[head[:, 7]]
    head_of = np.repeat(np.arange(len(head)), reps)  # each row's head and tail, then gathered column by column
    within = np.arange(len(head_of)) - np.repeat(np.cumsum(reps) - reps, reps)
    tail_of = np.repeat(offset[head[:, 7]], reps) + within
    # GROUP_COLS order: tp, cp, cp_kind, pp, ep, etp, mb, sched, vpp, sp, then the options
    out = np.empty((len(head_of), len(GROUP_COLS)), dtype=GROUP_DTYPE, order="F")  # columns contiguous: col() read most
    sources = [(head, j) for j in range(4)] + [(flat_tails, j) for j in range(2)] + \
        [(head, j) for j in range(4, 7)] + [(flat_tails, j) for j in range(2, flat_tails.shape[1])]
    for k, (src, j) in enumerate(sources):
        # mode "clip": the indices are in range, and an unchecked take writes straight into the column (the
        # default "raise" buffers the whole output first, 15x slower here)
        np.take(np.ascontiguousarray(src[:, j]), head_of if src is head else tail_of, out=out[:, k], mode="clip")
    return out


@dataclass(frozen=True)
class Rows:
    """Members of some groups: ``group`` indexes ``Space.groups``; ``rec`` uses the REC_* codes; ``hsdp`` 0 for
    ZeRO over all of DP, j >= 1 for HSDP with the shard size ``Space.hsdp_sizes(group)[j - 1]``."""

    group: np.ndarray
    zero: np.ndarray
    rec: np.ndarray
    hsdp: np.ndarray | None = None

    def __post_init__(self):
        if self.hsdp is None:
            object.__setattr__(self, "hsdp", np.zeros(len(self.group), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.group)

    def take(self, mask_or_idx: np.ndarray) -> "Rows":
        return Rows(self.group[mask_or_idx], self.zero[mask_or_idx], self.rec[mask_or_idx], self.hsdp[mask_or_idx])

    @property
    def column(self) -> np.ndarray:
        """Each row's (ZeRO stage, HSDP variant) column (``column_of``)."""
        return column_of(self.zero, self.hsdp)


#: ZeRO stages 0..3: the columns of one HSDP variant in the bounds' per-column tables (``column_of``)
ZERO_COLUMNS = len(ZERO_STAGES)


def column_of(zero, hsdp):
    """The column of ZeRO stage ``zero`` under HSDP variant ``hsdp`` (0: over all of DP) in the tables the bounds
    keep per (ZeRO stage, HSDP variant)."""
    return zero + ZERO_COLUMNS * hsdp


def recompute_k(rec: np.ndarray) -> np.ndarray:
    """Layers per stage fully recomputed by a REC_FULL_K code (0 for the other codes)."""
    return np.where(rec >= REC_FULL_K, rec - REC_FULL_K + 1, 0)


@dataclass(frozen=True)
class Space:
    """All groups of one planning request, and how to expand them into rows (configurations)."""

    groups: np.ndarray  # (n_groups, len(GROUP_COLS)) int64
    schedules: tuple[str, ...]
    num_layers: int
    num_gpus: int
    global_batch: int
    seq_len: int
    zero_stages: tuple[int, ...]
    rec_codes: tuple[int, ...]  # from REC_NONE, REC_SELECTIVE, REC_FULL_ALL
    partial_recompute: bool
    #: the options every row holds (``SearchSpace.fixed``)
    fixed: FixedOptions = FixedOptions()
    #: HSDP shard sizes (``hsdp_shards``): per distinct (TP, CP, PP, EP, expert TP) a row of S sizes in DP
    #: ranks, the valid ones first, 0 = none (``hsdp_table``), and each group's row of it (``hsdp_key``)
    hsdp_table: np.ndarray | None = None
    hsdp_key: np.ndarray | None = None
    #: the ZeRO stages of the HSDP rows (those of ``zero_stages`` HSDP runs with)
    hsdp_zero_stages: tuple[int, ...] = ()
    #: whether rows with ZeRO over all of DP are in the space (not when a user fixed --dp-shard)
    plain_rows: bool = True
    #: partial recomputation counts only dividing equal chunks (``SearchSpace.recompute_count_divides``)
    partial_divides: bool = False

    def col(self, name: str) -> np.ndarray:
        return self.groups[:, G[name]]

    @property
    def dp(self) -> np.ndarray:
        return self._derived()[0]

    @property
    def num_microbatches(self) -> np.ndarray:
        return self._derived()[1]

    def dp_of(self, tp, cp, pp):
        """The data-parallel degree of these TP, CP and PP degrees (numbers or arrays) on the request's GPUs."""
        return self.num_gpus // (tp * cp * pp)

    def _derived(self) -> tuple[np.ndarray, np.ndarray]:
        """(dp, num_microbatches) per group, computed once."""
        cached = self.__dict__.get("_cache")
        if cached is None:
            dp = self.dp_of(self.col("tp"), self.col("cp"), self.col("pp"))
            cached = (dp, self.global_batch // (dp * self.col("mb")))
            object.__setattr__(self, "_cache", cached)
        return cached

    def max_chunk(self) -> np.ndarray:
        """Largest chunk of the even split (``even_layer_split``): ceil(L / (pp * vpp)), per group."""
        return -(-self.num_layers // (self.col("pp") * self.col("vpp")))

    def _proper_divisors(self) -> np.ndarray:
        """(layers + 1, layers + 1): row c lists the divisors of c below c, then zeros (computed once)."""
        cached = self.__dict__.get("_divisor_table")
        if cached is None:
            cached = np.zeros((self.num_layers + 1, self.num_layers + 1), dtype=np.int64)
            for c in range(1, self.num_layers + 1):
                ds = divisors(c)[:-1]
                cached[c, :len(ds)] = ds
            object.__setattr__(self, "_divisor_table", cached)
        return cached

    def equal_chunks(self) -> np.ndarray:
        """Whether each group's layers split into equal model chunks."""
        return self.num_layers % (self.col("pp") * self.col("vpp")) == 0

    def rows_per_group(self) -> np.ndarray:
        cached = self.__dict__.get("_rows_per_group")
        if cached is None:
            n_partial = self.max_chunk() - 1
            if self.partial_divides:
                n_partial = np.where(self.equal_chunks(), (self._proper_divisors() > 0).sum(axis=1)[self.max_chunk()],
                                     0)
            if not (self.partial_recompute and REC_FULL_ALL in self.rec_codes):
                n_partial = np.zeros_like(n_partial)
            overlap = self.col("epo").astype(bool)
            n_codes = np.where(overlap, len(self.overlap_rec_codes), len(self.rec_codes))
            cached = (n_codes + np.where(overlap, 0, n_partial)) * self.zero_width()
            object.__setattr__(self, "_rows_per_group", cached)
        return cached

    @property
    def overlap_rec_codes(self) -> tuple[int, ...]:
        """The recomputation codes the MoE all-to-all overlap runs with (Megatron-Core's rules): not full
        recomputation, and not selective recomputation of whole MoE blocks ("moe")."""
        moe = recompute_module_on(self.fixed.recompute_modules, "moe")
        return tuple(c for c in self.rec_codes if c != REC_FULL_ALL and not (moe and c == REC_SELECTIVE))

    @property
    def hsdp_columns(self) -> int:
        """S: HSDP shard sizes a group may have (0 without HSDP rows)."""
        if self.hsdp_table is None or not self.hsdp_zero_stages:
            return 0
        return self.hsdp_table.shape[1]

    @property
    def column_count(self) -> int:
        """Columns of the per-(ZeRO stage, HSDP variant) tables: the stages of each variant, plain ZeRO included."""
        return ZERO_COLUMNS * (1 + self.hsdp_columns)

    def columns(self) -> list[int]:
        """The columns the space has rows in: its ZeRO stages over all of DP (unless a user fixed --dp-shard), and
        the stages HSDP runs with under each shard size."""
        plain = list(self.zero_stages) if self.plain_rows else []
        return plain + [column_of(z, j) for j in range(1, 1 + self.hsdp_columns) for z in self.hsdp_zero_stages]

    def hsdp_sizes(self, group: np.ndarray) -> np.ndarray:
        """(len(group), S): the groups' HSDP shard sizes, valid ones first, 0 = none."""
        return self.hsdp_table[self.hsdp_key[np.asarray(group, dtype=np.int64)]]

    def hsdp_count(self) -> np.ndarray:
        """HSDP shard sizes each group has rows for."""
        cached = self.__dict__.get("_hsdp_count")
        if cached is None:
            cached = np.zeros(len(self.groups), dtype=np.int64) if not self.hsdp_columns else \
                (self.hsdp_table > 0).sum(axis=1)[self.hsdp_key]
            object.__setattr__(self, "_hsdp_count", cached)
        return cached

    def zero_width(self) -> np.ndarray:
        """Rows of each group per recomputation variant: the plain ZeRO stages, then each HSDP shard size with the
        ZeRO stages HSDP runs with."""
        cached = self.__dict__.get("_zero_width")
        if cached is None:
            cached = len(self.zero_stages) * int(self.plain_rows) + self.hsdp_count() * len(self.hsdp_zero_stages)
            object.__setattr__(self, "_zero_width", cached)
        return cached

    def shard_of(self, group: np.ndarray, hsdp: np.ndarray) -> np.ndarray:
        """DP ranks ZeRO shards over for rows (``Rows.hsdp``): all of DP, or the HSDP shard size."""
        group, hsdp = np.asarray(group, dtype=np.int64), np.asarray(hsdp, dtype=np.int64)
        dp = self.dp[group]
        if not self.hsdp_columns or not hsdp.any():
            return dp
        shard = np.take_along_axis(self.hsdp_sizes(group), np.maximum(hsdp - 1, 0)[:, None], axis=1)[:, 0]
        return np.where(hsdp > 0, shard, dp)

    def size(self) -> int:
        """Number of configurations (rows) in the whole space."""
        return int(self.rows_per_group().sum()) if len(self.groups) else 0

    def expand(self, group_ids: np.ndarray) -> Rows:
        """All rows of the given groups."""
        group_ids = np.asarray(group_ids, dtype=np.int64)
        per = self.rows_per_group()[group_ids] if len(self.groups) else np.zeros(0, dtype=np.int64)
        idx = np.repeat(group_ids, per)
        start = np.repeat(np.cumsum(per) - per, per)
        off = np.arange(len(idx)) - start
        width = self.zero_width()[idx]
        k, r = off % np.maximum(width, 1), off // np.maximum(width, 1)
        n_plain = len(self.zero_stages) * int(self.plain_rows)
        zeros = np.array(self.zero_stages, dtype=np.int64)
        h_zeros = np.array(self.hsdp_zero_stages or (0,), dtype=np.int64)
        kk = np.maximum(k - n_plain, 0)  # past the plain stages: shard size kk // len(h_zeros), stage kk % len
        z = np.where(k < n_plain, zeros[np.minimum(k, len(zeros) - 1)], h_zeros[kk % len(h_zeros)])
        hsdp = np.where(k < n_plain, 0, kk // len(h_zeros) + 1)
        base = np.array(self.rec_codes, dtype=np.int64)
        nb = len(base)
        k = r - nb + 1  # full recomputation of the first k layers of each chunk, k = 1 ..
        if self.partial_divides and len(idx):  # the (r - nb + 1)-th divisor of the chunk size, below it
            table = self._proper_divisors()
            k = table[self.max_chunk()[idx], np.clip(r - nb, 0, table.shape[1] - 1)]
        rec = np.where(r < nb, base[np.minimum(r, nb - 1)], REC_FULL_K + k - 1)
        overlap = self.col("epo")[idx].astype(bool) if len(idx) else np.zeros(0, dtype=bool)
        if overlap.any():  # those groups' rows skip the codes the overlap cannot run with: the others, in order
            short = np.array(self.overlap_rec_codes, dtype=np.int64)
            rec = np.where(overlap, short[np.minimum(r, len(short) - 1)] if len(short) else rec, rec)
        return Rows(idx, z, rec, hsdp)

    def config(self, group: int, zero: int, rec: int, hsdp: int = 0) -> RunConfig:
        g = {name: int(self.groups[group, j]) for j, name in enumerate(GROUP_COLS)}
        mode = "none" if rec == REC_NONE else "selective" if rec == REC_SELECTIVE else "full"
        return RunConfig(
            dp_shard=int(self.hsdp_sizes([group])[0, hsdp - 1]) if hsdp else None,
            num_gpus=self.num_gpus, tp=g["tp"], pp=g["pp"], cp=g["cp"], ep=g["ep"], vpp=g["vpp"],
            etp=None if g["etp"] == g["tp"] else g["etp"],
            global_batch_size=self.global_batch, micro_batch_size=g["mb"], seq_len=self.seq_len,
            sequence_parallel=bool(g["sp"]), zero_stage=int(zero), recompute=mode,
            recompute_num_layers=int(rec) - REC_FULL_K + 1 if rec >= REC_FULL_K else None,
            schedule=self.schedules[g["sched"]], cp_kind=CP_KINDS[g["cp_kind"]], **self.fixed.as_dict(),
            **{field_: (g[col] if col == "grb" else EP_DISPATCHERS[g[col]] if col == "epd" else bool(g[col]))
               for col, field_ in OPTION_FIELDS.items()})


def build_space(model: ModelSpec, cluster: Cluster, num_gpus: int, global_batch: int, seq_len: int,
                space: SearchSpace = SearchSpace()) -> Space:
    rows = group_rows(model, cluster, num_gpus, global_batch, seq_len, space)
    # offloading runs without full recomputation, and offloads nothing inside a MoE block "moe" recomputes
    moe_offload = recompute_module_on(space.recompute_modules, "moe") and \
        bool({"expert_fc1", "moe_act"} & set(space.offload_modules.split(",")))
    rec_codes = tuple(code for mode, code in (("none", REC_NONE), ("selective", REC_SELECTIVE),
                                              ("full", REC_FULL_ALL)) if mode in space.recompute_modes
                      and not (mode == "full" and space.offload_modules)
                      and not (mode == "selective" and moe_offload))
    zero_stages = tuple(sorted(space.zero_stages))
    table, key = hsdp_shards(model, cluster, rows, num_gpus, space)
    return Space(groups=rows,
                 schedules=tuple(space.schedules), num_layers=model.num_layers, num_gpus=num_gpus,
                 global_batch=global_batch, seq_len=seq_len, zero_stages=zero_stages,
                 rec_codes=rec_codes, partial_recompute=space.partial_recompute, fixed=space.fixed,
                 partial_divides=space.recompute_count_divides, hsdp_table=table, hsdp_key=key,
                 hsdp_zero_stages=tuple(z for z in zero_stages if z in space.hsdp_zero_stages and z >= 1),
                 plain_rows=space.plain_zero)


def hsdp_shards(model: ModelSpec, cluster: Cluster, groups: np.ndarray, num_gpus: int,
                space: SearchSpace) -> tuple[np.ndarray, np.ndarray]:
    """The HSDP shard sizes (DP ranks) groups have rows for: the user's ``dp_shard_values``, else groups of DP ranks
    whose TP x CP x dp_shard GPUs fill ``hsdp_node_spans`` whole nodes. Valid (``validity``'s dp_shard rules): at
    least 2 and fewer than DP, dividing DP, and, for MoE models, an expert-data-parallel group that splits evenly
    into the dp / dp_shard replicas. They depend on (TP, CP, PP, EP, expert TP) only, so they are computed once per
    distinct tuple: returns (table, key), the sizes per distinct tuple (valid ones first, 0 = none) and each
    group's row of the table."""
    cols = [groups[:, G[c]].astype(np.int64) for c in ("tp", "cp", "pp", "ep", "etp")]
    if not len(groups):
        return np.zeros((0, 0), dtype=np.int64), np.zeros(0, dtype=np.int64)
    key = np.zeros(len(groups), dtype=np.int64)
    for c in cols:  # a mixed-radix code of the tuple (the radices multiply to at most ~1e14 here)
        key = key * (int(c.max()) + 1) + c
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    tp, cp, pp, ep, etp = (c[first] for c in cols)
    n = len(first)
    if space.dp_shard_values is not None:
        cand = np.broadcast_to(np.array(space.dp_shard_values, dtype=np.int64), (n, len(space.dp_shard_values)))
    else:
        span = np.array(space.hsdp_node_spans, dtype=np.int64) * cluster.gpus_per_node
        per = (tp * cp)[:, None]
        cand = np.where(span[None, :] % per == 0, span[None, :] // per, 0)
    if not cand.shape[1]:
        return np.zeros((n, 0), dtype=np.int64), inv.reshape(-1)
    dp = (num_gpus // (tp * cp * pp))[:, None]
    ok = (cand >= 2) & (cand < dp) & (dp % np.maximum(cand, 1) == 0)
    ok &= hsdp_splits_expert_dp(model, dp, cp[:, None], ep[:, None], tp[:, None], etp[:, None], cand)
    cand = np.where(ok, cand, 0)
    order = np.argsort(cand == 0, axis=1, kind="stable")  # valid ones first, in the given order
    return np.take_along_axis(cand, order, axis=1), inv.reshape(-1)
