"""The Python API: ``estimate(model, cluster, plan)``, accepting catalog ids or specs."""

from __future__ import annotations

import os
from pathlib import Path

from meshplan import catalog
from meshplan.costs.costed import cost_program
from meshplan.errors import MeshplanError
from meshplan.explore.search import ROW_TYPES, SearchResult, search_strategies
from meshplan.explore.search import search as run_search
from meshplan.explore.executors import EXECUTORS, make_executor
from meshplan.explore.pareto import device_counts, devices_front, energy_front, memory_front
from meshplan.explore.serving import search_serving
from meshplan.explore.space import SearchSpace
from meshplan.explore.store import PlanStore
from meshplan.io.hf_config import model_from_hf_config
from meshplan.io.profile import load_profile
from meshplan.parallel.hierarchy import plan_for_strategy
from meshplan.parallel.program import build_program
from meshplan.parallel.strategy import build_strategy_program
from meshplan.specs import Cluster, Plan, Scenario, Task, TransformerModel, make_scenario
from meshplan.specs.base import build
from meshplan.specs.scenario import device_count
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.profile import Profile
from meshplan.specs.strategy import Strategy
from meshplan.specs.dlrm_scenario import DLRMScenario, make_dlrm_scenario
from meshplan.timeline.estimate import DLRMEstimate, Estimate
from meshplan.timeline.inference import InferenceEstimate, inference_estimate, serving_plans
from meshplan.timeline.iteration import iteration_estimate, iteration_trace
from meshplan.timeline.step import step_estimate
from meshplan.timeline.trace import chrome_trace, serving_trace
from meshplan.units import format_bytes


def resolve_model(model: str | TransformerModel | DLRMModel | dict) -> TransformerModel | DLRMModel:
    """A catalog id, a path to a HuggingFace config.json (or its folder), a mapping or a spec.
    A mapping with ``arch: dlrm`` (or a DLRM catalog id) gives a DLRMModel."""
    if isinstance(model, str):
        if model.endswith(".json") or _is_dir(model):
            return model_from_hf_config(model)
        return catalog.model(model)
    if isinstance(model, DLRMModel) or (isinstance(model, dict) and model.get("arch") == "dlrm"):
        return build(DLRMModel, model, "model")
    if not isinstance(model, (TransformerModel, dict)):
        raise MeshplanError("model", model, "a catalog model id, a HuggingFace config.json path, or a mapping of model fields")
    return build(TransformerModel, model, "model")


def _is_dir(path: str) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):  # a name too long for a path, an embedded NUL: not a folder
        return False


def resolve_cluster(cluster: str | Cluster | dict, profile: str | Path | Profile | dict | None = None) -> Cluster:
    """A catalog id, a mapping or a spec; with ``profile`` (a measured profile's path, e.g. from
    ``meshplan calibrate``), its device runs at the measured efficiency instead of the catalog's."""
    if isinstance(cluster, str):
        resolved = catalog.cluster(cluster)
    elif not isinstance(cluster, (Cluster, dict)):
        raise MeshplanError("cluster", cluster, "a catalog cluster id, or a mapping of cluster fields")
    else:
        if isinstance(cluster, dict) and isinstance(cluster.get("device"), str):
            cluster = {**cluster, "device": catalog.device(cluster["device"])}
        resolved = build(Cluster, cluster, "cluster")
    return resolved if profile is None else load_profile(profile).apply(resolved)


def with_compute_units(cluster: str | Cluster | dict, sm_count: int) -> Cluster:
    """``cluster`` with every device scaled to ``sm_count`` SMs (Device.with_compute_units; the
    power left for work above the profile's idle power scales with them)."""
    resolved = resolve_cluster(cluster)
    power = catalog.efficiency(resolved.device.efficiency).power
    device = resolved.device.with_compute_units(sm_count, power.idle_w if power else 0.0)
    return resolved.model_copy(update={"id": f"{resolved.id}-{sm_count}sm", "device": device})


def scenario(
    model: str | TransformerModel | dict,
    cluster: str | Cluster | dict,
    plan: Plan | dict | None = None,
    num_devices: int | None = None,
    task: Task | dict | None = None,
    profile: str | Path | Profile | dict | None = None,
    **plan_fields,
) -> Scenario:
    """Validate the inputs once; every error names its field. A DLRM gives a DLRMScenario, whose
    plan fields are ``strategy``, ``global_batch_size`` and ``precision``."""
    plan_data = _plan_fields(plan)
    plan_data.update(plan_fields)
    resolved = resolve_model(model)
    if isinstance(resolved, DLRMModel):
        return make_dlrm_scenario(resolved, resolve_cluster(cluster, profile), plan_data, num_devices, task)
    resolved_cluster = resolve_cluster(cluster, profile)
    if plan_data.get("strategy") is not None:
        plan_data = _transformer_strategy(plan_data, resolved_cluster, num_devices)
    plan_data = _framework_on_device(plan_data, resolved_cluster)
    return make_scenario(
        resolved,
        resolved_cluster,
        build(Plan, plan_data, "plan"),
        num_devices,
        build(Task, task or {}, "task"),
    )


def _plan_fields(plan: Plan | dict | None) -> dict:
    """The fields a plan sets: a Plan's, or a mapping's."""
    if isinstance(plan, Plan):
        return plan.model_dump(exclude_unset=True)
    if plan is not None and not isinstance(plan, dict):
        raise MeshplanError("plan", plan, "a Plan, or a mapping of plan fields (tp, pp, dp, ...), or plan fields as keywords")
    return dict(plan or {})


def _framework_on_device(plan_data: dict, cluster: Cluster) -> dict:
    """The plan's framework defaults as they were on the cluster's device family
    (catalog.framework_on), under the fields the plan gives."""
    name = catalog.framework_id(plan_data.get("framework"))
    changes = catalog.framework_on(name, cluster.device.efficiency) if name else {}
    return {**changes, **plan_data} if changes else plan_data


def _transformer_strategy(plan_data: dict, cluster: Cluster, num_devices: int | None) -> dict:
    """A MAD Max strategy for a transformer model becomes plan fields (tp, dp, ZeRO, mesh order);
    fields the plan also sets explicitly must agree with it."""
    strategy = build(Strategy, plan_data.pop("strategy"), "strategy")
    if num_devices is None:
        raise MeshplanError("num_devices", None, "give the device count with a strategy")
    num_devices = device_count(num_devices)
    fields = plan_for_strategy(strategy.of("transformer"), cluster, num_devices)
    for key, value in fields.items():
        if key in plan_data and plan_data[key] != value:
            raise MeshplanError(f"plan.{key}", plan_data[key], f"the strategy {strategy.label} implies {key}={value}")
    return {**plan_data, **fields}


def estimate(
    model: str | TransformerModel | dict,
    cluster: str | Cluster | dict,
    plan: Plan | dict | None = None,
    num_devices: int | None = None,
    task: Task | dict | None = None,
    profile: str | Path | Profile | dict | None = None,
    **plan_fields,
) -> Estimate | InferenceEstimate:
    """Predict one training step (or, with ``task={"kind": "inference", ...}``, a prefill and
    the decode that follows it). ``plan`` fields may also be given as keyword arguments::

        meshplan.estimate("gpt3-175b", "dgx-a100-80gb", tp=8, pp=16, num_devices=1536,
                          global_batch_size=1536, recompute="full")

    ``profile`` is a measured profile (the profile.yaml ``meshplan calibrate`` writes) used
    instead of the device's catalog profile.

    A DLRM takes a per-layer-kind strategy instead (MAD Max Sec. 2.2) and returns a DLRMEstimate::

        meshplan.estimate(model="dlrm-a", cluster="zionex-a100", num_devices=128,
                          strategy="embedding=(mp) dense=(tp,ddp)", global_batch_size=65536)
    """
    return estimate_scenario(scenario(model, cluster, plan, num_devices, task, profile, **plan_fields))


def estimate_scenario(s: Scenario | DLRMScenario) -> Estimate | InferenceEstimate | DLRMEstimate:
    if isinstance(s, DLRMScenario):
        return iteration_estimate(build_strategy_program(s))
    if s.task.kind == "inference":
        return inference_estimate(s)
    return step_estimate(cost_program(build_program(s)))


#: a trace draws every forward and backward pass; beyond this many it is too big to open
TRACE_MAX_EVENTS = 100_000


def trace(s: Scenario) -> dict:
    """The Chrome/Perfetto trace of one step of ``s``, or of a serving request's prefill and first
    decode steps (open it in ui.perfetto.dev)."""
    if isinstance(s, DLRMScenario):
        return iteration_trace(iteration_estimate(build_strategy_program(s)))
    if s.task.kind == "inference":
        if s.plan.virtual_pipeline_stages > 1:
            raise MeshplanError("--trace", f"{s.plan.virtual_pipeline_stages} virtual stages",
                                "serving traces are drawn without virtual pipeline stages only so far")
        plans = serving_plans(s)
        return serving_trace(*plans, inference_estimate(s, plans=plans))
    if s.plan.pp * s.num_micro_batches > TRACE_MAX_EVENTS:
        raise MeshplanError("--trace", f"{s.num_micro_batches} micro-batches on {s.plan.pp} stages",
                            f"at most {TRACE_MAX_EVENTS} forward passes in a trace (pp x micro-batches)")
    costed = cost_program(build_program(s))
    return chrome_trace(costed, step_estimate(costed))


def search_job(model, cluster, num_devices, plan=None, space=None, task=None, profile=None, **plan_fields) -> tuple:
    """Resolve and validate the inputs of a search: (model, cluster, devices, base plan, space, task)."""
    plan_data = _plan_fields(plan)
    plan_data.update(plan_fields)
    if not isinstance(num_devices, int) or isinstance(num_devices, bool) or num_devices < 1:
        raise MeshplanError("num_devices", num_devices, "must be a positive integer")
    resolved = resolve_model(model)
    _check_fixed_fields(plan_data, space, resolved, task)
    if isinstance(resolved, DLRMModel):
        return (resolved, resolve_cluster(cluster, profile), num_devices, plan_data, None, task)
    resolved_cluster = resolve_cluster(cluster, profile)
    return (
        resolved,
        resolved_cluster,
        num_devices,
        build(Plan, _framework_on_device(plan_data, resolved_cluster), "plan"),
        build(SearchSpace, space or {}, "space"),
        build(Task, task or {}, "task"),
    )


def _check_fixed_fields(plan_data: dict, space, resolved, task) -> None:
    """A search sets some fields itself: fixing them in the plan, or giving space fields this
    search does not vary, would be silently ignored, so both are errors."""
    given = space.model_fields_set if isinstance(space, SearchSpace) else set(space) if isinstance(space, dict) else set()
    kind = task.kind if isinstance(task, Task) else (task or {}).get("kind") if isinstance(task, dict) else None
    if isinstance(resolved, DLRMModel):
        searched, varied, who = ("strategy",), (), "a DLRM search (it tries every per-layer-kind strategy)"
    elif kind == "inference":
        searched, varied, who = ("tp", "pp", "dp"), ("tp", "pp"), "a serving search"
    else:
        searched, varied, who = (*SearchSpace.model_fields, "dp"), None, "a training search"
    for key in plan_data:
        if key in searched:
            instead = ("dp follows from the device count" if key == "dp" else "drop it" if varied == ()
                       else f"narrow space.{key} instead")
            raise MeshplanError(f"plan.{key}", plan_data[key], f"{who} sets it; {instead}")
    for key in sorted(given, key=str):
        if varied is not None and key not in varied:
            valid = f"it varies only {', '.join(varied)}" if varied else "it takes no space"
            raise MeshplanError(f"space.{key}", (space or {}).get(key) if isinstance(space, dict) else getattr(space, key), f"{who} does not read it; {valid}")


def pareto(model, cluster, num_devices, plan=None, space=None, task=None, progress=None, profile=None, **plan_fields) -> dict:
    """Exact Pareto fronts around the best plan: step time vs memory per device, step time vs
    devices used (num_devices, num_devices/2, ...), and step time vs energy per step.
    ``progress(done, total)`` counts the plans
    the memory front considers, then one more for each device count's search."""
    job = search_job(model, cluster, num_devices, plan, space, task, profile, **plan_fields)
    if isinstance(job[0], DLRMModel) or job[5].kind == "inference":
        raise MeshplanError("--pareto", True, "Pareto fronts are drawn for transformer training searches")
    counts = len(device_counts(num_devices))
    plans = 0

    def memory_progress(done: int, total: int) -> None:
        nonlocal plans
        plans = total
        progress(done, total + counts)

    def devices_progress(done: int, total: int) -> None:
        progress(plans + done, plans + total)

    return {
        "memory": memory_front(*job, progress=memory_progress if progress else None),
        "devices": devices_front(*job, progress=devices_progress if progress else None),
        "energy": energy_front(*job),
    }


def search(
    model: str | TransformerModel | dict,
    cluster: str | Cluster | dict,
    num_devices: int,
    plan: Plan | dict | None = None,
    space: SearchSpace | dict | None = None,
    top: int = 10,
    task: Task | dict | None = None,
    progress=None,
    reference: dict | None = None,
    executor: str = "serial",
    workers: int | None = None,
    store: str | None = None,
    profile: str | Path | Profile | dict | None = None,
    objective: str = "time",
    **plan_fields,
) -> SearchResult:
    """The ``top`` best plans that fit by ``objective`` (time, energy, edp or cost), exactly.
    ``plan`` holds what is not searched (global batch, seq_len, precision); ``space`` narrows or
    widens the knobs searched::

        meshplan.search("llama3-70b", "dgx-h100", 512, global_batch_size=1024, seq_len=8192)

    ``executor`` is serial, local (worker processes) or ray; ``store`` is a folder that keeps
    every evaluated plan as Parquet and lets an interrupted search resume; ``profile`` a
    measured profile (``meshplan calibrate``) used instead of the device's catalog profile.
    """
    _check_search_options(top, executor, workers)
    _check_search_hooks(progress, reference, store)
    job = search_job(model, cluster, num_devices, plan, space, task, profile, **plan_fields)
    resolved_model, resolved_cluster, _, base, resolved_space, resolved_task = job
    if objective != "time" and (isinstance(resolved_model, DLRMModel) or resolved_task.kind == "inference"):
        raise MeshplanError("--objective", objective, "time: DLRM and serving searches rank by time")
    if isinstance(resolved_model, DLRMModel):  # per-layer-kind strategies (MAD Max Sec. 2.2)
        result = search_strategies(resolved_model, resolved_cluster, num_devices, base, top, resolved_task)
        if not result.top:
            raise _nothing_fits(result, num_devices, resolved_cluster.device.hbm_bytes)
        return result
    plan_store = None
    if store is not None:
        job = {
            "model": resolved_model.model_dump(mode="json"),
            "cluster": resolved_cluster.model_dump(mode="json"),
            "num_devices": num_devices,
            "plan": base.model_dump(mode="json"),
            "space": resolved_space.model_dump(mode="json"),
            "task": resolved_task.model_dump(mode="json"),
        }
        plan_store = PlanStore(store, job, ROW_TYPES)
    if resolved_task.kind == "inference":
        result = search_serving(resolved_model, resolved_cluster, num_devices, base, resolved_space, top, resolved_task)
        if not result.top:
            raise _nothing_fits(result, num_devices, resolved_cluster.device.hbm_bytes)
        return result
    pool = make_executor(executor, workers)
    try:
        result = run_search(
            resolved_model, resolved_cluster, num_devices, base, resolved_space, top, resolved_task,
            progress, reference, None if executor == "serial" else pool, plan_store, objective=objective,
        )
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if not result.top:
        raise _nothing_fits(result, num_devices, resolved_cluster.device.hbm_bytes)
    return result


def _check_search_options(top: object, executor: object, workers: object) -> None:
    """Checked before any work (a store folder is created only for a search that can run)."""
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise MeshplanError("top", top, "must be at least 1")
    if executor not in EXECUTORS:
        raise MeshplanError("--executor", executor, f"one of {', '.join(EXECUTORS)}")
    if workers is None:
        return
    if executor != "local":
        raise MeshplanError("--workers", workers, "sets the worker processes of --executor local only")
    most = 4 * (os.cpu_count() or 1)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= most:
        raise MeshplanError("--workers", workers, f"between 1 and {most} (4 per core of this machine)")


def _check_search_hooks(progress: object, reference: object, store: object) -> None:
    """The search's progress callback, reference plan and store folder, each of its kind."""
    if progress is not None and not callable(progress):
        raise MeshplanError("progress", progress, "a function progress(done, total), or None")
    if reference is not None and not isinstance(reference, dict):
        raise MeshplanError("reference", reference, "a mapping of plan fields (tp, pp, ...) to rank among the plans, or None")
    if store is not None and (not isinstance(store, (str, Path)) or not str(store).strip()):
        raise MeshplanError("store", store, "a folder's path (a new one, or a store to resume), or None")


def _nothing_fits(result: SearchResult, num_devices: int, capacity: float) -> MeshplanError:
    """Which constraint fails for every plan, and the closest change that would help."""
    if result.candidates == 0:
        field, count = max(result.rejected.items(), key=lambda item: item[1])
        return MeshplanError(
            field, f"{count} of {result.space_size} points",
            "no plan of the space passes this constraint",
            hint="widen the space (--set space.tp=[1,2,4,8]) or change --devices or --global-batch",
        )
    need = result.leanest_infeasible_bytes
    factor = -(-need // capacity)  # ceil
    return MeshplanError(
        "memory",
        f"{format_bytes(need, 'GiB')} per device for the leanest of {result.candidates} plans",
        f"a device holds {format_bytes(capacity, 'GiB')}",
        hint=f"try about {int(factor) * num_devices} devices, zero_stage 3 and recompute full in the space, "
        "or a smaller micro-batch",
    )


def collective(kind: str, cluster: str | Cluster | dict, devices: int, sizes, stride: int = 1, algorithm: str = "auto",
               protocol: str = "auto", measured=None, profile: str | Path | Profile | dict | None = None,
               gpus_per_thread: int = 1):
    """The model's curve of one collective over ``devices`` of ``cluster`` (``stride`` ranks
    apart, as a plan's groups sit): a CollectivePoint per size in bytes (nccl-tests' buffer
    sizes), each with the algorithm x protocol NCCL's tuner runs, or the forced pair (NCCL_ALGO,
    NCCL_PROTO spellings), and ``measured`` seconds beside it where given. ``gpus_per_thread``:
    the GPUs each thread of the measuring run launched on (nccl-tests ``-g``), whose launches
    floor each call (meshplan.io.nccl_tests.launch_floor_s)."""
    from meshplan.costs.collectives import CURVE_KINDS, collective_curve, group_span
    from meshplan.network.tuner import usable_algorithms
    from meshplan.specs.plan import COLLECTIVE_ALGORITHMS, COLLECTIVE_PROTOCOLS, forced_algorithms_text

    if kind not in CURVE_KINDS:
        raise MeshplanError("kind", kind, f"one of {', '.join(CURVE_KINDS)}")
    resolved = resolve_cluster(cluster, profile)
    devices = device_count(devices)
    if devices < 2:
        raise MeshplanError("devices", devices, "at least 2: a collective joins several devices")
    resolved.check_devices(devices)
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise MeshplanError("stride", stride, "a positive integer: ranks between consecutive members")
    sizes = [float(s) for s in sizes]
    if not sizes or any(not s > 0 for s in sizes):
        raise MeshplanError("sizes", sizes, "one or more sizes in bytes, each above 0")
    if isinstance(gpus_per_thread, bool) or not isinstance(gpus_per_thread, int) or gpus_per_thread < 1:
        raise MeshplanError("gpus_per_thread", gpus_per_thread, "a positive integer: the GPUs one thread launched on (nccl-tests -g)")
    valid = f"auto or one of {', '.join(COLLECTIVE_ALGORITHMS)} (NCCL_ALGO's spellings too)"
    try:
        name = forced_algorithms_text(algorithm) if isinstance(algorithm, str) and ":" not in algorithm else None
    except MeshplanError:
        name = None
    if name is None:
        raise MeshplanError("algorithm", algorithm, valid)
    protocol_name = {p.lower(): p for p in COLLECTIVE_PROTOCOLS}.get(str(protocol).lower())
    if protocol_name is None:
        raise MeshplanError("protocol", protocol, f"one of {', '.join(COLLECTIVE_PROTOCOLS)}")
    protocol = protocol_name
    span = group_span(resolved, devices, stride)
    if (name, protocol) != ("auto", "auto"):  # as NCCL fails a call that NCCL_ALGO / NCCL_PROTO leave nothing
        usable = usable_algorithms(kind, 1 << 20, span, protocol)
        if not usable or name not in ("auto", *usable):
            field, value = ("algorithm", algorithm) if name != "auto" else ("protocol", protocol)
            raise MeshplanError(field, value, f"what runs {kind} over {devices} devices of {resolved.id} with protocol "
                                              f"{protocol}: {', '.join(usable) or 'nothing'}")
    return collective_curve(kind, span, sizes, name, protocol, measured, gpus_per_thread)
