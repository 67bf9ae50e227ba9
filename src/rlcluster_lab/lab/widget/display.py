"""The lab's display: the views (SVG figures of the report, the summary, the step log) in one
``Tab``, so the lab fits a 1600 x 1000 screen beside its knobs, and the "what changed" list,
each redrawn only when the part of the report it shows has changed; and the lab's style sheet.

The figures are the notebooks' own (pure functions of report JSON that return SVG, drawn in
milliseconds), put into ``Output`` widgets as display data: core ipywidgets only (no ipympl,
which Colab does not run), so it runs in JupyterLab, VS Code and Colab alike.

Where no widget can be drawn (an untrusted notebook, GitHub), the output bundle's HTML is a
static picture of the lab (``lab_picture``). It uses only what JupyterLab's sanitizer keeps
for an untrusted notebook (no ``<style>``, no inline ``<svg>``: inline styles, ``<details>``
and ``data:`` images).
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from rlcluster_lab.app.learner import StepRecord
from rlcluster_lab.app.report import devices_text
from rlcluster_lab.lab.figures.flow import (
    actor_share_text,
    changes_html,
    engine_copied,
    p14_joined,
    rollout_text,
    warning_lines,
)
from rlcluster_lab.lab.figures.memory import memory_by_device, memory_by_role
from rlcluster_lab.lab.figures.placement import decision_flow, device_grid
from rlcluster_lab.lab.figures.sync import sync_bytes, sync_peak, sync_plan
from rlcluster_lab.lab.widget.status import STEP_COUNTER

if TYPE_CHECKING:
    from rlcluster_lab.lab.widget.controls import Knobs

# The panels (the views that show figures), each with its heading.
TITLES = {
    "flow": "Decision flow (L1): the branches that fired are highlighted",
    "grid": "Devices: which role holds what, on which device",
    "memory": "Memory (L2): physical bytes per device and per role, by memory kind",
    "sync": "Weight sync (P13, L3): bytes against the minimum the placement allows, and its transient peak",
}
# The tabs, in reading order: (view, tab title). Every panel is one view.
VIEWS = (
    ("summary", "Summary"),
    ("flow", "Decision flow"),
    ("grid", "Devices"),
    ("memory", "Memory"),
    ("sync", "Weight sync"),
    ("steps", "Training steps"),
)
# Each figure fits the screen's height under JupyterLab's bars and the tab bar (the
# browser test checks a 1600 x 1000 window); a wider view than the tab is scaled to it.
# The knobs a refusal names get a red outline, and its message a note beside the first of
# them, placed over the views (out of the flow: nothing moves when it shows, ``placement_lab.Notes``).
# A knob changed since the last Construct gets an orange bar at its left (a shadow: nothing
# moves), and every view a line saying it shows the constructed cluster (``Display.mark_stale``).
# The status sentence spans the lab's width above the knobs and views, two lines high at least:
# a sentence longer than that wraps onto more lines rather than being cut off (all of it in
# its hover title and the details too); one of two lines leaves the knobs where they were.
STYLE = """<style>
.rl-lab .rl-view img { max-width: 100%; max-height: calc(100vh - 220px); width: auto; height: auto; }
.rl-lab .rl-at-fault { outline: 2px solid #c00; outline-offset: 1px; }
.rl-lab .rl-pending { box-shadow: -4px 0 0 #e69f00; }
.rl-lab .rl-stale .widget-html-content { font-size: 12px; line-height: 1.35; white-space: normal; color: #8a5a00; }
.rl-lab .rl-changes { font-size: 12px; line-height: 1.35; }
.rl-lab .rl-status .widget-html-content { font-size: 12px; line-height: 1.4; min-height: 34px; white-space: normal; }
.rl-lab .rl-status.rl-busy .widget-html-content { color: #8a5a00; }
.rl-lab .rl-details { font-size: 12px; line-height: 1.35; }
.rl-lab .rl-controls .widget-html-content { line-height: 1.35; }
.rl-lab .rl-controls, .rl-lab .rl-controls .widget-box, .rl-lab .rl-slot { overflow: visible; }
.rl-lab .rl-slot { position: relative; }
.rl-lab .rl-note { position: absolute; left: calc(100% + 16px); top: 0; width: 380px; z-index: 30; margin: 0;
  border: 1px solid #c00; background: #fee; padding: 6px; font-size: 12px; line-height: 1.35;
  box-shadow: 0 2px 6px rgba(0, 0, 0, 0.25); }
.rl-lab .rl-note .widget-html-content { white-space: normal; line-height: 1.35; }
.rl-lab .rl-sharing td, .rl-lab .rl-sharing th { padding: 1px 12px 1px 0; }
</style>"""


def display_data(text: str, svg: str | None = None) -> dict[str, Any]:
    """One display-data output: ``text``, or an SVG figure with ``text`` as its alt text."""
    data = {"text/plain": text} if svg is None else {"image/svg+xml": str(svg), "text/plain": text}
    return {"output_type": "display_data", "data": data, "metadata": {}}


class Display:
    """The widgets that show a report: the views in tabs and the "what changed" list."""

    def __init__(self) -> None:
        self._drawn: dict[str, str] = {}  # panel -> the data its figures were drawn from
        self.style = widgets.HTML(STYLE, layout=widgets.Layout(display="none"))  # applies while hidden
        # add_class returns the widget: each is made with its class.
        self.summary = widgets.HTML().add_class("rl-summary")
        self.changes = widgets.HTML().add_class("rl-changes")
        self.step_log = widgets.HTML().add_class("rl-step-log")
        self.outputs = {
            name: widgets.Output(layout=widgets.Layout(min_height="120px")).add_class(f"rl-panel-{name}")
            for name in TITLES
        }
        # Per view, under its heading: what it shows is the last construction, not the knobs' changes since.
        self.stale = {
            name: widgets.HTML(layout=widgets.Layout(display="none")).add_class("rl-stale") for name, _ in VIEWS
        }
        self.stale_text = ""
        # One tab per view, each under its title (the panels keep their figures' own width, scaled down only
        # where the tab is narrower).
        content: dict[str, widgets.Widget] = {"summary": self.summary, "steps": self.step_log, **self.outputs}
        pages = []
        for name, _title in VIEWS:
            heading = [widgets.HTML(f"<b>{html.escape(TITLES[name])}</b>")] if name in TITLES else []
            page = widgets.VBox(heading + [self.stale[name], content[name]], layout=widgets.Layout(padding="2px"))
            pages.append(page.add_class("rl-view").add_class(f"rl-view-{name}"))
        self.tabs = widgets.Tab(pages, titles=[title for _, title in VIEWS], selected_index=1).add_class("rl-views")

    def show(self, view: str) -> None:
        """Select the view's tab (``VIEWS``): what an action changed comes into view."""
        self.tabs.selected_index = [name for name, _ in VIEWS].index(view)

    def mark_stale(self, pending: Sequence[tuple[str, str, str]]) -> None:
        """Label every view as showing the last construction while knobs differ from it (``pending``:
        label, setting then, setting now); no label when nothing is pending."""
        changes = ", ".join(f"{name} {before} \u2192 {now}" for name, before, now in pending)
        self.stale_text = (
            f"Showing the cluster as last constructed; changed since, not applied until Construct: {changes}"
            if pending
            else ""
        )
        for note in self.stale.values():
            note.value = f"<i>{html.escape(self.stale_text)}</i>"
            note.layout.display = "block" if pending else "none"

    @property
    def shown(self) -> str:
        """The view whose tab is selected."""
        return VIEWS[self.tabs.selected_index or 0][0]

    def draw(
        self, report: dict[str, Any], steps: Sequence[StepRecord], changes: Sequence[str] = ()
    ) -> tuple[float, list[str]]:
        """Redraw the panels whose data changed since they were last drawn.

        Each panel's figures are pure functions of part of the report (the
        decisions, the memory, the sync): a panel whose part is unchanged keeps
        its figures.

        Returns:
            The seconds drawing took, and the panels redrawn.
        """
        start = time.perf_counter()
        self.summary.value = summary_html(report)
        self.changes.value = changes_html(changes)
        self.step_log.value = steps_html(steps)
        sync = report.get("sync")
        memory = report["memory"]
        draws: dict[str, tuple[Any, list[Callable[[], Any]] | str]] = {
            "flow": (
                (report["decisions"], report["sharing_map"], report["rollout_branch"], report["anchor"]),
                [lambda: decision_flow(report)],
            ),
            "grid": ((report["role_to_mesh"], report["config_role_to_mesh"], memory), [lambda: device_grid(report)]),
            "memory": (
                (memory, report["decisions"], report["offload_to_cpu"]),
                [lambda: memory_by_device(memory), lambda: memory_by_role(memory, report)],
            ),
            "sync": (
                sync,
                [lambda: sync_bytes(sync), lambda: sync_plan(sync)]
                + ([lambda: sync_peak(sync)] if sync.get("transient_peak") else [])
                if sync
                else "no sync measured yet: press Sync weights (P13)",
            ),
        }
        redrawn = []
        for name, (data, draw) in draws.items():
            key = json.dumps(data, sort_keys=True, default=str)
            if self._drawn.get(name) == key:
                continue
            try:
                shown = (
                    [display_data(draw)] if isinstance(draw, str) else [display_data(TITLES[name], f()) for f in draw]
                )
            except Exception as exc:  # noqa: BLE001 - one broken figure must not take the lab down
                shown = [display_data(f"could not draw this panel: {type(exc).__name__}: {exc}")]
            self.outputs[name].outputs = tuple(shown)
            self._drawn[name] = key
            redrawn.append(name)
        return time.perf_counter() - start, redrawn

    def clear(self, text: str) -> None:
        """Every panel shows ``text`` instead of a figure."""
        self._drawn = {}
        self.summary.value = self.changes.value = self.step_log.value = ""
        for out in self.outputs.values():
            out.outputs = (display_data(text),)


def summary_html(report: dict[str, Any]) -> str:
    """The report's headline facts: sharing map, rollout branch, meshes, anchor, memory, warnings."""
    rows = "".join(
        f"<tr><td>{html.escape(role)}</td><td>{html.escape(', '.join(others) or 'no link')}</td>"
        f"<td>{html.escape(actor_share_text(report, role)) if report.get('memory') else ''}</td>"
        f"<td>{_mesh_text(report['role_to_mesh'].get(role))}</td></tr>"
        for role, others in report["sharing_map"].items()
    )
    memory = report.get("memory") or {}
    lines = [
        f"on <b>{html.escape(devices_text(report))}</b>; "
        f"engine <b>{html.escape(report['engine'])}</b>"
        + ("; LoRA actor" if report["lora"] else "")
        + ("; offload to pinned host" if report["offload_to_cpu"] else ""),
        f"rollout branch (P3): <b>{html.escape(report['rollout_branch'])}</b>; "
        f"rollout samples with the actor's own buffers: <b>{report['rollout_shares_actor_weights']}</b>; "
        f"reference shares the actor's backbone: <b>{report['reference_shares_backbone']}</b>"
        + (" (P4 warned of a copy at construction; P14 has since joined it)" if p14_joined(report) else ""),
    ]
    if engine_copied(report):
        lines.append(f"rollout: {html.escape(rollout_text(report))}")
    if report.get("mesh_overridden_by_engine"):
        lines.append("P7: the engine replaced the rollout mesh; the sharing map was built from the config's meshes")
    anchor = report["anchor"]
    lines.append(f"anchor (P8): {anchor['bytes']:,} bytes in {html.escape(str(anchor['memory_kind']))}")
    if memory:
        lines.append(
            f"memory (measured, physical bytes): {memory['unique_bytes']:,} in unique buffers, "
            f"{memory['naive_bytes']:,} if every role held its own"
        )
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in warning_lines(report))
    return (
        "<div class='rl-sharing'><b>sharing map (P1, P2)</b>"
        "<table style='text-align:left'><tr><th>role</th><th>linked in the map</th>"
        "<th>holds of the actor's buffers (measured)</th>"
        "<th>mesh (after construction)</th></tr>"
        f"{rows}</table></div>"
        + "".join(f"<div>{line}</div>" for line in lines)
        + (f"<ul class='rl-warnings'>{warnings}</ul>" if warnings else "")
    )


def _mesh_text(mesh: dict[str, Any] | None) -> str:
    if not mesh:
        return "(not present)"
    shape = " x ".join(f"{k}={v}" for k, v in mesh["shape"].items())
    return html.escape(f"{shape} on devices {mesh['device_ids']}")


def steps_html(steps: Sequence[StepRecord]) -> str:
    if not steps:
        return ""
    # Each step ends with a sync (P13): the global step that sync reached is the step's number.
    rows = "".join(
        f"<tr><td>{s.sync.global_step if s.sync is not None else ''}</td><td>{s.mean_reward:.3f}</td>"
        f"<td>{s.loss:+.4f}</td><td>{s.kl:.2e}</td><td>{_optimizer_steps(s)}</td></tr>"
        for s in steps
    )
    return (
        "<b>training steps</b> (toy reward: lowercase letters in the completion)"
        f"<table style='text-align:left'><tr><th>{STEP_COUNTER}</th><th>mean reward</th><th>loss</th><th>kl</th>"
        "<th>optimizer steps</th></tr>"
        f"{rows}</table>"
    )


def _optimizer_steps(s: StepRecord) -> str:
    """The step's optimizer steps, and those that kept the previous parameters (why, on hover)."""
    if not s.rejected_steps:
        return str(s.optimizer_steps)
    return f"{s.optimizer_steps} (<span title='{html.escape(s.rejected or '')}'>{s.rejected_steps} rejected</span>)"


_FONT = "font-size:12px;line-height:1.35"


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
        name, value = knobs.shown(field)
        color = "color:#9a9a9a;" if getattr(outlined[field], "disabled", False) else ""
        cell = f"style='text-align:left;padding:1px 10px 1px 0;{color}'"
        rows.append(f"<tr><td {cell}>{html.escape(name)}</td><td {cell}><b>{html.escape(value)}</b></td></tr>")
    return f"<table class='rl-picture-knobs' style='{_FONT}'>{''.join(rows)}</table>"


def _output_html(out: widgets.Output) -> str:
    parts = []
    for item in out.outputs:
        data = item.get("data", {})
        if "image/svg+xml" in data:
            svg = "".join(data["image/svg+xml"])  # a str, or the lines of one
            src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
            alt = html.escape(str(data.get("text/plain", "figure")), quote=True)
            parts.append(f"<img src='{src}' alt='{alt}' style='max-width:100%;height:auto;display:block'>")
        elif "text/plain" in data:
            parts.append(f"<pre style='{_FONT}'>{html.escape(str(data['text/plain']))}</pre>")
    return "".join(parts)


def view_html(display: Display, name: str) -> str:
    """One view's content: its heading and figures, or its HTML (the summary, the step log)."""
    heading = f"<div><b>{html.escape(TITLES[name])}</b></div>" if name in TITLES else ""
    if display.stale_text:
        heading += f"<div><i>{html.escape(display.stale_text)}</i></div>"
    html_views = {"summary": display.summary.value, "steps": display.step_log.value or "<i>no training step yet</i>"}
    body = html_views[name] if name in html_views else _output_html(display.outputs[name])
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


def mimebundle(widget_bundle: dict[str, Any], knobs: Knobs, display: Display, status: str) -> dict[str, Any]:
    """The widget's own bundle with the picture as its HTML and, as its text, what the lab is and its status."""
    text = f"PlacementLab (an interactive widget: run the notebook to use it). {status}"
    return {**widget_bundle, "text/html": lab_picture(knobs, display, status), "text/plain": text}
