"""What the arrays a reshard makes are, for the figures of a sync's peak, and what its programs
hold; the sync's peak walk decides what is alive and counts buffers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# What an array is, for the figures of a sync's peak: which role it belongs to and why it exists.
STAGED = "staged source"  # the actor's leaves brought from pinned host to device memory (offload)
IN_FLIGHT = "in flight"  # a program's result on the source devices, before its shards cross
RESHARDED = "new rollout arrays"  # the destination layout, in device memory
MEMORY_KIND = "new rollout arrays (pinned host)"  # moved to the destination's memory kind
CAST = "cast"  # the rollout dtype, made on the destination devices
ANCHOR = "new anchor"  # the anchor re-pinned (P8)
RELEASED = "released"  # old arrays the sync replaced and nothing holds any more (negative)
PINNED = " (pinned host)"  # the suffix of a term counted in pinned host memory


def term_in(term: str, kind: str) -> str:
    """The term as the figures split it by memory kind: a new rollout array in pinned host is
    ``MEMORY_KIND``; a cast or a release there carries ``PINNED``; the anchor is pinned by nature."""
    if kind != "pinned_host" or term in (MEMORY_KIND, ANCHOR) or term.endswith(PINNED):
        return term
    return MEMORY_KIND if term == RESHARDED else term + PINNED


def program_temporaries(compiled: Any, devices: Sequence[Any]) -> tuple[tuple[int, ...], int]:
    """(device ids, temporary bytes per device) of a compiled SPMD program, from its memory
    analysis: every partition runs the same module, so each device holds that many."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - a backend without the analysis reports none
        stats = None
    return tuple(int(d.id) for d in devices), int(getattr(stats, "temp_size_in_bytes", 0) or 0)
