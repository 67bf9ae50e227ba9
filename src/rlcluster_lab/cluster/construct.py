"""Construction: the one sequence of decisions and placements, for a live cluster and for a plan.

``construct`` follows the reference's order: the sharing map (P1, P2); the actor, the rollout
model (P3), the reference (P4), the critic and the reward model, each loaded onto its mesh (P5,
P14); the engine, which may replace the rollout mesh (P7); the optimizers (P12); the anchor (P8).
An ``Executor`` moves the models: the live one (``cluster.live``) real arrays, the planner's
(``planner.executor``) arrays on paper, so a plan is the cluster's own construction on shapes.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from rlcluster_lab.core.meshes import describe_mesh
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.rules import loading, reference, rollout, sharing, steps
from rlcluster_lab.rules.anchor import anchor_is_partial, p8_anchor
from rlcluster_lab.rules.rollout import MeshBranch, RolloutBranch


@dataclasses.dataclass(frozen=True)
class LoadFacts:
    """What P5 reads of a model before loading it onto a mesh."""

    model_meshes: list[dict[str, Any]]
    leaves_on_target: int
    leaves: int
    on_device: bool
    memory_kind: str  # the kind it stays in: its devices' default, or pinned_host
    dtype: str | None


class Executor(Protocol):
    """What construction asks of the world it places models in (real arrays, or arrays on paper)."""

    def as_model(self, given: Any, role: Role) -> tuple[Any, str | None]:
        """The model a role was given, and the checkpoint path it was read from (None: a model)."""

    def load_facts(self, model: Any, role: Role, mesh: Any) -> LoadFacts: ...

    def place(self, model: Any, role: Role, mesh: Any, kind: str, dtype: str | None) -> Any:
        """``model`` resharded onto ``mesh`` in ``kind`` memory, cast to ``dtype`` (P5)."""

    def move(self, model: Any, kind: str) -> Any:
        """Put every leaf of ``model`` in ``kind`` memory, in place (leaves there already kept); returns ``model``."""

    def share(self, dst: Any, src: Any, frozen_only: bool, role: Role) -> None:
        """``dst`` takes ``src``'s arrays (all, or the frozen, non-LoRA ones): P14's update."""

    def shares_backbone(self, reference: Any, actor: Any) -> bool: ...

    def is_lora(self, model: Any) -> bool: ...

    def make_engine(self, rollout_actor: Any, mesh: Any) -> Any: ...

    def engine_model(self, engine: Any) -> Any: ...

    def init_optimizer(self, model: Any, lora: bool, mesh: Any, role: Role = Role.ACTOR) -> Any:
        """The optimizer state of ``role``'s optimizer (ACTOR or CRITIC) over ``model``'s
        trainable parameters, each moment beside its parameter on ``mesh``."""

    def move_optimizer(self, state: Any, kind: str) -> Any: ...

    def pin_anchor(self, actor: Any, partial: bool) -> tuple[Any, int]:
        """The anchor snapshot in pinned host memory, and its bytes."""

    def device_kind(self, mesh: Any) -> str: ...


@dataclasses.dataclass
class Request:
    """What construction works from: the models as given and the config's facts."""

    actor: Any
    reference: Any | None
    reward: Any | None
    critic: Any | None
    role_to_mesh: dict[Role, Any]
    engine_kind: str
    engine_name: str
    rollout_dtype: str | None
    offload_to_cpu: bool
    anchor_mode: str
    actor_is_module: bool
    reference_is_module: bool


@dataclasses.dataclass
class Placed:
    """The roles after construction (live models or models on paper) and what was decided.
    A live cluster's steps replace ``optimizer`` and ``critic_optimizer``, its syncs ``anchor``."""

    actor: Any
    engine: Any
    reference: Any | None
    reward: Any | None
    critic: Any | None
    optimizer: Any
    critic_optimizer: Any | None
    anchor: Any
    role_to_mesh: dict[Role, Any]
    config_role_to_mesh: dict[Role, Any]
    sharing_map: sharing.SharingMap
    rollout_branch: RolloutBranch
    mesh_overridden_by_engine: bool
    lora: bool
    warnings: list[str]
    mover: Mover


def construct(ex: Executor, req: Request, trace: Trace, sink: dict[str, Any] | None = None) -> Placed:
    """Place every role, taking every decision from the rules. ``sink`` receives each model as
    soon as it exists, so a caller can release what a construction that raised had made."""
    sink = sink if sink is not None else {}
    r2m = dict(req.role_to_mesh)
    actor_given, path = ex.as_model(req.actor, Role.ACTOR)
    if path is not None:
        sink["actor_read"] = actor_given  # read from a checkpoint: construction's own arrays
    lora = ex.is_lora(actor_given)
    shared, decisions = sharing.sharing_map(
        r2m,
        actor_is_module=req.actor_is_module,
        actor_has_lora=req.actor_is_module and lora,
        has_reference=req.reference is not None,
        reference_is_module=req.reference_is_module,
    )
    for d in decisions:
        trace.add(d)
    if path is not None:
        trace.add(loading.p5_from_path("actor", path))
    mover = Mover(ex, shared, trace, req.offload_to_cpu, r2m)

    actor = sink["actor"] = mover.load(actor_given, Role.ACTOR, r2m[Role.ACTOR])
    linked = sharing.shares(shared, Role.ACTOR, Role.ROLLOUT)
    p3 = trace.add(rollout.p3_rollout_model(linked, req.engine_kind, req.engine_name, req.rollout_dtype))
    if p3.branch is RolloutBranch.SECOND_COPY:
        # A fresh load of the actor as given (a path is read again).
        again = actor_given
        if path is not None:
            again = sink["rollout_read"] = mover.given(req.actor, Role.ACTOR)
        rollout_actor = sink["rollout"] = mover.load(again, Role.ROLLOUT, r2m[Role.ROLLOUT], dtype=req.rollout_dtype)
    else:
        rollout_actor = actor

    def load_role(role: Role, given: Any) -> Any:
        if given is None:
            return None
        read = sink[f"{role.value}_read"] = mover.given(given, role)  # construction's own, to free on failure
        sink[role.value] = mover.load(read, role, r2m[role])
        return sink[role.value]

    ref = load_role(Role.REFERENCE, req.reference)
    if ref is not None:
        ref_linked = sharing.shares(shared, Role.ACTOR, Role.REFERENCE)
        shares = ref_linked and ex.shares_backbone(ref, actor)
        p4 = trace.add(reference.p4_reference_backbone(ref_linked, shares, req.offload_to_cpu))
        if warning := reference.p4_warning(p4):
            mover.warnings.append(warning)
    critic, reward = load_role(Role.CRITIC, req.critic), load_role(Role.REWARD, req.reward)
    mover.models = {Role.ACTOR: actor, Role.REFERENCE: ref, Role.CRITIC: critic, Role.REWARD: reward}

    # P14: a model in pinned host memory comes to device before the engine sees it, so its programs are the device's.
    config_mesh = r2m[Role.ROLLOUT]
    mover.to_device(rollout_actor, Role.ROLLOUT)
    engine = sink["engine"] = ex.make_engine(rollout_actor, config_mesh)
    mover.engine = engine
    mover.to_host(ex.engine_model(engine), Role.ROLLOUT)
    owns = bool(engine.owns_weights)
    if req.offload_to_cpu and owns and linked:
        trace.add(loading.p14_own_copy_engine(req.engine_name))
    # P7: an engine that exposes a mesh replaces the rollout mesh; the sharing map is deliberately not rebuilt.
    engine_mesh = getattr(engine, "mesh", None)  # None: the engine exposes no mesh
    p7 = trace.add(rollout.p7_engine_mesh(req.engine_name, config_mesh, engine_mesh, linked))
    overridden = False
    if p7.branch is MeshBranch.REPLACED:
        overridden = engine_mesh != config_mesh
        r2m[Role.ROLLOUT] = engine_mesh

    # P12: the optimizer over the trainable parameters, made with the actor on device.
    mover.to_device(actor, Role.ACTOR)
    trace.add(steps.p12_trainable(lora))
    optimizer = sink["optimizer"] = ex.init_optimizer(actor, lora, r2m[Role.ACTOR])
    mover.to_host(actor, Role.ACTOR)
    if req.offload_to_cpu:
        optimizer = sink["optimizer"] = ex.move_optimizer(optimizer, "pinned_host")
    # P12 for the critic: its own optimizer over all its parameters, offloaded with the others (never in the reference).
    critic_optimizer = None
    if critic is not None:
        mover.to_device(critic, Role.CRITIC)
        trace.add(steps.p12_critic_trainable())
        critic_optimizer = sink["critic_optimizer"] = ex.init_optimizer(critic, False, r2m[Role.CRITIC], Role.CRITIC)
        mover.to_host(critic, Role.CRITIC)
        if req.offload_to_cpu:
            critic_optimizer = sink["critic_optimizer"] = ex.move_optimizer(critic_optimizer, "pinned_host")

    # P8: the anchor, pinned to host (only the adapters with anchor="trainable" and LoRA).
    anchor, nbytes = ex.pin_anchor(actor, anchor_is_partial(req.anchor_mode, lora))
    sink["anchor"] = anchor
    trace.add(p8_anchor(req.anchor_mode, lora, 0, nbytes))
    return Placed(
        actor=actor,
        engine=engine,
        reference=ref,
        reward=reward,
        critic=critic,
        optimizer=optimizer,
        critic_optimizer=critic_optimizer,
        anchor=anchor,
        role_to_mesh=r2m,
        config_role_to_mesh=dict(req.role_to_mesh),
        sharing_map=shared,
        rollout_branch=p3.branch,
        mesh_overridden_by_engine=overridden,
        lora=lora,
        warnings=mover.warnings,
        mover=mover,
    )


class Mover:
    """P5 and P14: load a model onto a mesh, and move roles between memory kinds, keeping the
    roles that share weights together (construction's, then the live cluster's operations')."""

    def __init__(
        self, ex: Executor, shared: sharing.SharingMap, trace: Trace, offload: bool, role_to_mesh: dict[Role, Any]
    ) -> None:
        self.ex, self.shared, self.trace, self.offload = ex, shared, trace, offload
        self.role_to_mesh = role_to_mesh  # the config's meshes: where each role computes
        self.models: dict[Role, Any] = {}
        self.engine: Any = None
        self.warnings: list[str] = []

    def given(self, model: Any, role: Role) -> Any:
        got, path = self.ex.as_model(model, role)
        if path is not None:
            self.trace.add(loading.p5_from_path(role.value, path))
        return got

    def load(self, model: Any, role: Role, mesh: Any, dtype: str | None = None) -> Any:
        """P5: keep a model already on ``mesh``, else reshard it there in its memory kind;
        then P14: with offload, a model on device moves to pinned host."""
        facts = self.ex.load_facts(model, role, mesh)
        read = {k: v for k, v in dataclasses.asdict(facts).items() if k != "on_device"}  # what P5 reads
        p5 = self.trace.add(loading.p5_load(role.value, target_mesh=describe_mesh(mesh), requested_dtype=dtype, **read))
        if p5.branch is loading.LoadBranch.RESHARDED:
            cast = dtype if dtype is not None and facts.leaves and dtype != facts.dtype else None
            model = self.ex.place(model, role, mesh, facts.memory_kind, cast)
        p14 = loading.p14_offload(role.value, self.offload, facts.on_device)
        if p14 is not None:
            self.trace.add(p14)
            model = self.ex.move(model, "pinned_host")
        return model

    def twin(self, clone: Callable[[Any], Any], engine: Any) -> Mover:
        """This mover over the models ``clone`` maps this one's to, and ``engine``: its moves
        change those only (a cluster's twin, ``ClusterState.isolated``)."""
        twin = copy.copy(self)
        twin.models = {role: clone(model) for role, model in self.models.items()}
        twin.engine = engine
        twin.ex = copy.copy(self.ex)
        twin.ex.engine = engine  # the live executor hands the rollout its partner's weights through it
        return twin

    def to_device(self, model: Any, role: Role) -> None:
        """P14: bring a role's model to device for its work, its sharing partners with it."""
        if self.offload:
            self._move(model, role, self.ex.device_kind(self.role_to_mesh[role]))

    def to_host(self, model: Any, role: Role) -> None:
        if self.offload:
            self._move(model, role, "pinned_host")

    def _move(self, model: Any, role: Role, kind: str) -> None:
        self.ex.move(model, kind)
        owns = self.engine is not None and bool(self.engine.owns_weights)
        for other in loading.p14_updated_together(self.shared, role, owns):  # the actor, rollout or reference
            if other is Role.ROLLOUT:
                target = None if self.engine is None else self.ex.engine_model(self.engine)
            else:
                target = self.models.get(other)
            if target is not None and target is not model:  # the reference takes the frozen arrays only
                self.ex.share(target, model, other is Role.REFERENCE, other)
