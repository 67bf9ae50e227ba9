"""Choosing the devices the lab runs on.

On a machine with GPUs or TPUs the lab uses them as they are. Elsewhere it
asks the CPU backend for several simulated devices, which must happen before
the JAX backend starts: once any JAX operation has run, the device count is
fixed for the life of the process. The processes the lab starts beside it (the
multi-process workers, the warm start) run JAX on the CPU alone (``cpu_only_env``).
"""

from __future__ import annotations

import os

import jax
from jax._src import xla_bridge as _xla_bridge

from rlcluster_lab.core.options import DEFAULT_SIMULATED_DEVICES, MAX_SIMULATED_DEVICES, check_device_count

__all__ = ["DEFAULT_SIMULATED_DEVICES", "MAX_SIMULATED_DEVICES", "check_device_count"]


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
