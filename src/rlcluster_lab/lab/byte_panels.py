"""The lab's byte panels as SVG: memory by device and by role (L2), and the sync (L3).

Pure functions of a report's ``memory`` or ``sync`` JSON (see ``lab.panels``
for the conventions: physical bytes, a shared buffer drawn once, hatched).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcluster_lab.lab.style import ENTRY_ORDER, KINDS, ROLE_COLORS, fmt_bytes
from rlcluster_lab.lab.svg import MUTED, WIDTH, Canvas, Svg, clip, device_keys, legend, present

SYNC_COLORS = {"arrived": "#c44e52", "copied": "#dd8452", "reused": "#55a868", "relayed": "#8b1a1a"}


def _groups(memory: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return sorted(
        memory.get("shared", []),
        key=lambda g: tuple(ENTRY_ORDER.index(r) if r in ENTRY_ORDER else 99 for r in g.get("roles", [])),
    )


def _own(memory: Mapping[str, Any], entry: str, dev: str, kind: str) -> int:
    """What ``entry`` holds on ``dev`` in ``kind`` that no other entry holds."""
    held = int(memory.get("by_role", {}).get(entry, {}).get("by_device", {}).get(dev, {}).get(kind, 0))
    for g in memory.get("shared", []):
        if entry in g.get("roles", []):
            held -= int((g.get("by_device") or {}).get(dev, {}).get(kind, 0))
    return held


def memory_by_device(memory: Mapping[str, Any]) -> Svg:
    """What each device holds, each buffer once: a segment per role for its own buffers and a
    hatched segment per set of roles for the buffers they share; one bar per memory kind.

    A dashed outline marks what the device would hold if every role had its
    own copy. The bar's height is the report's ``by_device`` figure.
    """
    by_device = memory.get("by_device", {})
    entries = present(list(memory.get("by_role", {})), ENTRY_ORDER)
    groups = _groups(memory)
    devices = device_keys(list(by_device))
    kinds = [k for k in KINDS if any(by_device.get(d, {}).get(k) for d in devices)] or ["device"]
    naive = {
        (d, k): sum(int(memory["by_role"][e].get("by_device", {}).get(d, {}).get(k, 0)) for e in entries)
        for d in devices
        for k in kinds
    }
    top_value = max([naive[key] for key in naive] + [1])
    left, top, plot_h = 66, 52, 190
    slot = (WIDTH - left - 12) / max(len(devices), 1)
    bar_w = min(30.0, slot * 0.8 / len(kinds))
    c = Canvas(WIDTH, top + plot_h + 96)
    c.text(
        8,
        18,
        f"Memory per device (measured): {fmt_bytes(memory.get('unique_bytes', 0))} held, "
        f"{fmt_bytes(memory.get('naive_bytes', 0))} if every role had its own copy",
        size=13,
        weight="bold",
    )
    allocator = memory.get("allocator") or {}
    note = "allocator figures: " + (
        "see the JSON" if allocator.get("available") else (allocator.get("note") or "none on this backend")
    )
    c.text(8, 36, clip(note, WIDTH - 16, 11), size=11, fill=MUTED, title=note)
    scale = plot_h / top_value
    base = top + plot_h
    for frac in (0.0, 0.5, 1.0):
        yy = base - plot_h * frac
        c.line(left - 4, yy, WIDTH - 8, yy, "#eeeeee")
        c.text(left - 8, yy + 4, fmt_bytes(top_value * frac), size=10.5, anchor="end", fill=MUTED)
    for i, dev in enumerate(devices):
        for k, kind in enumerate(kinds):
            x = left + i * slot + (slot - bar_w * len(kinds)) / 2 + k * bar_w
            y = base
            pinned = kind == "pinned_host"
            for e in entries:
                v = _own(memory, e, dev, kind)
                if v > 0:
                    h = v * scale
                    color = ROLE_COLORS.get(e, "#999999")
                    c.rect(
                        x,
                        y - h,
                        bar_w - 2,
                        h,
                        c.dots(color) if pinned else color,
                        stroke="white",
                        width=0.5,
                        id=f"seg:{dev}:{kind}:{e}",
                        title=f"{e} on device {dev} ({kind}): {fmt_bytes(v)}, its own",
                        nbytes=v,
                    )
                    y -= h
            for g in groups:
                v = int((g.get("by_device") or {}).get(dev, {}).get(kind, 0))
                if v > 0:
                    h = v * scale
                    names = " = ".join(g["roles"])
                    c.rect(
                        x,
                        y - h,
                        bar_w - 2,
                        h,
                        c.hatch(ROLE_COLORS.get(g["roles"][0], "#999999")),
                        stroke="#555555",
                        width=0.5,
                        id=f"seg:{dev}:{kind}:{'+'.join(g['roles'])}",
                        title=f"{names} on device {dev} ({kind}): {fmt_bytes(v)} held once",
                        nbytes=v,
                    )
                    y -= h
            held = int(by_device.get(dev, {}).get(kind, 0))
            n = naive[(dev, kind)]
            if n > held:
                c.rect(
                    x,
                    base - n * scale,
                    bar_w - 2,
                    (n - held) * scale,
                    "none",
                    stroke="#777777",
                    width=1,
                    dash="3,2",
                    id=f"naive:{dev}:{kind}",
                    nbytes=n - held,
                    title=f"device {dev} ({kind}): {fmt_bytes(n - held)} more if every role had its own copy",
                )
        c.text(left + i * slot + slot / 2, base + 16, f"dev {dev}", size=11, anchor="middle")
    items = [
        (ROLE_COLORS.get(e, "#999999"), e)
        for e in entries
        if any(_own(memory, e, d, k) > 0 for d in devices for k in kinds)
    ]
    items += [
        (c.hatch(ROLE_COLORS.get(g["roles"][0], "#999999")), " = ".join(g["roles"]) + " (held once)") for g in groups
    ]
    y = legend(c, left, base + 38, items, WIDTH - left - 10)
    extra = []
    if "pinned_host" in kinds:
        extra.append("dotted (right-hand bars): pinned host memory")
    extra.append("dashed: what separate copies would add")
    c.text(left, y + 2, "; ".join(extra), size=11, fill=MUTED)
    c.height = y + 12
    return c.render()


def memory_by_role(memory: Mapping[str, Any]) -> Svg:
    """What each role (and the anchor, the optimizer state) holds: its own buffers solid, the
    ones it shares hatched and named, so a shared buffer is visibly the same buffer."""
    by_role = memory.get("by_role", {})
    entries = present(list(by_role), ENTRY_ORDER)
    shared_of: dict[str, list[tuple[int, list[str]]]] = {}
    for g in _groups(memory):
        for e in g.get("roles", []):
            shared_of.setdefault(e, []).append((int(g.get("bytes", 0)), [r for r in g["roles"] if r != e]))
    top_value = max([int(by_role[e].get("bytes", 0)) for e in entries] + [1])
    left, top, row_h = 96, 40, 30
    bar_max = WIDTH * 0.46
    c = Canvas(WIDTH, top + row_h * len(entries) + 30)
    c.text(
        8,
        18,
        f"Memory per role (measured): {fmt_bytes(memory.get('unique_bytes', 0))} held, each buffer once",
        size=13,
        weight="bold",
    )
    for i, e in enumerate(entries):
        y = top + i * row_h
        color = ROLE_COLORS.get(e, "#999999")
        total = int(by_role[e].get("bytes", 0))
        shared = sum(b for b, _ in shared_of.get(e, []))
        own = total - shared
        scale = bar_max / top_value
        c.text(left - 8, y + 15, e, size=12, anchor="end", weight="bold")
        c.rect(
            left,
            y + 2,
            own * scale,
            row_h - 10,
            color,
            id=f"seg:role:{e}:own",
            nbytes=own,
            title=f"{e}: {fmt_bytes(own)} in buffers only it holds",
        )
        if shared:
            c.rect(
                left + own * scale,
                y + 2,
                shared * scale,
                row_h - 10,
                c.hatch(color),
                stroke=color,
                width=0.6,
                id=f"seg:role:{e}:shared",
                nbytes=shared,
                title=f"{e}: {fmt_bytes(shared)} in buffers other roles hold too (drawn once in the device view)",
            )
        kinds = ", ".join(f"{fmt_bytes(v)} {k}" for k, v in by_role[e].get("by_kind", {}).items())
        text = f"{fmt_bytes(total)} ({kinds})" if total else "nothing"
        if shared:
            text += "; shared: " + "; ".join(f"{fmt_bytes(b)} = {', '.join(o)}" for b, o in shared_of[e])
        c.text(left + total * scale + 6, y + 16, clip(text, WIDTH - left - total * scale - 14, 11), size=11, title=text)
    c.text(
        8,
        top + row_h * len(entries) + 14,
        "solid: buffers only this role holds; hatched: buffers it shares (the same bytes, not a copy)",
        size=11,
        fill=MUTED,
    )
    return c.render()


def sync_bytes(sync: Mapping[str, Any]) -> Svg:
    """Where one sync's bytes went, with the numbers (L3).

    The upper bar splits the synced bytes (physical, every destination shard)
    into what arrived from another device, what was made on the device from
    its own data, and what was reused; the lower bar is everything that
    crossed devices against the least the placement forces (the tick), its
    excess relayed (moved again or dropped) drawn dark.
    """
    runs = {("LoRA" if sync.get("lora") else "full") + " sync": sync} if "synced_bytes" in sync else dict(sync)
    left, top, block = 120, 34, 112
    c = Canvas(WIDTH, top + block * len(runs) + 12)
    c.text(8, 18, "Weight sync (P13, measured): where the bytes went", size=13, weight="bold")
    widest = max(
        [max(int(s.get("synced_bytes", 0)), int(s.get("moved_cross_device_bytes", 0))) for s in runs.values()] + [1]
    )
    scale = (WIDTH - left - 16) / widest
    for i, (label, s) in enumerate(runs.items()):
        y = top + i * block
        synced = int(s.get("synced_bytes", 0))
        moved = int(s.get("moved_cross_device_bytes", 0))
        relayed = int(s.get("relayed_cross_device_bytes", 0))
        parts = [
            ("arrived", "arrived from another device", moved - relayed),
            ("copied", "made on its device from its own data", int(s.get("copied_same_device_bytes", 0))),
            ("reused", "reused: the destination buffer is the source's", int(s.get("reused_bytes", 0))),
        ]
        c.text(left - 8, y + 15, label, size=12, anchor="end", weight="bold")
        c.text(left - 8, y + 29, "synced", size=11, anchor="end", fill=MUTED)
        x = left
        for key, what, v in parts:
            if v > 0:
                c.rect(
                    x,
                    y + 2,
                    v * scale,
                    22,
                    SYNC_COLORS[key],
                    id=f"seg:sync:{label}:{key}",
                    title=f"{what}: {fmt_bytes(v)}",
                    nbytes=v,
                )
                x += v * scale
        c.text(
            left,
            y + 40,
            f"{fmt_bytes(synced)} synced = {fmt_bytes(moved - relayed)} arrived + "
            f"{fmt_bytes(parts[1][2])} made locally + {fmt_bytes(parts[2][2])} reused; "
            f"{fmt_bytes(int(s.get('synced_logical_bytes', 0)))} logical (each leaf once)",
            size=11,
        )
        yy = y + 50
        c.text(left - 8, yy + 15, "crossed", size=11, anchor="end", fill=MUTED)
        if moved - relayed > 0:
            c.rect(
                left,
                yy + 2,
                (moved - relayed) * scale,
                18,
                SYNC_COLORS["arrived"],
                id=f"seg:cross:{label}:kept",
                nbytes=moved - relayed,
            )
        if relayed > 0:
            c.rect(
                left + (moved - relayed) * scale,
                yy + 2,
                relayed * scale,
                18,
                SYNC_COLORS["relayed"],
                id=f"seg:cross:{label}:relayed",
                title=f"relayed: {fmt_bytes(relayed)} crossed but did not stay",
                nbytes=relayed,
            )
        minimum = int(s.get("minimum_cross_device_bytes", 0))
        mx = left + minimum * scale
        c.line(mx, yy - 2, mx, yy + 24, "black", width=2.5, id=f"min:{label}")
        excess = int(s.get("excess_cross_device_bytes", moved - minimum))
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
        c.text(
            left,
            yy + 36,
            f"{fmt_bytes(moved)} crossed devices; minimum {fmt_bytes(minimum)} (black tick); "
            f"excess {fmt_bytes(excess)}" + (f", of which {fmt_bytes(relayed)} relayed" if relayed else ""),
            size=11,
        )
        strategy = s.get("reshard_strategy", "?")
        c.text(
            left,
            yy + 52,
            f"reshard: {strategy}; anchor re-pinned {fmt_bytes(int(s.get('anchor_bytes', 0)))}" + timing,
            size=11,
            fill=MUTED,
        )
    return c.render()
