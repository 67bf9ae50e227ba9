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
import numpy as np
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
    compiled: bool = False  # the copy programs for these shardings were built in this block

    @property
    def exact(self) -> bool:
        return not self.opaque_leaves


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


def shard_key(shard: Any) -> tuple[int, int]:
    """(device id, buffer pointer): which buffer on which device a shard is."""
    return (shard.device.id, shard.data.unsafe_buffer_pointer())


def shard_keys(x: jax.Array) -> set[tuple[int, int]]:
    """``shard_key`` of every addressable shard of ``x``."""
    return {shard_key(s) for s in x.addressable_shards}


def _log_shards(kind: TransferKind, before: jax.Array, after: jax.Array, label: str | None = None) -> set[int]:
    """Log the shards of ``after`` that are new buffers (not ``before``'s); returns their devices."""
    old = shard_keys(before)
    new = [s for s in after.addressable_shards if shard_key(s) not in old]
    log = _LOG.get()
    if log is not None:
        for s in new:
            log.transfers.append(Transfer(kind, s.device.id, s.device.id, int(s.data.nbytes), label if label is not None else log.leaf))
    return {s.device.id for s in new}


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
                have += box_size(inter)
        out.append(box_size(want) - have)
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


def reshard(x: jax.Array, dst: Sharding, *, copy: bool = False) -> jax.Array:
    """``x`` laid out as ``dst``, moving only device to device.

    The result reuses ``x`` when its sharding is already ``dst`` (unless
    ``copy``). A memory-kind change is applied after the layout change.
    """
    return reshard_many([x], [dst], copy=copy)[0]


def reshard_tree(values: Any, shardings: Any, *, copy: bool = False) -> Any:
    """``reshard`` over matching trees of arrays and shardings, in one batch."""
    leaves, treedef = jax.tree.flatten(values)
    dsts = treedef.flatten_up_to(shardings)
    return jax.tree.unflatten(treedef, reshard_many(leaves, dsts, copy=copy))


def reshard_many(
    xs: Sequence[jax.Array],
    dsts: Sequence[Sharding],
    *,
    copy: bool = False,
    labels: Sequence[str | None] | None = None,
) -> list[jax.Array]:
    """``reshard`` of many arrays at once; ``labels`` tag their transfers in the log.

    The decisions are made array by array (reuse, per-device copy, or
    assembly from pieces); the work of all arrays is then batched: one
    program per source device cuts every piece, one call moves every piece
    that crosses devices, one program per destination device assembles every
    block. A sync of a whole model is a handful of dispatches, not hundreds.
    """
    current = _LOG.get()
    default = current.leaf if current is not None else None
    labels = [default if lab is None else lab for lab in labels] if labels is not None else [default] * len(xs)
    out: list[jax.Array | None] = [None] * len(xs)
    if jax.default_backend() != "cpu":
        todo = [i for i, (x, d) in enumerate(zip(xs, dsts)) if x.sharding != d or copy]
        for i, (x, d) in enumerate(zip(xs, dsts)):
            if i not in todo:
                out[i] = x
            elif current is not None and x.sharding != d:
                current.opaque_leaves.append(labels[i])
        if todo:
            moved = jax.device_put([xs[i] for i in todo], [dsts[i] for i in todo], may_alias=False if copy else None)
            for i, y in zip(todo, moved):
                out[i] = y
                if xs[i].sharding == dsts[i]:
                    _log_shards("same_device", xs[i], y, labels[i])
        return out  # type: ignore[return-value]

    # Layout changes run in device memory; memory-kind changes are per-device
    # moves on either side of it, which the transfer guard allows.
    work = jax.devices()[0].default_memory().kind
    staged: dict[int, tuple[jax.Array, Sharding, bool]] = {}
    for i, (x, dst) in enumerate(zip(xs, dsts)):
        if x.sharding == dst:
            if not copy:
                out[i] = x
            else:
                staged[i] = (x, dst, False)
            continue
        staged[i] = (x, dst, x.sharding.memory_kind != work)
    to_work = [i for i, (x, _, moved) in staged.items() if moved]
    if to_work:
        for i, y in zip(to_work, _put([staged[i][0] for i in to_work],
                                      [staged[i][0].sharding.with_memory_kind(work) for i in to_work])):
            _log_shards("memory_kind", staged[i][0], y, labels[i])
            staged[i] = (y, staged[i][1], True)

    targets: dict[int, Sharding] = {}
    assemble: list[int] = []
    direct: list[int] = []
    for i, (x, dst, moved_kind) in staged.items():
        if x.sharding == dst:  # the forced copy of an unchanged sharding
            direct.append(i)
            targets[i] = dst
            continue
        target = dst.with_memory_kind(work) if dst.memory_kind != work else dst
        targets[i] = target
        (direct if x.sharding.is_equivalent_to(target, x.ndim) else assemble).append(i)
    # Devices whose destination shard of array i was made by a logged copy.
    produced: dict[int, set[int]] = {i: set() for i in staged}
    for i in direct:
        x, _, moved_kind = staged[i]
        y = jax.device_put(x, targets[i], may_alias=False) if copy and not moved_kind else jax.device_put(x, targets[i])
        produced[i] = _log_shards("same_device", x, y, labels[i])
        out[i] = y
    if assemble:
        # Per-device programs must not inherit a role's mesh context.
        with jax.set_mesh(None):
            built = _assemble_many([staged[i][0] for i in assemble], [targets[i] for i in assemble], copy,
                                   [labels[i] for i in assemble])
        for i, (y, made) in zip(assemble, built):
            out[i] = y
            produced[i] = made
    to_final = [i for i in staged if targets[i] != dsts[i]]
    if to_final:
        for i, y in zip(to_final, _put([out[i] for i in to_final], [dsts[i] for i in to_final])):
            _log_shards("memory_kind", out[i], y, labels[i])
            out[i] = y
    for i in staged:
        if out[i] is xs[i]:
            continue
        # A shard that carries the source's own data on its device but sits in a
        # new buffer (moved between memory kinds on the way) was copied within
        # its device: logged so that every destination byte is accounted for.
        _log_carried(xs[i], out[i], produced[i], labels[i])  # type: ignore[arg-type]
    return out  # type: ignore[return-value]


def log_cast(src: jax.Array, before: jax.Array, after: jax.Array, label: str | None) -> None:
    """A cast made new buffers out of ``before`` (a reshard of ``src``): log the shards that
    were still ``src``'s own buffers, which the cast turned into same-device copies."""
    log = _LOG.get()
    if log is None or before is after:
        return
    own = shard_keys(src)
    for s in before.addressable_shards:
        if shard_key(s) in own:
            log.transfers.append(Transfer("same_device", s.device.id, s.device.id, int(s.data.nbytes), label))


def _log_carried(src: jax.Array, out: jax.Array, produced: set[int], label: str | None) -> None:
    log = _LOG.get()
    if log is None:
        return
    src_keys = shard_keys(src)
    for s in out.addressable_shards:
        if shard_key(s) not in src_keys and s.device.id not in produced:
            log.transfers.append(Transfer("same_device", s.device.id, s.device.id, int(s.data.nbytes), label))


def _put(xs: list[Any], dsts: list[Any]) -> list[Any]:
    return list(jax.device_put(xs, dsts)) if xs else []


# A local piece is cut from a source shard on the block's own device; a
# remote piece arrives packed with the other pieces from the same device.
_LocalPiece = tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # input, starts, limits, offset
_RemotePiece = tuple[int, int, tuple[int, ...], tuple[int, ...]]  # pack, start in pack, shape, offset


@dataclasses.dataclass(frozen=True)
class _Block:
    array: int
    device: int
    shape: tuple[int, ...]
    dtype: Any
    local: tuple[_LocalPiece, ...]
    remote: tuple[_RemotePiece, ...]


@dataclasses.dataclass(frozen=True)
class _Program:
    """How a batch of arrays is resharded, worked out once per set of (shape, dtype, shardings).

    ``packs``: per (source device, destination device, dtype) the pieces
    that cross, as (array, starts, limits) cut from that device's shard,
    raveled and concatenated so they cross in one transfer. ``blocks``: per
    destination device, the blocks it assembles. ``reused``: (array, block
    position, device) of blocks that are a source shard as it is.
    """

    plans: tuple[tuple[BlockPlan, ...], ...]
    packs: tuple[tuple[int, int, Any, tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]], ...]
    blocks: tuple[tuple[int, tuple[tuple[int, int, _Block], ...], tuple[int, ...]], ...]
    reused: tuple[tuple[int, int, int], ...]
    whole: tuple[tuple[int, int, int, int], ...] = ()  # (array, block, src device, dst device)


def _program(key: tuple[tuple[tuple[int, ...], Any, Sharding, Sharding], ...]) -> _Program:
    plans = []
    for shape, _, src, dst in key:
        src_boxes = [(d.id, to_box(idx, shape)) for d, idx in src.devices_indices_map(shape).items()]
        dst_boxes = [(d.id, to_box(idx, shape)) for d, idx in dst.devices_indices_map(shape).items()]
        plans.append(tuple(plan_reshard(shape, src_boxes, dst_boxes)))
    packs: dict[tuple[int, int, Any], list[tuple[int, tuple[int, ...], tuple[int, ...]]]] = {}
    pack_fill: dict[tuple[int, int, Any], int] = {}
    per_device: dict[int, list[tuple[int, int, _Block]]] = {}
    reused = []
    whole = []
    for a, plan in enumerate(plans):
        dtype = key[a][1]
        for b, block in enumerate(plan):
            if block.reuses_source_buffer:
                reused.append((a, b, block.device))
                continue
            if len(block.pieces) == 1 and block.pieces[0].src_box == block.box:
                # A whole source shard from another device: it crosses as it is.
                whole.append((a, b, block.pieces[0].src_device, block.device))
                continue
            local, remote = [], []
            for piece in block.pieces:
                starts = tuple(lo - s0 for (lo, _), (s0, _) in zip(piece.box, piece.src_box))
                limits = tuple(hi - s0 for (_, hi), (s0, _) in zip(piece.box, piece.src_box))
                offset = tuple(lo - w0 for (lo, _), (w0, _) in zip(piece.box, block.box))
                if piece.src_device == block.device:
                    local.append((a, starts, limits, offset))
                else:
                    pk = (piece.src_device, block.device, dtype)
                    packs.setdefault(pk, []).append((a, starts, limits))
                    shape = tuple(hi - lo for lo, hi in zip(starts, limits))
                    remote.append((pk, pack_fill.get(pk, 0), shape, offset))
                    pack_fill[pk] = pack_fill.get(pk, 0) + box_size(piece.box)
            per_device.setdefault(block.device, []).append(
                (a, b, _Block(a, block.device, tuple(hi - lo for lo, hi in block.box), dtype, tuple(local), tuple(remote)))
            )
    pack_keys = list(packs)
    index = {pk: i for i, pk in enumerate(pack_keys)}
    blocks = []
    for dev, entries in per_device.items():
        fixed = []
        for a, b, blk in entries:
            remote = tuple((index[pk], start, shape, off) for pk, start, shape, off in blk.remote)
            fixed.append((a, b, dataclasses.replace(blk, remote=remote)))
        incoming = tuple(i for i, pk in enumerate(pack_keys) if pk[1] == dev)
        blocks.append((dev, tuple(fixed), incoming))
    return _Program(
        plans=tuple(plans),
        packs=tuple((pk[0], pk[1], pk[2], tuple(packs[pk])) for pk in pack_keys),
        blocks=tuple(blocks),
        reused=tuple(reused),
        whole=tuple(whole),
    )


@dataclasses.dataclass(frozen=True)
class _Schedule:
    """A ``_Program`` as the calls to make, everything static worked out once."""

    cuts: tuple[tuple[int, tuple[int, ...], Any, tuple[int, ...]], ...]  # src device, arrays, spec, pack ids
    pack_devices: tuple[int, ...]  # destination device of each pack
    pack_bytes: tuple[int, ...]
    cross_log: tuple[tuple[int, int, int, int], ...]  # src device, dst device, bytes, array
    places: tuple[tuple[int, tuple[int, ...], tuple[int, ...], Any, tuple[tuple[int, int], ...]], ...]
    same_log: tuple[tuple[int, int, int], ...]  # device, bytes, array
    reused: tuple[tuple[int, int, int], ...]
    whole: tuple[tuple[int, int, int, int], ...]  # (array, block, src device, dst device)
    made: tuple[frozenset[int], ...]  # per array: devices whose block is a new buffer (without forced copies)
    block_counts: tuple[int, ...]


@functools.lru_cache(maxsize=64)
def _schedule(key: tuple[tuple[tuple[int, ...], Any, Sharding, Sharding], ...]) -> _Schedule:
    prog = _program(key)
    by_src: dict[int, list[int]] = {}
    for i, (src_dev, _, _, _) in enumerate(prog.packs):
        by_src.setdefault(src_dev, []).append(i)
    cuts = []
    for src_dev, ids in by_src.items():
        arrays = tuple(sorted({a for i in ids for a, _, _ in prog.packs[i][3]}))
        slot = {a: k for k, a in enumerate(arrays)}
        spec = tuple(tuple((slot[a], st, lim) for a, st, lim in prog.packs[i][3]) for i in ids)
        cuts.append((src_dev, arrays, spec, tuple(ids)))
    cross_log = []
    pack_bytes = []
    for src_dev, dst_dev, dtype, pieces in prog.packs:
        itemsize = np.dtype(dtype).itemsize
        sizes = [box_size(tuple(zip(st, lim))) * itemsize for _, st, lim in pieces]
        pack_bytes.append(sum(sizes))
        cross_log.extend((src_dev, dst_dev, n, a) for (a, _, _), n in zip(pieces, sizes))
    places = []
    same_log = []
    for dev, entries, incoming in prog.blocks:
        arrays = tuple(sorted({blk.array for _, _, blk in entries if blk.local}))
        slot = {a: k for k, a in enumerate(arrays)}
        pslot = {i: k for k, i in enumerate(incoming)}
        spec = tuple(
            (blk.shape, str(np.dtype(blk.dtype)),
             tuple((slot[a], st, lim, off) for a, st, lim, off in blk.local),
             tuple((pslot[i], start, shape, off) for i, start, shape, off in blk.remote))
            for _, _, blk in entries
        )
        places.append((dev, arrays, tuple(incoming), spec, tuple((a, b) for a, b, _ in entries)))
        for a, _, blk in entries:
            itemsize = np.dtype(blk.dtype).itemsize
            same_log.extend((dev, box_size(tuple(zip(st, lim))) * itemsize, a) for _, st, lim, _ in blk.local)
    made = [{block.device for block in plan} for plan in prog.plans]
    for a, _, dev in prog.reused:
        made[a].discard(dev)
    return _Schedule(
        cuts=tuple(cuts),
        pack_devices=tuple(dst for _, dst, _, _ in prog.packs),
        pack_bytes=tuple(pack_bytes),
        cross_log=tuple(cross_log),
        places=tuple(places),
        same_log=tuple(same_log),
        reused=prog.reused,
        whole=prog.whole,
        made=tuple(frozenset(m) for m in made),
        block_counts=tuple(len(plan) for plan in prog.plans),
    )


def clear_programs() -> None:
    """Forget the compiled copy programs (the next reshard of a sharding set builds them again).

    Each program is compiled per device, and on the CPU backend every
    compiled kernel holds memory mappings of its own; a long session that
    builds many different clusters (the lab's rebuild button) releases them
    here, before the process runs into the kernel's limit on mappings.
    """
    _schedule.cache_clear()
    _cut_and_pack.clear_cache()
    _assemble_blocks.clear_cache()


def _assemble_many(
    xs: list[jax.Array], dsts: list[Sharding], copy: bool, labels: list[str | None]
) -> list[tuple[jax.Array, set[int]]]:
    log = _LOG.get()
    misses = _schedule.cache_info().misses
    sched = _schedule(tuple((tuple(x.shape), np.dtype(x.dtype), x.sharding, d) for x, d in zip(xs, dsts)))
    if log is not None and _schedule.cache_info().misses > misses:
        # New sharding pairs: their copy programs are compiled inside this call.
        log.compiled = True
    shards = [{s.device.id: s.data for s in x.addressable_shards} for x in xs]
    devices = {d.id: d for d in jax.devices()}

    # Phase 1: on each source device, one program cuts and packs what leaves it.
    packed: list[Any] = [None] * len(sched.pack_devices)
    for src_dev, arrays, spec, ids in sched.cuts:
        for i, y in zip(ids, _cut_and_pack(tuple(shards[a][src_dev] for a in arrays), spec)):
            packed[i] = y
    # Phase 2: every pack, and every whole shard that only changes device, crosses in one call.
    blocks: list[list[Any]] = [[None] * n for n in sched.block_counts]
    if packed or sched.whole:
        sent = [shards[a][src] for a, _, src, _ in sched.whole]
        arrived = list(jax.device_put(packed + sent, [devices[d] for d in sched.pack_devices]
                                      + [devices[dst] for _, _, _, dst in sched.whole]))
        packed = arrived[: len(packed)]
        # What crossed is the packs; each piece in them is logged under its leaf.
        assert [p.nbytes for p in packed] == list(sched.pack_bytes)
        if log is not None:
            log.transfers.extend(Transfer("cross_device", s, d, n, labels[a]) for s, d, n, a in sched.cross_log)
        for (a, b, src, dst), y in zip(sched.whole, arrived[len(packed):]):
            blocks[a][b] = y
            if log is not None:
                log.transfers.append(Transfer("cross_device", src, dst, int(y.nbytes), labels[a]))
    # Phase 3: on each destination device, one program assembles its blocks.
    for dev, arrays, incoming, spec, where in sched.places:
        outs = _assemble_blocks(tuple(shards[a][dev] for a in arrays), tuple(packed[i] for i in incoming), spec)
        for (a, b), y in zip(where, outs):
            blocks[a][b] = y
    if log is not None:
        log.transfers.extend(Transfer("same_device", d, d, n, labels[a]) for d, n, a in sched.same_log)
    made = [set(m) for m in sched.made]
    for a, b, dev in sched.reused:
        data = shards[a][dev]
        if copy:
            data = jax.device_put(data, devices[dev], may_alias=False)
            made[a].add(dev)
            if log is not None:
                log.transfers.append(Transfer("same_device", dev, dev, int(data.nbytes), labels[a]))
        blocks[a][b] = data
    return [
        (jax.make_array_from_single_device_arrays(tuple(x.shape), dst, blocks[a]), made[a])
        for a, (x, dst) in enumerate(zip(xs, dsts))
    ]


@functools.partial(jax.jit, static_argnums=(1,))
def _cut_and_pack(inputs: tuple[jax.Array, ...], spec: Any) -> tuple[jax.Array, ...]:
    # Static bounds: no index array is sent from the host.
    out = []
    for pieces in spec:
        parts = [jax.lax.slice(inputs[k], st, lim).reshape(-1) for k, st, lim in pieces]
        out.append(parts[0] if len(parts) == 1 else jnp.concatenate(parts))
    return tuple(out)


@functools.partial(jax.jit, static_argnums=(2,))
def _assemble_blocks(locals_: tuple[jax.Array, ...], packs: tuple[jax.Array, ...], spec: Any) -> tuple[jax.Array, ...]:
    out = []
    for shape, dtype, local, remote in spec:
        block = jnp.zeros(shape, dtype)
        for k, st, lim, off in local:
            block = jax.lax.dynamic_update_slice(block, jax.lax.slice(locals_[k], st, lim), off)
        for k, start, piece_shape, off in remote:
            n = 1
            for d in piece_shape:
                n *= d
            piece = jax.lax.slice(packs[k], (start,), (start + n,)).reshape(piece_shape)
            block = jax.lax.dynamic_update_slice(block, piece, off)
        out.append(block)
    return tuple(out)


def _intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def box_size(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n
