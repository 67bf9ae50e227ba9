"""Choosing the devices the lab runs on.

On a machine with GPUs or TPUs the lab uses them as they are. Elsewhere it
asks the CPU backend for several simulated devices, which must happen before
the JAX backend starts: once any JAX operation has run, the device count is
fixed for the life of the process.
"""

from __future__ import annotations

import jax
from jax._src import xla_bridge as _xla_bridge

from rlcluster_lab.core.errors import ConfigError

DEFAULT_SIMULATED_DEVICES = 8

# The most simulated CPU devices the lab asks for. Each one costs the CPU client about
# 100 KB and start-up time (2048 devices: ~12 s and ~380 MB before any array exists), and
# no layout the lab compares needs more; 200,000 would grow until the machine runs out.
MAX_SIMULATED_DEVICES = 4096


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


def check_device_count(count: object, name: str = "count") -> None:
    """Refuse a simulated device count that is not an int between 1 and ``MAX_SIMULATED_DEVICES``.

    Checked before ``jax_num_cpu_devices`` is set: a huge count would otherwise make
    the CPU client grow without bound, or fail inside jaxlib's bindings.

    Raises:
        TypeError: ``count`` is not an int.
        ConfigError: ``count`` is out of range; the message names ``name``.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"{name} must be an int (a number of simulated CPU devices), got {type(count).__name__}")
    if not 1 <= count <= MAX_SIMULATED_DEVICES:
        raise ConfigError(
            f"{name} must be between 1 and {MAX_SIMULATED_DEVICES} simulated CPU devices, got {count:,} "
            f"(the lab's layouts are drawn for {DEFAULT_SIMULATED_DEVICES})"
        )
