"""The cluster on JAX's multi-process runtime: several processes, one program.

Multi-controller JAX runs the same Python program in every process; each
process owns some of the devices and holds only the shards that live on
them. This package starts such a run on one machine (``launcher``), sets
each process up (``worker``), moves data across the process boundary
(``crossing``), reads host values and per-process facts back
(``gathering``), and reports what each process holds and what crossed
(``report``).

Importing the package imports no JAX: the CLI reads its flags first.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "LaunchError": "rlcluster_lab.multiprocess.launcher",
    "host_value": "rlcluster_lab.core.gathering",
    "host_values": "rlcluster_lab.core.gathering",
    "run_report": "rlcluster_lab.multiprocess.launcher",
    "run_reports": "rlcluster_lab.multiprocess.launcher",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlcluster_lab.multiprocess' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
