"""SVG drawing for the lab's figures: a small canvas (rectangles, text, lines, paths, hatches)
whose elements carry ids and hover titles, rendered to a string that a notebook and the
widget lab show as a figure."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

from rlcluster_lab.lab.figures.style import text_width

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"

TEXT = "#222222"

MUTED = "#5f5f5f"

WIDTH = 760  # a figure's width in px: it fits a notebook's output column and the lab's view beside its knobs

# The smallest text a figure draws, in px at its own width: 12 px is 9 pt (1 pt = 4/3 px). A figure
# is shown at its width (``WIDTH``), so this is the size on screen.
MIN_FONT = 12.0


class Svg(str):
    """SVG markup that a notebook displays as a figure."""

    def _repr_svg_(self) -> str:
        return str(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # A notebook stores this as the figure's text/plain beside the SVG: one line, not the markup again.
        size = re.search(r'width="([\d.]+)" height="([\d.]+)"', self)
        printer.text(f"<SVG figure, {size.group(1)} x {size.group(2)} px>" if size else "<SVG figure>")


class Canvas:
    """A minimal SVG writer: rectangles, text, lines and paths, with ids and hover titles."""

    def __init__(self, width: float, height: float, title: str) -> None:
        self.width, self.height = width, height
        self._items: list[str] = []
        self._patterns: dict[str, str] = {}
        self.text(8, 20, title, size=14, weight="bold")  # every figure's heading, at its top left

    def hatch(self, color: str, tint: str, dotted: bool = False) -> str:
        """A fill of thin diagonal lines in ``color`` over a light tint of ``tint``: what marks
        another role's buffers. Light enough for dark text. ``dotted``: with dots in ``tint``
        between the lines, the same buffers in pinned host memory (``kind_fill``)."""
        pid = f"hatch-{'dots-' if dotted else ''}{color.lstrip('#')}-{tint.lstrip('#')}"
        dots = f'<circle cx="3.5" cy="3.5" r="1.2" fill="{tint}"/>' if dotted else ""
        self._patterns[pid] = (
            f'<pattern id="{pid}" width="7" height="7" patternUnits="userSpaceOnUse" '
            f'patternTransform="rotate(45)"><rect width="7" height="7" fill="{tint}" fill-opacity="0.22"/>'
            f'<line x1="0" y1="0" x2="0" y2="7" stroke="{color}" stroke-width="2" stroke-opacity="0.75"/>{dots}'
            "</pattern>"
        )
        return f"url(#{pid})"

    def dots(self, color: str) -> str:
        """A dotted fill in ``color``: what marks pinned host memory."""
        pid = "dots-" + color.lstrip("#")
        self._patterns[pid] = (
            f'<pattern id="{pid}" width="5" height="5" patternUnits="userSpaceOnUse">'
            f'<rect width="5" height="5" fill="{color}" fill-opacity="0.2"/>'
            f'<circle cx="2.5" cy="2.5" r="1.3" fill="{color}"/></pattern>'
        )
        return f"url(#{pid})"

    def kind_fill(self, kind: str, color: str) -> str:
        """The fill of bytes in memory ``kind``: ``color``, dotted in pinned host memory."""
        return self.dots(color) if kind == "pinned_host" else color

    def rect(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        fill: str,
        *,
        stroke: str | None = None,
        width: float = 1.0,
        rx: float = 0,
        dash: str | None = None,
        id: str | None = None,
        title: str | None = None,
        nbytes: int | None = None,
        opacity: float | None = None,
    ) -> None:
        attrs = [f'x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" fill="{fill}"']
        if opacity is not None:
            attrs.append(f'fill-opacity="{opacity}"')
        if nbytes is not None:
            attrs.append(f'data-bytes="{int(nbytes)}"')  # the figure's number, for readers and tests
        if stroke:
            attrs.append(f'stroke="{stroke}" stroke-width="{width}"')
        if rx:
            attrs.append(f'rx="{rx}"')
        if dash:
            attrs.append(f'stroke-dasharray="{dash}"')
        self._add("rect", " ".join(attrs), id, title)

    def bar(
        self, x: float, y: float, size: float, scale: float, parts: Iterable[tuple], *, up: bool = False, **style: Any
    ) -> float:
        """One bar's segments end to end, each ``bytes * scale`` long: rightwards from ``x`` at ``y``,
        ``size`` high, or with ``up`` upwards from ``y`` at ``x``, ``size`` wide. ``parts``: (bytes,
        fill, id, title), one of no bytes left out. Returns where the bar ends (x, or with ``up`` y)."""
        for n, fill, id, title in parts:
            if n > 0:
                if up:
                    y -= n * scale
                    self.rect(x, y, size, n * scale, fill, id=id, title=title, nbytes=n, **style)
                else:
                    self.rect(x, y, n * scale, size, fill, id=id, title=title, nbytes=n, **style)
                    x += n * scale
        return y if up else x

    def text(
        self,
        x: float,
        y: float,
        s: str,
        *,
        size: float = 12,
        anchor: str = "start",
        weight: str | None = None,
        fill: str = TEXT,
        id: str | None = None,
        title: str | None = None,
    ) -> None:
        attrs = f'x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}"'
        if weight:
            attrs += f' font-weight="{weight}"'
        self._add("text", attrs, id, title, html.escape(s))

    def text_lines(self, x: float, y: float, lines: Sequence[str], step: float = 16, **style: Any) -> float:
        """``lines`` one under another from ``y``, ``step`` apart (``style`` as ``text``'s); returns
        the y under the last."""
        for line in lines:
            self.text(x, y, line, **style)
            y += step
        return y

    def line(
        self,
        x1: float,
        y1: float,
        x2: float,
        y2: float,
        stroke: str,
        *,
        width: float = 1.0,
        dash: str | None = None,
        id: str | None = None,
        title: str | None = None,
        nbytes: int | None = None,
    ) -> None:
        attrs = f'x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" stroke-width="{width}"'
        if dash:
            attrs += f' stroke-dasharray="{dash}"'
        if nbytes is not None:
            attrs += f' data-bytes="{int(nbytes)}"'  # the figure's number, for readers and tests
        self._add("line", attrs, id, title)

    def arrow(self, d: str, stroke: str, *, id: str | None = None, title: str | None = None) -> None:
        """A path ``d`` that ends in an arrowhead."""
        self._patterns["arrow"] = (
            '<marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
            'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#555555"/></marker>'
        )
        self._add(
            "path", f'd="{d}" fill="none" stroke="{stroke}" stroke-width="1.2" marker-end="url(#arrow)"', id, title
        )

    def _add(self, tag: str, attrs: str, id: str | None, title: str | None, body: str | None = None) -> None:
        """One element with its hover title and ``body`` (a text's) inside; one with neither closes itself."""
        head = f"<{tag} {attrs}" + (f' id="{html.escape(id, quote=True)}"' if id else "")
        inner = (f"<title>{html.escape(title)}</title>" if title else "") + (body or "")
        self._items.append(f"{head}/>" if body is None and not inner else f"{head}>{inner}</{tag}>")

    def render(self) -> Svg:
        defs = f"<defs>{''.join(self._patterns.values())}</defs>" if self._patterns else ""
        return Svg(
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" height="{self.height:.0f}" '
            f'viewBox="0 0 {self.width:.0f} {self.height:.0f}" font-family="{FONT}">'
            f'<rect width="100%" height="100%" fill="white"/>{defs}{"".join(self._items)}</svg>'
        )


def legend(c: Canvas, x: float, y: float, items: Sequence[tuple[str, str]]) -> float:
    """Swatches and labels, left to right, wrapping 8 px from the right edge; returns the y below
    them. Each swatch's id is ``legend:<its label>``."""
    width = c.width - x - 8
    cx = x
    for fill, label in items:
        w = 18 + text_width(label, MIN_FONT)
        if cx + w > x + width and cx > x:
            cx, y = x, y + 20
        c.rect(cx, y - 11, 13, 13, fill, stroke="#888888", width=0.6, id=f"legend:{label}")
        c.text(cx + 18, y, label, size=MIN_FONT)
        cx += w + 12
    return y + 20
