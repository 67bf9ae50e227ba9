"""Which process owns what: the facts every multi-process path reads (in one process: the first
device of a mesh, ``np.asarray``)."""

from __future__ import annotations

from typing import Any

import jax


def home_device(mesh: Any) -> Any:
    """The device arrays made without a placement land on while working on ``mesh``: the mesh's first
    device this process owns, else its own first device of that platform."""
    devices = list(mesh.devices.flat)
    own = next((d for d in devices if d.process_index == jax.process_index()), None)
    return own if own is not None else jax.local_devices(backend=devices[0].platform)[0]


def processes_of(devices: Any) -> list[int]:
    """The process indices owning ``devices``, sorted."""
    return sorted({int(d.process_index) for d in devices})


def foreign_device_ids() -> frozenset[int]:
    """Ids of the devices other processes own (empty in a single process): a program spanning
    processes is the same text on each, and each counts only the flows onto its own devices."""
    return frozenset(int(d.id) for d in jax.devices() if d.process_index != jax.process_index())


def spans_processes(devices: Any) -> bool:
    """True when ``devices`` belong to more than one process."""
    return len(processes_of(devices)) > 1


def crosses_processes(src: Any, dst: Any) -> bool:
    """True when a move from device ``src[p]`` to ``dst[p]`` leaves a process for some position p."""
    return any(a.process_index != b.process_index for a, b in zip(src, dst))
