"""Figures of measured memory (L2): what each device holds and what each role holds, each
buffer drawn once.

Pure functions of a report's ``memory`` JSON, returning an ``Svg`` that the notebooks and the
widget lab both show (``lab.placement_figures`` says why SVG, and the conventions: physical
bytes, a shared buffer drawn once and hatched where another role holds it). Segments carry
an ``id`` and their bytes (``data-bytes``): ``"seg:<device>:<kind>:<entry or a+b>"``,
``"naive:<device>:<kind>"``, ``"alloc:<device>"``, ``"seg:role:<entry>:held:<kind>"``,
``"seg:role:<entry>:same:<owner>"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcluster_lab.lab.style import ENTRY_ORDER, KINDS, ROLE_COLORS, byte_ticks, device_order, fmt_bytes, in_order, wrap
from rlcluster_lab.lab.svg import MIN_FONT, MUTED, WIDTH, Canvas, Svg, legend


def _groups(memory: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return sorted(
        memory.get("shared", []),
        key=lambda g: tuple(ENTRY_ORDER.index(r) if r in ENTRY_ORDER else 99 for r in g.get("roles", [])),
    )


def _group_fill(c: Canvas, roles: list[str]) -> str:
    """A set of shared buffers: hatched in its first holder's colour over a tint of the next
    one's, so that "actor = reference" and "actor = rollout = reference" look different."""
    return c.hatch(ROLE_COLORS.get(roles[0], "#999999"), ROLE_COLORS.get(roles[1], "#999999"))


def own_bytes(memory: Mapping[str, Any], entry: str, dev: str, kind: str) -> int:
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
    own copy. The bar's height is the report's ``by_device`` figure. Pinned
    host bars are dotted. The axis' ticks are round values (``style.byte_ticks``).
    Where the backend reports allocator figures, a black tick marks the allocator's
    bytes in use on each device; where it does not, the figure says so.
    """
    by_device = memory.get("by_device", {})
    entries = in_order(list(memory.get("by_role", {})), ENTRY_ORDER)
    groups = _groups(memory)
    devices = device_order(list(by_device))
    kinds = [k for k in KINDS if any(by_device.get(d, {}).get(k) for d in devices)] or ["device"]
    naive = {
        (d, k): sum(int(memory["by_role"][e].get("by_device", {}).get(d, {}).get(k, 0)) for e in entries)
        for d in devices
        for k in kinds
    }
    allocator = memory.get("allocator") or {}
    in_use = {
        d: int(v)
        for d in devices
        if allocator.get("available")
        and (v := (allocator.get("by_device") or {}).get(d, {}).get("bytes_in_use")) is not None
    }
    # Round ticks; the axis' top is the last one, so every bar fits under it.
    ticks = byte_ticks(max([naive[key] for key in naive] + list(in_use.values()) + [1]))
    top_value = ticks[-1][0]
    left, top, plot_h = 80, 60, 190
    slot = (WIDTH - left - 12) / max(len(devices), 1)
    bar_w = min(30.0, slot * 0.8 / len(kinds))
    c = Canvas(
        WIDTH,
        top + plot_h + 96,
        f"Memory per device (measured): {fmt_bytes(memory.get('unique_bytes', 0))} held, "
        f"{fmt_bytes(memory.get('naive_bytes', 0))} if every role had its own copy",
    )
    note = "physical bytes (every device's shard counted), each buffer drawn once; allocator: " + (
        "the black tick is its bytes in use on the device"
        if in_use
        else (allocator.get("note") or "no figures on this backend")
    )
    notes = wrap(note, WIDTH - 16, MIN_FONT, lines=3)
    for k, line in enumerate(notes):
        c.text(8, 40 + 16 * k, line, size=MIN_FONT, fill=MUTED, title=note)
    top += 16 * (len(notes) - 1)
    scale = plot_h / top_value
    base = top + plot_h
    dashed = False
    for value, label in ticks:
        yy = base - value * scale
        c.line(left - 4, yy, WIDTH - 8, yy, "#eeeeee")
        c.text(left - 8, yy + 4, label, size=MIN_FONT, anchor="end", fill=MUTED, id=f"tick:{value:.0f}")
    for i, dev in enumerate(devices):
        for k, kind in enumerate(kinds):
            x = left + i * slot + (slot - bar_w * len(kinds)) / 2 + k * bar_w
            y = base
            pinned = kind == "pinned_host"
            for e in entries:
                v = own_bytes(memory, e, dev, kind)
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
                        _group_fill(c, g["roles"]),
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
                dashed = True
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
        if dev in in_use:
            # The allocator counts device memory: the tick sits on the device-memory bar.
            k = kinds.index("device") if "device" in kinds else 0
            x0 = left + i * slot + (slot - bar_w * len(kinds)) / 2 + k * bar_w
            y = base - in_use[dev] * scale
            c.rect(
                x0 - 3,
                y - 1.5,
                bar_w + 4,
                3,
                "black",
                id=f"alloc:{dev}",
                nbytes=in_use[dev],
                title=f"device {dev}: the allocator reports {fmt_bytes(in_use[dev])} in use",
            )
        c.text(left + i * slot + slot / 2, base + 17, f"dev {dev}", size=MIN_FONT, anchor="middle")
    items = [
        (ROLE_COLORS.get(e, "#999999"), e)
        for e in entries
        if any(own_bytes(memory, e, d, k) > 0 for d in devices for k in kinds)
    ]
    items += [(_group_fill(c, g["roles"]), " = ".join(g["roles"]) + " (held once)") for g in groups]
    y = legend(c, 8, base + 42, items)
    # Say only what is drawn: how many bars a device has, and a dashed box only if one is drawn.
    extra = []
    if kinds == ["pinned_host"]:
        extra.append("dotted: pinned host memory (every bar)")
    elif "pinned_host" in kinds:
        extra.append(f"{len(kinds)} bars per device: {', '.join(_KIND_WORDS[k] for k in kinds)}")
    if dashed:
        extra.append("dashed: what separate copies would add")
    if extra:
        c.text(8, y + 2, "; ".join(extra), size=MIN_FONT, fill=MUTED)
    c.height = y + (12 if extra else -6)
    return c.render()


# How the per-device legend names each memory kind's bar, left to right (``KINDS`` order).
_KIND_WORDS = {"device": "device memory (solid, left)", "pinned_host": "pinned host (dotted, right)"}


def role_parts(memory: Mapping[str, Any], entry: str) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """``entry``'s bytes split the way the figures draw them, each buffer once over all entries.

    Returns:
        Per memory kind, the bytes counted in ``entry``'s bar: its own buffers, and the shared
        ones it is the first holder of (in the report's order: the actor before the rest);
        then, per set of shared buffers another entry is the first holder of, that entry and
        the bytes: drawn hatched, as the same buffers, not counted again.
    """
    row = memory.get("by_role", {}).get(entry, {})
    counted = {k: int(v) for k, v in row.get("by_kind", {}).items()}
    borrowed: dict[str, int] = {}
    for g in _groups(memory):
        if entry not in g.get("roles", []) or g["roles"][0] == entry:
            continue
        for k in counted:
            counted[k] -= sum(int(kinds.get(k, 0)) for kinds in (g.get("by_device") or {}).values())
        borrowed[g["roles"][0]] = borrowed.get(g["roles"][0], 0) + int(g.get("bytes", 0))
    return {k: v for k, v in counted.items() if v}, list(borrowed.items())


def held_with(memory: Mapping[str, Any], entry: str) -> list[tuple[str, int]]:
    """Per other entry, the bytes of ``entry``'s buffers it holds too (the report's order)."""
    out: dict[str, int] = {}
    for g in _groups(memory):
        if entry in g.get("roles", []):
            for r in g["roles"]:
                if r != entry:
                    out[r] = out.get(r, 0) + int(g.get("bytes", 0))
    return sorted(out.items(), key=lambda kv: ENTRY_ORDER.index(kv[0]) if kv[0] in ENTRY_ORDER else 99)


def memory_by_role(memory: Mapping[str, Any]) -> Svg:
    """What each role (and the anchor, the optimizer state) holds, each buffer drawn once: the
    solid part of a bar is counted in that bar (its own buffers, and shared ones it holds first),
    a hatched part is the same buffers as another role's, in that role's colour ("= actor"), so
    the solid parts add up to what the devices hold."""
    by_role = memory.get("by_role", {})
    entries = in_order(list(by_role), ENTRY_ORDER)
    top_value = max([int(by_role[e].get("bytes", 0)) for e in entries] + [1])
    left, top, row_h = 100, 48, 40
    bar_max = 300.0
    text_x = left + bar_max + 10
    text_w = WIDTH - 8 - text_x
    scale = bar_max / top_value
    c = Canvas(
        WIDTH, 0, f"Memory per role (measured): the solid parts add up to {fmt_bytes(memory.get('unique_bytes', 0))}"
    )
    c.text(
        8,
        38,
        f"physical bytes, each buffer counted once; {fmt_bytes(memory.get('naive_bytes', 0))} "
        "if every role's bytes were summed",
        size=MIN_FONT,
        fill=MUTED,
    )
    kinds_seen: set[str] = set()
    for i, e in enumerate(entries):
        y = top + i * row_h
        color = ROLE_COLORS.get(e, "#999999")
        total = int(by_role[e].get("bytes", 0))
        counted, borrowed = role_parts(memory, e)
        c.text(left - 8, y + 18, e, size=13, anchor="end", weight="bold")
        x = left
        for kind in KINDS:
            v = counted.get(kind, 0)
            if v <= 0:
                continue
            kinds_seen.add(kind)
            c.rect(
                x,
                y + 4,
                v * scale,
                row_h - 14,
                c.dots(color) if kind == "pinned_host" else color,
                stroke=color,
                width=0.6,
                id=f"seg:role:{e}:held:{kind}",
                nbytes=v,
                title=f"{e}: {fmt_bytes(v)} in {kind}, counted here",
            )
            x += v * scale
        for owner, v in borrowed:
            c.rect(
                x,
                y + 4,
                v * scale,
                row_h - 14,
                c.hatch(ROLE_COLORS.get(owner, "#999999"), color),
                stroke=ROLE_COLORS.get(owner, "#999999"),
                width=0.6,
                id=f"seg:role:{e}:same:{owner}",
                nbytes=v,
                title=f"{e}: {fmt_bytes(v)} that are the {owner}'s buffers (counted in the {owner}'s bar)",
            )
            x += v * scale
        kinds = ", ".join(k.replace("_", " ") for k in KINDS if by_role[e].get("by_kind", {}).get(k))
        text = f"{fmt_bytes(total)}" + (f" in {kinds}" if kinds and kinds != "device" else "") if total else "nothing"
        for owner, v in borrowed:
            text += f"; {'all' if v == total else fmt_bytes(v)} = the {owner}'s buffers"
        if not borrowed and held_with(memory, e):
            text += "; also held by " + ", ".join(f"{r} ({fmt_bytes(v)})" for r, v in held_with(memory, e))
        lines = wrap(text, text_w, MIN_FONT, lines=2)
        for k, line in enumerate(lines):
            c.text(text_x, y + 18 + 15 * k - 7 * (len(lines) - 1), line, size=MIN_FONT, title=text)
    items = [("#9a9a9a", "solid: counted in this bar")]
    items.append((c.hatch(ROLE_COLORS["actor"], "#9a9a9a"), "hatched: another role's buffers (same bytes, no copy)"))
    if "pinned_host" in kinds_seen:
        items.append((c.dots("#666666"), "dotted: pinned host"))
    c.height = legend(c, 8, top + row_h * len(entries) + 12, items)
    return c.render()
