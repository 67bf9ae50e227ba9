"""What a layout change did, as one stream of typed events, and who listens to it.

The mover only ``emit``s: the arrays a step made, each point where it holds the most
(``Phase``), every copy and the ledger's notes (``LEDGER``). Instruments listen inside
``listening(...)``; work done only to describe an event is guarded by ``wants(kind)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

import jax

TransferKind = Literal["cross_device", "same_device", "memory_kind"]


@dataclasses.dataclass(frozen=True)
class Made:
    """The mover made these arrays (or re-labelled others) as ``term`` (``placement.phases``)."""

    arrays: Sequence[jax.Array]
    term: str


@dataclasses.dataclass(frozen=True)
class Phase:
    """The mover holds the most it will before it drops something; ``programs``: (device ids,
    temporary bytes per device) of each compiled program that ran since the last phase."""

    name: str
    programs: Sequence[tuple[tuple[int, ...], int]] = ()


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One copy of ``nbytes`` physical bytes into a buffer on ``dst_device``: ``cross_device``,
    ``same_device`` (from data already there) or ``memory_kind`` (between a device's memories)."""

    kind: TransferKind
    src_device: int
    dst_device: int
    nbytes: int
    leaf: str | None


@dataclasses.dataclass(frozen=True)
class Relayed:
    """Bytes of ``leaf`` that crossed devices but did not stay where they crossed to."""

    leaf: str | None
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """A collective whose bytes could not be read, and why."""

    leaf: str | None
    why: str


@dataclasses.dataclass(frozen=True)
class Ran:
    """A reshard strategy (``xla`` or ``minimal``) changed a layout."""

    strategy: str


@dataclasses.dataclass(frozen=True)
class Built:
    """A program the mover ran was built now: ``compiled``, or read from the persistent cache."""

    source: str


@dataclasses.dataclass(frozen=True)
class Routed:
    """A reshard ran this route (``placement.route.Route``): the plan the sync report prints."""

    route: Any


LEDGER = frozenset({Transfer, Relayed, Unreadable, Ran, Built, Routed})


class Listener(Protocol):
    """Takes the events of ``kinds`` emitted inside its ``listening`` block."""

    kinds: frozenset[type]

    def on(self, event: Any) -> None: ...


_LISTENERS: contextvars.ContextVar[tuple[tuple[Listener, frozenset[type]], ...]] = contextvars.ContextVar(
    "rlcluster_lab_placement_listeners", default=()
)


def wants(kind: type) -> bool:
    """Someone listens to events of ``kind`` here (describe them only then)."""
    return any(kind in kinds for _, kinds in _LISTENERS.get())


def emit(event: Any) -> None:
    """Hand ``event`` to every listener that takes its kind."""
    for listener, kinds in _LISTENERS.get():
        if type(event) in kinds:
            listener.on(event)


@contextlib.contextmanager
def listening(*listeners: Listener, instead: frozenset[type] = frozenset()) -> Iterator[None]:
    """``listeners`` hear their kinds inside the block, beside the ones already listening; the
    kinds in ``instead`` go to ``listeners`` alone (the outer ones do not hear them)."""
    outer = tuple((listener, kinds - instead) for listener, kinds in _LISTENERS.get())
    token = _LISTENERS.set(outer + tuple((listener, frozenset(listener.kinds)) for listener in listeners))
    try:
        yield
    finally:
        _LISTENERS.reset(token)
