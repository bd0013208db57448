"""Timing one kernel: median of repeats after warm-up, rotating among input sets.

On a GPU each repeat is bracketed by CUDA events (no host synchronization inside the timed
region); the inputs rotate among enough sets that together exceed twice the L2 cache, so a
repeat does not find its operands on chip (the practice of nvbench and Triton's do_bench). On a
CPU each repeat is timed with ``time.perf_counter`` around the call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def input_sets(make: Callable[[], object], bytes_per_set: float, device) -> list:
    """As many input sets as it takes to exceed twice the device's L2 cache (2 to 16 sets)."""
    import torch

    count = 2
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)
        count = int(min(16, max(2, -(-2 * l2 // max(bytes_per_set, 1)))))
    return [make() for _ in range(count)]


def median_time_s(run: Callable[[object], object], inputs: Sequence, device, warmup: int, repeats: int) -> float:
    """Median seconds of ``run(inputs[i % len(inputs)])`` over ``repeats`` calls after ``warmup``."""
    import torch

    for i in range(warmup):
        run(inputs[i % len(inputs)])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for i, (start, end) in enumerate(events):
            start.record()
            run(inputs[i % len(inputs)])
            end.record()
        torch.cuda.synchronize(device)
        return statistics.median(start.elapsed_time(end) for start, end in events) / 1e3
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        run(inputs[i % len(inputs)])
        times.append(time.perf_counter() - start)
    return statistics.median(times)
