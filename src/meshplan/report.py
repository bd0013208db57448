"""Terminal tables (rich) built from result values; nothing here computes a number."""

from __future__ import annotations

from rich.table import Table

from meshplan.timeline.estimate import DLRMEstimate, Estimate
from meshplan.units import format_bytes, format_devices, format_energy, format_seconds


def estimate_table(e: Estimate) -> Table:
    p = e.plan
    group = p.get("microbatch_group_size")
    vpp = f"{p['virtual_pipeline_stages']}" + (f" (groups of {group})" if group and group != p["pp"] else "")
    title = (
        f"{e.model_id} on {format_devices(e.num_devices, e.cluster_id)}  "
        f"tp={p['tp']} pp={p['pp']} dp={p['dp']} cp={p['cp']} ep={p['ep']} vpp={vpp} "
        f"mb={p['micro_batch_size']} gb={p['global_batch_size']} seq={p['seq_len']} "
        f"zero={p['zero_stage']} recompute={p['recompute']}"
        + (f" ({p['recompute_layers']} layers a chunk)" if p.get("recompute_layers") is not None else "")
        + f" {p['precision']}"
        + (" (attention fp8)" if p.get("fp8_attention") else "")
        + (" eager" if p.get("fusion") == "eager" else "")
    )
    return metric_table(title, estimate_groups(e))


def metric_table(title: str, groups: dict[str, list[tuple[str, str]]]) -> Table:
    """A two-column table of metrics and values, its groups parted by rules."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    add_groups(table, groups)
    return table


def estimate_groups(e: Estimate) -> dict[str, list[tuple[str, str]]]:
    """The rows of the estimate table in three groups: time, where the time goes, memory."""
    b = e.breakdown
    time_rows = [
        ("step time", format_seconds(e.step_time_s)),
        ("tokens/s", f"{e.tokens_per_s:,.0f}"),
        ("samples/s", f"{e.samples_per_s:,.2f}"),
        ("MFU / HFU", f"{e.mfu:.1%} / {e.hfu:.1%}"),
        ("TFLOP/s per device", f"{e.tflops_per_device:.1f}"),
        ("compute", format_seconds(b.compute_s)),
        ("  of which recompute", format_seconds(b.recompute_s)),
        *((f"exposed comm {axis}", format_seconds(t)) for axis, t in b.exposed_comm_s.items() if t > 0),
        ("pipeline bubble", format_seconds(b.bubble_s)),
        ("optimizer", format_seconds(b.optimizer_s)),
    ]
    if e.trainable_params < e.params:
        time_rows.append(("trainable parameters", f"{e.trainable_params:,.0f} of {e.params:,.0f} ({e.trainable_params / e.params:.3%})"))
    if e.pipeline_split != "even" or (e.mtp_layers and len(e.stage_layers) > 1):
        mtp = f"; the last runs {e.mtp_layers} of them for multi-token prediction" if e.mtp_layers else ""
        time_rows.append(("layers per pipeline stage", f"{_runs(e.stage_layers)} ({e.pipeline_split}{mtp})"))
    if e.train_tokens:
        days = e.time_to_train_s(e.train_tokens) / 86400
        time_rows.append((f"time to train {e.train_tokens:.3g} tokens", f"{days:,.2f} days, {e.device_hours(e.train_tokens):,.0f} device-hours"))
    # the serialized step: every op kind and collective in full, plus the bubble; these sum to it
    work_rows = [
        ("where the time goes (serialized, nothing overlapped)", format_seconds(e.serialized_s)),
        *((f"  {kind.replace('_', ' ')}", format_seconds(t)) for kind, t in e.serialized_by_op_s.items() if t > 0),
        *((f"  {kind}", f"{format_seconds(c['serialized_s'])}, {c['hidden_fraction']:.0%} hidden")
          for kind, c in e.collectives.items()),
        *((("  pipeline bubble", format_seconds(b.bubble_s)),) if b.bubble_s > 0 else ()),
    ]
    memory_rows = [
        ("memory per device", f"{format_bytes(e.memory.total_bytes)} of {format_bytes(e.memory.capacity_bytes)}" + ("" if e.fits else "  DOES NOT FIT")),
        *((f"  {_memory_name(name)}", format_bytes(v)) for name, v in e.memory.as_dict().items()
          if name not in ("capacity_bytes", "total_bytes") and not name.startswith("host_") and v > 0),
    ]
    if getattr(e.memory, "host_total_bytes", 0.0) > 0:  # optimizer or activation offload
        m = e.memory
        held = [what for what, v in (("optimizer", m.host_optimizer_bytes), ("activations", m.host_activations_bytes)) if v > 0]
        memory_rows.append((f"host memory per device (offloaded {' and '.join(held)})",
                            f"{format_bytes(m.host_total_bytes)} of {format_bytes(m.host_capacity_bytes)}" + ("" if m.host_fits else "  DOES NOT FIT")))
        o = e.offload_s
        if o:
            time_rows.append(("  optimizer offload", f"GPU {format_seconds(o['gpu_s'])} beside D2H {format_seconds(o['d2h_s'])} + CPU "
                                                      f"{format_seconds(o['cpu_s'])}, then H2D {format_seconds(o['h2d_s'])}"))
    groups = {"time": time_rows, "work": work_rows, "memory": memory_rows}
    if e.energy is not None:
        groups["energy"] = energy_rows(e)
    return groups



def _shares(joules: dict[str, float]) -> str:
    """``{"gemm": 1.9e5, ...}`` as "gemm 196 kJ, attention 28.9 kJ", largest first."""
    return ", ".join(f"{name} {format_energy(j)}" for name, j in sorted(joules.items(), key=lambda kv: -kv[1]) if j > 0)

def energy_rows(e, step: str = "step") -> list[tuple[str, str]]:
    """Energy per step by component, device power against the TDP, and the footprint of the
    training run when the task names its tokens."""
    en = e.energy
    rows = [
        (f"energy per {step}", format_energy(en.total_j)),
        ("  compute", format_energy(en.compute_j)),
        ("  HBM traffic", format_energy(en.memory_j)),
        *((f"  links {level}", format_energy(j)) for level, j in en.links_j.items() if j > 0),
        ("  idle power", format_energy(en.static_j)),
        *((("  hosts beyond the devices", format_energy(en.host_j)),) if getattr(en, "host_j", 0.0) > 0 else ()),
        *((("  optimizer offload (host link and DRAM)", format_energy(en.offload_j)),) if getattr(en, "offload_j", 0.0) > 0 else ()),
        *((("  compute and HBM by op kind", _shares(en.by_op_kind_j)),) if en.by_op_kind_j else ()),
        *((("  links by collective", _shares(en.by_collective_j)),) if en.by_collective_j else ()),
        ("power per device (average / busiest)", f"{en.average_device_w:,.0f} W / {en.peak_device_w:,.0f} W of {en.tdp_w:,.0f} W"),
        (f"power per node of {en.devices_per_node} (average / busiest)", f"{en.average_node_w / 1e3:,.2f} kW / {en.peak_node_w / 1e3:,.2f} kW"),
    ]
    if getattr(e, "train_tokens", None):
        pue = e.footprint.get("pue", 1.0)
        rows.append((f"energy to train {e.train_tokens:.3g} tokens", f"{format_energy(e.energy_to_train_j(e.train_tokens))} (PUE {pue:g})"))
        co2e = e.co2e_to_train_kg(e.train_tokens)
        if co2e is not None:
            grid = e.footprint.get("grid_region") or "given"
            rows.append(("  emissions", f"{co2e / 1000:,.1f} t CO2e (grid {grid}: "
                                        f"{e.footprint['grid_kg_co2e_per_kwh'] * 1000:,.0f} g CO2e/kWh)"))
        rows.extend(cost_rows(e))
    return rows


def cost_rows(e) -> list[tuple[str, str]]:
    """The cost of training ``train_tokens``: device-hours x price, or the TCO by component."""
    parts = e.cost_breakdown_to_train(e.train_tokens)
    if parts is None:
        return []
    total = sum(parts.values())
    tco = e.footprint.get("tco")
    if tco is None:
        return [("  cost", f"{total:,.0f} USD (device-hours x price)")]
    rows = [("  cost (TCO)", f"{total:,.0f} USD, {e.cost_per_device_hour():.3f} USD per device-hour "
                             f"({tco['lifetime_years']:g} years, {tco['electricity_usd_per_kwh']:g} USD/kWh)")]
    rows.extend((f"    {name}", f"{usd:,.0f} USD") for name, usd in parts.items())
    return rows


def _memory_name(field: str) -> str:
    """'optimizer_bytes' -> 'optimizer state' (not to be read as the optimizer's time)."""
    name = field.removesuffix("_bytes")
    if name == "optimizer_step":  # MemoryBreakdown.optimizer_step_bytes
        return "optimizer step, beyond the backward's peak (gradients, foreach temporaries)"
    return "optimizer state" if name == "optimizer" else name.replace("_", " ")


def add_groups(table: Table, groups: dict[str, list[tuple[str, str]]]) -> None:
    """Rows in groups, a rule between groups."""
    for index, rows in enumerate(groups.values()):
        if index:
            table.add_section()
        for name, value in rows:
            table.add_row(name, value)


def _runs(values: tuple[int, ...]) -> str:
    """``15, 16 x6, 15`` for (15, 16, 16, 16, 16, 16, 16, 15)."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return ", ".join(f"{v} x{n}" if n > 1 else str(v) for v, n in out)


def inference_table(e) -> Table:
    p = e.plan
    title = (
        f"{e.model_id} inference on {format_devices(e.num_devices, e.cluster_id)}  tp={p['tp']} pp={p['pp']} dp={p['dp']} "
        f"batch={e.batch_size} prompt={e.prompt_len} output={e.output_len} {p['precision']}"
    )

    def bound(phase) -> str:
        kind = "memory-bandwidth bound" if phase.memory_bound else "compute bound"
        return f"{format_seconds(phase.roofline_s)} ({kind})"

    def waits(phase) -> list[tuple[str, str]]:
        return [("  of which waiting for the host", format_seconds(phase.host_wait_s))] if phase.host_wait_s > 0 else []

    rows = [
        ("time to first token (prefill)", format_seconds(e.ttft_s)),
        ("  roofline bound", bound(e.prefill)),
        *waits(e.prefill),
        ("time per output token (decode)", format_seconds(e.tpot_s)),
        ("  roofline bound", bound(e.decode)),
        *waits(e.decode),
        ("  of which tp communication", format_seconds(e.decode.tp_comm_s)),
        ("request latency", format_seconds(e.request_s)),
        ("decode tokens/s", f"{e.decode_tokens_per_s:,.0f}"),
        ("output tokens/s over the request", f"{e.tokens_per_s:,.0f}"),
    ]
    memory_rows = [
        ("memory per device", f"{format_bytes(e.memory.total_bytes)} of {format_bytes(e.memory.capacity_bytes)}" + ("" if e.fits else "  DOES NOT FIT")),
        ("  weights", format_bytes(e.memory.weights_bytes)),
        ("  KV cache", format_bytes(e.memory.kv_cache_bytes)),
        ("  activations", format_bytes(e.memory.activations_bytes)),
    ]
    groups = {"time": rows, "memory": memory_rows}
    if e.energy_per_output_token_j is not None:
        groups["energy"] = [
            ("energy per output token", format_energy(e.energy_per_output_token_j)),
            ("energy per request batch", format_energy(e.energy_per_request_j)),
            ("  prefill", format_energy(e.prefill_energy.total_j)),
            ("  one decode step", format_energy(e.decode_energy.total_j)),
            ("power per device in decode (average)", f"{e.decode_energy.average_device_w:,.0f} W of {e.decode_energy.tdp_w:,.0f} W"),
        ]
    return metric_table(title, groups)


def validation_tables(results, summary) -> list[Table]:
    """The cases and the error per group; where a case gives a measured peak memory, a memory
    column and the memory error per group too."""
    memory = any(r.memory_error is not None for r in results)
    cases = Table(title="Validation: predicted vs measured step time", header_style="bold")
    for col in ("case", "group", "measured", "predicted", "error", *(("memory (measured, error)",) if memory else ())):
        cases.add_column(col, justify="left" if col in ("case", "group") else "right")
    for r in results:
        peak = (f"{format_bytes(r.measured_memory_bytes)}, {r.memory_error:+.1%}" if r.memory_error is not None else "-",) if memory else ()
        if r.error:
            cases.add_row(r.id, r.group, _s(r.measured_step_time_s), "-", f"not scored: {r.error}", *(("-",) if memory else ()))
        else:
            cases.add_row(r.id, r.group, _s(r.measured_step_time_s), _s(r.predicted_step_time_s),
                          f"{r.relative_error:+.1%}" + ("" if r.fits else " (predicted not to fit)")
                          + (f" ({r.note})" if r.note else ""), *peak)
    # median and max of the absolute error; bias, the median signed one (below 0: predicted fast)
    groups = Table(title="Error per group", header_style="bold")
    for col in ("group", "cases", "not scored", "median", "max", "bias"):
        groups.add_column(col, justify="left" if col == "group" else "right")
    for g, stats in summary.items():
        groups.add_row(g, str(stats["cases"]), str(stats["failed"]), *_stat_cells(stats, ""))
    tables = [cases, groups]
    if memory:
        peaks = Table(title="Memory per device: error per group", header_style="bold")
        for col in ("group", "cases", "median", "max", "bias"):
            peaks.add_column(col, justify="left" if col == "group" else "right")
        for g, stats in summary.items():
            if stats["memory_cases"]:
                peaks.add_row(g, str(stats["memory_cases"]), *_stat_cells(stats, "memory_"))
        tables.append(peaks)
    return tables


def _stat_cells(stats: dict, prefix: str) -> list[str]:
    return [("-" if stats[prefix + k] is None else f"{stats[prefix + k]:{form}}")
            for k, form in (("median_abs_error", ".1%"), ("max_abs_error", ".1%"), ("median_error", "+.1%"))]


def _s(value) -> str:
    return "-" if value is None else f"{value:.4g} s"


def _plan_cells(r: dict) -> tuple[str, ...]:
    return (
        str(r["tp"]), str(r["pp"]), str(r["dp"]), str(r["cp"]), str(r["micro_batch_size"]),
        str(r["virtual_pipeline_stages"]), _recompute_cell(r), str(r["zero_stage"]), "y" if r["sequence_parallel"] else "n",
    )


def _recompute_cell(r: dict) -> str:
    """The recompute, and how many layers of each chunk re-run where not all do ("full 4")."""
    layers = r.get("recompute_layers")
    return r["recompute"] if layers is None else f"{r['recompute']} {layers}"


_PLAN_HEAD = ("tp", "pp", "dp", "cp", "mb", "vpp", "recompute", "zero", "sp")


def front_table(title: str, rows: list[dict]) -> Table:
    energy = any(r.get("energy_j") is not None for r in rows)
    table = Table(title=title, header_style="bold")
    for col in ("devices", *_PLAN_HEAD, "step", "memory", *(("energy/step",) if energy else ())):
        table.add_column(col, justify="left" if col == "recompute" else "right")
    for r in rows:
        cells = [str(r["num_devices"]), *_plan_cells(r), format_seconds(r["step_time_s"]), format_bytes(r["memory_bytes"])]
        table.add_row(*cells, *((format_energy(r["energy_j"]),) if energy else ()))
    return table


def runner_up_line(why: dict) -> str:
    changed = ", ".join(f"{k} {a}->{b}" for k, (a, b) in why["changed"].items())
    if why.get("tie"):
        return f"runner-up ({changed}) ties with the best (same step time)"
    parts = ", ".join(f"{k.removesuffix('_s')} {v:+.3g} s" for k, v in why["components_s"].items() if abs(v) > 0)
    return f"runner-up ({changed}) is {format_seconds(why['slower_by_s'])} slower: {parts}"


def search_table(result, objective: str = "time") -> Table:
    energy = any(r.get("energy_j") is not None for r in result.top)
    by = "" if objective == "time" else f" by {objective}"
    table = Table(title=f"Best {len(result.top)} plans{by} (of {result.candidates} valid)", header_style="bold")
    for col in ("rank", *_PLAN_HEAD, "step", "tokens/s", "MFU", "memory", *(("energy/step", "W/device") if energy else ()),
                *(("cost/step",) if objective == "cost" else ())):
        table.add_column(col, justify="left" if col == "recompute" else "right")
    for rank, r in enumerate(result.top, start=1):
        cells = [str(rank), *_plan_cells(r), format_seconds(r["step_time_s"]), f"{r['tokens_per_s']:,.0f}",
                 f"{r['mfu']:.1%}", format_bytes(r["memory_bytes"])]
        if energy:
            cells += [format_energy(r["energy_j"]), f"{r['average_device_w']:,.0f}"]
        if objective == "cost":
            cells.append(f"{r['cost_per_step']:,.4g}")
        table.add_row(*cells)
    return table


_KIND_NAMES = {
    "embedding_lookup": "embedding lookups", "gemm": "GEMM", "other": "other (interaction, loss, optimizer)",
    "all_to_all": "all-to-all", "all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
}


def dlrm_table(e: DLRMEstimate) -> Table:
    title = (
        f"{e.model_id} on {format_devices(e.num_devices, e.cluster_id)}  {e.strategy}  "
        f"global batch {e.global_batch_size:,} samples  {e.precision}"
    )
    return metric_table(title, dlrm_groups(e))


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
    groups = {"time": time_rows, "work": work_rows, "memory": memory_rows}
    if e.energy is not None:
        groups["energy"] = energy_rows(e, "iteration")
    return groups


def serving_table(result) -> Table:
    table = Table(title=f"Best {len(result.top)} serving plans (of {result.candidates} valid)", header_style="bold")
    for col in ("rank", "tp", "pp", "dp", "TTFT", "TPOT", "decode tokens/s", "memory", "decode"):
        table.add_column(col, justify="right")
    for rank, r in enumerate(result.top, start=1):
        table.add_row(
            str(rank), str(r["tp"]), str(r["pp"]), str(r["dp"]), format_seconds(r["ttft_s"]), format_seconds(r["tpot_s"]),
            f"{r['decode_tokens_per_s']:,.0f}", format_bytes(r["memory_bytes"]),
            "host bound" if r.get("decode_host_bound") else "memory bound" if r["decode_memory_bound"] else "compute bound",
        )
    return table


def dlrm_search_table(result) -> Table:
    table = Table(title=f"Best {len(result.top)} DLRM strategies (of {result.candidates})", header_style="bold")
    for col in ("rank", "strategy", "iteration", "MQPS", "comm exposed", "memory"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for rank, r in enumerate(result.top, start=1):
        table.add_row(
            str(rank), r["strategy"], format_seconds(r["step_time_s"]), f"{r['samples_per_s'] / 1e6:.3g}",
            f"{r['comm_exposed_fraction']:.0%}", format_bytes(r["memory_bytes"]),
        )
    return table
