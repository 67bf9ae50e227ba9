"""P1 and P2: the backbone sharing map, which roles may hold one set of weights: a pure function of
the meshes and a few facts about the models, so the live cluster and the planner decide alike.
Meshes are compared with ``==``: JAX interns ``Mesh`` objects, so only the same devices in the
same shape with the same axis names and types are the same mesh."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from rlcluster_lab.core.meshes import describe_mesh
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.trace import Decision
from rlcluster_lab.rules.registry import Locator, rule

SharingMap = dict[Role, tuple[Role, ...]]


class LinkBranch(str, enum.Enum):
    LINKED = "linked"
    NOT_LINKED = "not linked"
    SKIPPED = "skipped"
    PROPAGATED = "propagated"


P1 = rule(
    "P1",
    "actor/rollout link",
    question="actor mesh == rollout mesh?",
    answers={LinkBranch.LINKED: "linked", LinkBranch.NOT_LINKED: "not linked"},
    tests=("tests/test_sharing.py::test_p1_*", "tests/test_cluster_matrix.py"),
    reference=(
        Locator(
            "RLCluster._init_backbone_sharing_map",
            "If",
            uses=("r2m", "ACTOR", "ROLLOUT", "=="),
            what="the link: an `if` comparing the actor's and the rollout's meshes with `==`",
        ),
    ),
)


@dataclasses.dataclass(frozen=True)
class P1Values:  # the two meshes (described), the same devices or not (``same_devices``), and ``==``
    actor_mesh: Mapping[str, Any]
    rollout_mesh: Mapping[str, Any]
    same_devices: bool
    equal: bool


def same_devices(a: Any, b: Any) -> bool:
    """Whether two meshes (or ``core.meshes.describe_mesh`` descriptions) span the same devices, in any
    shape, order or axis names: the one test every view reads, a set of device ids (the same eight
    chips as (2, 4) and as (8, 1) are the same devices and two meshes)."""
    return _device_set(a) == _device_set(b)


def _device_set(mesh: Any) -> frozenset[int]:
    described = mesh if isinstance(mesh, Mapping) else describe_mesh(mesh)
    return frozenset(int(d) for d in described.get("device_ids", []))


@P1.function
def p1_link_actor_rollout(actor_mesh: Any, rollout_mesh: Any) -> Decision[P1Values]:
    """P1: ACTOR and ROLLOUT are linked both ways exactly when their meshes are equal.

    Equal means ``==`` on meshes, which JAX interns: the same devices in the same shape with the same
    axis names and axis types. The same eight chips as (2, 4) and as (8, 1) are two meshes, so the
    rollout gets a full second copy.
    """
    same = actor_mesh == rollout_mesh
    return Decision(
        "P1",
        "role_to_mesh[ACTOR] == role_to_mesh[ROLLOUT]",
        P1Values(describe_mesh(actor_mesh), describe_mesh(rollout_mesh), same_devices(actor_mesh, rollout_mesh), same),
        "actor and rollout linked both ways" if same else "not linked: the rollout gets its own weights",
        LinkBranch.LINKED if same else LinkBranch.NOT_LINKED,
    )


P2 = rule(
    "P2",
    "LoRA reference link and propagation",
    question="LoRA actor, reference on its mesh?",
    answers={LinkBranch.LINKED: "linked", LinkBranch.NOT_LINKED: "not linked", LinkBranch.SKIPPED: "skipped"},
    tests=("tests/test_sharing.py::test_p2_*", "tests/test_cluster_matrix.py"),
    reference=(
        Locator(
            "RLCluster._init_backbone_sharing_map",
            "If",
            uses=("isinstance", "Module"),
            what="skipped when the actor or the reference is not a module",
        ),
        Locator(
            "RLCluster._init_backbone_sharing_map",
            "If",
            uses=("is_lora_enabled",),
            what="a LoRA actor linked to a reference on its mesh",
        ),
        Locator("RLCluster._propagate_backbone_sharing_map", what="propagation"),
    ),
)


@dataclasses.dataclass(frozen=True)
class P2SkipValues:  # a model given as a path, not a module: P2 skipped
    actor_is_module: bool
    reference_is_module: bool


@dataclasses.dataclass(frozen=True)
class P2LinkValues:  # a LoRA actor, a reference, its mesh against the actor's
    actor_has_lora: bool
    has_reference: bool
    reference_mesh: Mapping[str, Any] | None
    meshes_equal: bool


@dataclasses.dataclass(frozen=True)
class P2PropagationValues:  # the roles linked to the actor, by name
    linked_to_actor: Sequence[str]


@P2.function
def p2_link_reference(
    *,
    actor_is_module: bool,
    reference_is_module: bool,
    actor_has_lora: bool,
    has_reference: bool,
    actor_mesh: Any,
    reference_mesh: Any,
) -> Decision[P2SkipValues] | Decision[P2LinkValues]:
    """P2: a LoRA actor and its reference are linked when they share a mesh.

    Only when the actor is an in-memory module with LoRA parameters, a reference is given, and the
    reference mesh equals the actor mesh: the frozen base can then serve as the reference, adapters
    filtered out. If either model is given as a path instead of a module, the rule is skipped.
    """
    if not actor_is_module or (has_reference and not reference_is_module):
        return Decision(
            "P2",
            "actor and reference are in-memory modules",
            P2SkipValues(actor_is_module, reference_is_module),
            "skipped: a model was given as a path",
            LinkBranch.SKIPPED,
        )
    same_ref = bool(has_reference and reference_mesh == actor_mesh)
    link = actor_has_lora and same_ref
    return Decision(
        "P2",
        "actor has LoRA and a reference is given and role_to_mesh[REFERENCE] == role_to_mesh[ACTOR]",
        P2LinkValues(actor_has_lora, has_reference, describe_mesh(reference_mesh) if has_reference else None, same_ref),
        "actor and reference linked both ways" if link else "reference not linked",
        LinkBranch.LINKED if link else LinkBranch.NOT_LINKED,
    )


@P2.function
def p2_propagate(links: Mapping[Role, list[Role]]) -> tuple[dict[Role, list[Role]], Decision[P2PropagationValues]]:
    """P2 (propagation): every pair of roles linked to ACTOR is linked to each other."""
    out = {role: list(others) for role, others in links.items()}
    added = []
    for role in list(out[Role.ACTOR]):
        for other in out[Role.ACTOR]:
            if other != role and other not in out[role]:
                out[role].append(other)
                added.append((role, other))
    return out, Decision(
        "P2",
        "propagate: roles linked to ACTOR are linked to each other",
        P2PropagationValues(tuple(r.value for r in out[Role.ACTOR])),
        f"added {len(added)} link(s)" + (": " + ", ".join(f"{a.value}->{b.value}" for a, b in added) if added else ""),
        LinkBranch.PROPAGATED,
    )


def sharing_map(
    role_to_mesh: Mapping[Role, Any],
    *,
    actor_is_module: bool,
    actor_has_lora: bool,
    has_reference: bool,
    reference_is_module: bool,
) -> tuple[SharingMap, list[Decision[Any]]]:
    """P1, then P2 and its propagation: role -> roles it may share weights with, in link order."""
    links: dict[Role, list[Role]] = {role: [] for role in Role}
    p1 = p1_link_actor_rollout(role_to_mesh[Role.ACTOR], role_to_mesh[Role.ROLLOUT])
    if p1.branch is LinkBranch.LINKED:
        # Both are loaded from the same actor model, so one mesh means one copy.
        links[Role.ACTOR].append(Role.ROLLOUT)
        links[Role.ROLLOUT].append(Role.ACTOR)
    p2 = p2_link_reference(
        actor_is_module=actor_is_module,
        reference_is_module=reference_is_module,
        actor_has_lora=actor_has_lora,
        has_reference=has_reference,
        actor_mesh=role_to_mesh[Role.ACTOR],
        reference_mesh=role_to_mesh.get(Role.REFERENCE),
    )
    decisions: list[Decision[Any]] = [p1, p2]
    if p2.branch is LinkBranch.SKIPPED:
        return _freeze(links), decisions
    if p2.branch is LinkBranch.LINKED:
        links[Role.ACTOR].append(Role.REFERENCE)
        links[Role.REFERENCE].append(Role.ACTOR)
    links, propagated = p2_propagate(links)
    decisions.append(propagated)
    return _freeze(links), decisions


def shares(sharing: SharingMap, a: Role, b: Role) -> bool:
    """Whether the map links ``a`` to ``b``."""
    return b in sharing.get(a, ())


def sharing_map_json(sharing: SharingMap) -> dict[str, list[str]]:
    """Role name -> sorted list of role names, every role present."""
    return {role.value: sorted(r.value for r in sharing.get(role, ())) for role in Role}


def _freeze(links: Mapping[Role, list[Role]]) -> SharingMap:
    return {role: tuple(others) for role, others in links.items()}


def build_sharing_map(
    role_to_mesh: Mapping[Role, Any],
    *,
    actor_is_module: bool,
    actor_has_lora: bool,
    has_reference: bool,
    reference_is_module: bool,
    trace: Any = None,
) -> SharingMap:
    """The sharing map (P1, P2), its decisions added to ``trace`` when one is given."""
    result, decisions = sharing_map(
        role_to_mesh,
        actor_is_module=actor_is_module,
        actor_has_lora=actor_has_lora,
        has_reference=has_reference,
        reference_is_module=reference_is_module,
    )
    if trace is not None:
        for d in decisions:
            trace.add(d)
    return result
