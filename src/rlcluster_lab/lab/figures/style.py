"""The lab's visual vocabulary, shared by the SVG figures and the matplotlib ones: role order
and colours, memory kinds, the parts of a sync, how bytes and entries are written, and how
wide text is in DejaVu Sans (the font of both kinds of figure), which keeps labels inside
their boxes."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rlcluster_lab.core.limits import BINARY_UNITS
from rlcluster_lab.core.roles import Role
from rlcluster_lab.core.shardings import MEMORY_KINDS
from rlcluster_lab.measure.memory import MEMORY_ENTRIES

ROLE_ORDER: tuple[str, ...] = tuple(role.value for role in Role)

ENTRY_ORDER: tuple[str, ...] = MEMORY_ENTRIES

KINDS: tuple[str, ...] = MEMORY_KINDS

ROLE_COLORS: dict[str, str] = {
    "actor": "#4c72b0",
    "rollout": "#dd8452",
    "reference": "#55a868",
    "reward": "#8172b3",
    "critic": "#937860",
    "anchor": "#da8bc3",
    "optimizer": "#8c8c8c",
    "critic_optimizer": "#b5a28f",
}


def role_color(name: str) -> str:
    """A role's (or memory entry's) colour; grey for a name that has none."""
    return ROLE_COLORS.get(name, "#999999")


KIND_COLORS: dict[str, str] = {"device": "#4c72b0", "pinned_host": "#ccb974"}

SYNC_PARTS: tuple[tuple[str, str, str], ...] = (
    # (report key, legend label, colour): the identity synced = arrived + copied + reused (L3).
    ("arrived_cross_device_bytes", "arrived from other devices", "#c44e52"),
    ("copied_same_device_bytes", "copied within a device", "#dd8452"),
    ("reused_bytes", "reused (no copy)", "#55a868"),
)

RELAYED = "#8b1a1a"  # bytes that crossed devices and did not stay (a sync's relayed excess)

HIGHLIGHT = "#f6c343"  # the branch that fired

IDLE = "#eeeeee"  # the branches that did not

IDLE_TEXT = "#9a9a9a"

PHYSICAL = "physical bytes (every device shard counted)"


def byte_ticks(top: float) -> list[tuple[float, str]]:
    """Round axis ticks from 0 to at least ``top`` bytes, each with its label: steps of 1, 2,
    2.5 or 5 times a power of ten in the unit ``top`` is written in (``fmt_bytes``), at most
    4 steps, every label in that one unit; the last tick is the axis' top.
    266,752 B (260.5 KiB) -> 0, 100, 200, 300 KiB."""
    top = max(float(top), 1.0)
    power = max(p for p in range(len(BINARY_UNITS)) if top >= 1024**p)
    unit = 1024**power
    scaled = top / unit
    decade = 10 ** math.floor(math.log10(scaled))
    steps = [f * decade for f in (0.1, 0.2, 0.25, 0.5, 1, 2, 2.5, 5) if power > 0 or f * decade >= 1]
    step = next((s for s in steps if math.ceil(scaled / s - 1e-9) <= 4), 10 * decade)
    values = [round(k * step, 6) for k in range(math.ceil(scaled / step - 1e-9) + 1)]
    return [(value * unit, f"{value:g} {BINARY_UNITS[power]}" if value else "0") for value in values]


def on_where(report: Mapping[str, Any]) -> str:
    """ " on TPU v5 lite chip 0": the devices a memory or sync report's figures come from, or ""."""
    return f" on {report['where']}" if report.get("where") else ""


def in_order(keys: Sequence[str], order: Sequence[str]) -> list[str]:
    """``keys`` in the lab's usual ``order`` (``ROLE_ORDER``, ``ENTRY_ORDER``), unknown ones last, sorted."""
    return [k for k in order if k in keys] + sorted(k for k in keys if k not in order)


def device_order(keys: Sequence[str]) -> list[str]:
    """Device keys of a report ("0", "1", ..., "10") in numeric order, any other key after them."""
    return sorted(keys, key=lambda k: (0, int(k)) if str(k).isdigit() else (1, str(k)))


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
