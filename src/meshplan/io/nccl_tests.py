"""Read the tables nccl-tests prints (NVIDIA/nccl-tests: all_reduce_perf, all_gather_perf,
reduce_scatter_perf, alltoall_perf, sendrecv_perf), so ``meshplan collective`` can set the
model beside a user's own measurements.

A log holds one or more tests, each opened by ``# Collective test starting: <name>_perf``
(nccl-tests 2.13 and later), listing its ranks (``#  Rank  0 Group  0 Pid ... on <host> device
0 ...``; older versions print no group) and a row per size: size (B), count, type, redop, root,
then time (us), algbw, busbw and #wrong out of place, and the same in place. Older versions
leave out root, and print no redop (or a blank one) for all_gather and alltoall, so a row is
read from its ends: size and count first, the two times 8 and 4 cells from the last. Sizes are
what nccl-tests and meshplan both call the buffer (doc/PERFORMANCE.md): an all-gather's
gathered output, a reduce-scatter's input, an all-to-all's send buffer. A bare table (no
header) is one test of the collective the caller names. ``# nThread T nGpus G`` says how many
GPUs each thread drove.

Where one thread drives several GPUs (``-g G``), it launches each call on them one after
another, and a GPU's kernel cannot finish before the last GPU's has started: with the launches
of the next iteration queued behind, a run times max(collective, G launches) per call
(``launch_floor_s``). A launch takes longer the more channels (thread blocks) NCCL runs the call
on, and NCCL adds channels as the buffer grows: on 8 H100s a call below 4 MiB takes 35 us on one
channel and 41-43 us on all 24, where one rank per GPU takes 10-34 us.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from meshplan.errors import MeshplanError

#: nccl-tests binaries -> meshplan's collective kinds
TESTS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
         "alltoall_perf": "all_to_all", "sendrecv_perf": "send_recv"}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_RANK = re.compile(r"^#\s*Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_THREADS = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+(\d+)")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")

#: seconds one thread takes to launch a collective on one more GPU, and more for each channel
#: the call runs on beyond the first (network.algorithms.nccl_channels): Together AI's 8x H100
#: node (nccl-tests -g 8, NCCL 2.26.2) times its NCCL-chosen all-reduce at 34.7-36.4 us from 8 B
#: to 32 KiB (one channel; the collective itself takes 15 us), rising to 41.5 us at 1 MiB (24
#: channels; the collective 28 us), where one rank per GPU takes 15-32 us. Least squares over its
#: 18 sizes from 8 B to 1 MiB, over 8 GPUs (benchmarks/nccl_curves.py --fit-launch; its ring
#: runs, all-gathers and reduce-scatters, and SuperBench's 8x A100 node, held out)
LAUNCH_PER_GPU_S = 4.44e-6
LAUNCH_PER_CHANNEL_S = 34.8e-9


def launch_floor_s(gpus_per_thread: int, channels: int = 1) -> float:
    """The least time a call on ``channels`` channels takes where one thread launches it on
    ``gpus_per_thread`` GPUs (module docstring); none with a thread per GPU."""
    if gpus_per_thread <= 1:
        return 0.0
    return gpus_per_thread * (LAUNCH_PER_GPU_S + LAUNCH_PER_CHANNEL_S * (channels - 1))


@dataclass
class NcclTest:
    """One test of a log: its collective (meshplan's kind; None where the log does not say), the
    ranks and hosts it listed, and (size bytes, out-of-place seconds, in-place seconds) rows."""

    collective: str | None
    ranks: int = 0
    hosts: set[str] = field(default_factory=set)
    rows: list[tuple[float, float, float]] = field(default_factory=list)
    gpus_per_thread: int = 1  # nccl-tests -g: the GPUs one thread launches the collective on

    @property
    def nodes(self) -> int:
        return max(1, len(self.hosts))


def read_nccl_tests(path: str | Path) -> list[NcclTest]:
    """The tests of an nccl-tests log, in the order it ran them; one error line if it has no table."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as err:
        raise MeshplanError("--nccl-tests", str(path), f"a readable nccl-tests output file ({err.strerror})") from None
    tests: list[NcclTest] = []
    current: NcclTest | None = None
    threads = 1  # printed once, before the first test, for every test of the run
    for line in text.splitlines():
        gpus = _THREADS.match(line)
        if gpus:
            threads = max(1, int(gpus.group(1)))
            if current is not None:
                current.gpus_per_thread = threads
        started = _START.match(line)
        if started:
            name = started.group(1)
            current = NcclTest(TESTS.get(name, name), gpus_per_thread=threads)
            tests.append(current)
            continue
        if current is None:  # a bare table, or a header nccl-tests older than 2.13 prints
            current = NcclTest(None, gpus_per_thread=threads)
            tests.append(current)
        rank = _RANK.match(line)
        if rank:
            current.ranks += 1
            current.hosts.add(rank.group(1))
            continue
        row = _row(line.split())
        if row is not None:
            current.rows.append(row)
    tests = [t for t in tests if t.rows]
    if not tests:
        raise MeshplanError("--nccl-tests", str(path),
                            "nccl-tests output: rows of size, count, type, redop, root, time, algbw, busbw, #wrong")
    return tests


def _row(words: list[str]) -> tuple[float, float, float] | None:
    """(size bytes, out-of-place seconds, in-place seconds) of one table row, or None for any
    other line or a row without a positive size and times. A row ends with time, algbw, busbw
    and #wrong out of place, then in place."""
    if len(words) < 11 or not all(_NUMBER.match(words[i]) for i in (0, 1, -8, -7, -6, -4, -3, -2)):
        return None
    size, out_of_place, in_place = float(words[0]), float(words[-8]), float(words[-4])
    if size <= 0 or out_of_place <= 0 or in_place <= 0:
        return None
    return size, out_of_place * 1e-6, in_place * 1e-6


def size_sweep(text: str) -> list[float]:
    """Sizes in bytes as nccl-tests' -b/-e/-f take them: ``MIN:MAX`` doubling from MIN to MAX,
    or a comma list; K, M, G and T are powers of 1024 (nccl-tests' -b 8 -e 8G)."""

    def one(item: str) -> float:
        match = _SIZE.match(item)
        if not match:
            raise MeshplanError("--sizes", text, "sizes such as 1K:8G (doubling from 1 KiB to 8 GiB) or 1M,64M,1G")
        return float(match.group(1)) * 1024.0 ** "_KMGT".index(match.group(2).upper() or "_")

    if ":" in text:
        low, _, high = text.partition(":")
        first, last = one(low), one(high)
        if not 0 < first <= last:
            raise MeshplanError("--sizes", text, "MIN:MAX with 0 < MIN <= MAX")
        sizes = [first]
        while sizes[-1] * 2 <= last:
            sizes.append(sizes[-1] * 2)
        return sizes
    sizes = [one(item) for item in text.split(",") if item.strip()]
    if not sizes or any(s <= 0 for s in sizes):
        raise MeshplanError("--sizes", text, "sizes above 0 bytes, such as 1M,64M,1G")
    return sizes
