"""JAX's persistent compilation cache, on by default for the CLI, the notebooks and the lab.

``enable_compilation_cache`` must run before the first compilation. Where the cache lives:

1. ``RLCLUSTER_LAB_COMPILATION_CACHE``: a folder, or ``off`` to turn it off;
2. else ``JAX_COMPILATION_CACHE_DIR``, JAX's own setting;
3. else ``$XDG_CACHE_HOME/rlcluster-lab/jax`` (``~/.cache/rlcluster-lab/jax``).

It is bounded on disk by ``RLCLUSTER_LAB_COMPILATION_CACHE_MAX_MB`` (least recently used files
deleted down to 90%), and written after the work that compiled it (``WriteBehind``). It is
trusted: JAX runs the native code its entries hold, so the folder must be the user's own and
writable by nobody else (created 0700); any other gets one warning and no persistent cache.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import stat
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import jax

ENV = "RLCLUSTER_LAB_COMPILATION_CACHE"
MAX_MB_ENV = "RLCLUSTER_LAB_COMPILATION_CACHE_MAX_MB"
DEFAULT_MAX_MB = 512
# Files of the lab's own that trimming leaves alone (the warm start's lock and record, lab/notebook/warm.py).
KEEP_PREFIX = "rlcluster-lab-warm"
_OFF = {"0", "off", "false", "no", "none", ""}


def cache_dir() -> Path | None:
    """The folder the cache would use here, or None when it is turned off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in _OFF else Path(value).expanduser()
    jax_dir = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if jax_dir:
        return Path(jax_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlcluster-lab" / "jax"


def untrusted_reason(folder: Path) -> str | None:
    """Why ``folder`` may not hold files this process runs or believes, or None when it may: it must
    be this user's folder, writable by neither group nor others (reached through a link only if the
    link is this user's too)."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        link = os.lstat(folder)
        info = os.stat(folder)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISLNK(link.st_mode) and uid is not None and link.st_uid != uid:
        return f"is a symbolic link owned by user id {link.st_uid}, not by this user ({uid})"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if uid is not None and info.st_uid != uid:
        return f"is owned by user id {info.st_uid}, not by this user ({uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode = stat.S_IMODE(info.st_mode)
        return f"can be written by other users (mode {mode:04o}; it must not be group- or world-writable)"
    return None


_WARNED: set[str] = set()


def trusted_folder(folder: Path, what: str) -> Path | None:
    """``folder``, created private (0700) when missing, or None (one warning) when it cannot be trusted."""
    with contextlib.suppress(OSError):
        folder.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.mkdir(folder, 0o700)
    reason = untrusted_reason(folder)
    if reason is None:
        return folder
    warn_once(
        folder,
        f"{what} is off: {folder} {reason}. Its files would be run or believed as this program's own; "
        f"use a folder of your own (chmod 700), set {ENV} to one, or set {ENV}=off",
    )
    return None


def warn_once(folder: Path, message: str) -> None:
    """A ``RuntimeWarning`` about ``folder``, once per folder in this process (to the caller's caller)."""
    if str(folder) not in _WARNED:
        _WARNED.add(str(folder))
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache (``path``, or ``cache_dir()``) for every program,
    however quickly it compiled; returns the folder, or None when it is off or not trusted."""
    folder = Path(path).expanduser() if path is not None else cache_dir()
    if folder is not None:
        folder = trusted_folder(folder, "the persistent compilation cache")
    if folder is None:
        # Off, also for a folder JAX took from its own environment variable.
        if jax.config.jax_compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", None)
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _write_behind()
    if str(folder) not in _TRIMMED:
        _TRIMMED.add(str(folder))
        trim_cache(folder, max_cache_bytes())
    return folder


_TRIMMED: set[str] = set()


def max_cache_bytes() -> int:
    """The bound on the cache's files, in bytes (``RLCLUSTER_LAB_COMPILATION_CACHE_MAX_MB``); a
    ``ValueError`` for a value that is not a positive number of megabytes."""
    value = os.environ.get(MAX_MB_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_MB * 2**20
    try:
        mb = float(value)
    except ValueError:
        mb = float("nan")
    if not mb > 0 or mb == float("inf"):
        raise ValueError(f"{MAX_MB_ENV}={value!r} must be a positive number of megabytes (e.g. 512)")
    return int(mb * 2**20)


def cache_files(folder: Path) -> list[tuple[float, int, Path]]:
    """(last use, size, path) of every regular file under ``folder``; links are neither followed
    nor listed, so nothing outside the folder is ever seen."""
    found: list[tuple[float, int, Path]] = []
    for here, _, names in os.walk(folder):  # a folder that cannot be read is skipped
        for name in names:
            path = Path(here, name)
            with contextlib.suppress(OSError):
                info = path.lstat()
                if stat.S_ISREG(info.st_mode):
                    found.append((max(info.st_atime, info.st_mtime), info.st_size, path))
    return found


def trim_cache(folder: Path, max_bytes: int) -> tuple[int, int]:
    """Delete the least recently used files under ``folder`` (a trusted one) while it holds more than
    ``max_bytes``, down to 90% of it, keeping the warm start's; returns (files deleted, bytes freed)."""
    if untrusted_reason(folder) is not None:
        return 0, 0
    files = cache_files(folder)
    total = sum(size for _, size, _ in files)
    if total <= max_bytes:
        return 0, 0
    target, start, deleted = int(max_bytes * 0.9), total, 0
    for _, size, path in sorted(files):
        if total <= target:
            break
        if path.name.startswith(KEEP_PREFIX):
            continue
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        deleted += 1
    return deleted, start - total


# WriteBehind writes once nothing was compiled for QUIET_S seconds, or MAX_PENDING entries wait.
QUIET_S = 0.5
MAX_PENDING = 32


class WriteBehind:
    """Persistent-cache entries written after the work that compiled them (``write``: JAX's own write).

    JAX writes each program it compiles before it runs it, for a later process while a person waits
    on this one. Here one thread at the lowest CPU priority writes what is queued once nothing was
    compiled for ``QUIET_S`` seconds or ``MAX_PENDING`` entries wait; ``flush`` (also at exit)
    writes everything now.
    """

    def __init__(self, write: Callable[..., None]) -> None:
        self.write = write
        self._cond = threading.Condition()
        self._pending: list[tuple[tuple, dict]] = []
        self._writing = 0  # entries taken from the queue and not written yet
        self._last = 0.0
        self._thread: threading.Thread | None = None

    def put(self, *args: object, **kwargs: object) -> None:
        """Queue one write (JAX's ``put_executable_and_time`` arguments)."""
        with self._cond:
            self._pending.append((args, kwargs))
            self._last = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="compilation cache writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def pending(self) -> int:
        """Entries queued or being written."""
        with self._cond:
            return len(self._pending) + self._writing

    def flush(self) -> None:
        """Write every queued entry now, and wait for the writer's own to be written."""
        with self._cond:
            batch = self._take()
        self._write_all(batch)
        with self._cond:
            self._cond.wait_for(lambda: not self._writing)

    def _take(self) -> list[tuple[tuple, dict]]:
        batch, self._pending = self._pending, []
        self._writing += len(batch)
        return batch

    def _run(self) -> None:
        with contextlib.suppress(AttributeError, OSError):  # Linux: a thread has its own priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while True:
            with self._cond:
                while True:
                    quiet_for = self._last + QUIET_S - time.monotonic()
                    if self._pending and (quiet_for <= 0 or len(self._pending) >= MAX_PENDING):
                        break
                    self._cond.wait(quiet_for if self._pending else None)
                batch = self._take()
            self._write_all(batch)

    def _write_all(self, batch: list[tuple[tuple, dict]]) -> None:
        try:
            for args, kwargs in batch:
                try:
                    self.write(*args, **kwargs)
                except Exception as err:  # noqa: BLE001 - as JAX itself: a cache that cannot be written only warns
                    warnings.warn(
                        f"a persistent compilation cache entry was not written: {type(err).__name__}: {err}",
                        RuntimeWarning,
                        stacklevel=1,
                    )
        finally:
            with self._cond:
                self._writing -= len(batch)
                self._cond.notify_all()

    def _forget(self) -> None:
        """In a forked child: the parent writes its own entries; the child starts empty."""
        self._cond = threading.Condition()
        self._pending, self._writing, self._thread = [], 0, None


_WRITER: WriteBehind | None = None


def _write_behind() -> None:
    """Route JAX's persistent-cache writes through one ``WriteBehind`` (once per process).

    Left as JAX does it where JAX has no ``put_executable_and_time`` to route (another version)."""
    global _WRITER
    if _WRITER is not None:
        return
    from jax._src import compilation_cache

    write = getattr(compilation_cache, "put_executable_and_time", None)
    if write is None:
        return
    _WRITER = WriteBehind(write)
    compilation_cache.put_executable_and_time = _WRITER.put
    atexit.register(flush_cache_writes)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_WRITER._forget)


def flush_cache_writes() -> None:
    """Write every compiled program still queued for the persistent cache, now (``WriteBehind``)."""
    if _WRITER is not None:
        _WRITER.flush()


def pending_cache_writes() -> int:
    """Programs compiled in this process and not written to the persistent cache yet."""
    return 0 if _WRITER is None else _WRITER.pending()


# A helper thread compiling on another's behalf (``compiling_for``) -> the thread it works for.
_WORKS_FOR: dict[int, int] = {}


@contextlib.contextmanager
def compiling_for(thread: int) -> Iterator[None]:
    """Count what the current thread compiles inside the block as compiled by ``thread`` (an
    ident), for that thread's ``count_compilations``: work split over helper threads is still
    the caller's."""
    me = threading.get_ident()
    _WORKS_FOR[me] = thread
    try:
        yield
    finally:
        _WORKS_FOR.pop(me, None)


def _on_behalf_of(thread: int, counted: int) -> bool:
    while thread != counted and thread in _WORKS_FOR:
        thread = _WORKS_FOR[thread]
    return thread == counted


@contextlib.contextmanager
def count_compilations() -> Iterator[list[tuple[str, float, bool]]]:
    """Collect (program name, seconds, read from the persistent cache) of every executable this
    thread (or a helper compiling for it, ``compiling_for``) built inside the block."""
    from jax._src import monitoring

    found: list[tuple[str, float, bool]] = []
    me = threading.get_ident()
    hit: dict[int, bool] = {}  # per thread: its next executable came from the disk cache

    def on_event(event: str, **kwargs: object) -> None:
        thread = threading.get_ident()
        if event == "/jax/compilation_cache/cache_hits" and _on_behalf_of(thread, me):
            hit[thread] = True

    def on_duration(event: str, seconds: float, **kwargs: object) -> None:
        thread = threading.get_ident()
        if event.endswith("backend_compile_duration") and _on_behalf_of(thread, me):
            found.append((str(kwargs.get("fun_name", "?")), float(seconds), hit.pop(thread, False)))

    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
    try:
        yield found
    finally:
        monitoring.unregister_event_duration_listener(on_duration)
        monitoring.unregister_event_listener(on_event)


# Threads compiling outside the persistent cache (``uncached``).
_UNCACHED: set[int] = set()


@functools.cache
def _route_cache_io() -> None:
    """Route JAX's persistent-cache read and write through a check of ``_UNCACHED`` (once per
    process): JAX decides once per process whether the cache is used, so it cannot be turned
    off for one block by its settings."""
    from jax._src import compiler

    read, write = compiler._cache_read, compiler._cache_write

    def cache_read(*args: object, **kwargs: object) -> object:
        return (None, None) if threading.get_ident() in _UNCACHED else read(*args, **kwargs)

    def cache_write(*args: object, **kwargs: object) -> None:
        if threading.get_ident() not in _UNCACHED:
            write(*args, **kwargs)

    compiler._cache_read, compiler._cache_write = cache_read, cache_write


@contextlib.contextmanager
def uncached() -> Iterator[None]:
    """Inside the block, every program this thread compiles is compiled by XLA: nothing is read
    back from the persistent cache and nothing written to it (other threads use it as before).
    For measuring what compiling costs; a fresh ``jax.jit`` also keeps JAX's in-memory cache out."""
    _route_cache_io()
    me = threading.get_ident()
    _UNCACHED.add(me)
    try:
        yield
    finally:
        _UNCACHED.discard(me)
