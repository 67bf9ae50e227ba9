"""Choosing the devices the lab runs on.

On a machine with GPUs or TPUs the lab uses them as they are. Elsewhere it
asks the CPU backend for several simulated devices, which must happen before
the JAX backend starts: once any JAX operation has run, the device count is
fixed for the life of the process. The processes the lab starts beside it (the
multi-process workers, the warm start) run JAX on the CPU alone (``cpu_only_env``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
from jax._src import xla_bridge as _xla_bridge

from rlcluster_lab.core.options import DEFAULT_SIMULATED_DEVICES, MAX_SIMULATED_DEVICES, check_device_count

__all__ = ["DEFAULT_SIMULATED_DEVICES", "MAX_SIMULATED_DEVICES", "check_device_count", "devices_words"]


def devices_words(devices: Sequence[Any]) -> str:
    """Where figures come from, in words: ``"TPU v5 lite chip 0"``, ``"4 NVIDIA H100 chips"``,
    ``"8 simulated CPU devices"`` (several CPU devices are the simulated ones ``setup()`` asks for).

    Every report and figure names its devices with this one function.

    Raises:
        ValueError: no devices, or devices of two platforms (one report is of one platform's).
    """
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
    workers, the warm start): this process's, made to keep off the accelerator.

    Only one process can hold a TPU chip, and the kernel that starts these holds it. So the
    child's JAX initialises the CPU backend and nothing else (``JAX_PLATFORMS=cpu``: libtpu and
    CUDA are never loaded); a platform named the deprecated way (``JAX_PLATFORM_NAME``, which
    would ask for a backend the child does not start) is dropped; and on a TPU VM
    ``jax.distributed.initialize`` in a worker does not ask the VM's metadata server whether it
    is part of a TPU slice (``TPU_SKIP_MDS_QUERY``): its processes are on this machine.
    """
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORM_NAME"}
    env["JAX_PLATFORMS"] = "cpu"
    env["TPU_SKIP_MDS_QUERY"] = "1"
    return env


class DeviceSetupError(RuntimeError):
    """The simulated devices could not be configured (the backend already started)."""


def backend_started() -> bool:
    """True once JAX has initialised a backend in this process."""
    return bool(_xla_bridge.backends_are_initialized())


def ensure_simulated_devices(count: int = DEFAULT_SIMULATED_DEVICES) -> list[jax.Device]:
    """Give the CPU backend ``count`` devices, then return the devices in use.

    Accelerators, when present, are used unchanged (the CPU setting only
    affects the CPU backend). Raises ``DeviceSetupError`` when the backend
    already started on CPU with another device count, since that cannot be
    changed any more: restart the kernel or process and call this first.
    """
    check_device_count(count)
    if not backend_started():
        jax.config.update("jax_num_cpu_devices", count)
        return jax.devices()
    devices = jax.devices()
    if devices[0].platform == "cpu" and len(devices) != count:
        raise DeviceSetupError(
            f"JAX already started with {len(devices)} CPU device(s); {count} were "
            "requested. The count (jax_num_cpu_devices) can only be set before the first JAX operation: "
            "restart the kernel (or process) and call "
            f"rlcluster_lab.ensure_simulated_devices({count}) before anything else uses JAX."
        )
    return devices
