"""Shardings of a model on a mesh: which devices and memory kind each leaf belongs in, from its
logical axis names through the role's rules (a leaf without a spec is replicated). Facts only:
the model package puts fresh values there, ``placement`` moves existing models (P5, P14)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.meshes import MESH_AXES

MEMORY_KINDS: tuple[str, ...] = ("device", "pinned_host")  # where the lab places arrays
HOST_MEMORY_KINDS: tuple[str, ...] = ("pinned_host", "unpinned_host")  # buffers in the host's own memory


class PlacementError(ConfigError):
    """A model cannot be placed on a mesh as asked; the message names the fix (and, where a
    knob of the lab or the CLI sets the mesh, that knob). ``role``: whose model it was."""

    def __init__(self, message: str = "", *, role: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.role = role


def default_memory_kind(where: Mesh | jax.Array) -> str:
    """The default memory kind of the devices of ``where`` (a mesh or an array). Read from the
    devices themselves, so a mesh of CPU devices beside an accelerator gets the CPU's kind."""
    first = where.devices.flat[0] if isinstance(where, Mesh) else min(where.sharding.device_set, key=lambda d: d.id)
    return first.default_memory().kind


def array_leaves(tree: Any) -> list[jax.Array]:
    return [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]


def state_meshes(tree: Any) -> set[Mesh]:
    """The meshes the NamedSharding leaves of ``tree`` live on."""
    return {x.sharding.mesh for x in array_leaves(tree) if isinstance(x.sharding, NamedSharding)}


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
    state: Any, mesh: Mesh, rules: Iterable[tuple[str, Any]] | None, memory_kind: str, *, role: str = "model"
) -> Any:
    """NamedShardings for every leaf of ``state`` on ``mesh``, checked against its shapes."""
    specs = resolve_specs(state, rules)
    values = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state
    spec_values = nnx.to_pure_dict(specs) if isinstance(specs, nnx.State) else specs

    def one(x: Any, spec: Any) -> NamedSharding:
        spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
        check_spec(spec, getattr(x, "shape", ()), mesh, role)
        return NamedSharding(mesh, spec, memory_kind=memory_kind)

    return jax.tree.map(one, values, spec_values, is_leaf=lambda s: s is None or isinstance(s, PartitionSpec))


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
                f"axis names {MESH_AXES} (rlcluster_lab.make_mesh), or map the model's logical "
                f"axes onto this mesh's names with TrainingConfig.role_to_logical_axis_rule.",
                role=role,
            )
        size = math.prod(int(mesh.shape[n]) for n in names)
        if dim < len(shape) and shape[dim] % size:
            problem = (
                f"the {role} model has a dimension of size {shape[dim]} sharded over mesh axes "
                f"{names} of total size {size}, which does not divide it"
            )
            # The knobs that fix it (the device count, the engine, the model size) are named by
            # the checks that know them (app.scenario.validate).
            raise PlacementError(
                f"{problem}. Pick a mesh shape whose {names} size divides {shape[dim]}, or a model size "
                "whose dimensions do.",
                problem=problem,
                role=role,
            )
