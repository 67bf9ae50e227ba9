"""rlcluster-lab: where the models of an RL run live on accelerators, and what it costs.

Call ``ensure_simulated_devices()`` (or, in a notebook, ``setup()``) first on a
machine without accelerators, before anything else uses JAX.

The public names below are loaded on first use, so ``python -m rlcluster_lab``
can read its flags and refuse a bad combination before JAX is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "AvoidableCopyWarning": "rlcluster_lab.cluster",
    "ByteTokenizer": "rlcluster_lab.model.tokenizer",
    "ClusterConfig": "rlcluster_lab.core.config",
    "ConfigError": "rlcluster_lab.core.errors",
    "Decision": "rlcluster_lab.core.trace",
    "DeviceSetupError": "rlcluster_lab.core.devices",
    "GRPOLearner": "rlcluster_lab.app.learner",
    "LAYOUTS": "rlcluster_lab.core.options",
    "LabDevices": "rlcluster_lab.lab.setup",
    "LearnerConfig": "rlcluster_lab.app.learner",
    "LearnerResult": "rlcluster_lab.app.learner",
    "MODEL_SIZES": "rlcluster_lab.model",
    "PlacementLab": "rlcluster_lab.lab.widget",
    "MemoryReport": "rlcluster_lab.measure",
    "Mode": "rlcluster_lab.core.roles",
    "ModelConfig": "rlcluster_lab.model",
    "NotConstructedError": "rlcluster_lab.cluster",
    "PlacementError": "rlcluster_lab.core.shardings",
    "PlacementReport": "rlcluster_lab.app.report",
    "Plan": "rlcluster_lab.planner.plan",
    "PlannedMesh": "rlcluster_lab.planner.shapes",
    "RLCluster": "rlcluster_lab.cluster",
    "RLEngine": "rlcluster_lab.cluster",
    "Role": "rlcluster_lab.core.roles",
    "RolloutConfig": "rlcluster_lab.core.options",
    "RolloutEngine": "rlcluster_lab.engines",
    "RolloutOutput": "rlcluster_lab.engines",
    "Scenario": "rlcluster_lab.core.options",
    "ScoreModel": "rlcluster_lab.model.scoring",
    "SglangJaxStyleEngine": "rlcluster_lab.engines",
    "SyncReport": "rlcluster_lab.measure",
    "Trace": "rlcluster_lab.core.trace",
    "TrainBatch": "rlcluster_lab.training",
    "TrainingConfig": "rlcluster_lab.core.config",
    "TransformerLM": "rlcluster_lab.model",
    "ValueBatch": "rlcluster_lab.training",
    "VanillaEngine": "rlcluster_lab.engines",
    "VllmStyleEngine": "rlcluster_lab.engines",
    "build_cluster": "rlcluster_lab.app.scenario",
    "build_sharing_map": "rlcluster_lab.rules.sharing",
    "describe_mesh": "rlcluster_lab.core.meshes",
    "ensure_simulated_devices": "rlcluster_lab.core.devices",
    "init_model": "rlcluster_lab.model",
    "init_score_model": "rlcluster_lab.model.scoring",
    "is_lora": "rlcluster_lab.model",
    "layout_meshes": "rlcluster_lab.core.meshes",
    "make_mesh": "rlcluster_lab.core.meshes",
    "memory_report": "rlcluster_lab.measure",
    "mesh_from_ids": "rlcluster_lab.core.meshes",
    "place_model": "rlcluster_lab.placement",
    "placement_report": "rlcluster_lab.app.report",
    "plan_cluster": "rlcluster_lab.planner.plan",
    "plan_scenario": "rlcluster_lab.planner.plan",
    "reachable_layouts": "rlcluster_lab.core.meshes",
    "setup": "rlcluster_lab.lab.setup",
    "with_lora": "rlcluster_lab.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlcluster_lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
