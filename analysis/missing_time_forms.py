"""What form does a row's gap take? The time the model lacks, per step, per micro-batch and per token and layer.

An accuracy diagnostic, not part of the model. For each selected modern row (``compare.missing_time``): the measured
step less the model's (both from tokens/s per GPU, the published layout's tokens per step), per step, per
micro-batch of one pipeline replica, and per token and layer (the tokens a replica carries through a step times the
layers one GPU holds), with the attention slowdown that would close the gap (``compare.attention_gap``). Rows of
different layouts, containers and GPUs tell the forms apart: a cost paid once per step reads constant in the first
column, one paid per token the GPU computes in the last; an attention kernel's would need one slowdown at every
sequence length.

    python analysis/missing_time_forms.py GPT-OSS

What it printed (2026-12-06, 14 GPT-OSS-120B rows, bf16, Megatron-Bridge 25.11-26.04.01): on B200 and GB200 the
4K rows of 26.02-26.04.01 (EP 8 in a node, EP 64 over InfiniBand or over NVLink, all-to-all or HybridEP, with and
without the all-to-all overlap) lack 2.3-2.8 s a step, 0.78-0.94 us per token and layer; H100's four (PP 4, EP 8,
micro-batch 1) 4.4-4.8 s, 1.47-1.62 us, about twice Blackwell's, so the device spends it, not the host. The two
25.11 rows split the forms: B200 at global batch 512 (two micro-batches) lacks 2.15 s, 1.83 us; GB200 at 8K and
micro-batch 1 (twenty) 4.0 s, 0.68 us, so neither a per-step cost nor a per-token one alone reads the same on every
row. Attention alone would need 7-8x at 4K but 4.5x at 8K: not the attention kernel's rate.
"""

from __future__ import annotations

import argparse

from planner.validation.compare import attention_gap, load_modern_runs, missing_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("patterns", nargs="+", help="substrings of row ids (e.g. GPT-OSS Nemotron3Nano)")
    args = ap.parse_args()
    for run in load_modern_runs():
        if not any(p in run["id"] for p in args.patterns):
            continue
        layout = run["layout"]
        gap = missing_time(run)
        e, _, k = attention_gap(run)
        shape = (f"{layout['seq_len'] // 1024}K EP {layout.get('ep', 1)} PP {layout.get('pp', 1)} "
                 f"mb {layout['micro_batch_size']}")
        print(f"{run['id']:36s} {shape:22s} error {100 * e:+6.1f}%  lacks {gap.step_s:5.2f} s a step, "
              f"{gap.per_micro_batch_s:5.2f} s a micro-batch, {1e6 * gap.per_token_layer_s:5.2f} us a token and layer;"
              f" attention would need {k:4.1f}x")


if __name__ == "__main__":
    main()
