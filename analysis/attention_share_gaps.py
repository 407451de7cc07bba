"""Does a row's gap follow its attention? The attention slowdown each published row would need to match.

An accuracy diagnostic, not part of the model. For each selected modern row (``compare.attention_gap``): its error e
(estimated over measured tokens/s per GPU, minus 1), the attention kernels' share a of its step (d log step / d log
attention time, by slowing every attention table of its profile 10%), and the slowdown k of the attention alone
that would close the gap, 1 + e / a (the step scales as 1 + a (k - 1)). A gap that is the attention kernel's needs
the same k on every row of one container, whatever the sequence length, TP, PP or CP; a gap in the GEMMs needs a k
that falls as attention takes over the step, a cost of the CP ring one that grows with the CP degree or the link.
``--left-out`` scores a row some fitted value is chosen on at that value refit without its source
(``fit.cross_validated_errors``), so that the fit does not hide its gap.

    python analysis/attention_share_gaps.py NeMo2403 NeMo2504 --left-out
    python analysis/attention_share_gaps.py NeMo2403 --kernel cudnn      # as if the rows ran the newer table

What it printed (2026-12-06): NeMo 24.03's nine H100 rows at the H100 cuDNN table (``--kernel cudnn``) need 1.39x
to 1.52x from 4K to 1M tokens (TP 1-8, PP 1-2, CP 1-32): the container's cuDNN 9.0 (README, "The gap is the
kernel"). NeMo 25.04's B200 rows with ring CP (32K-1M, CP 2-16, TP 1-4) need 1.13x-1.16x, its 8K and 16K rows
1.07x-1.08x with ``--left-out`` (B200's GEMM ratio refit without that release).
"""

from __future__ import annotations

import argparse
import json

from planner.validation.compare import attention_gap, load_modern_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prefixes", nargs="+", help="row id prefixes (e.g. NeMo2403 NeMo2504)")
    ap.add_argument("--kernel", help="price the rows' attention with this table instead of the one they name")
    ap.add_argument("--left-out", action="store_true", help="fitted rows at their value refit without their source")
    args = ap.parse_args()
    left_out = {}
    if args.left_out:
        from planner.validation.fit import cross_validated_errors
        left_out = cross_validated_errors()
    for run in load_modern_runs():
        if not run["id"].startswith(tuple(args.prefixes)):
            continue
        if args.kernel:
            run = json.loads(json.dumps(run))
            run["layout"]["attention_kernel"] = args.kernel
        e, share, k = attention_gap(run, None if args.kernel else left_out.get(run["id"]))
        layout = run["layout"]
        shape = (f"{layout['seq_len'] // 1024}K TP {layout.get('tp', 1)} PP {layout.get('pp', 1)} "
                 f"CP {layout.get('cp', 1)}")
        print(f"{run['id']:40s} {shape:24s} error {100 * e:+6.1f}%  attention share {share:.2f}  needs {k:.2f}x")


if __name__ == "__main__":
    main()
