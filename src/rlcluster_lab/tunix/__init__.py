"""Point the lab at Tunix's own ``RLCluster`` (the optional ``[tunix]`` extra).

``inspect(rl_cluster)``: the lab's report of a Tunix cluster; ``side_by_side(scenario)``: Tunix's
cluster and the lab's, decision by decision; ``build_tunix_cluster(scenario)``. Importing this
package imports neither Tunix nor JAX (``available()`` asks whether Tunix is installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

if TYPE_CHECKING:
    from rlcluster_lab.tunix.build import build_tunix_cluster
    from rlcluster_lab.tunix.compare import Row, SideBySide, side_by_side
    from rlcluster_lab.tunix.differences import DIFFERENCES, config_differences
    from rlcluster_lab.tunix.extra import INSTALL_HINT, TunixMissingError, available, require, version_note
    from rlcluster_lab.tunix.report import inspect

__all__ = [
    "DIFFERENCES",
    "INSTALL_HINT",
    "Row",
    "SideBySide",
    "TunixMissingError",
    "available",
    "build_tunix_cluster",
    "config_differences",
    "inspect",
    "require",
    "side_by_side",
    "version_note",
]

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
