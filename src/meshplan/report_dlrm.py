"""Terminal table of a DLRM estimate (rich); nothing here computes a number."""

from __future__ import annotations

from rich.table import Table

from meshplan.timeline.dlrm import DLRMEstimate
from meshplan.units import format_bytes, format_seconds

_KIND_NAMES = {
    "embedding_lookup": "embedding lookups", "gemm": "GEMM", "other": "other (interaction, loss, optimizer)",
    "all_to_all": "all-to-all", "all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
}


def dlrm_table(e: DLRMEstimate) -> Table:
    title = (
        f"{e.model_id} on {e.num_devices} x {e.cluster_id}  {e.strategy}  "
        f"global batch {e.global_batch_size:,} samples  {e.precision}"
    )
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    fit = "" if e.fits else "  DOES NOT FIT"
    rows = [
        ("iteration (overlapped)", format_seconds(e.iteration_s)),
        ("throughput", f"{e.mqps:.3g} MQPS ({e.samples_per_s:,.0f} samples/s)"),
        ("serialized (no overlap)", format_seconds(e.serialized_s)),
        ("compute", format_seconds(e.compute_s)),
        ("communication", format_seconds(e.comm_s)),
        ("exposed communication", f"{format_seconds(e.exposed_comm_s)} ({e.comm_exposed_fraction:.1%} of communication, "
                                  f"{e.exposed_comm_per_iteration:.1%} of the iteration)"),
        ("TFLOP/s per device", f"{e.tflops_per_device:.1f}"),
        *((f"  {_KIND_NAMES[k]}", format_seconds(v)) for k, v in e.serialized_by_kind_s.items() if v > 0),
        *((f"  {_KIND_NAMES[k]} hidden behind compute", f"{format_seconds(c.hidden_s)} of {format_seconds(c.total_s)}")
          for k, c in e.comm_by_collective.items() if c.total_s > 0),
        ("memory per device", f"{format_bytes(e.memory.total_bytes)} of {format_bytes(e.memory.capacity_bytes)}{fit}"),
        *((f"  {name.removesuffix('_bytes').replace('_', ' ')}", format_bytes(v))
          for name, v in e.memory.as_dict().items() if name not in ("capacity_bytes", "total_bytes") and v > 0),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
