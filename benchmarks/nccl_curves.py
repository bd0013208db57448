"""The model's bus bandwidth against every published nccl-tests curve in
tests/data/nccl_tests_busbw.csv: per system, collective and node count, the median and largest
error over the sizes, and the sizes within 15%.

    python benchmarks/nccl_curves.py              # the table
    python benchmarks/nccl_curves.py --fit-nvls   # refit NVLS_CHUNK_OVERHEAD_BYTES and
                                                  # NVLS_FILL_LOOPS (meshplan.network.algorithms)
    python benchmarks/nccl_curves.py --fit-p2p    # refit P2P_NVLINK_FRACTION
    python benchmarks/nccl_curves.py --fit-nvlink5  # refit the NVLink5 levels' efficiency
    python benchmarks/nccl_curves.py --fit-launch   # refit LAUNCH_PER_GPU_S and LAUNCH_PER_CHANNEL_S
                                                    # (meshplan.io.nccl_tests)

The fit is least squares on the relative bus-bandwidth error of one 8x H100 node's NVLS
all-reduce (h100-together-nvls) from 4 MiB up, where its one thread driving all 8 GPUs no longer
sets the time; the other curves are not used and test it. The NVLink send fraction is the
ratio of two slopes from 256 to 512 MiB of NVIDIA's 8x H100 alltoall_perf sweep
(h100-aiconfigurator): the measured time's, and the model's at the full link; the H200, A100 and
B200 sweeps give theirs for comparison. The NVLink5 levels' efficiency is fitted the same way on
the ring all-gather and reduce-scatter of NVIDIA's 8x B200 sweep (b200-aiconfigurator); GB200's
and GB300's 4-GPU sweeps are held out. The launch time a GPU of a thread that drives several
(nccl-tests -g), and what each channel of the call adds to it, are least squares over that NVLS
all-reduce up to 1 MiB (time / 8 GPUs against the channels NCCL runs each size on); its ring
runs, all-gathers and reduce-scatters, and SuperBench's 8x A100 node are held out.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_collective_algorithms import BUS_FACTOR, curve_points, measured_busbw, model_busbw  # noqa: E402

from meshplan import catalog  # noqa: E402
from meshplan.network import algorithms, tuner  # noqa: E402

FIT_SYSTEM, FIT_SMALLEST = "h100-together-nvls", 4 << 20
FIT_P2P = "h100-aiconfigurator"


def errors(rows) -> list[float]:
    return [model_busbw(r) / measured_busbw(r) - 1.0 for r in rows]


def table() -> None:
    curves = defaultdict(list)
    for row in curve_points():
        curves[(row["system"], row["collective"], int(row["nodes"]) * int(row["gpus_per_node"]))].append(row)
    print(f"{'system':34s} {'collective':15s} {'gpus':>4s} {'sizes':>14s} {'median':>7s} {'max':>7s} {'<=15%':>6s}")
    for (system, kind, gpus), rows in curves.items():
        e = np.abs(errors(rows))
        sizes = [float(r["size_bytes"]) for r in rows]
        span = f"{_size(min(sizes))}-{_size(max(sizes))}"
        print(f"{system:34s} {kind:15s} {gpus:4d} {span:>14s} {np.median(e):7.1%} {e.max():7.1%} {np.mean(e <= 0.15):6.0%}")


def _size(b: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.0f}{unit}"
    return f"{b:.0f}"


def fit_nvls() -> None:
    rows = [r for r in curve_points() if r["system"] == FIT_SYSTEM and r["collective"] == "all_reduce"
            and float(r["size_bytes"]) >= FIT_SMALLEST]
    best = None
    for overhead in np.arange(0.0, 30001.0, 500.0):
        for fill in np.arange(0.0, 3.01, 0.25):
            algorithms.NVLS_CHUNK_OVERHEAD_BYTES, algorithms.NVLS_FILL_LOOPS = float(overhead), float(fill)
            tuner.choose.cache_clear()
            score = float(np.sum(np.square(errors(rows))))
            if best is None or score < best[0]:
                best = (score, overhead, fill)
    _, overhead, fill = best
    algorithms.NVLS_CHUNK_OVERHEAD_BYTES, algorithms.NVLS_FILL_LOOPS = float(overhead), float(fill)
    tuner.choose.cache_clear()
    print(f"fitted on {FIT_SYSTEM} all_reduce >= {_size(FIT_SMALLEST)} ({len(rows)} sizes): "
          f"NVLS_CHUNK_OVERHEAD_BYTES {overhead:.0f}, NVLS_FILL_LOOPS {fill:.2f}, "
          f"max error {np.max(np.abs(errors(rows))):.1%}")
    for system in ("nd-h100-v5", "h100-xxrjun-1n"):
        held = [r for r in curve_points() if r["system"] == system and r["collective"] == "all_reduce"
                and float(r["size_bytes"]) >= 2 << 20]
        e = np.abs(errors(held))
        print(f"  held out: {system} all_reduce >= 2M ({len(held)} sizes): median {np.median(e):.1%}, max {e.max():.1%}")


def slope_ratio(system: str, kind: str, gpus: int) -> float:
    """The model's time slope from 256 to 512 MiB over the measured one, for one published curve."""
    rows = {float(r["size_bytes"]): r for r in curve_points() if r["system"] == system
            and r["collective"] == kind and int(r["gpus_per_node"]) == gpus}
    low, high = rows[256 << 20], rows[512 << 20]
    measured = float(high["time_us"]) - float(low["time_us"])
    model = [float(r["size_bytes"]) * BUS_FACTOR[kind](gpus) / model_busbw(r) / 1e3 for r in (low, high)]  # us
    return (model[1] - model[0]) / measured


def fit_p2p() -> None:
    algorithms.P2P_NVLINK_FRACTION = 1.0
    for system in ("h100-aiconfigurator", "h200-aiconfigurator", "a100-aiconfigurator", "b200-aiconfigurator"):
        fitted = " (the fit: P2P_NVLINK_FRACTION)" if system == FIT_P2P else ""
        print(f"{system}: NVLink sends at {slope_ratio(system, 'all_to_all', 8):.3f} of the link{fitted}")


def fit_nvlink5() -> None:
    efficiency = next(level.efficiency for level in catalog.cluster("dgx-b200").levels if level.name == "nvlink5")
    ratios = [slope_ratio("b200-aiconfigurator", kind, 8) for kind in ("all_gather", "reduce_scatter")]
    print(f"b200-aiconfigurator 8 GPUs, ring all-gather and reduce-scatter: the measured slope is "
          f"{np.mean(ratios):.3f} of the model's at efficiency {efficiency}: fitted efficiency {efficiency * np.mean(ratios):.3f}")
    for system in ("gb200-aiconfigurator", "gb300-aiconfigurator"):
        held = [r for r in curve_points() if r["system"] == system and r["collective"] in ("all_gather", "reduce_scatter", "all_reduce")
                and float(r["size_bytes"]) >= 64 << 20]
        e = np.abs(errors(held))
        print(f"  held out: {system} 4 GPUs, three collectives >= 64M ({len(held)} sizes): median {np.median(e):.1%}, max {e.max():.1%}")


#: the sizes whose time is the launches alone: the model's collective takes under 70% of it
LAUNCH_LARGEST = 1 << 20


def fit_launch() -> None:
    """LAUNCH_PER_GPU_S and LAUNCH_PER_CHANNEL_S: least squares of the time of Together AI's NVLS
    all-reduce up to 1 MiB (one thread launching each call on all 8 GPUs, nccl-tests -g 8) over
    its 8 GPUs, against the channels beyond the first that NCCL runs each size on."""
    from meshplan.costs.collectives import group_span
    from meshplan.io import nccl_tests

    rows = [r for r in curve_points() if r["system"] == FIT_SYSTEM and r["collective"] == "all_reduce"
            and float(r["size_bytes"]) <= LAUNCH_LARGEST]
    span = group_span(catalog.cluster("dgx-h100"), 8, 1)
    channels = []
    for r in rows:
        name, protocol, _ = tuner.choose("all_reduce", float(r["size_bytes"]), span)
        channels.append(algorithms.nccl_channels(float(r["size_bytes"]), span, name, protocol) - 1)
    per_gpu = np.array([float(r["time_us"]) * 1e-6 / int(r["gpus_per_thread"]) for r in rows])
    (per_channel, base), *_ = np.linalg.lstsq(np.column_stack([channels, np.ones(len(rows))]), per_gpu, rcond=None)
    print(f"fitted on {FIT_SYSTEM} all_reduce <= {_size(LAUNCH_LARGEST)} ({len(rows)} sizes, 1-{max(channels) + 1} "
          f"channels): LAUNCH_PER_GPU_S {base * 1e6:.2f} us, LAUNCH_PER_CHANNEL_S {per_channel * 1e9:.1f} ns")
    nccl_tests.LAUNCH_PER_GPU_S, nccl_tests.LAUNCH_PER_CHANNEL_S = float(base), float(per_channel)
    for system in ("h100-together-nvls", "h100-together-ring", "a100-40g-superbench"):
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            if (system, kind) == (FIT_SYSTEM, "all_reduce"):
                continue
            held = [r for r in curve_points() if r["system"] == system and r["collective"] == kind
                    and float(r["size_bytes"]) <= LAUNCH_LARGEST]
            e = np.abs(errors(held))
            print(f"  held out: {system} {kind} <= {_size(LAUNCH_LARGEST)} ({len(held)} sizes): "
                  f"median {np.median(e):.1%}, max {e.max():.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-nvls", action="store_true", help="refit the NVLS chunk cost and pipeline fill")
    parser.add_argument("--fit-p2p", action="store_true", help="refit the share of NVLink grouped sends reach")
    parser.add_argument("--fit-nvlink5", action="store_true", help="refit the NVLink5 levels' achieved fraction")
    parser.add_argument("--fit-launch", action="store_true", help="refit the launch time a GPU of nccl-tests -g")
    args = parser.parse_args()
    if args.fit_nvls:
        fit_nvls()
    elif args.fit_p2p:
        fit_p2p()
    elif args.fit_nvlink5:
        fit_nvlink5()
    elif args.fit_launch:
        fit_launch()
    else:
        table()


if __name__ == "__main__":
    csv.field_size_limit(1 << 20)
    main()
