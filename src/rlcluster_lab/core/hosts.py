"""Which process owns what: the facts every multi-process path reads.

In a single process every device is addressable and these helpers reduce to
what the lab did before (the first device of a mesh, ``np.asarray``).
"""

from __future__ import annotations

from typing import Any

import jax


def home_device(mesh: Any) -> Any:
    """The device arrays made without a placement should land on while working on ``mesh``.

    The mesh's first device this process owns; a process that owns none of
    them (the trainer process, for a rollout mesh on another process) gets
    its own first device of the mesh's platform: a device it does not own
    cannot receive a host value here.
    """
    devices = list(mesh.devices.flat)
    own = next((d for d in devices if d.process_index == jax.process_index()), None)
    return own if own is not None else jax.local_devices(backend=devices[0].platform)[0]


def processes_of(devices: Any) -> list[int]:
    """The process indices owning ``devices``, sorted."""
    return sorted({int(d.process_index) for d in devices})


def foreign_device_ids() -> frozenset[int]:
    """Ids of the devices other processes own (empty in a single process).

    A compiled program that spans processes is the same text on every
    process, so each reads every flow in it; a process counts only the flows
    that land on its own devices, and process 0 adds the processes' counts.
    """
    return frozenset(int(d.id) for d in jax.devices() if d.process_index != jax.process_index())


def spans_processes(devices: Any) -> bool:
    """True when ``devices`` belong to more than one process."""
    return len(processes_of(devices)) > 1


def crosses_processes(src: Any, dst: Any) -> bool:
    """True when a move from device ``src[p]`` to ``dst[p]`` leaves a process for some position p."""
    return any(a.process_index != b.process_index for a, b in zip(src, dst))
