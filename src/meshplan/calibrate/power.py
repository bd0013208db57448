"""Sustained power: seconds of back-to-back kernels under the GPU's energy counter (power.csv).

Each workload runs back to back for ``seconds`` after a warm-up (so the clocks and the power
manager have settled, as under a training step's long GEMMs), and the board's energy counter is
read before and after: NVML's ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the
driver loaded; Volta and newer), whose difference over the run is exact where sampled power
is not. A background thread samples the power (``nvmlDeviceGetPowerUsage``) and SM clock
(``nvmlDeviceGetClockInfo``) for their medians. The workloads and columns are those of
``shared/calibration/h100-sxm/power.csv``: idle, bf16 GEMMs at a few sizes, an FP8 GEMM where
the device has FP8, a streaming HBM copy and add, and a copy small enough to stay in L2.
``calibrate/fit_power.py`` fits the profile's power model on them.

The counter sits behind ``Meter`` (start a workload, stop: its energy) so a test can count
deterministic joules on a CPU; ``open_meter`` gives NVML's, or a note saying why there is none.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

#: seconds of each workload per batch of calls between synchronizations (and progress updates)
BATCH_S = 0.05
#: seconds between the sampler's readings of power and SM clock
SAMPLE_S = 0.05


@dataclass(frozen=True)
class Reading:
    """What a meter saw over one workload: the energy the counter moved by, and the medians of
    the power and SM clock it sampled (None where it samples neither)."""

    energy_j: float
    power_w_median: float | None = None
    sm_mhz_median: float | None = None


class MeterError(RuntimeError):
    """The counter could not be read (the measurement of power stops, with a note)."""


class Meter(Protocol):
    """An energy counter read around each workload; ``start`` and ``stop`` raise MeterError
    where it cannot be read."""

    def start(self, workload: str) -> None: ...

    def stop(self) -> Reading: ...

    def close(self) -> None: ...


class NvmlMeter:
    """The NVML energy counter of one GPU, with power and SM clock sampled in a thread."""

    def __init__(self, pynvml, handle):
        self._nvml, self._handle = pynvml, handle
        self._start_mj = 0
        self._samples: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, workload: str) -> None:
        self._samples = []
        self._done.clear()
        self._start_mj = self._energy_mj()
        self._thread = threading.Thread(target=self._sample, name=f"nvml {workload}", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        nvml = self._nvml
        while not self._done.wait(SAMPLE_S):
            try:
                self._samples.append((nvml.nvmlDeviceGetPowerUsage(self._handle) / 1e3,
                                      float(nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM))))
            except nvml.NVMLError:  # a sample missed is a sample fewer; the counter decides
                pass

    def stop(self) -> Reading:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        end_mj = self._energy_mj()
        watts = [w for w, _ in self._samples]
        mhz = [c for _, c in self._samples]
        return Reading((end_mj - self._start_mj) / 1e3, statistics.median(watts) if watts else None,
                       statistics.median(mhz) if mhz else None)

    def _energy_mj(self) -> int:
        try:
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except self._nvml.NVMLError as err:
            raise MeterError(f"NVML's energy counter could not be read ({err})") from None

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


def open_meter(device) -> tuple[Meter | None, str | None]:
    """NVML's meter for ``device`` (a torch device), or (None, a note saying why there is none)."""
    if device.type != "cuda":
        return None, f"power not measured: NVML reads NVIDIA GPUs and this run is on the {device.type.upper()}"
    try:
        import pynvml
    except ImportError:
        return None, "power not measured: nvidia-ml-py is not installed (pip install 'meshplan[calibrate]')"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return None, f"power not measured: NVML did not start ({err})"
    try:
        handle = _handle(pynvml, device)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # Volta and newer have the counter
    except pynvml.NVMLError as err:
        pynvml.nvmlShutdown()
        return None, f"power not measured: this GPU's NVML energy counter cannot be read ({err})"
    return NvmlMeter(pynvml, handle), None


def _handle(pynvml, device):
    """NVML's handle of the GPU PyTorch calls ``device``: matched by UUID, since
    CUDA_VISIBLE_DEVICES renumbers CUDA's devices but not NVML's."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        uuid = str(uuid)  # e.g. 0b42632a-bc5c-f731-724b-6936a19c4b24; NVML prefixes GPU-
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)


@dataclass(frozen=True)
class Workload:
    """One row of power.csv: ``make()`` allocates the inputs and returns one call of the kernel
    (None: idle); each call does ``flop`` and moves ``bytes`` (inputs read and outputs written once)."""

    name: str
    flop: float
    bytes: float
    make: Callable[[], Callable[[], object]] | None


def size_label(nbytes: int) -> str:
    """1073741824 -> 1GiB, 16777216 -> 16MiB (as the shared file names its rows)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


def l2_resident_bytes(device, largest: int) -> int:
    """The copy that stays in L2: the largest power of two, at most ``largest``, whose source
    and destination together fill at most 70% of the device's L2 (H100's 50 MB: 16 MiB)."""
    import torch

    if device.type != "cuda":
        return largest
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    size = largest
    while size > 4096 and 2 * size > 0.7 * l2:
        size //= 2
    return size


def workloads(device, gemm_sizes: tuple[int, ...], hbm_bytes: int, l2_bytes: int, fp8: bool) -> list[Workload]:
    """Idle, bf16 GEMMs of ``gemm_sizes``, an FP8 GEMM of the largest (where ``fp8``), an HBM copy
    and add of ``hbm_bytes`` per tensor and an L2-resident copy of ``l2_bytes``: bf16 data."""
    import torch

    def gemm(n: int):
        a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
        out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        return lambda: torch.matmul(a, b, out=out)

    def gemm_fp8(n: int):
        one = torch.ones((), device=device, dtype=torch.float32)
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt needs
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    def stream(nbytes: int, add: bool):
        a, b, out = (torch.randn(nbytes // 2, device=device, dtype=torch.bfloat16) for _ in range(3))
        return (lambda: torch.add(a, b, out=out)) if add else (lambda: out.copy_(a))

    rows = [Workload("idle", 0.0, 0.0, None)]
    rows += [Workload(f"gemm_bf16_{n}", 2.0 * n ** 3, 3 * 2.0 * n * n, lambda n=n: gemm(n)) for n in sorted(gemm_sizes, reverse=True)]
    if fp8:
        n = max(gemm_sizes)
        rows.append(Workload(f"gemm_fp8_{n}", 2.0 * n ** 3, (1.0 + 1.0 + 2.0) * n * n, lambda: gemm_fp8(n)))
    hbm, l2 = size_label(hbm_bytes), size_label(l2_bytes)
    rows += [Workload(f"hbm_copy_{hbm}", 0.0, 2.0 * hbm_bytes, lambda: stream(hbm_bytes, False)),
             Workload(f"hbm_add_{hbm}", hbm_bytes / 2, 3.0 * hbm_bytes, lambda: stream(hbm_bytes, True)),
             Workload(f"l2_copy_{l2}", 0.0, 2.0 * l2_bytes, lambda: stream(l2_bytes, False))]
    return rows


def measure(w: Workload, device, meter: Meter, seconds: float, progress: Callable[[float], None] | None = None) -> tuple:
    """One power.csv row: ``w`` back to back for ``seconds`` (after a warm-up of up to 2 s) with
    ``meter`` read around it; ``progress`` is told the fraction done as it runs."""
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    warmup_s = min(2.0, seconds / 2)
    call = w.make() if w.make is not None else None
    batch = 1
    if call is not None:
        call()
        sync()
        started = time.perf_counter()
        call()
        sync()
        batch = max(1, int(BATCH_S / max(time.perf_counter() - started, 1e-9)))
    _sustain(call, batch, warmup_s, sync)
    meter.start(w.name)
    started = time.perf_counter()
    calls = _sustain(call, batch, seconds, sync, lambda elapsed: progress and progress(min(1.0, elapsed / seconds)))
    elapsed = time.perf_counter() - started
    reading = meter.stop()
    return _row(w, elapsed, calls, reading)


def _sustain(call, batch: int, seconds: float, sync, tick: Callable[[float], object] | None = None) -> int:
    """Calls of ``call`` in batches of ``batch`` until ``seconds`` have passed (None: sleep)."""
    started, calls = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - started) < seconds:
        if call is None:
            time.sleep(min(BATCH_S, seconds - elapsed))
        else:
            for _ in range(batch):
                call()
            sync()
            calls += batch
        if tick:
            tick(time.perf_counter() - started)
    return calls


def _row(w: Workload, seconds: float, calls: int, reading: Reading) -> tuple:
    """The row in power.csv's columns and formats (table.COLUMNS); idle has no work columns."""
    flop, nbytes = w.flop * calls, w.bytes * calls
    idle = w.make is None
    return (
        w.name, f"{seconds:.3f}", calls, f"{reading.energy_j:.2f}", f"{reading.energy_j / seconds:.1f}",
        "" if reading.power_w_median is None else f"{reading.power_w_median:.3f}",
        "" if reading.sm_mhz_median is None else f"{reading.sm_mhz_median:.0f}",
        "" if idle else int(flop), "" if idle else int(nbytes),
        "" if idle else f"{flop / seconds / 1e12:.5g}", "" if idle else f"{nbytes / seconds / 1e9:.5g}",
    )
