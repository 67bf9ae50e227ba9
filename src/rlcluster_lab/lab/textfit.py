"""How wide a line of text is in DejaVu Sans (the font of the matplotlib figures and the first
font of the SVG figures), and text cut or wrapped to a width: what keeps labels inside their
boxes in both kinds of figure. Widths come in the unit of the size: px for px, pt for pt."""

from __future__ import annotations

import functools
import os


def text_width(text: str, size: float, bold: bool = False) -> float:
    """How wide ``text`` is at font size ``size`` in DejaVu Sans, in the unit of ``size`` (summed
    glyph advances, no kerning; Helvetica and Arial, the SVG figures' fallbacks, are narrower)."""
    em = _advances(bold)
    return size * sum(em.get(ch, 0.7) for ch in text)


@functools.cache
def _advances(bold: bool) -> dict[str, float]:
    """Advance per printable ASCII character, in em, read from the DejaVu Sans that matplotlib ships."""
    from matplotlib import get_data_path
    from matplotlib.ft2font import FT2Font, LoadFlags

    font = FT2Font(os.path.join(get_data_path(), "fonts", "ttf", "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"))
    font.set_size(100, 72)
    # linearHoriAdvance: the glyph's advance in 1/65536 px, here at 100 px to the em.
    codes = [*range(32, 127), *map(ord, "\u2026\u2192\u00d7\u2264\u2265\u2013\u2014")]
    return {chr(c): font.load_char(c, flags=LoadFlags.NO_HINTING).linearHoriAdvance / 65536 / 100 for c in codes}


def clip(text: str, width: float, size: float = 12.0, bold: bool = False) -> str:
    """Text cut to fit ``width`` (an ellipsis marks the cut)."""
    if text_width(text, size, bold) <= width:
        return text
    while len(text) > 1 and text_width(text + "\u2026", size, bold) > width:
        text = text[:-1]
    return text.rstrip() + "\u2026"


def wrap(text: str, width: float, size: float = 12.0, lines: int = 3, bold: bool = False) -> list[str]:
    """``text`` broken at spaces into lines that fit ``width``, at most ``lines`` of them
    (the last one clipped with an ellipsis if the text is longer still)."""
    out: list[str] = []
    line = ""
    for word in text.split():
        candidate = f"{line} {word}" if line else word
        if line and text_width(candidate, size, bold) > width:
            out.append(line)
            line = word
        else:
            line = candidate
    if line:
        out.append(line)
    if len(out) > lines:
        out = out[: lines - 1] + [clip(" ".join(out[lines - 1 :]), width, size, bold)]
    return [clip(o, width, size, bold) for o in out]
