"""Putting a model onto a mesh and into a memory kind (P5, P14).

Partition specs come from the model's own logical axis names, mapped onto
mesh axes by the role's logical axis rules (the model's defaults when the
config gives none). A leaf without a spec is replicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlcluster_lab.core.meshes import describe_mesh
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.model import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.placement.reshard import cast_many, reshard_tree

MEMORY_KINDS = ("device", "pinned_host")


class PlacementError(ValueError):
    """A model cannot be placed on a mesh as asked; the message names the fix."""


def default_memory_kind(where: Any = None) -> str:
    """The default memory kind of the devices ``where`` names (a mesh, an array, a sharding,
    a device); of JAX's default device when None. Read from the devices themselves, so a
    mesh of CPU devices beside an accelerator gets the CPU's kind."""
    return _first_device(where).default_memory().kind


def _first_device(where: Any) -> Any:
    if where is None:
        return jax.devices()[0]
    if isinstance(where, Mesh):
        return where.devices.flat[0]
    if isinstance(where, jax.Array):
        where = where.sharding
    if hasattr(where, "device_set"):
        return min(where.device_set, key=lambda d: d.id)
    if hasattr(where, "default_memory"):
        return where
    leaves = array_leaves(where)
    if leaves:
        return _first_device(leaves[0])
    return jax.devices()[0]


def array_leaves(tree: Any) -> list[jax.Array]:
    return [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]


def state_meshes(tree: Any) -> set[Mesh]:
    """The meshes the NamedSharding leaves of ``tree`` live on."""
    return {x.sharding.mesh for x in array_leaves(tree) if isinstance(x.sharding, NamedSharding)}


def all_on_mesh(tree: Any, mesh: Mesh) -> bool:
    leaves = array_leaves(tree)
    return bool(leaves) and all(isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh for x in leaves)


def is_on_device(tree: Any) -> bool:
    """True when any leaf sits in its devices' default memory (the reference's test, kept as is)."""
    return any(x.sharding.memory_kind == default_memory_kind(x) for x in array_leaves(tree))


def memory_kinds(tree: Any) -> list[str]:
    return sorted({str(x.sharding.memory_kind) for x in array_leaves(tree)})


def resolve_specs(state: Any, rules: Iterable[tuple[str, Any]] | None) -> Any:
    """Map the state's logical partition specs onto mesh axes with ``rules``."""
    if rules is None:
        return nnx.get_partition_spec(state)
    with nnx.logical_axis_rules(list(rules)):
        return nnx.get_partition_spec(state)


def target_shardings(
    state: Any,
    mesh: Mesh,
    rules: Iterable[tuple[str, Any]] | None,
    memory_kind: str,
    *,
    role: str = "model",
) -> Any:
    """NamedShardings for every leaf of ``state`` on ``mesh``, checked against its shapes."""
    specs = resolve_specs(state, rules)
    values = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state
    spec_values = nnx.to_pure_dict(specs) if isinstance(specs, nnx.State) else specs

    def one(x: Any, spec: Any) -> NamedSharding:
        spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
        check_spec(spec, getattr(x, "shape", ()), mesh, role)
        return NamedSharding(mesh, spec, memory_kind=memory_kind)

    shardings = jax.tree.map(one, values, spec_values, is_leaf=lambda s: s is None or isinstance(s, PartitionSpec))
    return shardings


def check_spec(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh, role: str) -> None:
    """A spec may name only the mesh's axes, and each sharded dimension must divide evenly."""
    for dim, entry in enumerate(spec):
        if entry is None:
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        missing = [n for n in names if n not in mesh.axis_names]
        if missing:
            raise PlacementError(
                f"the {role} model's partition spec {spec} uses axis name(s) {missing} that the "
                f"{role} mesh does not have (its axes: {tuple(mesh.axis_names)}). Build the mesh with "
                f"axis names ('fsdp', 'tp') (rlcluster_lab.make_mesh), or map the model's logical "
                f"axes onto this mesh's names with TrainingConfig.role_to_logical_axis_rule."
            )
        size = 1
        for n in names:
            size *= int(mesh.shape[n])
        if dim < len(shape) and shape[dim] % size:
            raise PlacementError(
                f"the {role} model has a dimension of size {shape[dim]} sharded over mesh axes "
                f"{names} of total size {size}, which does not divide it. Pick a mesh shape whose "
                f"{names} size divides {shape[dim]}, or a model size whose dimensions do."
            )


def put_on_memory_kind(tree: Any, memory_kind: str) -> Any:
    """The same tree with every array in ``memory_kind``; leaves already there are kept."""
    if memory_kind not in MEMORY_KINDS:
        raise PlacementError(f"unsupported memory kind {memory_kind!r}; use one of {MEMORY_KINDS}")

    def move(x: Any) -> Any:
        if not isinstance(x, jax.Array) or x.sharding.memory_kind == memory_kind:
            return x
        return jax.device_put(x, x.sharding.with_memory_kind(memory_kind))

    return jax.tree.map(move, tree)


def move_model(model: nnx.Module, memory_kind: str) -> None:
    """Move a model's variables to ``memory_kind`` in place (its Variables get new arrays)."""
    nnx.update(model, put_on_memory_kind(nnx.state(model), memory_kind))


def place_model(
    model: nnx.Module,
    mesh: Mesh,
    rules: Iterable[tuple[str, Any]] | None = None,
    *,
    memory_kind: str | None = None,
    dtype: Any = None,
    role: str = "model",
    copy: bool = False,
) -> nnx.Module:
    """A model whose every leaf is sharded on ``mesh`` per its partition specs.

    Leaves already in their target sharding are kept (no copy) unless ``copy``
    asks for buffers of its own; the rest are resharded. Returns a new module
    object; ``model`` is left untouched.
    """
    graphdef, state = nnx.split(model)
    kind = memory_kind or default_memory_kind(mesh)
    shardings = target_shardings(
        state, mesh, rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES, kind, role=role
    )
    values = nnx.to_pure_dict(state)
    if dtype is not None:
        leaves, treedef = jax.tree.flatten(values)
        # Cast in device memory (never compute on pinned host buffers); the reshard below
        # puts the result in the memory kind asked for.
        leaves = [
            x
            if x.dtype == jnp.dtype(dtype) or x.sharding.memory_kind == default_memory_kind(x)
            else jax.device_put(x, x.sharding.with_memory_kind(default_memory_kind(x)))
            for x in leaves
        ]
        values = jax.tree.unflatten(treedef, cast_many(leaves, [dtype] * len(leaves)))
    moved = reshard_tree(values, shardings, copy=copy)
    nnx.replace_by_pure_dict(state, moved)
    return nnx.merge(graphdef, state)


def load_model(
    model: nnx.Module,
    mesh: Mesh,
    *,
    role: str,
    rules: Iterable[tuple[str, Any]] | None,
    dtype: Any = None,
    offload_to_cpu: bool = False,
    trace: Trace,
) -> nnx.Module:
    """P5: keep a model already on ``mesh``; else reshard it there, keeping its memory kind.

    The dtype cast happens only with a reshard, as in the reference. With
    ``offload_to_cpu`` a model on device then moves to pinned host memory.
    """
    state = nnx.state(model)
    leaves = array_leaves(state)
    on_device = is_on_device(state)
    meshes = state_meshes(state)
    kept = all_on_mesh(state, mesh)
    on_target = sum(isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh for x in leaves)
    kind = default_memory_kind(mesh) if on_device else "pinned_host"
    cast = dtype is not None and leaves and jnp.dtype(dtype) != leaves[0].dtype
    if not kept:
        model = place_model(model, mesh, rules, memory_kind=kind, dtype=dtype if cast else None, role=role)
    trace.record(
        "P5",
        f"{role}: every leaf already on the target mesh",
        {
            "role": role,
            "model_meshes": [describe_mesh(m) for m in meshes],
            "target_mesh": describe_mesh(mesh),
            "leaves_on_target": on_target,
            "leaves": len(leaves),
            "memory_kind": kind,
            "dtype": str(leaves[0].dtype) if leaves else None,
            "requested_dtype": None if dtype is None else str(jnp.dtype(dtype)),
        },
        "kept as is"
        if kept
        else f"resharded onto the target mesh in {kind} memory"
        + (f", cast to {jnp.dtype(dtype)}" if cast else "")
        + (f" ({on_target} of {len(leaves)} leaves were already in place and are reused)" if on_target else ""),
    )
    if offload_to_cpu and on_device:
        move_model(model, "pinned_host")
        trace.record(
            "P14",
            f"{role}: offload_to_cpu and the model is on device",
            {"role": role, "offload_to_cpu": True},
            "moved to pinned_host",
        )
    return model
