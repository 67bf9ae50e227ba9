"""Which buffer a shard is, and the copies a step made as ledger events (``placement.events``):
whoever listens (the sync report's ``measure.sync.TransferLog``, L3's evidence) records them.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from rlcluster_lab.placement.events import Transfer, TransferKind, emit


def shard_key(shard: Any) -> tuple[str, int, int]:
    """(platform, device id, buffer pointer): which buffer on which device a shard is.

    The platform is part of the key: a CPU device and an accelerator can both
    have id 0 in one process (simulated CPU devices beside a single chip).
    """
    return (shard.device.platform, shard.device.id, shard.data.unsafe_buffer_pointer())


def shard_bytes(shard: Any) -> int:
    """Bytes a shard's buffer holds: its shape times the item size (what ``nbytes`` gives, at a
    tenth of the cost; the measurements read it for every shard of every sync)."""
    data = shard.data
    return math.prod(data.shape) * data.dtype.itemsize


def shard_keys(x: jax.Array) -> set[tuple[str, int, int]]:
    """``shard_key`` of every addressable shard of ``x``."""
    return {shard_key(s) for s in x.addressable_shards}


def log_new_shards(kind: TransferKind, before: jax.Array, after: jax.Array, label: str | None) -> set[int]:
    """Emit a transfer for each shard of ``after`` that is a new buffer (not ``before``'s); returns their devices."""
    old = shard_keys(before)
    new = [s for s in after.addressable_shards if shard_key(s) not in old]
    for s in new:
        emit(Transfer(kind, s.device.id, s.device.id, shard_bytes(s), label))
    return {s.device.id for s in new}
