"""What the machine has, and a refusal before allocating more than that (JAX-free).

Every size that decides memory (a checkpoint's dimensions, an array header, a LoRA rank,
a device count, a batch) is checked here against the host memory available *before*
anything is allocated, so a bad value ends in one line that names the estimate and the
limit instead of a ``MemoryError`` deep inside NumPy or the kernel's OOM killer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlcluster_lab.core.errors import ConfigError

# Environment variable that caps what the lab may plan to allocate (bytes), for tests and
# for users who want a tighter bound than the machine's free memory.
LIMIT_ENV = "RLCLUSTER_LAB_MEMORY_LIMIT"

# Environment variable that gives every device a simulated memory of that many bytes
# (``device_free_bytes``): the device-memory checks then run on CPU devices too.
DEVICE_LIMIT_ENV = "RLCLUSTER_LAB_DEVICE_MEMORY"

# The share of the available memory one request may take: the rest is left for the
# interpreter, XLA's own buffers and the copies a placement makes on the way.
SHARE = 0.5


class TooLargeError(ConfigError, MemoryError):
    """A request whose estimated bytes exceed what the machine can give; nothing was allocated."""


# Units a byte count may carry (the CLI's --memory-per-device and $RLCLUSTER_LAB_MEMORY_LIMIT).
BYTE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    **{f"{p}b": 1000**i for i, p in enumerate("kmgt", 1)},
    **{f"{p}ib": 1024**i for i, p in enumerate("kmgt", 1)},
}
# Far above any machine's memory (an exabyte), so a limit never becomes a huge or infinite float.
_MAX_LIMIT = 10**18


def parse_bytes(text: str, name: str = "value", *, allow_zero: bool = False) -> float:
    """``'80GB'``, ``'16GiB'``, ``'450e9'``, ``'2.5 TB'`` as bytes: a positive (or with
    ``allow_zero``, non-negative) finite number with an optional unit of ``BYTE_UNITS`` (and a
    trailing ``/s``, for rates).

    Raises:
        ValueError: anything else; the message names ``name``.
    """
    s = str(text).strip().lower().replace(" ", "").removesuffix("/s")
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number) :]
    if unit not in BYTE_UNITS:
        raise ValueError(
            f"{name}: cannot read {text!r:.40} as bytes: unknown unit {unit!r:.20} (use B, KB, MB, GB, TB, KiB, "
            "MiB, GiB, TiB)"
        )
    try:
        value = float(number) * BYTE_UNITS[unit]
    except ValueError:
        raise ValueError(f"{name}: cannot read {text!r:.40} as bytes; write e.g. 80GB, 16GiB or 450e9") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a positive, finite number of bytes (e.g. 80GB), got {text!r:.40}")
    return value


def available_host_bytes() -> int:
    """Host memory this process may still use, in bytes (``MemAvailable``, or the env cap).

    Raises:
        ConfigError: ``$RLCLUSTER_LAB_MEMORY_LIMIT`` is not a finite number of bytes between 0 and
            10**18 (a number with an optional unit: ``64MiB``, ``2e9``).
    """
    cap = os.environ.get(LIMIT_ENV)
    if cap:
        try:
            value = parse_bytes(cap, LIMIT_ENV, allow_zero=True)
        except ValueError:
            value = math.inf
        if value > _MAX_LIMIT:
            raise ConfigError(
                f"{LIMIT_ENV}={cap!r:.40} is not a number of bytes between 0 and {_MAX_LIMIT:.0e}; set it to e.g. "
                f"2000000000, 2GB or 64MiB (units {', '.join(u for u in BYTE_UNITS if u)}), or unset it"
            )
        return int(value)
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


def limit_bytes(freed: int = 0) -> int:
    """The most one request may plan to allocate (bytes).

    ``freed``: host bytes the caller frees before allocating (a cluster it replaces), counted as
    free memory; ``$RLCLUSTER_LAB_MEMORY_LIMIT`` bounds the request itself, so it ignores them.
    """
    return available_host_bytes() if os.environ.get(LIMIT_ENV) else int((available_host_bytes() + freed) * SHARE)


def _too_large(problem: str, fix: str, knobs: Sequence[str]) -> TooLargeError:
    """The refusal: ``problem`` and, for the Python API, ``fix``; with ``knobs`` the lab and the CLI
    say the problem alone and name those knobs as their own widgets or flags (``core.knobs.describe``)."""
    message = f"{problem}; {fix}" if fix else problem
    return TooLargeError(message, knobs=knobs, problem=problem if knobs else None)


def check_fits(need: int, what: str, fix: str = "", freed: int = 0, knobs: Sequence[str] = ()) -> None:
    """Refuse ``need`` bytes (estimated from shapes, never by allocating) before allocating them
    when they exceed ``limit_bytes(freed)``; the message names ``what`` would be allocated ("the
    checkpoint's parameters") and ends with ``fix``, how to get a smaller request; ``knobs``: the
    knobs (``core.knobs``) whose change asks for less, the likeliest first.

    Raises:
        TooLargeError: ``need`` exceeds the limit; the message gives both figures.
    """
    limit = limit_bytes(freed)
    if need > limit:
        counted = f", counting the {fmt_bytes(freed)} the cluster it replaces frees" if freed else ""
        raise _too_large(
            f"{what} would need about {fmt_bytes(need)} ({need:,} bytes, estimated from shapes) but at most "
            f"{fmt_bytes(limit)} may be allocated here (half the free host memory{counted}, or ${LIMIT_ENV})",
            fix,
            knobs,
        )


def device_free_bytes(device: Any) -> int | None:
    """Bytes ``device`` can still allocate, from its allocator (``memory_stats()``: its limit less
    what is in use); None where the device reports no figures (CPU devices).

    With ``$RLCLUSTER_LAB_DEVICE_MEMORY`` set (bytes, e.g. ``64MiB``) every device is taken to
    hold that much, a simulated device memory: its free bytes are that limit less what is in use
    (the allocator's ``bytes_in_use``, or on a device without one the bytes this process's live
    arrays hold in its device memory), so the checks against device memory run, and are tested,
    on CPU devices too.

    Raises:
        ConfigError: ``$RLCLUSTER_LAB_DEVICE_MEMORY`` is not a number of bytes.
    """
    try:
        stats = device.memory_stats()
    except Exception:  # no such method, or a backend without allocator figures that raises rather than returning None
        stats = None
    simulated = os.environ.get(DEVICE_LIMIT_ENV)
    if simulated:
        try:
            limit = parse_bytes(simulated, DEVICE_LIMIT_ENV, allow_zero=True)
        except ValueError as err:
            raise ConfigError(f"{err}; or unset {DEVICE_LIMIT_ENV}") from None
        used = int(stats["bytes_in_use"]) if stats and "bytes_in_use" in stats else _live_device_bytes(device)
        return int(min(limit, _MAX_LIMIT)) - used
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def _live_device_bytes(device: Any) -> int:
    """Bytes this process's live arrays hold in ``device``'s own memory (each shard once)."""
    import jax

    total = 0
    for array in jax.live_arrays():
        if str(getattr(array.sharding, "memory_kind", None)) in ("pinned_host", "unpinned_host"):
            continue  # host memory, not the device's
        for shard in array.addressable_shards:
            if shard.device == device:
                total += shard.data.nbytes
    return total


def check_fits_devices(
    need: Mapping[int, int],
    devices: Iterable[Any],
    what: str,
    fix: str = "",
    freed: Mapping[int, int] | None = None,
    knobs: Sequence[str] = (),
) -> None:
    """Refuse when any device's ``need[device.id]`` bytes exceed what it can still allocate.

    Only devices that report allocator figures (``device_free_bytes``) are checked:
    on CPU devices, whose memory is the host's, ``check_fits`` is the check. ``freed[device.id]``:
    bytes the caller frees on that device before allocating (a cluster it replaces), counted as free.
    ``fix`` and ``knobs`` as for ``check_fits``.

    Raises:
        TooLargeError: the first device that cannot hold its share; the message gives both figures.
    """
    for device in devices:
        want = int(need.get(int(device.id), 0))
        free = device_free_bytes(device)
        released = int((freed or {}).get(int(device.id), 0))
        if free is None or want <= free + released:
            continue
        free = max(free + released, 0)
        counted = f" and the {fmt_bytes(released)} the cluster it replaces frees" if released else ""
        source = f"${DEVICE_LIMIT_ENV}" if os.environ.get(DEVICE_LIMIT_ENV) else "its allocator's memory_stats()"
        raise _too_large(
            f"{what} would need about {fmt_bytes(want)} ({want:,} bytes, estimated from shapes) on {device.platform} "
            f"device {device.id} but it has {fmt_bytes(free)} free ({free:,} bytes, from {source}{counted})",
            fix,
            knobs,
        )


BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(n: float) -> str:
    """Bytes in binary units, short and stable: 534528 -> '522.0 KiB'. The one way the
    project writes a byte count for reading (messages, the CLI's plan, the lab's figures)."""
    n = float(n)
    for unit in BINARY_UNITS[:-1]:
        if abs(n) < 1024:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} {BINARY_UNITS[-1]}"
