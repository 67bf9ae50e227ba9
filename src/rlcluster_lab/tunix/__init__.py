"""Point the lab at Tunix's own ``RLCluster`` (the optional ``[tunix]`` extra).

- ``inspect(rl_cluster)``: the lab's report of a Tunix cluster, read from its
  state: sharing map, whether rollout and actor share buffers, whether the
  reference shares the backbone, role meshes as constructed, the engine's mesh
  override, the anchor, memory per role x device x memory kind (a buffer held
  by several roles counted once). Decisions are observed, not traced.
  ``inspect(...).sync()`` runs the cluster's ``sync_weights`` under the lab's
  sync observer and P13 transfer guard.
- ``side_by_side(scenario)``: Tunix's cluster and the lab's for one scenario,
  compared decision by decision, each difference matched to the documented
  difference that explains it, checked on the two clusters.
- ``build_tunix_cluster(scenario)``: Tunix's cluster from the lab's models.

Importing this package imports neither Tunix nor JAX: the names below load on first
use, and a function that needs Tunix raises ``TunixMissingError`` saying how to
install the extra (``available()`` asks first). Nothing else in the lab imports
this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

if TYPE_CHECKING:
    from rlcluster_lab.tunix.build import ENGINES, Given, TunixBuild, build_tunix_cluster
    from rlcluster_lab.tunix.compare import Row, SideBySide, side_by_side
    from rlcluster_lab.tunix.differences import DIFFERENCES, DifferenceCheck, config_differences
    from rlcluster_lab.tunix.extra import (
        INSTALL_HINT,
        PINNED_VERSION,
        TunixMissingError,
        available,
        installed_version,
        require,
        version_note,
    )
    from rlcluster_lab.tunix.report import TunixReport, inspect
    from rlcluster_lab.tunix.sync import TunixSync

__all__ = [
    "DIFFERENCES",
    "DifferenceCheck",
    "ENGINES",
    "Given",
    "INSTALL_HINT",
    "PINNED_VERSION",
    "Row",
    "SideBySide",
    "TunixBuild",
    "TunixMissingError",
    "TunixReport",
    "TunixSync",
    "available",
    "build_tunix_cluster",
    "config_differences",
    "inspect",
    "installed_version",
    "require",
    "side_by_side",
    "version_note",
]

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
