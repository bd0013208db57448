"""Fit a device family's kernel models (GEMM, FP8 GEMM, attention, memory-bound kernels) on the
CSV files `meshplan calibrate` writes: ``fit_kernels(folder, device)``.

The formulas are meshplan's own (meshplan.costs.kernels); only their parameters are fitted, by
least squares on log(predicted / measured) with a soft-L1 loss (robust to the few odd rows),
each kind on its own file. Each measured time is an isolated, synchronised call, so the
prediction compared is max(isolated floor, kernel time + the harness's per-call overhead); the
floor is fitted, the overhead is the difference between the 2048^3 GEMM (and the 1 GiB copy)
timed alone and back to back (power.csv), and estimates use neither (specs.kernels.KernelModels).
Without power.csv the overhead is taken as 0 and the launch costs absorb it. Where the folder
holds whole decoder layers (layer.csv), the host's dispatch per op is fitted on them too
(``fit_host``).

Needs scipy (the calibrate extra), imported inside ``fit_kernels``; numpy and the csv module
read the files. ``benchmarks/fit_kernels.py`` prints the result as the catalog's YAML block.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshplan import catalog
from meshplan.costs.kernels import Chip, attention_s, gemm_s, memory_op_s
from meshplan.errors import MeshplanError
from meshplan.specs.device import Device
from meshplan.specs.kernels import AttentionKernel, AttentionPass, GemmKernel, HostDispatch, KernelModels, MemoryClassKernel, MemoryKernels
from meshplan.workloads.ops import AttentionShape
from meshplan.workloads.transformer import layer_blocks

#: the calibration harness's memory-op names and the kernel class each measures
MEASURED_CLASS = {
    "copy": "copy", "add": "add", "gelu": "activation", "silu_mul": "gated_activation",
    "rms_norm": "norm", "layer_norm": "norm", "softmax": "softmax", "adamw_fused_fp32": "optimizer",
}
#: output tile per precision (CUTLASS's Hopper defaults: 128x128 for 16-bit, 128x256 for fp8;
#: the fit is within 0.5% across 128x128, 128x256 and 256x128)
TILES = {"bf16": (128, 128), "fp8": (128, 256)}
SPLIT_K = (1, 2, 3, 4)
BLOCK_Q = 128
#: soft-L1 scale of the log errors: errors well above it count about linearly (a median-like fit)
F_SCALE = 0.02
#: rows needed per fitted parameter of a kind (GEMM 6, attention pass 7), and sizes per memory
#: class (fraction and launch, plus one to check them); a --quick run has fewer and is not fitted
ROWS_PER_PARAMETER = 3
SIZES_PER_MEMORY_CLASS = 3


@dataclass(frozen=True)
class KernelFit:
    """The fitted models, the harness overheads given to them, and each file's |relative error|
    per row (as measured: isolated floor and overhead included)."""

    kernels: KernelModels
    compute_overhead_s: float
    memory_overhead_s: float
    errors: dict[str, np.ndarray] = field(default_factory=dict)


def read_columns(path: Path) -> dict[str, np.ndarray]:
    """A CSV file as one array per column (numbers where every value parses, else strings)."""
    with path.open(newline="") as f:
        table = list(csv.DictReader(f))
    out = {}
    for key in table[0] if table else ():
        values = [r[key] for r in table]
        try:
            out[key] = np.array([float(v) for v in values])
        except ValueError:
            out[key] = np.array(values)
    return out


def _count(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open(newline="") as f:
        return sum(1 for _ in csv.DictReader(f))


def missing_data(folder: str | Path, device: Device) -> str | None:
    """Why the kernel models cannot be fitted on ``folder`` for ``device``, or None if they can."""
    folder = Path(folder)
    if device.sm_count is None:
        return f"{device.id} has no sm_count in the catalog"
    need = {"gemm_bf16.csv": ROWS_PER_PARAMETER * 6, "attention.csv": ROWS_PER_PARAMETER * 7}
    short = [f"{name} ({_count(folder / name)} rows, {rows} needed)" for name, rows in need.items() if _count(folder / name) < rows]
    memory = read_columns(folder / "memory_ops.csv") if (folder / "memory_ops.csv").is_file() else {}
    ops = memory.get("op", np.array([]))
    sizes = {op: int(np.sum(ops == op)) for op in set(ops.tolist())}
    if sizes.get("copy", 0) < SIZES_PER_MEMORY_CLASS or min(sizes.values()) < SIZES_PER_MEMORY_CLASS:
        short.append(f"memory_ops.csv ({min(sizes.values(), default=0)} sizes of some op, {SIZES_PER_MEMORY_CLASS} needed, copy among them)")
    unknown = sorted(set(sizes) - set(MEASURED_CLASS))
    if unknown:
        short.append(f"memory_ops.csv (ops with no kernel class: {', '.join(unknown)})")
    return "too few rows: " + "; ".join(short) if short else None


def chip(device: Device, precision: str) -> Chip:
    return Chip(device.sustained_peak(precision), device.sm_count, device.hbm_bytes_per_s, device.sram_bytes)


def gemm_kernel(x, tile, overhead: float) -> GemmKernel:
    fraction, prologue, quantization, reduce, launch, floor = (float(v) for v in x)
    return GemmKernel(tile=tile, split_k=SPLIT_K, sm_fraction=fraction, prologue_k=prologue, wave_quantization=quantization,
                      split_reduce_passes=reduce, launch_s=launch, isolated_floor_s=floor, isolated_overhead_s=overhead)


def harness_overhead_s(data: Path, file: str, match: dict, workload: str) -> float:
    """What an isolated call adds: a kernel timed alone (``file``, the row matching ``match``)
    minus its time per call back to back (power.csv ``workload``, 15 s of calls; at the lower
    clock of a sustained run, so a lower bound on the overhead). 0 where either was not measured."""
    if not (data / "power.csv").is_file():
        return 0.0
    with (data / file).open(newline="") as f:
        alone = next((r for r in csv.DictReader(f) if all(r[k] == v for k, v in match.items())), None)
    with (data / "power.csv").open(newline="") as f:
        stream = next((r for r in csv.DictReader(f) if r["workload"] == workload), None)
    if alone is None or stream is None:
        return 0.0
    return max(0.0, float(alone["time_s"]) - float(stream["seconds"]) / float(stream["calls"]))


def gemm_measured_s(g: GemmKernel, d, element_bytes: float, c: Chip):
    return np.maximum(g.isolated_floor_s, gemm_s(d["m"], d["k"], d["n"], element_bytes, g, c) + g.isolated_overhead_s)


def attention_pass(x, overhead: float = 0.0, softmax_dims: float = 0.0) -> AttentionPass:
    fraction, prologue, quantization, q_passes, kv_passes, launch, floor = (float(v) for v in x)
    return AttentionPass(sm_fraction=fraction, prologue_kv=prologue, wave_quantization=quantization, q_passes=q_passes,
                         kv_passes=kv_passes, softmax_dims=softmax_dims, launch_s=launch, isolated_floor_s=floor,
                         isolated_overhead_s=overhead)


def family_softmax_dims(device: Device) -> tuple[float, float]:
    """The forward and backward softmax_dims of ``device``'s family in the catalog (0 where it
    has no kernel models). They are not fitted: one head dimension, as measured, cannot tell the
    exponentials from the matmuls; the family's come from its datasheet (catalog/efficiency.yaml)."""
    try:
        kernels = catalog.efficiency(device.efficiency).kernels
    except MeshplanError:
        kernels = None
    if kernels is None:
        return 0.0, 0.0
    return kernels.attention.forward.softmax_dims, kernels.attention.backward.softmax_dims


def attention_shape(d) -> AttentionShape:
    return AttentionShape(batch=d["batch"], heads=d["heads"], kv_heads=d["kv_heads"], seq=d["seq"], kv=d["seq"],
                          qk_dim=d["head_dim"], v_dim=d["head_dim"], causal=True, flash=True)


def attention_measured_s(a: AttentionKernel, d, c: Chip, backward: bool):
    shape = attention_shape(d)
    traffic = 2.0 * d["batch"] * d["seq"] * (2.0 * d["heads"] + 2.0 * d["kv_heads"]) * d["head_dim"]  # Q, O, K, V in bf16
    p = a.backward if backward else a.forward
    return np.maximum(p.isolated_floor_s, attention_s(shape, a, 2.0, traffic, c, backward) + p.isolated_overhead_s)


def memory_measured_s(mem: MemoryKernels, d, hbm_bytes_per_s: float):
    out = np.empty(len(d["op"]))
    for i, (op, nbytes) in enumerate(zip(d["op"], d["bytes_moved"])):
        out[i] = memory_op_s(nbytes, MEASURED_CLASS[op], mem, hbm_bytes_per_s)
    return np.maximum(mem.isolated_floor_s, out + mem.isolated_overhead_s)


def _least_squares(residual, x0, lower, upper):
    from scipy.optimize import least_squares

    best = None
    for start in x0:
        r = least_squares(residual, start, bounds=(lower, upper), loss="soft_l1", f_scale=F_SCALE)
        if best is None or r.cost < best.cost:
            best = r
    return best.x


def _abs_errors(predicted, measured) -> np.ndarray:
    return np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0)


def _causal(d: dict) -> dict:
    """The causal rows (the attention formula is fitted on causal kernels, as training runs them)."""
    if "causal" not in d:
        return d
    keep = np.asarray(d["causal"]).astype(str) == "True"
    return {k: v[keep] for k, v in d.items()}


def fit_kernels(folder: str | Path, device: Device, source: str = "fit") -> KernelFit:
    """The kernel models of ``device`` (a catalog Device: peaks, sm_count, HBM bandwidth, SRAM)
    fitted on the CSV files in ``folder``; ``source`` names the measurement in each model."""
    folder = Path(folder)
    reason = missing_data(folder, device)
    if reason:
        raise MeshplanError(str(folder), reason, "a folder of kernels measured by a full `meshplan calibrate` run")
    # the 2048^3 GEMM and the 1 GiB copy were timed both alone and back to back; attention goes
    # through the same isolated-call path as the GEMMs and is given their overhead
    compute_overhead = harness_overhead_s(folder, "gemm_bf16.csv", {"model": "square", "m": "2048"}, "gemm_bf16_2048")
    memory_overhead = harness_overhead_s(folder, "memory_ops.csv", {"op": "copy", "elements": "536870912"}, "hbm_copy_1GiB")
    bf16 = chip(device, "bf16")
    errors: dict[str, np.ndarray] = {}

    gemms: dict[str, GemmKernel] = {}
    precisions = [("bf16", 2.0)]
    if "fp8" in device.peak_flop_per_s and _count(folder / "gemm_fp8.csv") >= ROWS_PER_PARAMETER * 6:
        precisions.append(("fp8", 1.0))
    for precision, element_bytes in precisions:
        c = chip(device, precision)
        d = read_columns(folder / f"gemm_{precision}.csv")
        tile = TILES[precision]
        x = _least_squares(lambda x: np.log(gemm_measured_s(gemm_kernel(x, tile, compute_overhead), d, element_bytes, c) / d["time_s"]),
                           [[0.72, 140, 0.2, 0.4, 10e-6, 20e-6], [0.6, 300, 0.8, 1.0, 40e-6, 30e-6], [0.6, 140, 0.2, 0.5, 40e-6, 10e-6]],
                           [0.05, 0, 0, 0, 0, 0], [1.0, 5000, 1.0, 10.0, 100e-6, 100e-6])
        gemm = gemm_kernel(x, tile, compute_overhead)
        if precision != "bf16":
            # no back-to-back run at small sizes: what this precision's isolated calls cost beyond
            # the bf16 launch is put on the harness (torch._scaled_mm's heavier dispatch), not the
            # kernel; the sum, and so the fit, is unchanged
            launch = gemms["bf16"].launch_s
            extra = gemm.launch_s - launch
            gemm = gemm.model_copy(update={"launch_s": launch, "isolated_overhead_s": compute_overhead + extra})
        gemms[precision] = gemm
        errors[f"gemm {precision}"] = _abs_errors(gemm_measured_s(gemm, d, element_bytes, c), d["time_s"])

    att = _causal(read_columns(folder / "attention.csv"))
    bwd_s = att["fwd_bwd_s"] - att["fwd_s"]
    placeholder = attention_pass([0.5, 0, 0, 0, 0, 0, 0])
    starts = [[0.6, 100, 0.5, 1, 1, 10e-6, 10e-6], [0.6, 400, 0.2, 0.5, 5, 100e-6, 400e-6], [0.5, 500, 0.8, 0, 10, 50e-6, 300e-6]]
    lower, upper = [0.05, 0, 0, 0, 0, 0, 0], [1.0, 1e5, 1.0, 50, 50, 1e-3, 1e-3]

    softmax = family_softmax_dims(device)

    def one_pass(x, backward: bool) -> AttentionKernel:
        p = attention_pass(x, compute_overhead, softmax[backward])
        return AttentionKernel(block_q=BLOCK_Q, forward=placeholder if backward else p, backward=p if backward else placeholder, source=source)

    xf = _least_squares(lambda x: np.log(attention_measured_s(one_pass(x, False), att, bf16, False) / att["fwd_s"]), starts, lower, upper)
    xb = _least_squares(lambda x: np.log(attention_measured_s(one_pass(x, True), att, bf16, True) / bwd_s), starts, lower, upper)
    attention = AttentionKernel(block_q=BLOCK_Q, forward=attention_pass(xf, compute_overhead, softmax[0]),
                                backward=attention_pass(xb, compute_overhead, softmax[1]), source=source)
    errors["attention forward"] = _abs_errors(attention_measured_s(attention, att, bf16, False), att["fwd_s"])
    errors["attention backward"] = _abs_errors(attention_measured_s(attention, att, bf16, True), bwd_s)

    mem = read_columns(folder / "memory_ops.csv")
    classes = sorted({MEASURED_CLASS[op] for op in mem["op"]})

    def memory(x) -> MemoryKernels:
        fits = {c: MemoryClassKernel(fraction=float(x[2 * i]), launch_s=float(x[2 * i + 1])) for i, c in enumerate(classes)}
        return MemoryKernels(classes=fits, isolated_floor_s=float(x[-1]), isolated_overhead_s=memory_overhead, source=source)

    xm = _least_squares(lambda x: np.log(memory_measured_s(memory(x), mem, device.hbm_bytes_per_s) / mem["time_s"]),
                        [[0.8, 10e-6] * len(classes) + [20e-6]], [0.05, 0] * len(classes) + [0], [2.0, 200e-6] * len(classes) + [100e-6])
    memory_kernels = memory(xm)
    errors["memory ops"] = _abs_errors(memory_measured_s(memory_kernels, mem, device.hbm_bytes_per_s), mem["time_s"])
    kernels = KernelModels(gemm=gemms, attention=attention, memory=memory_kernels, host=fit_host(folder, source), source=source)
    return KernelFit(kernels, compute_overhead, memory_overhead, errors)


def fit_host(folder: Path, source: str = "fit") -> HostDispatch | None:
    """The host's dispatch per lowered op (specs.kernels.HostDispatch) from whole decoder layers
    (``layer.csv``: one rank's eager layer, forward and forward+backward, no communication): the
    least forward and the least backward any measured layer took, over the ops meshplan lowers a
    dense decoder layer to. The smallest layers take that however little their kernels do, so no
    layer ran faster than its dispatch; larger layers are GPU-bound and leave it alone. None
    without layer.csv."""
    path = folder / "layer.csv"
    if _count(path) == 0:
        return None
    layers = read_columns(path)
    ops = dense_layer_ops()
    return HostDispatch(forward_s=float(np.min(layers["fwd_s"])) / ops,
                        backward_s=float(np.min(layers["fwd_bwd_s"] - layers["fwd_s"])) / ops,
                        source=f"{source}: least forward and backward of {len(layers['fwd_s'])} measured decoder layers (layer.csv) over the {ops} ops of a dense layer")


def dense_layer_ops() -> int:
    """The ops meshplan lowers a pre-norm dense decoder layer to as the harness runs it (two
    norms, the QKV, attention, output, up, activation and down ops, two residual adds; no rotary
    embeddings, which calibrate's layer and the shared one leave out): the same for every size
    and tp."""
    plain = catalog.model("llama3-8b").model_copy(update={"rotary": False})
    (block,) = layer_blocks(plain, 1, 1024, 2.0, flash_attention=True)
    return len(block.ops)


def error_summary(e: np.ndarray) -> str:
    return f"median |error| {np.median(e):.1%}, p90 {np.percentile(e, 90):.1%}, max {e.max():.1%} ({len(e)} rows)"
