"""One calibration run: what to measure, skipping rows already in ``out`` (resume), row by row.

Started alone, it measures the kernels on one device (GEMMs at the model's shapes and a square
sweep, FP8 GEMMs where the device has them, attention, memory ops, whole decoder layers and a
probe layer for the host's dispatch), then, on an NVIDIA GPU NVML
can read, the power of sustained kernels (``calibrate/power.py``). Started by ``torchrun``, it
measures the collectives over every launched rank instead (rank 0 writes the rows). Both write
into the same folder, so the fit reads what each run left there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshplan.calibrate import require_torch
from meshplan.calibrate.shapes import FULL, MEMORY_OPS, QUICK, Sizes, attention_cases, layer_cases, model_gemms, square_gemms, valid_tps
from meshplan.calibrate.table import Table
from meshplan.errors import MeshplanError
from meshplan.specs.model import TransformerModel

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Request:
    out: Path
    model: TransformerModel | None  # None: the square sweep and generic attention shapes only
    tps: tuple[int, ...]
    sizes: Sizes
    device: str = "auto"  # auto (a GPU if there is one), cuda or cpu
    power_seconds: float = 5.0  # how long each power workload runs (0: power is not measured)


def _device(torch, wanted: str):
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    if wanted == "cuda" and not torch.cuda.is_available():
        raise MeshplanError("--on", wanted, "this machine has no CUDA device PyTorch can use; use --on cpu")
    return torch.device(wanted) if wanted == "cpu" else torch.device("cuda", torch.cuda.current_device())


def measure_kernels(request: Request, progress: Progress | None = None) -> list[str]:
    """Measure every kernel row not yet in ``request.out``; the notes say what was skipped."""
    torch = require_torch()
    from meshplan.calibrate import kernels

    device = _device(torch, request.device)
    torch.manual_seed(0)
    out = request.out
    notes = []
    gemms = square_gemms(request.sizes.square)
    if request.model is not None:
        gemms = model_gemms(request.model, request.tps, request.sizes.tokens) + gemms
    fp8_skipped = kernels.fp8_note(device)
    if fp8_skipped:
        notes.append(fp8_skipped)
    fp8 = [] if fp8_skipped else [g for g in gemms if g.pass_ == "fwd"]
    attention = attention_cases(request.model, request.tps, request.sizes)
    memory = [(op, n) for n in request.sizes.memory_elements for op in MEMORY_OPS]
    layers = layer_cases(request.model, request.tps, request.sizes)
    tables = {name: Table(out, name) for name in ("gemm_bf16.csv", "attention.csv", "memory_ops.csv", "layer.csv")}
    if not fp8_skipped:
        tables["gemm_fp8.csv"] = Table(out, "gemm_fp8.csv")
    jobs = (
        [("gemm_bf16.csv", g.key, lambda g=g: kernels.gemm_row(g, device, request.sizes)) for g in gemms]
        + [("gemm_fp8.csv", g.key, lambda g=g: kernels.fp8_row(g, device, request.sizes)) for g in fp8]
        + [("attention.csv", a.key, lambda a=a: kernels.attention_row(a, device, request.sizes)) for a in attention]
        + [("memory_ops.csv", (op, n, "fp32" if op.endswith("fp32") else "bf16"),
            lambda op=op, n=n: kernels.memory_row(op, n, device, request.sizes)) for op, n in memory]
        + [("layer.csv", layer.key, lambda layer=layer: kernels.layer_row(layer, device, request.sizes)) for layer in layers]
    )
    _run(jobs, tables, progress, notes)
    kernels.write_environment(out / "env.json", device, notes)
    return notes


def _run(jobs, tables: dict[str, Table], progress: Progress | None, notes: list[str]) -> None:
    """Measure each job not yet in its table; a row the device has no memory for is left out
    (and said), the others still measured."""
    import torch

    for done, (name, key, measure) in enumerate(jobs):
        if progress:
            progress(done, len(jobs))
        if tables[name].has(key):
            continue
        try:
            tables[name].append(measure())
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            notes.append(f"{name} row {','.join(map(str, key))} skipped: out of device memory")
        except RuntimeError as err:  # cuBLASLt refuses some FP8 shapes (dimensions not multiples of 16)
            if name != "gemm_fp8.csv":
                raise
            notes.append(f"{name} row {','.join(map(str, key))} skipped: {str(err).splitlines()[0]}")
    if progress:
        progress(len(jobs), len(jobs))


def measure_power(request: Request, progress: Progress | None = None, meter=None) -> list[str]:
    """Measure each power workload not yet in ``request.out``/power.csv under ``meter`` (None:
    NVML's, where this is an NVIDIA GPU it can read); the notes say what was skipped and why,
    and are added to env.json's. Never an error where there is no counter: one note."""
    torch = require_torch()
    from meshplan.calibrate import kernels, power

    device = _device(torch, request.device)
    notes = []
    own = meter is None
    if request.power_seconds <= 0:
        notes.append("power not measured: --power-seconds 0")
        meter, own = None, False
    elif own:
        meter, note = power.open_meter(device)
        if note:
            notes.append(note)
    if meter is not None:
        try:
            _measure_power(request, device, meter, progress, notes)
        finally:
            if own:
                meter.close()
    kernels.add_notes(request.out / "env.json", notes)
    return notes


def _measure_power(request: Request, device, meter, progress: Progress | None, notes: list[str]) -> None:
    import torch

    from meshplan.calibrate import kernels, power

    sizes = request.sizes
    fp8_skipped = kernels.fp8_note(device)
    l2_bytes = power.l2_resident_bytes(device, sizes.power_l2_bytes)
    rows = power.workloads(device, sizes.power_gemms, sizes.power_hbm_bytes, l2_bytes, fp8=fp8_skipped is None)
    table = Table(request.out, "power.csv")
    steps = 100  # progress steps per workload
    for index, w in enumerate(rows):
        if table.has((w.name,)):
            continue

        def tick(fraction: float, index=index) -> None:
            if progress:
                progress(index * steps + int(fraction * steps), len(rows) * steps)

        try:
            table.append(power.measure(w, device, meter, request.power_seconds, tick))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            notes.append(f"power.csv row {w.name} skipped: out of device memory")
        except power.MeterError as err:
            notes.append(f"power measurement stopped at {w.name}: {err}")
            break
    if progress:
        progress(len(rows) * steps, len(rows) * steps)


def measure_collectives(request: Request, progress: Progress | None = None) -> tuple[list[str], bool]:
    """Measure the collectives over the launched ranks; (notes, whether this rank wrote rows)."""
    torch = require_torch()
    from meshplan.calibrate import collectives

    wanted = request.device
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    dist, device, groups = collectives.start(wanted)
    try:
        writer = dist.get_rank() == 0
        table = Table(request.out, "collectives.csv") if writer else None
        done_keys = _done_everywhere(dist, table)
        items = list(collectives.plan(groups, request.sizes.collective_bytes))
        notes = []
        for index, (group, name, nbytes) in enumerate(items):
            if progress and writer:
                progress(index, len(items))
            row_key = tuple(str(v) for v in collectives.key(name, group, collectives.elements(nbytes, group.ranks) * 4))
            if row_key in done_keys:
                continue
            row = collectives.measure(dist, device, group, name, nbytes, request.sizes.warmup, request.sizes.repeats)
            if row is None:
                notes.append(f"{name} skipped over {group.ranks} ranks: the {dist.get_backend()} backend does not implement it")
            elif group.records and table is not None:
                table.append(row)
        if progress and writer:
            progress(len(items), len(items))
        notes += _measure_overlap(request, dist, device, groups, writer)
        dist.barrier()
        return sorted(set(notes)), writer
    finally:
        dist.destroy_process_group()


def _done_everywhere(dist, table: Table | None) -> set[tuple]:
    """The keys of the rows rank 0's ``table`` holds, on every rank, so all skip the same rows."""
    done = [sorted(table.done) if table else None]
    dist.broadcast_object_list(done, src=0)
    return set(map(tuple, done[0]))


def _measure_overlap(request: Request, dist, device, groups, writer: bool) -> list[str]:
    """GEMMs beside all-gathers over each group (overlap.csv, ``collectives.overlap``) that the
    folder does not hold yet; the notes say what was skipped."""
    from meshplan.calibrate import collectives

    table = Table(request.out, "overlap.csv") if writer else None
    done_keys = _done_everywhere(dist, table)
    sizes = request.sizes
    for group in groups:
        for nbytes in sizes.overlap_bytes:
            key = tuple(str(v) for v in collectives.overlap_key(device, group, nbytes, sizes.overlap_gemm))
            if key in done_keys:
                continue
            try:
                row = collectives.overlap(dist, device, group, nbytes, sizes.overlap_gemm, sizes.overlap_gemms, sizes.warmup)
            except (RuntimeError, NotImplementedError, ValueError) as err:
                return [f"overlap.csv not measured over {group.ranks} ranks: {str(err).splitlines()[0]}"]
            if group.records and table is not None:
                table.append(row)
    return []


def catalog_device(device_id: str | None, on: str):
    """The catalog Device whose peaks the fit divides by: ``--device``, or the GPU found here
    matched by name (its family token, e.g. h100, and the closest memory size)."""
    from meshplan import catalog

    if device_id is not None:
        return catalog.device(device_id)
    torch = require_torch()
    if on == "cpu" or not torch.cuda.is_available():
        raise MeshplanError("--device", None, "the catalog device whose peaks turn measured times into efficiencies "
                            "(meshplan catalog list devices); a CPU run must name one")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = props.name.lower().replace(" ", "")
    found = [catalog.device(d) for d in catalog.device_ids() if d.split("-")[0] in name]
    if not found:
        raise MeshplanError("--device", None, f"{props.name} is not in the catalog; name the closest catalog device "
                            "(meshplan catalog list devices)")
    return min(found, key=lambda d: abs(d.hbm_bytes - props.total_memory))


def write_profile(out: Path, device, path: Path) -> dict:
    """Fit the rows in ``out`` for ``device`` and write the profile YAML to ``path``."""
    import yaml

    from meshplan.calibrate.fit import fit_profile

    profile = fit_profile(out, device)
    header = ("# A measured device profile, written by `meshplan calibrate` (calibrate/fit.py).\n"
              "# Use it with: meshplan estimate|search|validate ... --profile " + str(path) + "\n"
              "# `efficiency:` has the format of one entry of catalog/efficiency.yaml.\n")
    try:
        path.write_text(header + yaml.safe_dump(profile, sort_keys=False, default_flow_style=None, width=100))
    except OSError as err:
        raise MeshplanError("--profile-out", str(path), f"a writable file ({err.strerror or err})") from None
    return profile


def make_request(out: Path, model: str | None, tp: str, device: str | None, on: str, quick: bool,
                 measure: bool = True, power_seconds: float | None = None) -> tuple[Request, object]:
    """The measurement a ``meshplan calibrate`` command asks for, checked before anything is
    measured or written, and the catalog device its profile is fitted for. ``power_seconds``:
    how long each power workload runs (None: 5 s, 1 s with ``quick``)."""
    if on not in ("auto", "cuda", "cpu"):
        raise MeshplanError("--on", on, "one of auto, cuda, cpu")
    degrees = _degrees(tp)
    sizes = QUICK if quick else FULL
    power_seconds = sizes.power_seconds if power_seconds is None else power_seconds
    if not 0 <= power_seconds <= 3600:
        raise MeshplanError("--power-seconds", power_seconds, "seconds from 0 (power not measured) to 3600")
    resolved = None
    if model is not None:
        from meshplan.api import resolve_model

        resolved = resolve_model(model)
        if not isinstance(resolved, TransformerModel):
            raise MeshplanError("--model", model, "a transformer model (DLRM shapes are not calibrated yet)")
        degrees = valid_tps(resolved, degrees)
        if not degrees:
            raise MeshplanError("--tp", tp, f"degrees that divide {resolved.id}'s heads and FFN width")
    fit_device = catalog_device(device, on)
    if measure:
        require_torch()  # before anything is written
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MeshplanError("--out", str(out), f"a folder that can be created ({err.strerror or err})") from None
    return Request(out, resolved, degrees[-1:] if quick else degrees, sizes, on, power_seconds), fit_device


def _degrees(text: str) -> tuple[int, ...]:
    try:
        degrees = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        degrees = ()
    if not degrees or min(degrees) < 1:
        raise MeshplanError("--tp", text, "positive integers separated by commas, e.g. 1,2,4,8")
    return degrees
