"""The compiled programs placement keeps in bounded caches that register here, so a rebuild of a
layout seen before compiles nothing and ``clear_programs`` forgets them all."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from typing import Any

import jax

from rlcluster_lab.core.compile_cache import count_compilations, flush_cache_writes
from rlcluster_lab.core.gathering import any_process

_CLEARS: list[Callable[[], None]] = []  # every placement cache's clear, run by clear_programs


def cleared_with_programs(clear: Callable[[], None]) -> Callable[[], None]:
    """Register ``clear`` (a cache's own) to run in ``clear_programs``; usable as a decorator."""
    _CLEARS.append(clear)
    return clear


class ProgramCache:
    """A small thread-safe least-recently-used map of compiled programs."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        cleared_with_programs(self.clear)

    def get(self, key: Hashable) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is not None:
                self._data.move_to_end(key)
            return hit

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def compile_outside_mesh(jitted: Any, *args: Any, options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """``jitted`` lowered for ``args`` and compiled outside any role's mesh (its shardings are
    explicit) with ``options`` (None: XLA's defaults), and where the executable came from:
    ``"compiled"`` or ``"persistent cache"``."""
    with jax.set_mesh(None), count_compilations() as made:
        compiled = jitted.lower(*args).compile(options)
    return compiled, "persistent cache" if made and all(cached for _, _, cached in made) else "compiled"


def clear_programs() -> None:
    """Forget every compiled program placement keeps (the next reshard builds them again): for a caller
    that wants the memory back, or a test that swaps the planner."""
    for clear in _CLEARS:
        clear()


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


def trim_compiled_programs() -> bool:
    """Release every compiled program when this process holds more than ``TRIM_FRACTION`` of its
    memory-mapping limit (each CPU program holds mappings, and the kernel stops a process at
    ``vm.max_map_count``); True when it did. The persistent cache makes rebuilding a disk read."""
    held, limit = mapped_regions(), mapping_limit()
    over = not (held is None or limit is None or held < TRIM_FRACTION * limit)
    if jax.process_count() > 1:
        # multi-process: all drop their programs together, or one would analyse a shared program alone and wait.
        over = any_process(over, "trim compiled programs")
    if not over:
        return False
    # Programs queued for the disk cache are written first, so rebuilding any is a read from disk.
    flush_cache_writes()
    clear_programs()
    jax.clear_caches()
    return True
