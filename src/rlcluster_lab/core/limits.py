"""What the machine has, and a refusal before allocating more than that (JAX-free).

Every size that decides memory (a checkpoint's dimensions, an array header, a LoRA rank,
a device count, a batch) is checked here against the host memory available *before*
anything is allocated, so a bad value ends in one line that names the estimate and the
limit instead of a ``MemoryError`` deep inside NumPy or the kernel's OOM killer.
"""

from __future__ import annotations

import os

from rlcluster_lab.core.errors import ConfigError

# Environment variable that caps what the lab may plan to allocate (bytes), for tests and
# for users who want a tighter bound than the machine's free memory.
LIMIT_ENV = "RLCLUSTER_LAB_MEMORY_LIMIT"

# The share of the available memory one request may take: the rest is left for the
# interpreter, XLA's own buffers and the copies a placement makes on the way.
SHARE = 0.5


class TooLargeError(ConfigError, MemoryError):
    """A request whose estimated bytes exceed what the machine can give; nothing was allocated."""


def available_host_bytes() -> int:
    """Host memory this process may still use, in bytes (``MemAvailable``, or the env cap)."""
    cap = os.environ.get(LIMIT_ENV)
    if cap:
        try:
            return int(float(cap))
        except ValueError as exc:
            raise ConfigError(f"{LIMIT_ENV}={cap!r} is not a number of bytes") from exc
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 1 << 40  # unknown: do not refuse on a guess


def limit_bytes() -> int:
    """The most one request may plan to allocate (bytes)."""
    if os.environ.get(LIMIT_ENV):
        return available_host_bytes()
    return int(available_host_bytes() * SHARE)


def check_fits(need: int, what: str, fix: str = "") -> None:
    """Refuse ``need`` bytes before allocating them when they exceed :func:`limit_bytes`.

    Args:
        need: the estimated bytes (computed from shapes, never by allocating).
        what: what would be allocated, for the message ("the checkpoint's parameters").
        fix: how to get a smaller request, appended to the message.

    Raises:
        TooLargeError: ``need`` exceeds the limit; the message gives both figures.
    """
    limit = limit_bytes()
    if need > limit:
        hint = f"; {fix}" if fix else ""
        raise TooLargeError(
            f"{what} would need about {_human(need)} ({need:,} bytes, estimated from shapes) but at most "
            f"{_human(limit)} may be allocated here (half the free host memory, or ${LIMIT_ENV}){hint}"
        )


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1000
    return f"{n} B"
