"""Checks that a figure can be read at the size it is shown: no text under 9 pt, no label cut
off at the figure's edge or overflowing its box, no legend over the data, no tick labels
running into each other. Used by the figure tests, for the matplotlib figures and the SVG ones."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from rlcluster_lab.lab.figures.mpl import MAX_WIDTH, MIN_PT
from rlcluster_lab.lab.figures.style import text_width
from rlcluster_lab.lab.figures.svg import MIN_FONT

NS = "{http://www.w3.org/2000/svg}"

SCREEN_PX_PER_PT = 4 / 3  # CSS: 1 pt = 4/3 px


def mpl_problems(fig: Figure) -> list[str]:
    """Everything in a matplotlib figure that cannot be read at its size (empty when legible)."""
    problems = []
    if fig.get_figwidth() > MAX_WIDTH + 1e-9:
        problems.append(f"figure {fig.get_figwidth():.1f} in wide: a notebook would shrink it")
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    ticks, shown = _tick_labels(fig)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    for t in texts:
        if (id(t) in ticks and id(t) not in shown) or not _is_drawn(t):
            continue
        if t.get_fontsize() < MIN_PT:
            problems.append(f"{t.get_text()[:40]!r} at {t.get_fontsize()} pt")
        box = t.get_window_extent(renderer)
        if box.x0 < edge.x0 - 1 or box.x1 > edge.x1 + 1 or box.y0 < edge.y0 - 1 or box.y1 > edge.y1 + 1:
            problems.append(f"{t.get_text()[:40]!r} runs past the figure's edge")
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    for legend in legends:
        lbox = legend.get_window_extent(renderer)
        for ax in fig.axes:
            for patch in ax.patches:
                pbox = patch.get_window_extent(renderer)
                if pbox.width > 0.5 and pbox.height > 0.5 and lbox.overlaps(pbox):
                    problems.append(f"legend over {patch.get_gid() or type(patch).__name__}")
            for t in ax.texts:
                if t.get_text().strip() and lbox.overlaps(t.get_window_extent(renderer)):
                    problems.append(f"legend over the label {t.get_text()[:40]!r}")
    for ax in fig.axes:
        if not ax.axison:
            continue
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if id(t) in shown and t.get_visible() and t.get_text().strip()]
            boxes = [t.get_window_extent(renderer) for t in labels]
            for a in range(len(boxes)):
                for b in range(a + 1, len(boxes)):
                    if boxes[a].overlaps(boxes[b]):
                        problems.append(f"tick labels {labels[a].get_text()!r} and {labels[b].get_text()!r} overlap")
    return problems


def _tick_labels(fig: Figure) -> tuple[set[int], set[int]]:
    """Ids of every tick label, and of those drawn: a tick outside the axis's view is not."""
    every, shown = set(), set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                inside = lo - 1e-9 * max(1.0, abs(hi)) <= tick.get_loc() <= hi + 1e-9 * max(1.0, abs(hi))
                for label in (tick.label1, tick.label2):
                    every.add(id(label))
                    if inside and ax.axison:
                        shown.add(id(label))
    return every, shown


def _is_drawn(t: Text) -> bool:
    """Whether the figure draws this text (tick labels of a hidden axis are not drawn)."""
    ax = t.axes
    if ax is None or ax.axison or t in ax.texts or t in (ax.title, ax._left_title, ax._right_title):
        return True
    return any(t is cell.get_text() for table in ax.tables for cell in table.get_celld().values())


def svg_problems(svg: str, shown_width: float | None = None) -> list[str]:
    """Everything in an SVG figure that cannot be read when shown ``shown_width`` px wide
    (default: its own width): text under 9 pt on screen, text past the canvas's edges, a
    label wider than the box it sits in."""
    root = ET.fromstring(svg)
    _, _, vw, vh = (float(v) for v in root.get("viewBox").split())
    scale = (shown_width or float(root.get("width"))) / vw
    problems = []
    boxes = [
        (el.get("id"), float(el.get("x")), float(el.get("y")), float(el.get("width")), float(el.get("height")))
        for el in root.iter(NS + "rect")
        if el.get("id") and el.get("x") is not None
    ]
    for el in root.iter(NS + "text"):
        content = "".join(el.itertext()) if el.find(NS + "title") is None else (el.find(NS + "title").tail or "")
        size = float(el.get("font-size"))
        if size * scale < MIN_FONT - 1e-9:
            problems.append(f"{content[:40]!r} at {size * scale / SCREEN_PX_PER_PT:.1f} pt on screen")
        x, y = float(el.get("x")), float(el.get("y"))
        w = text_width(content, size, el.get("font-weight") == "bold")
        anchor = el.get("text-anchor", "start")
        x0 = x - {"start": 0, "middle": w / 2, "end": w}[anchor]
        if x0 < -0.5 or x0 + w > vw + 0.5 or y > vh + 0.5 or y - size < -0.5:
            problems.append(f"{content[:40]!r} runs past the panel's edge")
        for bid, bx, by, bw, bh in boxes:
            if bx <= x <= bx + bw and by <= y - size / 3 <= by + bh and (x0 < bx - 0.5 or x0 + w > bx + bw + 0.5):
                problems.append(f"{content[:40]!r} is wider than its box {bid}")
    return problems


def text_boxes(svg: str) -> list[tuple[str, float, float, float, float]]:
    """Every drawn text of an SVG figure as (text, x0, y0, x1, y1) in the figure's units: its
    width measured as the lab measures it (``style.text_width``), from the cap height above its
    baseline to the descenders below."""
    root = ET.fromstring(svg)
    boxes = []
    for el in root.iter(NS + "text"):
        content = "".join(el.itertext()) if el.find(NS + "title") is None else (el.find(NS + "title").tail or "")
        if not content.strip():
            continue
        size = float(el.get("font-size"))
        x, y = float(el.get("x")), float(el.get("y"))
        w = text_width(content, size, el.get("font-weight") == "bold")
        x0 = x - {"start": 0, "middle": w / 2, "end": w}[el.get("text-anchor", "start")]
        boxes.append((content, x0, y - 0.75 * size, x0 + w, y + 0.2 * size))
    return boxes


def svg_overlaps(svg: str, tolerance: float = 1.0) -> list[str]:
    """Pairs of texts in an SVG figure whose boxes (``text_boxes``) overlap by more than
    ``tolerance`` px each way: labels that run together when drawn."""
    boxes = text_boxes(svg)
    found = []
    for i, (a, ax0, ay0, ax1, ay1) in enumerate(boxes):
        for b, bx0, by0, bx1, by1 in boxes[i + 1 :]:
            if min(ax1, bx1) - max(ax0, bx0) > tolerance and min(ay1, by1) - max(ay0, by0) > tolerance:
                found.append(f"{a[:40]!r} runs into {b[:40]!r}")
    return found
