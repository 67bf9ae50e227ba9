"""The placement report: what the cluster decided, as one frozen, JSON-ready object.

CLI, figures and widgets read this report; none of them recomputes a decision.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from rlcluster_lab.cluster import RLCluster, buffer_keys, sharing_backbone, state_bytes
from rlcluster_lab.meshes import describe_meshes
from rlcluster_lab.placement import memory_kinds
from rlcluster_lab.roles import Role
from rlcluster_lab.sharing import sharing_map_json


@dataclasses.dataclass(frozen=True)
class PlacementReport:
    sharing_map: dict[str, list[str]]
    rollout_branch: str
    rollout_shares_actor_weights: bool
    reference_shares_backbone: bool
    role_to_mesh: dict[str, dict[str, Any]]
    config_role_to_mesh: dict[str, dict[str, Any]]
    mesh_overridden_by_engine: bool
    engine: str
    offload_to_cpu: bool
    lora: bool
    anchor: dict[str, Any]
    decisions: list[dict[str, Any]]
    warnings: list[str]
    platform: str
    device_count: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def placement_report(cluster: RLCluster) -> PlacementReport:
    """Read the decisions and the live buffers of a constructed cluster."""
    actor = cluster.actor_model
    rollout_model = cluster.rollout.model()
    actor_keys = buffer_keys(nnx.state(actor))
    rollout_keys = buffer_keys(nnx.state(rollout_model))
    reference = cluster.reference_model
    anchor = cluster.anchor_policy_state
    kinds = memory_kinds(anchor) if anchor is not None else []
    present = {Role.ACTOR, Role.ROLLOUT} | set(cluster.models())
    return PlacementReport(
        sharing_map=sharing_map_json(cluster.sharing_map),
        rollout_branch=str(cluster.rollout_branch),
        # Every buffer the engine samples with is one of the actor's own.
        rollout_shares_actor_weights=bool(rollout_keys) and rollout_keys <= actor_keys,
        reference_shares_backbone=reference is not None and sharing_backbone(reference, actor),
        role_to_mesh=describe_meshes({r: m for r, m in cluster.role_to_mesh.items() if r in present}),
        config_role_to_mesh=describe_meshes({r: m for r, m in cluster.config_role_to_mesh.items() if r in present}),
        mesh_overridden_by_engine=cluster.mesh_overridden_by_engine,
        engine=cluster.cluster_config.engine_name(),
        offload_to_cpu=cluster.cluster_config.offload_to_cpu,
        lora=cluster.trainable_is_lora,
        anchor={
            "memory_kind": kinds[0] if len(kinds) == 1 else kinds,
            "bytes": state_bytes(anchor) if anchor is not None else 0,
        },
        decisions=cluster.trace.to_json(),
        warnings=list(cluster.warnings),
        platform=jax.default_backend(),
        device_count=jax.device_count(),
    )
