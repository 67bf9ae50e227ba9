"""The notebook side: the set-up every notebook runs first, the notebooks' experiments, the
figures (each defined once: the report's figures in SVG, shown by the notebooks and the
widget lab; the notebooks' charts of steps, plans and shards in matplotlib), and the widget
lab itself, and the rule code shown beside a decision.

``from rlcluster_lab.lab import PlacementLab`` gives the lab; ``rlcluster_lab.setup()``
(``lab.setup.setup``) sets a notebook up and returns its ``LabDevices``. The names are
imported on first use: the widget lab imports ipywidgets, which a figure does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

if TYPE_CHECKING:
    from rlcluster_lab.lab.chip import chip_figures
    from rlcluster_lab.lab.code_view import show_rule
    from rlcluster_lab.lab.setup import LabDevices
    from rlcluster_lab.lab.widget import PlacementLab

__all__ = ["LabDevices", "PlacementLab", "chip_figures", "show_rule"]

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
