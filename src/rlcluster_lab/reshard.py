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

Every copy the CPU path makes can be recorded (``record_transfers``): the
weight sync's report (L3) counts what was really copied from this log, not
from the plan, so a reshard that moved more than it needed would show it.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any, Literal

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


TransferKind = Literal["cross_device", "same_device", "memory_kind"]


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One copy a reshard made: ``nbytes`` physical bytes into a new buffer on ``dst_device``.

    ``cross_device``: the bytes came from another device. ``same_device``: a
    new buffer made from data already on that device (a slice, an assembled
    block, a forced copy). ``memory_kind``: a move between a device's own
    memories (device <-> pinned host).
    """

    kind: TransferKind
    src_device: int
    dst_device: int
    nbytes: int
    leaf: str | None


@dataclasses.dataclass
class TransferLog:
    """The transfers made inside one ``record_transfers`` block.

    ``exact`` turns False when some leaf went through ``jax.device_put``
    between different layouts (GPU, TPU), whose inner copies are not visible
    here; the sync report then says its numbers are inferred from placement.
    """

    transfers: list[Transfer] = dataclasses.field(default_factory=list)
    opaque_leaves: list[str | None] = dataclasses.field(default_factory=list)
    leaf: str | None = None

    @property
    def exact(self) -> bool:
        return not self.opaque_leaves

    def add(self, kind: TransferKind, src_device: int, dst_device: int, nbytes: int) -> None:
        self.transfers.append(Transfer(kind, src_device, dst_device, int(nbytes), self.leaf))


_LOG: contextvars.ContextVar[TransferLog | None] = contextvars.ContextVar("rlcluster_lab_transfer_log", default=None)


@contextlib.contextmanager
def record_transfers() -> Iterator[TransferLog]:
    """Log every copy ``reshard`` makes inside the block."""
    log = TransferLog()
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


@contextlib.contextmanager
def leaf_label(label: str) -> Iterator[None]:
    """Tag the transfers made inside the block with a leaf path."""
    log = _LOG.get()
    if log is None:
        yield
        return
    prev, log.leaf = log.leaf, label
    try:
        yield
    finally:
        log.leaf = prev


def _log_shards(kind: TransferKind, before: jax.Array, after: jax.Array) -> None:
    """Log the shards of ``after`` that are new buffers (not ``before``'s), device by device."""
    log = _LOG.get()
    if log is None:
        return
    old = {(s.device.id, s.data.unsafe_buffer_pointer()) for s in before.addressable_shards}
    for s in after.addressable_shards:
        if (s.device.id, s.data.unsafe_buffer_pointer()) not in old:
            log.add(kind, s.device.id, s.device.id, s.data.nbytes)


def minimum_cross_device_elements(
    src_boxes: Sequence[tuple[int, Box]], dst_boxes: Sequence[tuple[int, Box]]
) -> list[int]:
    """Per destination shard: elements that no source shard on its own device holds.

    Shards of one sharding are equal or disjoint, so a device's own source
    shards are one box, and what it lacks is its destination box minus the
    intersection with that box. This is the least any reshard must move.
    """
    local: dict[int, list[Box]] = {}
    for dev, box in src_boxes:
        local.setdefault(dev, []).append(box)
    out = []
    for dev, want in dst_boxes:
        have = 0
        for box in dict.fromkeys(local.get(dev, [])):
            inter = _intersect(box, want)
            if inter is not None:
                have += _box_size(inter)
        out.append(_box_size(want) - have)
    return out


def shard_boxes(x: jax.Array) -> list[tuple[int, Box]]:
    """(device id, box) of every addressable shard of ``x``."""
    shape = tuple(x.shape)
    return [(s.device.id, to_box(s.index, shape)) for s in x.addressable_shards]


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
    src = shard_boxes(x)
    dst_map = dst.addressable_devices_indices_map(shape)
    dst_boxes = [(d.id, to_box(idx, shape)) for d, idx in dst_map.items()]
    return plan_reshard(shape, src, dst_boxes)


def reshard(x: jax.Array, dst: Sharding, *, copy: bool = False) -> jax.Array:
    """``x`` laid out as ``dst``, moving only device to device.

    The result reuses ``x`` when its sharding is already ``dst`` (unless
    ``copy``). A memory-kind change is applied after the layout change.
    """
    if x.sharding == dst:
        if not copy:
            return x
        out = jax.device_put(x, dst, may_alias=False)
        _log_shards("same_device", x, out)
        return out
    if jax.default_backend() != "cpu":
        log = _LOG.get()
        if log is not None:
            log.opaque_leaves.append(log.leaf)
        return jax.device_put(x, dst, may_alias=False if copy else None)
    # Layout changes run in device memory; memory-kind changes are per-device
    # moves on either side of it, which the transfer guard allows.
    work = jax.devices()[0].default_memory().kind
    moved_kind = x.sharding.memory_kind != work
    if moved_kind:
        src = x
        x = jax.device_put(x, x.sharding.with_memory_kind(work))
        _log_shards("memory_kind", src, x)
    target = dst.with_memory_kind(work) if dst.memory_kind != work else dst
    if x.sharding.is_equivalent_to(target, x.ndim):
        out = jax.device_put(x, target, may_alias=False) if copy and not moved_kind else jax.device_put(x, target)
        _log_shards("same_device", x, out)
    else:
        # Per-device programs must not inherit a role's mesh context.
        with jax.set_mesh(None):
            out = _assemble(x, target, copy=copy)
    if target == dst:
        return out
    final = jax.device_put(out, dst)
    _log_shards("memory_kind", out, final)
    return final


def reshard_tree(values: Any, shardings: Any, *, copy: bool = False) -> Any:
    """``reshard`` over matching trees of arrays and shardings."""
    return jax.tree.map(lambda x, s: reshard(x, s, copy=copy), values, shardings)


def _assemble(x: jax.Array, dst: Sharding, *, copy: bool) -> jax.Array:
    shape = tuple(x.shape)
    by_device = {s.device.id: s.data for s in x.addressable_shards}
    devices = {d.id: d for d in dst.addressable_devices}
    log = _LOG.get()
    blocks = []
    for plan in array_plan(x, dst):
        device = devices[plan.device]
        if plan.reuses_source_buffer:
            data = by_device[plan.device]
            if copy:
                data = jax.device_put(data, device, may_alias=False)
                if log is not None:
                    log.add("same_device", plan.device, plan.device, data.nbytes)
            blocks.append(data)
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
            if log is not None:
                # A piece from this device is copied into the new block; one from
                # another device crossed over. The bytes of the array really moved.
                kind = "same_device" if piece.src_device == plan.device else "cross_device"
                log.add(kind, piece.src_device, plan.device, part.nbytes)
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
