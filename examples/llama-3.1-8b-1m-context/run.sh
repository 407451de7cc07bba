#!/usr/bin/env bash
# Llama-3.1-8B trained on 1,048,576-token sequences (8 sequences = 8M tokens per step) on 256 H100s.
# Context parallelism is the only way such a sequence fits: one layer's activations for 1M tokens are
# ~100 GiB on one GPU. Run from the repository root with the project installed (`pip install .`).
set -euo pipefail

SEQ=1048576
COMMON=(--model llama-3.1-8b --cluster h100-80gb-sxm --gpus 256 --global-batch 8 --seq-len "$SEQ")

# 1. Let the search choose every knob (TP, CP degree and kind, PP, DP, micro-batch, schedule, recompute, ZeRO).
planner plan "${COMMON[@]}" --top 3

# 2. The search's pick, evaluated alone: ring attention over 128 ranks (8192 tokens each), no TP.
planner estimate "${COMMON[@]}" --cp 128 --recompute none --zero 2

# 3. Two hand-made alternatives for comparison:
#    TP 8 inside the node with a 32-way ring across nodes (Megatron's usual long-context layout) ...
planner estimate "${COMMON[@]}" --tp 8 --cp 32 --recompute selective --zero 1
#    ... and DeepSpeed-Ulysses over 32 ranks (32 heads, so cp <= 32 with TP 1), which needs full recompute to fit.
planner estimate "${COMMON[@]}" --cp 32 --cp-kind ulysses --recompute full --zero 2
