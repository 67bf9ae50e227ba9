"""The ``minimal`` reshard strategy: every destination shard assembled on its own device.

Each destination shard is built on its device from the overlapping pieces of source shards
(``boxes.plan_reshard``), preferring a copy already there, so only the bytes a device lacks
cross: the least any reshard can move at slice granularity. Batched per tree: one program
per source device cuts and packs what leaves it, one transfer call moves every pack (and
every whole shard that only changes device), one program per destination device assembles
its blocks; the schedule is worked out once per set of shardings and every copy is logged.
Its price is two small programs per device per new set of shardings, hence ``xla`` is the
default.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Sharding

from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.placement import phases
from rlcluster_lab.placement.boxes import box_size, plan_reshard, to_box
from rlcluster_lab.placement.programs import cleared_with_programs
from rlcluster_lab.placement.transfers import Transfer, current_log

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Schedule:
    """How a batch of arrays is resharded: the calls to make, everything static worked out once.

    A pack is the pieces one source device sends one destination device (of one dtype),
    raveled and concatenated so they cross in one transfer.
    """

    cuts: tuple[tuple[int, tuple[int, ...], Any, tuple[int, ...]], ...]  # src device, arrays, spec, pack ids
    pack_devices: tuple[int, ...]  # destination device of each pack
    pack_bytes: tuple[int, ...]
    cross_log: tuple[tuple[int, int, int, int], ...]  # src device, dst device, bytes, array
    places: tuple[tuple[int, tuple[int, ...], tuple[int, ...], Any, tuple[tuple[int, int], ...]], ...]
    same_log: tuple[tuple[int, int, int], ...]  # device, bytes, array
    reused: tuple[tuple[int, int, int], ...]  # (array, block, device): a source shard as it is
    whole: tuple[tuple[int, int, int, int], ...]  # (array, block, src device, dst device)
    made: tuple[frozenset[int], ...]  # per array: devices whose block is a new buffer (without forced copies)
    block_counts: tuple[int, ...]


@functools.lru_cache(maxsize=32)
def _schedule(key: tuple[tuple[Shape, Any, Sharding, Sharding], ...]) -> _Schedule:
    plans = []
    for shape, _, src, dst in key:
        src_boxes = [(d.id, to_box(idx, shape)) for d, idx in src.devices_indices_map(shape).items()]
        dst_boxes = [(d.id, to_box(idx, shape)) for d, idx in dst.devices_indices_map(shape).items()]
        # Looked up on the module, so a test can swap in another planner.
        plans.append(plan_reshard(shape, src_boxes, dst_boxes))
    packs: dict[tuple[int, int, Any], list[tuple[int, Shape, Shape]]] = {}  # (array, starts, limits)
    fill: dict[tuple[int, int, Any], int] = {}
    # Per destination device, its blocks: (array, block, shape, dtype, local pieces, remote pieces).
    # A local piece is cut from a source shard on the block's own device; a remote one arrives packed.
    per_device: dict[int, list[tuple[int, int, Shape, Any, list[Any], list[Any]]]] = {}
    reused, whole = [], []
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
                    remote.append((pk, fill.get(pk, 0), tuple(hi - lo for lo, hi in zip(starts, limits)), offset))
                    fill[pk] = fill.get(pk, 0) + box_size(piece.box)
            shape = tuple(hi - lo for lo, hi in block.box)
            per_device.setdefault(block.device, []).append((a, b, shape, dtype, local, remote))
    pack_keys = list(packs)
    cuts = []
    for src_dev in dict.fromkeys(pk[0] for pk in pack_keys):
        ids = tuple(i for i, pk in enumerate(pack_keys) if pk[0] == src_dev)
        arrays = tuple(sorted({a for i in ids for a, _, _ in packs[pack_keys[i]]}))
        slot = {a: k for k, a in enumerate(arrays)}
        spec = tuple(tuple((slot[a], st, lim) for a, st, lim in packs[pack_keys[i]]) for i in ids)
        cuts.append((src_dev, arrays, spec, ids))
    cross_log, pack_bytes = [], []
    for (src_dev, dst_dev, dtype), pieces in packs.items():
        sizes = [box_size(tuple(zip(st, lim))) * np.dtype(dtype).itemsize for _, st, lim in pieces]
        pack_bytes.append(sum(sizes))
        cross_log.extend((src_dev, dst_dev, n, a) for (a, _, _), n in zip(pieces, sizes))
    places, same_log = [], []
    for dev, entries in per_device.items():
        incoming = tuple(i for i, pk in enumerate(pack_keys) if pk[1] == dev)
        arrays = tuple(sorted({a for a, _, _, _, local, _ in entries if local}))
        slot = {a: k for k, a in enumerate(arrays)}
        pslot = {pack_keys[i]: k for k, i in enumerate(incoming)}
        spec = tuple(
            (
                shape,
                str(np.dtype(dtype)),
                tuple((slot[a], st, lim, off) for a, st, lim, off in local),
                tuple((pslot[pk], start, piece_shape, off) for pk, start, piece_shape, off in remote),
            )
            for _, _, shape, dtype, local, remote in entries
        )
        places.append((dev, arrays, incoming, spec, tuple((a, b) for a, b, *_ in entries)))
        for a, _, _, dtype, local, _ in entries:
            itemsize = np.dtype(dtype).itemsize
            same_log.extend((dev, box_size(tuple(zip(st, lim))) * itemsize, a) for _, st, lim, _ in local)
    return _Schedule(
        cuts=tuple(cuts),
        pack_devices=tuple(dst for _, dst, _ in pack_keys),
        pack_bytes=tuple(pack_bytes),
        cross_log=tuple(cross_log),
        places=tuple(places),
        same_log=tuple(same_log),
        reused=tuple(reused),
        whole=tuple(whole),
        made=tuple(frozenset(bl.device for bl in plan if not bl.reuses_source_buffer) for plan in plans),
        block_counts=tuple(len(plan) for plan in plans),
    )


@cleared_with_programs
def clear() -> None:
    """Forget the per-device copy programs (the next reshard of a sharding set builds them again)."""
    _schedule.cache_clear()
    _cut_and_pack.clear_cache()
    _assemble_blocks.clear_cache()


def assemble_many(
    xs: list[jax.Array], dsts: list[Sharding], copy: bool, labels: list[str | None]
) -> list[tuple[jax.Array, set[int]]]:
    with count_compilations() as built:
        out = _assemble(xs, dsts, copy, labels)
    log = current_log()
    if log is not None:
        # The per-device copy programs of new sharding pairs are built inside this call.
        log.compiled |= any(not cached for _, _, cached in built)
        log.loaded |= any(cached for _, _, cached in built)
    return out


def _assemble(
    xs: list[jax.Array], dsts: list[Sharding], copy: bool, labels: list[str | None]
) -> list[tuple[jax.Array, set[int]]]:
    log = current_log()
    sched = _schedule(tuple((tuple(x.shape), np.dtype(x.dtype), x.sharding, d) for x, d in zip(xs, dsts)))
    shards = [{s.device.id: s.data for s in x.addressable_shards} for x in xs]
    # The arrays' own devices (one platform per sharding), never the default backend's.
    devices = {d.id: d for x, dst in zip(xs, dsts) for d in (*x.sharding.device_set, *dst.device_set)}

    # Phase 1: on each source device, one program cuts and packs what leaves it.
    packed: list[Any] = [None] * len(sched.pack_devices)
    for src_dev, arrays, spec, ids in sched.cuts:
        for i, y in zip(ids, _cut_and_pack(tuple(shards[a][src_dev] for a in arrays), spec)):
            packed[i] = y
    phases.made(packed, phases.IN_FLIGHT)
    # Phase 2: every pack, and every whole shard that only changes device, crosses in one call.
    blocks: list[list[Any]] = [[None] * n for n in sched.block_counts]
    if packed or sched.whole:
        sent = [shards[a][src] for a, _, src, _ in sched.whole]
        arrived = list(
            jax.device_put(
                packed + sent, [devices[d] for d in sched.pack_devices] + [devices[dst] for _, _, _, dst in sched.whole]
            )
        )
        phases.made(arrived, phases.IN_FLIGHT)
        phases.phase("move")
        packed = arrived[: len(packed)]
        # What crossed is the packs; each piece in them is logged under its leaf.
        assert [p.nbytes for p in packed] == list(sched.pack_bytes)
        if log is not None:
            log.transfers.extend(Transfer("cross_device", s, d, n, labels[a]) for s, d, n, a in sched.cross_log)
        for (a, b, src, dst), y in zip(sched.whole, arrived[len(packed) :]):
            blocks[a][b] = y
            if log is not None:
                log.transfers.append(Transfer("cross_device", src, dst, int(y.nbytes), labels[a]))
    # Phase 3: on each destination device, one program assembles its blocks.
    for dev, arrays, incoming, spec, where in sched.places:
        outs = _assemble_blocks(tuple(shards[a][dev] for a in arrays), tuple(packed[i] for i in incoming), spec)
        phases.made(outs, phases.RESHARDED)
        for (a, b), y in zip(where, outs):
            blocks[a][b] = y
    if log is not None:
        log.transfers.extend(Transfer("same_device", d, d, n, labels[a]) for d, n, a in sched.same_log)
    made = [set(m) for m in sched.made]
    for a, b, dev in sched.reused:
        data = shards[a][dev]
        if copy:
            data = jax.device_put(data, devices[dev], may_alias=False)
            phases.made([data], phases.RESHARDED)
            made[a].add(dev)
            if log is not None:
                log.transfers.append(Transfer("same_device", dev, dev, int(data.nbytes), labels[a]))
        blocks[a][b] = data
    # Every block is assembled while the packs that fed it are still held.
    phases.phase("reshard")
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
            piece = jax.lax.slice(packs[k], (start,), (start + math.prod(piece_shape),)).reshape(piece_shape)
            block = jax.lax.dynamic_update_slice(block, piece, off)
        out.append(block)
    return tuple(out)
