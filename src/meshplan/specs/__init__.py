"""Frozen, validated inputs: Device, Cluster, TransformerModel, Plan, Task, Scenario."""

from meshplan.specs.cluster import Cluster, NetworkLevel
from meshplan.specs.device import BYTES_PER_ELEMENT, Device, Efficiency, EfficiencyCurve
from meshplan.specs.model import MLA, MoE, TransformerModel
from meshplan.specs.plan import Plan
from meshplan.specs.scenario import Scenario, make_scenario
from meshplan.specs.task import Task

__all__ = [
    "BYTES_PER_ELEMENT",
    "Cluster",
    "Device",
    "Efficiency",
    "MLA",
    "MoE",
    "EfficiencyCurve",
    "NetworkLevel",
    "Plan",
    "Scenario",
    "Task",
    "TransformerModel",
    "make_scenario",
]
