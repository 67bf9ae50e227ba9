"""A static picture of the lab, in plain HTML, for every renderer that cannot draw a widget.

A notebook stores each output as a bundle of formats; a renderer shows the best one it can.
JupyterLab draws the live widget, or, for a trusted notebook, the widget restored from the
state saved with the notebook; an untrusted notebook (a fresh clone), GitHub and other
renderers without widgets show the bundle's HTML instead of the widget's repr text. This is
that HTML: the knobs as they were set, the status, what changed, and every view, the figures
as SVG images, the view that was selected first and the others folded under it.

It uses only what JupyterLab's sanitizer keeps for an untrusted notebook (no ``<style>``, no
inline ``<svg>``: inline styles, ``<details>`` and images with ``data:`` addresses).
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from rlcluster_lab.lab.display import TITLES, VIEWS

if TYPE_CHECKING:
    from rlcluster_lab.lab.controls import Knobs
    from rlcluster_lab.lab.display import Display

_FONT = "font-size:12px;line-height:1.35"


def knob_value(widget: widgets.Widget) -> str:
    """A knob's setting as the widget shows it."""
    if isinstance(widget, widgets.Dropdown):
        return str(widget.label)
    if isinstance(widget, widgets.Checkbox | widgets.ToggleButton):
        return "on" if widget.value else "off"
    return str(widget.value)


def _in_screen_order(box: widgets.Widget, wanted: dict[int, str]) -> list[str]:
    """The fields of ``wanted`` (widget id -> field) in the order the column shows them."""
    if id(box) in wanted:
        return [wanted[id(box)]]
    return [field for child in getattr(box, "children", ()) for field in _in_screen_order(child, wanted)]


def knobs_table(knobs: Knobs) -> str:
    """Every knob shown now, top to bottom, with its setting (a knob that does not apply is greyed)."""
    custom = knobs.custom_box.layout.display != "none"
    outlined = knobs.outlined()
    rows = []
    for field in _in_screen_order(knobs.widget, {id(w): f for f, w in outlined.items()}):
        if field in ("rollout_shape", "rollout_devices") and not custom:
            continue
        widget = outlined[field]
        if field == "rollout_devices":
            name, value = "rollout devices", ", ".join(str(d.id) for d in knobs.picked_devices()) or "none"
        else:
            name, value = str(widget.description), knob_value(widget)
        color = "color:#9a9a9a;" if getattr(widget, "disabled", False) else ""
        cell = f"style='text-align:left;padding:1px 10px 1px 0;{color}'"
        rows.append(f"<tr><td {cell}>{html.escape(name)}</td><td {cell}><b>{html.escape(value)}</b></td></tr>")
    return f"<table class='rl-picture-knobs' style='{_FONT}'>{''.join(rows)}</table>"


def _output_html(out: widgets.Output) -> str:
    parts = []
    for item in out.outputs:
        data = item.get("data", {})
        if "image/svg+xml" in data:
            svg = "".join(data["image/svg+xml"]) if isinstance(data["image/svg+xml"], list) else data["image/svg+xml"]
            src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
            alt = html.escape(str(data.get("text/plain", "figure")), quote=True)
            parts.append(f"<img src='{src}' alt='{alt}' style='max-width:100%;height:auto;display:block'>")
        elif "text/plain" in data:
            parts.append(f"<pre style='{_FONT}'>{html.escape(str(data['text/plain']))}</pre>")
    return "".join(parts)


def view_html(display: Display, name: str) -> str:
    """One view's content: its heading and figures, or its HTML (the summary, the step log)."""
    heading = f"<div><b>{html.escape(TITLES[name])}</b></div>" if name in TITLES else ""
    if name == "summary":
        body = display.summary.value
    elif name == "steps":
        body = display.step_log.value or "<i>no training step yet</i>"
    else:
        body = _output_html(display.outputs[name])
    return f"<div class='rl-picture-view rl-picture-view-{name}'>{heading}{body}</div>"


def lab_picture(knobs: Knobs, display: Display, status: str) -> str:
    """The lab as it stands, as one block of HTML: the knobs' column beside the views."""
    shown = display.shown
    tabs = " · ".join(
        f"<b>[{html.escape(title)}]</b>" if name == shown else html.escape(title) for name, title in VIEWS
    )
    folded = "".join(
        f"<details><summary>{html.escape(title)}</summary>{view_html(display, name)}</details>"
        for name, title in VIEWS
        if name != shown
    )
    left = (
        "<div style='flex:0 0 400px;max-width:400px'>"
        "<div><b>Placement lab</b>, as last run: a picture of the widget. Run the notebook to turn its knobs.</div>"
        f"<div class='rl-picture-status' style='margin:4px 0;{_FONT}'><i>{html.escape(status)}</i></div>"
        f"{knobs_table(knobs)}{display.changes.value}</div>"
    )
    right = (
        "<div style='flex:1 1 480px;min-width:0'>"
        f"<div class='rl-picture-tabs' style='margin-bottom:4px'>{tabs}</div>"
        f"{view_html(display, shown)}{folded}</div>"
    )
    return (
        f"<div class='rl-lab-picture' style='display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start;{_FONT}'>"
        f"{left}{right}</div>"
    )


def text_line(status: str) -> str:
    """The bundle's plain-text form: what the lab is, and its status."""
    return f"PlacementLab (an interactive widget: run the notebook to use it). {status}"


def mimebundle(widget_bundle: dict[str, Any], knobs: Knobs, display: Display, status: str) -> dict[str, Any]:
    """The widget's own bundle with the picture as its HTML and one line as its text."""
    return {**widget_bundle, "text/html": lab_picture(knobs, display, status), "text/plain": text_line(status)}
