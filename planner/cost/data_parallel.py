"""Data parallelism: the gradient reduction, the parameter gather of sharded optimizers and ZeRO-3, how much of it
compute hides, and the optimizer step. Every function broadcasts over arrays (a search's many configurations) as
over numbers (one configuration).

Collectives (``planner.cost.comm``) run over two groups: the DP x CP ranks for dense weights and the expert-data-
parallel ranks, DP x CP / EP, for expert weights (Megatron-Core's expert-data-parallel group). What each ZeRO stage
moves (Rajbhandari et al. 2020, Sec. 5; Megatron's distributed optimizer):

* stage 0 (DDP): all-reduce of the gradients;
* stages 1 / 2: reduce-scatter of the gradients, then all-gather of the updated bf16 weights;
* stage 3: per micro-batch, the weights gathered for forward and again for backward, and the gradients
  reduce-scattered; schedules that run each chunk's micro-batches back to back (breadth-first) gather once per step
  (Lamy-Poirier 2022, "Breadth-First Pipeline Parallelism", Sec. 4).

ZeRO-3 as the stacks run it (PyTorch FSDP, Zhao et al. 2023, "PyTorch FSDP", Sec. 3.3-3.4; torchtitan's
``fully_shard`` per transformer block; Megatron-FSDP and DeepSpeed ZeRO-3 likewise per module): the unit is a
decoder layer. Each unit's weights are all-gathered just before its forward, the next unit's gather prefetched
under this unit's compute; backward re-gathers each unit (but the last one of forward, which stays gathered) and
reduce-scatters its gradients, again one unit ahead / behind its compute. So each collective is a layer's worth of
bytes, paying the collective's latency once per layer, and the first gather and the last reduce-scatter of every
pass have no compute to hide under.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import comm
from planner.cost.memory import WEIGHT_BYTES
from planner.specs.hardware import GPU, Cluster

#: bytes of HBM traffic per parameter in Megatron's mixed-precision optimizer step (fp32 main gradients and
#: master weights, Micikevicius et al. 2018): inf-check and gradient-norm passes read the fp32 gradient twice
#: (8 B); fused Adam reads master weight, gradient, m and v (16 B) and writes master, m and v (12 B); the copy
#: of the master weights into the bf16 model weights reads 4 B and writes 2 B.
ADAM_BYTES_PER_PARAM = 8 + 16 + 12 + 6
#: of those, the two moments' reads and writes at 4 B each (m and v, read and written once)
ADAM_MOMENT_ACCESSES = 4


def exposed_s(comm_s, window_s, interference: float):
    """Communication overlapped with ``window_s`` of compute: what sticks out of the window, plus the share of the
    hidden part that still slows the compute stream (``GPU.comm_overlap_interference``)."""
    hidden = np.minimum(comm_s, window_s)
    return comm_s - hidden + hidden * interference


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals], Blom's approximation Phi^-1((n - 0.375) / (n + 0.25))
    (Blom 1958); 0 for one."""
    from statistics import NormalDist

    return 0.0 if n <= 1 else NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def packed_wait_s(attention_s, cv: float, dp: int, sequences: int, micro_batch: int):
    """Per step, the wait of the data-parallel ranks for the one whose packed sequences hold the most attention
    work (the "DP computational imbalance" of NVIDIA's Megatron-Core dynamic-CP post, 2026-01-28): a rank's
    attention time over its ``sequences`` (m b) sequences varies with standard deviation ``attention_s`` (per
    micro-batch of ``micro_batch`` sequences) / b x ``cv`` x sqrt(m b), and the step waits for the expected
    maximum of ``dp`` such ranks above their mean (:func:`expected_max_normal`). A normal approximation: it holds
    when a rank sums many documents and understates the tail when a few long ones dominate."""
    return expected_max_normal(dp) * np.asarray(attention_s) / micro_batch * cv * np.sqrt(sequences)


def expert_dp_degree(dp, cp, ep, tp=1, etp=None):
    """Ranks an expert's weights are replicated over (and ZeRO shards them over), Megatron-Core's expert-data-
    parallel group: TP x CP x DP / (EP x expert TP) (DP x CP / EP when expert TP = TP), at least 1."""
    etp = tp if etp is None else etp
    return np.maximum(1, np.asarray(dp) * cp * tp // (np.asarray(ep) * etp))


def expert_shard_degree(dp, cp, ep, tp=1, etp=None, replicas=1):
    """Ranks ZeRO shards an expert's states over: the expert-data-parallel group, split evenly into HSDP's
    ``replicas`` (dp / dp_shard; validity checks that it splits), each replica keeping the same shards."""
    return expert_dp_degree(dp, cp, ep, tp, etp) // np.asarray(replicas)


def hsdp_groups(cluster: Cluster, tp, cp, dp, ep, etp=None, dp_shard=None) -> tuple[comm.GroupPlacement,
                                                                                       comm.GroupPlacement]:
    """HSDP's replicate groups (dense, expert): each GPU's peers holding the same shard, one per shard group of
    ``dp_shard`` DP ranks, which sit outside it (FSDP2's mesh: replicate outer, shard inner; Megatron's distributed-
    optimizer instances likewise): dp / dp_shard members spaced the shard group's span apart. None: no HSDP."""
    if dp_shard is None:
        return None
    gpn = cluster.gpus_per_node
    etp = tp if etp is None else etp
    replicas = np.asarray(dp) // np.asarray(dp_shard)
    expert_shard = expert_shard_degree(dp, cp, ep, tp, etp, replicas)
    return (comm.place_group(replicas, np.asarray(tp) * cp * dp_shard, gpn),
            comm.place_group(replicas, np.asarray(etp) * ep * expert_shard, gpn))


def dp_groups(cluster: Cluster, tp, cp, dp, ep, etp=None, replicas=1, pp=1, dp_shard=None) -> tuple[
        comm.GroupPlacement, comm.GroupPlacement]:
    """(dense, expert) data-parallel groups: DP x CP ranks spaced TP apart (rank order tp-cp-ep-dp-pp), and the
    expert-data-parallel ranks spaced expert-TP x EP apart (the MoE grid etp-ep-edp). ``replicas``: ranks of one
    pipeline that hold the same stage (DualPipe's stage and its mirror, 2), which join the stage's data-parallel
    groups from another pipeline stage: in the same node only when the whole pipeline is (``pp``). ``dp_shard``
    (HSDP): the groups are the shard groups of that many DP ranks (x CP), their replicas are ``hsdp_groups``."""
    gpn = cluster.gpus_per_node
    etp = tp if etp is None else etp
    shard = dp if dp_shard is None else dp_shard  # HSDP: ZeRO's groups are the shard groups, inside the replicas
    hsdp = np.asarray(dp) // np.asarray(shard)
    dense = comm.place_group(np.asarray(shard) * cp, tp, gpn)
    expert = comm.place_group(expert_shard_degree(dp, cp, ep, tp, etp, hsdp), np.asarray(etp) * ep, gpn)
    replicas = np.asarray(replicas)
    if not np.any(replicas > 1):
        return dense, expert
    across = comm.pipeline_spans_nodes(cluster, tp, cp, dp, pp)

    def mirrored(g: comm.GroupPlacement) -> comm.GroupPlacement:
        size = np.asarray(g.size) * replicas
        # the whole group, copies included, in one node; rows without copies keep their own placement
        inside = ~np.asarray(g.spans_nodes) & (~across | (replicas <= 1))
        return comm.GroupPlacement(size=size, members_per_node=np.where(inside, size, g.members_per_node),
                                   spans_nodes=(size > 1) & ~inside)
    return mirrored(dense), mirrored(expert)


@dataclass(frozen=True)
class DPCollectives:
    """One GPU's data-parallel collectives for the parameters it holds (dense and expert groups added up)."""

    all_reduce_s: float | np.ndarray  # the gradients, all-reduced (ZeRO-0)
    reduce_scatter_s: float | np.ndarray  # the gradients, reduce-scattered (ZeRO-1/2, one bucketed pass)
    all_gather_s: float | np.ndarray  # the bf16 weights, all-gathered (ZeRO-1/2, after the step)
    unit_all_gather_s: float | np.ndarray = 0.0  # ZeRO-3: one unit's (layer's) weights, all-gathered
    unit_reduce_scatter_s: float | np.ndarray = 0.0  # ZeRO-3: one unit's gradients, reduce-scattered
    units: float | np.ndarray = 1.0  # ZeRO-3 units (layers) on the GPU

    @property
    def zero3_per_gather_s(self):
        """ZeRO-3 traffic of one forward + backward of the GPU's weights, unit by unit: every unit gathered for
        forward, all but the last gathered again for backward, every unit's gradients reduce-scattered."""
        return (2 * self.units - 1) * self.unit_all_gather_s + self.units * self.unit_reduce_scatter_s


#: bytes per element of a linear layer's weight all-gathered in fp8 (Transformer Engine's Float8Tensor; its scale
#: is one number per tensor)
FP8_WEIGHT_BYTES = 1


def gathered_linear_weight_bytes(precision, fp8_param_gather):
    """Bytes per element the sharded optimizer / FSDP all-gathers of a linear layer's weight: 1 where the weights
    are kept in per-tensor fp8 and gathered so (``RunConfig.fp8_param_gather`` with ``precision`` "fp8"; Megatron-Core
    param_and_grad_buffer.py gathers Float8Tensor parameters' fp8 data), else bf16's 2 (mxfp8 parameters are
    gathered in bf16 into the reused gradient buffer and cast to MXFP8 after: the same file,
    reuse_grad_buf_for_mxfp8_param_ag)."""
    on = np.asarray(fp8_param_gather, dtype=bool) & (np.asarray(precision) == "fp8")
    return np.where(on, FP8_WEIGHT_BYTES, WEIGHT_BYTES)


def dp_collectives(cluster: Cluster, dense_group: comm.GroupPlacement, expert_group: comm.GroupPlacement,
                   dense_params, expert_params, grad_reduce_bytes, units=1.0, replica_groups=None,
                   weight_bytes=(WEIGHT_BYTES, WEIGHT_BYTES)) -> DPCollectives:
    """NCCL collectives (``planner.cost.comm``) over the dense and expert DP groups for the given parameters, added
    up; the gradients travel at ``grad_reduce_bytes`` per element, the weights at ``weight_bytes`` (dense, expert:
    bytes per element, bf16's 2 unless the linear layers' weights are gathered in fp8,
    :func:`gathered_linear_weight_bytes`). Per group, the buffers
    (gradients, weights; whole, and one of ``units`` equal ZeRO-3 units) go through one reduce-scatter evaluation
    along a leading axis (the all-gather is the same ring); the all-reduce is NCCL's fastest algorithm
    (``comm.all_reduce_s``: ring, tree or NVLink SHARP)."""
    units = np.maximum(np.asarray(units, dtype=float), 1.0)

    def per_group(group: comm.GroupPlacement, params, bytes_per_weight):
        whole_grad, whole_weight = params * grad_reduce_bytes, params * bytes_per_weight
        buffers = np.stack(np.broadcast_arrays(whole_grad, whole_weight, whole_grad / units, whole_weight / units))
        return comm.reduce_scatter_s(cluster, group, buffers)

    rs_dense, ag_dense, urs_dense, uag_dense = per_group(dense_group, dense_params, weight_bytes[0])
    rs_expert, ag_expert, urs_expert, uag_expert = per_group(expert_group, expert_params, weight_bytes[1])
    if replica_groups is not None:
        # HSDP (Zhao et al. 2023, "PyTorch FSDP", Sec. 3.2.2, hybrid sharding): after the reduce-scatter inside the
        # shard group, each GPU all-reduces its gradient shard with the replicas of its shard (in the same window)
        rep = comm.all_reduce_s(cluster, replica_groups[0], dense_params / dense_group.size * grad_reduce_bytes) + \
            comm.all_reduce_s(cluster, replica_groups[1], expert_params / expert_group.size * grad_reduce_bytes)
        rs_dense, urs_dense = rs_dense + rep, urs_dense + rep / units
    ar = comm.all_reduce_s(cluster, dense_group, dense_params * grad_reduce_bytes) + \
        comm.all_reduce_s(cluster, expert_group, expert_params * grad_reduce_bytes)
    return DPCollectives(all_reduce_s=ar, reduce_scatter_s=rs_dense + rs_expert, all_gather_s=ag_dense + ag_expert,
                         unit_all_gather_s=uag_dense + uag_expert, unit_reduce_scatter_s=urs_dense + urs_expert,
                         units=units)


def zero3_exposed_per_microbatch_s(c: DPCollectives, fwd_s, bwd_s, interference: float):
    """ZeRO-3 time one micro-batch leaves exposed, unit by unit (the module docstring): the first gather of forward
    and the last reduce-scatter of backward in full; the other units' gathers under the previous unit's forward
    (the n - 1 of them against (n - 1)/n of ``fwd_s``), their re-gathers and reduce-scatters under the neighbouring
    units' backward (``bwd_s``, recomputation included)."""
    n = c.units
    ag, rs = c.unit_all_gather_s, c.unit_reduce_scatter_s
    rest = (n - 1) / n
    return ag + rs + exposed_s((n - 1) * ag, rest * fwd_s, interference) + \
        exposed_s((n - 1) * (ag + rs), rest * bwd_s, interference)


def dp_exposed_s(c: DPCollectives, zero_stage, fwd_s, bwd_s, recompute_s, num_microbatches, gathers_once_per_step,
                 overlap_grad_reduce, overlap_param_gather, interference: float):
    """Data-parallel time left on one pipeline rank's critical path per step (``fwd_s``, ``bwd_s``,
    ``recompute_s``: its forward, backward and recomputation time of one micro-batch).

    ZeRO-0/1/2 (Megatron DDP / distributed optimizer): the gradient collective overlaps the last micro-batch's
    backward when ``overlap_grad_reduce``, the weight all-gather the first forward when ``overlap_param_gather``;
    otherwise each is fully exposed. ZeRO-3: unit by unit (:func:`zero3_exposed_per_microbatch_s`) in every
    micro-batch, or once per step when the schedule gathers once per step, then the first unit's gather and the
    last unit's reduce-scatter stick out and the rest hides under all m micro-batches' compute.
    """
    zero = np.asarray(zero_stage)
    t_mb = fwd_s + bwd_s + recompute_s
    edges = c.unit_all_gather_s + c.unit_reduce_scatter_s
    z3_once = edges + exposed_s(c.zero3_per_gather_s - edges, num_microbatches * t_mb, interference)
    z3_each = num_microbatches * zero3_exposed_per_microbatch_s(c, fwd_s, bwd_s + recompute_s, interference)
    z3 = np.where(gathers_once_per_step, z3_once, z3_each)
    grads = np.where(zero == 0, c.all_reduce_s, c.reduce_scatter_s)
    gather = np.where(zero == 0, 0.0, c.all_gather_s)
    z012 = np.where(overlap_grad_reduce, exposed_s(grads, bwd_s, interference), grads) + \
        np.where(overlap_param_gather, exposed_s(gather, fwd_s, interference), gather)
    return np.where(zero == 3, z3, z012)


def optimizer_step_s(local_params, gpu: GPU, adam_moment_bytes=4):
    """Adam over the parameters this GPU updates, memory-bound: ``ADAM_BYTES_PER_PARAM`` bytes each over HBM at the
    memory-bound kernels' efficiency, the moments' four accesses at ``adam_moment_bytes`` (bf16 moments: 34 B)."""
    per_param = ADAM_BYTES_PER_PARAM + ADAM_MOMENT_ACCESSES * (np.asarray(adam_moment_bytes) - 4)
    return local_params * per_param / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_bound_efficiency)
