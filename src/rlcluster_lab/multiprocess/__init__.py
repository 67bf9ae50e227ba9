"""The cluster on JAX's multi-process runtime: several processes, one program, each holding
the shards on its own devices. ``launcher`` starts a run on one machine, ``worker`` sets each
process up, ``report`` merges what each holds and what crossed. Importing it imports no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

if TYPE_CHECKING:
    from rlcluster_lab.core.gathering import host_values
    from rlcluster_lab.multiprocess.launcher import LaunchError, run_reports

__all__ = ["LaunchError", "host_values", "run_reports"]

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
