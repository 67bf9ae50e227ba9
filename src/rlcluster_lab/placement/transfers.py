"""The log of what a reshard copied: the evidence the sync report (L3) counts from.

``TransferLog`` listens to the mover's ledger events (``placement.events``): every copy a
reshard makes, whichever strategy makes it, from which device, onto which, how many bytes, for
which leaf (inside ``events.listening(log)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from rlcluster_lab.placement.events import LEDGER, Built, Ran, Relayed, Transfer, TransferKind, Unreadable, emit


@dataclasses.dataclass
class TransferLog:
    """The transfers made while it listened.

    ``relayed`` (per leaf): bytes that crossed devices but did not stay as destination data
    where they crossed to. ``strategies``: the reshard strategies used. ``unreadable``:
    collectives whose bytes could not be read. ``compiled``: a program that ran meanwhile was
    compiled here.
    """

    transfers: list[Transfer] = dataclasses.field(default_factory=list)
    relayed: dict[str | None, int] = dataclasses.field(default_factory=dict)
    strategies: set[str] = dataclasses.field(default_factory=set)
    unreadable: list[tuple[str | None, str]] = dataclasses.field(default_factory=list)
    compiled: bool = False
    loaded: bool = False  # a program that ran meanwhile was read back from the persistent cache
    kinds = LEDGER

    def on(self, event: Any) -> None:
        """Take one ledger event (``placement.events.LEDGER``)."""
        if isinstance(event, Transfer):
            self.transfers.append(event)
        elif isinstance(event, Relayed) and event.nbytes > 0:
            self.relayed[event.leaf] = self.relayed.get(event.leaf, 0) + event.nbytes
        elif isinstance(event, Unreadable):
            self.unreadable.append((event.leaf, event.why))
        elif isinstance(event, Ran):
            self.strategies.add(event.strategy)
        elif isinstance(event, Built):
            self.compiled |= event.source == "compiled"
            self.loaded |= event.source != "compiled"


def shard_key(shard: Any) -> tuple[str, int, int]:
    """(platform, device id, buffer pointer): which buffer on which device a shard is.

    The platform is part of the key: a CPU device and an accelerator can both
    have id 0 in one process (simulated CPU devices beside a single chip).
    """
    return (shard.device.platform, shard.device.id, shard.data.unsafe_buffer_pointer())


def shard_keys(x: jax.Array) -> set[tuple[str, int, int]]:
    """``shard_key`` of every addressable shard of ``x``."""
    return {shard_key(s) for s in x.addressable_shards}


def log_new_shards(kind: TransferKind, before: jax.Array, after: jax.Array, label: str | None) -> set[int]:
    """Emit a transfer for each shard of ``after`` that is a new buffer (not ``before``'s); returns their devices."""
    old = shard_keys(before)
    new = [s for s in after.addressable_shards if shard_key(s) not in old]
    for s in new:
        emit(Transfer(kind, s.device.id, s.device.id, int(s.data.nbytes), label))
    return {s.device.id for s in new}
