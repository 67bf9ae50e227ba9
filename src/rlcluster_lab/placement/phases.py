"""The points where a reshard can be watched for memory: what it made, and when it holds the most.

The reshard tells a ``Probe`` (the sync's observer, ``measure.sync``) which arrays it made and
when it holds the most it will before dropping something (``phase``), with the temporaries
of the programs that ran since; the probe decides what is alive and counts buffers. Without
a probe these calls cost one context-variable read each.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import jax

# What an array is, for the figures of a sync's peak: which role it belongs to and why it exists.
STAGED = "staged source"  # the actor's leaves brought from pinned host to device memory (offload)
IN_FLIGHT = "in flight"  # a program's result on the source devices, before its shards cross
RESHARDED = "new rollout arrays"  # the destination layout, in device memory
MEMORY_KIND = "new rollout arrays (pinned host)"  # moved to the destination's memory kind
CAST = "cast"  # the rollout dtype, made on the destination devices
ANCHOR = "new anchor"  # the anchor re-pinned (P8)
RELEASED = "released"  # old arrays the sync replaced and nothing holds any more (negative)
PINNED = " (pinned host)"  # the suffix of a term counted in pinned host memory
TERMS = (STAGED, IN_FLIGHT, RESHARDED, MEMORY_KIND, CAST, ANCHOR, RELEASED)


def term_in(term: str, kind: str) -> str:
    """The term as the figures split it by memory kind: a new rollout array in pinned host is
    ``MEMORY_KIND``; a cast or a release there carries ``PINNED``; the anchor is pinned by nature."""
    if kind != "pinned_host" or term in (MEMORY_KIND, ANCHOR) or term.endswith(PINNED):
        return term
    return MEMORY_KIND if term == RESHARDED else term + PINNED


class Probe(Protocol):
    """Watches a reshard's memory (implemented by the sync's observer)."""

    def made(self, arrays: Iterable[jax.Array], term: str) -> None:
        """The reshard made these arrays (or re-labelled others): they count while alive."""

    def phase(self, name: str, programs: Sequence[tuple[tuple[int, ...], int]] = ()) -> None:
        """The reshard holds the most it will before it drops something.

        ``programs``: (device ids, temporary bytes per device) of every compiled
        program that ran since the last point (its memory analysis).
        """


_PROBE: contextvars.ContextVar[Probe | None] = contextvars.ContextVar("rlcluster_lab_memory_probe", default=None)
T = TypeVar("T")


@contextlib.contextmanager
def bound(var: contextvars.ContextVar[T], value: T) -> Iterator[T]:
    """``var`` set to ``value`` inside the block (placement's settings are context variables)."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def current_probe() -> Probe | None:
    """The probe of the innermost ``probing`` block, if any."""
    return _PROBE.get()


def probing(probe: Probe | None) -> contextlib.AbstractContextManager[Probe | None]:
    """Report every reshard made inside the block to ``probe``."""
    return bound(_PROBE, probe)


def made(arrays: Iterable[jax.Array], term: str) -> None:
    """Tell the probe (if any) that the reshard made ``arrays``."""
    probe = _PROBE.get()
    if probe is not None:
        probe.made(arrays, term)


def phase(name: str, programs: Sequence[tuple[tuple[int, ...], int]] = ()) -> None:
    """Tell the probe (if any) that the reshard is at a point of its most memory."""
    probe = _PROBE.get()
    if probe is not None:
        probe.phase(name, programs)


def program_temporaries(compiled: Any, devices: Sequence[Any]) -> tuple[tuple[int, ...], int]:
    """(device ids, temporary bytes per device) of a compiled SPMD program, from its memory
    analysis: every partition runs the same module, so each device holds that many."""
    return tuple(int(d.id) for d in devices), _temp_bytes(compiled)


def _temp_bytes(compiled: Any) -> int:
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - a backend without the analysis reports none
        return 0
    return int(getattr(stats, "temp_size_in_bytes", 0) or 0) if stats is not None else 0
