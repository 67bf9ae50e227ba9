"""``inspect``: the lab's report of a Tunix ``RLCluster``, read from the object's state: the
placement report's fields (the lab's figures draw it), every decision an observation
(``observe``), memory from the lab's buffer walk (L2), and ``sync()`` (L3).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx

from rlcluster_lab.app.report import PlacementFacts, anchor_facts
from rlcluster_lab.core.meshes import describe_meshes
from rlcluster_lab.core.roles import Role
from rlcluster_lab.measure.memory import memory_of
from rlcluster_lab.model import is_lora
from rlcluster_lab.placement.buffers import buffer_keys, sharing_backbone
from rlcluster_lab.rl_cluster import RLCluster
from rlcluster_lab.rules.sharing import sharing_map_json
from rlcluster_lab.tunix.build import Given, TunixBuild
from rlcluster_lab.tunix.extra import installed_version, require, version_note
from rlcluster_lab.tunix.observe import (
    OBSERVED,
    P4_WARNING_MARK,
    anchor_state,
    engine_name,
    observed_decisions,
    role_meshes,
    sharing_map,
    tunix_entries,
    tunix_models,
)
from rlcluster_lab.tunix.sync import TunixSync, run_sync


@dataclasses.dataclass(frozen=True)
class TunixReport(PlacementFacts):
    """The lab's report of a Tunix cluster: the placement report's fields, observed
    (``config_role_to_mesh``: the meshes as asked where known); ``notes`` say what could not be read."""

    tunix_version: str | None
    notes: tuple[str, ...]
    source: str = OBSERVED
    cluster: Any = dataclasses.field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        # "sync": the placement report's key; a sync's own report comes from sync().
        return super().to_json() | {"sync": None, "notes": list(self.notes)}

    def sync(self) -> TunixSync:
        """Run the cluster's ``sync_weights`` under the lab's observer and P13 guard (``inspect`` again after)."""
        if self.cluster is None:
            raise ValueError("this report holds no cluster to sync; build it with rlcluster_lab.tunix.inspect(cluster)")
        return run_sync(self.cluster, self.platform)


def inspect(rl_cluster: Any, given: Given | None = None) -> TunixReport:
    """The lab's report of a constructed Tunix ``RLCluster``.

    Args:
        rl_cluster: a Tunix ``RLCluster`` (0.1.7), or the ``TunixBuild`` ``build_tunix_cluster``
            returns (its ``given`` is then used).
        given: what the cluster was handed, when known: the report then also shows P5, the mesh
            the engine replaced (P7) and the P4 warning Tunix logged.

    Raises:
        TypeError: ``rl_cluster`` is not Tunix's ``RLCluster``, or ``given`` is not a ``Given``.
        TunixMissingError: Tunix is not installed.
    """
    if isinstance(rl_cluster, TunixBuild):
        rl_cluster, given = rl_cluster.cluster, given or rl_cluster.given
    if not isinstance(rl_cluster, require("inspect").rl_cluster.RLCluster):
        lab = (
            " (the lab's own: read it with rlcluster_lab.placement_report)" if isinstance(rl_cluster, RLCluster) else ""
        )
        raise TypeError(
            f"rl_cluster must be Tunix's RLCluster (tunix.rl.rl_cluster.RLCluster) or the TunixBuild that "
            f"build_tunix_cluster returns, got {type(rl_cluster).__name__}{lab}"
        )
    if given is not None and not isinstance(given, Given):
        raise TypeError(f"given must be the Given of a TunixBuild, or None; got {type(given).__name__}")
    models = tunix_models(rl_cluster)
    present = {Role(name) for name in models}
    meshes = role_meshes(rl_cluster, present)
    devices = sorted({d for m in meshes.values() for d in m.devices.flat}, key=lambda d: d.id)
    actor = models["actor"]
    reference = models.get("reference")
    decisions = observed_decisions(rl_cluster, given)
    rollout_keys = buffer_keys(nnx.state(models["rollout"]))
    own_mesh = getattr(rl_cluster.rollout, "mesh", None)  # the mesh the engine exposes (P7)
    replaced = own_mesh is not None and meshes.get(Role.ROLLOUT) is own_mesh
    notes = [version_note()]
    if given is None:
        notes.append(
            "built elsewhere: P5 (kept or resharded), the rollout mesh as asked (P7) and Tunix's logged "
            "warnings are not readable from the object alone"
        )
        asked = {r: m for r, m in meshes.items() if not (r is Role.ROLLOUT and replaced)}
        warnings: list[str] = []
    else:
        asked = {r: m for r, m in given.role_to_mesh.items() if r in present}
        warnings = [
            "P4: Tunix logged its avoidable-copy warning (reference and actor hold two copies of the backbone)"
            for m in given.logged
            if P4_WARNING_MARK in m
        ]
    p8 = next((d for d in decisions if d["rule"] == "P8"), None)
    if p8 is None:
        notes.append("this Tunix version keeps no anchor policy state (P8)")
    return TunixReport(
        sharing_map=sharing_map_json(sharing_map(rl_cluster)),
        rollout_branch=next(d["branch"] for d in decisions if d["rule"] == "P3"),
        rollout_shares_actor_weights=bool(rollout_keys) and rollout_keys <= buffer_keys(nnx.state(actor)),
        reference_shares_backbone=reference is not None and sharing_backbone(reference, actor),
        role_to_mesh=describe_meshes(meshes),
        config_role_to_mesh=describe_meshes(asked),
        # The lab's meaning (P7): the engine brought a mesh other than the one asked (unknown without given).
        mesh_overridden_by_engine=replaced and (given is None or own_mesh != given.role_to_mesh.get(Role.ROLLOUT)),
        engine=engine_name(rl_cluster),
        offload_to_cpu=bool(rl_cluster.cluster_config.offload_to_cpu),
        lora=is_lora(actor),
        anchor=anchor_facts(p8["branch"], anchor_state(rl_cluster)) if p8 is not None else {},
        decisions=decisions,
        warnings=warnings,
        platform=devices[0].platform,
        device_count=len(devices),
        memory=memory_of(tunix_entries(rl_cluster), devices=devices),
        tunix_version=installed_version(),
        notes=tuple(notes),
        cluster=rl_cluster,
    )
