"""Shards as boxes (a (start, stop) pair per dimension): which part of a global array each
device holds, and what a change of layout must move. Indices and devices only, so the same
arithmetic serves the minimal strategy, the minimum any reshard moves (L3), the crossing
report and the planner.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
from jax.sharding import Sharding

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
    """Per destination shard: elements no source shard on its own device holds, the least any
    reshard must move (shards of one sharding are equal or disjoint)."""
    local: dict[int, list[Box]] = {}
    for dev, box in src_boxes:
        local.setdefault(dev, []).append(box)
    out = []
    for dev, want in dst_boxes:
        common = (intersect_boxes(box, want) for box in dict.fromkeys(local.get(dev, [])))
        out.append(box_size(want) - sum(box_size(c) for c in common if c is not None))
    return out


def shard_boxes(x: jax.Array) -> list[tuple[int, Box]]:
    """(device id, box) of every addressable shard of ``x``."""
    shape = tuple(x.shape)
    return [(s.device.id, to_box(s.index, shape)) for s in x.addressable_shards]


def to_box(index: Sequence[slice], shape: Sequence[int]) -> Box:
    """A shard's index (slices) as a box; dimensions the index leaves out are whole."""
    box = tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))
    return box + tuple((0, n) for n in shape[len(box) :])


def plan_reshard(
    shape: Sequence[int], src_boxes: Sequence[tuple[int, Box]], dst_boxes: Sequence[tuple[int, Box]]
) -> list[BlockPlan]:
    """For each destination (device, box): the source pieces that fill it.

    ``src_boxes`` lists every source shard as (device id, box); a box held by
    several devices (replication) is a choice, and the destination device's
    own copy is preferred, then the lowest device id.
    """
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


def array_plan(x: jax.Array, dst: Sharding) -> list[BlockPlan]:
    shape = tuple(x.shape)
    src = shard_boxes(x)
    dst_map = dst.addressable_devices_indices_map(shape)
    dst_boxes = [(d.id, to_box(idx, shape)) for d, idx in dst_map.items()]
    return plan_reshard(shape, src, dst_boxes)


def relabel(x: jax.Array, dst: Sharding) -> jax.Array:
    """``x``'s own shards as an array on ``dst``, an equivalent sharding (nothing is copied)."""
    return jax.make_array_from_single_device_arrays(x.shape, dst, [s.data for s in x.addressable_shards], dtype=x.dtype)


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
