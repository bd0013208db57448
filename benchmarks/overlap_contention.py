"""How much a GEMM slows while a copy runs beside it on the same GPU: the contention behind a
profile's ``overlap_slowdown`` (compute seconds lost per second a collective runs beside it).

    python benchmarks/overlap_contention.py measure OUT.csv [sm] [ce]  # on an NVIDIA GPU (torch, triton)
    python benchmarks/overlap_contention.py [CSV]             # summarize (default: the H100 data)

A collective's kernels move data through the GPU the way a copy does. Two kinds are measured:

- ``sm``: a copy kernel of a few CTAs, each streaming its own slice of a 512 MiB buffer, as
  NCCL's kernels run one CTA per channel (16 to 32 channels on NVLink);
- ``ce``: back-to-back 256 MiB device-to-device copies, which CUDA runs on a copy engine, as
  Transformer Engine's ring-exchange userbuffers send (``use_ce``, its default).

Each GEMM shape (Llama 3 70B's per-rank GEMMs at tensor parallel 4 and 8192 tokens, and an 8192
square, in bf16 and fp8) runs 30 times on one stream, alone and then beside a copy started first
on another stream, sized to last three times as long; five rounds interleaved so that the card's
power-capped clock drifts through both; each time is the median of the rounds. slowdown =
beside / alone - 1; ``covered``, the least share of the GEMM loop the copy ran beside over the
rounds. The summary prints the median slowdown per copy kind and CTA count over the rows whose
copy covered the loop, next to the catalog profile's.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from meshplan.calibrate.fit import COVERED  # a row counts where the copy ran beside this share of the loop
from meshplan.calibrate.table import read_rows

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "h100-sxm" / "overlap_contention.csv"
FIELDS = ["dtype", "gemm", "m", "n", "k", "side", "ctas", "side_gbps", "alone_s", "beside_s", "slowdown",
          "covered", "sm_mhz_alone", "sm_mhz_beside"]
#: (m, n, k) of one tensor-parallel rank of Llama 3 70B at tp 4, 8192 tokens, and a square
SHAPES = {"qkv": (8192, 2560, 8192), "proj": (8192, 8192, 2048), "fc1": (8192, 14336, 8192),
          "fc2": (8192, 8192, 7168), "square": (8192, 8192, 8192)}
SM_CTAS = (8, 16, 24, 32, 48)
REPS, ROUNDS = 30, 5


def measure(out: Path, sides: tuple[str, ...] = ("sm", "ce")) -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def copy_loop(src, dst, n_per_cta, iters, BLOCK: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * n_per_cta
        for _ in range(iters):
            for off in range(0, n_per_cta, BLOCK):
                idx = base + off + tl.arange(0, BLOCK)
                tl.store(dst + idx, tl.load(src + idx))

    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        def sm_mhz():
            return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:  # no NVML: no clock column
        def sm_mhz():
            return ""

    device = torch.device("cuda")
    elements = 1 << 28  # 512 MiB of bf16
    src = torch.randn(elements, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    main, side = torch.cuda.Stream(), torch.cuda.Stream()
    # a 256 MiB copy-engine copy: 16 MiB ones were issued no faster than the GPU ran them, so
    # they ended before the GEMMs began (covered 0 on the H100 machine)
    chunk = 1 << 27

    def timed(stream, launch) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record()
            launch()
            end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    def sm_copy(ctas: int, iters: int) -> None:
        copy_loop[(ctas,)](src, dst, elements // ctas // 4096 * 4096, iters, BLOCK=4096, num_warps=8)

    def ce_copy(count: int) -> None:
        for i in range(count):
            offset = (i * chunk) % (elements - chunk)
            dst[offset:offset + chunk].copy_(src[offset:offset + chunk])

    sm_copy(1, 1)  # compile
    ce_copy(4)  # the copy engine's first use
    torch.cuda.synchronize()
    rates = {}  # side -> (seconds of one unit, bytes read and written per unit)
    for ctas in SM_CTAS if "sm" in sides else ():
        rates[("sm", ctas)] = (timed(side, lambda: sm_copy(ctas, 1)), 4 * (elements // ctas // 4096 * 4096) * ctas)
    if "ce" in sides:
        rates[("ce", 0)] = (timed(side, lambda: ce_copy(40)) / 40, 4 * chunk)

    def operands(dtype: str, m: int, n: int, k: int):
        if dtype == "bf16":
            xs = [torch.randn(m, k, device=device, dtype=torch.bfloat16) for _ in range(3)]
            ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16).t() for _ in range(3)]
            return lambda i: xs[i % 3] @ ws[i % 3]
        xs = [torch.randn(m, k, device=device).to(torch.float8_e4m3fn) for _ in range(3)]
        ws = [torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t() for _ in range(3)]
        one = torch.ones((), device=device)
        return lambda i: torch._scaled_mm(xs[i % 3], ws[i % 3], one, one, out_dtype=torch.bfloat16)

    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        for dtype in ("bf16", "fp8"):
            for name, (m, n, k) in SHAPES.items():
                gemm = operands(dtype, m, n, k)

                def loop():
                    for i in range(REPS):
                        gemm(i)

                for _ in range(3):
                    timed(main, loop)
                alone0 = timed(main, loop)
                for (kind, ctas), (unit_s, unit_bytes) in rates.items():
                    units = int(3 * alone0 / unit_s) + 1
                    alone, beside, covered, mhz_alone, mhz_beside = [], [], [], [], []
                    for _ in range(ROUNDS):
                        alone.append(timed(main, loop))
                        mhz_alone.append(sm_mhz())
                        marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                        with torch.cuda.stream(side):
                            marks[0].record()
                            sm_copy(ctas, units) if kind == "sm" else ce_copy(units)
                            marks[1].record()
                        with torch.cuda.stream(main):
                            marks[2].record()
                            loop()
                            marks[3].record()
                        torch.cuda.synchronize()
                        mhz_beside.append(sm_mhz())
                        loop_s = marks[2].elapsed_time(marks[3])
                        beside.append(loop_s / 1e3)
                        # the share of the GEMM loop the copy ran beside (it must cover it all),
                        # in ms from the copy's start: [0, copy end] against [loop start, loop end]
                        copy_end, loop_start, loop_end = (marks[0].elapsed_time(marks[i]) for i in (1, 2, 3))
                        inside = min(copy_end, loop_end) - max(0.0, loop_start)
                        covered.append(max(0.0, inside) / loop_s)
                    a, b = statistics.median(alone) / REPS, statistics.median(beside) / REPS
                    writer.writerow(dict(
                        dtype=dtype, gemm=name, m=m, n=n, k=k, side=kind, ctas=ctas,
                        side_gbps=f"{unit_bytes / unit_s / 1e9:.0f}", alone_s=f"{a:.6e}", beside_s=f"{b:.6e}",
                        slowdown=f"{b / a - 1:.4f}", covered=f"{min(covered):.3f}",
                        sm_mhz_alone=statistics.median(mhz_alone) if mhz_alone[0] != "" else "",
                        sm_mhz_beside=statistics.median(mhz_beside) if mhz_beside[0] != "" else ""))
                    f.flush()
                    print(f"{dtype} {name:6s} {kind} {ctas:2d}: {b / a - 1:+.3f} (covered {min(covered):.2f})", flush=True)




def summary(rows: list[dict]) -> dict[tuple[str, int], tuple[float | None, int, int]]:
    """Per (copy kind, CTAs): the median slowdown over the rows whose copy covered the GEMM loop
    (None: no such row), how many rows those are, and how many were measured."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["side"], int(r["ctas"])), []).append(r)
    out = {}
    for key, measured in sorted(groups.items()):
        values = [float(r["slowdown"]) for r in measured if float(r["covered"]) >= COVERED]
        out[key] = (statistics.median(values) if values else None, len(values), len(measured))
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        measure(Path(sys.argv[2]), tuple(sys.argv[3:]) or ("sm", "ce"))
        sys.exit(0)
    rows = read_rows(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
    from meshplan import catalog
    profile = catalog.efficiency("hopper").overlap_slowdown
    for (kind, ctas), (value, used, measured) in summary(rows).items():
        rate = statistics.median(float(r["side_gbps"]) for r in rows if r["side"] == kind and int(r["ctas"]) == ctas)
        label = f"sm copy, {ctas:2d} CTAs" if kind == "sm" else "copy engine     "
        if value is None:
            print(f"{label} ({rate:5.0f} GB/s): not measured, the copies ended before the GEMMs began")
        else:
            print(f"{label} ({rate:5.0f} GB/s): GEMMs {value:+.2f} slower per second beside "
                  f"({used} of {measured} rows covered)")
    print(f"hopper profile overlap_slowdown: {profile:.2f}")
