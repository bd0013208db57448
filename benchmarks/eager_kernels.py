"""Two costs of PyTorch's own training loops that the fused frameworks do not pay, measured on one GPU.

    python benchmarks/eager_kernels.py measure OUT_DIR   # on an NVIDIA GPU (torch)
    python benchmarks/eager_kernels.py [DIR]             # the model against them (default: the H100 data)

- ``adam_step.csv``: one AdamW step over a model-like list of weights (4096 x 4096 matrices),
  PyTorch's default implementation on CUDA (``foreach``: one multi-tensor kernel per arithmetic
  step) and its single-kernel one (``fused=True``), fp32 or bf16 state, weight decay 0.1.
- ``unaligned_gemm.csv``: the output layer's three GEMMs (forward x·Wᵀ, input gradient dy·W,
  weight gradient dyᵀ·x) in bf16 for vocabularies that are a multiple of 8 (50304, GPT-2's
  vocabulary padded as nanoGPT pads it) and ones that are not (GPT-2's 50257, 32001), at hidden
  sizes 768-4096 and 4K or 16K tokens. A row that is not a multiple of 16 bytes keeps cuBLAS off
  its TMA kernels.

Each time is the median of CUDA-event-timed repetitions after warm-up.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "h100-sxm-eager"
ADAM_FIELDS = ["implementation", "dtype", "params", "tensors", "step_s"]
GEMM_FIELDS = ["pass", "m", "k", "n", "flop", "time_s"]
VOCABS = (50304, 50257, 32001)
HIDDEN = (768, 1024, 2048, 4096)
TOKENS = (4096, 16384)


def _median_s(fn, reps: int, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure_adam(path: Path) -> None:
    import torch

    side = 4096
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, ADAM_FIELDS)
        writer.writeheader()
        for tensors in (16, 64):
            for dtype in (torch.float32, torch.bfloat16):
                for implementation in ("foreach", "fused"):
                    params = [torch.nn.Parameter(torch.randn(side, side, device="cuda", dtype=dtype))
                              for _ in range(tensors)]
                    for p in params:
                        p.grad = torch.randn_like(p)
                    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1,
                                            **({"fused": True} if implementation == "fused" else {"foreach": True}))
                    step_s = _median_s(opt.step, reps=10)
                    writer.writerow(dict(implementation=implementation, dtype=str(dtype).removeprefix("torch."),
                                         params=tensors * side * side, tensors=tensors, step_s=f"{step_s:.6e}"))
                    print(f"adam {implementation:7s} {dtype} {tensors * side * side / 1e9:.2f}B: {step_s * 1e3:.2f} ms",
                          flush=True)


def measure_gemms(path: Path) -> None:
    import torch

    rows = [(m, k, n) for n in VOCABS for k in HIDDEN for m in TOKENS]
    rows.append((16383, 4096, 50304))  # tokens need no alignment: the row lengths are k and n
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, GEMM_FIELDS)
        writer.writeheader()
        for m, k, n in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            passes = {"forward": (lambda: x @ w.t(), (m, k, n)),
                      "input_grad": (lambda: dy @ w, (m, n, k)),
                      "weight_grad": (lambda: dy.t() @ x, (n, m, k))}
            for name, (fn, (a, b, c)) in passes.items():
                flop = 2.0 * m * k * n
                reps = max(3, min(20, int(2e13 / flop)))
                t = _median_s(fn, reps)
                writer.writerow({"pass": name, "m": a, "k": b, "n": c, "flop": f"{flop:.4e}", "time_s": f"{t:.6e}"})
                print(f"gemm {name:11s} {a:6d} {b:6d} {c:6d}: {flop / t / 1e12:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        measure_adam(out / "adam_step.csv")
        measure_gemms(out / "unaligned_gemm.csv")
        sys.exit(0)
    print("summary: see tests/test_eager_kernels.py")
