"""Replacing a folder of files in one step: how a checkpoint is saved (``model.checkpoint``).

The new files are written, each flushed, into a folder made exclusively beside the target
(``mkdtemp``: private, so nothing is written through a planted link), which then takes the
target's place in one rename; the previous folder is removed only after. A reader sees the old
files or the new ones, never a mixture. Writers of one parent folder take an exclusive lock on
it, under which a folder a killed writer left behind is removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO


def replace_folder(folder: Path, files: Mapping[str, Callable[[BinaryIO], Any]]) -> None:
    """Make ``folder`` hold exactly ``files`` (name -> a function that writes it), atomically. A
    ``FileExistsError`` for a link, a file, or a folder holding other entries (replacing it would
    delete them); an ``OSError`` from a failed write leaves ``folder`` as it was."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder.parent):
        _check_replaceable(folder, tuple(files))
        _remove_stale(folder)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}{SAVING}", dir=folder.parent))
        try:
            modes = [_write_file(tmp / name, write) for name, write in files.items()]
            # mkdtemp made the folder private while it was written; it gets the mode a new
            # folder gets here (the files' mode, as the umask left it, plus search permission).
            mode = modes[0] if modes else 0o644
            os.chmod(tmp, mode | ((mode & 0o444) >> 2))
            _fsync_folder(tmp)
            _swap_into_place(tmp, folder)
        finally:
            # Before the swap: the unfinished new folder; after it: the previous one.
            shutil.rmtree(tmp, ignore_errors=True)
        _fsync_folder(folder.parent)


# The folder a save writes is made beside its target, named ".<target>.saving-<random>".
SAVING = ".saving-"
_LOCAL_LOCK = threading.Lock()  # where flock is not available (not POSIX)


@contextlib.contextmanager
def _exclusive(parent: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``parent`` while a save writes into it (threads and processes)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        with _LOCAL_LOCK:
            yield
        return
    fd = os.open(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait_for_lock(fd)
        yield
    finally:
        os.close(fd)  # releases the lock


def _wait_for_lock(fd: int) -> None:
    """Another save in this folder holds the lock: wait for it to finish."""
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)


def _check_replaceable(folder: Path, names: tuple[str, ...]) -> None:
    """``folder`` may be replaced: absent, or a folder holding only files of these names."""
    if folder.is_symlink():
        raise FileExistsError(
            f"{folder} is a symbolic link; save never writes through one: save to the folder it points to "
            "or to another path"
        )
    if not folder.exists():
        return
    if not folder.is_dir():
        raise FileExistsError(f"{folder} exists and is not a folder; save writes a checkpoint folder: use another path")
    with os.scandir(folder) as entries:
        others = sorted(e.name for e in entries if e.name not in names or e.is_dir(follow_symlinks=False))
    if others:
        raise FileExistsError(
            f"{folder} holds {others[:3]} besides {' and '.join(names)}; save replaces the whole "
            "folder, so it refuses one with other entries: save to a new path, or move them away"
        )


def _remove_stale(folder: Path) -> None:
    """Folders a killed save left beside ``folder`` (the lock is held: no save is writing them)."""
    prefix = f".{folder.name}{SAVING}"
    with os.scandir(folder.parent) as entries:
        stale = [e.path for e in entries if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)]
    for leftover in stale:
        shutil.rmtree(leftover, ignore_errors=True)


def _write_file(target: Path, write: Any) -> int:
    """Create ``target`` (never an existing file or link), write it, flush it to disk; returns its mode."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(target, flags, 0o666)
    with os.fdopen(fd, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
        return os.fstat(f.fileno()).st_mode & 0o777


def _fsync_folder(folder: Path) -> None:
    """Make a folder's entries (a new file, a rename) durable, where the system allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _swap_into_place(new: Path, folder: Path) -> None:
    """Put the folder ``new`` at ``folder`` in one step; the previous ``folder`` (if any) ends at
    ``new``. Linux exchanges the two names atomically (``renameat2``, ``RENAME_EXCHANGE``);
    elsewhere the previous folder is renamed aside first, so a crash between the two renames leaves
    both checkpoints whole."""
    if not folder.exists():
        os.rename(new, folder)
        return
    if _exchange(new, folder):
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}{SAVING}old-", dir=folder.parent))
    os.rmdir(aside)  # a fresh name for the rename below
    os.rename(folder, aside)
    try:
        os.rename(new, folder)
    except BaseException:
        os.rename(aside, folder)
        raise
    os.rename(aside, new)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # this file system or kernel cannot
        return False
    raise OSError(err, os.strerror(err), str(b))
