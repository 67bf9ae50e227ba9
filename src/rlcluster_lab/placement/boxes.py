"""Shards as boxes (a (start, stop) pair per dimension): which part of a global array each device
holds, and what a change of layout must move; indices and devices only, for the minimal strategy,
the minimum any reshard moves (L3), the crossing report and the planner alike."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
from jax._src.array import ArrayImpl as _ArrayImpl  # jax.Array's own constructor (not public)
from jax.sharding import Sharding

from rlcluster_lab.placement.transfers import shard_data, shard_devices

Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension


@dataclasses.dataclass(frozen=True)
class Piece:
    """Part of one destination shard, cut from one source shard."""

    src_device: int
    src_box: Box  # the source shard's box in the global array
    box: Box  # the piece's box in the global array

    def size(self) -> int:
        return box_size(self.box)


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """How one destination shard is made."""

    device: int
    box: Box
    pieces: tuple[Piece, ...]

    @property
    def reuses_source_buffer(self) -> bool:
        """The whole block is one source shard already on this device."""
        return len(self.pieces) == 1 and self.pieces[0].src_device == self.device and self.pieces[0].src_box == self.box


def minimum_cross_device_elements(
    src_boxes: Sequence[tuple[int, Box]], dst_boxes: Sequence[tuple[int, Box]]
) -> list[int]:
    """Per destination shard: elements no source shard on its own device holds, the least any reshard
    must move; remembered per pair of layouts (every sync asks again)."""
    return list(_minimum(tuple(src_boxes), tuple(dst_boxes)))


@functools.lru_cache(maxsize=512)  # a planner's large meshes make long keys: a few hundred pairs
def _minimum(src_boxes: tuple[tuple[int, Box], ...], dst_boxes: tuple[tuple[int, Box], ...]) -> tuple[int, ...]:
    local: dict[int, list[Box]] = {}
    for dev, box in src_boxes:
        local.setdefault(dev, []).append(box)
    out = []
    for dev, want in dst_boxes:
        common = (intersect_boxes(box, want) for box in dict.fromkeys(local.get(dev, [])))
        out.append(box_size(want) - sum(box_size(c) for c in common if c is not None))
    return tuple(out)


def device_put_keeps(src_boxes: Sequence[tuple[int, Box]], dst_boxes: Sequence[tuple[int, Box]]) -> list[bool]:
    """Per destination shard (mesh order): does ``jax.device_put`` onto the destination keep the
    source's buffer there? Every load and reshard of the lab follows it by default (P5, P13), so L2's
    shared buffers are the reference's. Both lists are (device id, box) in mesh order. As read from
    JAX (a test checks it):

    - the same devices in another order: every shard is made anew;
    - equal tilings: a shard is kept where its device is the same at that position;
    - otherwise a source shard with the same box on the same device is kept, unless some destination
      box is no source shard's: then the array goes through the host and nothing is kept.
    """
    src_ids, dst_ids = [d for d, _ in src_boxes], [d for d, _ in dst_boxes]
    if len(src_ids) > 1 and src_ids != dst_ids and set(src_ids) == set(dst_ids):
        return [False] * len(dst_ids)
    if len(src_ids) == len(dst_ids) and all(a == b for (_, a), (_, b) in zip(src_boxes, dst_boxes)):
        return [s == d for s, d in zip(src_ids, dst_ids)]
    held = set(src_boxes)
    if not {box for _, box in dst_boxes} <= {box for _, box in src_boxes}:
        return [False] * len(dst_ids)
    return [(d, box) in held for d, box in dst_boxes]


def shard_boxes(x: jax.Array) -> list[tuple[int, Box]]:
    """(device id, box) of every addressable shard of ``x``, in the order of its shards."""
    return list(_sharding_boxes(x.sharding, tuple(x.shape), shard_devices(x.sharding, tuple(x.shape))))


@functools.lru_cache(maxsize=1024)
def _sharding_boxes(sharding: Sharding, shape: tuple[int, ...], devices: tuple[Any, ...]) -> tuple[Any, ...]:
    # A shard's index is its sharding's, for its device: the same for every array of this layout.
    index = sharding.devices_indices_map(shape)
    return tuple((d.id, to_box(index[d], shape)) for d in devices)


def to_box(index: Sequence[slice], shape: Sequence[int]) -> Box:
    """A shard's index (slices) as a box; dimensions the index leaves out are whole."""
    box = tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))
    return box + tuple((0, n) for n in shape[len(box) :])


def plan_reshard(
    shape: Sequence[int], src_boxes: Sequence[tuple[int, Box]], dst_boxes: Sequence[tuple[int, Box]]
) -> list[BlockPlan]:
    """For each destination (device, box): the source pieces that fill it (``src_boxes``: (device id,
    box) per source shard), a replicated box taken from the destination device's own copy, else
    from the lowest device id."""
    holders: dict[Box, list[int]] = {}
    for dev, box in src_boxes:
        holders.setdefault(box, []).append(dev)
    plans = []
    for dev, want in dst_boxes:
        pieces = []
        for box, devs in holders.items():
            inter = intersect_boxes(box, want)
            if inter is None:
                continue
            src = dev if dev in devs else min(devs)
            pieces.append(Piece(src_device=src, src_box=box, box=inter))
        covered = sum(p.size() for p in pieces)
        if covered != box_size(want):
            raise ValueError(
                f"source shards cover {covered} of the {box_size(want)} elements of destination "
                f"box {want}; the source sharding does not tile the array"
            )
        plans.append(BlockPlan(device=dev, box=want, pieces=tuple(pieces)))
    return plans


class Relabel:
    """Arrays laid out as ``x`` is, as arrays of ``dst`` (an equivalent sharding), over their very own
    buffers: nothing is copied. The shard order and the abstract value are worked out once per
    sharding, shape and dtype (checked by ``jax.make_array_from_single_device_arrays``); later calls
    reuse them without checking again, a quarter of that function's cost."""

    def __init__(self, x: jax.Array, dst: Sharding) -> None:
        shape = tuple(x.shape)
        blocks = {d.id: to_box(i, shape) for d, i in x.sharding.devices_indices_map(shape).items()}
        if blocks != {d.id: to_box(i, shape) for d, i in dst.devices_indices_map(shape).items()}:
            raise ValueError(f"{dst} lays out shape {shape} unlike {x.sharding}: a relabel would misplace blocks")
        source = {d.id: p for p, d in enumerate(shard_devices(x.sharding, shape))}
        self.order = tuple(source[d.id] for d in shard_devices(dst, shape))
        self.dst = dst
        checked = jax.make_array_from_single_device_arrays(shape, dst, _buffers(x), dtype=x.dtype)
        self.aval = checked.aval

    def __call__(self, x: jax.Array) -> jax.Array:
        buffers = getattr(x, "_arrays", None) or _buffers(x)  # the array's own, in shard order (see shard_data)
        return _ArrayImpl(self.aval, self.dst, [buffers[p] for p in self.order], committed=True, _skip_checks=True)


def _buffers(x: jax.Array) -> list[jax.Array]:
    return [data for _, data in shard_data(x)]


def intersect_boxes(a: Box, b: Box) -> Box | None:
    """The box two boxes have in common, or None when they do not meet."""
    out = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def box_size(box: Box) -> int:
    return math.prod(b - a for a, b in box)
