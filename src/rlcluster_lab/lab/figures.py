"""Figures drawn from reports: each function takes a report's JSON and returns a Figure.

Every function is pure: it reads the dict it is given (never a live cluster),
builds a ``matplotlib.figure.Figure`` directly (no pyplot, so no global figure
registry is left holding it) and recomputes no placement decision; it only
reads what the report recorded (L1-L4). Byte figures are PHYSICAL bytes, as
in the reports: every device shard counted, so a leaf replicated on four
devices counts four times. Axis labels say so.

Artists that tests (and the widget panel) look up carry a ``gid``:
``"P3:shared"`` for a decision box, ``"cell:rollout:5"`` for a device cell,
``"bar:<what>:<key>"`` for a bar.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from rlcluster_lab.lab.flow import OPTION_LABELS, FlowRow, flow_rows, mesh_coords, mesh_shape_text
from rlcluster_lab.lab.mpl import bytes_axis, device_order, new_figure, present_keys, to_png
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
from rlcluster_lab.lab.trend_figures import memory_timeline, p11_gap, plan_memory

# --------------------------------------------------------------------------- decision flow (L1)


def decision_flow(report: Mapping[str, Any]) -> Figure:
    """Every construction decision as a row of answers with the one that fired highlighted (L1)."""
    rows = flow_rows(report)
    width = 12.0
    fig = new_figure(width, 0.62 * len(rows) + 0.9)
    ax = fig.add_subplot()
    ax.set_xlim(0, width)
    ax.set_ylim(len(rows), -0.6)
    ax.axis("off")
    q_width, gap = 3.6, 0.12
    for i, row in enumerate(rows):
        y = i
        ax.text(0.05, y + 0.05, row.key.split(":")[0], fontsize=9, fontweight="bold", va="center")
        ax.text(0.55, y + 0.05, row.question, fontsize=9, va="center")
        box_w = (width - q_width - 0.1 - gap * (len(row.options) - 1)) / len(row.options)
        for j, option in enumerate(row.options):
            x = q_width + j * (box_w + gap)
            fired = option == row.fired
            box = FancyBboxPatch(
                (x, y - 0.25),
                box_w,
                0.5,
                boxstyle="round,pad=0.02",
                facecolor=HIGHLIGHT if fired else IDLE,
                edgecolor="#333333" if fired else "#cccccc",
                linewidth=1.6 if fired else 0.8,
                gid=f"{row.key}:{option}",
            )
            ax.add_patch(box)
            ax.text(
                x + box_w / 2,
                y - 0.02,
                OPTION_LABELS.get(option, option),
                ha="center",
                va="center",
                fontsize=8.5,
                color="black" if fired else IDLE_TEXT,
                fontweight="bold" if fired else "normal",
            )
        if row.detail:
            ax.text(q_width, y + 0.38, row.detail, fontsize=7, color="#555555", va="center")
    title = f"decisions: engine {report.get('engine', '?')}"
    if report.get("warnings"):
        title += f"  |  {len(report['warnings'])} warning(s)"
    ax.set_title(title, fontsize=10, loc="left")
    return fig


# --------------------------------------------------------------------------- device grid


def device_grid(report: Mapping[str, Any]) -> Figure:
    """Which devices each role's mesh covers, and where in the mesh each device sits.

    One row per role, one column per device. A filled cell is a device of the
    role's mesh, labelled with its mesh coordinate, so the reshaped layout
    shows the same eight devices at other coordinates. With a memory section
    each cell also gives the role's physical bytes on that device. When the
    engine replaced the rollout mesh (P7), the mesh the config asked for is
    drawn on an extra row.
    """
    meshes = report.get("role_to_mesh", {})
    rows: list[tuple[str, str, Mapping[str, Any]]] = [(r, r, meshes[r]) for r in present_keys(list(meshes), ROLE_ORDER)]
    if report.get("mesh_overridden_by_engine") and "rollout" in report.get("config_role_to_mesh", {}):
        at = next(i for i, r in enumerate(rows) if r[0] == "rollout") + 1
        rows.insert(at, ("rollout (config)", "rollout", report["config_role_to_mesh"]["rollout"]))
    all_ids = sorted(
        {int(d) for _, _, m in rows for d in m.get("device_ids", [])} | set(range(int(report.get("device_count", 0))))
    )
    by_role = (report.get("memory") or {}).get("by_role", {})
    sharing = report.get("sharing_map", {})

    fig = new_figure(1.6 + 0.95 * max(len(all_ids), 1) + 2.4, 0.55 * len(rows) + 1.0)
    ax = fig.add_subplot()
    ax.set_xlim(-0.05, len(all_ids) + 0.05)
    ax.set_ylim(len(rows) + 0.05, -0.05)
    ax.set_xticks([i + 0.5 for i in range(len(all_ids))], [f"dev {d}" for d in all_ids], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(
        [i + 0.5 for i in range(len(rows))], [f"{name}  {mesh_shape_text(mesh)}" for name, _, mesh in rows], fontsize=9
    )
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    for i, (name, role, mesh) in enumerate(rows):
        coords = mesh_coords(mesh)
        dashed = name.endswith("(config)")
        for j, dev in enumerate(all_ids):
            inside = dev in coords
            cell = Rectangle(
                (j + 0.04, i + 0.06),
                0.92,
                0.88,
                facecolor=ROLE_COLORS.get(role, "#999999") if inside and not dashed else "white",
                edgecolor=ROLE_COLORS.get(role, "#999999") if inside else "#dddddd",
                linestyle="--" if dashed else "-",
                linewidth=1.2 if inside else 0.6,
                alpha=0.85 if inside else 1.0,
                gid=f"cell:{name}:{dev}",
            )
            ax.add_patch(cell)
            if not inside:
                continue
            label = ",".join(str(c) for c in coords[dev])
            entry = by_role.get(role, {}).get("by_device", {}).get(str(dev)) if not dashed else None
            if entry:
                label += "\n" + fmt_bytes(sum(entry.values()))
            ax.text(
                j + 0.5, i + 0.5, label, ha="center", va="center", fontsize=7, color="#333333" if dashed else "white"
            )
        note = ""
        if not dashed:
            linked = sharing.get(role, [])
            note = ("map links it to " + ", ".join(linked)) if linked else "no links in the map"
            if role == "rollout" and report.get("rollout_shares_actor_weights"):
                note += "; samples with the actor's own buffers"
            elif role == "reference" and report.get("reference_shares_backbone"):
                note += "; its backbone is the actor's buffers"
        else:
            note = "asked for; replaced by the engine (P7)"
        ax.text(len(all_ids) + 0.15, i + 0.5, note, va="center", fontsize=8, clip_on=False)
    ax.set_title(
        f"{report.get('platform', '?')}: {report.get('device_count', len(all_ids))} device(s); "
        "cells give the mesh coordinate" + (" and physical bytes" if by_role else ""),
        fontsize=9,
        loc="left",
    )
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
    """Physical bytes on each device, stacked by role, one bar per memory kind (L2).

    Each bar stacks every role's own bytes on that device in that memory kind
    (the anchor and the optimizer state included), so its height is what the
    device would hold if no buffer were shared. The black box drawn over it
    is what the device really holds, each buffer counted once: the part of
    the stack above the box is what sharing saves. Where the backend reports
    allocator figures they are drawn as black ticks; on CPU it has none, and
    the title says so.
    """
    by_device = memory.get("by_device", {})
    by_role = memory.get("by_role", {})
    naive = _naive_by_device(memory)
    devices = device_order(list(set(by_device) | set(naive)))
    kinds = [k for k in KINDS if any(by_device.get(d, {}).get(k) or naive.get(d, {}).get(k) for d in devices)] or [
        "device"
    ]
    entries = present_keys(list(by_role), ENTRY_ORDER)
    fig = new_figure(max(6.0, 0.8 * len(devices) + 4.0), 3.8)
    ax = fig.add_subplot()
    width = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(devices))]
        bottom = [0] * len(devices)
        for e in entries:
            values = [int(by_role[e].get("by_device", {}).get(d, {}).get(kind, 0)) for d in devices]
            if not any(values):
                continue
            # Pinned host is hatched, so role colour and memory kind read together.
            segs = ax.bar(
                xs,
                values,
                width * 0.92,
                bottom=bottom,
                color=ROLE_COLORS.get(e, "#999999"),
                hatch="///" if kind == "pinned_host" else None,
                edgecolor="white",
                linewidth=0.5,
            )
            for bar, dev in zip(segs, devices):
                bar.set_gid(f"bar:role:{dev}:{kind}:{e}")
            bottom = [a + b for a, b in zip(bottom, values)]
        unique = [int(by_device.get(d, {}).get(kind, 0)) for d in devices]
        boxes = ax.bar(xs, unique, width * 0.92, facecolor="none", edgecolor="black", linewidth=1.6)
        for bar, dev in zip(boxes, devices):
            bar.set_gid(f"bar:device:{dev}:{kind}")
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
            )
    ax.set_xticks(range(len(devices)), [f"dev {d}" for d in devices], fontsize=8)
    ax.set_ylabel(PHYSICAL, fontsize=8)
    bytes_axis(ax.yaxis, ax.get_ylim()[1])
    handles, _ = ax.get_legend_handles_labels()
    handles += [Patch(facecolor=ROLE_COLORS.get(e, "#999999"), label=e) for e in entries]
    if "pinned_host" in kinds:
        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="///", label="pinned_host (hatched)"))
    handles.append(Patch(facecolor="none", edgecolor="black", linewidth=1.6, label="held: each buffer once"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    note = (
        "" if allocator.get("available") else "\nallocator: " + (allocator.get("note") or "no figures on this backend")
    )
    ax.set_title(
        f"per device: {fmt_bytes(memory.get('unique_bytes', 0))} counting each buffer once, "
        f"{fmt_bytes(memory.get('naive_bytes', 0))} summed per role{note}",
        fontsize=8,
        loc="left",
    )
    return fig


def memory_by_role(memory: Mapping[str, Any]) -> Figure:
    """Physical bytes each role (and the anchor, the optimizer state) holds, split by memory kind (L2).

    A buffer two roles share is in both bars; the label says with whom, and
    the title gives the total counting it once.
    """
    by_role = memory.get("by_role", {})
    entries = present_keys(list(by_role), ENTRY_ORDER)
    shared_with: dict[str, list[str]] = {}
    for group in memory.get("shared", []):
        for e in group.get("roles", []):
            shared_with.setdefault(e, []).append(
                f"{fmt_bytes(group.get('bytes', 0))} with {', '.join(r for r in group['roles'] if r != e)}"
            )
    fig = new_figure(9.0, 0.5 * len(entries) + 1.3)
    ax = fig.add_subplot()
    ys = list(range(len(entries)))
    left = [0] * len(entries)
    for kind in KINDS:
        values = [int(by_role[e].get("by_kind", {}).get(kind, 0)) for e in entries]
        if not any(values):
            continue
        bars = ax.barh(ys, values, left=left, color=KIND_COLORS[kind], label=kind, height=0.6)
        for bar, e in zip(bars, entries):
            bar.set_gid(f"bar:role:{e}:{kind}")
        left = [a + b for a, b in zip(left, values)]
    top = max([int(by_role[e].get("bytes", 0)) for e in entries] + [1])
    for y, e in zip(ys, entries):
        text = fmt_bytes(by_role[e].get("bytes", 0))
        if shared_with.get(e):
            text += "  (shares " + "; ".join(shared_with[e]) + ")"
        ax.text(int(by_role[e].get("bytes", 0)) + top * 0.01, y, text, va="center", fontsize=8)
    ax.set_yticks(ys, entries, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.9)
    ax.set_xlabel(PHYSICAL + "; a shared buffer appears in each role that holds it", fontsize=8)
    bytes_axis(ax.xaxis, ax.get_xlim()[1])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(
        f"per role: {fmt_bytes(memory.get('unique_bytes', 0))} counting each buffer once, "
        f"{fmt_bytes(memory.get('naive_bytes', 0))} summed per role",
        fontsize=9,
        loc="left",
    )
    return fig


# --------------------------------------------------------------------------- sync (L3)


def _syncs(sync: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """One sync report, or a mapping of label -> sync report."""
    if "synced_bytes" in sync:
        return {("LoRA" if sync.get("lora") else "full") + " sync": sync}
    return {str(k): v for k, v in sync.items()}


def sync_bytes(sync: Mapping[str, Any]) -> Figure:
    """Where the synced bytes went: moved between devices, copied within one, or reused (L3).

    Takes one sync report, or ``{label: sync report}`` to compare runs side by
    side. The black line on each bar is the least the placement needs to move
    between devices; the bar's red part is what the sync really moved.
    """
    runs = _syncs(sync)
    labels = list(runs)
    # At most 9.6 inches wide, so a notebook shows it unscaled and its 9-point text stays 9 points.
    fig = new_figure(min(9.6, max(6.5, 1.1 * len(labels) + 3.0)), 4.2)
    ax = fig.add_subplot()
    bottoms = [0] * len(labels)
    for key, legend, color in SYNC_PARTS:
        values = [int(runs[lb].get(key, 0)) for lb in labels]
        bars = ax.bar(range(len(labels)), values, 0.55, bottom=bottoms, color=color, label=legend)
        for bar, lb in zip(bars, labels):
            bar.set_gid(f"bar:sync:{lb}:{key}")
        bottoms = [a + b for a, b in zip(bottoms, values)]
    for i, lb in enumerate(labels):
        s = runs[lb]
        ax.hlines(
            int(s.get("minimum_cross_device_bytes", 0)),
            i - 0.36,
            i + 0.36,
            colors="black",
            linewidth=2,
            label="minimum to move between devices" if i == 0 else None,
            gid=f"line:minimum:{lb}",
        )
        if "synced_logical_bytes" in s:
            # Logical beside physical: a leaf on four devices is four times in the bar, once here.
            ax.hlines(
                int(s["synced_logical_bytes"]),
                i - 0.36,
                i + 0.36,
                colors="#222222",
                linestyles=":",
                linewidth=2,
                label="logical bytes (each leaf once)" if i == 0 else None,
                gid=f"line:logical:{lb}",
            )
        seconds = s.get("seconds")
        text = fmt_bytes(s.get("synced_bytes", 0))
        if seconds is not None:
            text += f"\n{seconds * 1e3:.1f} ms" + (" (incl. compiling)" if s.get("includes_compilation") else "")
        ax.text(i, bottoms[i], text, ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(labels)), [lb.replace(", ", ",\n") for lb in labels], fontsize=9)
    ax.set_ylabel(PHYSICAL, fontsize=9)
    ax.set_ylim(0, max(bottoms + [1]) * 1.25)
    bytes_axis(ax.yaxis, ax.get_ylim()[1])
    ax.tick_params(axis="y", labelsize=9)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("weight sync: synced (physical) = moved + copied + reused", fontsize=9, loc="left")
    return fig


def sync_leaves(sync: Mapping[str, Any], top: int | None = None) -> Figure:
    """Per leaf: moved, copied or reused bytes, with the minimum as a black tick (L3).

    ``top`` keeps only the leaves with the most synced bytes (ties by path).
    """
    leaves = list(sync.get("leaves", []))
    if top is not None:
        leaves = sorted(leaves, key=lambda lf: (-int(lf.get("synced_bytes", 0)), lf.get("path", "")))[:top]
        leaves.sort(key=lambda lf: lf.get("path", ""))
    # 9.6 inches wide and 9-point text: a notebook shows it unscaled.
    fig = new_figure(9.6, 0.25 * len(leaves) + 1.5)
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
        label="minimum between devices",
        zorder=3,
    )
    ax.set_yticks(ys, [f"{lf.get('path')} {tuple(lf.get('shape', []))}" for lf in leaves], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(PHYSICAL, fontsize=9)
    ax.set_xlim(0, max(left + [1]) * 1.05)
    bytes_axis(ax.xaxis, ax.get_xlim()[1])
    ax.tick_params(axis="x", labelsize=9)
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    shown = f"{len(leaves)} of {len(sync.get('leaves', []))} leaves" if top is not None else f"{len(leaves)} leaves"
    ax.set_title(f"weight sync per leaf ({shown})", fontsize=9, loc="left")
    return fig


# --------------------------------------------------------------------------- learner (P11)


# --------------------------------------------------------------------------- plan (L4)


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
