"""A weight sync in chunks: which leaves go together, and the setting in force (``sync_chunk_bytes``).

Leaves go in path order into chunks of at most N logical bytes (a larger leaf alone, never
split); each chunk is resharded, committed and its old arrays released before the next,
bounding the sync's transient peak at the cost of a reshard call per chunk. The cluster's
sync and the planner both split with ``chunk_leaves``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Sequence

from rlcluster_lab.placement.phases import bound

_CHUNK_BYTES: contextvars.ContextVar[int | None] = contextvars.ContextVar("rlcluster_lab_sync_chunk", default=None)


def chunk_leaves(sizes: Sequence[int], limit: int | None) -> list[range]:
    """Consecutive runs of leaves (indices into ``sizes``) of at most ``limit`` bytes each.

    ``limit`` None: one chunk of everything. Greedy in order: a chunk takes the next
    leaf while it stays within the limit; a leaf above the limit stands alone.
    """
    if not sizes:
        return []
    if limit is None:
        return [range(len(sizes))]
    out: list[range] = []
    start, filled = 0, 0
    for i, n in enumerate(sizes):
        if i > start and filled + n > limit:
            out.append(range(start, i))
            start, filled = i, 0
        filled += n
    out.append(range(start, len(sizes)))
    return out


def sync_chunks(limit: int | None) -> contextlib.AbstractContextManager[int | None]:
    """Hand weights over in chunks of at most ``limit`` bytes inside the block (None: in one piece)."""
    return bound(_CHUNK_BYTES, limit)


def current_chunk_bytes() -> int | None:
    """The chunk size a handover uses here (None: the whole tree in one piece)."""
    return _CHUNK_BYTES.get()
