"""Which buffer a shard is, and the copies a step made as ledger events (``placement.events``):
whoever listens (the sync report's ``measure.sync.TransferLog``, L3's evidence) records them.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax

from rlcluster_lab.core.states import WhileAlive
from rlcluster_lab.placement.events import Transfer, TransferKind, emit

Key = tuple[str, int, int]  # (platform, device id, buffer pointer)


def shard_key(shard: Any) -> Key:
    """(platform, device id, buffer pointer): which buffer on which device a shard is."""
    return buffer_key(shard.device, shard.data)


def buffer_key(device: Any, data: jax.Array) -> Key:
    """``shard_key`` of the single-device array ``data`` on ``device`` (the platform is part of it: a
    CPU device and a chip can both have id 0)."""
    return (device.platform, device.id, data.unsafe_buffer_pointer())


def buffer_bytes(data: jax.Array) -> int:
    """Bytes a single-device array's buffer holds: its shape times the item size (what ``nbytes``
    gives, at a tenth of the cost; the measurements read it for every shard of every sync)."""
    return math.prod(data.shape) * data.dtype.itemsize


def shard_buffers(x: jax.Array) -> tuple[tuple[Key, int], ...]:
    """(``shard_key``, bytes) of each addressable shard of ``x``, in shard order, read once while the
    array lives (its buffers never change)."""
    hit = _BUFFERS.get(x)
    if hit is None or x.is_deleted():
        hit = tuple((buffer_key(d, a), buffer_bytes(a)) for d, a in shard_data(x))
        _BUFFERS.put(x, hit)
    return hit


def shard_data(x: jax.Array) -> list[tuple[Any, jax.Array]]:
    """(device, single-device array) of each addressable shard of ``x``, in shard order: the buffers
    ``x.addressable_shards`` holds, from the array's own list (a third of the cost of building the
    ``Shard`` objects); an array without such a list has its shards read."""
    arrays = getattr(x, "_arrays", None)  # jax.Array's buffers in shard order (not public)
    if arrays is None:
        return [(s.device, s.data) for s in x.addressable_shards]
    return list(zip(shard_devices(x.sharding, tuple(x.shape)), arrays))


_BUFFERS = WhileAlive()  # array -> its shard_buffers


@functools.lru_cache(maxsize=1024)
def shard_devices(sharding: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """The devices of the addressable shards of an array of ``shape`` laid out by ``sharding``,
    in shard order (the sharding's own device order)."""
    return tuple(sharding.addressable_devices_indices_map(shape))


def shard_keys(x: jax.Array) -> set[Key]:
    """``shard_key`` of every addressable shard of ``x``."""
    return {key for key, _ in shard_buffers(x)}


def log_new_shards(kind: TransferKind, before: jax.Array, after: jax.Array, label: str | None) -> set[int]:
    """Emit a transfer for each shard of ``after`` that is a new buffer (not ``before``'s); returns their devices."""
    old = shard_keys(before)
    new = [(key, n) for key, n in shard_buffers(after) if key not in old]
    log_within_devices(kind, new, label)
    return {key[1] for key, _ in new}


def log_within_devices(kind: TransferKind, buffers: Any, label: str | None) -> None:
    """Emit a transfer within its device for each (``shard_key``, bytes) of ``buffers``."""
    for (_, device, _), n in buffers:
        emit(Transfer(kind, device, device, n, label))
