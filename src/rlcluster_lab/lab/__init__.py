"""The notebook side, one concern per folder, each importing only the folders under it:
``widget`` (the placement lab) and ``experiments`` (the notebooks' runs on live clusters), over
``notebook`` (the set-up every notebook runs first, the chip's hand-over, the warm start, the
working copies), over ``figures`` (each defined once: the report's in SVG, shown by the
notebooks and the widget; the notebooks' charts in matplotlib) and ``rule_code`` (a rule's code
shown beside a decision).

``from rlcluster_lab.lab import PlacementLab`` gives the lab; ``rlcluster_lab.setup()``
(``lab.notebook.setup.setup``) sets a notebook up and returns its ``LabDevices``. The names are
imported on first use: the widget lab imports ipywidgets, which a figure does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

if TYPE_CHECKING:
    from rlcluster_lab.lab.experiments.chip import chip_figures
    from rlcluster_lab.lab.notebook.setup import LabDevices
    from rlcluster_lab.lab.rule_code.view import show_rule
    from rlcluster_lab.lab.widget.placement_lab import PlacementLab

__all__ = ["LabDevices", "PlacementLab", "chip_figures", "show_rule"]

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
