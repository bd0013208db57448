"""Figure data from stored results: an estimate, a search (store folder or ``--json``), or a
validation. Pure functions of the stored dicts and rows; nothing here runs a model."""

from __future__ import annotations

from contextlib import contextmanager

from meshplan.errors import MeshplanError
from meshplan.explore.search import PLAN_COLUMNS
from meshplan.plots.figures import Bars, Figure, Report, Scatter, Series, Table
from meshplan.plots.inputs import Source, writer
from meshplan.plots.timeline import timeline

#: the exposed communication columns of a stored row, per axis
AXES = ("tp", "cp", "ep", "pp", "dp")

#: a stored row's energy per step, once rows carry one (the first column present is used)
ENERGY_COLUMNS = ("energy_j", "energy_per_step_j", "energy_total_j")

#: the memory categories of an estimate, drawn bottom to top
MEMORY_CATEGORIES = ("weights_bytes", "low_precision_weights_bytes", "gradients_bytes", "optimizer_bytes",
                     "activations_bytes", "gathered_weights_bytes", "comm_buffers_bytes", "optimizer_step_bytes")


def report(source: Source, trace: dict | None = None, top: int = 10, price: float | None = None,
           trace_path: str = "the trace") -> Report:
    """Every figure the stored result supports, and the timeline of ``trace`` (read from
    ``trace_path``) if given. ``price`` (per device-hour) adds a search's front of step time
    against cost per step."""
    from meshplan.plots.build_other import dlrm_figures, inference_figures

    builders = {"estimate": estimate_figures, "inference": inference_figures, "dlrm": dlrm_figures,
                "store": search_figures, "search": search_figures, "validation": validation_figures}
    with _as_written("INPUT", source.path, writer(source.kind)):
        if source.kind in ("store", "search"):
            figures, notes = search_figures(source, top, price)
        else:
            figures, notes = builders[source.kind](source, top)
    if trace is not None:
        with _as_written("--trace", trace_path, "estimate --trace"):
            figures.append(timeline(trace, title="Per-device timeline" + (" of one step" if source.kind == "estimate" else "")))
    elif source.kind != "validation":
        notes.append("no timeline: pass the trace of the plan with --trace (meshplan estimate ... --trace FILE)")
    title = "meshplan " + {"store": "search", "search": "search", "validation": "validate"}.get(source.kind, "estimate")
    return Report(title, f"{source.kind}: {source.path}", tuple(figures), tuple(notes))


@contextmanager
def _as_written(flag: str, path: str, written_by: str):
    """A stored file that has the shape of ``written_by``'s output but lacks a field the figures
    read, or holds a value of another kind there (a damaged or hand-edited file), is bad input
    naming the file, not an internal error."""
    try:
        yield
    except MeshplanError:
        raise
    except KeyError as err:
        raise MeshplanError(flag, path, f"a file as meshplan {written_by} writes it (it has no {err.args[0]!r})") from None
    except (TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as err:
        raise MeshplanError(flag, path, f"a file as meshplan {written_by} writes it (a value of the wrong kind: {err})") from None


# --- one estimate -------------------------------------------------------------------------

def estimate_figures(source: Source, top: int = 10) -> tuple[list[Figure], list[str]]:
    e = source.data
    energy, notes = energy_figures(e)
    return [key_numbers(e), step_breakdown(e), memory_per_role(e), *energy], notes


def energy_figures(e: dict) -> tuple[list[Figure], list[str]]:
    """The energy breakdown of an estimate, or a note that its device has no power model."""
    if e.get("energy"):
        return [energy_breakdown(e)], []
    return [], ["no energy figure: the device of this estimate has no power model"]


def key_numbers(e: dict) -> Table:
    p = e["plan"]
    plan = " ".join(f"{k}={p[k]}" for k in ("tp", "pp", "dp", "cp", "ep", "micro_batch_size", "global_batch_size",
                                            "seq_len", "zero_stage", "recompute", "precision") if k in p)
    rows = [("model", e["model_id"]), ("cluster", e["cluster_id"]), ("devices", e["num_devices"]), ("plan", plan),
            ("step_time_s", e["step_time_s"]), ("tokens_per_s", e["tokens_per_s"]), ("mfu", e["mfu"]),
            ("memory_bytes", e["memory"]["total_bytes"]), ("capacity_bytes", e["memory"]["capacity_bytes"]),
            ("fits", e["fits"])]
    if e.get("energy"):
        rows += [("energy_j", e["energy"]["total_j"]), ("average_device_w", e["energy"]["average_device_w"])]
    return Table("key_numbers", f"{e['model_id']} on {e['num_devices']} x {e['cluster_id']}", ("metric", "value"), tuple(rows))


def step_breakdown(e: dict) -> Bars:
    """Where the step time goes: compute (recompute apart), exposed communication per axis,
    bubble, optimizer; the segments sum to the breakdown's total."""
    b = e["breakdown"]
    series = {"compute": b["compute_s"] - b["recompute_s"], "recompute": b["recompute_s"]}
    series.update({f"exposed {axis}": t for axis, t in b["exposed_comm_s"].items()})
    series.update(bubble=b["bubble_s"], optimizer=b["optimizer_s"])
    return Bars("step_breakdown", "Where the step time goes", "s", ("step",), {k: (v,) for k, v in series.items()})


def memory_per_role(e: dict) -> Bars:
    """Memory per device of each pipeline role, by category, against the device's capacity."""
    roles = e["roles"] or [{"name": "device", "memory": e["memory"]}]
    series = {c.removesuffix("_bytes").replace("_", " "): tuple(r["memory"].get(c, 0.0) for r in roles)
              for c in MEMORY_CATEGORIES}
    return Bars("memory", "Memory per device against capacity", "bytes", tuple(f"{r['name']} stage" for r in roles),
                series, line=e["memory"]["capacity_bytes"], line_label="capacity")


def energy_breakdown(e: dict) -> Bars:
    """Energy of one step by component: compute, HBM, each network level's links, idle power."""
    en = e["energy"]
    series = {"compute": en["compute_j"], "memory": en["memory_j"]}
    series.update({f"links {level}": j for level, j in en["links_j"].items()})
    series["static"] = en["static_j"]
    return Bars("energy", "Energy per step (all devices)", "j", ("step",), {k: (v,) for k, v in series.items()})


# --- a search -------------------------------------------------------------------------------

def search_figures(source: Source, top: int = 10, price: float | None = None) -> tuple[list[Figure], list[str]]:
    energy = None
    if source.kind == "store":  # every plan the search evaluated; the fastest first
        rows = [r for r in source.data if r.get("fits") and r.get("step_time_s") is not None]
        capacity = ((source.job or {}).get("cluster") or {}).get("device", {}).get("hbm_bytes")
        energy = energy_column(rows)
        fronts = {"memory": front(rows, "memory_bytes"), "devices": front(rows, "num_devices"),
                  "energy": front(rows, energy) if energy else []}
        best, title = sorted(rows, key=lambda r: r["step_time_s"])[:top], "fastest plans that fit"
    else:  # the top plans as the search ranked them (by its --objective), and its exact fronts
        rows = list(source.data["top"])
        capacity = None
        stored = source.data.get("pareto") or {}
        energy = energy_column(rows) or ("energy_j" if stored.get("energy") else None)
        fronts = {"memory": stored.get("memory") or front(rows, "memory_bytes"),
                  "devices": stored.get("devices") or front(rows, "num_devices"),
                  "energy": stored.get("energy") or (front(rows, energy) if energy else [])}
        best, title = rows[:top], "best plans of the search"
    figures: list[Figure] = [top_plans(best, title), plan_breakdowns(best), plan_memory(best, capacity)]
    notes: list[str] = []
    figures.append(pareto_scatter("pareto_memory", "Step time against memory per device", rows, fronts["memory"],
                                  "memory_bytes", "memory per device", "bytes"))
    if len({r["num_devices"] for r in rows + fronts["devices"]}) > 1:
        figures.append(pareto_scatter("pareto_devices", "Step time against devices used", rows, fronts["devices"],
                                      "num_devices", "devices", "count"))
    else:
        notes.append("no devices front: every plan uses the same device count (meshplan search --pareto --json has it)")
    if energy and fronts["energy"]:
        figures.append(pareto_scatter("pareto_energy", "Step time against energy per step",
                                      [r for r in rows if r.get(energy) is not None], fronts["energy"],
                                      energy, "energy per step", "j"))
    else:
        notes.append("no energy front: the stored plans carry no energy per step (no power model)")
    if price is not None:  # device-hours of a step at the price (meshplan.explore.objectives)
        rows = [{**r, "cost_per_step": r["step_time_s"] * r["num_devices"] / 3600.0 * price} for r in rows]
    if any(r.get("cost_per_step") is not None for r in rows):
        costed = [r for r in rows if r.get("cost_per_step") is not None]
        figures.append(pareto_scatter("pareto_cost", "Step time against cost per step", costed,
                                      front(costed, "cost_per_step"), "cost_per_step", "cost per step", "count"))
    else:
        notes.append("no cost front: give a price per device-hour with --price")
    return figures, notes


def plan_label(row: dict) -> str:
    """A short name of a plan: its parallel degrees and the knobs that are not defaults."""
    parts = [f"tp{row['tp']} pp{row['pp']} dp{row['dp']}"]
    parts += [f"{k}{row[k]}" for k in ("cp", "ep") if row.get(k, 1) != 1]
    parts.append(f"mb{row['micro_batch_size']}")
    if row.get("virtual_pipeline_stages", 1) != 1:
        parts.append(f"v{row['virtual_pipeline_stages']}")
    parts.append(f"z{row['zero_stage']}")
    if row.get("recompute", "none") != "none":
        parts.append(f"rc-{row['recompute']}")
    return " ".join(parts)


def top_plans(rows: list[dict], title: str = "fastest plans that fit") -> Table:
    columns = (*PLAN_COLUMNS, "step_time_s", "tokens_per_s", "mfu", "memory_bytes")
    columns += tuple(c for c in ENERGY_COLUMNS if rows and rows[0].get(c) is not None)[:1]
    return Table("top_plans", f"The {len(rows)} {title}", ("rank", *columns),
                 tuple((rank, *(row.get(c) for c in columns)) for rank, row in enumerate(rows, start=1)))


def plan_breakdowns(rows: list[dict]) -> Bars:
    """Each plan's step time by component (the stored row's breakdown columns)."""
    series = {"compute": tuple(r["compute_s"] for r in rows)}
    series.update({f"exposed {axis}": tuple(r.get(f"exposed_{axis}_s") or 0.0 for r in rows) for axis in AXES})
    series.update(bubble=tuple(r["bubble_s"] for r in rows), optimizer=tuple(r["optimizer_s"] for r in rows))
    return Bars("plan_breakdowns", "Where the step time goes, fastest plans", "s", _labels(rows), series)


def plan_memory(rows: list[dict], capacity: float | None) -> Bars:
    return Bars("plan_memory", "Memory per device, fastest plans", "bytes", _labels(rows),
                {"memory per device": tuple(r["memory_bytes"] for r in rows)}, line=capacity,
                line_label="capacity" if capacity else "")


def _labels(rows: list[dict]) -> tuple[str, ...]:
    """Plan labels, numbered by rank so two plans never share a bar."""
    return tuple(f"{rank}. {plan_label(r)}" for rank, r in enumerate(rows, start=1))


def front(rows: list[dict], column: str) -> list[dict]:
    """The rows no other row beats on both step time and ``column`` (less is better on both),
    least ``column`` first."""
    out: list[dict] = []
    for row in sorted((r for r in rows if r.get(column) is not None), key=lambda r: (r[column], r["step_time_s"])):
        if not out or row["step_time_s"] < out[-1]["step_time_s"]:
            if out and out[-1][column] == row[column]:
                out.pop()
            out.append(row)
    return out


def energy_column(rows: list[dict]) -> str | None:
    """The energy column the rows carry (None: no row has one, e.g. no power model)."""
    return next((c for c in ENERGY_COLUMNS if any(r.get(c) is not None for r in rows)), None)


def pareto_scatter(name: str, title: str, rows: list[dict], front_rows: list[dict], column: str, label: str,
                   unit: str) -> Scatter:
    """Every plan that fits as a point, the front as a staircase through its plans (least
    ``column`` first, whatever order the front was stored in)."""
    front_rows = sorted(front_rows, key=lambda r: r[column])
    every = Series("plans that fit", tuple(float(r[column]) for r in rows), tuple(r["step_time_s"] for r in rows),
                   tuple(plan_label(r) for r in rows))
    line = Series("Pareto front", tuple(float(r[column]) for r in front_rows), tuple(r["step_time_s"] for r in front_rows),
                  tuple(plan_label(r) for r in front_rows), mode="lines+markers")
    return Scatter(name, title, label, "step time", unit, "s", (every, line))


# --- a validation ---------------------------------------------------------------------------

def validation_figures(source: Source, top: int = 10) -> tuple[list[Figure], list[str]]:
    cases = source.data
    scored = [c for c in cases if c.get("relative_error") is not None]
    notes = [f"{len(cases) - len(scored)} case(s) could not be scored (see the table)"] if len(scored) < len(cases) else []
    figures: list[Figure] = [case_table(cases)]
    if scored:
        figures += [predicted_vs_measured(scored), group_errors(scored)]
    return figures, notes


def case_table(cases: list[dict]) -> Table:
    columns = ("id", "group", "measured_step_time_s", "predicted_step_time_s", "relative_error", "error")
    return Table("cases", "Validation cases", columns, tuple(tuple(c.get(k) for k in columns) for c in cases))


def median_abs_error(cases: list[dict]) -> float:
    errors = sorted(abs(c["relative_error"]) for c in cases)
    mid = len(errors) // 2
    return errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2


def predicted_vs_measured(cases: list[dict]) -> Scatter:
    """One series per group; the band is the median absolute error of all scored cases."""
    groups = dict.fromkeys(c["group"] for c in cases)
    series = tuple(
        Series(group, tuple(c["measured_step_time_s"] for c in cases if c["group"] == group),
               tuple(c["predicted_step_time_s"] for c in cases if c["group"] == group),
               tuple(c["id"] for c in cases if c["group"] == group))
        for group in groups)
    band = median_abs_error(cases)
    return Scatter("predicted_vs_measured", "Predicted against measured step time", "measured step time",
                   "predicted step time", "s", "s", series, log=True, band=band,
                   band_label=f"median |error| {band:.1%}")


def group_errors(cases: list[dict]) -> Bars:
    """Median and largest absolute relative error of each group."""
    groups = tuple(dict.fromkeys(c["group"] for c in cases))
    medians = tuple(median_abs_error([c for c in cases if c["group"] == g]) for g in groups)
    largest = tuple(max(abs(c["relative_error"]) for c in cases if c["group"] == g) for g in groups)
    return Bars("group_errors", "Absolute relative error per group", "fraction", groups,
                {"median": medians, "beyond the median (to the largest)": tuple(m - s for m, s in zip(largest, medians))})
