"""Collective microbenchmarks over the ranks ``torchrun`` launched (NCCL on GPUs, gloo on CPUs).

Sizes and bandwidths follow nccl-tests (NVIDIA, doc/PERFORMANCE.md): ``bytes`` is the buffer
size of the operation (all_gather: the gathered output; reduce_scatter: the input;
send_recv: what each rank sends), algbw = bytes / time, and the bus bandwidth, comparable with
a link's peak whatever the rank count n, is

    all_reduce                             busbw = algbw x 2(n-1)/n
    all_gather, reduce_scatter, all_to_all busbw = algbw x (n-1)/n
    send_recv                              busbw = algbw

A time is the median over repeats of the slowest rank's time (all ranks start together after a
barrier). With several nodes, each node's ranks are also measured alone (nodes = 1): the
scale-up level, then every rank: the scale-out level.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw (nccl-tests PERFORMANCE.md)."""
    if collective == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


def launched() -> bool:
    """Whether torchrun (or another launcher setting WORLD_SIZE) started this process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@dataclass(frozen=True)
class Group:
    handle: object  # a torch ProcessGroup (None: the default group)
    ranks: int
    nodes: int
    records: bool  # whether this rank writes the group's rows


def start(device_type: str):
    """Join the process group; (torch.distributed, this rank's device, groups to measure)."""
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // per_node)
    groups = []
    if nodes > 1 and per_node > 1:
        node_groups = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(nodes)]
        groups.append(Group(node_groups[rank // per_node], per_node, 1, rank == 0))
    groups.append(Group(None, world, nodes, rank == 0))
    return dist, device, groups


def elements(nbytes: int, ranks: int) -> int:
    """The fp32 elements a row of ``nbytes`` sends: a multiple of the ranks, at least one each."""
    return max(ranks, nbytes // 4 // ranks * ranks)


def key(collective: str, group: Group, nbytes: int) -> tuple:
    return (collective, group.ranks, group.nodes, nbytes)


def measure(dist, device, group: Group, collective: str, nbytes: int, warmup: int, repeats: int) -> tuple | None:
    """One row (collective, ranks, nodes, bytes, time_s, algbw, busbw), or None if this backend
    does not implement the collective."""
    import torch

    n = group.ranks
    count = elements(nbytes, n)
    op = _operation(dist, device, group.handle, collective, count, n)
    try:
        for _ in range(warmup):
            op()
    except (RuntimeError, NotImplementedError, ValueError):
        return None
    times = []
    for _ in range(repeats):
        dist.barrier(group=group.handle)
        _sync(device)
        start = time.perf_counter()
        op()
        _sync(device)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group.handle)
    seconds = statistics.median(slowest.tolist())
    size = count * 4
    algbw = size / seconds
    return (collective, n, group.nodes, size, seconds, f"{algbw / 1e9:.4g}", f"{algbw * bus_factor(collective, n) / 1e9:.4g}")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _operation(dist, device, group, collective: str, count: int, n: int) -> Callable[[], None]:
    import torch

    def buf(elements):
        return torch.randn(elements, device=device)

    if collective == "all_reduce":
        x = buf(count)
        return lambda: dist.all_reduce(x, group=group)
    if collective == "all_gather":
        x, out = buf(count // n), buf(count)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
        return lambda: gather(out, x, group=group)
    if collective == "reduce_scatter":
        x, out = buf(count), buf(count // n)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(out, x, group=group)
    if collective == "all_to_all":
        x, out = buf(count), buf(count)
        return lambda: dist.all_to_all_single(out, x, group=group)
    # send_recv: every rank sends to the next and receives from the previous (a ring shift)
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    to, frm = (rank + 1) % n, (rank - 1) % n
    if group is not None:
        to, frm = dist.get_global_rank(group, to), dist.get_global_rank(group, frm)
    x, out = buf(count), buf(count)

    def shift():
        ops = [dist.P2POp(dist.isend, x, to, group), dist.P2POp(dist.irecv, out, frm, group)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    return shift


#: interleaved rounds of an overlap row: the GEMM loop alone, then beside the collectives
OVERLAP_ROUNDS = 3


def overlap_key(device, group: Group, nbytes: int, dim: int) -> tuple:
    """The leading columns naming an overlap.csv row (the bytes as ``overlap`` sends them)."""
    dtype = "bf16" if device.type == "cuda" else "fp32"
    return (device.type, group.ranks, group.nodes, elements(nbytes, group.ranks) * 4, f"{dim}x{dim}x{dim} {dtype}")


def overlap(dist, device, group: Group, nbytes: int, dim: int, gemms: int, warmup: int) -> tuple:
    """One overlap.csv row: a loop of ``gemms`` square GEMMs of ``dim`` timed alone and beside
    all-gathers of ``nbytes`` over ``group`` that last the whole loop (queued on a side stream
    on a GPU, asynchronous in gloo's threads on a CPU). ``covered`` is the least share of the
    loop any rank ran beside the collectives; ``slowdown``, the GEMMs' extra seconds per second
    beside them (beside / alone - 1), the ranks' mean; the times are this rank's medians over
    ``OVERLAP_ROUNDS`` interleaved rounds. What a profile's overlap_slowdown is (calibrate/fit.py)."""
    import torch

    n = group.ranks
    count = elements(nbytes, n)
    x, out = torch.randn(count // n, device=device), torch.randn(count, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    cuda = device.type == "cuda"
    a, b = (torch.randn(dim, dim, device=device, dtype=torch.bfloat16 if cuda else torch.float32) for _ in range(2))

    def collective(async_op: bool = False):
        return gather(out, x, group=group.handle, async_op=async_op)

    def gemm_loop() -> None:
        for _ in range(gemms):
            torch.matmul(a, b)

    def timed(launch) -> float:
        """Seconds of ``launch()`` on the current stream."""
        if not cuda:
            start = time.perf_counter()
            launch()
            return time.perf_counter() - start
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3

    for _ in range(warmup):
        collective()
        gemm_loop()
    _sync(device)
    dist.barrier(group=group.handle)
    collective_s, alone_s = timed(collective), timed(gemm_loop)
    # as many collectives as last twice the loop, the same count on every rank
    calls = torch.tensor([2.0 * alone_s / max(collective_s, 1e-9) + 1.0], dtype=torch.float64, device=device)
    dist.all_reduce(calls, op=dist.ReduceOp.MAX, group=group.handle)
    calls = int(min(calls.item(), 10_000))
    side = torch.cuda.Stream(device) if cuda else None
    alone, beside, covered = [], [], []
    for _ in range(OVERLAP_ROUNDS):
        alone.append(timed(gemm_loop))
        dist.barrier(group=group.handle)
        _sync(device)
        if cuda:
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            with torch.cuda.stream(side):
                marks[0].record()
                for _ in range(calls):
                    collective()
                marks[1].record()
            marks[2].record()
            gemm_loop()
            marks[3].record()
            torch.cuda.synchronize(device)
            # ms from the collectives' start: [0, their end] against [loop start, loop end]
            end, loop_start, loop_end = (marks[0].elapsed_time(m) for m in marks[1:])
            beside.append((loop_end - loop_start) / 1e3)
            covered.append(max(0.0, min(end, loop_end) - max(0.0, loop_start)) / (loop_end - loop_start))
        else:
            works = [collective(async_op=True) for _ in range(calls)]
            start = time.perf_counter()
            gemm_loop()
            beside.append(time.perf_counter() - start)
            covered.append(0.0 if works[-1].is_completed() else 1.0)
            for work in works:
                work.wait()
    slowdown = torch.tensor([statistics.median(beside) / statistics.median(alone) - 1.0], dtype=torch.float64, device=device)
    least = torch.tensor([min(covered)], dtype=torch.float64, device=device)
    dist.all_reduce(slowdown, group=group.handle)
    dist.all_reduce(least, op=dist.ReduceOp.MIN, group=group.handle)
    return (*overlap_key(device, group, nbytes, dim), statistics.median(alone), statistics.median(beside), collective_s,
            f"{least.item():.3f}", f"{slowdown.item() / n:.4f}")


def plan(groups: list[Group], sizes: tuple[int, ...]) -> Iterator[tuple[Group, str, int]]:
    for group in groups:
        for collective in COLLECTIVES:
            for nbytes in sizes:
                yield group, collective, nbytes
