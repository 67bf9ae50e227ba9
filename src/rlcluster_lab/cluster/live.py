"""The live executor: construction's steps (``cluster.construct``) done on real arrays."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from flax import nnx
from jax.sharding import NamedSharding

from rlcluster_lab.cluster.construct import LoadFacts
from rlcluster_lab.core.gathering import summed
from rlcluster_lab.core.meshes import describe_mesh
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import array_leaves, default_memory_kind, is_on_device, state_meshes
from rlcluster_lab.engines import OwnCopyEngine, RolloutEngine
from rlcluster_lab.model import checkpoint
from rlcluster_lab.model.lora import is_lora
from rlcluster_lab.placement.buffers import sharing_backbone, state_bytes
from rlcluster_lab.placement.place import move_model, place_model, put_on_memory_kind
from rlcluster_lab.training.step import init_optimizer_state

if TYPE_CHECKING:
    from rlcluster_lab.cluster.cluster import RLCluster


class LiveExecutor:
    """Places real models for an ``RLCluster`` (its config, tokenizer and role contexts)."""

    def __init__(self, cluster: RLCluster) -> None:
        self.cluster = cluster
        self.engine: RolloutEngine | None = None

    def as_model(self, given: Any, role: Role) -> tuple[nnx.Module, str | None]:
        if isinstance(given, nnx.Module):
            return given, None
        assert isinstance(given, (str, os.PathLike))
        return checkpoint.load(given), str(given)

    def load_facts(self, model: nnx.Module, role: Role, mesh: Any) -> LoadFacts:
        state = nnx.state(model)
        leaves = array_leaves(state)
        on_device = is_on_device(state)
        on_target = sum(isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh for x in leaves)
        return LoadFacts(
            model_meshes=[describe_mesh(m) for m in state_meshes(state)],
            leaves_on_target=on_target,
            leaves=len(leaves),
            on_device=on_device,
            memory_kind=default_memory_kind(mesh) if on_device else "pinned_host",
            dtype=str(leaves[0].dtype) if leaves else None,
        )

    def place(self, model: nnx.Module, role: Role, mesh: Any, kind: str, dtype: str | None) -> nnx.Module:
        return place_model(model, mesh, self.cluster.rules_for(role), memory_kind=kind, dtype=dtype, role=role.value)

    def move(self, model: nnx.Module, kind: str) -> nnx.Module:
        move_model(model, kind)
        return model

    def share(self, dst: nnx.Module, src: nnx.Module, frozen_only: bool, role: Role) -> None:
        if role is Role.ROLLOUT and self.engine is not None:
            self.engine.update_params(nnx.state(src))  # the engine takes new weights its own way
        else:
            nnx.update(dst, nnx.state(src, nnx.Not(nnx.LoRAParam)) if frozen_only else nnx.state(src))

    def shares_backbone(self, reference: nnx.Module, actor: nnx.Module) -> bool:
        return sharing_backbone(reference, actor)

    def is_lora(self, model: nnx.Module) -> bool:
        return is_lora(model)

    def make_engine(self, rollout_actor: nnx.Module, mesh: Any) -> RolloutEngine:
        """The engine, as the reference builds each kind (see ``cluster.engine_arguments``)."""
        from rlcluster_lab.cluster.cluster import engine_arguments

        c = self.cluster
        factory, kwargs = engine_arguments(c, rollout_actor, mesh)
        with c._role_context(Role.ROLLOUT, "construct: engine"):
            self.engine = factory(**kwargs)
        return self.engine

    def engine_model(self, engine: RolloutEngine) -> nnx.Module:
        return engine.model()

    def engine_mesh(self, engine: RolloutEngine) -> Any | None:
        return getattr(engine, "mesh", None)

    def engine_owns_weights(self, engine: RolloutEngine) -> bool:
        return bool(engine.owns_weights)

    def init_optimizer(self, model: nnx.Module, lora: bool, mesh: Any, role: Role = Role.ACTOR) -> Any:
        c = self.cluster
        tx = c._critic_tx if role is Role.CRITIC else c._tx
        with c._role_context(role, "construct: optimizer state"):
            return init_optimizer_state(tx, nnx.state(model, nnx.LoRAParam if lora else nnx.Param), mesh)

    def move_optimizer(self, state: Any, kind: str) -> Any:
        return put_on_memory_kind(state, kind)

    def pin_anchor(self, actor: nnx.Module, partial: bool) -> tuple[Any, int]:
        source = nnx.state(actor, nnx.LoRAParam) if partial else nnx.state(actor)
        anchor = put_on_memory_kind(source, "pinned_host")
        # multi-process: each process holds its own shards; P8 records the bytes of all of them.
        return anchor, summed(state_bytes(anchor), "anchor bytes")

    def device_kind(self, mesh: Any) -> str:
        return default_memory_kind(mesh)


def own_copy_class(engine_cls: type) -> bool:
    return isinstance(engine_cls, type) and issubclass(engine_cls, OwnCopyEngine)
