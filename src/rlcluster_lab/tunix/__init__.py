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

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "DIFFERENCES": "rlcluster_lab.tunix.differences",
    "DifferenceCheck": "rlcluster_lab.tunix.differences",
    "ENGINES": "rlcluster_lab.tunix.build",
    "Given": "rlcluster_lab.tunix.build",
    "INSTALL_HINT": "rlcluster_lab.tunix.extra",
    "PINNED_VERSION": "rlcluster_lab.tunix.extra",
    "Row": "rlcluster_lab.tunix.compare",
    "SideBySide": "rlcluster_lab.tunix.compare",
    "TunixBuild": "rlcluster_lab.tunix.build",
    "TunixMissingError": "rlcluster_lab.tunix.extra",
    "TunixReport": "rlcluster_lab.tunix.report",
    "TunixSync": "rlcluster_lab.tunix.sync",
    "available": "rlcluster_lab.tunix.extra",
    "build_tunix_cluster": "rlcluster_lab.tunix.build",
    "config_differences": "rlcluster_lab.tunix.differences",
    "inspect": "rlcluster_lab.tunix.report",
    "installed_version": "rlcluster_lab.tunix.extra",
    "require": "rlcluster_lab.tunix.extra",
    "side_by_side": "rlcluster_lab.tunix.compare",
}
_SUBMODULES = ("adapters", "build", "compare", "differences", "extra", "observe", "report", "standin", "sync")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
