"""Choosing the devices the lab runs on.

GPUs or TPUs are used as they are; elsewhere the CPU backend is asked for several simulated
devices, before the backend starts (the count is fixed from then on). Child processes run JAX
on the CPU alone (``cpu_only_env``). When another process holds the TPU chip, ``open_devices``
names it (``core.chip_holder``) and, for the notebooks, opens the CPU backend alone.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Literal

import jax
from jax._src import xla_bridge as _xla_bridge

from rlcluster_lab.core.chip_holder import ChipHeld, ChipHeldError, chip_held, failed_platform
from rlcluster_lab.core.options import DEFAULT_SIMULATED_DEVICES, MAX_SIMULATED_DEVICES, check_device_count

__all__ = ["DEFAULT_SIMULATED_DEVICES", "MAX_SIMULATED_DEVICES", "check_device_count", "devices_words"]


def devices_words(devices: Sequence[Any]) -> str:
    """Where figures come from, in words, for every report and figure: ``"TPU v5 lite chip 0"``,
    ``"4 NVIDIA H100 chips"``, ``"8 simulated CPU devices"``; a ``ValueError`` for no devices or two
    platforms."""
    devices = list(devices)
    platforms = sorted({d.platform for d in devices})
    if len(platforms) != 1:
        raise ValueError(f"devices_words takes one platform's devices, got {len(devices)} of {platforms or 'none'}")
    if platforms[0] == "cpu":
        return "1 CPU device" if len(devices) == 1 else f"{len(devices)} simulated CPU devices"
    kind = str(getattr(devices[0], "device_kind", "") or platforms[0].upper())
    chip = "" if kind.lower().endswith("chip") else " chip"
    return f"{kind}{chip} {devices[0].id}" if len(devices) == 1 else f"{len(devices)} {kind}{chip}s"


def cpu_only_env() -> dict[str, str]:
    """The environment of a child process that runs JAX on the CPU alone (the multi-process
    workers, the warm start), since the kernel that starts them may hold the chip:
    ``JAX_PLATFORMS=cpu``, no deprecated ``JAX_PLATFORM_NAME``, and ``TPU_SKIP_MDS_QUERY`` (a
    worker's ``jax.distributed.initialize`` does not ask a TPU VM's metadata server for a slice)."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORM_NAME"}
    env["JAX_PLATFORMS"] = "cpu"
    env["TPU_SKIP_MDS_QUERY"] = "1"
    return env


class DeviceSetupError(RuntimeError):
    """The simulated devices could not be configured (the backend already started)."""


def backend_started() -> bool:
    """True once JAX has initialised a backend in this process."""
    return bool(_xla_bridge.backends_are_initialized())


def ensure_simulated_devices(count: int = DEFAULT_SIMULATED_DEVICES, *, cpu: bool = False) -> list[jax.Device]:
    """Give the CPU backend ``count`` devices, then return the devices in use (accelerators
    unchanged, unless ``cpu``: then the CPU backend alone).

    Raises:
        DeviceSetupError: the backend already started on CPU with another count (restart first).
        ChipHeldError: another process holds the accelerator (its message names that process).
    """
    check_device_count(count)
    if not backend_started():
        jax.config.update("jax_num_cpu_devices", count)
        if cpu:
            jax.config.update("jax_platforms", "cpu")
        opened = open_devices(on_held="raise")
        return list(opened.devices)
    devices = jax.devices()
    if devices[0].platform == "cpu" and len(devices) != count:
        raise DeviceSetupError(
            f"JAX already started with {len(devices)} CPU device(s); {count} were "
            "requested. The count (jax_num_cpu_devices) can only be set before the first JAX operation: "
            "restart the kernel (or process) and call "
            f"rlcluster_lab.ensure_simulated_devices({count}) before anything else uses JAX."
        )
    return devices


@dataclasses.dataclass(frozen=True)
class Opened:
    """What ``open_devices`` opened."""

    devices: tuple[Any, ...]  # ``jax.devices()``: the CPU's alone where the chip is held
    held: ChipHeld | None  # the accelerator another process holds, if it is held


# JAX's platforms before ``open_devices`` fell back to the CPU alone (``reopen_devices`` restores them).
_before_fallback: list[str | None] = []


def _jax_devices() -> list[Any]:
    """``jax.devices()``: the lab's one call that opens the accelerator (the tests make it fail here
    as a chip another process holds makes it fail)."""
    return jax.devices()


def open_devices(*, on_held: Literal["cpu", "raise"], retried: bool = False) -> Opened:
    """Start JAX's backends and return its devices; where an accelerator's backend could not start
    because another process holds the chip, say which (``core.chip_holder``): with ``on_held="cpu"``
    the CPU's devices and the holder, with ``"raise"`` a ``ChipHeldError`` naming it (any other
    failure as JAX raised it). Where the platforms are named (a TPU VM), ``jax.devices()`` raises
    and the CPU backend is started alone; where not, JAX starts the CPU alone itself and keeps the
    TPU's error, read from there. ``retried`` (after ``reopen_devices``): a failure to start the
    accelerator's counts as held."""
    try:
        devices = _jax_devices()
    except RuntimeError as exc:
        platform = failed_platform(exc)
        held = chip_held(platform, str(exc)) if platform else None
        held = held or (ChipHeld(platform, ()) if platform and retried else None)
        if held is None:
            raise
        if on_held != "cpu":
            raise ChipHeldError(held, f"{held.chip} is held by {held.who()}") from None
        _before_fallback[:] = [jax.config.jax_platforms]
        jax.config.update("jax_platforms", "cpu")
        return Opened(tuple(jax.devices()), held)
    held = None
    if all(d.platform == "cpu" for d in devices):
        failed = [(p, e) for p, e in _backend_errors().items() if p != "cpu"]
        held = next(filter(None, (chip_held(p, e, said=True) for p, e in failed)), None)
        held = held or (ChipHeld(failed[0][0], ()) if failed and retried else None)
        if held is not None:
            _before_fallback[:] = [jax.config.jax_platforms]
    if held is not None and on_held != "cpu":
        raise ChipHeldError(held, f"{held.chip} is held by {held.who()}")
    return Opened(tuple(devices), held)


def reopen_devices() -> bool:
    """Let the next ``open_devices`` try the accelerator again after it fell back to the CPU: JAX's
    platforms restored and its backends cleared (arrays made before stay where they are); returns
    whether it had fallen back."""
    if not _before_fallback or not backend_started():
        return False
    jax.config.update("jax_platforms", _before_fallback.pop())
    from jax.extend.backend import clear_backends

    clear_backends()
    return True


def _backend_errors() -> dict[str, str]:
    """The backends JAX could not start, with its message for each (``jax.devices(platform)`` raises it)."""
    return dict(getattr(_xla_bridge, "_backend_errors", {}))
