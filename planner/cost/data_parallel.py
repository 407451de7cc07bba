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


def exposed_s(comm_s, window_s, interference: float):
    """Communication overlapped with ``window_s`` of compute: what sticks out of the window, plus the share of the
    hidden part that still slows the compute stream (``GPU.comm_overlap_interference``)."""
    hidden = np.minimum(comm_s, window_s)
    return comm_s - hidden + hidden * interference


def expert_dp_degree(dp, cp, ep, tp=1, etp=None):
    """Ranks an expert's weights are replicated over (and ZeRO shards them over), Megatron-Core's expert-data-
    parallel group: TP x CP x DP / (EP x expert TP) (DP x CP / EP when expert TP = TP), at least 1."""
    etp = tp if etp is None else etp
    return np.maximum(1, np.asarray(dp) * cp * tp // (np.asarray(ep) * etp))


def dp_groups(cluster: Cluster, tp, cp, dp, ep, etp=None) -> tuple[comm.GroupPlacement, comm.GroupPlacement]:
    """(dense, expert) data-parallel groups: DP x CP ranks spaced TP apart (rank order tp-cp-ep-dp-pp), and the
    expert-data-parallel ranks spaced expert-TP x EP apart (the MoE grid etp-ep-edp)."""
    gpn = cluster.gpus_per_node
    etp = tp if etp is None else etp
    return (comm.place_group(np.asarray(dp) * cp, tp, gpn),
            comm.place_group(expert_dp_degree(dp, cp, ep, tp, etp), np.asarray(etp) * ep, gpn))


@dataclass(frozen=True)
class DPCollectives:
    """One GPU's data-parallel collectives for the parameters it holds (dense and expert groups added up)."""

    all_reduce_s: float | np.ndarray  # the gradients, all-reduced (ZeRO-0)
    reduce_scatter_s: float | np.ndarray  # the gradients, reduce-scattered (ZeRO-1/2/3)
    all_gather_s: float | np.ndarray  # the bf16 weights, all-gathered (ZeRO-1/2 after the step, ZeRO-3 per use)

    @property
    def zero3_per_gather_s(self):
        """ZeRO-3 traffic of one forward + backward of the GPU's weights: gathered twice, gradients scattered once."""
        return 2 * self.all_gather_s + self.reduce_scatter_s


def dp_collectives(cluster: Cluster, dense_group: comm.GroupPlacement, expert_group: comm.GroupPlacement,
                   dense_params, expert_params, grad_reduce_bytes) -> DPCollectives:
    """NCCL collectives (``planner.cost.comm``) over the dense and expert DP groups for the given parameters, added
    up; the gradients travel at ``grad_reduce_bytes`` per element, the weights in bf16. Per group, the two buffers
    (gradients, weights) go through one reduce-scatter evaluation along a leading axis (the all-gather is the same
    ring); the all-reduce is NCCL's fastest algorithm (``comm.all_reduce_s``: ring, tree or NVLink SHARP)."""
    def per_group(group: comm.GroupPlacement, params):
        buffers = np.stack(np.broadcast_arrays(params * grad_reduce_bytes, params * WEIGHT_BYTES))
        return comm.reduce_scatter_s(cluster, group, buffers)

    rs_dense, ag_dense = per_group(dense_group, dense_params)
    rs_expert, ag_expert = per_group(expert_group, expert_params)
    ar = comm.all_reduce_s(cluster, dense_group, dense_params * grad_reduce_bytes) + \
        comm.all_reduce_s(cluster, expert_group, expert_params * grad_reduce_bytes)
    return DPCollectives(all_reduce_s=ar, reduce_scatter_s=rs_dense + rs_expert, all_gather_s=ag_dense + ag_expert)


def dp_exposed_s(c: DPCollectives, zero_stage, fwd_s, bwd_s, recompute_s, num_microbatches, gathers_once_per_step,
                 overlap_grad_reduce, overlap_param_gather, interference: float):
    """Data-parallel time left on one pipeline rank's critical path per step (``fwd_s``, ``bwd_s``,
    ``recompute_s``: its forward, backward and recomputation time of one micro-batch).

    ZeRO-0/1/2 (Megatron DDP / distributed optimizer): the gradient collective overlaps the last micro-batch's
    backward when ``overlap_grad_reduce``, the weight all-gather the first forward when ``overlap_param_gather``;
    otherwise each is fully exposed. ZeRO-3: the per-micro-batch gathers and scatter overlap that micro-batch's
    compute, m times per step, or once per step over all m micro-batches when the schedule gathers once per step.
    """
    zero = np.asarray(zero_stage)
    t_mb = fwd_s + bwd_s + recompute_s
    z3_once = exposed_s(c.zero3_per_gather_s, num_microbatches * t_mb, interference)
    z3_each = num_microbatches * exposed_s(c.zero3_per_gather_s, t_mb, interference)
    z3 = np.where(gathers_once_per_step, z3_once, z3_each)
    grads = np.where(zero == 0, c.all_reduce_s, c.reduce_scatter_s)
    gather = np.where(zero == 0, 0.0, c.all_gather_s)
    z012 = np.where(overlap_grad_reduce, exposed_s(grads, bwd_s, interference), grads) + \
        np.where(overlap_param_gather, exposed_s(gather, fwd_s, interference), gather)
    return np.where(zero == 3, z3, z012)


def optimizer_step_s(local_params, gpu: GPU):
    """Adam over the parameters this GPU updates, memory-bound: ``ADAM_BYTES_PER_PARAM`` bytes each over HBM at the
    memory-bound kernels' efficiency."""
    return local_params * ADAM_BYTES_PER_PARAM / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_bound_efficiency)
