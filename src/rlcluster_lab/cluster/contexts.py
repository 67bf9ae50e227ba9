"""The role contexts: entering a role's context, and a bounded, read-only record of each entry.

The record is taken *inside* the context and reads JAX's own current mesh, not the mesh the
cluster meant to enter, so an operation that stopped entering its role's mesh would show it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rlcluster_lab.core.config import ClusterConfig
from rlcluster_lab.core.hosts import home_device
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import default_memory_kind


@dataclasses.dataclass(frozen=True)
class ContextEntry:
    """One entry into a role's context by ``operation``: the current mesh inside as JAX reports it
    (axis sizes, devices in mesh order), and whether it is the role's mesh."""

    operation: str
    role: str
    mesh_shape: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...]
    is_role_mesh: bool

    def mesh_text(self) -> str:
        """``fsdp=2 x tp=2 on devices 0-3`` (or the id list when not a run)."""
        shape = " x ".join(f"{k}={v}" for k, v in self.mesh_shape) or "(no mesh)"
        ids = list(self.device_ids)
        if not ids:
            return shape
        if ids == list(range(ids[0], ids[-1] + 1)):
            return f"{shape} on devices {ids[0]}-{ids[-1]}"
        return f"{shape} on devices {ids}"


class ContextLog:
    """The last ``capacity`` entries, oldest first (the default: a few RL steps of every operation)."""

    def __init__(self, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError(f"a context log keeps at least one entry; got capacity={capacity}")
        self._entries: collections.deque[ContextEntry] = collections.deque(maxlen=capacity)

    def record(self, operation: str, role: str, role_mesh: Any) -> ContextEntry:
        """Append what JAX reports as the current mesh, called inside the role's context."""
        current = jax.sharding.get_mesh()
        devices = np.asarray(current.devices) if current.shape else np.asarray([])
        entry = ContextEntry(
            operation=operation,
            role=role,
            mesh_shape=tuple((str(k), int(v)) for k, v in current.shape.items()),
            device_ids=tuple(int(d.id) for d in devices.flat),
            is_role_mesh=bool(current == role_mesh),
        )
        self._entries.append(entry)  # the oldest is dropped when full
        return entry

    def entries(self) -> tuple[ContextEntry, ...]:
        return tuple(self._entries)


def context_rows(entries: tuple[ContextEntry, ...] | list[ContextEntry]) -> list[dict[str, Any]]:
    """The entries as table rows: operation, role, the mesh JAX had current, and whether it is the role's."""
    return [
        {"operation": e.operation, "role": e.role, "current mesh": e.mesh_text(), "role's mesh": e.is_role_mesh}
        for e in entries
    ]


@contextlib.contextmanager
def role_context(config: ClusterConfig, mesh: Mesh, role: Role) -> Iterator[Mesh]:
    """Enter a role's context, recording nothing: ``mesh`` current, its devices the default ones, the
    cluster's matmul precision (``core.precision``) and the role's logical axis rules, all thread-local."""
    rules = config.logical_axis_rules(role)
    with contextlib.ExitStack() as stack:
        stack.enter_context(jax.set_mesh(mesh))
        # multi-process: the mesh's first device this process owns (home_device).
        stack.enter_context(jax.default_device(home_device(mesh)))
        if config.matmul_precision is not None:
            stack.enter_context(jax.default_matmul_precision(config.matmul_precision))
        if rules:
            stack.enter_context(nnx.logical_axis_rules(list(rules)))
        yield mesh


class RoleContexts:
    """Where each role of one cluster computes (the config's meshes, then construction's, P7),
    and the record of every entry into a role's context."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.role_to_mesh: dict[Role, Mesh] = dict(config.role_to_mesh)
        self.log = ContextLog()

    def rules_for(self, role: Role) -> Any:
        """The role's logical axis rules, or the model family's defaults."""
        rules = self.config.logical_axis_rules(role)
        return rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES

    def devices(self) -> list[Any]:
        """Every device some role's mesh uses, in id order."""
        return sorted({d for mesh in self.role_to_mesh.values() for d in mesh.devices.flat}, key=lambda d: d.id)

    def platform(self) -> str:
        """The platform of the devices the meshes use (one platform per cluster)."""
        return next(iter(self.role_to_mesh[Role.ACTOR].devices.flat)).platform

    def device_kind(self, role: Role) -> str:
        """The default memory kind of the devices the role's mesh uses (where it computes)."""
        return default_memory_kind(self.role_to_mesh[role])

    @contextlib.contextmanager
    def enter(self, role: Role, operation: str = "(unnamed)") -> Iterator[Mesh]:
        """``role_context`` on the role's mesh, recorded in ``log`` under ``operation``."""
        mesh = self.role_to_mesh[role]
        with role_context(self.config, mesh, role):
            self.log.record(operation, role.value, mesh)  # read inside: what JAX has current
            yield mesh
