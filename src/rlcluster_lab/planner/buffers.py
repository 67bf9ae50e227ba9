"""Arrays on paper for the what-if planner (L4): shardings, and which buffer each shard is, so
a buffer several roles hold counts once, as in the measured walk. ``Buffers`` reshards them
as ``reshard.reshard_many`` would (P5): which shards keep their source buffer and which are new.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec

from rlcluster_lab.measure.memory import KINDS
from rlcluster_lab.placement.boxes import device_put_keeps, minimum_cross_device_elements
from rlcluster_lab.placement.layout import Layout, PlannedMesh, shard_elements


@dataclasses.dataclass(frozen=True, eq=False)
class PlannedArray:
    """An array on paper: its sharding, and per device its shard's buffer: ``origins[i]``, the
    id of the array that first made the shard on ``mesh.device_ids[i]`` (one device and one
    origin: one buffer)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    mesh: PlannedMesh
    spec: PartitionSpec
    kind: str
    origins: np.ndarray

    @property
    def shard_bytes(self) -> int:
        return shard_elements(self.shape, self.spec, self.mesh) * self.dtype.itemsize

    @property
    def layout(self) -> Layout:
        return Layout(self.mesh, self.spec, self.kind)


def anchor_arrays(
    actor: Mapping[Any, PlannedArray], adapters: Collection[Any], *, partial: bool, new: bool = False
) -> dict[Any, PlannedArray]:
    """P8: the actor's arrays the anchor snapshot holds, at construction and again after every
    sync (P13): every one, or the adapters only when the anchor is partial
    (``rules.anchor.anchor_is_partial``). ``new``: only those it copies to pinned host (into
    new buffers, or over the old anchor's: ``rules.anchor.p8_repin_in_place``), the ones not
    pinned already (under offload it keeps the actor's own buffers)."""
    return {p: a for p, a in actor.items() if (not partial or p in adapters) and not (new and a.kind == "pinned_host")}


def shard_rows(groups: Sequence[Sequence[PlannedArray]], itemsize: int | None = None) -> dict[str, np.ndarray]:
    """One row per device shard of every array, group after group: the group's index
    (``entry``), the device, the buffer's origin, its bytes (``itemsize`` bytes per element
    instead of the array's own, if given) and its memory kind's index in ``KINDS``."""
    arrays = [(e, a) for e, group in enumerate(groups) for a in group]
    if not arrays:
        return {k: np.zeros(0, dtype=np.int64) for k in ("entry", "device", "origin", "bytes", "kind")}

    def nbytes(a: PlannedArray) -> int:
        return a.shard_bytes if itemsize is None else a.shard_bytes // a.dtype.itemsize * itemsize

    def column(value: Any) -> np.ndarray:
        return np.concatenate([np.full(a.mesh.size, value(e, a), dtype=np.int64) for e, a in arrays])

    return {
        "entry": column(lambda e, a: e),
        "device": np.concatenate([a.mesh.ids for _, a in arrays]),
        "origin": np.concatenate([a.origins for _, a in arrays]),
        "bytes": column(lambda e, a: nbytes(a)),
        "kind": column(lambda e, a: KINDS.index(a.kind)),
    }


def distinct_buffers(rows: dict[str, np.ndarray], per_entry: bool = False) -> np.ndarray:
    """Indices of the first row of each buffer (an origin on a device), or with ``per_entry``
    of each buffer within each group."""
    key = rows["origin"] * (int(rows["device"].max(initial=0)) + 1) + rows["device"]
    if per_entry:
        key = key * (int(rows["entry"].max(initial=0)) + 1) + rows["entry"]
    return np.unique(key, return_index=True)[1]


@functools.lru_cache(maxsize=8192)
def overlap(shape: tuple[int, ...], src: Layout, dst: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Per destination shard (mesh order): is it exactly the source shard on its device
    (``plan_reshard``'s ``reuses_source_buffer``, read off each device's own box: visiting
    every pair of shards is too slow at 256 chips), and how many of its elements no source
    shard on its device holds (``boxes.minimum_cross_device_elements``, as the measured sync)."""
    src_boxes, dst_boxes = src.boxes(shape), dst.boxes(shape)
    local = dict(src_boxes)
    same = np.array([local.get(dev) == box for dev, box in dst_boxes], dtype=bool)
    lacking = np.array(minimum_cross_device_elements(src_boxes, dst_boxes), dtype=np.int64)
    same.setflags(write=False)
    lacking.setflags(write=False)
    return same, lacking


@functools.lru_cache(maxsize=8192)
def host_overlap(shape: tuple[int, ...], src: Layout, dst: Layout, hosts: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Per destination shard (mesh order): how many of its elements no source shard on its
    *host* holds (``overlap``'s second figure with each device named by its host, ``hosts``:
    (device id, host index) pairs). A box several devices of one host need crosses once, for
    the first of them; the others copy it within the host."""
    host = dict(hosts)
    src_hosts = [(host[d], box) for d, box in src.boxes(shape)]
    dst_hosts = [(host[d], box) for d, box in dst.boxes(shape)]
    lacking = np.array(minimum_cross_device_elements(src_hosts, dst_hosts), dtype=np.int64)
    seen: set[tuple[int, Any]] = set()
    for i, (h, box) in enumerate(dst_hosts):
        if (h, box) in seen:
            lacking[i] = 0
        seen.add((h, box))
    lacking.setflags(write=False)
    return lacking


@functools.lru_cache(maxsize=8192)
def device_put_kept(shape: tuple[int, ...], src: Layout, dst: Layout) -> np.ndarray:
    """Per destination shard (mesh order): ``boxes.device_put_keeps`` on paper."""
    keeps = np.array(device_put_keeps(src.boxes(shape), dst.boxes(shape)), dtype=bool)
    keeps.setflags(write=False)
    return keeps


class Buffers:
    """Makes arrays on paper and reshards them as ``reshard.reshard_many`` would with ``strategy``."""

    def __init__(self, strategy: str) -> None:
        self._ids = itertools.count()
        self.strategy = strategy

    def new(
        self, shape: tuple[int, ...], dtype: Any, mesh: PlannedMesh, spec: PartitionSpec, kind: str
    ) -> PlannedArray:
        origins = np.full(mesh.size, next(self._ids), dtype=np.int64)
        return PlannedArray(tuple(shape), np.dtype(dtype), mesh, spec, kind, origins)

    def like(self, a: PlannedArray, *, kind: str | None = None, dtype: Any = None) -> PlannedArray:
        """New buffers with ``a``'s sharding (a copy, a cast or a memory-kind move)."""
        return self.new(a.shape, a.dtype if dtype is None else dtype, a.mesh, a.spec, a.kind if kind is None else kind)

    def kept(self, a: PlannedArray, dst: Layout) -> np.ndarray:
        """Per destination shard: does a reshard (without copy) keep ``a``'s buffer? As the live
        reshard does: with the ``xla`` strategy what ``jax.device_put`` keeps
        (``boxes.device_put_keeps``), with ``minimal`` every shard already on its device."""
        if a.layout == dst:
            return np.ones(dst.mesh.size, dtype=bool)
        if a.kind != "device" or dst.kind != "device":
            # A memory-kind change moves every shard into a new buffer.
            return np.zeros(dst.mesh.size, dtype=bool)
        if self.strategy == "minimal":
            return overlap(a.shape, a.layout, dst)[0]
        return device_put_kept(a.shape, a.layout, dst)

    def reshard(self, a: PlannedArray, dst: Layout, *, copy: bool = False, dtype: Any = None) -> PlannedArray:
        if dtype is not None and np.dtype(dtype) != a.dtype:
            a = self.like(a, dtype=dtype)  # place_model casts before it reshards
        if a.layout == dst and not copy:
            return a
        out = self.new(a.shape, a.dtype, dst.mesh, dst.spec, dst.kind)
        if copy:
            return out
        keep = self.kept(a, dst)
        if keep.any():
            by_device = np.full(1 + max(max(a.mesh.device_ids), max(dst.device_ids)), -1, dtype=np.int64)
            by_device[a.mesh.ids] = a.origins
            out = dataclasses.replace(out, origins=np.where(keep, by_device[dst.mesh.ids], out.origins))
        return out
