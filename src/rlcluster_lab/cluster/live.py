"""The live executor: construction's steps done on real arrays, and what a construction that
raised gives back (``give_back``)."""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import NamedSharding

from rlcluster_lab.cluster.construct import LoadFacts, Placed, Request, construct
from rlcluster_lab.cluster.contexts import RoleContexts
from rlcluster_lab.cluster.validate import engine_class
from rlcluster_lab.core.config import max_kv_cache_size
from rlcluster_lab.core.gathering import summed
from rlcluster_lab.core.meshes import describe_mesh
from rlcluster_lab.core.options import RolloutConfig, dtype_name
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import array_leaves, default_memory_kind, is_on_device, state_meshes
from rlcluster_lab.core.states import model_state
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.engines import OwnCopyEngine, RolloutEngine
from rlcluster_lab.model import checkpoint
from rlcluster_lab.model.lora import is_lora, trained_params
from rlcluster_lab.placement.buffers import buffer_keys, sharing_backbone, state_bytes
from rlcluster_lab.placement.place import place_model, put_on_memory_kind
from rlcluster_lab.training.step import init_optimizer_state


@dataclasses.dataclass(eq=False)
class LiveExecutor:
    """Places real models for a cluster, in its role contexts (``engine_kind``: a name or ``custom``;
    ``rollout_config``: the TRAIN one; ``optimizers`` per trained role)."""

    contexts: RoleContexts
    tokenizer: Any
    engine_kind: str
    rollout_config: RolloutConfig
    optimizers: dict[Role, optax.GradientTransformation]
    engine: RolloutEngine | None = dataclasses.field(default=None, init=False)

    def as_model(self, given: Any, role: Role) -> tuple[nnx.Module, str | None]:
        if isinstance(given, nnx.Module):
            return given, None
        return checkpoint.load(given), str(given)

    def load_facts(self, model: nnx.Module, role: Role, mesh: Any) -> LoadFacts:
        state = model_state(model)
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
        rules, strategy = self.contexts.rules_for(role), self.contexts.config.reshard
        return place_model(model, mesh, rules, memory_kind=kind, dtype=dtype, role=role.value, strategy=strategy)

    def move(self, model: nnx.Module, kind: str) -> nnx.Module:
        nnx.update(model, put_on_memory_kind(model_state(model), kind))  # its Variables get new arrays
        return model

    def share(self, dst: nnx.Module, src: nnx.Module, frozen_only: bool, role: Role) -> None:
        if role is Role.ROLLOUT and self.engine is not None:
            self.engine.update_params(model_state(src))  # the engine takes new weights its own way
        else:
            nnx.update(dst, model_state(src, nnx.Not(nnx.LoRAParam)) if frozen_only else model_state(src))

    shares_backbone = staticmethod(sharing_backbone)
    is_lora = staticmethod(is_lora)

    def make_engine(self, rollout_actor: nnx.Module, mesh: Any) -> RolloutEngine:
        """The engine, as the reference builds each kind: the TRAIN rollout config unchanged, and the
        KV cache size (the largest over modes) only to the engines that take one (vanilla, vllm)."""
        config, kind = self.contexts.config, self.engine_kind
        kwargs: dict[str, Any] = dict(
            rollout_actor=rollout_actor, tokenizer=self.tokenizer, mesh=mesh, rollout_config=self.rollout_config
        )
        factory = config.rollout_engine
        if kind != "custom":
            factory = engine_class(config, kind)
            kwargs["reshard"] = config.reshard  # an own-copy engine places its copy by it
            if kind in ("vanilla", "vllm"):
                kwargs["cache_size"] = max_kv_cache_size(config)
            if issubclass(factory, OwnCopyEngine):
                kwargs["logical_axis_rules"] = self.contexts.rules_for(Role.ROLLOUT)
        with self.contexts.enter(Role.ROLLOUT, "construct: engine"):
            self.engine = factory(**kwargs)
        self.engine.reshard = config.reshard  # a custom engine's too
        return self.engine

    def engine_model(self, engine: RolloutEngine) -> nnx.Module:
        return engine.model()

    def init_optimizer(self, model: nnx.Module, lora: bool, mesh: Any, role: Role = Role.ACTOR) -> Any:
        with self.contexts.enter(role, "construct: optimizer state"):
            trainable = model_state(model, trained_params(lora))
            return init_optimizer_state(self.optimizers[role], trainable, mesh)

    move_optimizer = staticmethod(put_on_memory_kind)

    def pin_anchor(self, actor: nnx.Module, partial: bool) -> tuple[Any, int]:
        source = model_state(actor, nnx.LoRAParam) if partial else model_state(actor)
        anchor = put_on_memory_kind(source, "pinned_host")
        # multi-process: each process holds its own shards; P8 records the bytes of all of them.
        return anchor, summed(state_bytes(anchor), "anchor bytes")

    device_kind = staticmethod(default_memory_kind)


def construct_live(executor: LiveExecutor, given: dict[Role, Any], trace: Trace) -> Placed:
    """``construct`` on real arrays of the models ``given`` per role (modules, checkpoint paths or None);
    a construction that raised gives everything back (``give_back``) before the error goes on."""
    config = executor.contexts.config
    actor, reference = given[Role.ACTOR], given.get(Role.REFERENCE)
    data_type = executor.rollout_config.data_type
    request = Request(
        actor=actor,
        reference=reference,
        reward=given.get(Role.REWARD),
        critic=given.get(Role.CRITIC),
        role_to_mesh=executor.contexts.role_to_mesh,
        engine_kind=executor.engine_kind,
        engine_name=config.engine_name(),
        rollout_dtype=None if data_type is None else dtype_name(data_type),
        offload_to_cpu=config.offload_to_cpu,
        anchor_mode=config.anchor,
        actor_is_module=isinstance(actor, nnx.Module),
        reference_is_module=reference is None or isinstance(reference, nnx.Module),
    )
    before = {id(x) for x in jax.live_arrays()}
    modules = {id(m): m for m in given.values() if isinstance(m, nnx.Module)}
    saved = [(m, jax.tree.map(lambda x: x, model_state(m))) for m in modules.values()]
    made: dict[str, Any] = {}
    try:
        return construct(executor, request, trace, sink=made)
    except BaseException as exc:
        freed = give_back(made, saved, before)
        exc.add_note(
            f"RLCluster construction did not finish: the models you passed were given back their own "
            f"arrays and memory kinds, and the {freed} array(s) construction had made were freed."
        )
        raise


def give_back(made: dict[str, Any], saved: list[tuple[nnx.Module, Any]], before: set[int]) -> int:
    """After a failed construction: give the caller's models their arrays back (``saved``
    snapshots) and free exactly what construction made; returns the number of arrays freed.
    Ownership decides: an array that existed before (``before``: ids) or shares a buffer with
    one of the caller's is kept, and others' arrays are never reached."""
    ours = [x for obj in made.values() for x in _arrays_of(obj)]
    ours += [x for model, _ in saved for x in array_leaves(model_state(model))]
    for model, snapshot in saved:
        nnx.update(model, snapshot)
    protected = buffer_keys([snapshot for _, snapshot in saved])
    made.clear()
    freed = 0
    for x in {id(x): x for x in ours}.values():
        if id(x) in before or x.is_deleted() or buffer_keys([x]) & protected:
            continue
        x.delete()
        freed += 1
    gc.collect()
    return freed


def _arrays_of(obj: Any) -> list[jax.Array]:
    """The arrays a model, an engine's model or a pytree (optimizer state, anchor) holds."""
    if isinstance(obj, RolloutEngine):
        try:
            obj = obj.model()
        except Exception:  # an engine that failed half-way: what it holds is not ours to judge
            return []
    if isinstance(obj, nnx.Module):
        obj = model_state(obj)
    return array_leaves(obj)
