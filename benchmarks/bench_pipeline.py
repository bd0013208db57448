"""How fast is ``pipeline_time``? Per schedule, for p=16 stages x 128 micro-batches and p=64 x 1024.

    python benchmarks/bench_pipeline.py

Stages: the first carries the embedding, the last the logits and loss (Megatron-style uneven
work): [F=1.1, B=2.2 x 1][F=1, B=2 x p-2][F=1.6, B=3.2 x 1] ms, a third of each backward being
the weight gradient W (split out by zb-h1 and dualpipe), DualPipe's F&B 0.85 of F+B+W. Rows:
gpipe and 1f1b without p2p latency (closed forms), 1f1b with 20 us of overlapped p2p, interleaved
1f1b with v=4 chunks, zb-h1, dualpipe (certified periodic extrapolation). Prints the first call
(which compiles and caches the schedule's dependency graph for the engine) and the median of
later calls, in microseconds, against the 100 us target. Always exits 0: it reports, it does not
gate; compare figures taken on the same machine.
"""

from __future__ import annotations

import statistics
import time

from meshplan.timeline.pipeline_schedule import StageWork, pipeline_time

TARGET_US = 100.0
CASES = [  # (label, schedule, virtual, p2p_s)
    ("gpipe", "gpipe", 1, 0.0),
    ("1f1b", "1f1b", 1, 0.0),
    ("1f1b, p2p 20 us overlapped", "1f1b", 1, 20e-6),
    ("1f1b interleaved v=4", "1f1b", 4, 0.0),
    ("zb-h1", "zb-h1", 1, 0.0),
    ("dualpipe", "dualpipe", 1, 0.0),
]


def stages(p: int) -> list[StageWork]:
    def work(f_ms: float, count: int, virtual: int) -> StageWork:
        f, full = f_ms * 1e-3 / virtual, 2 * f_ms * 1e-3 / virtual
        return StageWork(f, full * 2 / 3, full / 3, paired_s=0.85 * (f + full), count=count)

    return lambda v: [work(1.1, 1, v), work(1.0, p - 2, v), work(1.6, 1, v)]


def time_us(call, repeats: int) -> tuple[float, float]:
    start = time.perf_counter()
    call()
    first = (time.perf_counter() - start) * 1e6
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        runs.append((time.perf_counter() - start) * 1e6)
    return first, statistics.median(runs)


def main() -> None:
    print(f"{'p':>3} {'m':>5}  {'schedule':<28} {'first call':>12} {'median':>10}  target {TARGET_US:.0f} us")
    for p, m in [(16, 128), (64, 1024)]:
        layout = stages(p)
        for label, schedule, virtual, p2p in CASES:
            first, median = time_us(lambda: pipeline_time(layout(virtual), m, schedule, virtual, p2p), 20)
            verdict = "PASS" if median <= TARGET_US else "FAIL"
            print(f"{p:>3} {m:>5}  {label:<28} {first:>9.0f} us {median:>7.0f} us  {verdict}")


if __name__ == "__main__":
    main()
