"""Who holds the accelerator chip, when JAX could not open it because another process has it.

Only one process at a time can open a TPU chip. While one holds it (in JupyterLab, the kernel of
the notebook opened first), JAX's TPU backend fails to start in every other with libtpu's own
words, a lockfile error whose advice (remove the lockfile) is wrong while that process runs. The
lab names that process instead, from ``/proc``: the processes with the chip's device files
(``/dev/accel*``; ``/dev/vfio/<group>`` from TPU v5e on) or libtpu's lockfile among their open
files, the process that has locked the lockfile (``/proc/locks``, which lists every user's), and
a process libtpu's message names. For a Jupyter kernel, the notebook it runs is asked of the
Jupyter server that started it (``core.jupyter``).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Sequence
from pathlib import Path

from rlcluster_lab.core import jupyter

DEVICE_FILES: tuple[str, ...] = ("/dev/accel*", "/dev/vfio/[0-9]*")
LOCKFILE = "/tmp/libtpu_lockfile"

# JAX's words for an accelerator's backend that did not start: at ``jax.devices()`` when the
# platforms are named (a TPU VM names "tpu,cpu"), at ``jax.devices("tpu")`` when they are not.
_FAILED = re.compile(r"Unable to initialize backend '(\w+)'|Backend '(\w+)' failed to initialize")
# libtpu's words when another process has the chip (its lockfile; "already in use by process with pid N").
_HELD_WORDS = re.compile(r"lockfile|already in use|device or resource busy", re.IGNORECASE)
_PID_WORDS = re.compile(r"\bpid\s*:?\s*(\d+)", re.IGNORECASE)
_KERNEL_FILE = re.compile(r"kernel-(.+)\.json$")
_COMMAND_CHARS = 90  # a command line is shown up to this many characters


@dataclasses.dataclass(frozen=True)
class Holder:
    """A process that holds the chip."""

    pid: int
    argv: tuple[str, ...]
    notebook: str | None = None  # the notebook it runs, for a kernel whose server says so
    server: jupyter.Server | None = None  # that server: it can shut the kernel down

    @property
    def kernel_id(self) -> str | None:
        """The Jupyter kernel id in its connection file's name (``-f .../kernel-<id>.json``), if any."""
        return kernel_id(self.argv)

    @property
    def command(self) -> str:
        """Its command line, each file without its folder, cut to a readable length:
        ``python3 -m ipykernel_launcher -f kernel-6f1e8a4c-....json``."""
        words = [os.path.basename(a) if a.startswith("/") else a for a in self.argv] or ["?"]
        text = " ".join(" ".join(words).split())  # a ``-c`` program's lines on one line
        return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 1] + "…"

    def words(self) -> str:
        """``process 4321 (python -m ipykernel_launcher -f ..., the kernel of notebook 00_start_here.ipynb)``."""
        of = f", the kernel of notebook {self.notebook}" if self.notebook else ""
        return f"process {self.pid} ({self.command}{of})"


def kernel_id(argv: Sequence[str]) -> str | None:
    """The kernel id of a Jupyter kernel's command line (``-f``/``--f=`` names its connection file
    ``kernel-<id>.json``); None for any other command."""
    found = _KERNEL_FILE.search(os.path.basename(_connection_file(argv)))
    return found.group(1) if found else None


def failed_platform(error: BaseException | str) -> str | None:
    """The accelerator platform whose backend JAX could not start (``"tpu"``), read from JAX's
    message; None for any other error, or for the CPU's backend."""
    found = _FAILED.search(str(error))
    platform = (found.group(1) or found.group(2)) if found else None
    return platform if platform != "cpu" else None


@dataclasses.dataclass(frozen=True)
class ChipHeld:
    """An accelerator JAX could not open because another process holds it."""

    platform: str  # "tpu"
    holders: tuple[Holder, ...]  # empty: none this user can list (libtpu's words said it is held)

    @property
    def chip(self) -> str:
        return f"the {self.platform.upper()} chip"

    def who(self) -> str:
        """``"process 4321 (...)"``, several joined with "and", or ``"another process"`` when none is listed."""
        if not self.holders:
            return "another process (one this user cannot list)"
        return " and ".join(h.words() for h in self.holders)

    def to_free(self) -> str:
        """What frees the chip, in the holder's terms: shut its kernel down, or end the process."""
        kernels = [h for h in self.holders if h.kernel_id]
        if kernels and len(kernels) == len(self.holders):
            it = "that kernel" if len(kernels) == 1 else "those kernels"
            return f"shut {it} down (in its notebook: Kernel > Shut Down Kernel)"
        pids = " ".join(str(h.pid) for h in self.holders)
        return f"end that process (kill {pids})" if pids else "end the process that holds it"


class ChipHeldError(RuntimeError):
    """JAX could not open the accelerator because another process holds it; the message names it."""

    def __init__(self, held: ChipHeld, message: str) -> None:
        super().__init__(message)
        self.held = held


def chip_held(
    platform: str,
    failure: str,
    device_files: Sequence[str] | None = None,
    lockfile: str | None = None,
    *,
    said: bool = False,
) -> ChipHeld | None:
    """Whether the ``platform`` backend JAX could not start (``failure``: JAX's message) failed
    because another process holds the chip: that process, or libtpu's words saying so; else None.

    Args:
        device_files: glob patterns of the chip's device files (default ``DEVICE_FILES``).
        lockfile: libtpu's lockfile (default ``LOCKFILE``).
        said: only where ``failure`` says so in libtpu's words (JAX fails to start the TPU's
            backend on a machine without libtpu too, and the processes are not looked at then).
    """
    says = bool(_HELD_WORDS.search(failure))
    if said and not says:
        return None
    holders = find_holders(device_files, lockfile, named_pids=[int(p) for p in _PID_WORDS.findall(failure)])
    return ChipHeld(platform, holders) if holders or says else None


def find_holders(
    device_files: Sequence[str] | None = None,
    lockfile: str | None = None,
    *,
    named_pids: Sequence[int] = (),
    proc: str = "/proc",
) -> tuple[Holder, ...]:
    """The other processes that hold the chip: an open link to one of ``device_files`` (glob
    patterns; default ``DEVICE_FILES``) or to ``lockfile`` (default ``LOCKFILE``), a lock on
    ``lockfile``, or a pid in ``named_pids`` that is running; each with its command line, and, for
    a Jupyter kernel, its notebook where a running server says. Processes this user may not look
    into are found through the lock alone."""
    device_files = DEVICE_FILES if device_files is None else device_files
    lockfile = LOCKFILE if lockfile is None else lockfile
    targets = {os.path.realpath(p) for pattern in device_files for p in glob.glob(pattern)}
    if os.path.exists(lockfile):
        targets.add(os.path.realpath(lockfile))
    pids = set(_locking_pids(lockfile, proc)) | {p for p in named_pids if Path(proc, str(p)).exists()}
    for entry in os.scandir(proc) if targets else ():
        if entry.name.isdigit() and int(entry.name) not in pids and _has_open(entry.path, targets):
            pids.add(int(entry.name))
    pids.discard(os.getpid())
    holders = [Holder(pid, _argv(proc, pid)) for pid in sorted(pids)]
    return tuple(_with_notebooks(holders))


def _has_open(process: str, targets: set[str]) -> bool:
    try:
        links = os.scandir(os.path.join(process, "fd"))
    except OSError:  # another user's process, or one that just ended
        return False
    with links:
        for link in links:
            try:
                if os.readlink(link.path) in targets:
                    return True
            except OSError:
                continue
    return False


def _locking_pids(lockfile: str, proc: str) -> list[int]:
    """The processes holding a lock (``flock`` or POSIX) on ``lockfile``, from ``/proc/locks``."""
    try:
        st = os.stat(lockfile)
        lines = Path(proc, "locks").read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return []
    # "1: FLOCK  ADVISORY  WRITE 4321 00:2a:131 0 EOF": the pid, then major:minor:inode (hex, hex, decimal).
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    pids = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or "->" in fields:  # a process waiting for the lock, not holding it
            continue
        try:
            major, minor, inode = fields[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                pids.append(int(fields[4]))
        except ValueError:
            continue
    return pids


def _argv(proc: str, pid: int) -> tuple[str, ...]:
    try:
        raw = Path(proc, str(pid), "cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def _with_notebooks(holders: list[Holder]) -> list[Holder]:
    """The holders, each kernel with its notebook and server where a running server names it."""
    kernels = [h for h in holders if h.kernel_id]
    if not kernels:
        return holders
    files = [_connection_file(h.argv) for h in kernels]
    known = jupyter.kernel_notebooks(jupyter.running_servers(jupyter.runtime_dirs(os.path.dirname(f) for f in files)))
    return [
        dataclasses.replace(h, server=known[h.kernel_id][0], notebook=known[h.kernel_id][1])
        if h.kernel_id in known
        else h
        for h in holders
    ]


def _connection_file(argv: Sequence[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "-f" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("-f=", "--f=")):
            return arg.partition("=")[2]
    return ""
