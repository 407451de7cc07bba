"""Partition benchmark: Llama-3.1-405B (128K vocabulary) on H100 80GB, tp 8, pp 16, dp 16; prints the per-rank
time and memory table of the even split (best uniform recomputation) against the planned partition, and the
partitioner's run time.

    /work/venv/bin/python benchmarks/bench_partition.py [micro_batch] [seq_len]
"""

from __future__ import annotations

import sys
import time

from planner.search.partition import partition, partition_report
from planner.specs.config import RunConfig
from planner.specs.hardware import load_cluster
from planner.specs.model import load_model


def main() -> None:
    mbs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    seq = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    model, cluster = load_model("llama-3.1-405b"), load_cluster("h100-80gb-sxm")
    cfg = RunConfig(num_gpus=2048, tp=8, pp=16, global_batch_size=2048, micro_batch_size=mbs, seq_len=seq,
                    recompute="none")
    print(partition_report(model, cluster, cfg))
    t0 = time.perf_counter()
    partition(model, cluster, cfg)
    print(f"\npartition() took {(time.perf_counter() - t0) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
