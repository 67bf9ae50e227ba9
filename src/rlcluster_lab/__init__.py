"""rlcluster-lab: where the models of an RL run live on accelerators, and what it costs.

Call ``ensure_simulated_devices()`` (or, in a notebook, ``setup()``) first on a machine without
accelerators. The top level is the cluster's API; the planner, the lab and the multi-process
launcher have namespaces of their own (names that moved there, ``_MOVED``, still resolve here).
Names load on first use, so ``import rlcluster_lab`` imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

if TYPE_CHECKING:
    from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig, LearnerResult
    from rlcluster_lab.app.report import PlacementReport, placement_report
    from rlcluster_lab.app.scenario import build_cluster
    from rlcluster_lab.core.config import ClusterConfig, TrainingConfig
    from rlcluster_lab.core.devices import DeviceSetupError, ensure_simulated_devices
    from rlcluster_lab.core.errors import ConfigError
    from rlcluster_lab.core.meshes import describe_mesh, layout_meshes, make_mesh, reachable_layouts
    from rlcluster_lab.core.options import LAYOUTS, RolloutConfig, Scenario
    from rlcluster_lab.core.roles import Mode, Role
    from rlcluster_lab.core.shardings import PlacementError
    from rlcluster_lab.core.trace import Decision, Trace
    from rlcluster_lab.engines import (
        RolloutEngine,
        RolloutOutput,
        SglangJaxStyleEngine,
        VanillaEngine,
        VllmStyleEngine,
    )
    from rlcluster_lab.lab.notebook.setup import setup
    from rlcluster_lab.measure import MemoryReport, SyncReport, memory_report
    from rlcluster_lab.model import MODEL_SIZES, ModelConfig, TransformerLM, init_model, is_lora, with_lora
    from rlcluster_lab.model.scoring import ScoreModel, init_score_model
    from rlcluster_lab.model.tokenizer import ByteTokenizer
    from rlcluster_lab.placement import place_model
    from rlcluster_lab.rl_cluster import AvoidableCopyWarning, NotConstructedError, RLCluster, RLEngine
    from rlcluster_lab.rules.sharing import build_sharing_map
    from rlcluster_lab.training import TrainBatch, ValueBatch

__all__ = [
    # the cluster (P15: two names, one class)
    "RLCluster",
    "RLEngine",
    "build_cluster",
    "Scenario",
    "LAYOUTS",
    "ClusterConfig",
    "TrainingConfig",
    "RolloutConfig",
    "Role",
    "Mode",
    "TrainBatch",
    "ValueBatch",
    # devices and meshes
    "ensure_simulated_devices",
    "setup",
    "make_mesh",
    "layout_meshes",
    "reachable_layouts",
    "describe_mesh",
    "place_model",
    "build_sharing_map",
    # rollout engines
    "RolloutEngine",
    "RolloutOutput",
    "VanillaEngine",
    "VllmStyleEngine",
    "SglangJaxStyleEngine",
    # models
    "MODEL_SIZES",
    "ModelConfig",
    "TransformerLM",
    "init_model",
    "with_lora",
    "is_lora",
    "ScoreModel",
    "init_score_model",
    "ByteTokenizer",
    # reports: the decision trace (L1), memory (L2), the sync (L3)
    "placement_report",
    "PlacementReport",
    "Decision",
    "Trace",
    "memory_report",
    "MemoryReport",
    "SyncReport",
    # the toy learner
    "GRPOLearner",
    "LearnerConfig",
    "LearnerResult",
    # errors
    "ConfigError",
    "DeviceSetupError",
    "PlacementError",
    "AvoidableCopyWarning",
    "NotConstructedError",
]

# Names that moved to their own namespace, still served here for older code.
_MOVED = {
    "PlacementLab": "rlcluster_lab.lab",
    "LabDevices": "rlcluster_lab.lab",
    "Plan": "rlcluster_lab.planner",
    "PlannedMesh": "rlcluster_lab.planner",
    "plan_cluster": "rlcluster_lab.planner",
    "plan_scenario": "rlcluster_lab.planner",
    "mesh_from_ids": "rlcluster_lab.core.meshes",
}

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__, moved=_MOVED)
