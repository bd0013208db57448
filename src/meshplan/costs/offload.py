"""The optimizer step with part of the optimizer state offloaded to the host (Plan.optimizer_offload).

Megatron-Core's HybridDeviceOptimizer (--optimizer-cpu-offload --optimizer-offload-fraction f;
megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py, NVIDIA/Megatron-LM at d98e8a6)
steps a device's optimizer shard in two parts:

1. the gradients of the offloaded parameters are copied device -> host on a copy stream
   (``_set_sub_optimizer_grads``), while the GPU optimizer steps the rest (its kernels are
   launched before the CPU work starts, on the compute stream);
2. the CPU optimizer steps the offloaded parameters once their copy is done (``step``: the
   D2H event is synchronized, then ``cpu_optimizer.step``);
3. a post-step hook copies the updated parameters host -> device, after the compute stream, so
   after the GPU optimizer too (``param_copy_back_gpu_hook``: ``_h2d_stream.wait_stream``).

So the phase takes max(GPU part, D2H + CPU step) + H2D. This is Megatron's default, without
``overlap_cpu_optimizer_d2h_h2d`` (per-parameter pipelining of copies and CPU steps) and without
DeepSpeed ZeRO-Offload's copying of gradients during backward (Ren et al., "ZeRO-Offload",
USENIX ATC 2021, Sec. 4.1): both would hide part of the copies, so this is the slower schedule.

The CPU step streams its fp32 operands through host DRAM: DeepSpeed's CPU Adam
(csrc/adam/cpu_adam_impl.cpp, ``Step_1``) reads the parameter, gradient and both moments and
writes the parameter and both moments, 7 x 4 = 28 bytes per parameter. Every device of a node
steps its own shard at once, so each gets an even share of the node's DRAM bandwidth (and of
its DRAM: parallel.program.host_share_bytes); a job smaller than a node shares it among its own
devices only. The CPU
cores' power is not counted here: it is part of the host's watts (Task.host_w_per_node).
"""

from __future__ import annotations

from dataclasses import dataclass

#: host DRAM bytes one CPU Adam step moves per parameter: read fp32 parameter, gradient, m and v,
#: write parameter, m and v (DeepSpeed csrc/adam/cpu_adam_impl.cpp, Adam_Optimizer::Step_1)
CPU_ADAM_BYTES_PER_PARAM = 28.0


@dataclass(frozen=True)
class OffloadTimes:
    """The optimizer phase of one device with ``fraction`` of its state on the host."""

    fraction: float
    gpu_s: float  # the GPU optimizer over the parameters that stay
    d2h_s: float  # gradients of the offloaded parameters, device -> host
    cpu_s: float  # the CPU optimizer over the offloaded parameters
    h2d_s: float  # their updated weights, host -> device

    @property
    def total_s(self) -> float:
        """max(GPU part, D2H + CPU step) + H2D (HybridDeviceOptimizer.step and its hook)."""
        return max(self.gpu_s, self.d2h_s + self.cpu_s) + self.h2d_s

    def as_dict(self) -> dict[str, float]:
        return {"fraction": self.fraction, "gpu_s": self.gpu_s, "d2h_s": self.d2h_s, "cpu_s": self.cpu_s,
                "h2d_s": self.h2d_s, "total_s": self.total_s}


@dataclass(frozen=True)
class OffloadTraffic:
    """Bytes one device's offloaded optimizer step moves per step."""

    link_bytes: float  # over the host link, both directions
    host_memory_bytes: float  # through host DRAM: the CPU step and both copies' ends


def offload_traffic(params: float, fraction: float, gradient_bytes: float, weight_bytes: float) -> OffloadTraffic:
    """Of ``params`` parameters a device updates, ``fraction`` are stepped on the host: each sends
    its gradient (``gradient_bytes``: Megatron's fp32 main_grad; DeepSpeed casts to fp32 before
    the copy) down and its updated weight (``weight_bytes``, the training precision: ZeRO-Offload
    Sec. 3, and DeepSpeed PR #7309's 16-bit copy back) up; DRAM also takes the CPU Adam's 28
    bytes per parameter."""
    offloaded = params * fraction
    link = offloaded * (gradient_bytes + weight_bytes)
    return OffloadTraffic(link_bytes=link, host_memory_bytes=offloaded * CPU_ADAM_BYTES_PER_PARAM + link)


def offload_times(params: float, fraction: float, gpu_s: float, gradient_bytes: float, weight_bytes: float,
                  host, devices_per_node: int) -> OffloadTimes:
    """The optimizer phase of a device that updates ``params`` parameters with ``fraction`` of
    them offloaded to ``host`` (specs.cluster.Host) shared by ``devices_per_node`` devices;
    ``gpu_s`` is the GPU optimizer over the rest."""
    offloaded = params * fraction
    link_s = 1.0 / host.link_bytes_per_s
    dram_per_device = host.memory_bytes_per_s * host.memory_efficiency / devices_per_node
    return OffloadTimes(
        fraction=fraction,
        gpu_s=gpu_s,
        d2h_s=offloaded * gradient_bytes * link_s,
        cpu_s=offloaded * CPU_ADAM_BYTES_PER_PARAM / dram_per_device,
        h2d_s=offloaded * weight_bytes * link_s,
    )


def offload_energy_j(traffic: OffloadTraffic, host) -> float:
    """Joules of one device's offloaded step outside the accelerator: the bytes over the host link
    and through host DRAM times 8 times their energy per bit (the rack-scale energy/latency
    study's Energy = 8·M·cost per bit, applied to the host's link and memory)."""
    return 8.0 * (traffic.link_bytes * host.link_energy_per_bit_j + traffic.host_memory_bytes * host.memory_energy_per_bit_j)
