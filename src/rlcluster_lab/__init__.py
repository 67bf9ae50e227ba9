"""rlcluster-lab: where the models of an RL run live on accelerators, and what it costs.

Call ``ensure_simulated_devices()`` first on a machine without accelerators,
before anything else uses JAX.
"""
from rlcluster_lab.cluster import AvoidableCopyWarning, NotConstructedError, RLCluster, RLEngine
from rlcluster_lab.config import ClusterConfig, ConfigError, RolloutConfig, TrainingConfig
from rlcluster_lab.devices import DeviceSetupError, ensure_simulated_devices
from rlcluster_lab.engines import RolloutEngine, RolloutOutput, SglangJaxStyleEngine, VanillaEngine, VllmStyleEngine
from rlcluster_lab.learner import GRPOLearner, LearnerConfig, LearnerResult
from rlcluster_lab.measure import MemoryReport, SyncReport, memory_report
from rlcluster_lab.meshes import LAYOUTS, describe_mesh, layout_meshes, make_mesh, mesh_from_ids, reachable_layouts
from rlcluster_lab.notebook import LabDevices, setup
from rlcluster_lab.model import MODEL_SIZES, ModelConfig, TransformerLM, init_model, is_lora, with_lora
from rlcluster_lab.placement import PlacementError, place_model
from rlcluster_lab.plan import Plan, plan_cluster, plan_scenario
from rlcluster_lab.plan_shapes import PlannedMesh
from rlcluster_lab.report import PlacementReport, placement_report
from rlcluster_lab.roles import Mode, Role
from rlcluster_lab.scenario import Scenario, build_cluster
from rlcluster_lab.scoring import ScoreModel, init_score_model
from rlcluster_lab.sharing import build_sharing_map
from rlcluster_lab.tokenizer import ByteTokenizer
from rlcluster_lab.trace import Decision, Trace
from rlcluster_lab.training import TrainBatch

__all__ = [
    "AvoidableCopyWarning", "ByteTokenizer", "ClusterConfig", "ConfigError", "Decision",
    "DeviceSetupError", "GRPOLearner", "MemoryReport", "SyncReport", "memory_report", "LAYOUTS", "LearnerConfig", "LearnerResult", "MODEL_SIZES",
    "Mode", "ModelConfig", "NotConstructedError", "PlacementError", "PlacementReport", "RLCluster",
    "RLEngine", "Role", "RolloutConfig", "RolloutEngine", "RolloutOutput", "Scenario", "ScoreModel",
    "SglangJaxStyleEngine", "Trace", "TrainBatch", "TrainingConfig", "TransformerLM", "VanillaEngine",
    "VllmStyleEngine", "build_cluster", "build_sharing_map", "describe_mesh", "ensure_simulated_devices",
    "init_model", "init_score_model", "is_lora", "layout_meshes", "make_mesh", "mesh_from_ids",
    "place_model", "placement_report", "reachable_layouts", "with_lora", "LabDevices", "setup",
    "Plan", "PlannedMesh", "plan_cluster", "plan_scenario",
]
