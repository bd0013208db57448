"""Time of each DLRM task on one device: roofline kernels, embedding lookups and collectives.

- GEMMs, attention and streaming kernels: meshplan.costs.compute.Roofline with the device's
  efficiency profile (MAD Max Sec. 4.2, "Compute Blocks": flop / (peak x utilization); the
  profile's matmul curve gives ~69% on large A100 GEMMs, MAD Max uses ~70%).
- Embedding lookups: bytes / (HBM bandwidth x EMBEDDING_HBM_UTILIZATION) (MAD Max Sec. 4.2,
  "Embedding Bags").
- Collectives: meshplan.costs.collectives over the levels a group spans, as for transformers
  (the cluster's ``rails`` say how many NICs of a node one collective drives; ZionEX's come from
  MAD Max Sec. 4.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from meshplan import catalog
from meshplan.costs.collectives import GroupSpan, collective_s, group_span
from meshplan.costs.compute import Roofline
from meshplan.parallel.dlrm import DLRMProgram, Group, Task
from meshplan.specs.device import BYTES_PER_ELEMENT

#: achieved fraction of HBM bandwidth for embedding-bag lookups: "typical values for embedding
#: bags of interest are ~80% for A100s" (MAD Max Sec. 4.2). The one DLRM-specific utilization.
EMBEDDING_HBM_UTILIZATION = 0.80


@dataclass(frozen=True)
class CostedTask:
    task: Task
    stream: str  # "compute", or "comm:<level>": collectives queue per network level they cross
    duration_s: float
    span: GroupSpan | None = None


def lookup_s(lookup_bytes: float, roofline: Roofline, hbm_bytes_per_s: float) -> float:
    """Embedding-bag time: lookup bytes / (HBM bandwidth x utilization) (MAD Max Sec. 4.2)."""
    if lookup_bytes <= 0:
        return 0.0
    return lookup_bytes / (hbm_bytes_per_s * EMBEDDING_HBM_UTILIZATION) + roofline.efficiency.kernel_overhead_s


def compute_s(task: Task, roofline: Roofline, element_bytes: float, hbm_bytes_per_s: float) -> float:
    """One compute task: its GEMMs one after another, or an attention / streaming / lookup kernel."""
    if task.kernel == "lookup":
        return lookup_s(task.lookup_bytes, roofline, hbm_bytes_per_s)
    if task.kernel == "gemm":
        return float(sum(roofline.matmul_s(m, k, n, element_bytes) for m, k, n in task.gemms))
    if task.kernel == "attention":
        return float(roofline.attention_s(task.flop, task.bytes))
    return float(roofline.memory_s(task.bytes)) if task.bytes > 0 else 0.0


def cost_dlrm_program(program: DLRMProgram) -> tuple[CostedTask, ...]:
    """Durations (and comm streams) of every task of ``program``."""
    cluster = program.cluster
    device = cluster.device
    roofline = Roofline.of(device, catalog.efficiency(device.efficiency), program.precision)
    element_bytes = BYTES_PER_ELEMENT[program.precision]
    spans: dict[Group, GroupSpan] = {}
    out = []
    for task in program.tasks:
        if task.stream == "compute":
            out.append(CostedTask(task, "compute", compute_s(task, roofline, element_bytes, device.hbm_bytes_per_s)))
            continue
        span = spans.get(task.group) or spans.setdefault(task.group, group_span(cluster, task.group.size, task.group.stride))
        stream = f"comm:{max(span.levels)}" if span.hops else "comm:0"
        out.append(CostedTask(task, stream, collective_s(task.category, task.comm_bytes, span), span))
    return tuple(out)
