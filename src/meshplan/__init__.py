"""meshplan: predict and plan how large ML models run on accelerator clusters."""

from meshplan.api import estimate, search, with_compute_units
from meshplan.errors import MeshplanError
from meshplan.specs import Cluster, Device, Plan, Task, TransformerModel
from meshplan.timeline.estimate import Estimate

__version__ = "0.1.0"
__all__ = ["Cluster", "Device", "Estimate", "MeshplanError", "Plan", "Task", "TransformerModel", "estimate", "search", "with_compute_units"]
