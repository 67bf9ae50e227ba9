"""The notebook side: the set-up every notebook runs first, the notebooks' experiments, the
figures (each defined once: the report's figures in SVG, shown by the notebooks and the
widget lab; the notebooks' charts of steps, plans and shards in matplotlib), and the widget
lab itself.

``from rlcluster_lab.lab import PlacementLab`` gives the lab.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # The widget lab imports ipywidgets: loaded only when it is asked for.
    if name in ("PlacementLab", "live_buffer_bytes"):
        from rlcluster_lab.lab import widget

        return getattr(widget, name)
    if name in ("Knobs", "shape_options", "CUSTOM"):
        from rlcluster_lab.lab import controls

        return getattr(controls, name)
    raise AttributeError(f"module 'rlcluster_lab.lab' has no attribute {name!r}")
