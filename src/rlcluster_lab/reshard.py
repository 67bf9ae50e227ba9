"""Moving arrays between shardings without a trip through the host.

On GPU and TPU, ``jax.device_put`` reshards device to device. On the CPU
backend it gathers through host memory when the layouts differ, which the
weight sync's transfer guard (P13) forbids and which would not show what a
real interconnect moves. So on CPU the lab reshards shard by shard: every
destination shard is assembled on its own device from the pieces of source
shards that overlap it, taking a piece from a copy already on that device
when there is one. Only the bytes a destination device lacks cross devices,
which is the least any reshard can move at this granularity.

``plan_reshard`` is the pure part (indices and devices only, no arrays), so
the same plan serves execution and byte accounting.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Sharding

Box = tuple[tuple[int, int], ...]  # (start, stop) per dimension


@dataclasses.dataclass(frozen=True)
class Piece:
    """Part of one destination shard, cut from one source shard."""

    src_device: int
    src_box: Box  # the source shard's box in the global array
    box: Box  # the piece's box in the global array

    def size(self) -> int:
        return _box_size(self.box)


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


def to_box(index: Sequence[slice], shape: Sequence[int]) -> Box:
    out = []
    for sl, n in zip(index, shape):
        start, stop, _ = sl.indices(n)
        out.append((start, stop))
    # Scalars and trailing unsharded dims.
    for n in shape[len(out) :]:
        out.append((0, n))
    return tuple(out)


def plan_reshard(
    shape: Sequence[int],
    src_boxes: Sequence[tuple[int, Box]],
    dst_boxes: Sequence[tuple[int, Box]],
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
            inter = _intersect(box, want)
            if inter is None:
                continue
            src = dev if dev in devs else min(devs)
            pieces.append(Piece(src_device=src, src_box=box, box=inter))
        covered = sum(p.size() for p in pieces)
        if covered != _box_size(want):
            raise ValueError(
                f"source shards cover {covered} of the {_box_size(want)} elements of destination "
                f"box {want}; the source sharding does not tile the array"
            )
        plans.append(BlockPlan(device=dev, box=want, pieces=tuple(pieces)))
    return plans


def array_plan(x: jax.Array, dst: Sharding) -> list[BlockPlan]:
    shape = tuple(x.shape)
    src = [(s.device.id, to_box(s.index, shape)) for s in x.addressable_shards]
    dst_map = dst.addressable_devices_indices_map(shape)
    dst_boxes = [(d.id, to_box(idx, shape)) for d, idx in dst_map.items()]
    return plan_reshard(shape, src, dst_boxes)


def reshard(x: jax.Array, dst: Sharding, *, copy: bool = False) -> jax.Array:
    """``x`` laid out as ``dst``, moving only device to device.

    The result reuses ``x`` when its sharding is already ``dst`` (unless
    ``copy``). A memory-kind change is applied after the layout change.
    """
    if x.sharding == dst:
        return jax.device_put(x, dst, may_alias=False) if copy else x
    if jax.default_backend() != "cpu":
        return jax.device_put(x, dst, may_alias=False if copy else None)
    # Layout changes run in device memory; memory-kind changes are per-device
    # moves on either side of it, which the transfer guard allows.
    work = jax.devices()[0].default_memory().kind
    moved_kind = x.sharding.memory_kind != work
    if moved_kind:
        x = jax.device_put(x, x.sharding.with_memory_kind(work))
    target = dst.with_memory_kind(work) if dst.memory_kind != work else dst
    if x.sharding.is_equivalent_to(target, x.ndim):
        out = jax.device_put(x, target, may_alias=False) if copy and not moved_kind else jax.device_put(x, target)
    else:
        # Per-device programs must not inherit a role's mesh context.
        with jax.set_mesh(None):
            out = _assemble(x, target, copy=copy)
    return out if target == dst else jax.device_put(out, dst)


def reshard_tree(values: Any, shardings: Any, *, copy: bool = False) -> Any:
    """``reshard`` over matching trees of arrays and shardings."""
    return jax.tree.map(lambda x, s: reshard(x, s, copy=copy), values, shardings)


def _assemble(x: jax.Array, dst: Sharding, *, copy: bool) -> jax.Array:
    shape = tuple(x.shape)
    by_device = {s.device.id: s.data for s in x.addressable_shards}
    devices = {d.id: d for d in dst.addressable_devices}
    blocks = []
    for plan in array_plan(x, dst):
        device = devices[plan.device]
        if plan.reuses_source_buffer:
            data = by_device[plan.device]
            blocks.append(jax.device_put(data, device, may_alias=False) if copy else data)
            continue
        parts = []
        offsets = []
        for piece in plan.pieces:
            local = tuple((a - s0, b - s0) for (a, b), (s0, _) in zip(piece.box, piece.src_box))
            part = by_device[piece.src_device]
            if local != tuple((0, n) for n in part.shape):
                part = _slice(part, tuple(a for a, _ in local), tuple(b for _, b in local))
            if piece.src_device != plan.device:
                part = jax.device_put(part, device)
            elif part is by_device[piece.src_device] and copy:
                part = jax.device_put(part, device, may_alias=False)
            parts.append(part)
            offsets.append(tuple(a - w0 for (a, _), (w0, _) in zip(piece.box, plan.box)))
        block_shape = tuple(b - a for a, b in plan.box)
        if len(parts) == 1 and tuple(parts[0].shape) == block_shape:
            blocks.append(parts[0])
        else:
            blocks.append(_place(tuple(parts), tuple(offsets), block_shape))
    return jax.make_array_from_single_device_arrays(shape, dst, blocks)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _slice(a: jax.Array, starts: tuple[int, ...], limits: tuple[int, ...]) -> jax.Array:
    # Static bounds: no index array is sent from the host.
    return jax.lax.slice(a, starts, limits)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _place(parts: tuple[jax.Array, ...], offsets: tuple[tuple[int, ...], ...], shape: tuple[int, ...]) -> jax.Array:
    out = jnp.zeros(shape, parts[0].dtype)
    for part, off in zip(parts, offsets):
        out = jax.lax.dynamic_update_slice(out, part, off)
    return out


def _intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def _box_size(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n
