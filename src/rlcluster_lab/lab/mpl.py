"""Small matplotlib helpers for the lab's figures: a figure without pyplot, a bytes axis,
the order of entries and devices, and PNG bytes of a figure."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MultipleLocator


def to_png(fig: Figure, dpi: int = 100) -> bytes:
    """PNG bytes of a figure (for an ipywidgets Image or a file)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def bytes_axis(axis: Any, top: float) -> None:
    """Ticks at round numbers of one binary unit picked for ``top`` (0, 100 KiB, 200 KiB...)."""
    unit, name = 1, "B"
    for k, label in ((1, "KiB"), (2, "MiB"), (3, "GiB"), (4, "TiB")):
        if top >= 1024**k:
            unit, name = 1024**k, label
    scaled = max(top / unit, 1e-9)
    magnitude = 10 ** math.floor(math.log10(scaled / 5)) if scaled >= 5 else 1
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if scaled / (m * magnitude) <= 6)
    axis.set_major_locator(MultipleLocator(step * unit))
    axis.set_major_formatter(lambda v, _: f"{v / unit:g} {name}" if v else "0")


def new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def present_keys(keys: Sequence[str], order: Sequence[str]) -> list[str]:
    """``keys`` in the lab's usual order, unknown ones last (sorted, so stable)."""
    known = [k for k in order if k in keys]
    return known + sorted(k for k in keys if k not in order)


def device_order(keys: Sequence[str]) -> list[str]:
    return sorted(keys, key=lambda k: (0, int(k)) if str(k).isdigit() else (1, str(k)))
