"""A weight sync in chunks: which leaves go together (``sync_chunk_bytes``, P13's order).

Leaves go in path order into chunks of at most N logical bytes (a larger leaf alone, never
split); each chunk is resharded, committed and its old arrays released before the next,
bounding the sync's transient peak at the cost of a reshard call per chunk. The cluster's
sync and the planner both split with ``chunk_leaves``.
"""

from __future__ import annotations

from collections.abc import Sequence


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
