"""The cluster on JAX's multi-process runtime: several processes, one program.

Multi-controller JAX runs the same Python program in every process; each
process owns some of the devices and holds only the shards that live on
them. This package starts such a run on one machine (``launcher``), sets
each process up (``worker``) and reports what each process holds and what
crossed (``report``); moving data across the process boundary
(``placement.crossing``) and reading host values and per-process facts back
(``core.gathering``) sit lower down, where the cluster uses them.

Importing the package imports no JAX: the CLI reads its flags first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

if TYPE_CHECKING:
    from rlcluster_lab.core.gathering import host_value, host_values
    from rlcluster_lab.multiprocess.launcher import LaunchError, run_report, run_reports

__all__ = ["LaunchError", "host_value", "host_values", "run_report", "run_reports"]

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
