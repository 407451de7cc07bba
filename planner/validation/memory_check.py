"""Check each profile's ``memory_bound_efficiency`` on published speeds of memory-bound kernels.

The rows (``memory_kernels.json``) are normalization kernels timed on a GPU, forward and backward, at the shapes of
real models. Priced as the cost model prices a norm (``planner.cost.compute.elementwise_ops``: a forward moves
``NORM_ELEMENTS`` elements per input element in bf16, a backward ``ELEMENTWISE_BWD_RATIO`` times that), a row implies
the fraction of the profile's HBM bandwidth the kernel reached: those bytes over its measured time, time-weighted
over its shapes and both directions. A check, never a fit: the profile keeps its own value and this says how far the
published kernels are from it.

    python -m planner.validation.memory_check
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from planner.cost.compute import ACT_BYTES, ELEMENTWISE_BWD_RATIO, NORM_ELEMENTS
from planner.specs.hardware import load_cluster

RUNS_FILE = Path(__file__).with_name("memory_kernels.json")


def load_rows(path: Path = RUNS_FILE) -> list[dict]:
    return json.loads(path.read_text())["runs"]


def implied_efficiency(row: dict) -> float:
    """The memory-bound efficiency ``row``'s kernel reached on its profile's HBM, in the cost model's bytes."""
    elements = np.prod(np.asarray(row["shapes"], dtype=float), axis=1)
    fwd_bytes = ACT_BYTES * NORM_ELEMENTS * elements
    model_bytes = float(np.sum(fwd_bytes * (1.0 + ELEMENTWISE_BWD_RATIO)))
    seconds = float(np.sum(row["fwd_ms"]) + np.sum(row["bwd_ms"])) * 1e-3
    return model_bytes / seconds / load_cluster(row["profile"]).gpu.hbm_bandwidth_bytes_per_s


def main() -> None:
    for row in load_rows():
        gpu = load_cluster(row["profile"]).gpu
        print(f"{row['profile']}: {row['kernel']} on {len(row['shapes'])} shapes implies "
              f"{implied_efficiency(row):.3f} of HBM; the profile's memory_bound_efficiency {gpu.memory_bound_efficiency}")


if __name__ == "__main__":
    main()
