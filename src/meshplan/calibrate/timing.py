"""Timing one kernel: median of repeats after warm-up, rotating among input sets.

On a GPU each repeat is bracketed by CUDA events (no host synchronization inside the timed
region); the inputs rotate among enough sets that together exceed twice the L2 cache, so a
repeat does not find its operands on chip (the practice of nvbench and Triton's do_bench).

A short kernel is timed again with its repeats queued behind a spinning kernel that holds the
GPU until the host has issued them all (nvbench's blocking kernel), so each event pair times the
GPU's work, not PyTorch's dispatch: on the H100 machine eager dispatch took 20-50 us a call,
longer than a copy of 4 MB, and unqueued such rows measured the host (with the hold, calibrate's
fit of its memory ops there went from 15.3% to 0.7% median error, p90 44.5% to 5.4%). Long
kernels are not held: a GPU that idled behind the hold runs the next tens of milliseconds at
burst clocks, and queued 1 ms GEMMs on the H100 came out 8-10% faster than they sustain under
its power cap, which is what training sees. Whole layers are never held: there the host's
dispatch is part of what is measured (``kernels.layer_row``). On a CPU each repeat is timed with
``time.perf_counter`` around the call.
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


#: kernels timed faster than this are timed again, queued: eager dispatch (20-50 us a call on
#: the H100 machine) can fall behind them; a kernel this long always keeps ahead of its dispatch
QUEUE_BELOW_S = 100e-6
#: GPU cycles held per queued call: 100 us at 2 GHz, twice the slowest dispatch measured
HOLD_CYCLES_PER_CALL = 200_000


def median_time_s(run: Callable[[object], object], inputs: Sequence, device, warmup: int, repeats: int,
                  queued: bool = True) -> float:
    """Median seconds of ``run(inputs[i % len(inputs)])`` over ``repeats`` calls after ``warmup``;
    ``queued``: on a GPU, a kernel shorter than ``QUEUE_BELOW_S`` is timed again with its calls
    waiting behind a spinning kernel until all are issued, and that time is kept."""
    import torch

    for i in range(warmup):
        run(inputs[i % len(inputs)])
    if device.type == "cuda":
        seconds = _events_s(run, inputs, device, repeats, 0)
        if queued and seconds < QUEUE_BELOW_S and hasattr(torch.cuda, "_sleep"):
            seconds = _events_s(run, inputs, device, repeats, HOLD_CYCLES_PER_CALL * repeats)
        return seconds
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        run(inputs[i % len(inputs)])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _events_s(run: Callable[[object], object], inputs: Sequence, device, repeats: int, hold_cycles: int) -> float:
    """Median seconds between CUDA events around each call, after holding the GPU for
    ``hold_cycles`` (0: not held)."""
    import torch

    torch.cuda.synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    if hold_cycles:
        torch.cuda._sleep(hold_cycles)
    for i, (start, end) in enumerate(events):
        start.record()
        run(inputs[i % len(inputs)])
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in events) / 1e3
