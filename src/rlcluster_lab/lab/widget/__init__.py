"""The placement lab (``placement_lab.PlacementLab``): its knobs, its views, its status line and
the next training step rehearsed in the background."""
