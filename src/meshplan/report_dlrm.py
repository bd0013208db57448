"""Terminal table of a DLRM estimate (rich); nothing here computes a number."""

from __future__ import annotations

from rich.table import Table

from meshplan.report import add_groups
from meshplan.timeline.dlrm import DLRMEstimate
from meshplan.units import format_bytes, format_devices, format_seconds

_KIND_NAMES = {
    "embedding_lookup": "embedding lookups", "gemm": "GEMM", "other": "other (interaction, loss, optimizer)",
    "all_to_all": "all-to-all", "all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
}


def dlrm_table(e: DLRMEstimate) -> Table:
    title = (
        f"{e.model_id} on {format_devices(e.num_devices, e.cluster_id)}  {e.strategy}  "
        f"global batch {e.global_batch_size:,} samples  {e.precision}"
    )
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    add_groups(table, dlrm_groups(e))
    return table


def dlrm_groups(e: DLRMEstimate) -> dict[str, list[tuple[str, str]]]:
    """The rows of the DLRM table in three groups: time, where the time goes, memory."""
    fit = "" if e.fits else "  DOES NOT FIT"
    time_rows = [
        ("iteration (overlapped)", format_seconds(e.iteration_s)),
        ("throughput", f"{e.mqps:.3g} MQPS ({e.samples_per_s:,.0f} samples/s)"),
        ("TFLOP/s per device", f"{e.tflops_per_device:.1f}"),
        ("compute", format_seconds(e.compute_s)),
        ("communication", format_seconds(e.comm_s)),
        ("exposed communication", f"{format_seconds(e.exposed_comm_s)} ({e.comm_exposed_fraction:.1%} of communication, "
                                  f"{e.exposed_comm_per_iteration:.1%} of the iteration)"),
    ]
    # every compute kind and collective in full: these sum to the serialized iteration
    work_rows = [
        ("where the time goes (serialized, nothing overlapped)", format_seconds(e.serialized_s)),
        *((f"  {_KIND_NAMES[k]}", format_seconds(v)) for k, v in e.serialized_by_kind_s.items() if v > 0 and k not in e.comm_by_collective),
        *((f"  {_KIND_NAMES[k]}", f"{format_seconds(c.total_s)}, {format_seconds(c.hidden_s)} hidden behind compute")
          for k, c in e.comm_by_collective.items() if c.total_s > 0),
    ]
    memory_rows = [
        ("memory per device", f"{format_bytes(e.memory.total_bytes)} of {format_bytes(e.memory.capacity_bytes)}{fit}"),
        *((f"  {name.removesuffix('_bytes').replace('_', ' ').replace('optimizer', 'optimizer state')}", format_bytes(v))
          for name, v in e.memory.as_dict().items() if name not in ("capacity_bytes", "total_bytes") and v > 0),
    ]
    return {"time": time_rows, "work": work_rows, "memory": memory_rows}
