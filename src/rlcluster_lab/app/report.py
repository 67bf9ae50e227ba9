"""The placement report: what the cluster decided and what it costs, as one frozen, JSON-ready
object that the CLI, figures and widgets read (none recomputes a decision)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from flax import nnx

from rlcluster_lab.core.gathering import held_within
from rlcluster_lab.core.meshes import describe_meshes
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import memory_kinds
from rlcluster_lab.measure import MemoryReport, SyncReport, memory_report
from rlcluster_lab.placement.buffers import buffer_keys, sharing_backbone, state_bytes
from rlcluster_lab.rl_cluster import RLCluster
from rlcluster_lab.rules.sharing import sharing_map_json


@dataclasses.dataclass(frozen=True)
class PlacementFacts:
    """Where a cluster placed its roles and what that holds: the fields every figure reads,
    whoever built the cluster (the lab's own, or Tunix's read by ``rlcluster_lab.tunix``)."""

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
    device_count: int  # the devices the cluster's meshes use (not every device of the platform)
    memory: MemoryReport

    def to_json(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}
        return fields | {"memory": self.memory.to_json()}


@dataclasses.dataclass(frozen=True)
class PlacementReport(PlacementFacts):
    """The lab's cluster: its placement, plus the report of the sync the caller ran, if any."""

    sync: SyncReport | None = None

    def to_json(self) -> dict[str, Any]:
        return super().to_json() | {"sync": self.sync.to_json() if self.sync is not None else None}


def devices_text(report: Mapping[str, Any]) -> str:
    """The devices a placement report's cluster is built on, in words: its memory report's ``where``,
    else its device count and platform ("8 cpu device(s)")."""
    where = (report.get("memory") or {}).get("where")
    return str(where) if where else f"{report.get('device_count', '?')} {report.get('platform', '?')} device(s)"


def anchor_facts(mode: str, pinned: Any) -> dict[str, Any]:
    """The anchor (P8): its mode, the memory kind(s) of the pinned snapshot, and the bytes the
    snapshot itself pins (adapters only with mode 'trainable' and LoRA)."""
    kinds = memory_kinds(pinned) if pinned is not None else []
    size = state_bytes(pinned) if pinned is not None else 0
    return {"mode": mode, "memory_kind": kinds[0] if len(kinds) == 1 else kinds, "bytes": size}


def placement_report(cluster: RLCluster, sync: SyncReport | None = None) -> PlacementReport:
    """Read the decisions and the live buffers (L2) of a constructed cluster, with the ``SyncReport``
    of a sync the caller ran, if any (L3).

    Raises:
        TypeError: ``cluster`` is not the lab's ``RLCluster`` (for Tunix's: ``tunix.inspect``), or
            ``sync`` is not a ``SyncReport``.
    """
    if not isinstance(cluster, RLCluster):
        raise TypeError(
            f"cluster must be the lab's RLCluster (build_cluster(...)), got {type(cluster).__name__}; for "
            "Tunix's RLCluster use rlcluster_lab.tunix.inspect"
        )
    if sync is not None and not isinstance(sync, SyncReport):
        raise TypeError(f"sync must be the SyncReport that cluster.sync_weights() returned, or None; got {sync!r:.40}")
    actor = cluster.actor_model
    actor_keys, rollout_keys = (buffer_keys(nnx.state(m)) for m in (actor, cluster.rollout.model()))
    reference = cluster.reference_model
    present = {Role.ACTOR, Role.ROLLOUT} | set(cluster.models())
    return PlacementReport(
        sharing_map=sharing_map_json(cluster.sharing_map),
        rollout_branch=str(cluster.rollout_branch),
        # Every buffer the engine samples with is one of the actor's own.
        rollout_shares_actor_weights=held_within(rollout_keys, actor_keys, "rollout buffers shared"),
        reference_shares_backbone=reference is not None and sharing_backbone(reference, actor),
        role_to_mesh=describe_meshes({r: m for r, m in cluster.role_to_mesh.items() if r in present}),
        config_role_to_mesh=describe_meshes({r: m for r, m in cluster.config_role_to_mesh.items() if r in present}),
        mesh_overridden_by_engine=cluster.mesh_overridden_by_engine,
        engine=cluster.cluster_config.engine_name(),
        offload_to_cpu=cluster.cluster_config.offload_to_cpu,
        lora=cluster.trainable_is_lora,
        anchor=anchor_facts(cluster.cluster_config.anchor, cluster.pinned_anchor_state),
        decisions=cluster.trace.to_json(),
        warnings=list(cluster.warnings),
        # The cluster's own platform (its meshes' devices), not JAX's default backend.
        platform=cluster.platform,
        device_count=len(cluster.devices()),
        memory=memory_report(cluster),
        sync=sync,
    )
