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
    "ByteTokenizer": "rlcluster_lab.tokenizer",
    "ClusterConfig": "rlcluster_lab.config",
    "ConfigError": "rlcluster_lab.config",
    "Decision": "rlcluster_lab.trace",
    "DeviceSetupError": "rlcluster_lab.devices",
    "GRPOLearner": "rlcluster_lab.learner",
    "LAYOUTS": "rlcluster_lab.meshes",
    "LabDevices": "rlcluster_lab.notebook",
    "LearnerConfig": "rlcluster_lab.learner",
    "LearnerResult": "rlcluster_lab.learner",
    "MODEL_SIZES": "rlcluster_lab.model",
    "MemoryReport": "rlcluster_lab.measure",
    "Mode": "rlcluster_lab.roles",
    "ModelConfig": "rlcluster_lab.model",
    "NotConstructedError": "rlcluster_lab.cluster",
    "PlacementError": "rlcluster_lab.placement",
    "PlacementReport": "rlcluster_lab.report",
    "Plan": "rlcluster_lab.plan",
    "PlannedMesh": "rlcluster_lab.plan_shapes",
    "RLCluster": "rlcluster_lab.cluster",
    "RLEngine": "rlcluster_lab.cluster",
    "Role": "rlcluster_lab.roles",
    "RolloutConfig": "rlcluster_lab.config",
    "RolloutEngine": "rlcluster_lab.engines",
    "RolloutOutput": "rlcluster_lab.engines",
    "Scenario": "rlcluster_lab.options",
    "ScoreModel": "rlcluster_lab.scoring",
    "SglangJaxStyleEngine": "rlcluster_lab.engines",
    "SyncReport": "rlcluster_lab.measure",
    "Trace": "rlcluster_lab.trace",
    "TrainBatch": "rlcluster_lab.training",
    "TrainingConfig": "rlcluster_lab.config",
    "TransformerLM": "rlcluster_lab.model",
    "VanillaEngine": "rlcluster_lab.engines",
    "VllmStyleEngine": "rlcluster_lab.engines",
    "build_cluster": "rlcluster_lab.scenario",
    "build_sharing_map": "rlcluster_lab.sharing",
    "describe_mesh": "rlcluster_lab.meshes",
    "ensure_simulated_devices": "rlcluster_lab.devices",
    "init_model": "rlcluster_lab.model",
    "init_score_model": "rlcluster_lab.scoring",
    "is_lora": "rlcluster_lab.model",
    "layout_meshes": "rlcluster_lab.meshes",
    "make_mesh": "rlcluster_lab.meshes",
    "memory_report": "rlcluster_lab.measure",
    "mesh_from_ids": "rlcluster_lab.meshes",
    "place_model": "rlcluster_lab.placement",
    "placement_report": "rlcluster_lab.report",
    "plan_cluster": "rlcluster_lab.plan",
    "plan_scenario": "rlcluster_lab.plan",
    "reachable_layouts": "rlcluster_lab.meshes",
    "setup": "rlcluster_lab.notebook",
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
