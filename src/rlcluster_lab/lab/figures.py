"""Figures drawn from reports: each function takes a report's JSON and returns a Figure.

Every function is pure: it reads the dict it is given (never a live cluster),
builds a ``matplotlib.figure.Figure`` directly (no pyplot, so no global figure
registry is left holding it) and recomputes no placement decision; it only
reads what the report recorded (L1-L4). Byte figures are PHYSICAL bytes, as
in the reports: every device shard counted, so a leaf replicated on four
devices counts four times. Axis labels say so.

A buffer several roles hold is drawn once: solid in the bar of its first
holder (the actor before the rest), hatched in that holder's colour
("= the actor's buffers") wherever else it appears, as in the SVG panels.
Every figure is at most ``mpl.MAX_WIDTH`` inches wide with no text under
``mpl.MIN_PT`` points, so a notebook shows it at full size.

Artists that tests (and the widget panel) look up carry a ``gid``:
``"P3:shared"`` for a decision box, ``"link:P1:P3"`` for an arrow,
``"cell:rollout:5"`` for a device cell, ``"bar:<what>:<key>"`` for a bar.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from rlcluster_lab.lab.byte_panels import held_with, own_bytes, role_parts
from rlcluster_lab.lab.flow import (
    OPTION_LABELS,
    FlowRow,
    flow_links,
    flow_rows,
    link_ends,
    link_lanes,
    mesh_coords,
    mesh_shape_text,
)
from rlcluster_lab.lab.mpl import (
    FONT,
    MAX_WIDTH,
    MIN_PT,
    TITLE,
    bytes_axis,
    device_order,
    inch_axes,
    inches,
    legend_columns,
    new_figure,
    present_keys,
    to_png,
)
from rlcluster_lab.lab.sharing_notes import role_note, shared_bytes
from rlcluster_lab.lab.style import (
    ENTRY_ORDER,
    HIGHLIGHT,
    IDLE,
    IDLE_TEXT,
    KIND_COLORS,
    KINDS,
    PHYSICAL,
    ROLE_COLORS,
    ROLE_ORDER,
    SYNC_PARTS,
    fmt_bytes,
)
from rlcluster_lab.lab.textfit import clip, text_width, wrap
from rlcluster_lab.lab.trend_figures import memory_timeline, p11_gap, plan_memory

MUTED = "#555555"


def _tint(color: str, alpha: float = 0.22) -> tuple[float, float, float, float]:
    """``color`` mixed with white: the background of a hatched (shared) segment."""
    r, g, b, _ = to_rgba(color)
    return (1 - alpha * (1 - r), 1 - alpha * (1 - g), 1 - alpha * (1 - b), 1.0)


def _color(entry: str) -> str:
    return ROLE_COLORS.get(entry, "#999999")


# --------------------------------------------------------------------------- decision flow (L1)


def _option_widths(labels: list[str], room: float, gap: float) -> list[float]:
    need = [max(inches(text_width(label, FONT, bold=True)) + 0.16, 0.6) for label in labels]
    free = room - gap * (len(labels) - 1)
    return [w * free / sum(need) for w in need]


def decision_flow(report: Mapping[str, Any]) -> Figure:
    """Every decision of construction (and of any sync) in the order the trace recorded them,
    the answer that fired highlighted, and an arrow from a decision to each one that reads its
    result (P1 -> P3, P2 -> P4, P1 -> P7, P12 -> P13), its value listed under the rows (L1)."""
    rows: list[FlowRow] = flow_rows(report)
    row_of: dict[str, int] = {}
    for i, row in enumerate(rows):
        row_of.setdefault(row.key.split(":")[0], i)
    links = [link for link in flow_links(report) if link.src in row_of and link.dst in row_of]
    lanes = link_lanes(links, row_of)
    width = MAX_WIDTH
    left = 0.2 + 0.13 * (max(lanes + [0]) + 1)
    q_x = left + 0.52
    q_w = 2.55
    opt_x = q_x + q_w + 0.05
    details = [wrap(r.detail, 72 * (width - q_x - 0.1), MIN_PT, lines=2) if r.detail else [] for r in rows]
    heights = [0.4 + 0.19 * len(d) for d in details]
    footer = wrap(
        "arrows: a decision that reads another's result; "
        + "; ".join(f"{link.src} -> {link.dst} ({link.value})" for link in links),
        72 * (width - 0.2),
        MIN_PT,
        lines=3,
    )
    top = 0.45
    fig = new_figure(width, top + sum(heights) + 0.2 * len(footer) + 0.15, layout=None)
    ax = inch_axes(fig)
    title = f"Decisions in the order taken (engine {report.get('engine', '?')})"
    if report.get("warnings"):
        title += f"; {len(report['warnings'])} warning(s)"
    ax.text(0.1, 0.22, title, fontsize=TITLE, fontweight="bold", va="center")
    mid: dict[str, float] = {}
    y = top
    for row, detail, h in zip(rows, details, heights):
        rule = row.key.split(":")[0]
        mid.setdefault(rule, y + 0.14)
        ax.add_patch(
            FancyBboxPatch(
                (left, y), 0.44, 0.28, boxstyle="round,pad=0,rounding_size=0.05", facecolor="#333333", linewidth=0
            )
        )
        ax.text(left + 0.22, y + 0.14, rule, fontsize=FONT, fontweight="bold", color="white", ha="center", va="center")
        ax.text(q_x, y + 0.14, clip(row.question, 72 * q_w, FONT), fontsize=FONT, va="center")
        labels = [OPTION_LABELS.get(o, o) for o in row.options]
        x = opt_x
        for option, label, w in zip(row.options, labels, _option_widths(labels, width - 0.1 - opt_x, 0.06)):
            fired = option == row.fired
            ax.add_patch(
                FancyBboxPatch(
                    (x, y),
                    w,
                    0.28,
                    boxstyle="round,pad=0,rounding_size=0.05",
                    facecolor=HIGHLIGHT if fired else IDLE,
                    edgecolor="#333333" if fired else "#cccccc",
                    linewidth=1.4 if fired else 0.8,
                    gid=f"{row.key}:{option}",
                )
            )
            ax.text(
                x + w / 2,
                y + 0.14,
                clip(label, 72 * (w - 0.08), FONT, bold=fired),
                ha="center",
                va="center",
                fontsize=FONT,
                color="black" if fired else IDLE_TEXT,
                fontweight="bold" if fired else "normal",
            )
            x += w + 0.06
        for k, line in enumerate(detail):
            ax.text(q_x, y + 0.45 + 0.19 * k, line, fontsize=MIN_PT, color=MUTED, va="center")
        y += h
    for link, lane, (a, b) in zip(links, lanes, link_ends(links)):
        lx = left - 0.14 - 0.13 * lane
        y1, y2 = mid[link.src] + 0.07 * a, mid[link.dst] + 0.07 * b
        ax.plot(
            [left - 0.01, lx, lx, left - 0.08],
            [y1, y1, y2, y2],
            color=MUTED,
            linewidth=1.1,
            gid=f"link:{link.src}:{link.dst}",
        )
        ax.annotate(
            "",
            xy=(left - 0.01, y2),
            xytext=(left - 0.09, y2),
            arrowprops={"arrowstyle": "-|>", "color": MUTED, "linewidth": 1.1, "shrinkA": 0, "shrinkB": 0},
        )
    for k, line in enumerate(footer):
        ax.text(0.1, y + 0.12 + 0.2 * k, line, fontsize=MIN_PT, color=MUTED, va="center")
    return fig


# --------------------------------------------------------------------------- device grid


def device_grid(report: Mapping[str, Any]) -> Figure:
    """Which devices each role's mesh covers, where in the mesh each device sits, and whose
    buffers a role computes with there.

    One row per role, one column per device. A filled cell is a device of the
    role's mesh, labelled with its mesh coordinate (so the reshaped layout
    shows the same eight devices at other coordinates) and the role's
    physical bytes there. A cell whose bytes are all the actor's own buffers
    is hatched in the actor's colour and says "= actor": the rollout on P3's
    shared branch, a LoRA reference's backbone (P4); a copy is solid. When the
    engine replaced the rollout mesh (P7), the mesh the config asked for is
    drawn dashed on an extra row. Under the grid, per role, the sharing map's
    links (P1, P2) beside what the role measurably shares with the actor.
    """
    meshes = report.get("role_to_mesh", {})
    rows: list[tuple[str, str, Mapping[str, Any]]] = [(r, r, meshes[r]) for r in present_keys(list(meshes), ROLE_ORDER)]
    if report.get("mesh_overridden_by_engine") and "rollout" in report.get("config_role_to_mesh", {}):
        at = next(i for i, r in enumerate(rows) if r[0] == "rollout") + 1
        rows.insert(at, ("rollout (config)", "rollout", report["config_role_to_mesh"]["rollout"]))
    all_ids = sorted(
        {int(d) for _, _, m in rows for d in m.get("device_ids", [])} | set(range(int(report.get("device_count", 0))))
    )
    memory = report.get("memory") or {}
    by_role = memory.get("by_role", {})
    width = MAX_WIDTH
    label_w, top, row_h = 1.55, 0.62, 0.52
    cell_w = min(0.95, (width - label_w - 0.1) / max(len(all_ids), 1))
    show_bytes = 72 * cell_w >= text_width("888.8 KiB", MIN_PT) + 4
    notes = [
        (role, wrap(role_note(report, role), 72 * (width - 0.35), MIN_PT, lines=3))
        for name, role, _ in rows
        if name == role
    ]
    height = top + row_h * len(rows) + 0.5 + 0.19 * sum(len(lines) for _, lines in notes) + 0.1
    fig = new_figure(width, height, layout=None)
    ax = inch_axes(fig)
    title = (
        f"{report.get('platform', '?')}: {report.get('device_count', len(all_ids))} device(s); "
        "cells give the mesh coordinate" + (" and the role's physical bytes there" if by_role else "")
    )
    ax.text(0.1, 0.2, title, fontsize=TITLE, fontweight="bold", va="center")
    for j, dev in enumerate(all_ids):
        ax.text(label_w + (j + 0.5) * cell_w, top - 0.12, f"dev {dev}", fontsize=MIN_PT, ha="center", color=MUTED)
    actor = _color("actor")
    seen: set[str] = set()
    for i, (name, role, mesh) in enumerate(rows):
        y = top + i * row_h
        dashed = name.endswith("(config)")
        ax.text(0.1, y + 0.19, name, fontsize=FONT, fontweight="bold", va="center")
        ax.text(0.1, y + 0.38, f"mesh {mesh_shape_text(mesh)}", fontsize=MIN_PT, color=MUTED, va="center")
        coords = mesh_coords(mesh)
        color = _color(role)
        for j, dev in enumerate(all_ids):
            x = label_w + j * cell_w
            inside = dev in coords
            held = (
                sum(by_role.get(role, {}).get("by_device", {}).get(str(dev), {}).values())
                if inside and not dashed
                else 0
            )
            shared = shared_bytes(memory, role, "actor", str(dev)) if role != "actor" and held else 0
            hatched = bool(held) and shared >= held
            kind = "asked" if dashed and inside else "actor's" if hatched else "own" if inside else "none"
            seen.add(kind)
            ax.add_patch(
                Rectangle(
                    (x + 0.03, y + 0.03),
                    cell_w - 0.06,
                    row_h - 0.08,
                    facecolor={"own": color, "actor's": _tint(color, 0.3)}.get(kind, "white"),
                    edgecolor={"none": "#dddddd", "actor's": actor}.get(kind, color),
                    hatch="///" if hatched else None,
                    linestyle="--" if dashed else "-",
                    linewidth=1.2 if inside else 0.6,
                    gid=f"cell:{name}:{dev}",
                )
            )
            if not inside:
                continue
            ink = "white" if kind == "own" else "#222222"
            note = "asked for" if dashed else "= actor" if hatched else fmt_bytes(held) if held and show_bytes else ""
            # On a hatched cell the text sits on a white ground, so the stripes do not cross it.
            ground = {"facecolor": "white", "edgecolor": "none", "pad": 0.6, "alpha": 0.85} if hatched else None
            for line, at in ((",".join(map(str, coords[dev])), 0.17), (note, 0.35)):
                if line:
                    ax.text(
                        x + cell_w / 2, y + at, line, fontsize=MIN_PT, ha="center", va="center", color=ink, bbox=ground
                    )
    y = top + row_h * len(rows) + 0.18
    key = [
        ("own", {"facecolor": "#9a9a9a", "edgecolor": "#9a9a9a"}, "solid: buffers of its own (a copy)"),
        (
            "actor's",
            {"facecolor": _tint("#9a9a9a", 0.3), "edgecolor": actor, "hatch": "///"},
            '"= actor": the actor\'s own buffers, no copy',
        ),
        (
            "asked",
            {"facecolor": "white", "edgecolor": "#9a9a9a", "linestyle": "--"},
            "dashed: the mesh asked for, replaced by the engine (P7)",
        ),
    ]
    x = 0.1
    for kind, style, label in key:
        if kind not in seen:
            continue
        ax.add_patch(Rectangle((x, y - 0.07), 0.18, 0.14, linewidth=1, **style))
        ax.text(x + 0.25, y, label, fontsize=MIN_PT, va="center")
        x += 0.25 + inches(text_width(label, MIN_PT)) + 0.3
    y += 0.3
    for role, lines in notes:
        for k, line in enumerate(lines):
            ax.text(
                0.1 if k == 0 else 0.3, y, line, fontsize=MIN_PT, va="center", gid=f"note:{role}" if k == 0 else None
            )
            y += 0.19
    return fig


# --------------------------------------------------------------------------- memory (L2)


def _naive_by_device(memory: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per device and kind, the sum over entries: what it would be if no buffer were shared."""
    out: dict[str, dict[str, int]] = {}
    for entry in memory.get("by_role", {}).values():
        for dev, kinds in entry.get("by_device", {}).items():
            for kind, n in kinds.items():
                out.setdefault(str(dev), {}).setdefault(kind, 0)
                out[str(dev)][kind] += int(n)
    return out


def memory_by_device(memory: Mapping[str, Any]) -> Figure:
    """What each device holds, each buffer once, one bar per memory kind (L2).

    A solid segment per role for the buffers only it holds; a hatched segment
    per set of roles for the buffers they share, in the colour of its first
    holder over a tint of the next ("actor = reference"), drawn once. So a
    bar's height is the report's ``by_device`` figure. The dashed box above
    it is what separate copies would add. Pinned host bars are dotted. Where
    the backend reports allocator figures they are drawn as black ticks; on
    CPU it has none, and the title says so.
    """
    by_device = memory.get("by_device", {})
    entries = present_keys(list(memory.get("by_role", {})), ENTRY_ORDER)
    naive = _naive_by_device(memory)
    devices = device_order(list(set(by_device) | set(naive)))
    kinds = [k for k in KINDS if any(by_device.get(d, {}).get(k) or naive.get(d, {}).get(k) for d in devices)] or [
        "device"
    ]
    groups = sorted(
        memory.get("shared", []),
        key=lambda g: tuple(ENTRY_ORDER.index(r) if r in ENTRY_ORDER else 99 for r in g.get("roles", [])),
    )
    fig = new_figure(max(6.0, 0.8 * len(devices) + 3.0), 4.6)
    ax = fig.add_subplot()
    width = 0.8 / len(kinds)
    handles: dict[str, Patch] = {}
    for k, kind in enumerate(kinds):
        pinned = kind == "pinned_host"
        for i, dev in enumerate(devices):
            x = i - 0.4 + width * (k + 0.5)
            bottom = 0
            for e in entries:
                v = own_bytes(memory, e, dev, kind)
                if v <= 0:
                    continue
                ax.bar(
                    x,
                    v,
                    width * 0.92,
                    bottom=bottom,
                    color=_color(e),
                    hatch=".." if pinned else None,
                    edgecolor="white",
                    linewidth=0.5,
                    gid=f"bar:own:{dev}:{kind}:{e}",
                )
                handles.setdefault(e, Patch(facecolor=_color(e), label=e))
                bottom += v
            for g in groups:
                v = int((g.get("by_device") or {}).get(dev, {}).get(kind, 0))
                if v <= 0:
                    continue
                roles = g["roles"]
                ax.bar(
                    x,
                    v,
                    width * 0.92,
                    bottom=bottom,
                    color=_tint(_color(roles[1]), 0.35),
                    hatch="///",
                    edgecolor=_color(roles[0]),
                    linewidth=0.6,
                    gid=f"bar:group:{dev}:{kind}:{'+'.join(roles)}",
                )
                label = " = ".join(roles) + " (held once)"
                handles.setdefault(
                    label,
                    Patch(
                        facecolor=_tint(_color(roles[1]), 0.35), edgecolor=_color(roles[0]), hatch="///", label=label
                    ),
                )
                bottom += v
            extra = int(naive.get(dev, {}).get(kind, 0)) - bottom
            if extra > 0:
                ax.bar(
                    x,
                    extra,
                    width * 0.92,
                    bottom=bottom,
                    facecolor="none",
                    edgecolor="#777777",
                    linestyle="--",
                    linewidth=1,
                    gid=f"bar:naive:{dev}:{kind}",
                )
                handles.setdefault(
                    "naive",
                    Patch(
                        facecolor="none",
                        edgecolor="#777777",
                        linestyle="--",
                        label="dashed: what separate copies would add",
                    ),
                )
    if "pinned_host" in kinds:
        handles["pinned"] = Patch(
            facecolor="white", edgecolor="#555555", hatch="..", label="dotted (right bar): pinned_host"
        )
    allocator = memory.get("allocator") or {}
    if allocator.get("available"):
        in_use = [allocator.get("by_device", {}).get(d, {}).get("bytes_in_use") for d in devices]
        pts = [(i, v) for i, v in enumerate(in_use) if v is not None]
        if pts:
            ax.scatter(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="_",
                s=400,
                color="black",
                label="allocator: bytes in use",
                zorder=3,
                gid="points:allocator",
            )
    ax.set_xticks(range(len(devices)), [f"dev {d}" for d in devices], fontsize=FONT)
    ax.set_ylabel(PHYSICAL, fontsize=MIN_PT)
    ax.margins(y=0.05)
    bytes_axis(ax.yaxis, ax.get_ylim()[1])
    legend_handles = ax.get_legend_handles_labels()[0] + list(handles.values())
    ncols = legend_columns(fig, [h.get_label() for h in legend_handles])
    fig.legend(handles=legend_handles, loc="outside lower center", ncols=ncols, fontsize=MIN_PT, frameon=False)
    room = 72 * (fig.get_figwidth() - 1.2)  # the title starts at the axes' left edge
    lines = wrap(
        f"per device, each buffer once: {fmt_bytes(memory.get('unique_bytes', 0))} held, "
        f"{fmt_bytes(memory.get('naive_bytes', 0))} if every role had its own copy",
        room,
        FONT,
        2,
    )
    if not allocator.get("available"):
        lines += wrap("allocator: " + (allocator.get("note") or "no figures on this backend"), room, FONT, 2)
    ax.set_title("\n".join(lines), fontsize=FONT, loc="left")
    return fig


def memory_by_role(memory: Mapping[str, Any]) -> Figure:
    """What each role (and the anchor, the optimizer state) holds, each buffer drawn once (L2).

    The solid part of a bar is counted in that bar: the role's own buffers
    and the shared ones it is the first holder of. A hatched part is the same
    buffers as another role's, in that role's colour ("= the actor's
    buffers"), not counted again: the solid parts add up to the bytes held,
    the bars' full lengths to what every role's own copy would cost.
    """
    by_role = memory.get("by_role", {})
    entries = present_keys(list(by_role), ENTRY_ORDER)
    fig = new_figure(MAX_WIDTH, 0.5 * len(entries) + 2.0)
    ax, ax_text = fig.subplots(1, 2, width_ratios=[1.05, 1], sharey=True)
    ys = list(range(len(entries)))
    handles: dict[str, Patch] = {"held": Patch(facecolor="#9a9a9a", label="solid: counted in this bar")}
    for y, e in zip(ys, entries):
        counted, borrowed = role_parts(memory, e)
        left = 0
        for kind in KINDS:
            v = counted.get(kind, 0)
            if v <= 0:
                continue
            pinned = kind == "pinned_host"
            ax.barh(
                y,
                v,
                left=left,
                height=0.6,
                color=_tint(_color(e), 0.55) if pinned else _color(e),
                hatch=".." if pinned else None,
                edgecolor=_color(e),
                linewidth=0.6,
                gid=f"bar:role:{e}:held:{kind}",
            )
            if pinned:
                handles["pinned"] = Patch(
                    facecolor="white", edgecolor="#555555", hatch="..", label="dotted: pinned_host"
                )
            left += v
        for owner, v in borrowed:
            ax.barh(
                y,
                v,
                left=left,
                height=0.6,
                color=_tint(_color(e), 0.3),
                hatch="///",
                edgecolor=_color(owner),
                linewidth=0.6,
                gid=f"bar:role:{e}:same:{owner}",
            )
            handles.setdefault(
                "same",
                Patch(
                    facecolor="white",
                    edgecolor=_color(owner),
                    hatch="///",
                    label="hatched: another role's buffers (no copy)",
                ),
            )
            left += v
        total = int(by_role[e].get("bytes", 0))
        kinds = ", ".join(k for k in KINDS if by_role[e].get("by_kind", {}).get(k))
        text = fmt_bytes(total) + (f" in {kinds}" if kinds and kinds != "device" else "") if total else "nothing"
        for owner, v in borrowed:
            text += f"; {'all' if v == total else fmt_bytes(v)} = the {owner}'s buffers"
        if not borrowed and held_with(memory, e):
            text += "; also held by " + ", ".join(f"{r} ({fmt_bytes(v)})" for r, v in held_with(memory, e))
        ax_text.text(0.0, y, "\n".join(wrap(text, 72 * 4.4, MIN_PT, lines=2)), fontsize=MIN_PT, va="center")
    ax.set_yticks(ys, entries, fontsize=FONT)
    ax.invert_yaxis()
    top = max([int(by_role[e].get("bytes", 0)) for e in entries] + [1])
    ax.set_xlim(0, top * 1.03)
    ax.set_xlabel(PHYSICAL, fontsize=MIN_PT)
    bytes_axis(ax.xaxis, ax.get_xlim()[1])
    ax_text.axis("off")
    ax_text.set_xlim(0, 1)
    ncols = legend_columns(fig, [h.get_label() for h in handles.values()])
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncols=ncols, fontsize=MIN_PT, frameon=False)
    title = (
        f"per role, each buffer once: the solid parts add up to {fmt_bytes(memory.get('unique_bytes', 0))}; "
        f"{fmt_bytes(memory.get('naive_bytes', 0))} if every role's bytes were summed"
    )
    ax.set_title("\n".join(wrap(title, 72 * (MAX_WIDTH - 1.2), FONT, 2)), fontsize=FONT, loc="left")
    return fig


# --------------------------------------------------------------------------- sync (L3)


def _syncs(sync: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """One sync report, or a mapping of label -> sync report."""
    if "synced_bytes" in sync:
        return {("LoRA" if sync.get("lora") else "full") + " sync": sync}
    return {str(k): v for k, v in sync.items()}


SYNC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("synced_bytes", "synced\n(physical)"),
    ("synced_logical_bytes", "synced\n(logical)"),
    ("arrived", "moved between\ndevices"),
    ("copied_same_device_bytes", "copied within\na device"),
    ("reused_bytes", "reused\n(no copy)"),
    ("moved_cross_device_bytes", "crossed\ndevices"),
    ("minimum_cross_device_bytes", "minimum\nto cross"),
    ("excess_cross_device_bytes", "excess"),
)


def _sync_value(s: Mapping[str, Any], key: str) -> int:
    if key == "arrived":  # what crossed and stayed: synced = arrived + copied + reused
        return int(s.get("moved_cross_device_bytes", 0)) - int(s.get("relayed_cross_device_bytes", 0))
    if key == "excess_cross_device_bytes" and key not in s:
        return int(s.get("moved_cross_device_bytes", 0)) - int(s.get("minimum_cross_device_bytes", 0))
    return int(s.get(key, 0))


def sync_bytes(sync: Mapping[str, Any]) -> Figure:
    """Where the synced bytes went, with every number in a table under the bars (L3).

    Takes one sync report, or ``{label: sync report}`` to compare runs side by
    side. Per run, the left bar splits the synced bytes (physical) into what
    moved between devices, what was copied within a device and what was
    reused; the right bar is everything that crossed devices (dark: relayed,
    crossed but did not stay), with the least the placement forces as a
    black line. The table gives each figure, and the logical synced bytes
    (each leaf once) beside the physical ones.
    """
    runs = _syncs(sync)
    labels = list(runs)
    fig = new_figure(MAX_WIDTH, 4.0 + 0.3 * (len(labels) + 2))
    bars_fig, table_fig = fig.subfigures(2, 1, height_ratios=[4.0, 0.3 * (len(labels) + 2)])
    ax = bars_fig.add_subplot()
    w = 0.36
    for i, lb in enumerate(labels):
        s = runs[lb]
        bottom = 0
        for key, legend, color in SYNC_PARTS:
            v = _sync_value(s, "arrived" if key == "moved_cross_device_bytes" else key)
            ax.bar(
                i - w / 2 - 0.01,
                v,
                w,
                bottom=bottom,
                color=color,
                label=legend if i == 0 else None,
                gid=f"bar:sync:{lb}:{key}",
            )
            bottom += v
        arrived = _sync_value(s, "arrived")
        relayed = int(s.get("relayed_cross_device_bytes", 0))
        ax.bar(i + w / 2 + 0.01, arrived, w, color=SYNC_PARTS[0][2], gid=f"bar:cross:{lb}:kept")
        ax.bar(
            i + w / 2 + 0.01,
            relayed,
            w,
            bottom=arrived,
            color="#8b1a1a",
            label="relayed: crossed, did not stay" if i == 0 else None,
            gid=f"bar:cross:{lb}:relayed",
        )
        ax.hlines(
            int(s.get("minimum_cross_device_bytes", 0)),
            i + 0.01,
            i + w + 0.05,
            colors="black",
            linewidth=2.2,
            label="least the placement allows\nto cross devices" if i == 0 else None,
            gid=f"line:minimum:{lb}",
        )
        if "synced_logical_bytes" in s:
            # Logical beside physical: a leaf on four devices is four times in the bar, once here.
            ax.hlines(
                int(s["synced_logical_bytes"]),
                i - w - 0.01,
                i - 0.01,
                colors="#222222",
                linestyles=":",
                linewidth=2,
                label="synced, logical (each leaf once)" if i == 0 else None,
                gid=f"line:logical:{lb}",
            )
    ax.set_xticks(range(len(labels)), [lb.replace(", ", ",\n") for lb in labels], fontsize=MIN_PT)
    pad = 0.1 + 0.25 * max(0, 3 - len(labels))  # one or two runs: bars no wider than with three
    ax.set_xlim(-0.5 - pad, len(labels) - 0.5 + pad)
    ax.set_ylabel(PHYSICAL, fontsize=MIN_PT)
    top = max(
        [max(_sync_value(s, "synced_bytes"), _sync_value(s, "moved_cross_device_bytes")) for s in runs.values()] + [1]
    )
    ax.set_ylim(0, top * 1.08)
    bytes_axis(ax.yaxis, ax.get_ylim()[1])
    ax.legend(fontsize=MIN_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(
        "weight sync (P13, measured): per run, the left bar is what synced (= moved + copied + reused),\n"
        "the right one what crossed devices",
        fontsize=FONT,
        loc="left",
    )
    ax_table = table_fig.add_subplot()
    ax_table.axis("off")
    table = ax_table.table(
        cellText=[[fmt_bytes(_sync_value(runs[lb], key)) for key, _ in SYNC_COLUMNS] for lb in labels],
        rowLabels=labels,
        colLabels=[head for _, head in SYNC_COLUMNS],
        loc="center",
        cellLoc="right",
        bbox=(0.1, 0.0, 0.9, 1.0),
    )
    table.auto_set_font_size(False)
    table.set_fontsize(MIN_PT)
    for (r, _c), cell in table.get_celld().items():
        cell.set_edgecolor("#cccccc")
        if r == 0:
            cell.set_height(cell.get_height() * 2)
            cell.get_text().set_horizontalalignment("center")
    return fig


def sync_leaves(sync: Mapping[str, Any], top: int | None = None) -> Figure:
    """Per leaf: moved, copied or reused bytes, with the minimum as a black tick (L3).

    ``top`` keeps only the leaves with the most synced bytes (ties by path).
    """
    leaves = list(sync.get("leaves", []))
    if top is not None:
        leaves = sorted(leaves, key=lambda lf: (-int(lf.get("synced_bytes", 0)), lf.get("path", "")))[:top]
        leaves.sort(key=lambda lf: lf.get("path", ""))
    fig = new_figure(MAX_WIDTH, 0.24 * len(leaves) + 1.9)
    ax = fig.add_subplot()
    ys = list(range(len(leaves)))
    left = [0] * len(leaves)
    for key, legend, color in SYNC_PARTS:
        values = [int(lf.get(key, 0)) for lf in leaves]
        bars = ax.barh(ys, values, left=left, color=color, label=legend, height=0.7)
        for bar, lf in zip(bars, leaves):
            bar.set_gid(f"bar:leaf:{lf.get('path')}:{key}")
        left = [a + b for a, b in zip(left, values)]
    ax.scatter(
        [int(lf.get("minimum_cross_device_bytes", 0)) for lf in leaves],
        ys,
        marker="|",
        s=90,
        color="black",
        label="least the placement allows to cross",
        zorder=3,
    )
    ax.set_yticks(ys, [f"{lf.get('path')} {tuple(lf.get('shape', []))}" for lf in leaves], fontsize=MIN_PT)
    ax.invert_yaxis()
    ax.set_xlabel(PHYSICAL, fontsize=MIN_PT)
    ax.set_xlim(0, max(left + [1]) * 1.05)
    bytes_axis(ax.xaxis, ax.get_xlim()[1])
    ncols = legend_columns(fig, [legend for _, legend, _ in SYNC_PARTS] + ["least the placement allows to cross"])
    fig.legend(loc="outside lower center", ncols=ncols, fontsize=MIN_PT, frameon=False)
    shown = f"{len(leaves)} of {len(sync.get('leaves', []))} leaves" if top is not None else f"{len(leaves)} leaves"
    ax.set_title(f"weight sync per leaf ({shown})", fontsize=FONT, loc="left")
    return fig


# --------------------------------------------------------------------------- learner (P11) and plan (L4): trend_figures


__all__ = [
    "ENTRY_ORDER",
    "FlowRow",
    "HIGHLIGHT",
    "IDLE",
    "IDLE_TEXT",
    "KINDS",
    "KIND_COLORS",
    "PHYSICAL",
    "ROLE_COLORS",
    "ROLE_ORDER",
    "SYNC_PARTS",
    "decision_flow",
    "device_grid",
    "flow_rows",
    "fmt_bytes",
    "memory_by_device",
    "memory_by_role",
    "memory_timeline",
    "p11_gap",
    "plan_memory",
    "sync_bytes",
    "sync_leaves",
    "to_png",
]
