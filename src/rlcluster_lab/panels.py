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

import html
from collections.abc import Mapping, Sequence
from typing import Any

from rlcluster_lab.viz import ENTRY_ORDER, HIGHLIGHT, IDLE, IDLE_TEXT, KINDS, ROLE_COLORS, ROLE_ORDER, flow_rows, fmt_bytes

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
TEXT = "#222222"
MUTED = "#5f5f5f"
WIDTH = 760  # a panel's width in px: two side by side fit a 1600 px wide screen
SYNC_COLORS = {"arrived": "#c44e52", "copied": "#dd8452", "reused": "#55a868", "relayed": "#8b1a1a"}


class Svg(str):
    """SVG markup that a notebook displays as a figure."""

    def _repr_svg_(self) -> str:
        return str(self)


class _Canvas:
    """A minimal SVG writer: rectangles, text, lines and paths, with ids and hover titles."""

    def __init__(self, width: float, height: float) -> None:
        self.width, self.height = width, height
        self._items: list[str] = []
        self._patterns: dict[str, str] = {}

    def hatch(self, color: str) -> str:
        """A fill of diagonal lines in ``color``: what marks a buffer held by more than one role."""
        pid = "hatch-" + color.lstrip("#")
        self._patterns[pid] = (
            f'<pattern id="{pid}" width="6" height="6" patternUnits="userSpaceOnUse" '
            f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{color}" fill-opacity="0.25"/>'
            f'<line x1="0" y1="0" x2="0" y2="6" stroke="{color}" stroke-width="3"/></pattern>'
        )
        return f"url(#{pid})"

    def dots(self, color: str) -> str:
        """A dotted fill in ``color``: what marks pinned host memory."""
        pid = "dots-" + color.lstrip("#")
        self._patterns[pid] = (
            f'<pattern id="{pid}" width="5" height="5" patternUnits="userSpaceOnUse">'
            f'<rect width="5" height="5" fill="{color}" fill-opacity="0.2"/>'
            f'<circle cx="2.5" cy="2.5" r="1.3" fill="{color}"/></pattern>'
        )
        return f"url(#{pid})"

    def rect(self, x: float, y: float, w: float, h: float, fill: str, *, stroke: str | None = None,
             width: float = 1.0, rx: float = 0, dash: str | None = None, id: str | None = None,
             title: str | None = None, nbytes: int | None = None) -> None:
        attrs = [f'x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" fill="{fill}"']
        if nbytes is not None:
            attrs.append(f'data-bytes="{int(nbytes)}"')  # the figure's number, for readers and tests
        if stroke:
            attrs.append(f'stroke="{stroke}" stroke-width="{width}"')
        if rx:
            attrs.append(f'rx="{rx}"')
        if dash:
            attrs.append(f'stroke-dasharray="{dash}"')
        self._add("rect", " ".join(attrs), id, title)

    def text(self, x: float, y: float, s: str, *, size: float = 12, anchor: str = "start", weight: str | None = None,
             fill: str = TEXT, id: str | None = None, title: str | None = None) -> None:
        attrs = f'x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}"'
        if weight:
            attrs += f' font-weight="{weight}"'
        body = html.escape(s)
        if title:
            body = f"<title>{html.escape(title)}</title>" + body
        self._items.append(f"<text {attrs}{_id(id)}>{body}</text>")

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str, *, width: float = 1.0,
             dash: str | None = None, id: str | None = None) -> None:
        attrs = f'x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" stroke-width="{width}"'
        if dash:
            attrs += f' stroke-dasharray="{dash}"'
        self._add("line", attrs, id, None)

    def path(self, d: str, stroke: str, *, width: float = 1.2, arrow: bool = False, id: str | None = None,
             title: str | None = None) -> None:
        attrs = f'd="{d}" fill="none" stroke="{stroke}" stroke-width="{width}"'
        if arrow:
            self._patterns["arrow"] = (
                '<marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
                'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#555555"/></marker>'
            )
            attrs += ' marker-end="url(#arrow)"'
        self._add("path", attrs, id, title)

    def _add(self, tag: str, attrs: str, id: str | None, title: str | None) -> None:
        if title:
            self._items.append(f"<{tag} {attrs}{_id(id)}><title>{html.escape(title)}</title></{tag}>")
        else:
            self._items.append(f"<{tag} {attrs}{_id(id)}/>")

    def render(self) -> Svg:
        defs = f"<defs>{''.join(self._patterns.values())}</defs>" if self._patterns else ""
        return Svg(
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" height="{self.height:.0f}" '
            f'viewBox="0 0 {self.width:.0f} {self.height:.0f}" font-family="{FONT}">'
            f'<rect width="100%" height="100%" fill="white"/>{defs}{"".join(self._items)}</svg>'
        )


def _id(id: str | None) -> str:
    return f' id="{html.escape(id, quote=True)}"' if id else ""


def _legend(c: _Canvas, x: float, y: float, items: Sequence[tuple[str, str]], width: float) -> float:
    """Swatches and labels, left to right, wrapping at ``width``; returns the y below them."""
    cx = x
    for fill, label in items:
        w = 18 + 7 * len(label)
        if cx + w > x + width:
            cx, y = x, y + 18
        c.rect(cx, y - 10, 12, 12, fill, stroke="#888888", width=0.6)
        c.text(cx + 16, y, label, size=11)
        cx += w + 10
    return y + 18


def _present(keys: Sequence[str], order: Sequence[str]) -> list[str]:
    return [k for k in order if k in keys] + sorted(k for k in keys if k not in order)


def _devices(keys: Sequence[str]) -> list[str]:
    return sorted(keys, key=lambda k: (0, int(k)) if str(k).isdigit() else (1, str(k)))


# --------------------------------------------------------------------------- decision flow (L1)

_OPTION_LABELS = {
    "second_copy": "second copy",
    "engine_initial_value": "engine's initial value",
    "shared": "same object",
    "full": "full state",
    "trainable": "trainable only",
    "kept": "rollout mesh kept",
    "replaced": "engine's mesh",
}
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
    from rlcluster_lab.viz import FlowRow

    p12 = [d for d in report.get("decisions", []) if d.get("rule") == "P12"]
    if not p12:
        return None
    lora = bool((p12[0].get("values") or {}).get("lora"))
    return FlowRow("P12", "the optimizer trains", ("LoRA params", "all params"),
                   "LoRA params" if lora else "all params", str(p12[0].get("outcome", "")))


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
    c = _Canvas(WIDTH, top + row_h * len(rows) + 10)
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
        c.text(left + 40, y + 15, _clip(row.question, q_w - 44), size=12, title=row.question)
        n = len(row.options)
        box_w = (WIDTH - opt_x - 8 - 6 * (n - 1)) / n
        for j, option in enumerate(row.options):
            x = opt_x + j * (box_w + 6)
            fired = option == row.fired
            label = _OPTION_LABELS.get(option, option)
            c.rect(x, y, box_w, 22, HIGHLIGHT if fired else IDLE, stroke="#333333" if fired else "#cccccc",
                   width=1.6 if fired else 0.8, rx=4, id=f"{row.key}:{option}",
                   title=f"{row.key}: {label}" + (" (fired)" if fired else ""))
            c.text(x + box_w / 2, y + 15, _clip(label, box_w - 6), size=11.5, anchor="middle",
                   weight="bold" if fired else None, fill=TEXT if fired else IDLE_TEXT)
        if row.detail:
            c.text(opt_x, y + 36, _clip(row.detail, WIDTH - opt_x - 8), size=11, fill=MUTED, title=row.detail)
    for k, (src, dst, why) in enumerate(FLOW_LINKS):
        if src in y_of and dst in y_of:
            x = left - 10 - 11 * k
            y1, y2 = y_of[src], y_of[dst]
            c.path(f"M{left - 3},{y1} H{x} V{y2} H{left - 4}", "#555555", arrow=True,
                   id=f"link:{src}:{dst}", title=f"{src} -> {dst}: {why}")
    return c.render()


def _clip(text: str, width: float, size: float = 12) -> str:
    """Text cut to roughly fit ``width`` px (an ellipsis marks the cut; hover shows all)."""
    fits = max(4, int(width / (size * 0.56)))
    return text if len(text) <= fits else text[: fits - 1] + "\u2026"


# --------------------------------------------------------------------------- device grid


def _mesh_coords(mesh: Mapping[str, Any]) -> dict[int, tuple[int, ...]]:
    dims = [int(v) for v in mesh.get("shape", {}).values()] or [1]
    out: dict[int, tuple[int, ...]] = {}
    for flat, dev in enumerate(mesh.get("device_ids", [])):
        coord, rest = [], flat
        for size in reversed(dims):
            coord.append(rest % size)
            rest //= size
        out[int(dev)] = tuple(reversed(coord))
    return out


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
    rows: list[tuple[str, str, Mapping[str, Any]]] = [(r, r, meshes[r]) for r in _present(list(meshes), ROLE_ORDER)]
    if report.get("mesh_overridden_by_engine") and "rollout" in report.get("config_role_to_mesh", {}):
        at = next(i for i, r in enumerate(rows) if r[0] == "rollout") + 1
        rows.insert(at, ("rollout (config)", "rollout", report["config_role_to_mesh"]["rollout"]))
    ids = sorted({int(d) for _, _, m in rows for d in m.get("device_ids", [])}
                 | set(range(int(report.get("device_count", 0)))))
    memory = report.get("memory") or {}
    by_role = memory.get("by_role", {})
    label_w, top, row_h = 150, 44, 40
    cell_w = min(66.0, (WIDTH - label_w - 10) / max(len(ids), 1))
    c = _Canvas(WIDTH, top + row_h * len(rows) + 30)
    c.text(8, 18, f"Devices: {report.get('device_count', len(ids))} on {report.get('platform', '?')}; "
           "each cell: the mesh coordinate and the role's bytes there", size=13, weight="bold")
    for j, dev in enumerate(ids):
        c.text(label_w + j * cell_w + cell_w / 2, top - 8, f"dev {dev}", size=11, anchor="middle", fill=MUTED)
    actor_color = ROLE_COLORS["actor"]
    for i, (name, role, mesh) in enumerate(rows):
        y = top + i * row_h
        dashed = name.endswith("(config)")
        shape = "x".join(str(v) for v in mesh.get("shape", {}).values())
        c.text(8, y + 17, name, size=12, weight="bold")
        c.text(8, y + 32, f"mesh {shape}", size=11, fill=MUTED)
        coords = _mesh_coords(mesh)
        for j, dev in enumerate(ids):
            x = label_w + j * cell_w
            if dev not in coords:
                c.rect(x + 2, y + 2, cell_w - 4, row_h - 6, "white", stroke="#dddddd", width=0.6,
                       id=f"cell:{name}:{dev}")
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
                title += f"; holds {fmt_bytes(held)}" + (f", of which {fmt_bytes(shared)} are the actor's buffers"
                                                         if shared else "")
            c.rect(x + 2, y + 2, cell_w - 4, row_h - 6, fill, stroke=color, width=1.4,
                   dash="4,3" if dashed else None, rx=3, id=f"cell:{name}:{dev}", title=title)
            dark = fill == color
            c.text(x + cell_w / 2, y + 16, ",".join(map(str, coords[dev])), size=11, anchor="middle",
                   fill="white" if dark else TEXT)
            if note:
                c.text(x + cell_w / 2, y + 30, _clip(note, cell_w - 4, 10.5), size=10.5, anchor="middle",
                       fill="white" if dark else TEXT)
    y = top + row_h * len(rows) + 14
    c.text(8, y, "hatched: the role computes with the actor's own buffers (no copy); solid: buffers of its own",
           size=11, fill=MUTED)
    return c.render()


# --------------------------------------------------------------------------- memory (L2)


def _groups(memory: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return sorted(memory.get("shared", []), key=lambda g: tuple(ENTRY_ORDER.index(r) if r in ENTRY_ORDER else 99
                                                                   for r in g.get("roles", [])))


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
    entries = _present(list(memory.get("by_role", {})), ENTRY_ORDER)
    groups = _groups(memory)
    devices = _devices(list(by_device))
    kinds = [k for k in KINDS if any(by_device.get(d, {}).get(k) for d in devices)] or ["device"]
    naive = {(d, k): sum(int(memory["by_role"][e].get("by_device", {}).get(d, {}).get(k, 0)) for e in entries)
             for d in devices for k in kinds}
    top_value = max([naive[key] for key in naive] + [1])
    left, top, plot_h = 66, 52, 190
    slot = (WIDTH - left - 12) / max(len(devices), 1)
    bar_w = min(30.0, slot * 0.8 / len(kinds))
    c = _Canvas(WIDTH, top + plot_h + 96)
    c.text(8, 18, f"Memory per device (measured): {fmt_bytes(memory.get('unique_bytes', 0))} held, "
           f"{fmt_bytes(memory.get('naive_bytes', 0))} if every role had its own copy", size=13, weight="bold")
    allocator = memory.get("allocator") or {}
    note = "allocator figures: " + ("see the JSON" if allocator.get("available") else
                                   (allocator.get("note") or "none on this backend"))
    c.text(8, 36, _clip(note, WIDTH - 16, 11), size=11, fill=MUTED, title=note)
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
                    c.rect(x, y - h, bar_w - 2, h, c.dots(color) if pinned else color, stroke="white", width=0.5,
                           id=f"seg:{dev}:{kind}:{e}", title=f"{e} on device {dev} ({kind}): {fmt_bytes(v)}, its own",
                           nbytes=v)
                    y -= h
            for g in groups:
                v = int((g.get("by_device") or {}).get(dev, {}).get(kind, 0))
                if v > 0:
                    h = v * scale
                    names = " = ".join(g["roles"])
                    c.rect(x, y - h, bar_w - 2, h, c.hatch(ROLE_COLORS.get(g["roles"][0], "#999999")),
                           stroke="#555555", width=0.5, id=f"seg:{dev}:{kind}:{'+'.join(g['roles'])}",
                           title=f"{names} on device {dev} ({kind}): {fmt_bytes(v)} held once", nbytes=v)
                    y -= h
            held = int(by_device.get(dev, {}).get(kind, 0))
            n = naive[(dev, kind)]
            if n > held:
                c.rect(x, base - n * scale, bar_w - 2, (n - held) * scale, "none", stroke="#777777", width=1,
                       dash="3,2", id=f"naive:{dev}:{kind}", nbytes=n - held,
                       title=f"device {dev} ({kind}): {fmt_bytes(n - held)} more if every role had its own copy")
        c.text(left + i * slot + slot / 2, base + 16, f"dev {dev}", size=11, anchor="middle")
    items = [(ROLE_COLORS.get(e, "#999999"), e) for e in entries if any(_own(memory, e, d, k) > 0
                                                                        for d in devices for k in kinds)]
    items += [(c.hatch(ROLE_COLORS.get(g["roles"][0], "#999999")), " = ".join(g["roles"]) + " (held once)")
              for g in groups]
    y = _legend(c, left, base + 38, items, WIDTH - left - 10)
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
    entries = _present(list(by_role), ENTRY_ORDER)
    shared_of: dict[str, list[tuple[int, list[str]]]] = {}
    for g in _groups(memory):
        for e in g.get("roles", []):
            shared_of.setdefault(e, []).append((int(g.get("bytes", 0)), [r for r in g["roles"] if r != e]))
    top_value = max([int(by_role[e].get("bytes", 0)) for e in entries] + [1])
    left, top, row_h = 96, 40, 30
    bar_max = WIDTH * 0.46
    c = _Canvas(WIDTH, top + row_h * len(entries) + 30)
    c.text(8, 18, f"Memory per role (measured): {fmt_bytes(memory.get('unique_bytes', 0))} held, each buffer once",
           size=13, weight="bold")
    for i, e in enumerate(entries):
        y = top + i * row_h
        color = ROLE_COLORS.get(e, "#999999")
        total = int(by_role[e].get("bytes", 0))
        shared = sum(b for b, _ in shared_of.get(e, []))
        own = total - shared
        scale = bar_max / top_value
        c.text(left - 8, y + 15, e, size=12, anchor="end", weight="bold")
        c.rect(left, y + 2, own * scale, row_h - 10, color, id=f"seg:role:{e}:own", nbytes=own,
               title=f"{e}: {fmt_bytes(own)} in buffers only it holds")
        if shared:
            c.rect(left + own * scale, y + 2, shared * scale, row_h - 10, c.hatch(color), stroke=color, width=0.6,
                   id=f"seg:role:{e}:shared", nbytes=shared,
                   title=f"{e}: {fmt_bytes(shared)} in buffers other roles hold too (drawn once in the device view)")
        kinds = ", ".join(f"{fmt_bytes(v)} {k}" for k, v in by_role[e].get("by_kind", {}).items())
        text = f"{fmt_bytes(total)} ({kinds})" if total else "nothing"
        if shared:
            text += "; shared: " + "; ".join(f"{fmt_bytes(b)} = {', '.join(o)}" for b, o in shared_of[e])
        c.text(left + total * scale + 6, y + 16, _clip(text, WIDTH - left - total * scale - 14, 11), size=11,
               title=text)
    c.text(8, top + row_h * len(entries) + 14, "solid: buffers only this role holds; hatched: buffers it shares "
           "(the same bytes, not a copy)", size=11, fill=MUTED)
    return c.render()


# --------------------------------------------------------------------------- sync (L3)


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
    c = _Canvas(WIDTH, top + block * len(runs) + 12)
    c.text(8, 18, "Weight sync (P13, measured): where the bytes went", size=13, weight="bold")
    widest = max([max(int(s.get("synced_bytes", 0)), int(s.get("moved_cross_device_bytes", 0)))
                  for s in runs.values()] + [1])
    scale = (WIDTH - left - 16) / widest
    for i, (label, s) in enumerate(runs.items()):
        y = top + i * block
        synced = int(s.get("synced_bytes", 0))
        moved = int(s.get("moved_cross_device_bytes", 0))
        relayed = int(s.get("relayed_cross_device_bytes", 0))
        parts = [("arrived", "arrived from another device", moved - relayed),
                 ("copied", "made on its device from its own data", int(s.get("copied_same_device_bytes", 0))),
                 ("reused", "reused: the destination buffer is the source's", int(s.get("reused_bytes", 0)))]
        c.text(left - 8, y + 15, label, size=12, anchor="end", weight="bold")
        c.text(left - 8, y + 29, "synced", size=11, anchor="end", fill=MUTED)
        x = left
        for key, what, v in parts:
            if v > 0:
                c.rect(x, y + 2, v * scale, 22, SYNC_COLORS[key], id=f"seg:sync:{label}:{key}",
                       title=f"{what}: {fmt_bytes(v)}", nbytes=v)
                x += v * scale
        c.text(left, y + 40, f"{fmt_bytes(synced)} synced = {fmt_bytes(moved - relayed)} arrived + "
               f"{fmt_bytes(parts[1][2])} made locally + {fmt_bytes(parts[2][2])} reused; "
               f"{fmt_bytes(int(s.get('synced_logical_bytes', 0)))} logical (each leaf once)", size=11)
        yy = y + 50
        c.text(left - 8, yy + 15, "crossed", size=11, anchor="end", fill=MUTED)
        if moved - relayed > 0:
            c.rect(left, yy + 2, (moved - relayed) * scale, 18, SYNC_COLORS["arrived"], id=f"seg:cross:{label}:kept",
                   nbytes=moved - relayed)
        if relayed > 0:
            c.rect(left + (moved - relayed) * scale, yy + 2, relayed * scale, 18, SYNC_COLORS["relayed"],
                   id=f"seg:cross:{label}:relayed", title=f"relayed: {fmt_bytes(relayed)} crossed but did not stay",
                   nbytes=relayed)
        minimum = int(s.get("minimum_cross_device_bytes", 0))
        mx = left + minimum * scale
        c.line(mx, yy - 2, mx, yy + 24, "black", width=2.5, id=f"min:{label}")
        excess = int(s.get("excess_cross_device_bytes", moved - minimum))
        seconds = s.get("seconds")
        timing = "" if seconds is None else f"; handover {seconds * 1e3:.1f} ms" + (
            " incl. compiling" if s.get("includes_compilation") else
            " incl. reading programs from the compilation cache" if s.get("includes_program_load") else "")
        c.text(left, yy + 36, f"{fmt_bytes(moved)} crossed devices; minimum {fmt_bytes(minimum)} (black tick); "
               f"excess {fmt_bytes(excess)}" + (f", of which {fmt_bytes(relayed)} relayed" if relayed else ""),
               size=11)
        strategy = s.get("reshard_strategy", "?")
        c.text(left, yy + 52, f"reshard: {strategy}; anchor re-pinned {fmt_bytes(int(s.get('anchor_bytes', 0)))}"
               + timing, size=11, fill=MUTED)
    return c.render()


__all__ = ["Svg", "decision_flow", "device_grid", "memory_by_device", "memory_by_role", "sync_bytes", "FLOW_LINKS"]
