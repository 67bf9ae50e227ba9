"""Layouts as plain data: a mesh on paper, the box each device's shard covers, and a sharding as
(mesh, spec, memory kind), for live arrays (``Layout.of``) and the planner's alike."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rlcluster_lab.core.meshes import MESH_AXES, check_mesh_shape
from rlcluster_lab.placement.boxes import Box


@dataclasses.dataclass(frozen=True)
class PlannedDevice:
    """A device on paper: only its id, which is all a mesh description needs."""

    id: int


@dataclasses.dataclass(frozen=True)
class PlannedMesh:
    """A mesh on paper, equal exactly when a ``Mesh`` would be (P1): devices in order, shape, axis names
    and axis types; with the attributes ``describe_mesh``, ``check_spec`` and the sharing map read."""

    device_ids: tuple[int, ...]
    axis_sizes: tuple[int, ...]
    axis_names: tuple[str, ...] = MESH_AXES
    axis_types: tuple[str, ...] | None = None  # None: Auto on every axis, as make_mesh builds

    def __post_init__(self) -> None:
        ids = tuple(int(i) for i in self.device_ids)
        sizes = tuple(int(s) for s in self.axis_sizes)
        names = tuple(str(n) for n in self.axis_names)
        types = tuple(self.axis_types) if self.axis_types is not None else ("Auto",) * len(names)
        check_mesh_shape(ids, sizes, names)
        if len(types) != len(names):
            raise ValueError(f"axis types {types} and axis names {names} differ in length")
        object.__setattr__(self, "device_ids", ids)
        object.__setattr__(self, "axis_sizes", sizes)
        object.__setattr__(self, "axis_names", names)
        object.__setattr__(self, "axis_types", types)

    @classmethod
    def build(cls, devices: Sequence[Any], shape: Sequence[int], axis_names: Sequence[str] = MESH_AXES) -> PlannedMesh:
        """Same signature as ``meshes.make_mesh``; devices are ids or objects with ``.id``."""
        return cls(tuple(getattr(d, "id", d) for d in devices), tuple(shape), tuple(axis_names))

    @classmethod
    def of(cls, mesh: Any) -> PlannedMesh:
        """A real ``Mesh`` (or a planned one) on paper."""
        if isinstance(mesh, PlannedMesh):
            return mesh
        types = tuple(str(t).split(".")[-1] for t in mesh.axis_types)
        ids = tuple(int(d.id) for d in np.asarray(mesh.devices).flat)
        return cls(ids, tuple(np.asarray(mesh.devices).shape), tuple(mesh.axis_names), types)

    @property
    def shape(self) -> collections.OrderedDict[str, int]:
        return collections.OrderedDict(zip(self.axis_names, self.axis_sizes))

    @property
    def size(self) -> int:
        return len(self.device_ids)

    @property
    def devices(self) -> np.ndarray:
        grid = np.empty(len(self.device_ids), dtype=object)
        grid[:] = [PlannedDevice(i) for i in self.device_ids]
        return grid.reshape(self.axis_sizes)

    @property
    def ids(self) -> np.ndarray:
        """Device ids in mesh order (row-major over the grid)."""
        return _ids_array(self.device_ids)


def mesh_words(axes: Mapping[str, int]) -> str:
    """A mesh's shape in words, ``mesh(fsdp=2,tp=4)``: how the reports and the sync's plan write it."""
    return "mesh(" + ",".join(f"{n}={k}" for n, k in axes.items()) + ")"


def id_ranges(ids: Sequence[int]) -> str:
    """Device ids in words: a run of consecutive ids as ``first-last``, else listed."""
    ids = list(ids)
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0])
    return ",".join(map(str, ids))


@functools.lru_cache(maxsize=4096)
def _ids_array(ids: tuple[int, ...]) -> np.ndarray:
    out = np.asarray(ids, dtype=np.int64)
    out.setflags(write=False)
    return out


def spec_axes(spec: PartitionSpec, ndim: int) -> list[tuple[str, ...]]:
    """For each dimension, the mesh axes it is split over (major first)."""
    entries = [spec[dim] if dim < len(spec) else None for dim in range(ndim)]
    return [() if e is None else tuple(e) if isinstance(e, tuple) else (e,) for e in entries]


@functools.lru_cache(maxsize=65536)
def shard_boxes(shape: tuple[int, ...], spec: PartitionSpec, mesh: PlannedMesh) -> tuple[tuple[int, Box], ...]:
    """(device id, box) of every device's shard, in mesh order, as ``NamedSharding.devices_indices_map``
    gives them (a dimension split over axes (a, b): size(a) * size(b) pieces, a major)."""
    sizes = dict(mesh.shape)
    axes = spec_axes(spec, len(shape))
    out = []
    for flat, coords in enumerate(np.ndindex(*mesh.axis_sizes)):
        at = dict(zip(mesh.axis_names, coords))
        box = []
        for n, names in zip(shape, axes):
            parts, k = 1, 0
            for a in names:
                parts *= sizes[a]
                k = k * sizes[a] + at[a]
            step = n // parts
            box.append((k * step, (k + 1) * step))
        out.append((mesh.device_ids[flat], tuple(box)))
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def shard_elements(shape: tuple[int, ...], spec: PartitionSpec, mesh: PlannedMesh) -> int:
    """Elements in each device's shard (all shards are the same size)."""
    sizes = dict(mesh.shape)
    n = 1
    for dim, names in zip(shape, spec_axes(spec, len(shape))):
        n *= dim // math.prod(sizes[a] for a in names)
    return n


@dataclasses.dataclass(frozen=True)
class Layout:
    """A sharding as plain data: the mesh on paper, the partition spec and the memory kind."""

    mesh: PlannedMesh
    spec: PartitionSpec
    kind: str

    @classmethod
    def of(cls, sharding: NamedSharding) -> Layout:
        return cls(PlannedMesh.of(sharding.mesh), sharding.spec, str(sharding.memory_kind))

    @property
    def device_ids(self) -> tuple[int, ...]:
        return self.mesh.device_ids

    def boxes(self, shape: tuple[int, ...]) -> tuple[tuple[int, Box], ...]:
        """(device id, box) of every shard, in mesh order."""
        return shard_boxes(shape, self.spec, self.mesh)

    def shard_bytes(self, shape: tuple[int, ...], itemsize: int) -> int:
        return shard_elements(shape, self.spec, self.mesh) * itemsize

    def in_kind(self, kind: str) -> Layout:
        return dataclasses.replace(self, kind=kind)
