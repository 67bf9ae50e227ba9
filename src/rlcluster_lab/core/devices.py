"""Choosing the devices the lab runs on.

On a machine with GPUs or TPUs the lab uses them as they are. Elsewhere it
asks the CPU backend for several simulated devices, which must happen before
the JAX backend starts: once any JAX operation has run, the device count is
fixed for the life of the process.
"""

from __future__ import annotations

import jax
from jax._src import xla_bridge as _xla_bridge

from rlcluster_lab.core.options import DEFAULT_SIMULATED_DEVICES, MAX_SIMULATED_DEVICES, check_device_count

__all__ = ["DEFAULT_SIMULATED_DEVICES", "MAX_SIMULATED_DEVICES", "check_device_count"]


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
