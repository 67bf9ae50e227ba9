"""Stored reports for the figure tests (tests/data/reports, written by tests/data/make_reports.py),
and helpers that read an SVG figure back: its elements by id, their bytes, its text."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path
from typing import Any

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
STEP = "step-offload"  # one RL step phase by phase, not a placement report
PLACEMENTS = tuple(sorted(p.stem for p in REPORTS.glob("*.json") if p.stem != STEP))
NS = "{http://www.w3.org/2000/svg}"


@cache
def _text(name: str) -> str:
    return (REPORTS / f"{name}.json").read_text()


def stored(name: str) -> dict[str, Any]:
    """A fresh copy of the stored report ``name`` (a test may change it)."""
    return json.loads(_text(name))


def elements(svg: str) -> dict[str, ET.Element]:
    """The figure's elements that carry an id, by id."""
    root = ET.fromstring(svg)
    assert root.tag == NS + "svg"
    return {el.get("id"): el for el in root.iter() if el.get("id")}


def drawn_bytes(els: dict[str, ET.Element], prefix: str) -> int:
    """The bytes (``data-bytes``) of every element whose id starts with ``prefix``, added up."""
    return sum(int(el.get("data-bytes", 0)) for key, el in els.items() if key.startswith(prefix))


def svg_text(svg: str) -> str:
    """Every text the figure draws (not its hover titles), joined by spaces, with runs of white
    space made one."""
    root = ET.fromstring(svg)
    parts = []
    for el in root.iter(NS + "text"):
        parts.append(el.text or "")
        parts += [child.tail or "" for child in el]  # a <title> child is hover text: only what follows it
    return " ".join(" ".join(parts).split())


def is_hatched(el: ET.Element) -> bool:
    return (el.get("fill") or "").startswith("url(#hatch")
