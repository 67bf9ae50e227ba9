"""Figures of measured memory (L2): what each device holds and what each role holds, each
buffer drawn once.

Pure functions of a report's ``memory`` JSON, returning an ``Svg`` that the notebooks and the
widget lab both show (``lab.figures.placement`` says why SVG, and the conventions: physical
bytes, a shared buffer drawn once and hatched where another role holds it). Segments carry
an ``id`` and their bytes (``data-bytes``): ``"seg:<device>:<kind>:<entry or a+b>"``,
``"naive:<device>:<kind>"``, ``"alloc:<device>"``, ``"seg:role:<entry>:held:<kind>"``,
``"seg:role:<entry>:same:<owner>"``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.lab.figures.flow import engine_copied, rollout_text, share_reason
from rlcluster_lab.lab.figures.style import (
    ENTRY_ORDER,
    KINDS,
    byte_ticks,
    device_order,
    in_order,
    role_color,
    text_width,
    wrap,
)
from rlcluster_lab.lab.figures.svg import MIN_FONT, MUTED, WIDTH, Canvas, Svg, legend


def _groups(memory: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return sorted(
        memory.get("shared", []),
        key=lambda g: tuple(ENTRY_ORDER.index(r) if r in ENTRY_ORDER else 99 for r in g.get("roles", [])),
    )


def _group_fills(c: Canvas, groups: list[Mapping[str, Any]]) -> list[str]:
    """Per set of shared buffers, its fill: hatched in its first holder's colour over a tint of
    another holder's, the first one that no earlier set uses with the same first holder, so that
    no two sets look alike ("actor = rollout = reference" and "actor = rollout = anchor")."""
    fills: list[str] = []
    for g in groups:
        first, *rest = g["roles"]
        tints = [role_color(r) for r in rest] + _SPARE_TINTS
        fills.append(next(f for t in tints if (f := c.hatch(role_color(first), t)) not in fills))
    return fills


# Tints for a set of shared buffers whose holders' colours are all taken by other sets.
_SPARE_TINTS = ["#222222", "#bbbbbb", "#777777", "#e0e0e0"]


def held_on(memory: Mapping[str, Any], entry: str, dev: str) -> dict[str, dict[tuple[str, ...], int]]:
    """Where ``entry``'s bytes are on device ``dev``: per memory kind it holds bytes in (``KINDS``
    order), per set of holders, the bytes; ``(entry,)`` are its own buffers, a shared set's
    roles (``memory["shared"]``) the buffers it holds with them.

    The one account of memory kinds per role and device: the Devices view (a cell per role and
    device, ``figures.placement.device_grid``) and the Memory view (a bar per device and kind,
    ``memory_by_device``) both draw it, solid in device memory and dotted in pinned host.
    """
    held: dict[str, dict[tuple[str, ...], int]] = {}
    for kind in KINDS:
        sets = {
            tuple(g["roles"]): v
            for g in memory.get("shared", [])
            if entry in g.get("roles", []) and (v := _on(g, dev, kind)) > 0
        }
        own = _on(memory.get("by_role", {}).get(entry, {}), dev, kind) - sum(sets.values())
        if parts := ({(entry,): own} if own > 0 else {}) | sets:
            held[kind] = parts
    return held


def _on(holding: Mapping[str, Any], dev: str, kind: str) -> int:
    """The bytes a role's or a shared set's ``by_device`` gives for ``dev`` and ``kind``."""
    return int((holding.get("by_device") or {}).get(dev, {}).get(kind, 0))


def where_prefix(memory: Mapping[str, Any]) -> str:
    """How a memory figure's note begins: the devices its figures come from (the report's
    ``where``) and that they are measured ("TPU v5 lite chip 0, measured: "); "" without a ``where``."""
    return f"{memory['where']}, measured: " if memory.get("where") else ""


def allocator_beside_roles(memory: Mapping[str, Any], in_use: Mapping[str, int]) -> str:
    """The allocator's bytes in use beside the per-role figure of device memory, per device that
    reports them, and why the two differ (``measure.memory.ALLOCATOR_DIFFERENCE``); with none
    in use, why the backend gives no figures."""
    allocator = memory.get("allocator") or {}
    if not in_use:
        return "allocator: " + (allocator.get("note") or "no figures on this backend")
    by_device = memory.get("by_device", {})
    pairs = "; ".join(
        f"dev {d}: {fmt_bytes(v)} in use beside {fmt_bytes(int(by_device.get(d, {}).get('device', 0)))} per role"
        for d, v in in_use.items()
    )
    source = allocator.get("where") or "allocator"
    return f"{source} (the black tick): {pairs}. {allocator.get('difference', '')}".rstrip()


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
    naive = {(d, k): sum(_on(memory["by_role"][e], d, k) for e in entries) for d in devices for k in kinds}
    allocator = memory.get("allocator") or {}
    allocated = (allocator.get("by_device") or {}) if allocator.get("available") else {}
    in_use = {d: int(v) for d in devices if (v := allocated.get(d, {}).get("bytes_in_use")) is not None}
    # Round ticks; the axis' top is the last one, so every bar fits under it.
    ticks = byte_ticks(max([naive[key] for key in naive] + list(in_use.values()) + [1]))
    top_value = ticks[-1][0]
    left, top, plot_h = 80, 60, 190
    slot = (WIDTH - left - 12) / max(len(devices), 1)
    bar_w = min(30.0, slot * 0.8 / len(kinds))
    unique, separate = (fmt_bytes(memory.get(k, 0)) for k in ("unique_bytes", "naive_bytes"))
    title = f"Memory per device (measured): {unique} held, {separate} if every role had its own copy"
    c = Canvas(WIDTH, top + plot_h + 96, title)
    group_fills = _group_fills(c, groups)
    drawn: dict[str, set[str]] = {}  # entry or set of shared buffers -> the memory kinds of its segments
    note = (
        f"{where_prefix(memory)}per role: physical bytes (every device's shard counted), each buffer drawn once; "
        + allocator_beside_roles(memory, in_use)
    )
    notes = wrap(note, WIDTH - 16, MIN_FONT, lines=5)
    c.text_lines(8, 40, notes, size=MIN_FONT, fill=MUTED, title=note)
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
            holding = {e: held_on(memory, e, dev).get(kind, {}) for e in entries}
            own = [(e, v) for e in entries if (v := holding[e].get((e,), 0)) > 0]
            held_once = [
                (roles, fill, v)
                for roles, fill in zip((tuple(g["roles"]) for g in groups), group_fills)
                if (v := holding.get(roles[0], {}).get(roles, 0)) > 0
            ]
            for name in [e for e, _ in own] + [" = ".join(roles) for roles, _, _ in held_once]:
                drawn.setdefault(name, set()).add(kind)
            on = f"on device {dev} ({kind})"
            parts = [
                (v, c.kind_fill(kind, role_color(e)), f"seg:{dev}:{kind}:{e}", f"{e} {on}: {fmt_bytes(v)}, its own")
                for e, v in own
            ]
            y = c.bar(x, base, bar_w - 2, scale, parts, up=True, stroke="white", width=0.5)
            parts = [
                (v, fill, f"seg:{dev}:{kind}:{'+'.join(roles)}", f"{' = '.join(roles)} {on}: {fmt_bytes(v)} held once")
                for roles, fill, v in held_once
            ]
            c.bar(x, y, bar_w - 2, scale, parts, up=True, stroke="#555555", width=0.5)
            held = int(by_device.get(dev, {}).get(kind, 0))
            n = naive[(dev, kind)]
            if n > held:
                dashed = True
                title = f"device {dev} ({kind}): {fmt_bytes(n - held)} more if every role had its own copy"
                outline = {"stroke": "#777777", "width": 1, "dash": "3,2", "id": f"naive:{dev}:{kind}", "title": title}
                c.rect(x, base - n * scale, bar_w - 2, (n - held) * scale, "none", nbytes=n - held, **outline)
        if dev in in_use:
            # The allocator counts device memory: the tick sits on the device-memory bar.
            k = kinds.index("device") if "device" in kinds else 0
            x0 = left + i * slot + (slot - bar_w * len(kinds)) / 2 + k * bar_w
            y = base - in_use[dev] * scale
            title = f"device {dev}: the allocator reports {fmt_bytes(in_use[dev])} in use"
            c.rect(x0 - 3, y - 1.5, bar_w + 4, 3, "black", id=f"alloc:{dev}", nbytes=in_use[dev], title=title)
        c.text(left + i * slot + slot / 2, base + 17, f"dev {dev}", size=MIN_FONT, anchor="middle")
    # Each swatch as its segments are drawn: dotted where they are all in pinned host.
    items = [
        (c.dots(role_color(e)) if drawn[e] == {"pinned_host"} else role_color(e), e) for e in entries if e in drawn
    ]
    items += [(fill, " = ".join(g["roles"]) + " (held once)") for g, fill in zip(groups, group_fills)]
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
    counted = {k: int(v) for k, v in memory.get("by_role", {}).get(entry, {}).get("by_kind", {}).items()}
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
    out: Counter[str] = Counter()
    for g in _groups(memory):
        if entry in g.get("roles", []):
            out.update({r: int(g.get("bytes", 0)) for r in g["roles"] if r != entry})
    return [(r, out[r]) for r in in_order(list(out), ENTRY_ORDER)]


def role_sums(memory: Mapping[str, Any]) -> dict[str, int]:
    """Per memory kind, the bytes of the bars' counted parts (``role_parts``), added up: what the
    per-role figure says its solid (device) and dotted (pinned host) bars add up to."""
    sums = Counter(dict.fromkeys(KINDS, 0))
    for e in memory.get("by_role", {}):
        sums.update(role_parts(memory, e)[0])
    return dict(sums)


def _sums_text(sums: Mapping[str, int]) -> str:
    """What the counted parts add up to, in the words of what is drawn (nothing solid: say so)."""
    solid, dotted = sums.get("device", 0), sums.get("pinned_host", 0)
    if not dotted:
        return f"solid bars add up to {fmt_bytes(solid)}"
    said = f"dotted bars (pinned host) add up to {fmt_bytes(dotted)}"
    if not solid:
        return "no bar is solid (nothing in device memory); " + said
    return f"solid bars (device memory) add up to {fmt_bytes(solid)}; " + said


def memory_by_role(memory: Mapping[str, Any], report: Mapping[str, Any] | None = None) -> Svg:
    """What each role (and the anchor, the optimizer state) holds, each buffer drawn once: the
    counted part of a bar (solid in device memory, dotted in pinned host) is that bar's own
    buffers and the shared ones it holds first; a hatched part is the same buffers as another
    role's, in that role's colour ("= actor"). The counted parts add up to what the devices hold;
    the heading says what the solid and the dotted ones add up to (``role_sums``).

    ``report``: the placement report ``memory`` belongs to; given, a role whose bytes are all the
    actor's says which decision made it so (``flow.share_reason``: P3, P4, P4 then P14).
    """
    by_role = memory.get("by_role", {})
    entries = in_order(list(by_role), ENTRY_ORDER)
    top_value = max([int(by_role[e].get("bytes", 0)) for e in entries] + [1])
    # Room for the longest name ("critic_optimizer") left of the bars.
    left, top, row_h = max([100.0] + [text_width(e, 13, bold=True) + 16 for e in entries]), 64, 40
    bar_max = 300.0
    text_x = left + bar_max + 10
    scale = bar_max / top_value
    sums = role_sums(memory)
    c = Canvas(WIDTH, 0, f"Memory per role (measured): {fmt_bytes(sum(sums.values()))} held, each buffer counted once")
    naive = fmt_bytes(memory.get("naive_bytes", 0))
    note = f"{where_prefix(memory)}{_sums_text(sums)}; physical bytes; {naive} if every role's bytes were summed"
    lines = wrap(note, WIDTH - 16, MIN_FONT, lines=3)
    for k, line in enumerate(lines):
        c.text(8, 38 + 16 * k, line, size=MIN_FONT, fill=MUTED, id="sums" if k == 0 else None, title=note)
    top += 16 * max(len(lines) - 2, 0)  # a third line of the note pushes the bars down
    kinds_seen: set[str] = set()
    hatched = False
    for i, e in enumerate(entries):
        y = top + i * row_h
        color = role_color(e)
        total = int(by_role[e].get("bytes", 0))
        counted, borrowed = role_parts(memory, e)
        c.text(left - 8, y + 18, e, size=13, anchor="end", weight="bold")
        held = {k: v for k in KINDS if (v := counted.get(k, 0)) > 0}
        kinds_seen.update(held)
        parts = [
            (v, c.kind_fill(k, color), f"seg:role:{e}:held:{k}", f"{e}: {fmt_bytes(v)} in {k}, counted here")
            for k, v in held.items()
        ]
        x = c.bar(left, y + 4, row_h - 14, scale, parts, stroke=color, width=0.6)
        for owner, v in borrowed:
            hatched, owner_color = True, role_color(owner)
            title = f"{e}: {fmt_bytes(v)} that are the {owner}'s buffers (counted in the {owner}'s bar)"
            part = (v, c.hatch(owner_color, color), f"seg:role:{e}:same:{owner}", title)
            x = c.bar(x, y + 4, row_h - 14, scale, [part], stroke=owner_color, width=0.6)
        kinds = ", ".join(k.replace("_", " ") for k in KINDS if by_role[e].get("by_kind", {}).get(k))
        text = f"{fmt_bytes(total)}" + (f" in {kinds}" if kinds and kinds != "device" else "") if total else "nothing"
        for owner, v in borrowed:
            why = share_reason(report, e) if report is not None and owner == "actor" and v == total else ""
            text += f"; {'all' if v == total else fmt_bytes(v)} = the {owner}'s buffers" + (f" ({why})" if why else "")
        if report is not None and e == "rollout" and engine_copied(report):
            text += f"; {rollout_text(report)}"
        if not borrowed and held_with(memory, e):
            text += "; also held by " + ", ".join(f"{r} ({fmt_bytes(v)})" for r, v in held_with(memory, e))
        lines = wrap(text, WIDTH - 8 - text_x, MIN_FONT, lines=2)
        c.text_lines(text_x, y + 18 - 7 * (len(lines) - 1), lines, 15, size=MIN_FONT, title=text)
    # Only what is drawn, each swatch as its parts are drawn.
    items = []
    if "device" in kinds_seen:
        items.append(("#9a9a9a", "solid: device memory, counted in this bar"))
    if "pinned_host" in kinds_seen:
        items.append((c.dots("#666666"), "dotted: pinned host, counted in this bar"))
    if hatched:
        items.append((c.hatch(role_color("actor"), "#9a9a9a"), "hatched: another role's buffers (same bytes, no copy)"))
    c.height = legend(c, 8, top + row_h * len(entries) + 12, items)
    return c.render()
