"""The role contexts a cluster entered: a bounded, read-only record.

Every operation of the cluster (generate, log-probs, rewards, values, the optimizer steps)
opens by entering the mesh of the role it uses (``RLCluster._role_context``). The record
is taken *inside* that context and reads JAX's own notion of the current mesh
(``jax.sharding.get_mesh()``), not the mesh the cluster meant to enter, so an operation
that stopped entering its role's mesh would show it.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import numpy as np

# Enough for a few RL steps of every operation; older entries are dropped first.
DEFAULT_CAPACITY = 256


@dataclasses.dataclass(frozen=True)
class ContextEntry:
    """One entry into a role's context.

    Attributes:
        operation: what entered it (``"generate"``, ``"update_actor"``, ``"construct: engine"``, ...).
        role: the role whose context it is.
        mesh_shape: the current mesh inside the context as JAX reports it, axis name -> size.
        device_ids: that mesh's devices, in mesh order.
        is_role_mesh: whether that mesh is the role's mesh (``role_to_mesh[role]``, ``==``).
    """

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
    """The last ``capacity`` entries, oldest first, and how many older ones were dropped."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"a context log keeps at least one entry; got capacity={capacity}")
        self._entries: collections.deque[ContextEntry] = collections.deque(maxlen=capacity)
        self.dropped = 0

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
        if len(self._entries) == self._entries.maxlen:
            self.dropped += 1
        self._entries.append(entry)
        return entry

    def entries(self) -> tuple[ContextEntry, ...]:
        return tuple(self._entries)


def context_rows(entries: tuple[ContextEntry, ...] | list[ContextEntry]) -> list[dict[str, Any]]:
    """The entries as table rows: operation, role, the mesh JAX had current, and whether it is the role's."""
    return [
        {"operation": e.operation, "role": e.role, "current mesh": e.mesh_text(), "role's mesh": e.is_role_mesh}
        for e in entries
    ]
