"""A GEMM run as chunks of its rows, back to back, as Transformer Engine's ring-exchange
userbuffers run a tensor-parallel GEMM (one chunk per rank as each arrives) and its pipelined
reduce-scatter (four chunks): does the kernel model price the chunks as the GPU runs them?

    python benchmarks/gemm_chunks.py measure OUT.csv   # on an NVIDIA GPU (torch)
    python benchmarks/gemm_chunks.py [CSV]             # the Hopper model against it

Shapes: Llama 3 70B's per-rank GEMMs at tensor parallel 4 (qkv, proj, fc1, fc2) and 8 (qkv8,
fc1_8), 8192 tokens, bf16 (``x @ W``) and fp8 (``torch._scaled_mm``, per-tensor scales, bf16
out). Each row: the rows split into 1, 2, 4 or 8 chunks, 20 repeats of all chunks between CUDA
events, the median of five such runs per repeat.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from meshplan.calibrate.table import read_rows

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "h100-sxm" / "gemm_chunks.csv"
SHAPES = {"qkv": (8192, 2560, 8192), "proj": (8192, 8192, 2048), "fc1": (8192, 14336, 8192),
          "fc2": (8192, 8192, 7168), "qkv8": (8192, 1280, 8192), "fc1_8": (8192, 7168, 8192)}
CHUNKS = (1, 2, 4, 8)
FIELDS = ["dtype", "gemm", "m", "n", "k", "chunks", "time_s"]


def measure(out: Path) -> None:
    import torch

    device = torch.device("cuda")

    def median_s(run, repeats: int = 20) -> float:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / repeats)
        return statistics.median(times)

    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        for dtype in ("bf16", "fp8"):
            for name, (m, n, k) in SHAPES.items():
                if dtype == "bf16":
                    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                    w = torch.randn(n, k, device=device, dtype=torch.bfloat16).t()
                    def gemm(a):
                        return a @ w
                else:
                    x = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
                    w = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
                    one = torch.ones((), device=device)
                    def gemm(a):
                        return torch._scaled_mm(a, w, one, one, out_dtype=torch.bfloat16)
                for chunks in CHUNKS:
                    parts = list(x.chunk(chunks, 0))
                    seconds = median_s(lambda: [gemm(p) for p in parts])
                    writer.writerow(dict(dtype=dtype, gemm=name, m=m, n=n, k=k, chunks=chunks, time_s=f"{seconds:.6e}"))
                    print(f"{dtype} {name:6s} chunks {chunks}: {seconds * 1e6:8.1f} us", flush=True)


def predicted_s(row: dict) -> float:
    """The Hopper kernel model's time of the row's chunks, one GEMM of m/chunks rows each."""
    from meshplan import catalog
    from meshplan.costs.compute import Roofline
    from meshplan.specs.device import BYTES_PER_ELEMENT

    device = catalog.device("h100-sxm5-80gb")
    roof = Roofline.of(device, catalog.efficiency(device.efficiency), row["dtype"])
    chunks = int(row["chunks"])
    return chunks * float(roof.matmul_s(int(row["m"]) // chunks, int(row["k"]), int(row["n"]), BYTES_PER_ELEMENT[row["dtype"]]))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        measure(Path(sys.argv[2]))
        sys.exit(0)
    rows = read_rows(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
    errors = []
    for row in rows:
        error = predicted_s(row) / float(row["time_s"]) - 1.0
        errors.append(abs(error))
        print(f"{row['dtype']} {row['gemm']:6s} chunks {row['chunks']}: measured {float(row['time_s']) * 1e6:8.1f} us, "
              f"model {error:+.1%}")
    print(f"median |error| {statistics.median(errors):.1%}, largest {max(errors):.1%} ({len(errors)} rows)")
