"""A 10,000-scenario hardware co-design sweep on both sweep backends (issue 15): the local process pool and
dask.distributed on a local cluster, timed side by side in one run, and the two frames compared row for row.

    python benchmarks/bench_sweep_backends.py            # 10,000 scenarios (minutes on two cores)
    python benchmarks/bench_sweep_backends.py 1000       # fewer

The scenarios: Llama-3.1-8B at sequence 4096, global batch 256, on 8-128 H100 variants whose HBM (10 values), NIC
bandwidth (10 values) and bf16 peak (20 values) vary: 2,000 profiles x 5 GPU counts.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pandas as pd

from planner.sweep import sweep


def main(n: int) -> None:
    hbm = list(np.linspace(40, 192, 10).round(1))
    nic = list(np.linspace(12.5, 100, 10).round(2))
    peak = list(np.linspace(500, 2500, 20).round(0))
    gpus = [8, 16, 32, 64, 128]
    while len(hbm) * len(nic) * len(peak) * len(gpus) > n and len(peak) > 1:
        peak = peak[:-1]
    vary = {"gpu.hbm_gib": hbm, "inter_node.bandwidth_gb_s": nic, "gpu.peak_bf16_tflops": peak}
    workers = os.cpu_count() or 1
    frames, times = {}, {}
    for backend in ("process", "dask"):
        t0 = time.perf_counter()
        frames[backend] = sweep("llama-3.1-8b", "h100-80gb-sxm", gpus, [256], [4096], vary=vary, processes=workers,
                                backend=backend)
        times[backend] = time.perf_counter() - t0
    pd.testing.assert_frame_equal(frames["process"], frames["dask"])
    rows = len(frames["process"])
    print(f"{rows:,} scenarios ({int(frames['process'].feasible.sum()):,} feasible), {workers} workers; "
          f"the two frames are equal row for row")
    for backend, seconds in times.items():
        print(f"  {backend:8s} {seconds:8.1f} s  {rows / seconds:8.1f} scenarios/s")
    print(f"  dask / process time: {times['dask'] / times['process']:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
