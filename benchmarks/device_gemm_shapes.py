"""The bf16 GEMMs of a decoder layer as Megatron-Core runs them, timed on a GPU against the profile's efficiency
curve (the measurement the H100 bf16 curve lacks: it is the A100 shape rescaled to one 8192^3 plateau, README).

    python benchmarks/device_gemm_shapes.py --dry-run               # here: the shapes and the curve's prediction
    python benchmarks/device_gemm_shapes.py --out $OUT/gemm.json    # on a lent GPU (device tool): time them

Per model and TP degree, the linear layers of one layer and the LM head on ``--tokens`` tokens (a micro-batch of 1
at the rows' 4,096): forward y = x W^T, and backward's input gradient dx = dy W and weight gradient dW = dy^T x, each
with its own operand layout (Megatron's column / row parallel linears through Transformer Engine: TN, NN, NT). Each
GEMM is timed with CUDA events over ``--iters`` calls after three warm-ups on random bf16 data; the JSON holds every
shape's measured TFLOP/s beside the profile's (peak x ``matmul_efficiency`` at that GEMM's FLOPs), and per model the
FLOP-weighted ratio of measured to predicted time. Nothing is fitted here: a profile change is a separate, cited
step. The default models are the Megatron-Core weak-scaling rows whose errors split by model size (README).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.specs.hardware import load_cluster  # noqa: E402
from planner.specs.model import load_model  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parents[1] / "planner" / "validation" / "models"
#: model (a shipped name or a file under planner/validation/models) and TP degree, as the weak-scaling rows ran them
DEFAULT_MODELS = ("megatron-ws-gpt-1.7b:1", "megatron-ws-gpt-7.1b:2", "megatron-ws-gpt-16b:4",
                  "megatron-ws-gpt-32b:8", "megatron-ws-gpt-177b:8")


def layer_gemms(model, tp: int, tokens: int) -> list[tuple[str, int, int, int]]:
    """(name, m, k, n) of the forward GEMMs y[m, n] = x[m, k] W^T of one layer and the LM head, on one TP rank."""
    h = model.hidden_size
    ffn_out = model.ffn_hidden_size * (2 if model.gated_mlp else 1)
    return [("qkv_proj", tokens, h, (model.q_dim + 2 * model.kv_dim) // tp),
            ("attn_out_proj", tokens, model.q_dim // tp, h),
            ("mlp_in", tokens, h, ffn_out // tp),
            ("mlp_out", tokens, model.ffn_hidden_size // tp, h),
            ("lm_head", tokens, h, model.vocab_size // tp)]


def passes(m: int, k: int, n: int) -> list[tuple[str, int, int, int]]:
    """The three GEMMs of a linear layer: forward (m x k by k x n), input gradient (m x n by n x k), weight gradient
    (k x m by m x n); each 2 m k n FLOPs."""
    return [("fwd", m, k, n), ("dgrad", m, n, k), ("wgrad", k, m, n)]


def load(ref: str):
    path = MODELS_DIR / f"{ref}.json"
    return load_model(str(path) if path.exists() else ref)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="model:tp,... (default: the weak-scaling rows)")
    ap.add_argument("--profile", default="h100-80gb-sxm", help="the hardware profile whose curve is compared")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="", help="write the JSON here (else print it)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: list the shapes and the curve's prediction")
    args = ap.parse_args()
    gpu = load_cluster(args.profile).gpu
    if not args.dry_run:
        import torch

        assert torch.cuda.is_available(), "no GPU: use --dry-run"
        device_name = torch.cuda.get_device_name()
    rows, summary = [], {}
    for item in args.models.split(","):
        ref, tp = item.rsplit(":", 1)
        model = load(ref)
        measured_s = predicted_s = 0.0
        for name, m, k, n in layer_gemms(model, int(tp), args.tokens):
            for kind, a, b, c in passes(m, k, n):
                flops = 2.0 * a * b * c
                eff = float(gpu.matmul_efficiency(flops))  # as compute.op_time_s reads it (bf16)
                pred = flops / (gpu.peak_flops * eff)
                row = {"model": ref, "tp": int(tp), "op": name, "pass": kind, "m": a, "k": b, "n": c,
                       "gflop": flops / 1e9, "predicted_efficiency": eff, "predicted_tflops": flops / pred / 1e12}
                if not args.dry_run:
                    t = time_gemm(a, b, c, kind, args.iters)
                    row.update(measured_ms=t * 1e3, measured_tflops=flops / t / 1e12,
                               measured_efficiency=flops / t / gpu.peak_flops)
                    measured_s += t
                predicted_s += pred
                rows.append(row)
        summary[item] = {"predicted_ms": predicted_s * 1e3,
                         **({"measured_ms": measured_s * 1e3, "measured_over_predicted": measured_s / predicted_s}
                            if not args.dry_run else {})}
    out = {"profile": args.profile, "tokens": args.tokens, "device": None if args.dry_run else device_name,
           "curve_log10_flops_efficiency": list(zip(gpu.matmul_efficiency.log10_flops,
                                                    gpu.matmul_efficiency.efficiency)),
           "summary": summary, "rows": rows}
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(json.dumps(summary, indent=1) if args.out else text)


def time_gemm(m: int, k: int, n: int, kind: str, iters: int) -> float:
    """Seconds per call of C[m x n] = A[m x k] B[k x n] with the operand layouts of a linear layer's pass (the
    layer's weight stored out x in, as PyTorch and Transformer Engine keep it; :func:`passes` gives the dims):
    forward A = x (row-major), B = W^T (W row-major); dgrad A = dy, B = W (both row-major); wgrad (dW^T = x^T dy)
    A = x^T (x row-major), B = dy (row-major)."""
    import torch

    dev, dt = "cuda", torch.bfloat16
    if kind == "fwd":
        a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(n, k, device=dev, dtype=dt).t()
    elif kind == "dgrad":
        a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
    else:
        a, b = torch.randn(k, m, device=dev, dtype=dt).t(), torch.randn(k, n, device=dev, dtype=dt)
    for _ in range(3):
        torch.matmul(a, b)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        torch.matmul(a, b)
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / 1e3 / iters


if __name__ == "__main__":
    main()
