"""The log of what a reshard copied: the evidence the sync report (L3) counts from.

Every copy a reshard makes, whichever strategy makes it, is recorded inside a
``record_transfers()`` block: from which device, onto which, how many bytes, for which leaf.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar

import jax

from rlcluster_lab.placement.phases import bound

TransferKind = Literal["cross_device", "same_device", "memory_kind"]


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One copy a reshard made: ``nbytes`` physical bytes into a buffer on ``dst_device``:
    ``cross_device`` (from another device), ``same_device`` (from data already there) or
    ``memory_kind`` (between a device's own memories)."""

    kind: TransferKind
    src_device: int
    dst_device: int
    nbytes: int
    leaf: str | None


@dataclasses.dataclass
class TransferLog:
    """The transfers made inside one ``record_transfers`` block.

    ``relayed`` (per leaf): bytes that crossed devices but did not stay as destination data
    where they crossed to. ``strategies``: the reshard strategies used. ``unreadable``:
    collectives whose bytes could not be read. ``compiled``: a program this block ran was
    compiled here.
    """

    transfers: list[Transfer] = dataclasses.field(default_factory=list)
    relayed: dict[str | None, int] = dataclasses.field(default_factory=dict)
    strategies: set[str] = dataclasses.field(default_factory=set)
    unreadable: list[tuple[str | None, str]] = dataclasses.field(default_factory=list)
    leaf: str | None = None
    compiled: bool = False
    loaded: bool = False  # a program this block ran was read back from the persistent cache

    @property
    def exact(self) -> bool:
        return not self.unreadable

    def note_built(self, source: str) -> None:
        """A program this block ran was built here: compiled, or read from the persistent cache."""
        if source == "compiled":
            self.compiled = True
        else:
            self.loaded = True

    def note_relayed(self, leaf: str | None, nbytes: int) -> None:
        """Bytes of ``leaf`` that crossed devices and did not stay (nothing when ``nbytes`` <= 0)."""
        if nbytes > 0:
            self.relayed[leaf] = self.relayed.get(leaf, 0) + nbytes


_LOG: contextvars.ContextVar[TransferLog | None] = contextvars.ContextVar("rlcluster_lab_transfer_log", default=None)


def current_log() -> TransferLog | None:
    """The log of the innermost ``record_transfers`` block, if any."""
    return _LOG.get()


def record_transfers() -> contextlib.AbstractContextManager[TransferLog]:
    """Log every copy ``reshard`` makes inside the block."""
    return bound(_LOG, TransferLog())  # type: ignore[return-value]


def not_recorded() -> contextlib.AbstractContextManager[None]:
    """Make no log entries inside the block (a caller that already knows them adds them)."""
    return bound(_LOG, None)  # type: ignore[return-value]


T = TypeVar("T")


def replay_log(cache: Any, key: Any, run: Callable[[], T]) -> T:
    """``run()`` inside the current log, recording its copies only the first time for ``key``.

    The same arrays' shapes and shardings onto the same destinations make the same copies, so
    the log of the first run is kept in ``cache`` (``get``/``put``) and added to the current
    log again on every later run, which runs unrecorded: the per-shard bookkeeping is paid once.
    """
    current = _LOG.get()
    known: TransferLog | None = cache.get(key)
    if known is None:
        with record_transfers() as known:
            out = run()
        cache.put(key, known)
        current.compiled |= known.compiled
        current.loaded |= known.loaded
    else:
        with not_recorded():
            out = run()
    current.transfers.extend(known.transfers)
    for leaf, n in known.relayed.items():
        current.note_relayed(leaf, n)
    current.unreadable.extend(known.unreadable)
    current.strategies.update(known.strategies)
    return out


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


def shard_key(shard: Any) -> tuple[str, int, int]:
    """(platform, device id, buffer pointer): which buffer on which device a shard is.

    The platform is part of the key: a CPU device and an accelerator can both
    have id 0 in one process (simulated CPU devices beside a single chip).
    """
    return (shard.device.platform, shard.device.id, shard.data.unsafe_buffer_pointer())


def shard_keys(x: jax.Array) -> set[tuple[str, int, int]]:
    """``shard_key`` of every addressable shard of ``x``."""
    return {shard_key(s) for s in x.addressable_shards}


def log_new_shards(kind: TransferKind, before: jax.Array, after: jax.Array, label: str | None = None) -> set[int]:
    """Log the shards of ``after`` that are new buffers (not ``before``'s); returns their devices."""
    old = shard_keys(before)
    new = [s for s in after.addressable_shards if shard_key(s) not in old]
    log = _LOG.get()
    if log is not None:
        for s in new:
            log.transfers.append(
                Transfer(kind, s.device.id, s.device.id, int(s.data.nbytes), label if label is not None else log.leaf)
            )
    return {s.device.id for s in new}
