"""Figures of a weight sync (L3): where a sync's bytes went, the same per leaf, and (from
``lab.sync_peak_figures``) what the sync holds on a device at each phase, and its chunk sizes.

Pure functions of a sync report's JSON (``SyncReport.to_json()``, or a placement report's
``sync``), returning an ``Svg`` that the notebooks and the widget lab both show
(``lab.placement_figures`` says why SVG). Bytes are physical (every destination shard
counted) unless a label says logical (each leaf once). Segments and ticks carry an ``id``
and their bytes (``data-bytes``): ``"seg:sync:<run>:<part>"``, ``"seg:cross:<run>:kept"``
and ``":relayed"``, ``"min:<run>"``, ``"logical:<run>"``, ``"seg:leaf:<path>:<report key>"``,
``"min:leaf:<path>"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcluster_lab.lab.style import RELAYED, SYNC_PARTS, fmt_bytes
from rlcluster_lab.lab.svg import MIN_FONT, MUTED, TEXT, WIDTH, Canvas, Svg, legend
from rlcluster_lab.lab.sync_peak_figures import sync_chunk_curve, sync_peak
from rlcluster_lab.lab.textfit import clip, text_width, wrap

# The synced bytes' parts (synced = arrived + copied + reused) in SYNC_PARTS' colours.
SYNC_COLORS = {
    "arrived": SYNC_PARTS[0][2],
    "copied": SYNC_PARTS[1][2],
    "reused": SYNC_PARTS[2][2],
    "relayed": RELAYED,
}


def _runs(sync: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """One sync report, or a mapping of label -> sync report."""
    if "synced_bytes" in sync:
        return {("LoRA" if sync.get("lora") else "full") + " sync": sync}
    return {str(k): v for k, v in sync.items()}


def sync_bytes(sync: Mapping[str, Any]) -> Svg:
    """Where a sync's bytes went, with the numbers (L3): one sync report, or
    ``{label: sync report}`` to compare runs on one byte scale.

    The upper bar splits the synced bytes (physical, every destination shard)
    into what arrived from another device, what was made on the device from
    its own data, and what was reused; the lower bar is everything that
    crossed devices against the least the placement forces (the tick), its
    excess relayed (moved again or dropped) drawn dark. The logical figure
    (each leaf once) is beside the physical one, with their ratio, and marked on
    the synced bar as a dotted tick.
    """
    runs = _runs(sync)
    left = 78
    bar_w = WIDTH - left - 16
    widest = max(
        [max(int(s.get("synced_bytes", 0)), int(s.get("moved_cross_device_bytes", 0))) for s in runs.values()] + [1]
    )
    scale = bar_w / widest
    c = Canvas(WIDTH, 0)
    c.text(8, 20, "Weight sync (P13, measured): where the bytes went", size=14, weight="bold")
    y = 44
    for label, s in runs.items():
        synced = int(s.get("synced_bytes", 0))
        logical = int(s.get("synced_logical_bytes", 0))
        moved = int(s.get("moved_cross_device_bytes", 0))
        relayed = int(s.get("relayed_cross_device_bytes", 0))
        minimum = int(s.get("minimum_cross_device_bytes", 0))
        parts = [
            ("arrived", "moved between devices", moved - relayed),
            ("copied", "copied within a device", int(s.get("copied_same_device_bytes", 0))),
            ("reused", "reused (no copy)", int(s.get("reused_bytes", 0))),
        ]
        head = (
            f"{label}: {fmt_bytes(synced)} synced (physical: every device's shard), "
            f"{fmt_bytes(logical)} logical (each leaf once)"
        )
        for k, line in enumerate(wrap(head, WIDTH - 16, 13, lines=2, bold=True)):
            c.text(8, y + 17 * k, line, size=13, weight="bold")
            y += 17 * bool(k)
        y += 10
        c.text(left - 8, y + 16, "synced", size=MIN_FONT, anchor="end", fill=MUTED)
        x = left
        for key, what, v in parts:
            if v > 0:
                c.rect(
                    x,
                    y + 2,
                    v * scale,
                    20,
                    SYNC_COLORS[key],
                    id=f"seg:sync:{label}:{key}",
                    title=f"{what}: {fmt_bytes(v)}",
                    nbytes=v,
                )
                x += v * scale
        if logical:
            lx = left + logical * scale
            c.line(lx, y - 2, lx, y + 26, TEXT, width=2, dash="2,2", id=f"logical:{label}", nbytes=logical)
        y = legend(
            c,
            left,
            y + 42,
            [(SYNC_COLORS[key], f"{what} {fmt_bytes(v)}") for key, what, v in parts],
            WIDTH - left - 8,
        )
        c.text(left - 8, y + 12, "crossed", size=MIN_FONT, anchor="end", fill=MUTED)
        if moved - relayed > 0:
            c.rect(
                left,
                y - 2,
                (moved - relayed) * scale,
                18,
                SYNC_COLORS["arrived"],
                id=f"seg:cross:{label}:kept",
                nbytes=moved - relayed,
                title=f"crossed devices and stayed: {fmt_bytes(moved - relayed)}",
            )
        if relayed > 0:
            c.rect(
                left + (moved - relayed) * scale,
                y - 2,
                relayed * scale,
                18,
                SYNC_COLORS["relayed"],
                id=f"seg:cross:{label}:relayed",
                title=f"relayed: {fmt_bytes(relayed)} crossed but did not stay",
                nbytes=relayed,
            )
        mx = left + minimum * scale
        c.line(mx, y - 6, mx, y + 20, "black", width=2.5, id=f"min:{label}", nbytes=minimum)
        excess = int(s.get("excess_cross_device_bytes", moved - minimum))
        lines = [
            (
                f"{fmt_bytes(moved)} crossed devices; the least this placement allows: {fmt_bytes(minimum)} "
                f"(black tick); excess {fmt_bytes(excess)}"
                + (
                    ", all of it relayed"
                    if relayed and relayed == excess
                    else f", {fmt_bytes(relayed)} relayed (dark)"
                    if relayed
                    else ""
                ),
                TEXT,
            )
        ]
        if logical and synced:
            lines.append(
                (
                    f"physical / logical = {synced / logical:.1f} (the dotted tick on the synced bar is the "
                    "logical figure): a leaf counts once per device that receives a piece of it, so a "
                    "replicated one counts on every device",
                    MUTED,
                )
            )
        seconds = s.get("seconds")
        timing = (
            ""
            if seconds is None
            else f"; handover {seconds * 1e3:.1f} ms"
            + (
                " incl. compiling"
                if s.get("includes_compilation")
                else " incl. reading programs from the compilation cache"
                if s.get("includes_program_load")
                else ""
            )
        )
        lines.append(
            (
                f"reshard: {s.get('reshard_strategy', '?')}; anchor re-pinned "
                f"{fmt_bytes(int(s.get('anchor_bytes', 0)))}" + timing,
                MUTED,
            )
        )
        y += 36
        for text, fill in lines:
            for line in wrap(text, WIDTH - left - 8, MIN_FONT, lines=2):
                c.text(left, y, line, size=MIN_FONT, fill=fill)
                y += 16
        y += 18
    c.height = y - 10
    return c.render()


def sync_leaves(sync: Mapping[str, Any], top: int | None = None) -> Svg:
    """Per leaf of one sync: the bytes moved between devices, copied within a device and
    reused, with the least the placement allows to cross as a black tick (L3).

    ``top`` keeps only the leaves with the most synced bytes (ties by path), drawn in path
    order like the rest.
    """
    leaves = list(sync.get("leaves", []))
    if top is not None:
        leaves = sorted(leaves, key=lambda lf: (-int(lf.get("synced_bytes", 0)), lf.get("path", "")))[:top]
        leaves.sort(key=lambda lf: lf.get("path", ""))
    labels = [f"{lf.get('path')} {tuple(lf.get('shape', []))}" for lf in leaves]
    label_w = min(max([text_width(lb, MIN_FONT) for lb in labels] + [60.0]) + 16, 330.0)
    left, row_h = label_w, 18
    bar_w = WIDTH - left - 16
    widest = max([sum(int(lf.get(key, 0)) for key, _, _ in SYNC_PARTS) for lf in leaves] + [1])
    scale = bar_w / widest
    shown = f"{len(leaves)} of {len(sync.get('leaves', []))} leaves" if top is not None else f"{len(leaves)} leaves"
    c = Canvas(WIDTH, 0)
    c.text(8, 20, f"Weight sync per leaf ({shown}), physical bytes", size=14, weight="bold")
    y = legend(
        c,
        8,
        42,
        [(color, what) for _, what, color in SYNC_PARTS] + [("black", "tick: the least the placement allows to cross")],
        WIDTH - 16,
    )
    for frac in (0.0, 0.5, 1.0):
        x = left + bar_w * frac
        anchor = {0.0: "start", 0.5: "middle", 1.0: "end"}[frac]
        c.text(x, y, fmt_bytes(widest * frac), size=MIN_FONT, anchor=anchor, fill=MUTED)
        c.line(x, y + 4, x, y + 8 + row_h * len(leaves), "#eeeeee")
    y += 8
    for lf, label in zip(leaves, labels):
        path = str(lf.get("path"))
        c.text(left - 8, y + 13, clip(label, label_w - 12, MIN_FONT), size=MIN_FONT, anchor="end", title=label)
        x = left
        for key, what, color in SYNC_PARTS:
            v = int(lf.get(key, 0))
            if v > 0:
                c.rect(
                    x,
                    y + 3,
                    v * scale,
                    row_h - 5,
                    color,
                    id=f"seg:leaf:{path}:{key}",
                    nbytes=v,
                    title=f"{path}: {fmt_bytes(v)} {what}",
                )
                x += v * scale
        minimum = int(lf.get("minimum_cross_device_bytes", 0))
        mx = left + minimum * scale
        c.line(mx, y + 1, mx, y + row_h, "black", width=2, id=f"min:leaf:{path}", nbytes=minimum)
        y += row_h
    c.height = y + 10
    return c.render()


__all__ = ["sync_bytes", "sync_chunk_curve", "sync_leaves", "sync_peak"]
