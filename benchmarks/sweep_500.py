"""Time a 500-scenario what-if sweep (the issue's acceptance: under a minute on 2 cores, with a progress bar).

    python benchmarks/sweep_500.py [--jobs N] [--csv out.csv]

Scenarios: Llama-3.1-8B on 5 clusters x 5 GPU counts x 4 global batch sizes x 5 sequence lengths = 500
(``--model`` picks another model; each scenario runs the full branch-and-bound search).
"""

from __future__ import annotations

import argparse
import os
import time

import planner

CLUSTERS = ["a100-80gb-sxm", "h100-80gb-sxm", "h200-141gb-sxm", "b200-180gb", "mi300x-192gb"]
GPUS = [8, 16, 32, 64, 128]
GLOBAL_BATCHES = [128, 256, 512, 1024]
SEQ_LENS = [2048, 4096, 8192, 16384, 32768]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: all cores)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--model", default="llama-3.1-8b")
    args = ap.parse_args()
    t0 = time.perf_counter()
    df = planner.sweep(args.model, CLUSTERS, GPUS, GLOBAL_BATCHES, SEQ_LENS, processes=args.jobs, progress=True)
    elapsed = time.perf_counter() - t0
    if args.csv:
        df.to_csv(args.csv, index=False)
    print(f"{len(df)} scenarios ({int(df.feasible.sum())} feasible) in {elapsed:.1f} s on "
          f"{args.jobs or os.cpu_count()} processes ({elapsed / len(df) * 1e3:.0f} ms per scenario)")


if __name__ == "__main__":
    main()
