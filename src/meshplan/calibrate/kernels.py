"""The kernel microbenchmarks, in PyTorch: GEMMs (bf16 and FP8), causal attention, memory ops,
and whole decoder layers.

Each function measures one row of a calibration file and returns its values in that file's
column order (``table.COLUMNS``). Inputs are random; every time is ``timing.median_time_s``.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess

from meshplan.calibrate.shapes import MEMORY_OPS, Attention, Gemm, Layer, Sizes
from meshplan.calibrate.timing import input_sets, median_time_s


def _tflops(flop: float, seconds: float) -> str:
    return f"{flop / seconds / 1e12:.4g}"


def gemm_row(g: Gemm, device, sizes: Sizes) -> tuple:
    """cuBLAS (or the CPU's BLAS) bf16 ``[m,k] @ [k,n]``."""
    import torch

    def make():
        return (torch.randn(g.m, g.k, device=device, dtype=torch.bfloat16),
                torch.randn(g.k, g.n, device=device, dtype=torch.bfloat16))

    inputs = input_sets(make, 2.0 * (g.m * g.k + g.k * g.n), device)
    seconds = median_time_s(lambda ab: torch.matmul(*ab), inputs, device, sizes.warmup, sizes.repeats)
    return (*g.key, seconds, _tflops(g.flop, seconds))


def fp8_note(device) -> str | None:
    """Why FP8 GEMMs cannot run here, or None when they can (``torch._scaled_mm``: e4m3 tensor
    cores from compute capability 8.9, Ada and Hopper on)."""
    import torch

    if device.type != "cuda":
        return "fp8 GEMMs skipped: torch._scaled_mm needs an NVIDIA GPU (compute capability 8.9 or newer)"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return f"fp8 GEMMs skipped: {torch.cuda.get_device_name(device)} has no FP8 tensor cores (compute capability < 8.9)"
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"fp8 GEMMs skipped: torch {torch.__version__} has no torch._scaled_mm"
    return None


def fp8_row(g: Gemm, device, sizes: Sizes) -> tuple:
    """``torch._scaled_mm``: e4m3 inputs with per-tensor scales, bf16 output (the second operand
    column-major, as cuBLASLt's FP8 GEMM requires)."""
    import torch

    one = torch.ones((), device=device, dtype=torch.float32)

    def make():
        a = torch.randn(g.m, g.k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(g.n, g.k, device=device).to(torch.float8_e4m3fn).t()
        return a, b

    def run(ab):
        return torch._scaled_mm(ab[0], ab[1], scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    inputs = input_sets(make, float(g.m * g.k + g.k * g.n), device)
    seconds = median_time_s(run, inputs, device, sizes.warmup, sizes.repeats)
    return (*g.key, seconds, _tflops(g.flop, seconds))


def attention_row(a: Attention, device, sizes: Sizes) -> tuple:
    """Causal ``scaled_dot_product_attention`` in bf16 (flash where PyTorch picks it), forward
    and forward+backward. GQA's K/V heads are repeated to the query heads before the kernel, as
    frameworks feeding SDPA do (Megatron-LM's unfused path, torchtitan), so the flash kernel runs
    (``enable_gqa`` may fall back to the math kernel); the row keeps the true kv_heads."""
    import torch
    import torch.nn.functional as F

    shape = (a.batch, a.heads, a.seq, a.head_dim)

    def make():
        q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        return q, k, v, torch.randn(shape, device=device, dtype=torch.bfloat16)

    def forward(qkvg):
        return F.scaled_dot_product_attention(*qkvg[:3], is_causal=a.causal)

    def forward_backward(qkvg):
        forward(qkvg).backward(qkvg[3])

    inputs = input_sets(make, 2.0 * a.batch * a.seq * a.head_dim * a.heads * 4, device)
    with torch.no_grad():
        fwd = median_time_s(forward, inputs, device, sizes.warmup, sizes.repeats)
    fwd_bwd = median_time_s(forward_backward, inputs, device, sizes.warmup, sizes.repeats)
    flop = a.fwd_flop
    bwd_tflops = _tflops(2.5 * flop, fwd_bwd - fwd) if fwd_bwd > fwd else ""
    return (*a.key, fwd, fwd_bwd, f"{flop:.4e}", _tflops(flop, fwd), bwd_tflops)


def layer_row(layer: Layer, device, sizes: Sizes) -> tuple:
    """One rank's decoder layer (``shapes.Layer``) in bf16, eager PyTorch as frameworks run it
    op by op: forward (with autograd recording) and forward+backward, no communication. A layer
    whose kernels are short takes what the host takes to issue them (the probe)."""
    import torch
    import torch.nn.functional as F

    b, s, h, d = layer.micro_batch, layer.seq, layer.hidden, layer.head_dim
    q_width, kv_width = layer.heads * d, layer.kv_heads * d
    up_width = (2 if layer.gated else 1) * layer.ffn

    def weight(*shape):
        return torch.nn.Parameter(torch.randn(*shape, device=device, dtype=torch.bfloat16) / shape[0] ** 0.5)

    weights = (weight(h), weight(h, q_width + 2 * kv_width), weight(q_width, h), weight(h), weight(h, up_width), weight(layer.ffn, h))

    def make():
        x = torch.randn(b, s, h, device=device, dtype=torch.bfloat16, requires_grad=True)
        return x, torch.randn(b, s, h, device=device, dtype=torch.bfloat16)

    def forward(xg):
        x = xg[0]
        norm1, qkv_w, out_w, norm2, up_w, down_w = weights
        q, k, v = (F.rms_norm(x, (h,), norm1) @ qkv_w).split((q_width, kv_width, kv_width), dim=-1)
        q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
        if layer.kv_heads < layer.heads:  # repeated to the query heads, so the flash kernel runs
            k, v = (t.repeat_interleave(layer.heads // layer.kv_heads, dim=1) for t in (k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, q_width)
        x = x + attn @ out_w
        up = F.rms_norm(x, (h,), norm2) @ up_w
        if layer.gated:
            gate, up = up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        else:
            act = F.gelu(up)
        return x + act @ down_w

    def forward_backward(xg):
        forward(xg).backward(xg[1])

    inputs = input_sets(make, 4.0 * b * s * h, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    fwd = median_time_s(forward, inputs, device, sizes.warmup, sizes.repeats, queued=False)
    fwd_bwd = median_time_s(forward_backward, inputs, device, sizes.warmup, sizes.repeats, queued=False)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    flop = 3.0 * layer.fwd_flop_gemm + 3.5 * layer.fwd_flop_attn  # backward: 2x the GEMMs, 2.5x attention
    return (*layer.key, fwd, fwd_bwd, layer.params, f"{layer.fwd_flop_gemm:.4e}", f"{layer.fwd_flop_attn:.4e}",
            _tflops(flop, fwd_bwd), f"{peak:.2f}")


def memory_row(op: str, elements: int, device, sizes: Sizes) -> tuple:
    """One streaming kernel over ``elements`` values; bytes moved count each input read once and
    each output written once (``shapes.MEMORY_OPS``)."""
    import torch
    import torch.nn.functional as F

    if op == "adamw_fused_fp32":
        return _adamw_row(elements, device, sizes)
    width = 4096 if elements >= 4096 else elements
    shape = (elements // width, width)

    def make():
        return (torch.randn(shape, device=device, dtype=torch.bfloat16),
                torch.randn(shape, device=device, dtype=torch.bfloat16),
                torch.empty(shape, device=device, dtype=torch.bfloat16))

    ones = torch.ones(width, device=device, dtype=torch.bfloat16)
    runs = {
        "copy": lambda x: x[2].copy_(x[0]),
        "add": lambda x: torch.add(x[0], x[1], out=x[2]),
        "gelu": lambda x: F.gelu(x[0]),
        "silu_mul": lambda x: torch.mul(F.silu(x[0]), x[1], out=x[2]),
        "rms_norm": lambda x: F.rms_norm(x[0], (width,), ones),
        "layer_norm": lambda x: F.layer_norm(x[0], (width,), ones, ones),
        "softmax": lambda x: torch.softmax(x[0], dim=-1),
    }
    nbytes = float(MEMORY_OPS[op] * elements)
    inputs = input_sets(make, 3 * 2.0 * elements, device)
    seconds = median_time_s(runs[op], inputs, device, sizes.warmup, sizes.repeats)
    return (op, elements, "bf16", int(nbytes), seconds, f"{nbytes / seconds / 1e9:.4g}")


def _adamw_row(elements: int, device, sizes: Sizes) -> tuple:
    """One fused AdamW step over ``elements`` fp32 parameters (PyTorch's ``fused=True``)."""
    import torch

    def make():
        param = torch.nn.Parameter(torch.randn(elements, device=device))
        param.grad = torch.randn(elements, device=device)
        opt = torch.optim.AdamW([param], lr=1e-4, fused=True)
        opt.step()  # the moments exist from here on
        return opt

    nbytes = float(MEMORY_OPS["adamw_fused_fp32"] * elements)
    inputs = input_sets(make, nbytes, device)
    seconds = median_time_s(lambda opt: opt.step(), inputs, device, sizes.warmup, sizes.repeats)
    return ("adamw_fused_fp32", elements, "fp32", int(nbytes), seconds, f"{nbytes / seconds / 1e9:.4g}")


def environment(device) -> dict:
    """What the numbers were measured on: device, SMs, memory, driver, clocks, torch."""
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
           "python": platform.python_version(), "measured_at": datetime.date.today().isoformat()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device=props.name, sm_count=props.multi_processor_count,
                   total_mem_gib=props.total_memory / 2**30, l2_bytes=getattr(props, "L2_cache_size", None))
        query = "name,driver_version,clocks.max.sm,clocks.max.memory,power.limit"
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", f"--query-gpu={query}", "--format=csv", f"--id={device.index or 0}"],
                capture_output=True, text=True, timeout=20, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            env["nvidia_smi"] = None
    else:
        env.update(device=_cpu_name(), threads=torch.get_num_threads())
    return env


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_environment(path, device, notes: list[str]) -> None:
    env = environment(device)
    env["notes"] = notes
    path.write_text(json.dumps(env, indent=1) + "\n")


def add_notes(path, notes: list[str]) -> None:
    """``notes`` added to those of the env.json at ``path`` (nothing where it is absent)."""
    if not notes or not path.exists():
        return
    env = json.loads(path.read_text())
    env["notes"] = [*env.get("notes", []), *(n for n in notes if n not in env.get("notes", []))]
    path.write_text(json.dumps(env, indent=1) + "\n")
