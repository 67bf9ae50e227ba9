"""Small matplotlib helpers for the notebooks' matplotlib figures: a figure without pyplot, a
bytes axis, legend columns, PNG bytes of a figure, and the sizes every figure keeps to.

A notebook shows a figure at its own size: ``dpi`` pixels per inch of ``figsize`` (100, the
default), and a notebook's output column is about 1000 px wide. So no figure is wider than
``MAX_WIDTH`` inches (it would be shrunk, and its text with it), and no text is smaller than
``MIN_PT`` points: 9 pt at 100 dpi is 12.5 px, at least the 12 px that 9 pt is on a screen.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from rlcluster_lab.lab.figures.style import byte_ticks, text_width


def to_png(fig: Figure) -> bytes:
    """PNG bytes of a figure at 100 dpi (for an ipywidgets Image or a file)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def bytes_axis(axis: Any, top: float) -> None:
    """Ticks at round numbers of one binary unit picked for ``top`` (``style.byte_ticks``)."""
    ticks = byte_ticks(top)
    axis.set_ticks([value for value, _ in ticks], [text for _, text in ticks])


MAX_WIDTH = 10.0  # inches: 1000 px at the default 100 dpi

MIN_PT = 9.0  # the smallest font size in any figure

FONT = 10.0  # body text, tick labels, legends


def new_figure(width: float, height: float, layout: str | None = "constrained") -> Figure:
    """A figure (no pyplot) at most ``MAX_WIDTH`` wide."""
    return Figure(figsize=(min(width, MAX_WIDTH), height), layout=layout)


def legend_columns(fig: Figure, labels: Sequence[str]) -> int:
    """How many columns a legend under the figure (at ``MIN_PT``) can have and still fit its width."""
    widest = max([text_width(line, MIN_PT) for label in labels for line in label.split("\n")] + [1.0])
    per_column = widest + 3.2 * MIN_PT  # the swatch, its gap and the gap between columns, in pt
    return max(1, min(len(labels), int((72 * fig.get_figwidth() - 20) // per_column)))
