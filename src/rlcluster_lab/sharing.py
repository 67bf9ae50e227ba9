"""The backbone sharing map (P1, P2): which roles may hold one set of weights.

A pure function of the meshes and of two facts about the models, so the same
code serves a live cluster and a what-if plan. Meshes are compared with ``==``:
JAX interns ``Mesh`` objects, so two meshes over the same devices in the same
shape with the same axis names are the same object, and anything else (the
same chips in another shape, or other axis names) is a different mesh.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcluster_lab.meshes import describe_mesh
from rlcluster_lab.roles import Role
from rlcluster_lab.trace import Trace

SharingMap = dict[Role, tuple[Role, ...]]


def build_sharing_map(
    role_to_mesh: Mapping[Role, Any],
    *,
    actor_is_module: bool,
    actor_has_lora: bool,
    has_reference: bool,
    reference_is_module: bool,
    trace: Trace | None = None,
) -> SharingMap:
    """Role -> roles it may share weights with, in the order links were made."""
    trace = trace if trace is not None else Trace()
    links: dict[Role, list[Role]] = {role: [] for role in Role}

    actor_mesh = role_to_mesh[Role.ACTOR]
    rollout_mesh = role_to_mesh[Role.ROLLOUT]
    same = actor_mesh == rollout_mesh
    if same:
        # P1: both are loaded from the same actor model, so one mesh means one copy.
        links[Role.ACTOR].append(Role.ROLLOUT)
        links[Role.ROLLOUT].append(Role.ACTOR)
    trace.record(
        "P1",
        "role_to_mesh[ACTOR] == role_to_mesh[ROLLOUT]",
        {
            "actor_mesh": describe_mesh(actor_mesh),
            "rollout_mesh": describe_mesh(rollout_mesh),
            "same_devices": _device_ids(actor_mesh) == _device_ids(rollout_mesh),
            "equal": same,
        },
        "actor and rollout linked both ways" if same else "not linked: the rollout gets its own weights",
    )

    if not actor_is_module or (has_reference and not reference_is_module):
        # P2 needs live modules to inspect; a model given as a path skips it.
        trace.record(
            "P2",
            "actor and reference are in-memory modules",
            {"actor_is_module": actor_is_module, "reference_is_module": reference_is_module},
            "skipped: a model was given as a path",
        )
        return _freeze(links)

    ref_mesh = role_to_mesh.get(Role.REFERENCE)
    same_ref = has_reference and ref_mesh == actor_mesh
    link_ref = actor_has_lora and same_ref
    if link_ref:
        # P2: with LoRA the frozen base can serve as the reference; adapters are filtered out.
        links[Role.ACTOR].append(Role.REFERENCE)
        links[Role.REFERENCE].append(Role.ACTOR)
    trace.record(
        "P2",
        "actor has LoRA and a reference is given and role_to_mesh[REFERENCE] == role_to_mesh[ACTOR]",
        {
            "actor_has_lora": actor_has_lora,
            "has_reference": has_reference,
            "reference_mesh": describe_mesh(ref_mesh) if has_reference else None,
            "meshes_equal": bool(same_ref),
        },
        "actor and reference linked both ways" if link_ref else "reference not linked",
    )

    # Propagation: every pair of roles linked to the actor is linked to each other.
    added = []
    for role in list(links[Role.ACTOR]):
        for other in links[Role.ACTOR]:
            if other != role and other not in links[role]:
                links[role].append(other)
                added.append((role, other))
    trace.record(
        "P2",
        "propagate: roles linked to ACTOR are linked to each other",
        {"linked_to_actor": list(links[Role.ACTOR])},
        f"added {len(added)} link(s)"
        + (": " + ", ".join(f"{a.value}->{b.value}" for a, b in added) if added else ""),
    )
    return _freeze(links)


def rollout_branch(linked: bool, engine_kind: str) -> str:
    """P3: ``shared`` (one object), ``second_copy`` (vanilla engine, unlinked) or
    ``engine_initial_value`` (any other engine takes the actor as its initial weights).

    Pure, so the cluster and the what-if planner take the same branch.
    """
    if linked:
        return "shared"
    if engine_kind == "vanilla":
        return "second_copy"
    return "engine_initial_value"


def shares(sharing_map: SharingMap, a: Role, b: Role) -> bool:
    return b in sharing_map.get(a, ())


def sharing_map_json(sharing_map: SharingMap) -> dict[str, list[str]]:
    """Role name -> sorted list of role names, every role present."""
    return {role.value: sorted(r.value for r in sharing_map.get(role, ())) for role in Role}


def _freeze(links: dict[Role, list[Role]]) -> SharingMap:
    return {role: tuple(others) for role, others in links.items()}


def _device_ids(mesh: Any) -> list[int]:
    return describe_mesh(mesh)["device_ids"]
