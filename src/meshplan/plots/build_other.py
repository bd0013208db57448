"""Figure data of the estimates that are not a training step: a serving request (prefill and
decode, ``--task inference``) and a DLRM iteration. Pure functions of the stored dicts."""

from __future__ import annotations

from meshplan.plots.build import energy_figures
from meshplan.plots.figures import Bars, Figure, Table
from meshplan.plots.inputs import Source


def _memory(data: dict, title: str) -> Bars:
    """One device's memory by category (every ``*_bytes`` but the totals) against capacity."""
    m = data["memory"]
    categories = [k for k, v in m.items() if k.endswith("_bytes") and k not in ("capacity_bytes", "total_bytes")
                  and isinstance(v, (int, float))]
    return Bars("memory", title, "bytes", ("device",),
                {k.removesuffix("_bytes").replace("_", " "): (m[k],) for k in categories},
                line=m["capacity_bytes"], line_label="capacity")


def _table(data: dict, keys: tuple[str, ...], title: str) -> Table:
    rows = [(k, data[k]) for k in keys if data.get(k) is not None]
    rows += [("memory_bytes", data["memory"]["total_bytes"]), ("capacity_bytes", data["memory"]["capacity_bytes"]),
             ("fits", data["fits"])]
    return Table("key_numbers", title, ("metric", "value"), tuple(rows))


# --- a serving request ----------------------------------------------------------------------

def inference_figures(source: Source, top: int = 10) -> tuple[list[Figure], list[str]]:
    d = source.data
    keys = ("model_id", "cluster_id", "num_devices", "batch_size", "prompt_len", "output_len", "ttft_s", "tpot_s",
            "request_s", "decode_tokens_per_s", "tokens_per_s", "energy_per_request_j", "energy_per_output_token_j")
    title = f"{d['model_id']} serving on {d['num_devices']} x {d['cluster_id']}"
    figures: list[Figure] = [_table(d, keys, title), phase_breakdown(d, "prefill"), phase_breakdown(d, "decode"),
                             _memory(d, "Memory per device against capacity (KV cache included)")]
    return figures, []


def phase_breakdown(d: dict, phase: str) -> Bars:
    """One pass of a phase through every stage: compute, tensor-parallel and pipeline
    communication; the segments sum to the phase's time (TTFT for the prefill, TPOT per decode step)."""
    p = d[phase]
    label = {"prefill": "The prefill (time to first token)", "decode": "One decode step (time per output token)"}[phase]
    return Bars(f"{phase}_breakdown", label, "s", (phase,),
                {"compute": (p["compute_s"],), "exposed tp": (p["tp_comm_s"],), "pp sends": (p["pp_comm_s"],)})


# --- a DLRM iteration -----------------------------------------------------------------------

def dlrm_figures(source: Source, top: int = 10) -> tuple[list[Figure], list[str]]:
    d = source.data
    keys = ("model_id", "cluster_id", "num_devices", "strategy", "global_batch_size", "precision", "iteration_s",
            "samples_per_s", "comm_exposed_fraction", "tflops_per_device")
    title = f"{d['model_id']} on {d['num_devices']} x {d['cluster_id']}"
    energy, notes = energy_figures(d)
    return [_table(d, keys, title), iteration_breakdown(d), serialized_by_kind(d),
            _memory(d, "Memory per device against capacity"), *energy], notes


def iteration_breakdown(d: dict) -> Bars:
    """The iteration: compute, then communication nothing hides (they sum to the iteration)."""
    return Bars("iteration_breakdown", "Where the iteration time goes", "s", ("iteration",),
                {"compute": (d["compute_s"],), "exposed communication": (d["exposed_comm_s"],)})


def serialized_by_kind(d: dict) -> Bars:
    """Each kind of work one after another (MAD Max Fig. 15 a): lookups, GEMMs, other compute, each collective."""
    return Bars("serialized_by_kind", "Serialized time by kind (nothing overlapped)", "s", ("serialized",),
                {k.replace("_", " "): (v,) for k, v in d["serialized_by_kind_s"].items()})
