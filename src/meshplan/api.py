"""The Python API: ``estimate(model, cluster, plan)``, accepting catalog ids or specs."""

from __future__ import annotations

from pathlib import Path

from meshplan import catalog
from meshplan.costs.costed import cost_program
from meshplan.parallel.program import build_program
from meshplan.io.hf_config import model_from_hf_config
from meshplan.specs import Cluster, Plan, Scenario, Task, TransformerModel, make_scenario
from meshplan.specs.base import build
from meshplan.timeline.estimate import Estimate
from meshplan.timeline.step import step_estimate
from meshplan.timeline.trace import chrome_trace


def resolve_model(model: str | TransformerModel | dict) -> TransformerModel:
    """A catalog id, a path to a HuggingFace config.json (or its folder), a mapping or a spec."""
    if isinstance(model, str):
        if model.endswith(".json") or Path(model).is_dir():
            return model_from_hf_config(model)
        return catalog.model(model)
    return build(TransformerModel, model, "model")


def resolve_cluster(cluster: str | Cluster | dict) -> Cluster:
    if isinstance(cluster, str):
        return catalog.cluster(cluster)
    if isinstance(cluster, dict) and isinstance(cluster.get("device"), str):
        cluster = {**cluster, "device": catalog.device(cluster["device"])}
    return build(Cluster, cluster, "cluster")


def scenario(
    model: str | TransformerModel | dict,
    cluster: str | Cluster | dict,
    plan: Plan | dict | None = None,
    num_devices: int | None = None,
    task: Task | dict | None = None,
    **plan_fields,
) -> Scenario:
    """Validate the inputs once; every error names its field."""
    plan_data = plan.model_dump(exclude_unset=True) if isinstance(plan, Plan) else dict(plan or {})
    plan_data.update(plan_fields)
    return make_scenario(
        resolve_model(model),
        resolve_cluster(cluster),
        build(Plan, plan_data, "plan"),
        num_devices,
        build(Task, task or {}, "task"),
    )


def estimate(
    model: str | TransformerModel | dict,
    cluster: str | Cluster | dict,
    plan: Plan | dict | None = None,
    num_devices: int | None = None,
    task: Task | dict | None = None,
    **plan_fields,
) -> Estimate:
    """Predict one training step. ``plan`` fields may also be given as keyword arguments::

        meshplan.estimate("gpt3-175b", "dgx-a100-80gb", tp=8, pp=16, num_devices=1536,
                          global_batch_size=1536, recompute="full")
    """
    return estimate_scenario(scenario(model, cluster, plan, num_devices, task, **plan_fields))


def estimate_scenario(s: Scenario) -> Estimate:
    return step_estimate(cost_program(build_program(s)))


def trace(s: Scenario) -> dict:
    """The Chrome/Perfetto trace of one step of ``s`` (open it in ui.perfetto.dev)."""
    costed = cost_program(build_program(s))
    return chrome_trace(costed, step_estimate(costed))
