"""A weight sync in chunks (``sync_chunk_bytes``, P13): leaves in path order, chunks of at most N
logical bytes (a larger leaf alone, never split), each resharded and committed before the next.
The cluster's sync and the planner both split with ``chunk_leaves``."""

from __future__ import annotations

from collections.abc import Sequence


def chunk_leaves(sizes: Sequence[int], limit: int | None) -> list[range]:
    """Consecutive runs of leaves (indices into ``sizes``) of at most ``limit`` bytes each, greedy in
    order (``limit`` None: one chunk; a leaf above the limit stands alone)."""
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
