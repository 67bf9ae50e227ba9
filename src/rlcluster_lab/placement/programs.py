"""The compiled programs placement keeps, and the bound on how many a process holds.

Both reshard strategies and the multi-process crossing keep their compiled
programs in bounded caches, so a rebuild of a layout seen before compiles
nothing. ``trim_compiled_programs`` drops them all (and JAX's own caches) when
the process nears the kernel's limit on memory mappings.
"""

from __future__ import annotations

import jax

from rlcluster_lab.core.gathering import any_process
from rlcluster_lab.placement import crossing, minimal, reshard, xla


def clear_programs() -> None:
    """Forget the compiled copy programs of both strategies and of the multi-process crossing
    (the next reshard builds them again).

    Programs are bounded caches already; this is for a caller that wants
    their memory back at once (or a test that swaps the planner).
    """
    minimal.clear()
    xla.clear()
    crossing.clear()
    reshard.forget_described()


def mapped_regions() -> int | None:
    """Memory mappings this process holds now (Linux), or None where that cannot be read."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def mapping_limit() -> int | None:
    """The kernel's per-process limit on memory mappings (Linux), or None."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


TRIM_FRACTION = 0.5


def trim_compiled_programs(fraction: float | None = None) -> bool:
    """Release every compiled program when this process holds more than ``fraction`` of its
    mapping limit; True when it did.

    On the CPU backend each compiled program holds memory mappings of its own
    (a training step's programs take about 1,000), and the kernel stops a
    process at ``vm.max_map_count`` (usually 65,530) with an allocation error.
    Programs stay cached while they are few, so a rebuild of a layout seen
    before compiles nothing; past the bound, they are dropped together, and
    the persistent cache makes rebuilding them a read from disk.
    """
    fraction = TRIM_FRACTION if fraction is None else fraction
    held, limit = mapped_regions(), mapping_limit()
    over = not (held is None or limit is None or held < fraction * limit)
    if jax.process_count() > 1:
        # multi-process: every process drops its programs together, or one would analyse a
        # shared program again alone and wait for the others (core.gathering).
        over = any_process(over, "trim compiled programs")
    if not over:
        return False
    clear_programs()
    jax.clear_caches()
    return True
