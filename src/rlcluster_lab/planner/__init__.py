"""What-if planning (L4): the cluster's own construction executed on arrays on paper (shapes,
dtypes, shardings; nothing allocated), for our sizes and published architectures on real
topologies, with memory per role, device and host through a step's phases (parameters,
gradients, optimizer state, activations, the KV cache, host RAM, the sync's peak), whether
it fits and why not, and what a sync moves within and across hosts.

``plan_cluster("llama3-8b", "gpu-8")`` plans a published model on a topology,
``plan_scenario(Scenario(...))`` the lab's own knobs; both return a ``Plan``. The names
are imported on first use: the CLI reads ``planner.workload`` before JAX starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

if TYPE_CHECKING:
    from rlcluster_lab.placement.layout import PlannedMesh
    from rlcluster_lab.planner.plan import Plan, plan_cluster, plan_scenario
    from rlcluster_lab.planner.workload import Workload

__all__ = ["Plan", "PlannedMesh", "Workload", "plan_cluster", "plan_scenario"]

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
