"""The planner's executor: construction's steps (``cluster.construct``) done on arrays on paper.

``construct`` takes every decision from the rule functions and asks an executor to carry it
out; this one moves ``PlannedArray`` records through ``Buffers``, which reshards them as the
cluster would. So a plan runs the cluster's own construction, on shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import optax
from jax.sharding import PartitionSpec

from rlcluster_lab.cluster.construct import LoadFacts
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES, describe_mesh
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import check_spec
from rlcluster_lab.engines import OwnCopyEngine, VllmStyleEngine
from rlcluster_lab.engines.own_copy import rearranged_device_grid
from rlcluster_lab.model import ModelConfig
from rlcluster_lab.placement.layout import Layout, PlannedMesh
from rlcluster_lab.planner.buffers import Buffers, PlannedArray, anchor_arrays
from rlcluster_lab.planner.request import PlanRequest, Rules
from rlcluster_lab.planner.shapes import AbstractLeaf, abstract_leaves, optimizer_slots

PathKey = tuple[Any, ...]


@dataclasses.dataclass(eq=False)
class PlannedModel:
    """A model on paper: one ``PlannedArray`` per parameter path; mutable like an ``nnx.Module``,
    so every role holding it sees a move between memory kinds or a share (P14)."""

    arrays: dict[PathKey, PlannedArray]
    kind: str  # "lm" or "score"
    lora_rank: int = 0
    lora_paths: frozenset[PathKey] = frozenset()

    def frozen_paths(self) -> list[PathKey]:
        return [p for p in self.arrays if p not in self.lora_paths]


@dataclasses.dataclass(eq=False)
class PlannedEngine:
    """A rollout engine on paper: the model it samples with, and the mesh it exposes (P7)."""

    model: PlannedModel
    mesh: PlannedMesh | None
    owns_weights: bool


@dataclasses.dataclass(eq=False)
class PlannedExecutor:
    """Carries out construction's steps on ``PlannedModel`` records, made and resharded by ``buf``."""

    buf: Buffers
    config: ModelConfig
    rules: Mapping[Role, Rules]  # each role's logical axis rules
    engine_cls: type  # the rollout engine's class (``ENGINES``)
    tp_size: int | None  # the vllm engine's tensor-parallel size (None: all its devices)
    tx: optax.GradientTransformation  # the actor's optimizer
    critic_tx: optax.GradientTransformation

    def specs(self, role: Role, model: PlannedModel) -> dict[PathKey, AbstractLeaf]:
        """The role's partition spec for every leaf of ``model`` (its rules, the model's shapes)."""
        leaves = abstract_leaves(self.config, model.lora_rank, model.kind, self.rules[role])
        return {leaf.path: leaf for leaf in leaves}

    def as_model(self, given: PlannedModel, role: Role) -> tuple[PlannedModel, str | None]:
        return given, None

    def load_facts(self, model: PlannedModel, role: Role, mesh: PlannedMesh) -> LoadFacts:
        arrays = list(model.arrays.values())
        on_device = any(a.kind == "device" for a in arrays)
        return LoadFacts(
            model_meshes=[describe_mesh(m) for m in dict.fromkeys(a.mesh for a in arrays)],
            leaves_on_target=sum(a.mesh == mesh for a in arrays),
            leaves=len(arrays),
            on_device=on_device,
            memory_kind="device" if on_device else "pinned_host",
            dtype=str(arrays[0].dtype) if arrays else None,
        )

    def place(
        self, model: PlannedModel, role: Role, mesh: PlannedMesh, kind: str, dtype: str | None, copy: bool = False
    ) -> PlannedModel:
        specs = self.specs(role, model)
        _check_specs((specs[p] for p in model.arrays), mesh, role.value)
        dst = {p: Layout(mesh, specs[p].spec, kind) for p in model.arrays}
        arrays = {p: self.buf.reshard(a, dst[p], copy=copy, dtype=dtype) for p, a in model.arrays.items()}
        return dataclasses.replace(model, arrays=arrays)

    def move(self, model: PlannedModel, kind: str) -> PlannedModel:
        model.arrays = {p: a if a.kind == kind else self.buf.like(a, kind=kind) for p, a in model.arrays.items()}
        return model

    def share(self, dst: PlannedModel, src: PlannedModel, frozen_only: bool, role: Role) -> None:
        paths = src.frozen_paths() if frozen_only else list(src.arrays)
        dst.arrays.update({p: src.arrays[p] for p in paths if p in dst.arrays})

    def shares_backbone(self, reference: PlannedModel, actor: PlannedModel) -> bool:
        frozen = reference.frozen_paths()
        return bool(frozen) and all(_same_buffers(reference.arrays[p], actor.arrays.get(p)) for p in frozen)

    def is_lora(self, model: PlannedModel) -> bool:
        return bool(model.lora_paths)

    def make_engine(self, rollout_actor: PlannedModel, mesh: PlannedMesh) -> PlannedEngine:
        """Vanilla samples with the model it is handed; an own-copy engine copies it onto its
        mesh (the vllm one onto its rearranged grid, which it exposes: P7)."""
        if not issubclass(self.engine_cls, OwnCopyEngine):
            return PlannedEngine(rollout_actor, None, owns_weights=False)
        exposes = issubclass(self.engine_cls, VllmStyleEngine)
        engine_mesh = mesh
        if exposes:
            grid = rearranged_device_grid(mesh.device_ids, self.tp_size)
            engine_mesh = PlannedMesh(tuple(grid.flat), grid.shape, mesh.axis_names)
        model = self.place(rollout_actor, Role.ROLLOUT, engine_mesh, "device", None, copy=True)
        return PlannedEngine(model, engine_mesh if exposes else None, owns_weights=True)

    def engine_model(self, engine: PlannedEngine) -> PlannedModel:
        return engine.model

    def init_optimizer(
        self, actor: PlannedModel, lora: bool, mesh: PlannedMesh, role: Role = Role.ACTOR
    ) -> list[PlannedArray]:
        """One array per optimizer slot (``shapes.optimizer_slots``): a mirroring slot per trainable
        parameter, any other leaf replicated on the role's mesh (P12 runs in its context)."""
        trainable = [a for p, a in actor.arrays.items() if p in actor.lora_paths or not lora]
        tx = self.critic_tx if role is Role.CRITIC else self.tx
        out = []
        for slot in optimizer_slots(tx, self.config, actor.lora_rank):
            if slot.mirrors:
                out += [self.buf.like(a, dtype=slot.dtype) for a in trainable]  # None: the parameter's dtype
            else:
                out.append(self.buf.new(slot.shape, slot.dtype, mesh, PartitionSpec(), "device"))
        return out

    def move_optimizer(self, state: list[PlannedArray], kind: str) -> list[PlannedArray]:
        return [a if a.kind == kind else self.buf.like(a, kind=kind) for a in state]

    def pin_anchor(self, actor: PlannedModel, partial: bool) -> tuple[dict[PathKey, PlannedArray], int]:
        """The snapshot (P8, ``anchor_arrays``); a partial one stands for a model that reads the
        actor's own backbone, so the returned arrays include it (the bytes count the pinned ones)."""
        held = anchor_arrays(actor.arrays, actor.lora_paths, partial=partial)
        pinned = {
            p: a if p not in held or a.kind == "pinned_host" else self.buf.like(a, kind="pinned_host")
            for p, a in actor.arrays.items()
        }
        return pinned, sum(a.shard_bytes * a.mesh.size for a in held.values())

    def device_kind(self, mesh: PlannedMesh) -> str:
        return "device"


def _check_specs(leaves: Iterable[AbstractLeaf], mesh: PlannedMesh, role: str) -> None:
    """The cluster's own check (``check_spec``): axis names exist, dimensions divide."""
    for shape, spec in {(leaf.shape, leaf.spec) for leaf in leaves}:
        check_spec(spec, shape, mesh, role)


def _same_buffers(a: PlannedArray, b: PlannedArray | None) -> bool:
    return b is not None and a.mesh == b.mesh and a.kind == b.kind and bool(np.array_equal(a.origins, b.origins))


def given_models(buf: Buffers, req: PlanRequest, role_to_mesh: Mapping[Role, PlannedMesh]) -> dict[str, PlannedModel]:
    """The models ``app.scenario.build_models`` hands the cluster for ``req``'s knobs, on paper: the
    reference on its mesh with the family's default rules; the actor a copy of it, or LoRA adapters
    over its buffers (over a copy with ``lora_separate_base``); reward and critic on their meshes."""

    def made(leaves: Iterable[AbstractLeaf], mesh: PlannedMesh) -> dict[PathKey, PlannedArray]:
        return {leaf.path: buf.new(leaf.shape, leaf.dtype, mesh, leaf.spec, "device") for leaf in leaves}

    config, lora_rank, mesh = req.model, req.lora_rank, role_to_mesh[Role.REFERENCE]
    rules = DEFAULT_LOGICAL_AXIS_RULES  # Scenario.build_models places the models it makes without rules
    base_leaves = abstract_leaves(config, 0, "lm", rules)
    _check_specs(base_leaves, mesh, "reference")
    reference = PlannedModel(made(base_leaves, mesh), "lm")
    if lora_rank:
        base = {p: buf.like(a) for p, a in reference.arrays.items()} if req.lora_separate_base else reference.arrays
        lora_leaves = abstract_leaves(config, lora_rank, "lm", rules)
        adapters = made((leaf for leaf in lora_leaves if leaf.lora), mesh)
        actor = PlannedModel(
            {leaf.path: adapters[leaf.path] if leaf.lora else base[leaf.path] for leaf in lora_leaves},
            "lm",
            lora_rank,
            frozenset(adapters),
        )
    else:
        actor = PlannedModel({p: buf.like(a) for p, a in reference.arrays.items()}, "lm")
    models = {"actor": actor, "reference": reference}
    for name, role, wanted in (("reward", Role.REWARD, req.with_reward), ("critic", Role.CRITIC, req.with_critic)):
        if wanted:
            models[name] = PlannedModel(made(abstract_leaves(config, 0, "score", rules), role_to_mesh[role]), "score")
    return models
