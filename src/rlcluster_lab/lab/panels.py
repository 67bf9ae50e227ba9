"""The lab's figures as SVG: decision flow, device grid, memory by device and by role, sync.

Each function takes a report's JSON (the placement report, its ``memory`` or
its ``sync``) and returns an ``Svg``: the markup as a string, displayed as a
figure in a notebook and in the lab's panels. They are pure functions of the
report and recompute no decision. SVG is drawn in a few milliseconds (a
matplotlib figure with this much text takes about half a second to render
on a small CPU), stays sharp at any zoom, keeps its text selectable, and
says more on hover (``<title>``). Elements that tests look up carry an
``id``: ``"P3:shared"`` for a decision's answer, ``"cell:rollout:5"`` for a
device cell, ``"seg:<what>:<key>"`` for a bar segment.

Bytes are physical bytes, as in the reports: every device shard counted.
A buffer that several roles hold is drawn once: hatched, in the colour of
the first role that holds it, and named in the legend ("actor = rollout").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The byte panels live in their own module; the lab and the notebooks reach every panel here.
from rlcluster_lab.lab.byte_panels import SYNC_COLORS, memory_by_device, memory_by_role, sync_bytes
from rlcluster_lab.lab.flow import OPTION_LABELS, FlowRow, flow_rows, mesh_coords
from rlcluster_lab.lab.style import HIGHLIGHT, IDLE, IDLE_TEXT, ROLE_COLORS, ROLE_ORDER, fmt_bytes
from rlcluster_lab.lab.svg import MUTED, TEXT, WIDTH, Canvas, Svg, clip, present

# --------------------------------------------------------------------------- decision flow (L1)

# Which decision feeds which: the arrows of the flow figure.
FLOW_LINKS: tuple[tuple[str, str, str], ...] = (
    ("P1", "P3", "linked?"),
    ("P2", "P4", "linked?"),
    ("P3", "P7", "engine"),
    ("P12", "P13", "trains what syncs"),
)


def _flow_order(report: Mapping[str, Any], rows: list[Any]) -> list[Any]:
    """Rows in the order the cluster took the decisions (the trace's order)."""
    first: dict[str, int] = {}
    for i, d in enumerate(report.get("decisions", [])):
        rule = str(d.get("rule"))
        role = (d.get("values") or {}).get("role")
        key = f"{rule}:{role}" if rule in ("P5",) and role else rule
        first.setdefault(key, i)
    end = len(report.get("decisions", []))
    return sorted(rows, key=lambda r: first.get(r.key, first.get(r.key.split(":")[0], end)))


def _p12_row(report: Mapping[str, Any]) -> Any:

    p12 = [d for d in report.get("decisions", []) if d.get("rule") == "P12"]
    if not p12:
        return None
    return FlowRow(
        "P12",
        "the optimizer trains",
        ("LoRA params", "all params"),
        str(p12[0].get("branch")),
        str(p12[0].get("outcome", "")),
    )


def decision_flow(report: Mapping[str, Any]) -> Svg:
    """Every decision of construction (and of any sync) in the order taken, the answer that
    fired highlighted, and arrows from a decision to the ones that read its result (L1)."""
    rows = list(flow_rows(report))
    extra = _p12_row(report)
    if extra is not None:
        rows.append(extra)
    rows = _flow_order(report, rows)
    row_h, top, left = 44, 34, 64
    q_w, opt_x = 300, left + 304
    c = Canvas(WIDTH, top + row_h * len(rows) + 10)
    title = f"Decisions in the order taken (engine {report.get('engine', '?')})"
    if report.get("warnings"):
        title += f"; {len(report['warnings'])} warning(s)"
    c.text(8, 18, title, size=13, weight="bold")
    y_of = {}
    for i, row in enumerate(rows):
        y = top + i * row_h
        rule = row.key.split(":")[0]
        y_of.setdefault(rule, y + 14)
        c.rect(left - 2, y, 36, 22, "#333333", rx=4)
        c.text(left + 16, y + 15, rule, size=11, anchor="middle", weight="bold", fill="white")
        c.text(left + 40, y + 15, clip(row.question, q_w - 44), size=12, title=row.question)
        n = len(row.options)
        box_w = (WIDTH - opt_x - 8 - 6 * (n - 1)) / n
        for j, option in enumerate(row.options):
            x = opt_x + j * (box_w + 6)
            fired = option == row.fired
            label = OPTION_LABELS.get(option, option)
            c.rect(
                x,
                y,
                box_w,
                22,
                HIGHLIGHT if fired else IDLE,
                stroke="#333333" if fired else "#cccccc",
                width=1.6 if fired else 0.8,
                rx=4,
                id=f"{row.key}:{option}",
                title=f"{row.key}: {label}" + (" (fired)" if fired else ""),
            )
            c.text(
                x + box_w / 2,
                y + 15,
                clip(label, box_w - 6),
                size=11.5,
                anchor="middle",
                weight="bold" if fired else None,
                fill=TEXT if fired else IDLE_TEXT,
            )
        if row.detail:
            c.text(opt_x, y + 36, clip(row.detail, WIDTH - opt_x - 8), size=11, fill=MUTED, title=row.detail)
    for k, (src, dst, why) in enumerate(FLOW_LINKS):
        if src in y_of and dst in y_of:
            x = left - 10 - 11 * k
            y1, y2 = y_of[src], y_of[dst]
            c.path(
                f"M{left - 3},{y1} H{x} V{y2} H{left - 4}",
                "#555555",
                arrow=True,
                id=f"link:{src}:{dst}",
                title=f"{src} -> {dst}: {why}",
            )
    return c.render()


# --------------------------------------------------------------------------- device grid


def _shared_on(memory: Mapping[str, Any], role: str, other: str, dev: str) -> int:
    """Bytes ``role`` holds on ``dev`` that are buffers ``other`` holds too."""
    total = 0
    for group in memory.get("shared", []):
        if role in group.get("roles", []) and other in group.get("roles", []):
            total += sum((group.get("by_device") or {}).get(dev, {}).values())
    return total


def device_grid(report: Mapping[str, Any]) -> Svg:
    """Which devices each role's mesh covers, its mesh coordinate there, and its bytes.

    A cell whose bytes are all the actor's own buffers is hatched in the
    actor's colour ("= actor"): the rollout on the shared branch, a LoRA
    reference's backbone. A second copy is solid in its own colour. When the
    engine replaced the rollout mesh (P7), the mesh the config asked for is
    drawn dashed on a row of its own.
    """
    meshes = report.get("role_to_mesh", {})
    rows: list[tuple[str, str, Mapping[str, Any]]] = [(r, r, meshes[r]) for r in present(list(meshes), ROLE_ORDER)]
    if report.get("mesh_overridden_by_engine") and "rollout" in report.get("config_role_to_mesh", {}):
        at = next(i for i, r in enumerate(rows) if r[0] == "rollout") + 1
        rows.insert(at, ("rollout (config)", "rollout", report["config_role_to_mesh"]["rollout"]))
    ids = sorted(
        {int(d) for _, _, m in rows for d in m.get("device_ids", [])} | set(range(int(report.get("device_count", 0))))
    )
    memory = report.get("memory") or {}
    by_role = memory.get("by_role", {})
    label_w, top, row_h = 150, 44, 40
    cell_w = min(66.0, (WIDTH - label_w - 10) / max(len(ids), 1))
    c = Canvas(WIDTH, top + row_h * len(rows) + 30)
    c.text(
        8,
        18,
        f"Devices: {report.get('device_count', len(ids))} on {report.get('platform', '?')}; "
        "each cell: the mesh coordinate and the role's bytes there",
        size=13,
        weight="bold",
    )
    for j, dev in enumerate(ids):
        c.text(label_w + j * cell_w + cell_w / 2, top - 8, f"dev {dev}", size=11, anchor="middle", fill=MUTED)
    actor_color = ROLE_COLORS["actor"]
    for i, (name, role, mesh) in enumerate(rows):
        y = top + i * row_h
        dashed = name.endswith("(config)")
        shape = "x".join(str(v) for v in mesh.get("shape", {}).values())
        c.text(8, y + 17, name, size=12, weight="bold")
        c.text(8, y + 32, f"mesh {shape}", size=11, fill=MUTED)
        coords = mesh_coords(mesh)
        for j, dev in enumerate(ids):
            x = label_w + j * cell_w
            if dev not in coords:
                c.rect(
                    x + 2, y + 2, cell_w - 4, row_h - 6, "white", stroke="#dddddd", width=0.6, id=f"cell:{name}:{dev}"
                )
                continue
            color = ROLE_COLORS.get(role, "#999999")
            held = sum(by_role.get(role, {}).get("by_device", {}).get(str(dev), {}).values()) if not dashed else 0
            shared = _shared_on(memory, role, "actor", str(dev)) if role != "actor" and held else 0
            if dashed:
                fill, note = "white", "asked for"
            elif held and shared == held:
                fill, note = c.hatch(actor_color), "= actor"
            else:
                fill, note = color, fmt_bytes(held) if held else ""
            title = f"{name} on device {dev}: mesh coordinate {coords[dev]}"
            if held:
                title += f"; holds {fmt_bytes(held)}" + (
                    f", of which {fmt_bytes(shared)} are the actor's buffers" if shared else ""
                )
            c.rect(
                x + 2,
                y + 2,
                cell_w - 4,
                row_h - 6,
                fill,
                stroke=color,
                width=1.4,
                dash="4,3" if dashed else None,
                rx=3,
                id=f"cell:{name}:{dev}",
                title=title,
            )
            dark = fill == color
            c.text(
                x + cell_w / 2,
                y + 16,
                ",".join(map(str, coords[dev])),
                size=11,
                anchor="middle",
                fill="white" if dark else TEXT,
            )
            if note:
                c.text(
                    x + cell_w / 2,
                    y + 30,
                    clip(note, cell_w - 4, 10.5),
                    size=10.5,
                    anchor="middle",
                    fill="white" if dark else TEXT,
                )
    y = top + row_h * len(rows) + 14
    c.text(
        8,
        y,
        "hatched: the role computes with the actor's own buffers (no copy); solid: buffers of its own",
        size=11,
        fill=MUTED,
    )
    return c.render()


# --------------------------------------------------------------------------- memory (L2)


# --------------------------------------------------------------------------- sync (L3)


__all__ = ["Svg", "decision_flow", "device_grid", "memory_by_device", "memory_by_role", "sync_bytes", "FLOW_LINKS"]


__all__ = [
    "SYNC_COLORS",
    "WIDTH",
    "Svg",
    "decision_flow",
    "device_grid",
    "memory_by_device",
    "memory_by_role",
    "sync_bytes",
]
